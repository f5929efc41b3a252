"""Memory-efficient causal attention: a blockwise (flash-style) form with its own ``custom_vjp``.

The forward scans key blocks with a running max and sum and saves only q, k, v, the output and the
fp32 log-sum-exp (O(S) residuals); the backward scans the key blocks again, recomputing each block's
probabilities from the log-sum-exp (O(S · block) workspace). Nothing of size S × S ever exists.

Semantics are transformers' eager attention, exactly: scores in fp32, masked scores get the fp32
minimum *added*, softmax over all S keys. A query that sees no key at all (a left-padding query)
therefore gets uniform weights over all S keys — future and padding keys included — and its
gradient flows through every score, as in the eager reference (``eager_attention``, kept for tests).

Shape legend: B batch, S sequence, H query heads, K kv heads, G = H // K, E head_dim, N key blocks,
Z keys per block, Q = G · S (one kv head's query rows).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

MASK_VALUE = float(np.finfo(np.float32).min)
BLOCK_KEYS = 256  # keys per block: the backward's workspace is a few [B, H, S, BLOCK_KEYS] fp32 tensors


def causal_padding_mask(attention_mask_BxS):
    """[B, S(query), S(key)] boolean: key <= query and key is not padding."""
    S = attention_mask_BxS.shape[1]
    causal_SxS = jnp.arange(S)[:, None] >= jnp.arange(S)[None, :]
    return causal_SxS[None] & (attention_mask_BxS[:, None, :] != 0)


def eager_attention(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS):
    """transformers' eager attention (full [B, K, G, S, S] fp32 scores): the numerical reference."""
    B, S, H, E = q_BxSxHxE.shape
    K = k_BxSxKxE.shape[2]
    q_BxSxKxGxE = q_BxSxHxE.reshape(B, S, K, H // K, E)
    scores = jnp.einsum("bqkge,bske->bkgqs", q_BxSxKxGxE, k_BxSxKxE, preferred_element_type=jnp.float32) * (E ** -0.5)
    scores = scores + jnp.where(causal_padding_mask(attention_mask_BxS), 0.0, MASK_VALUE)[:, None, None]
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxSxKxE.dtype)
    return jnp.einsum("bkgqs,bske->bqkge", probs, v_BxSxKxE).reshape(B, S, H, E)


def blockwise_attention(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, block_size: int = BLOCK_KEYS):
    """Causal grouped-query attention with O(S) residuals and O(S · block_size) workspace.

    Args:
      q_BxSxHxE: queries (RoPE applied); k_BxSxKxE, v_BxSxKxE: keys and values, K divides H
        (query head h uses kv head h // G, transformers' repeat_kv layout).
      attention_mask_BxS: 1 for real tokens, 0 for padding; key s is visible to query q iff s <= q
        and key s is real.
      block_size: keys per block (any S works; the last block is padded internally).
    Returns:
      out_BxSxHxE in v's dtype; equal to ``eager_attention`` up to floating-point rounding, values
      and gradients alike.
    Example:
      >>> out = blockwise_attention(q, k, v, jnp.ones(q.shape[:2], jnp.int32), block_size=128)
    """
    if block_size <= 0:
        raise ValueError(f"block_size={block_size!r} must be a positive integer")
    return _attention(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, block_size)


def _blocks(x_BxSx___, num_blocks: int, block: int, fill=0):
    """[B, S, ...] -> [N, B, Z, ...], the sequence padded to N·Z with ``fill``."""
    B, S = x_BxSx___.shape[:2]
    pad = [(0, 0), (0, num_blocks * block - S)] + [(0, 0)] * (x_BxSx___.ndim - 2)
    x = jnp.pad(x_BxSx___, pad, constant_values=fill)
    return jnp.moveaxis(x.reshape(B, num_blocks, block, *x_BxSx___.shape[2:]), 1, 0)


def _kv_blocks(x_BxSxKxE, num_blocks: int, block: int):
    """Keys or values [B, S, K, E] -> [N, B, K, Z, E] (zero-padded), each block's keys contiguous
    per kv head, so that the per-block products are plain batched matmuls over (B, K)."""
    B, S, K, E = x_BxSxKxE.shape
    x = jnp.pad(x_BxSxKxE, [(0, 0), (0, num_blocks * block - S), (0, 0), (0, 0)])
    return jnp.transpose(x.reshape(B, num_blocks, block, K, E), (1, 0, 3, 2, 4))


def _kv_unblock(x_NxBxKxZxE, S: int):
    """[N, B, K, Z, E] -> [B, S, K, E] (the padding dropped)."""
    N, B, K, Z, E = x_NxBxKxZxE.shape
    return jnp.transpose(x_NxBxKxZxE, (1, 0, 3, 2, 4)).reshape(B, N * Z, K, E)[:, :S]


def _heads_major(x_BxSxHxE, K: int):
    """[B, S, H, E] -> [B, K, G·S, E]: query head h = k·G + g (transformers' repeat_kv layout), its
    S rows after those of head h − 1 of the same kv head."""
    B, S, H, E = x_BxSxHxE.shape
    return jnp.transpose(x_BxSxHxE.reshape(B, S, K, H // K, E), (0, 2, 3, 1, 4)).reshape(B, K, H // K * S, E)


def _heads_minor(x_BxKxGSxE, S: int):
    """The inverse of :func:`_heads_major`: [B, K, G·S, E] -> [B, S, H, E]."""
    B, K, GS, E = x_BxKxGSxE.shape
    G = GS // S
    return jnp.transpose(x_BxKxGSxE.reshape(B, K, G, S, E), (0, 3, 1, 2, 4)).reshape(B, S, K * G, E)


def _block_scores(q_BxKxGSxE, k_BxKxZxE, m_BxZ, j_Z, S: int):
    """fp32 scores [B, K, G·S, Z] of one key block, masked as the eager form does; block padding
    gets -inf."""
    B, K, GS, E = q_BxKxGSxE.shape
    Z = k_BxKxZxE.shape[2]
    s = jnp.einsum("bkqe,bkze->bkqz", q_BxKxGSxE, k_BxKxZxE, preferred_element_type=jnp.float32) * (E ** -0.5)
    s = s.reshape(B, K, GS // S, S, Z)
    visible_BxSxZ = (jnp.arange(S)[:, None] >= j_Z[None, :])[None] & (m_BxZ[:, None, :] != 0)
    s = s + jnp.where(visible_BxSxZ, 0.0, MASK_VALUE)[:, None, None]
    s = jnp.where((j_Z < S)[None, None, None, None, :], s, -jnp.inf)
    return s.reshape(B, K, GS, Z)


def _empty_rows(attention_mask_BxS):
    """[B, S] bool: queries that see no key (no real key at or before them)."""
    return jnp.cumsum(attention_mask_BxS != 0, axis=1) == 0


def _key_blocks(k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, num_blocks: int, block: int):
    """The scans' inputs: keys, values, mask and key positions, one key block per step."""
    return (_kv_blocks(k_BxSxKxE, num_blocks, block), _kv_blocks(v_BxSxKxE, num_blocks, block),
            _blocks(attention_mask_BxS, num_blocks, block), jnp.arange(num_blocks * block).reshape(num_blocks, block))


# The layout: queries (and the output, its gradient, the running max, sum and log-sum-exp) are
# held as [B, K, G·S, ...] and each key block as [B, K, Z, E], so every per-block product is a
# batched matmul over (B, K) with contiguous operands. With q taken as [B, S, K, G, E] inside
# each step instead, a whole fp32 decoder layer (hidden 1024) on XLA's CPU backend took 1.27x /
# 1.35x (forward / forward + backward) as long at S = 1024 and 1.43x / 1.53x at S = 2048; the same
# at S = 256 (benchmarks/RESULTS.md, "Attention layout").


def _forward(q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, block):
    B, S, H, E = q_BxSxHxE.shape
    K = k_BxSxKxE.shape[2]
    N = -(-S // block)
    q_BxKxQxE = _heads_major(q_BxSxHxE, K)                                     # Q = G·S

    def step(carry, x):
        m_prev, l_prev, acc_prev = carry
        k_blk, v_blk, mask_blk, j_blk = x
        s = _block_scores(q_BxKxQxE, k_blk, mask_blk, j_blk, S)                # [B, K, Q, Z]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m_prev - m_new)
        l_new = corr * l_prev + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bkqz,bkze->bkqe", p.astype(v_blk.dtype), v_blk, preferred_element_type=jnp.float32)
        return (m_new, l_new, corr[..., None] * acc_prev + pv), None

    Q = q_BxKxQxE.shape[2]
    init = (jnp.full((B, K, Q), -jnp.inf, jnp.float32), jnp.zeros((B, K, Q), jnp.float32),
            jnp.zeros((B, K, Q, E), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, _key_blocks(k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, N, block))
    out_BxKxQxE = (acc / l[..., None]).astype(v_BxSxKxE.dtype)
    lse_BxKxGxS = (m + jnp.log(l)).reshape(B, K, H // K, S)
    return _heads_minor(out_BxKxQxE, S), lse_BxKxGxS


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q, k, v, attention_mask_BxS, block):
    return _forward(q, k, v, attention_mask_BxS, block)[0]


def _attention_fwd(q, k, v, attention_mask_BxS, block):
    out, lse = _forward(q, k, v, attention_mask_BxS, block)
    return out, (q, k, v, attention_mask_BxS, out, lse)


def _attention_bwd(block, res, g_out_BxSxHxE):
    q_BxSxHxE, k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, out_BxSxHxE, lse_BxKxGxS = res
    B, S, H, E = q_BxSxHxE.shape
    K = k_BxSxKxE.shape[2]
    N = -(-S // block)
    q = _heads_major(q_BxSxHxE, K)                                              # [B, K, Q, E]
    do = _heads_major(g_out_BxSxHxE.astype(v_BxSxKxE.dtype), K)
    delta_BxKxQ = jnp.einsum("bkqe,bkqe->bkq", do.astype(jnp.float32),
                             _heads_major(out_BxSxHxE, K).astype(jnp.float32))
    lse_BxKxQ = lse_BxKxGxS.reshape(B, K, H // K * S)
    # A query that sees no key has all its scores at the fp32 minimum (the added mask value absorbs
    # the score), so its weights are exactly uniform over the S keys.
    empty_BxKxQx1 = jnp.broadcast_to(_empty_rows(attention_mask_BxS)[:, None, None, :],
                                     (B, K, H // K, S)).reshape(B, K, H // K * S)[..., None]

    def step(dq_acc, x):
        k_blk, v_blk, mask_blk, j_blk = x
        s = _block_scores(q, k_blk, mask_blk, j_blk, S)
        p = jnp.where(empty_BxKxQx1 & (j_blk < S), 1.0 / S, jnp.exp(s - lse_BxKxQ[..., None]))
        dv = jnp.einsum("bkqz,bkqe->bkze", p.astype(do.dtype), do, preferred_element_type=jnp.float32)
        dp = jnp.einsum("bkqe,bkze->bkqz", do, v_blk, preferred_element_type=jnp.float32)
        ds = (p * (dp - delta_BxKxQ[..., None]) * (E ** -0.5)).astype(q.dtype)
        dq_acc = dq_acc + jnp.einsum("bkqz,bkze->bkqe", ds, k_blk, preferred_element_type=jnp.float32)
        dk = jnp.einsum("bkqz,bkqe->bkze", ds, q, preferred_element_type=jnp.float32)
        return dq_acc, (dk.astype(k_blk.dtype), dv.astype(v_blk.dtype))

    dq, (dk_N, dv_N) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32),
                                    _key_blocks(k_BxSxKxE, v_BxSxKxE, attention_mask_BxS, N, block))
    return (_heads_minor(dq, S).astype(q_BxSxHxE.dtype), _kv_unblock(dk_N, S), _kv_unblock(dv_N, S), None)


_attention.defvjp(_attention_fwd, _attention_bwd)
