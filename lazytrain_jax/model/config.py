"""ModelConfig: the shape of a decoder LLM, read from a Hugging Face config (pure Python, no jax).

The planner (``lazytrain_jax.schedule``) imports this module to cost a model without an accelerator,
so it must never import jax.

Supported ``model_type``: ``llama``, ``qwen2``, ``qwen3`` (every layer of kind ``"decoder"``) and
``qwen3_5_text``, the Qwen3.5/3.6 hybrid family (kinds ``"linear_attention"`` and
``"full_attention"``; its specifics live in ``qwen35_config.py``). Every layer has a *kind*
(``layer_kinds[i]``); the container, planner and executor handle any mix of kinds.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
from typing import Any, Mapping

from lazytrain_jax.model import qwen35_config as qwen35
from lazytrain_jax.model.hf_fields import hf_value, read_hf_rope

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", qwen35.MODEL_TYPE)
LAYER_KINDS = ("decoder",) + qwen35.KINDS
ROPE_TYPES = ("default", "llama3", "linear")
DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and numerics of a decoder-only LLM.

    Args:
      model_type: ``llama`` | ``qwen2`` | ``qwen3``.
      vocab_size, hidden_size, intermediate_size: widths.
      num_layers: number of transformer layers.
      num_heads, num_kv_heads, head_dim: attention geometry (head_dim need not be hidden/heads).
      rope_theta: RoPE base; rope_scaling: None or a dict with ``rope_type`` in ROPE_TYPES
        (``llama3``: factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
        ``linear``: factor).
      rms_norm_eps: RMSNorm epsilon.
      qkv_bias: bias on q/k/v projections (Qwen2: True); o_bias: bias on the output projection.
      mlp_bias: bias on the MLP projections (llama's ``mlp_bias``).
      qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
      tie_word_embeddings: LM head shares the embedding matrix.
      max_position_embeddings: written back to config.json; not a limit here.
      initializer_range: std of the normal init (Hugging Face convention).
      layer_kinds: one kind per layer; defaults to all ``"decoder"`` (``qwen3_5_text``: transformers'
        default ``layer_types``, every fourth layer ``"full_attention"``).
      partial_rotary_factor: fraction of head_dim that RoPE rotates (``qwen3_5_text``: 0.25).
      linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, linear_value_head_dim,
        linear_conv_kernel_dim: Gated DeltaNet geometry of ``"linear_attention"`` layers (0 if none).
      dtype: parameter dtype name of the master copy (``float32`` by default).
      extra_hf: Hugging Face config keys carried through save unchanged (bos/eos ids, ...).

    Example:
      >>> cfg = ModelConfig.from_hf_dict(json.load(open("config.json")))
      >>> cfg.num_params()
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    initializer_range: float = 0.02
    layer_kinds: tuple[str, ...] = ()
    dtype: str = "float32"
    extra_hf: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    partial_rotary_factor: float = 1.0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type={self.model_type!r} is not supported; valid: {list(SUPPORTED_MODEL_TYPES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        for name in ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        for name in ("rope_theta", "rms_norm_eps", "initializer_range"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name}={value!r} must be a finite number")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Mapping):
            raise ValueError(f"rope_scaling={self.rope_scaling!r} must be None or a dict")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps={self.rms_norm_eps!r} must be > 0")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta={self.rope_theta!r} must be > 0")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is not supported; valid: {list(DTYPES)}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            if rope_type not in ROPE_TYPES:
                raise ValueError(f"rope_scaling.rope_type={rope_type!r} is not supported; valid: {list(ROPE_TYPES)}")
            required = {"llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                   "original_max_position_embeddings"), "linear": ("factor",)}.get(rope_type, ())
            for key in required:
                if key not in self.rope_scaling:
                    raise ValueError(f"rope_scaling.{key} is required for rope_type={rope_type!r}")
        kinds = self.layer_kinds or (qwen35.default_layer_kinds(self.num_layers) if qwen35.is_hybrid(self)
                                     else ("decoder",) * self.num_layers)
        object.__setattr__(self, "layer_kinds", tuple(kinds))
        if len(self.layer_kinds) != self.num_layers:
            raise ValueError(f"layer_kinds has {len(self.layer_kinds)} entries; num_layers={self.num_layers}")
        for i, kind in enumerate(self.layer_kinds):
            if kind not in LAYER_KINDS:
                raise ValueError(f"layer_kinds[{i}]={kind!r} is not supported; valid: {list(LAYER_KINDS)}")
        qwen35.validate(self)
        object.__setattr__(self, "extra_hf", dict(self.extra_hf))

    def __hash__(self):  # dict-valued fields: hash a canonical JSON form instead of the field tuple
        return hash(self.fingerprint())

    def fingerprint(self) -> str:
        """A canonical JSON string of every field; equal configs give equal fingerprints."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, default=str)

    # ---- Hugging Face conversion -------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "ModelConfig":
        """Builds a ModelConfig from a Hugging Face ``config.json`` dict (transformers 4.x or 5.x)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"config.json must be a JSON object; got {type(d).__name__}")
        model_type = d.get("model_type")
        if model_type in (qwen35.MODEL_TYPE, qwen35.MULTIMODAL_MODEL_TYPE):
            return cls(**{**qwen35.kwargs_from_hf_dict(d), **overrides})
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"config.json: model_type={model_type!r} is not supported; "
                             f"valid: {list(SUPPORTED_MODEL_TYPES)}")
        act = hf_value(d, "hidden_act", "str", "silu")
        if act not in ("silu", "swish"):
            raise ValueError(f"config.json: hidden_act={act!r} is not supported; valid: ['silu']")
        if hf_value(d, "use_sliding_window", "bool", False):
            raise ValueError("config.json: use_sliding_window=True is not supported; valid: False")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            if key not in d:
                raise ValueError(f"config.json: required field {key!r} is missing")
        max_positions = hf_value(d, "max_position_embeddings", "int", 4096)
        rope_theta, rope_scaling, partial = read_hf_rope(d, max_positions)
        if partial != 1.0:
            raise ValueError(f"config.json: partial_rotary_factor={partial!r} is not supported; valid: 1.0")
        num_heads = hf_value(d, "num_attention_heads", "int")
        head_dim = hf_value(d, "head_dim", "int", None, none_ok=True) or hf_value(d, "hidden_size", "int") // num_heads
        attention_bias = hf_value(d, "attention_bias", "bool", False)
        known = {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling",
                 "rope_parameters", "rms_norm_eps", "attention_bias", "mlp_bias", "tie_word_embeddings",
                 "max_position_embeddings", "initializer_range", "hidden_act", "use_sliding_window",
                 "layer_types", "torch_dtype", "dtype", "transformers_version", "architectures",
                 "partial_rotary_factor"}
        extra = {k: v for k, v in d.items() if k not in known}
        kwargs = dict(
            model_type=model_type,
            vocab_size=hf_value(d, "vocab_size", "int"),
            hidden_size=hf_value(d, "hidden_size", "int"),
            intermediate_size=hf_value(d, "intermediate_size", "int"),
            num_layers=hf_value(d, "num_hidden_layers", "int"),
            num_heads=num_heads,
            num_kv_heads=hf_value(d, "num_key_value_heads", "int", None, none_ok=True) or num_heads,
            head_dim=head_dim,
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=hf_value(d, "rms_norm_eps", "float", 1e-6),
            qkv_bias=True if model_type == "qwen2" else attention_bias,
            o_bias=False if model_type == "qwen2" else attention_bias,
            mlp_bias=hf_value(d, "mlp_bias", "bool", False) if model_type == "llama" else False,
            qk_norm=model_type == "qwen3",
            tie_word_embeddings=hf_value(d, "tie_word_embeddings", "bool", False),
            max_position_embeddings=max_positions,
            initializer_range=hf_value(d, "initializer_range", "float", 0.02),
            extra_hf=extra,
        )
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_hf(cls, hf_config, **overrides) -> "ModelConfig":
        """Builds a ModelConfig from a transformers config object (``PretrainedConfig``)."""
        return cls.from_hf_dict(hf_config.to_dict(), **overrides)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides) -> "ModelConfig":
        """Reads a Hugging Face ``config.json``; a missing file raises FileNotFoundError naming it."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config.json not found: {path}")
        with open(path) as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON ({e})") from None
        try:
            return cls.from_hf_dict(d, **overrides)
        except ValueError as e:   # named by its path (from_hf_dict's own prefix, "config.json: ", dropped)
            raise ValueError(f"{path}: {str(e).removeprefix('config.json: ')}") from None

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` dict that transformers' ``from_pretrained`` reads back to this model."""
        if qwen35.is_hybrid(self):
            return qwen35.to_hf_dict(self)
        if self.model_type == "qwen2":
            if not self.qkv_bias or self.o_bias:
                raise ValueError("qwen2 requires qkv_bias=True and o_bias=False to be expressible in config.json")
        elif self.qkv_bias != self.o_bias:
            raise ValueError(f"{self.model_type}: qkv_bias={self.qkv_bias} and o_bias={self.o_bias} must be equal "
                             "(Hugging Face's attention_bias covers all four projections)")
        if self.qk_norm != (self.model_type == "qwen3"):
            raise ValueError(f"qk_norm={self.qk_norm} is not expressible for model_type={self.model_type!r}")
        arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
        rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
        if self.rope_scaling is not None:
            rope.update(self.rope_scaling)
        d: dict[str, Any] = dict(self.extra_hf)
        d.update(
            architectures=[arch[self.model_type]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=dict(self.rope_scaling) if self.rope_scaling is not None else None,
            rope_parameters=rope,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            initializer_range=self.initializer_range,
            torch_dtype=self.dtype,
        )
        if self.model_type != "qwen2":
            d["attention_bias"] = self.qkv_bias
        if self.model_type == "llama":
            d["mlp_bias"] = self.mlp_bias
        return d

    # ---- sizes (used by the planner) -------------------------------------------------------

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_num_params(self, kind: str = "decoder") -> int:
        """Parameters of one layer of ``kind``."""
        if kind in qwen35.KINDS:
            return qwen35.layer_num_params(self, kind)
        if kind != "decoder":
            raise ValueError(f"kind={kind!r} is not supported; valid: {list(LAYER_KINDS)}")
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        if self.qkv_bias:
            attn += self.q_size + 2 * self.kv_size
        if self.o_bias:
            attn += h
        mlp = 3 * h * i + ((2 * i + h) if self.mlp_bias else 0)
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + mlp + norms

    def embed_num_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_num_params(self) -> int:
        """Final norm plus the LM head (zero extra when tied to the embedding)."""
        return self.hidden_size + (0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size)

    def num_params(self) -> int:
        return (self.embed_num_params() + self.head_num_params()
                + sum(self.layer_num_params(k) for k in self.layer_kinds))

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)



def _preset(**kw) -> dict[str, Any]:
    return kw


# Real shapes (random init; for planning and benchmarks) and tiny *-debug flavours (for tests).
PRESETS: dict[str, dict[str, Any]] = {
    "llama-debug": _preset(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=10000.0,
                           rms_norm_eps=1e-5, max_position_embeddings=512),
    "qwen2-debug": _preset(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16, rope_theta=1e6,
                           qkv_bias=True, tie_word_embeddings=True, max_position_embeddings=512),
    "qwen3-debug": _preset(model_type="qwen3", vocab_size=256, hidden_size=64, intermediate_size=128,
                           num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e6,
                           qk_norm=True, max_position_embeddings=512),
    "qwen2.5-0.5b": _preset(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                            num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64, rope_theta=1e6,
                            qkv_bias=True, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen2.5-3b": _preset(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                          num_layers=36, num_heads=16, num_kv_heads=2, head_dim=128, rope_theta=1e6,
                          qkv_bias=True, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen2.5-7b": _preset(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                          num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6,
                          qkv_bias=True, max_position_embeddings=32768),
    "qwen2.5-14b": _preset(model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                           num_layers=48, num_heads=40, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                           rms_norm_eps=1e-5, qkv_bias=True, max_position_embeddings=32768),
    "qwen3-8b": _preset(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                        num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                        qk_norm=True, max_position_embeddings=40960),
    "qwen3-32b": _preset(model_type="qwen3", vocab_size=151936, hidden_size=5120, intermediate_size=25600,
                         num_layers=64, num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                         qk_norm=True, max_position_embeddings=40960),
    "llama3-8b": _preset(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=8192),
    "llama3-70b": _preset(model_type="llama", vocab_size=128256, hidden_size=8192, intermediate_size=28672,
                          num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
                          rms_norm_eps=1e-5, max_position_embeddings=8192),
    # The size of the paper's 27B setting (64 layers, hidden 5120, ~26.7B parameters, vocab of the
    # Qwen3.5/3.6 family) with every layer a full-attention decoder layer: the dense stand-in the
    # planner used before the hybrid family existed (``qwen3.6-27b`` is the real shape). Kept for
    # comparisons with earlier figures.
    "dense-27b": _preset(model_type="qwen3", vocab_size=248320, hidden_size=5120, intermediate_size=20480,
                         num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128, rope_theta=1e7,
                         qk_norm=True, max_position_embeddings=262144),
    # Qwen3.5/3.6 hybrid family: 8 tiny layers, transformers' default layer_types (every 4th full
    # attention: 6 Gated DeltaNet + 2 gated-attention layers), for tests.
    "qwen3.5-debug": _preset(model_type="qwen3_5_text", vocab_size=256, hidden_size=64, intermediate_size=128,
                             num_layers=8, num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=1e7,
                             partial_rotary_factor=0.25, qkv_bias=False, o_bias=False, qk_norm=True,
                             linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=512),
    # Qwen3.6-27B, the language model of the Qwen/Qwen3.6-27B checkpoint (model_type qwen3_5,
    # Qwen3_5ForConditionalGeneration). Every number is from its published config.json
    # (huggingface.co/Qwen/Qwen3.6-27B, ``text_config``), consistent with the model card there:
    # vocab_size 248320, hidden_size 5120, intermediate_size 17408, num_hidden_layers 64,
    # full_attention_interval 4 (layers 3, 7, ..., 63 full attention), num_attention_heads 24,
    # num_key_value_heads 4, head_dim 256, rope_theta 1e7, partial_rotary_factor 0.25 (rotary dim 64),
    # linear_num_key_heads 16, linear_num_value_heads 48, linear_key_head_dim 128,
    # linear_value_head_dim 128, linear_conv_kernel_dim 4, rms_norm_eps 1e-6, attention_bias false,
    # tie_word_embeddings false, max_position_embeddings 262144.
    "qwen3.6-27b": _preset(model_type="qwen3_5_text", vocab_size=248320, hidden_size=5120, intermediate_size=17408,
                           num_layers=64, num_heads=24, num_kv_heads=4, head_dim=256, rope_theta=1e7,
                           partial_rotary_factor=0.25, rms_norm_eps=1e-6, qkv_bias=False, o_bias=False,
                           qk_norm=True, linear_num_key_heads=16, linear_num_value_heads=48,
                           linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                           max_position_embeddings=262144),
}


def get_preset(name: str, **overrides) -> ModelConfig:
    """Returns the ModelConfig of a named preset; unknown names raise ValueError with suggestions.

    Example:
      >>> get_preset("qwen3-debug", num_layers=2)
    """
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"unknown model preset {name!r}.{hint} Valid presets: {sorted(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})


def resolve_config(model: Any, *, what: str = "a Model, a ModelConfig or a preset name") -> ModelConfig:
    """A ModelConfig from a preset name, a ModelConfig or anything with a ``.config`` ModelConfig."""
    if isinstance(model, str):
        return get_preset(model)
    if isinstance(model, ModelConfig):
        return model
    config = getattr(model, "config", None)
    if isinstance(config, ModelConfig):
        return config
    raise ValueError(f"model={model!r} must be {what}")


LOSS_CHUNK_BYTES = 1 << 28  # fp32 logits of one loss chunk: 256 MiB


def loss_chunk_tokens(vocab_size: int, num_tokens: int, chunk_bytes: int = LOSS_CHUNK_BYTES) -> int:
    """Tokens per loss chunk, so one chunk's fp32 logits ``[C, V]`` stay within ``chunk_bytes``.

    The one rule for the head's chunking: ``ModelUnits.head_loss`` chunks by it and the planner's
    head workspace (``schedule.costs``) is sized by it.

    Args:
      vocab_size: V; num_tokens: tokens of one head call (micro-batch x seq_len); chunk_bytes: budget.
    Returns:
      C in [1, num_tokens].
    Example:
      >>> loss_chunk_tokens(151936, 8 * 1024)
      441
    """
    return max(1, min(num_tokens, chunk_bytes // (4 * vocab_size)))
