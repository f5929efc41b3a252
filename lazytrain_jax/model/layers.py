"""Flax NNX modules of one streaming unit each: embedding, decoder layer, head (norm + LM head + loss).

Parameters use Hugging Face names and layouts (``Linear.weight`` is ``[out, in]``), so a layer's
state maps to checkpoint tensors by renaming alone: no transposes on load or save.

Shape legend: B batch, S sequence, D hidden, F intermediate, V vocab, H query heads, K kv heads,
G = H // K query heads per kv head, E head_dim, T tokens (B*S), C tokens per loss chunk.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from lazytrain_jax.model.attention import BLOCK_KEYS, MASK_VALUE, blockwise_attention, causal_padding_mask  # noqa: F401
from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.rope import apply_rope, rope_cos_sin

# Residual trimming. ``jax.checkpoint`` around a region (pre-norm + projections, q/k norm + RoPE, head
# merge + output projection, pre-norm + SwiGLU) makes ``jax.vjp`` keep only the region's inputs (and
# the gate/up matmul outputs) and recompute its elementwise work in the backward pass: the forward
# values are the same operations, and no matmul is recomputed (a matmul's transpose needs only its
# inputs; the backward has as many matmuls as without the regions). What a decoder layer keeps, per token, is listed in
# ``schedule/costs.py`` (``decoder_residual_bytes_per_token``) and checked against ``jax.vjp``.


def _linear(x, w_OxI, b_O):
    y = jnp.einsum("...i,oi->...o", x, w_OxI.astype(x.dtype))
    return y if b_O is None else y + b_O.astype(x.dtype)


def _rms_norm_fn(x, w, eps: float):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * x32.astype(x.dtype)


_rms_norm = jax.checkpoint(_rms_norm_fn, static_argnums=(2,))


@functools.partial(jax.checkpoint, static_argnums=(2,))
def _norm_project(x, norm_w, eps, weights):
    """Pre-norm and projections: keeps only ``x`` (the norm is recomputed, the matmuls are not)."""
    x = x if norm_w is None else _rms_norm_fn(x, norm_w, eps)
    return tuple(_linear(x, w, b) for w, b in weights)


@functools.partial(jax.checkpoint, static_argnums=(6,))
def _qk_rope(q_BxSxHxE, k_BxSxKxE, cos_BxSxE, sin_BxSxE, qw_E, kw_E, eps):
    if qw_E is not None:
        q_BxSxHxE, k_BxSxKxE = _rms_norm(q_BxSxHxE, qw_E, eps), _rms_norm(k_BxSxKxE, kw_E, eps)
    return apply_rope(q_BxSxHxE, cos_BxSxE, sin_BxSxE), apply_rope(k_BxSxKxE, cos_BxSxE, sin_BxSxE)


@jax.checkpoint
def _merge_heads_linear(x_BxSxHxE, w_DxHE, b_D):
    return _linear(x_BxSxHxE.reshape(*x_BxSxHxE.shape[:2], -1), w_DxHE, b_D)


@functools.partial(jax.checkpoint, static_argnums=(2,), policy=jax.checkpoint_policies.dots_saveable)
def _norm_swiglu(x, norm_w, eps, gate, up, down):
    """Pre-norm SwiGLU MLP: keeps ``x`` and the gate and up outputs (the rest is recomputed)."""
    x = x if norm_w is None else _rms_norm_fn(x, norm_w, eps)
    return _linear(jax.nn.silu(_linear(x, *gate)) * _linear(x, *up), *down)


class Linear(nnx.Module):
    """y = x @ weight.T + bias, weight stored ``[out, in]`` as in Hugging Face checkpoints."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool, std: float, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.weight = nnx.Param(std * jax.random.normal(rngs.params(), (out_features, in_features), dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype)) if use_bias else None

    def __call__(self, x):
        return _linear(x, self.weight[...], self.b())

    def b(self):
        return None if self.bias is None else self.bias[...]


class RMSNorm(nnx.Module):
    """transformers' RMSNorm: normalise in fp32, cast back, then scale by ``weight``."""

    def __init__(self, dim: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        return _rms_norm(x, self.weight[...], self.eps)


class Attention(nnx.Module):
    """Grouped-query causal self-attention with RoPE, optional qkv/o bias and Qwen3 q/k norm."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        D, std = cfg.hidden_size, cfg.initializer_range
        self.cfg = cfg
        self.q_proj = Linear(D, cfg.q_size, use_bias=cfg.qkv_bias, std=std, rngs=rngs, dtype=dtype)
        self.k_proj = Linear(D, cfg.kv_size, use_bias=cfg.qkv_bias, std=std, rngs=rngs, dtype=dtype)
        self.v_proj = Linear(D, cfg.kv_size, use_bias=cfg.qkv_bias, std=std, rngs=rngs, dtype=dtype)
        self.o_proj = Linear(cfg.q_size, D, use_bias=cfg.o_bias, std=std, rngs=rngs, dtype=dtype)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps, dtype=dtype)
            self.k_norm = RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x_BxSxD, cos_BxSxE, sin_BxSxE, attention_mask_BxS, norm: RMSNorm | None = None):
        """Attention of ``x`` (or of ``norm(x)``: the pre-norm then runs inside the projections'
        checkpointed region, so its output is recomputed in the backward instead of kept)."""
        cfg = self.cfg
        B, S, _ = x_BxSxD.shape
        K, E = cfg.num_kv_heads, cfg.head_dim
        G = cfg.num_heads // K
        norm_w, eps = (None, 0.0) if norm is None else (norm.weight[...], norm.eps)
        q, k, v = _norm_project(x_BxSxD, norm_w, eps, tuple((p.weight[...], p.b()) for p in
                                                               (self.q_proj, self.k_proj, self.v_proj)))
        q_BxSxHxE = q.reshape(B, S, K * G, E)
        k_BxSxKxE = k.reshape(B, S, K, E)
        v_BxSxKxE = v.reshape(B, S, K, E)
        qw, kw = (None, None) if self.q_norm is None else (self.q_norm.weight[...], self.k_norm.weight[...])
        q_BxSxHxE, k_BxSxKxE = _qk_rope(q_BxSxHxE, k_BxSxKxE, cos_BxSxE, sin_BxSxE, qw, kw, cfg.rms_norm_eps)
        out_BxSxHxE = attend(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS)
        return _merge_heads_linear(out_BxSxHxE, self.o_proj.weight[...], self.o_proj.b())


def attend(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS):
    """Causal grouped-query attention core: softmax(q k^T / sqrt(E) + mask) v, fp32 scores.

    ``attention_mask_BxS`` marks real keys (1) and padding (0); key s is visible to query q iff
    s <= q and the key is real.

    Query head h uses kv head h // G (transformers' repeat_kv layout). Masked scores get the fp32
    minimum *added* (transformers' eager attention), so fully masked rows give uniform weights.
    Blockwise (flash-style, ``attention.blockwise_attention``): its ``jax.vjp`` residuals are q, k,
    v, the mask, the output and an fp32 log-sum-exp per query and head (O(S)); the backward's
    workspace is O(S x BLOCK_KEYS).

    Returns:
      out_BxSxHxE in v's dtype.
    Example:
      >>> out = attend(q, k, v, jnp.ones(q.shape[:2], jnp.int32))
    """
    return blockwise_attention(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, BLOCK_KEYS)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        D, F, std = cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range
        self.gate_proj = Linear(D, F, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)
        self.up_proj = Linear(D, F, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)
        self.down_proj = Linear(F, D, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)

    def __call__(self, x, norm: RMSNorm | None = None):
        """MLP of ``x`` (or of ``norm(x)``, recomputed in the backward instead of kept)."""
        norm_w, eps = (None, 0.0) if norm is None else (norm.weight[...], norm.eps)
        return _norm_swiglu(x, norm_w, eps, *((p.weight[...], p.b()) for p in
                                              (self.gate_proj, self.up_proj, self.down_proj)))


class DecoderLayer(nnx.Module):
    """Pre-norm transformer layer (layer kind ``"decoder"``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.cfg = cfg
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.self_attn = Attention(cfg, rngs=rngs, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.mlp = MLP(cfg, rngs=rngs, dtype=dtype)

    def __call__(self, h_BxSxD, positions_BxS, attention_mask_BxS):
        cos_BxSxE, sin_BxSxE = rope_cos_sin(self.cfg, positions_BxS, h_BxSxD.dtype)
        h_BxSxD = h_BxSxD + self.self_attn(h_BxSxD, cos_BxSxE, sin_BxSxE, attention_mask_BxS,
                                           norm=self.input_layernorm)
        return h_BxSxD + self.mlp(h_BxSxD, norm=self.post_attention_layernorm)


class Embedding(nnx.Module):
    """A ``[V, D]`` table named ``weight``."""

    def __init__(self, num_embeddings: int, dim: int, *, std: float, rngs: nnx.Rngs, dtype=jnp.float32):
        self.weight = nnx.Param(std * jax.random.normal(rngs.params(), (num_embeddings, dim), dtype))


class Embed(nnx.Module):
    """Token embedding (unit ``embed``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, std=cfg.initializer_range, rngs=rngs,
                                      dtype=dtype)

    def __call__(self, input_ids_BxS):
        return jnp.take(self.embed_tokens.weight[...], input_ids_BxS, axis=0)


class Head(nnx.Module):
    """Final norm and LM head (unit ``head``); the LM head is absent when tied to the embedding."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, use_bias=False, std=cfg.initializer_range, rngs=rngs, dtype=dtype)

    def logits_weight(self, tied_weight_VxD):
        return tied_weight_VxD if self.lm_head is None else self.lm_head.weight[...]
