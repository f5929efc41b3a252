"""Rotary position embedding in Hugging Face's split-halves layout, with llama3 and linear scaling."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from lazytrain_jax.model.config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> np.ndarray:
    """[E/2] float32 inverse frequencies, computed in float32 as transformers does."""
    E = cfg.head_dim
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, E, 2, dtype=np.int64).astype(np.float32) / E)))
    inv_freq = inv_freq.astype(np.float32)
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    rope_type = scaling["rope_type"]
    factor = np.float32(scaling["factor"])
    if rope_type == "linear":
        return (inv_freq / factor).astype(np.float32)
    if rope_type == "llama3":
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = (2 * math.pi / inv_freq).astype(np.float32)
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq).astype(np.float32)
        smooth = ((old_len / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = ((1 - smooth) * scaled / factor + smooth * scaled).astype(np.float32)
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"rope_scaling.rope_type={rope_type!r} is not supported")


def rope_cos_sin(cfg: ModelConfig, positions_BxS, dtype):
    """cos, sin of shape [B, S, E] (the two halves repeated), cast to ``dtype``."""
    inv_freq = jnp.asarray(inv_frequencies(cfg))
    freqs_BxSxE2 = positions_BxS.astype(jnp.float32)[..., None] * inv_freq
    emb_BxSxE = jnp.concatenate([freqs_BxSxE2, freqs_BxSxE2], axis=-1)
    return jnp.cos(emb_BxSxE).astype(dtype), jnp.sin(emb_BxSxE).astype(dtype)


def apply_rope(x_BxSxNxE, cos_BxSxE, sin_BxSxE):
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = concat(-x2, x1)."""
    half = x_BxSxNxE.shape[-1] // 2
    x1, x2 = x_BxSxNxE[..., :half], x_BxSxNxE[..., half:]
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    cos, sin = cos_BxSxE[:, :, None, :], sin_BxSxE[:, :, None, :]
    return x_BxSxNxE * cos + rotated * sin
