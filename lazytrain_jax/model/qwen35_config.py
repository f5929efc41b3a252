"""The Qwen3.5 / Qwen3.6 hybrid family's part of ModelConfig (pure Python, no jax).

transformers calls the language model ``qwen3_5_text`` (``Qwen3_5ForCausalLM``); multimodal
``qwen3_5`` checkpoints (``Qwen3_5ForConditionalGeneration``) hold it in ``text_config``. Layers
are ``"linear_attention"`` (Gated DeltaNet) or ``"full_attention"`` (gated attention), listed in
``layer_types``. What differs from the dense families, read from transformers'
``models/qwen3_5``:

- every RMSNorm except the Gated DeltaNet's output norm scales by ``1 + weight`` (weights start at
  zero) and casts to the input dtype after the scale;
- full attention: ``q_proj`` emits query and a sigmoid output gate per head, q/k RMSNorm, RoPE on
  the first ``partial_rotary_factor * head_dim`` dimensions only;
- Gated DeltaNet: ``in_proj_qkv`` -> causal depthwise conv1d (kernel ``linear_conv_kernel_dim``)
  + SiLU -> q, k (``linear_num_key_heads`` x ``linear_key_head_dim``, L2-normalised) and v
  (``linear_num_value_heads`` x ``linear_value_head_dim``); the gated delta rule; a gated RMSNorm
  (``weight * norm(x) * silu(z)``); ``out_proj``.
"""

from __future__ import annotations

from typing import Any, Mapping

MODEL_TYPE = "qwen3_5_text"
MULTIMODAL_MODEL_TYPE = "qwen3_5"
KINDS = ("linear_attention", "full_attention")
DEFAULT_FULL_ATTENTION_INTERVAL = 4
LINEAR_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                 "linear_value_head_dim", "linear_conv_kernel_dim")
# transformers' Qwen3_5TextConfig keys this module reads (the rest is carried through unchanged).
_KNOWN = {"model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings",
          "initializer_range", "rms_norm_eps", "tie_word_embeddings", "rope_parameters", "rope_theta",
          "rope_scaling", "partial_rotary_factor", "attention_bias", "layer_types", "full_attention_interval",
          "torch_dtype", "dtype", "transformers_version", "architectures", *LINEAR_FIELDS}


def is_hybrid(cfg) -> bool:
    """True for configs of the Qwen3.5/3.6 hybrid family."""
    return cfg.model_type == MODEL_TYPE


def default_layer_kinds(num_layers: int, interval: int = DEFAULT_FULL_ATTENTION_INTERVAL) -> tuple[str, ...]:
    """transformers' default ``layer_types``: every ``interval``-th layer is full attention."""
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers))


def validate(cfg) -> None:
    """Family-specific checks of a ModelConfig (called from ``ModelConfig.__post_init__``)."""
    for i, kind in enumerate(cfg.layer_kinds):
        if (kind in KINDS) != is_hybrid(cfg):
            valid = list(KINDS) if is_hybrid(cfg) else ["decoder"]
            raise ValueError(f"layer_kinds[{i}]={kind!r} is not valid for model_type={cfg.model_type!r}; "
                             f"valid: {valid}")
    if not is_hybrid(cfg):
        return
    if not 0 < cfg.partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor={cfg.partial_rotary_factor!r} must be in (0, 1]")
    if rotary_dim(cfg) % 2 or rotary_dim(cfg) == 0:
        raise ValueError(f"partial_rotary_factor={cfg.partial_rotary_factor} x head_dim={cfg.head_dim} gives "
                         f"rotary dim {rotary_dim(cfg)}; it must be a positive even number")
    if cfg.rope_scaling is not None:
        raise ValueError(f"rope_scaling={dict(cfg.rope_scaling)!r} is not supported for {MODEL_TYPE}; valid: None "
                         "(rope_type 'default')")
    if "linear_attention" in cfg.layer_kinds:
        for name in LINEAR_FIELDS:
            value = getattr(cfg, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer when a layer is linear_attention")
        if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
            raise ValueError(f"linear_num_value_heads={cfg.linear_num_value_heads} must be a multiple of "
                             f"linear_num_key_heads={cfg.linear_num_key_heads}")
    if cfg.qkv_bias != cfg.o_bias or not cfg.qk_norm or cfg.mlp_bias:
        raise ValueError(f"{MODEL_TYPE} needs qkv_bias == o_bias (attention_bias), qk_norm=True and mlp_bias=False; "
                         f"got qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias}, qk_norm={cfg.qk_norm}, "
                         f"mlp_bias={cfg.mlp_bias}")


def rotary_dim(cfg) -> int:
    """Dimensions of each head that RoPE rotates (transformers: ``int(head_dim * partial_rotary_factor)``)."""
    return int(cfg.head_dim * cfg.partial_rotary_factor)


def layer_num_params(cfg, kind: str) -> int:
    """Parameters of one ``linear_attention`` or ``full_attention`` layer (MLP and both norms included)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    common = 3 * h * i + 2 * h
    if kind == "full_attention":
        attn = h * (2 * cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h + 2 * cfg.head_dim
        if cfg.qkv_bias:
            attn += 2 * cfg.q_size + 2 * cfg.kv_size + h
        return attn + common
    if kind == "linear_attention":
        key_dim = cfg.linear_num_key_heads * cfg.linear_key_head_dim
        value_dim = cfg.linear_num_value_heads * cfg.linear_value_head_dim
        conv_dim = 2 * key_dim + value_dim
        nv = cfg.linear_num_value_heads
        attn = (h * conv_dim + h * value_dim + 2 * h * nv + conv_dim * cfg.linear_conv_kernel_dim
                + 2 * nv + cfg.linear_value_head_dim + value_dim * h)
        return attn + common
    raise ValueError(f"kind={kind!r} is not a {MODEL_TYPE} layer kind; valid: {list(KINDS)}")


def kwargs_from_hf_dict(d: Mapping[str, Any]) -> dict[str, Any]:
    """ModelConfig keyword arguments from a ``qwen3_5_text`` or ``qwen3_5`` config.json dict.

    A multimodal ``qwen3_5`` config contributes its ``text_config`` (the vision tower is not part
    of the language model and is dropped; its tensors are skipped on load).
    """
    if d.get("model_type") == MULTIMODAL_MODEL_TYPE:
        text = d.get("text_config")
        if not isinstance(text, Mapping):
            raise ValueError(f"config.json: model_type={MULTIMODAL_MODEL_TYPE!r} needs a 'text_config' dict; "
                             f"got {type(text).__name__}")
        text = dict(text)
        text["model_type"] = MODEL_TYPE
        if "tie_word_embeddings" in d:
            text["tie_word_embeddings"] = d["tie_word_embeddings"]
        d = text
    act = d.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"config.json: hidden_act={act!r} is not supported; valid: ['silu']")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if key not in d:
            raise ValueError(f"config.json: required field {key!r} is missing")
    rope = dict(d.get("rope_parameters") or {})
    rope_theta = float(rope.pop("rope_theta", d.get("rope_theta", 10000.0)))
    partial = float(rope.pop("partial_rotary_factor", d.get("partial_rotary_factor", 0.25)))
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type != "default" or d.get("rope_scaling"):
        raise ValueError(f"config.json: rope_type={rope_type!r} is not supported for {MODEL_TYPE}; valid: 'default'")
    num_layers = int(d["num_hidden_layers"])
    layer_types = d.get("layer_types")
    if layer_types is None:
        kinds = default_layer_kinds(num_layers, int(d.get("full_attention_interval", DEFAULT_FULL_ATTENTION_INTERVAL)))
    else:
        kinds = tuple(layer_types)
    num_heads = int(d["num_attention_heads"])
    bias = bool(d.get("attention_bias", False))
    extra = {k: v for k, v in d.items() if k not in _KNOWN}
    if rope:  # mrope_section / mrope_interleaved: multimodal positions, identity for text
        extra["rope_parameters"] = rope
    return dict(
        model_type=MODEL_TYPE, vocab_size=int(d["vocab_size"]), hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]), num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=int(d.get("num_key_value_heads") or num_heads),
        head_dim=int(d.get("head_dim") or d["hidden_size"] // num_heads), rope_theta=rope_theta,
        rope_scaling=None, rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)), qkv_bias=bias, o_bias=bias,
        mlp_bias=False, qk_norm=True, tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
        initializer_range=float(d.get("initializer_range", 0.02)), layer_kinds=kinds,
        partial_rotary_factor=partial, extra_hf=extra,
        **{name: int(d.get(name, default)) for name, default in zip(LINEAR_FIELDS, (16, 32, 128, 128, 4))},
    )


def to_hf_dict(cfg) -> dict[str, Any]:
    """The ``qwen3_5_text`` config.json dict (``Qwen3_5ForCausalLM``) of a hybrid-family ModelConfig."""
    d: dict[str, Any] = dict(cfg.extra_hf)
    rope = {**dict(d.pop("rope_parameters", None) or {}), "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.partial_rotary_factor, "rope_type": "default"}
    d.update(
        architectures=["Qwen3_5ForCausalLM"], model_type=MODEL_TYPE, vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        hidden_act="silu", rms_norm_eps=cfg.rms_norm_eps, rope_parameters=rope, attention_bias=cfg.qkv_bias,
        tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.max_position_embeddings,
        initializer_range=cfg.initializer_range, layer_types=list(cfg.layer_kinds), torch_dtype=cfg.dtype,
        **{name: getattr(cfg, name) for name in LINEAR_FIELDS},
    )
    return d
