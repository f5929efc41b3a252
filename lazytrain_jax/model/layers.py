"""Flax NNX modules of one streaming unit each: embedding, decoder layer, head (norm + LM head + loss).

Parameters use Hugging Face names and layouts (``Linear.weight`` is ``[out, in]``), so a layer's
state maps to checkpoint tensors by renaming alone: no transposes on load or save.

Shape legend: B batch, S sequence, D hidden, F intermediate, V vocab, H query heads, K kv heads,
G = H // K query heads per kv head, E head_dim, T tokens (B*S), C tokens per loss chunk.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.rope import apply_rope, rope_cos_sin

# transformers' eager attention adds the dtype's minimum to masked scores. A fully masked row (a
# left-padding query) then softmaxes to uniform weights, NaN-free, and gradients still flow through
# its scores; adding (not selecting) keeps our gradients identical to the reference's there too.
MASK_VALUE = float(jnp.finfo(jnp.float32).min)


class Linear(nnx.Module):
    """y = x @ weight.T + bias, weight stored ``[out, in]`` as in Hugging Face checkpoints."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool, std: float, rngs: nnx.Rngs,
                 dtype=jnp.float32):
        self.weight = nnx.Param(std * jax.random.normal(rngs.params(), (out_features, in_features), dtype))
        self.bias = nnx.Param(jnp.zeros((out_features,), dtype)) if use_bias else None

    def __call__(self, x):
        y = jnp.einsum("...i,oi->...o", x, self.weight[...].astype(x.dtype))
        if self.bias is not None:
            y = y + self.bias[...].astype(x.dtype)
        return y


class RMSNorm(nnx.Module):
    """transformers' RMSNorm: normalise in fp32, cast back, then scale by ``weight``."""

    def __init__(self, dim: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.weight[...].astype(x.dtype) * x32.astype(x.dtype)


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

    def __call__(self, x_BxSxD, cos_BxSxE, sin_BxSxE, attention_mask_BxS):
        cfg = self.cfg
        B, S, _ = x_BxSxD.shape
        K, E = cfg.num_kv_heads, cfg.head_dim
        G = cfg.num_heads // K
        q_BxSxHxE = self.q_proj(x_BxSxD).reshape(B, S, K * G, E)
        k_BxSxKxE = self.k_proj(x_BxSxD).reshape(B, S, K, E)
        v_BxSxKxE = self.v_proj(x_BxSxD).reshape(B, S, K, E)
        if self.q_norm is not None:
            q_BxSxHxE = self.q_norm(q_BxSxHxE)
            k_BxSxKxE = self.k_norm(k_BxSxKxE)
        q_BxSxHxE = apply_rope(q_BxSxHxE, cos_BxSxE, sin_BxSxE)
        k_BxSxKxE = apply_rope(k_BxSxKxE, cos_BxSxE, sin_BxSxE)
        out_BxSxHxE = attend(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS)
        return self.o_proj(out_BxSxHxE.reshape(B, S, K * G * E))


def attend(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS):
    """Causal grouped-query attention core: softmax(q k^T / sqrt(E) + mask) v, fp32 scores.

    ``attention_mask_BxS`` marks real keys (1) and padding (0); key s is visible to query q iff
    s <= q and the key is real.

    Query head h uses kv head h // G (transformers' repeat_kv layout). Masked scores get the fp32
    minimum *added* (transformers' eager attention), so fully masked rows give uniform weights.

    Returns:
      out_BxSxHxE in v's dtype.
    """
    B, S, H, E = q_BxSxHxE.shape
    K = k_BxSxKxE.shape[2]
    G = H // K
    q_BxSxKxGxE = q_BxSxHxE.reshape(B, S, K, G, E)
    scores_BxKxGxSxS = jnp.einsum("bqkge,bske->bkgqs", q_BxSxKxGxE, k_BxSxKxE,
                                  preferred_element_type=jnp.float32) * (E ** -0.5)
    mask_BxSxS = causal_padding_mask(attention_mask_BxS)
    scores_BxKxGxSxS = scores_BxKxGxSxS + jnp.where(mask_BxSxS, 0.0, MASK_VALUE)[:, None, None]
    probs_BxKxGxSxS = jax.nn.softmax(scores_BxKxGxSxS, axis=-1).astype(v_BxSxKxE.dtype)
    out_BxSxKxGxE = jnp.einsum("bkgqs,bske->bqkge", probs_BxKxGxSxS, v_BxSxKxE)
    return out_BxSxKxGxE.reshape(B, S, H, E)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        D, F, std = cfg.hidden_size, cfg.intermediate_size, cfg.initializer_range
        self.gate_proj = Linear(D, F, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)
        self.up_proj = Linear(D, F, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)
        self.down_proj = Linear(F, D, use_bias=cfg.mlp_bias, std=std, rngs=rngs, dtype=dtype)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


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
        h_BxSxD = h_BxSxD + self.self_attn(self.input_layernorm(h_BxSxD), cos_BxSxE, sin_BxSxE,
                                           attention_mask_BxS)
        return h_BxSxD + self.mlp(self.post_attention_layernorm(h_BxSxD))


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


def causal_padding_mask(attention_mask_BxS):
    """[B, S(query), S(key)] boolean: key <= query and key is not padding."""
    S = attention_mask_BxS.shape[1]
    causal_SxS = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    return causal_SxS[None] & (attention_mask_BxS[:, None, :] != 0)
