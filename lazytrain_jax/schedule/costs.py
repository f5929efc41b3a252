"""Costs: per-unit bytes and times of one step, from the model shape (analytic) or a profiler.

Units are ``embed``, ``layer_0 .. layer_{L-1}``, ``head``. Every per-unit quantity is a list (layers
of different kinds are first class), so the profiler of the executor can fill the same structure
with measurements (``source="measured"``).

Analytic formulas (tokens τ = batch × seq, micro-batch tokens τ_m = τ / num_micro_batches, w = bytes
of the stream dtype: 2 for ``bfloat16``, 4 for ``float32``). The byte rules follow what the model's
units allocate; ``lazytrain_jax.model.unit_bytes`` measures the same quantities with ``jax.eval_shape``
and XLA, and a test holds the two together on real shapes.

- weights stream in the stream dtype (w B/param); gradients go down in ``grad_dtype`` (defaults to
  fp32 for an fp32 stream, else bf16).
- the embedding runs on the host: its gathered rows (= boundary 0, τ·D·w bytes) are its upload and
  the gradient of boundary 0 is its download (scatter-added into the table on the host).
- boundary bytes = batch × seq × hidden × w.
- forward FLOPs of a decoder layer = 2·P_layer·τ + causal attention 4·S²·heads·head_dim·B / 2.
  Backward = 2 × forward; with the in-layer (interior) recompute one more forward.
- time of a call = FLOPs / (F · τ_m / (τ_m + t_half)): a rate that drops for small micro-batches.
- interior residuals of a decoder layer kept by ``jax.vjp`` (the layer's own weights excluded), per
  token: the layer input and the post-attention residual stream (2D; the norms are recomputed from
  them), RoPE cos and sin (2E), q and k after RoPE and v (q_size + 2·kv_size), the attention output
  (q_size), the MLP gate and up outputs (2I), all in the stream dtype; with q/k norm also q and k
  before it (q_size + kv_size); plus the attention's fp32 log-sum-exp (4·heads bytes) and the int32
  attention mask (4 bytes). Exact (``decoder_residual_bytes_per_token``).
- backward workspace of a layer (one micro-batch, the recompute backward): its residuals
  rematerialised, four fp32 [heads, S, Z] attention blocks (Z = min(S, ATTENTION_BLOCK_KEYS); the
  attention backward computes them in fp32), four [τ_m, I] MLP gradient temporaries and one
  [τ_m, D] gradient temporary in the stream dtype (cotangents keep their primal's dtype)
  (``decoder_workspace_bytes``): a model of XLA's compiled temp bytes, measured/predicted 0.69-0.98
  on the CPU backend in fp32 (see ``tests/model/test_unit_bytes.py``; not yet checked on an accelerator).
- Qwen3.5/3.6 hybrid kinds (``hybrid_*`` functions, keyed by kind; R rotary dim, W conv kernel,
  Hv/Hk value/key heads of the Gated DeltaNet with dims V/K, X = 2·Hk·K + Hv·V conv channels, C = 64
  the delta rule's chunk). ``full_attention`` (gated attention): forward FLOPs as a decoder layer;
  residuals w·(2I + 6·q_size + 2D + 2·kv_size + 4R) + 4·(2·q_size + 4D + 2·kv_size) + the
  log-sum-exp, the mask and 4·(2·heads + 2·kv_heads + 4) bytes per token (the ``1 + w`` norms and
  q/k norms keep fp32 copies); workspace as a decoder layer's with these residuals.
  ``linear_attention`` (Gated DeltaNet): forward FLOPs 2·P_layer·τ plus, per token and value head,
  2·C·(2K + V) + C·(K + V) + 6·K·V + 2·C² (intra-chunk products, the unit-triangular inverse, state
  reads and updates, decay spans); residuals w·(2I + (W + 3)·X + 2·Hv·V + 2D) + 4·(2·Hv·K +
  7·Hv·V + 4D + 2·Hk·K + 8·Hv) per token (the delta rule is rematerialised in backward, so its
  chunk tensors are not kept); workspace = residuals + the recomputed chunk tensors, fp32
  Hv·K·V/C (chunk-boundary states) + 30·Hv·C per token (fitted to XLA's compiled temporaries at
  the 27B shape), + the MLP gradient temporaries as for a decoder layer. Tests:
  ``tests/schedule/test_qwen35_costs.py``.
- head: final norm + LM head + loss chunked over ``loss_chunk_tokens(V, τ_m)`` tokens (the rule the
  units use); forward 2·V·D·τ, backward 4·V·D·τ, both in the head window; working set = head weights
  (stream dtype) + the head gradient accumulated in fp32 on the device (x2 with several
  micro-batches: one micro-batch's gradient and the sum; the executor's rule) + fp32 logits and
  their gradient for one chunk (2 · chunk · V · 4 bytes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any, Mapping, Sequence

from lazytrain_jax.model.config import loss_chunk_tokens
from lazytrain_jax.schedule.hardware import check_positive_int

GRAD_DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
STREAM_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ATTENTION_BLOCK_KEYS = 256  # keys per block of the blockwise attention (model.attention.BLOCK_KEYS)
MASK_BYTES = 4  # the int32 attention mask, kept by the attention's backward
LSE_BYTES = 4  # fp32 log-sum-exp per query and head

_UNIT_LISTS = ("unit_names", "unit_kinds", "num_params", "weight_bytes", "grad_bytes", "fwd_time",
               "bwd_time", "bwd_recompute_time")
_LAYER_LISTS = ("residual_bytes", "workspace_bytes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Costs:
    """Per-unit costs of one training step at (batch, seq, micro-batches).

    Unit lists have L + 2 entries (embed, layers, head); ``boundary_bytes`` has L + 1 (boundary i is
    the input of layer i, full batch); ``residual_bytes`` (full batch) and ``workspace_bytes`` (one
    micro-batch) have L. Times are seconds for the whole batch (all micro-batches); ``fwd_time`` of
    the head holds its forward and backward (they run in one window) and its ``bwd_time`` is 0.

    Args:
      model_name: a label of the model; model_fingerprint: a hash of its shape.
      batch_size, seq_len, num_micro_batches: the step these costs are for.
      grad_dtype: dtype of gradients sent down (``bfloat16`` | ``float32``).
      stream_dtype: dtype of streamed weights and activations (``bfloat16`` | ``float32``).
      head_workspace_bytes: device bytes of the head/loss window (weights, gradient, logits chunk).
      source: ``analytic`` | ``measured``.
      opt_params: per unit, the host optimizer's work in parameters at ``Hardware.host_opt_rate``
        (None: ``num_params``). ``lt.profile`` weighs the embedding's and head's tensors whose Adam
        state stays fp32 (``adamw_8bit``'s default ``fp32_state_filter``: the native kernel's fp32
        loop, or the XLA path without it, at another rate than a layer's 8-bit update) by the
        measured ratio of the two rates. Read it as :attr:`optimizer_params`.
      head_link_factor: the head unit's weight upload and gradient download, each as a multiple of
        its bytes at the link's rate (``Hardware.h2d_bw`` / ``d2h_bw``, which ``lt.profile`` times
        on a layer's arrays); None: (1, 1). ``lt.profile`` measures it: a tied head's table is one
        large array, which moves into a fresh block every step (on the CPU backend 3-4x a layer's
        time per byte with huge pages). Read the link's bytes as :attr:`link_weight_bytes` and
        :attr:`link_grad_bytes`.

    Example:
      >>> c = analytic_costs(get_preset("qwen2.5-7b"), batch_size=8, seq_len=1024, device_flops=4e14)
      >>> Costs.from_dict(c.to_dict()) == c
      True
    """

    model_name: str
    model_fingerprint: str
    batch_size: int
    seq_len: int
    num_micro_batches: int = 1
    grad_dtype: str = "bfloat16"
    stream_dtype: str = "bfloat16"
    unit_names: tuple[str, ...]
    unit_kinds: tuple[str, ...]
    num_params: tuple[int, ...]
    weight_bytes: tuple[float, ...]
    grad_bytes: tuple[float, ...]
    fwd_time: tuple[float, ...]
    bwd_time: tuple[float, ...]
    bwd_recompute_time: tuple[float, ...]
    boundary_bytes: tuple[float, ...]
    residual_bytes: tuple[float, ...]
    workspace_bytes: tuple[float, ...]
    head_workspace_bytes: float
    source: str = "analytic"
    opt_params: tuple[float, ...] | None = None
    head_link_factor: tuple[float, float] | None = None

    def __post_init__(self):
        for name in _UNIT_LISTS + _LAYER_LISTS + ("boundary_bytes",):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.opt_params is not None:
            object.__setattr__(self, "opt_params", tuple(float(x) for x in self.opt_params))
            if len(self.opt_params) != len(self.unit_names):
                raise ValueError(f"Costs.opt_params has {len(self.opt_params)} entries; expected "
                                 f"{len(self.unit_names)} (one per unit)")
            for i, value in enumerate(self.opt_params):
                if not value >= 0:
                    raise ValueError(f"Costs.opt_params[{i}]={value!r} must be >= 0")
        if self.head_link_factor is not None:
            object.__setattr__(self, "head_link_factor", tuple(float(x) for x in self.head_link_factor))
            if len(self.head_link_factor) != 2 or not all(0 < x < math.inf for x in self.head_link_factor):
                raise ValueError(f"Costs.head_link_factor={self.head_link_factor!r} must be two finite factors > 0 "
                                 f"(upload, download), or None")
        for name in ("batch_size", "seq_len", "num_micro_batches"):
            check_positive_int(f"Costs.{name}", getattr(self, name))
        if self.batch_size % self.num_micro_batches:
            raise ValueError(f"Costs.num_micro_batches={self.num_micro_batches} must divide "
                             f"batch_size={self.batch_size}")
        if self.grad_dtype not in GRAD_DTYPE_BYTES:
            raise ValueError(f"Costs.grad_dtype={self.grad_dtype!r}; valid: {sorted(GRAD_DTYPE_BYTES)}")
        if self.stream_dtype not in STREAM_DTYPE_BYTES:
            raise ValueError(f"Costs.stream_dtype={self.stream_dtype!r}; valid: {sorted(STREAM_DTYPE_BYTES)}")
        num_units = len(self.unit_names)
        if num_units < 3:
            raise ValueError(f"Costs needs embed, at least one layer and head; got {num_units} units")
        for name in _UNIT_LISTS:
            if len(getattr(self, name)) != num_units:
                raise ValueError(f"Costs.{name} has {len(getattr(self, name))} entries; expected {num_units}")
        for name in _LAYER_LISTS:
            if len(getattr(self, name)) != num_units - 2:
                raise ValueError(f"Costs.{name} has {len(getattr(self, name))} entries; "
                                 f"expected {num_units - 2} (one per layer)")
        if len(self.boundary_bytes) != num_units - 1:
            raise ValueError(f"Costs.boundary_bytes has {len(self.boundary_bytes)} entries; "
                             f"expected {num_units - 1} (num_layers + 1)")
        for name in _UNIT_LISTS[2:] + _LAYER_LISTS + ("boundary_bytes",):
            for i, value in enumerate(getattr(self, name)):
                if not value >= 0:
                    raise ValueError(f"Costs.{name}[{i}]={value!r} must be >= 0")
        if self.source not in ("analytic", "measured"):
            raise ValueError(f"Costs.source={self.source!r}; valid: ['analytic', 'measured']")

    @property
    def num_layers(self) -> int:
        return len(self.unit_names) - 2

    @property
    def optimizer_params(self) -> tuple:
        """Per unit, the host optimizer's work in parameters at ``Hardware.host_opt_rate``
        (``opt_params``, else ``num_params``): a unit's update takes this / host_opt_rate seconds."""
        return self.opt_params if self.opt_params is not None else self.num_params

    @property
    def link_weight_bytes(self) -> tuple:
        """``weight_bytes`` as the H2D link spends them: the head's times ``head_link_factor[0]``
        (the step model's upload seconds are these over ``Hardware.h2d_bw``; memory reads
        ``weight_bytes``)."""
        if self.head_link_factor is None:
            return self.weight_bytes
        return self.weight_bytes[:-1] + (self.weight_bytes[-1] * self.head_link_factor[0],)

    @property
    def link_grad_bytes(self) -> tuple:
        """``grad_bytes`` as the D2H link spends them: the head's times ``head_link_factor[1]``."""
        if self.head_link_factor is None:
            return self.grad_bytes
        return self.grad_bytes[:-1] + (self.grad_bytes[-1] * self.head_link_factor[1],)

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.num_micro_batches

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len

    def layer(self, name: str) -> tuple:
        """Per-layer slice of a unit list (drops embed and head)."""
        return getattr(self, name)[1:-1]

    def total_params(self) -> int:
        return sum(self.num_params)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else v)
                for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Costs":
        from lazytrain_jax.schedule.hardware import dataclass_from_dict
        return dataclass_from_dict(cls, d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Costs":
        return cls.from_dict(json.loads(text))

    def summary(self) -> dict[str, Any]:
        """Totals for records: parameters, bytes and seconds of one step."""
        return dict(model_name=self.model_name, model_fingerprint=self.model_fingerprint,
                    num_layers=self.num_layers, batch_size=self.batch_size, seq_len=self.seq_len,
                    num_micro_batches=self.num_micro_batches, grad_dtype=self.grad_dtype,
                    stream_dtype=self.stream_dtype, source=self.source,
                    total_params=self.total_params(), weight_bytes=sum(self.weight_bytes),
                    boundary_bytes=sum(self.boundary_bytes), fwd_time=sum(self.fwd_time),
                    bwd_time=sum(self.bwd_time), bwd_recompute_time=sum(self.bwd_recompute_time),
                    head_link_factor=self.head_link_factor)


def config_fingerprint(config) -> str:
    """A short stable hash of a ModelConfig's shape (what a plan depends on)."""
    keys = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
            "num_kv_heads", "head_dim", "qkv_bias", "o_bias", "mlp_bias", "qk_norm", "tie_word_embeddings")
    payload = {k: getattr(config, k) for k in keys}
    payload["layer_kinds"] = list(config.layer_kinds)
    if "linear_attention" in config.layer_kinds:  # Gated DeltaNet geometry (absent from dense configs)
        for key in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                    "linear_conv_kernel_dim"):
            payload[key] = getattr(config, key)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def config_name(config) -> str:
    return f"{config.model_type}-L{config.num_layers}-H{config.hidden_size}"


def decoder_residual_bytes_per_token(config, stream_dtype: str = "bfloat16") -> int:
    """Bytes per token that ``jax.vjp`` keeps inside one decoder layer (see the module docstring).

    Example:
      >>> decoder_residual_bytes_per_token(get_preset("qwen2.5-0.5b"))  # 31036
    """
    w = STREAM_DTYPE_BYTES[stream_dtype]
    d, q, kv = config.hidden_size, config.q_size, config.kv_size
    elems = 2 * d + 2 * config.head_dim + 2 * q + 2 * kv + 2 * config.intermediate_size
    if config.qk_norm:
        elems += q + kv
    return w * elems + LSE_BYTES * config.num_heads + MASK_BYTES


def decoder_workspace_bytes(config, micro_batch_size: int, seq_len: int, stream_dtype: str = "bfloat16") -> float:
    """Backward workspace of one decoder layer for one micro-batch (see the module docstring)."""
    tokens = micro_batch_size * seq_len
    block = min(seq_len, ATTENTION_BLOCK_KEYS)
    attention = 4 * micro_batch_size * config.num_heads * seq_len * block * 4
    grads = (4 * config.intermediate_size + config.hidden_size) * STREAM_DTYPE_BYTES[stream_dtype] * tokens
    return float(decoder_residual_bytes_per_token(config, stream_dtype) * tokens + attention + grads)


def head_workspace_bytes(config, micro_batch_size: int, seq_len: int, stream_dtype: str = "bfloat16",
                         num_micro_batches: int = 1) -> float:
    """Head/loss window: head weights (stream dtype), their gradient accumulated in fp32 on the device
    (twice when micro-batched: one micro-batch's gradient and the running sum) and one loss chunk's
    fp32 logits and their gradient."""
    matrix = config.vocab_size * config.hidden_size + config.hidden_size  # LM head (maybe tied) + norm
    chunk = loss_chunk_tokens(config.vocab_size, micro_batch_size * seq_len)
    grads = 4 * (2 if num_micro_batches > 1 else 1)
    return float(matrix * (STREAM_DTYPE_BYTES[stream_dtype] + grads) + 2 * chunk * config.vocab_size * 4)


def layer_residual_and_workspace(config, kind: str, micro_batch_size: int, seq_len: int,
                                 stream_dtype: str = "bfloat16") -> tuple[int, float]:
    """(residual bytes per token, backward workspace bytes of one micro-batch) of a layer kind."""
    if kind == "decoder":
        return (decoder_residual_bytes_per_token(config, stream_dtype),
                decoder_workspace_bytes(config, micro_batch_size, seq_len, stream_dtype))
    if kind in HYBRID_KINDS:
        return (hybrid_residual_bytes_per_token(config, kind, stream_dtype),
                hybrid_workspace_bytes(config, kind, micro_batch_size, seq_len, stream_dtype))
    raise ValueError(f"layer kind {kind!r} has no byte model; valid: ['decoder', {', '.join(map(repr, HYBRID_KINDS))}]")


HYBRID_KINDS = ("linear_attention", "full_attention")
DELTA_RULE_CHUNK = 64


def hybrid_residual_bytes_per_token(config, kind: str, stream_dtype: str = "bfloat16") -> int:
    """Residual bytes per token of a Qwen3.5/3.6 hybrid layer (see the module docstring)."""
    w = STREAM_DTYPE_BYTES[stream_dtype]
    d, i = config.hidden_size, config.intermediate_size
    if kind == "full_attention":
        q, kv, r = config.q_size, config.kv_size, int(config.head_dim * config.partial_rotary_factor)
        return (w * (2 * i + 6 * q + 2 * d + 2 * kv + 4 * r) + 4 * (2 * q + 4 * d + 2 * kv)
                + LSE_BYTES * config.num_heads + MASK_BYTES + 4 * (2 * config.num_heads + 2 * config.num_kv_heads + 4))
    hk, k = config.linear_num_key_heads, config.linear_key_head_dim
    hv, v = config.linear_num_value_heads, config.linear_value_head_dim
    x = 2 * hk * k + hv * v
    return (w * (2 * i + (config.linear_conv_kernel_dim + 3) * x + 2 * hv * v + 2 * d)
            + 4 * (2 * hv * k + 7 * hv * v + 4 * d + 2 * hk * k + 8 * hv))


def hybrid_workspace_bytes(config, kind: str, micro_batch_size: int, seq_len: int,
                           stream_dtype: str = "bfloat16") -> float:
    """Backward workspace of one hybrid layer for one micro-batch (see the module docstring)."""
    tokens = micro_batch_size * seq_len
    if kind == "full_attention":
        decoder = decoder_workspace_bytes(config, micro_batch_size, seq_len, stream_dtype)
        return float(decoder + (hybrid_residual_bytes_per_token(config, kind, stream_dtype)
                                - decoder_residual_bytes_per_token(config, stream_dtype)) * tokens)
    k, v, c, hv = config.linear_key_head_dim, config.linear_value_head_dim, DELTA_RULE_CHUNK, config.linear_num_value_heads
    chunk_tensors = 4 * (hv * k * v / c + 30 * hv * c)
    grads = (4 * config.intermediate_size + config.hidden_size) * STREAM_DTYPE_BYTES[stream_dtype]
    return float((hybrid_residual_bytes_per_token(config, kind, stream_dtype) + chunk_tensors + grads) * tokens)


def hybrid_recurrent_flops_per_token(config) -> float:
    """Gated delta rule FLOPs per token of a ``linear_attention`` layer (chunked form, forward)."""
    k, v, c = config.linear_key_head_dim, config.linear_value_head_dim, DELTA_RULE_CHUNK
    per_head = 2 * c * (2 * k + v) + c * (k + v) + 6 * k * v + 2 * c * c
    return float(config.linear_num_value_heads * per_head)


def layer_fwd_flops(config, kind: str, batch_size: int, seq_len: int) -> float:
    """Forward FLOPs of one layer for a batch: matmuls plus causal attention (or the recurrence)."""
    tokens = batch_size * seq_len
    if kind == "linear_attention":
        return 2.0 * config.layer_num_params(kind) * tokens + hybrid_recurrent_flops_per_token(config) * tokens
    attention = 4.0 * seq_len**2 * config.num_heads * config.head_dim * batch_size / 2
    return 2.0 * config.layer_num_params(kind) * tokens + attention


def achieved_rate(device_flops: float, efficiency_half_tokens: float, call_tokens: int) -> float:
    return device_flops * call_tokens / (call_tokens + efficiency_half_tokens)


def analytic_costs(config, *, batch_size: int, seq_len: int, device_flops: float,
                   num_micro_batches: int = 1, efficiency_half_tokens: float = 256.0,
                   grad_dtype: str | None = None, stream_dtype: str = "bfloat16",
                   model_name: str | None = None) -> Costs:
    """Costs of one step from the model shape (see the module docstring for every formula).

    Args:
      config: a ModelConfig.
      batch_size, seq_len: the step; num_micro_batches: layer-major micro-batches (divides batch).
      device_flops, efficiency_half_tokens: achieved rate (see Hardware).
      grad_dtype: ``bfloat16`` | ``float32`` gradients sent to the host; defaults to ``float32`` for an
        fp32 stream, else ``bfloat16``.
      stream_dtype: ``bfloat16`` (training; or ``float16``) | ``float32`` (exactness runs): streamed
        weights and activations (boundaries, residuals).
      model_name: a label; defaults to ``model_type-L{layers}-H{hidden}``.
    Returns:
      Costs with ``source="analytic"``.
    Example:
      >>> analytic_costs(get_preset("qwen3.6-27b"), batch_size=72, seq_len=1024, device_flops=5e14)
    """
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("num_micro_batches", num_micro_batches)):
        check_positive_int(name, value)
    if batch_size % num_micro_batches:
        raise ValueError(f"num_micro_batches={num_micro_batches} must divide batch_size={batch_size}")
    if stream_dtype not in STREAM_DTYPE_BYTES:
        raise ValueError(f"stream_dtype={stream_dtype!r}; valid: {sorted(STREAM_DTYPE_BYTES)}")
    if grad_dtype is None:
        grad_dtype = "float32" if stream_dtype == "float32" else "bfloat16"
    if grad_dtype not in GRAD_DTYPE_BYTES:
        raise ValueError(f"grad_dtype={grad_dtype!r}; valid: {sorted(GRAD_DTYPE_BYTES)}")
    if not device_flops > 0:
        raise ValueError(f"device_flops={device_flops!r} must be > 0")
    tokens = batch_size * seq_len
    micro = batch_size // num_micro_batches
    rate = achieved_rate(device_flops, efficiency_half_tokens, micro * seq_len)
    gbytes = GRAD_DTYPE_BYTES[grad_dtype]
    h, v = config.hidden_size, config.vocab_size
    wb = STREAM_DTYPE_BYTES[stream_dtype]
    boundary = float(tokens * h * wb)

    names, kinds, params, wbytes, gbytes_l, fwd, bwd, bwd_rc = [], [], [], [], [], [], [], []
    residual, workspace = [], []
    # embed: host gather; upload the gathered rows, download the gradient of boundary 0.
    names.append("embed"); kinds.append("embed"); params.append(config.embed_num_params())
    wbytes.append(boundary); gbytes_l.append(boundary); fwd.append(0.0); bwd.append(0.0); bwd_rc.append(0.0)
    for idx, kind in enumerate(config.layer_kinds):
        p = config.layer_num_params(kind)
        f = layer_fwd_flops(config, kind, batch_size, seq_len) / rate
        names.append(f"layer_{idx}"); kinds.append(kind); params.append(p)
        wbytes.append(float(p * wb)); gbytes_l.append(float(p * gbytes))
        fwd.append(f); bwd.append(2 * f); bwd_rc.append(3 * f)
        res_tok, ws = layer_residual_and_workspace(config, kind, micro, seq_len, stream_dtype)
        residual.append(float(res_tok * tokens))
        workspace.append(ws)
    head_params = config.head_num_params()
    head_matrix = v * h  # the LM head matmul uses the (possibly tied) V x H matrix
    names.append("head"); kinds.append("head"); params.append(head_params)
    head_w = float((head_matrix + h) * wb)
    head_g = float((head_matrix + h) * gbytes)
    wbytes.append(head_w); gbytes_l.append(head_g)
    fwd.append(6.0 * head_matrix * tokens / rate); bwd.append(0.0); bwd_rc.append(0.0)
    head_ws = head_workspace_bytes(config, micro, seq_len, stream_dtype, num_micro_batches)
    return Costs(model_name=model_name or config_name(config), model_fingerprint=config_fingerprint(config),
                 batch_size=batch_size, seq_len=seq_len, num_micro_batches=num_micro_batches,
                 grad_dtype=grad_dtype, stream_dtype=stream_dtype, unit_names=tuple(names), unit_kinds=tuple(kinds),
                 num_params=tuple(params), weight_bytes=tuple(wbytes), grad_bytes=tuple(gbytes_l),
                 fwd_time=tuple(fwd), bwd_time=tuple(bwd), bwd_recompute_time=tuple(bwd_rc),
                 boundary_bytes=(boundary,) * (config.num_layers + 1), residual_bytes=tuple(residual),
                 workspace_bytes=tuple(workspace), head_workspace_bytes=head_ws)


def synthetic_costs(*, num_layers: int, weight_bytes: Sequence[float] | float, boundary_bytes: Sequence[float] | float,
                    fwd_time: Sequence[float] | float, residual_bytes: Sequence[float] | float = 0.0,
                    workspace_bytes: float = 0.0, head_time: float = 0.0, head_bytes: float = 0.0,
                    embed_bytes: float | None = None, num_params: Sequence[int] | int | None = None,
                    batch_size: int = 1, seq_len: int = 1, grad_scale: float = 1.0,
                    head_workspace_bytes: float = 0.0, bwd_ratio: float = 2.0) -> Costs:
    """Hand-made Costs for tests and what-if studies (scalars broadcast over layers).

    Example:
      >>> synthetic_costs(num_layers=4, weight_bytes=1e9, boundary_bytes=2e8, fwd_time=0.05)
    """
    def per_layer(x, n):
        return [float(v) for v in x] if isinstance(x, (list, tuple)) else [float(x)] * n
    wl, fl, rl = per_layer(weight_bytes, num_layers), per_layer(fwd_time, num_layers), per_layer(residual_bytes, num_layers)
    al = per_layer(boundary_bytes, num_layers + 1)
    pl = ([int(w / 2) for w in wl] if num_params is None else
          list(num_params) if isinstance(num_params, (list, tuple)) else [int(num_params)] * num_layers)
    emb = al[0] if embed_bytes is None else float(embed_bytes)
    return Costs(model_name=f"synthetic-L{num_layers}", model_fingerprint="synthetic", batch_size=batch_size,
                 seq_len=seq_len, unit_names=("embed",) + tuple(f"layer_{i}" for i in range(num_layers)) + ("head",),
                 unit_kinds=("embed",) + ("decoder",) * num_layers + ("head",),
                 num_params=tuple([int(emb / 2)] + pl + [int(head_bytes / 2)]),
                 weight_bytes=tuple([emb] + wl + [head_bytes]),
                 grad_bytes=tuple([emb] + [w * grad_scale for w in wl] + [head_bytes * grad_scale]),
                 fwd_time=tuple([0.0] + fl + [head_time]), bwd_time=tuple([0.0] + [bwd_ratio * f for f in fl] + [0.0]),
                 bwd_recompute_time=tuple([0.0] + [(bwd_ratio + 1) * f for f in fl] + [0.0]),
                 boundary_bytes=tuple(al), residual_bytes=tuple(rl),
                 workspace_bytes=tuple([float(workspace_bytes)] * num_layers), head_workspace_bytes=head_workspace_bytes)
