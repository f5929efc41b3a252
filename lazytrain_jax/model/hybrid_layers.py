"""Flax NNX layers of the Qwen3.5/3.6 hybrid family: Gated DeltaNet and gated full attention.

Two layer kinds, each one streaming unit called as ``layer(h_BxSxD, positions_BxS,
attention_mask_BxS) -> h_BxSxD`` and a pure function of its own parameters:

- ``"linear_attention"`` (``LinearAttentionLayer``): pre-norm Gated DeltaNet + SwiGLU MLP;
- ``"full_attention"`` (``FullAttentionLayer``): pre-norm gated attention + SwiGLU MLP.

Names and layouts are transformers' (``models/qwen3_5``), so loading and saving stay renames:
``linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, dt_bias, A_log, norm,
out_proj}`` and ``self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}``; ``conv1d.weight``
is ``[channels, 1, kernel]`` as in ``torch.nn.Conv1d``.

Shape legend: B batch, S sequence, D hidden, H query heads (full attention) or value heads (linear
attention), K kv heads (full attention), E head dim, R rotary dim, Q key heads of the linear
attention, P key head dim, V value head dim, X conv channels (2*Q*P + H*V), W conv kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.delta_rule import delta_rule_chunked, l2norm
from lazytrain_jax.model.layers import MLP, Head, Linear, attend
from lazytrain_jax.model.qwen35_config import rotary_dim
from lazytrain_jax.model.rope import apply_rope


class ZeroCenteredRMSNorm(nnx.Module):
    """transformers' ``Qwen3_5RMSNorm``: normalise in fp32, scale by ``1 + weight``, then cast."""

    def __init__(self, dim: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.zeros((dim,), dtype))
        self.eps = eps

    def __call__(self, x):
        f32 = jnp.promote_types(x.dtype, jnp.float32)
        x32 = x.astype(f32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (x32 * (1.0 + self.weight[...].astype(f32))).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """transformers' ``Qwen3_5RMSNormGated``: ``weight * norm(x) * silu(gate)`` (weight starts at one)."""

    def __init__(self, dim: int, *, eps: float, dtype=jnp.float32):
        self.weight = nnx.Param(jnp.ones((dim,), dtype))
        self.eps = eps

    def __call__(self, x, gate):
        f32 = jnp.promote_types(x.dtype, jnp.float32)
        x32 = x.astype(f32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...].astype(x.dtype) * x32.astype(x.dtype)
        return (y * jax.nn.silu(gate.astype(f32))).astype(x.dtype)


def partial_rope_cos_sin(cfg: ModelConfig, positions_BxS, dtype):
    """cos, sin [B, S, R] for the rotated first R = partial_rotary_factor * head_dim dimensions."""
    R = rotary_dim(cfg)
    inv_freq_R2 = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, R, 2).astype(np.float32) / np.float32(R))))
    freqs_BxSxR2 = positions_BxS.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq_R2.astype(np.float32))
    emb_BxSxR = jnp.concatenate([freqs_BxSxR2, freqs_BxSxR2], axis=-1)
    return jnp.cos(emb_BxSxR).astype(dtype), jnp.sin(emb_BxSxR).astype(dtype)


def apply_partial_rope(x_BxSxNxE, cos_BxSxR, sin_BxSxR):
    R = cos_BxSxR.shape[-1]
    rotated = apply_rope(x_BxSxNxE[..., :R], cos_BxSxR, sin_BxSxR)
    return jnp.concatenate([rotated, x_BxSxNxE[..., R:]], axis=-1)


class GatedAttention(nnx.Module):
    """Causal GQA with a per-head sigmoid output gate, q/k RMSNorm and partial RoPE (``self_attn``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        D, std, bias = cfg.hidden_size, cfg.initializer_range, cfg.qkv_bias
        self.cfg = cfg
        self.q_proj = Linear(D, 2 * cfg.q_size, use_bias=bias, std=std, rngs=rngs, dtype=dtype)
        self.k_proj = Linear(D, cfg.kv_size, use_bias=bias, std=std, rngs=rngs, dtype=dtype)
        self.v_proj = Linear(D, cfg.kv_size, use_bias=bias, std=std, rngs=rngs, dtype=dtype)
        self.o_proj = Linear(cfg.q_size, D, use_bias=cfg.o_bias, std=std, rngs=rngs, dtype=dtype)
        self.q_norm = ZeroCenteredRMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps, dtype=dtype)
        self.k_norm = ZeroCenteredRMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps, dtype=dtype)

    def __call__(self, x_BxSxD, positions_BxS, attention_mask_BxS):
        cfg = self.cfg
        B, S, _ = x_BxSxD.shape
        H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        qg_BxSxHx2E = self.q_proj(x_BxSxD).reshape(B, S, H, 2 * E)  # per head: [query | gate]
        gate_BxSxHE = qg_BxSxHx2E[..., E:].reshape(B, S, H * E)
        q_BxSxHxE = self.q_norm(qg_BxSxHx2E[..., :E])
        k_BxSxKxE = self.k_norm(self.k_proj(x_BxSxD).reshape(B, S, K, E))
        v_BxSxKxE = self.v_proj(x_BxSxD).reshape(B, S, K, E)
        cos_BxSxR, sin_BxSxR = partial_rope_cos_sin(cfg, positions_BxS, x_BxSxD.dtype)
        q_BxSxHxE = apply_partial_rope(q_BxSxHxE, cos_BxSxR, sin_BxSxR)
        k_BxSxKxE = apply_partial_rope(k_BxSxKxE, cos_BxSxR, sin_BxSxR)
        out_BxSxHxE = attend(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS)
        out_BxSxHE = out_BxSxHxE.reshape(B, S, H * E) * jax.nn.sigmoid(gate_BxSxHE)
        return self.o_proj(out_BxSxHE)


class DepthwiseConv1d(nnx.Module):
    """``torch.nn.Conv1d(X, X, W, groups=X, bias=False)`` weights ``[X, 1, W]``, used causally."""

    def __init__(self, channels: int, kernel: int, *, std: float, rngs: nnx.Rngs, dtype=jnp.float32):
        self.weight = nnx.Param(std * jax.random.normal(rngs.params(), (channels, 1, kernel), dtype))

    def __call__(self, x_BxSxX):
        W = self.weight.shape[-1]
        S = x_BxSxX.shape[1]
        w_XxW = self.weight[...][:, 0, :].astype(x_BxSxX.dtype)
        padded_BxS_xX = jnp.pad(x_BxSxX, ((0, 0), (W - 1, 0), (0, 0)))
        return sum(padded_BxS_xX[:, j:j + S] * w_XxW[:, j] for j in range(W))


class GatedDeltaNet(nnx.Module):
    """Gated DeltaNet token mixer (``linear_attn``): conv'd q/k/v, the gated delta rule, gated norm."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        D, std = cfg.hidden_size, cfg.initializer_range
        self.cfg = cfg
        Q, P, H, V = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_num_value_heads, cfg.linear_value_head_dim
        conv_dim = 2 * Q * P + H * V
        self.in_proj_qkv = Linear(D, conv_dim, use_bias=False, std=std, rngs=rngs, dtype=dtype)
        self.in_proj_z = Linear(D, H * V, use_bias=False, std=std, rngs=rngs, dtype=dtype)
        self.in_proj_b = Linear(D, H, use_bias=False, std=std, rngs=rngs, dtype=dtype)
        self.in_proj_a = Linear(D, H, use_bias=False, std=std, rngs=rngs, dtype=dtype)
        self.conv1d = DepthwiseConv1d(conv_dim, cfg.linear_conv_kernel_dim, std=std, rngs=rngs, dtype=dtype)
        self.dt_bias = nnx.Param(jnp.ones((H,), dtype))
        self.A_log = nnx.Param(jnp.zeros((H,), dtype))
        self.norm = GatedRMSNorm(V, eps=cfg.rms_norm_eps, dtype=dtype)
        self.out_proj = Linear(H * V, D, use_bias=False, std=std, rngs=rngs, dtype=dtype)

    def __call__(self, x_BxSxD, attention_mask_BxS):
        cfg = self.cfg
        B, S, _ = x_BxSxD.shape
        Q, P, H, V = cfg.linear_num_key_heads, cfg.linear_key_head_dim, cfg.linear_num_value_heads, cfg.linear_value_head_dim
        # padding tokens enter as zeros, so they write nothing into the recurrent state
        x_BxSxD = x_BxSxD * attention_mask_BxS[..., None].astype(x_BxSxD.dtype)
        qkv_BxSxX = jax.nn.silu(self.conv1d(self.in_proj_qkv(x_BxSxD)))
        q_BxSxQxP = qkv_BxSxX[..., :Q * P].reshape(B, S, Q, P)
        k_BxSxQxP = qkv_BxSxX[..., Q * P:2 * Q * P].reshape(B, S, Q, P)
        v_BxSxHxV = qkv_BxSxX[..., 2 * Q * P:].reshape(B, S, H, V)
        z_BxSxHxV = self.in_proj_z(x_BxSxD).reshape(B, S, H, V)
        f32 = jnp.promote_types(x_BxSxD.dtype, jnp.float32)  # the recurrence runs in (at least) fp32
        beta_BxSxH = jax.nn.sigmoid(self.in_proj_b(x_BxSxD)).astype(f32)
        a_BxSxH = self.in_proj_a(x_BxSxD).astype(f32)
        g_BxSxH = -jnp.exp(self.A_log[...].astype(f32)) * jax.nn.softplus(a_BxSxH + self.dt_bias[...].astype(f32))
        # each key head serves H // Q consecutive value heads (transformers' repeat_interleave)
        q_BxSxHxP = jnp.repeat(l2norm(q_BxSxQxP.astype(f32)), H // Q, axis=2) * (P ** -0.5)
        k_BxSxHxP = jnp.repeat(l2norm(k_BxSxQxP.astype(f32)), H // Q, axis=2)
        o_BxSxHxV = delta_rule_chunked(q_BxSxHxP, k_BxSxHxP, v_BxSxHxV.astype(f32), g_BxSxH, beta_BxSxH)
        o_BxSxHxV = self.norm(o_BxSxHxV.astype(x_BxSxD.dtype), z_BxSxHxV)
        return self.out_proj(o_BxSxHxV.reshape(B, S, H * V))


class _HybridLayer(nnx.Module):
    def _norms_and_mlp(self, cfg: ModelConfig, rngs: nnx.Rngs, dtype):
        self.input_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)
        self.mlp = MLP(cfg, rngs=rngs, dtype=dtype)


class LinearAttentionLayer(_HybridLayer):
    """Layer kind ``"linear_attention"``: h + GatedDeltaNet(norm(h)), then h + MLP(norm(h))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.linear_attn = GatedDeltaNet(cfg, rngs=rngs, dtype=dtype)
        self._norms_and_mlp(cfg, rngs, dtype)

    def __call__(self, h_BxSxD, positions_BxS, attention_mask_BxS):
        del positions_BxS  # the recurrence carries order; no positional encoding
        h_BxSxD = h_BxSxD + self.linear_attn(self.input_layernorm(h_BxSxD), attention_mask_BxS)
        return h_BxSxD + self.mlp(self.post_attention_layernorm(h_BxSxD))


class FullAttentionLayer(_HybridLayer):
    """Layer kind ``"full_attention"``: h + GatedAttention(norm(h)), then h + MLP(norm(h))."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        self.self_attn = GatedAttention(cfg, rngs=rngs, dtype=dtype)
        self._norms_and_mlp(cfg, rngs, dtype)

    def __call__(self, h_BxSxD, positions_BxS, attention_mask_BxS):
        h_BxSxD = h_BxSxD + self.self_attn(self.input_layernorm(h_BxSxD), positions_BxS, attention_mask_BxS)
        return h_BxSxD + self.mlp(self.post_attention_layernorm(h_BxSxD))


class HybridHead(Head):
    """Final norm (``1 + weight``) and LM head of the hybrid family (unit ``head``)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, dtype=jnp.float32):
        super().__init__(cfg, rngs=rngs, dtype=dtype)
        self.norm = ZeroCenteredRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, dtype=dtype)


LAYER_MODULES = {"linear_attention": LinearAttentionLayer, "full_attention": FullAttentionLayer}


def init_leaf(name: str, shape: tuple, rng: np.random.Generator, dtype) -> np.ndarray | None:
    """transformers' init of the family's special leaves (None: use the generic rule).

    ``A_log`` = log(U(0.01, 16)), ``dt_bias`` = 1, the ``1 + weight`` norms start at 0 and the gated
    norm (``linear_attn.norm``) at 1.
    """
    if name.endswith("A_log"):
        return np.log(rng.uniform(0.01, 16.0, shape)).astype(dtype)
    if name.endswith("dt_bias") or name.endswith("linear_attn.norm.weight"):
        return np.ones(shape, dtype)
    if name.endswith("norm.weight"):
        return np.zeros(shape, dtype)
    return None
