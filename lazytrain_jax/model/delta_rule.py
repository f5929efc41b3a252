"""The gated delta rule (Gated DeltaNet's token mixer): chunked form for training, per-token scan as reference.

Per value head, with a state S of shape [K, V] starting at zero, for each token t:

    S <- exp(g_t) * S                          (gated decay, g_t <= 0)
    S <- S + k_t (beta_t * (v_t - S^T k_t))^T  (delta rule: write the correction of what S predicts)
    o_t = S^T q_t

``delta_rule_scan`` runs exactly this loop (``jax.lax.scan`` over tokens). ``delta_rule_chunked``
computes the same outputs ``chunk_size`` tokens at a time (the WY/UT form of Yang et al., "Gated
Delta Networks", 2024, as in transformers' ``torch_chunk_gated_delta_rule``): inside a chunk the
updates collapse into matmuls and one unit-lower-triangular solve, and only the chunk-to-chunk state
is carried sequentially. Every ``exp`` takes a non-positive argument (decays are masked before
exponentiation), so neither form can overflow, and no gradient meets ``0 * inf``.

Both take q and k already L2-normalised and q already scaled, heads already expanded to the value
heads, all in fp32. Shape legend: B batch, S sequence, H value heads, K key dim, V value dim,
N chunks, C chunk size.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

DEFAULT_CHUNK_SIZE = 64  # transformers' and flash-linear-attention's chunk size


def l2norm(x, eps: float = 1e-6):
    """x / sqrt(sum(x^2) + eps) over the last axis (flash-linear-attention's and transformers' form)."""
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def unit_lower_inverse(strict_lower_CxC):
    """(I + L)^-1 for strictly lower-triangular L by matmuls only: L is nilpotent (L^C = 0), so
    (I + L)^-1 = sum_k (-L)^k = prod_j (I + (-L)^(2^j)) over 2^j < C (XLA's triangular solve is
    slow on CPU for many small systems; matmuls are fast everywhere)."""
    C = strict_lower_CxC.shape[-1]
    eye = jnp.eye(C, dtype=strict_lower_CxC.dtype)
    power = -strict_lower_CxC
    inverse = eye + power
    step = 2
    while step < C:
        power = power @ power
        inverse = inverse + inverse @ power
        step *= 2
    return inverse


def delta_rule_scan(q_BxSxHxK, k_BxSxHxK, v_BxSxHxV, g_BxSxH, beta_BxSxH):
    """The gated delta rule one token at a time (the reference form).

    Returns:
      o_BxSxHxV (fp32).

    Example:
      >>> o = delta_rule_scan(q, k, v, g, beta)
    """
    B, _, H, K = k_BxSxHxK.shape
    V = v_BxSxHxV.shape[-1]

    def step(state_BxHxKxV, xs):
        q_BxHxK, k_BxHxK, v_BxHxV, g_BxH, beta_BxH = xs
        state_BxHxKxV = state_BxHxKxV * jnp.exp(g_BxH)[..., None, None]
        pred_BxHxV = jnp.einsum("bhkv,bhk->bhv", state_BxHxKxV, k_BxHxK)
        delta_BxHxV = (v_BxHxV - pred_BxHxV) * beta_BxH[..., None]
        state_BxHxKxV = state_BxHxKxV + k_BxHxK[..., :, None] * delta_BxHxV[..., None, :]
        return state_BxHxKxV, jnp.einsum("bhkv,bhk->bhv", state_BxHxKxV, q_BxHxK)

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q_BxSxHxK, k_BxSxHxK, v_BxSxHxV, g_BxSxH, beta_BxSxH))
    _, o_SxBxHxV = jax.lax.scan(step, jnp.zeros((B, H, K, V), v_BxSxHxV.dtype), xs)
    return jnp.moveaxis(o_SxBxHxV, 0, 1)


def delta_rule_chunked(q_BxSxHxK, k_BxSxHxK, v_BxSxHxV, g_BxSxH, beta_BxSxH, chunk_size: int = DEFAULT_CHUNK_SIZE):
    """The gated delta rule in chunks of ``chunk_size`` tokens (the training form).

    The sequence is zero-padded to a multiple of ``chunk_size`` (zero decay and beta: padding changes
    nothing before it) and the padding's outputs are dropped.

    The function is rematerialised in the backward pass (``jax.checkpoint``): ``jax.vjp`` keeps
    only its five inputs, not the [C, C] matrices of every chunk and head nor the chunk-boundary
    states, which the backward recomputes (about 1 % of a layer's FLOPs at the Qwen3.6-27B shape),
    as flash-linear-attention's kernels do.

    Returns:
      o_BxSxHxV (fp32), equal to ``delta_rule_scan`` up to rounding.

    Example:
      >>> o = delta_rule_chunked(q, k, v, g, beta, chunk_size=64)
    """
    return _chunked_remat(q_BxSxHxK, k_BxSxHxK, v_BxSxHxV, g_BxSxH, beta_BxSxH, chunk_size)


@functools.partial(jax.checkpoint, static_argnums=(5,))
def _chunked_remat(q_BxSxHxK, k_BxSxHxK, v_BxSxHxV, g_BxSxH, beta_BxSxH, chunk_size):
    B, S, H, K = k_BxSxHxK.shape
    V = v_BxSxHxV.shape[-1]
    C = chunk_size
    N = -(-S // C)
    pad = N * C - S

    def chunks(x):  # [B, S, H, ...] -> [B, H, N, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape((B, N, C) + x.shape[2:])
        return jnp.moveaxis(x, 3, 1)

    q, k, v = chunks(q_BxSxHxK), chunks(k_BxSxHxK), chunks(v_BxSxHxV)
    g_BxHxNxC, beta_BxHxNxC = chunks(g_BxSxH), chunks(beta_BxSxH)
    # Log-decays as sums over exactly the tokens they span (not differences of running sums): with
    # strong decay the running sum reaches -1e3 within a chunk, and differences of such sums lose
    # the low bits, which the gradients of g (A_log, dt_bias) then amplify through cancellation.
    idx = jnp.arange(C)
    spans_CxCxC = (idx[None, None, :] > idx[None, :, None]) & (idx[None, None, :] <= idx[:, None, None])
    span_BxHxNxCxC = jnp.einsum("ijl,bhnl->bhnij", spans_CxCxC.astype(g_BxSxH.dtype), g_BxHxNxC,
                                precision=jax.lax.Precision.HIGHEST)
    cum_BxHxNxC = jnp.cumsum(g_BxHxNxC, axis=-1)  # chunk start -> token i
    rest_BxHxNxC = jnp.flip(jnp.cumsum(jnp.flip(g_BxHxNxC, -1), axis=-1), -1) - g_BxHxNxC  # token i -> chunk end
    lower_CxC = jnp.tril(jnp.ones((C, C), bool))
    # decay from token j to token i of a chunk, exp(g_{j+1} + ... + g_i) for j <= i, else 0
    decay_BxHxNxCxC = jnp.where(lower_CxC, jnp.exp(jnp.where(lower_CxC, span_BxHxNxCxC, 0.0)), 0.0)
    k_beta = k * beta_BxHxNxC[..., None]
    v_beta = v * beta_BxHxNxC[..., None]
    # UT transform: (I + strictly_lower(diag(beta) K K^T * decay)) [u, w] = [v_beta, k_beta * exp(cum)]
    a_CxC = jnp.einsum("bhnik,bhnjk->bhnij", k_beta, k) * decay_BxHxNxCxC
    rhs = jnp.concatenate([v_beta, k_beta * jnp.exp(cum_BxHxNxC)[..., None]], axis=-1)
    sol = jnp.einsum("bhnij,bhnjd->bhnid", unit_lower_inverse(jnp.tril(a_CxC, -1)), rhs)
    u_BxHxNxCxV, w_BxHxNxCxK = sol[..., :V], sol[..., V:]
    attn_BxHxNxCxC = jnp.einsum("bhnik,bhnjk->bhnij", q, k) * decay_BxHxNxCxC
    q_dec = q * jnp.exp(cum_BxHxNxC)[..., None]
    k_dec = k * jnp.exp(rest_BxHxNxC)[..., None]
    chunk_decay_BxHxN = jnp.exp(cum_BxHxNxC[..., -1])

    def step(state_BxHxKxV, xs):
        u, w, attn, qd, kd, cd = xs
        v_new_BxHxCxV = u - jnp.einsum("bhck,bhkv->bhcv", w, state_BxHxKxV)
        o_BxHxCxV = (jnp.einsum("bhck,bhkv->bhcv", qd, state_BxHxKxV)
                     + jnp.einsum("bhij,bhjv->bhiv", attn, v_new_BxHxCxV))
        state_BxHxKxV = state_BxHxKxV * cd[..., None, None] + jnp.einsum("bhck,bhcv->bhkv", kd, v_new_BxHxCxV)
        return state_BxHxKxV, o_BxHxCxV

    xs = tuple(jnp.moveaxis(x, 2, 0) for x in (u_BxHxNxCxV, w_BxHxNxCxK, attn_BxHxNxCxC, q_dec, k_dec,
                                                chunk_decay_BxHxN))
    _, o_NxBxHxCxV = jax.lax.scan(step, jnp.zeros((B, H, K, V), v_BxSxHxV.dtype), xs)
    o_BxNxCxHxV = jnp.transpose(o_NxBxHxCxV, (1, 0, 3, 2, 4))
    return o_BxNxCxHxV.reshape(B, N * C, H, V)[:, :S]
