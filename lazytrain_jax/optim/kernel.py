"""The fused per-tensor update: clip, dequantize, Adam(W) in fp32, requantize, in one pass.

Everything here is elementwise or a per-block reduction, so XLA fuses one tensor's update into a
few loops over memory. The whole-tree optax transform (``adam8bit.py``) calls :func:`leaf_update`;
the layer-by-layer host step (``layerwise.fused_layer_step``) calls :func:`leaf_master_step`, the
same math with its in-place writes ordered; the two agree to the last bit (tested).

Legend: ``_nb`` = blocked view ``[num_blocks, block_size]``; ``_n1`` = per-block ``[num_blocks, 1]``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from lazytrain_jax.optim import blockwise as q


class StepInfo(NamedTuple):
    """What one optimizer step applies, shared by every tensor (and every layer) of the step.

    Attributes:
      count: int32, 1-based index of the step being applied (for bias correction).
      clip_factor: fp32 multiplier of the gradients (1 when not clipping or under the max norm).
      apply: bool; False skips the step (non-finite global norm): updates 0, state untouched.
    """

    count: jax.Array
    clip_factor: jax.Array
    apply: jax.Array


class AdamHyperparams(NamedTuple):
    """Numeric Adam(W) hyperparameters of one step (plain numbers or traced fp32 scalars).

    ``learning_rate=None`` gives the bare Adam direction (``scale_by_adam_8bit``); otherwise the
    update is ``-learning_rate * (adam + weight_decay * params)`` (optax ``adamw`` semantics).
    """

    b1: Any
    b2: Any
    eps: Any
    learning_rate: Any = None
    weight_decay: Any = 0.0


def global_norm_fp32(tree) -> jax.Array:
    """Global L2 norm of a tree, accumulated in fp32 whatever the leaves' dtype.

    Args:
      tree: gradients (any float dtypes).

    Returns:
      fp32 scalar ``sqrt(sum of squares)`` (``optax.global_norm`` semantics).

    Example:
      >>> global_norm_fp32({"a": jnp.full(4, 0.5, jnp.bfloat16)})  # 1.0
    """
    leaves = jax.tree.leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def begin_step(count, num_skipped, global_norm, max_grad_norm, *, valid=None):
    """Decides what a step applies from the global gradient norm.

    Args:
      count: int32, steps applied so far (the state's ``count``).
      num_skipped: int32, steps skipped so far.
      global_norm: fp32 global gradient norm (>= 0), or None (then nothing is clipped or skipped).
        A concrete negative norm raises ValueError; a traced one that is negative or not finite
        skips the step.
      max_grad_norm: clip threshold or None. Clipping follows ``optax.clip_by_global_norm``:
        gradients are untouched when ``norm < max_grad_norm``, else scaled by
        ``max_grad_norm / norm`` (no epsilon).
      valid: optional traced bool (``config.hyperparams_valid``); False skips the step.

    Returns:
      ``(StepInfo, new_count, new_num_skipped)``; a skipped step (non-finite or negative norm,
      ``valid`` False) gives ``apply=False``, leaves ``count`` unchanged and increments
      ``num_skipped``.

    Example:
      >>> info, count, skipped = begin_step(jnp.int32(0), jnp.int32(0), jnp.float32(3.0), 1.0)
      >>> float(info.clip_factor)  # 1/3
    """
    from lazytrain_jax.optim.config import check_value  # config imports this module

    check_value("global_norm", global_norm)
    check_value("max_grad_norm", max_grad_norm)
    count = jnp.asarray(count, jnp.int32)
    num_skipped = jnp.asarray(num_skipped, jnp.int32)
    if global_norm is None and valid is None:
        info = StepInfo(count + 1, jnp.ones([], jnp.float32), jnp.ones([], jnp.bool_))
        return info, count + 1, num_skipped
    if global_norm is None:
        norm, apply = None, jnp.asarray(valid, jnp.bool_)
    else:
        norm = jnp.asarray(global_norm, jnp.float32)
        apply = jnp.isfinite(norm) & (norm >= 0.0)
        if valid is not None:
            apply = apply & valid
    if max_grad_norm is None or norm is None:
        factor = jnp.ones([], jnp.float32)
    else:
        max_norm = jnp.asarray(max_grad_norm, jnp.float32)
        factor = jnp.where(norm < max_norm, 1.0, max_norm / norm).astype(jnp.float32)
    new_count = jnp.where(apply, count + 1, count)
    info = StepInfo(count + 1, factor, apply)
    return info, new_count, num_skipped + jnp.where(apply, 0, 1).astype(jnp.int32)


def _f32(x):
    """Hyperparameters enter the math as fp32 scalars, whether given as numbers or arrays."""
    return jnp.asarray(x, jnp.float32)


def _adam_direction(g, m_old, v_old, info: StepInfo, hp: AdamHyperparams):
    g = g * info.clip_factor
    b1, b2 = _f32(hp.b1), _f32(hp.b2)
    m = (1.0 - b1) * g + b1 * m_old
    v = (1.0 - b2) * (g * g) + b2 * v_old
    bc1 = (1.0 - b1**info.count).astype(jnp.float32)
    bc2 = (1.0 - b2**info.count).astype(jnp.float32)
    u = (m / bc1) / (jnp.sqrt(v / bc2) + _f32(hp.eps))
    return u, m, v


def _finish(u, p, hp: AdamHyperparams, decay: bool):
    if hp.learning_rate is None:
        return u
    if decay and p is not None:
        u = u + _f32(hp.weight_decay) * p.astype(jnp.float32)
    return -_f32(hp.learning_rate) * u


def leaf_update(g, p, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *,
                block_size: int, decay: bool = True):
    """One tensor's fused update. The state format is read from ``mu``'s dtype.

    Args:
      g: gradient (any float dtype; the math runs in fp32).
      p: parameter or None (needed for weight decay; fixes the updates' dtype).
      mu, nu, mu_s, nu_s: the tensor's stored moments and per-block scales.
      info: the step's :class:`StepInfo`.
      hp: :class:`AdamHyperparams`.
      block_size: the block size the state was created with.
      decay: whether weight decay applies to this tensor.

    Returns:
      ``(updates, mu, nu, mu_s, nu_s)``; updates in ``p.dtype`` (``g.dtype`` without params).

    Example:
      >>> u, *moments = leaf_update(g, p, mu, nu, mu_s, nu_s, info, hp, block_size=256)
    """
    out_dtype = p.dtype if p is not None else g.dtype
    fmt = q.format_of(mu.dtype)
    g32 = g.astype(jnp.float32)
    if fmt == "fp32":
        u, m, v = _adam_direction(g32, mu, nu, info, hp)
        u = jnp.where(info.apply, _finish(u, p, hp, decay), 0.0).astype(out_dtype)
        m, v = _write_after(u, p, mu, nu, jnp.where(info.apply, m, mu),
                            jnp.where(info.apply, v, nu))
        return u, m, v, mu_s, nu_s

    shape = g.shape
    ms_n1, vs_n1 = mu_s.reshape(-1, 1), nu_s.reshape(-1, 1)
    if g.size % block_size == 0:
        # Work in the parameter's own shape (scales broadcast to it): XLA then updates the
        # donated master / codes in place instead of writing temporaries and copying them.
        u, mc, vc, ms_n1, vs_n1 = block_math(g32, p, mu, nu, ms_n1, vs_n1, info, hp,
                                             decay=decay, block_size=block_size)
        u = u.astype(out_dtype)
        mc, vc = _write_after(u, p, mu, nu, mc, vc)
        return u, mc, vc, ms_n1.reshape(mu_s.shape), vs_n1.reshape(nu_s.shape)
    p_nb = None if p is None else q.to_blocks(p, block_size)
    u_nb, mc_nb, vc_nb, ms_n1, vs_n1 = block_math(
        q.to_blocks(g32, block_size), p_nb, q.to_blocks(mu, block_size),
        q.to_blocks(nu, block_size), ms_n1, vs_n1, info, hp, decay=decay, block_size=block_size)
    return (q.from_blocks(u_nb, shape).astype(out_dtype), q.from_blocks(mc_nb, shape),
            q.from_blocks(vc_nb, shape), ms_n1.reshape(mu_s.shape), vs_n1.reshape(nu_s.shape))


def block_math(g, p, mc, vc, ms_n1, vs_n1, info: StepInfo, hp: AdamHyperparams, *,
               decay: bool, block_size: int):
    """The 8-bit update of whole blocks: ``(u, mc, vc, ms_n1, vs_n1)``.

    ``g`` (fp32), ``p``, ``mc``, ``vc`` share one shape whose row-major order is the block order
    (the parameter's shape, or ``[num_blocks, block_size]``); scales are ``[num_blocks, 1]``.
    ``u`` is the final fp32 update (0 on a skipped step, when codes and scales come back
    unchanged). Where v decodes to 0, m is treated as 0 (no m / eps blow-up).
    """
    u, m, v, new_ms, new_vs, expand = _block_moments(g, p, mc, vc, ms_n1, vs_n1, info, hp,
                                                     decay=decay, block_size=block_size)
    fmt = q.format_of(mc.dtype)
    m_code = q.encode_m_nb(m, new_ms, fmt, expand)
    v_code = q.encode_v_nb(v, new_vs, fmt, expand)
    return (jnp.where(info.apply, u, 0.0), jnp.where(info.apply, m_code, mc),
            jnp.where(info.apply, v_code, vc), new_ms, new_vs)


def _block_moments(g, p, mc, vc, ms_n1, vs_n1, info, hp, *, decay, block_size):
    fmt = q.format_of(mc.dtype)
    nb = ms_n1.shape[0]
    expand = lambda s_n1: jnp.broadcast_to(s_n1, (nb, block_size)).reshape(g.shape)  # noqa: E731
    v_old = q.decode_v_nb(vc, vs_n1, expand)
    m_old = jnp.where(v_old == 0.0, 0.0, q.decode_m_nb(mc, ms_n1, expand))
    u, m, v = _adam_direction(g, m_old, v_old, info, hp)
    u = _finish(u, p, hp, decay)
    if fmt == "dynamic8":
        new_ms, new_vs = _scale_bounds(g, mc, vc, ms_n1, vs_n1, info, hp, nb, block_size)
    else:  # fp8's coarse steps stall v under a loose scale (measured): exact absmax
        new_ms = _absmax_n1(m.reshape(nb, block_size))
        new_vs = _absmax_n1(v.reshape(nb, block_size))
    new_ms = jnp.where(info.apply, new_ms, ms_n1)
    new_vs = jnp.where(info.apply, new_vs, vs_n1)
    return u, m, v, new_ms, new_vs, expand


def leaf_direction(g32, p, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *,
                   block_size: int, decay: bool):
    """The update ``u`` of :func:`leaf_update` alone (0 on a skipped step), for 8-bit state of
    whole blocks: bit for bit ``leaf_update``'s ``u``. Elementwise over ``g32``, ``p`` and the old
    codes with the old per-block scales broadcast, so XLA fuses it into its consumer
    (``apply_updates``) instead of materializing it."""
    ms_n1, vs_n1 = mu_s.reshape(-1, 1), nu_s.reshape(-1, 1)
    u = _block_moments(g32, p, mu, nu, ms_n1, vs_n1, info, hp, decay=decay,
                       block_size=block_size)[0]
    return jnp.where(info.apply, u, 0.0).astype(p.dtype if p is not None else g32.dtype)


def _write_after(u, p, mu, nu, new_mu, new_nu):
    """``(new_mu, new_nu)``, written in place only after the update has read the old moments.

    Inside a user's jitted step ``p + u`` is the ``optax.apply_updates`` sum (XLA merges the two),
    so the new moments are ordered after the new params; without that ordering XLA copies both
    donated moment buffers whole each step. Values are unchanged (the gate is always true).
    """
    mu1 = jnp.where(after(u if p is None else p + u), new_mu, mu)
    return mu1, jnp.where(after(mu1), new_nu, nu)


def after(x):
    """A always-true bool that XLA cannot fold and that depends on ``x`` (its first element).

    Writing a state buffer in place while another fusion still reads its old value makes XLA
    copy the whole buffer; gating the write on this orders it after ``x``'s producer instead.
    """
    t = x.reshape(-1)[0].astype(jnp.float32)
    return (t == t) | (t != t)


def leaf_master_step(master, g, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *,
                     block_size: int, decay: bool, copy_dtype):
    """One tensor of :func:`layerwise.fused_layer_step`: ``(master, copy, mu, nu, mu_s, nu_s)``.

    Same results as ``leaf_update`` + ``apply_updates`` (bit for bit), but ordered so that the
    master, then m, then v are written in place without whole-buffer copies.
    """
    g32 = g.astype(jnp.float32)
    fmt = q.format_of(mu.dtype)
    if fmt == "fp32" or g.size % block_size:
        u, mu1, nu1, ms1, vs1 = leaf_update(g, master, mu, nu, mu_s, nu_s, info, hp,
                                            block_size=block_size, decay=decay)
        new_master = (master + u).astype(master.dtype)
        if fmt == "fp32":  # fp32 moments: write them after the master has read the old ones
            ok = after(new_master)
            mu1, nu1 = jnp.where(ok, mu1, mu), jnp.where(ok, nu1, nu)
        return new_master, new_master.astype(copy_dtype), mu1, nu1, ms1, vs1
    ms_n1, vs_n1 = mu_s.reshape(-1, 1), nu_s.reshape(-1, 1)
    u, m, v, new_ms, new_vs, expand = _block_moments(g32, master, mu, nu, ms_n1, vs_n1, info, hp,
                                                     decay=decay, block_size=block_size)
    u = jnp.where(info.apply, u, 0.0).astype(master.dtype)
    new_master = (master + u).astype(master.dtype)
    mc = jnp.where(info.apply & after(new_master), q.encode_m_nb(m, new_ms, fmt, expand), mu)
    vc = jnp.where(info.apply & after(mc), q.encode_v_nb(v, new_vs, fmt, expand), nu)
    return (new_master, new_master.astype(copy_dtype), mc, vc, new_ms.reshape(mu_s.shape),
            new_vs.reshape(nu_s.shape))


def _scale_bounds(g, mc, vc, ms_n1, vs_n1, info, hp, nb, block_size):
    """New block scales without a reduction over the new moments.

    XLA on CPU materializes any tensor it reduces; reducing the new m and v cost more than the
    rest of the update. Instead the scales are the triangle-inequality bounds
    ``s_m = b1 max|m_old| + (1 - b1) max|g|`` and ``s_v = b2 max v_old + (1 - b2) max g**2``,
    with exact maxima of the stored codes (1-byte reductions) and of the gradient (an input).
    So ``s >= max|new moment|`` (never saturates), is recomputed from the codes every step (no
    drift), and is within ``(1 - b) max|g|`` of the true absmax (measured s / absmax ~2 for pure
    noise gradients: about one bit of m's range). Used for ``dynamic8``; ``fp8`` (6 % steps)
    stalled v under this looser scale in the b2=0.999 runs of the numerics grid, so it reduces
    the new moments exactly.
    """
    g_nb = g.reshape(nb, block_size)
    g_max = jnp.maximum(jnp.max(g_nb, axis=1, keepdims=True),
                        -jnp.min(g_nb, axis=1, keepdims=True)) * info.clip_factor
    m_max = q.decoded_absmax_n1(mc.reshape(nb, block_size), ms_n1, signed=True)
    v_max = q.decoded_absmax_n1(vc.reshape(nb, block_size), vs_n1, signed=False)
    b1, b2 = _f32(hp.b1), _f32(hp.b2)
    s_m = b1 * m_max + (1.0 - b1) * g_max
    s_v = b2 * v_max + (1.0 - b2) * (g_max * g_max)
    flush = lambda s: jnp.where(s < q.MIN_SCALE, 0.0, s)  # noqa: E731
    return flush(s_m), flush(s_v)


def _absmax_n1(x_nb):
    # max over int32 bit patterns (order-preserving for x >= 0, NaN stays largest): XLA CPU then
    # fuses the producer into the reduction instead of materializing it for a library kernel
    bits = jax.lax.bitcast_convert_type(jnp.abs(x_nb), jnp.int32)
    a = jax.lax.bitcast_convert_type(jnp.max(bits, axis=1, keepdims=True), jnp.float32)
    return jnp.where(a < q.MIN_SCALE, 0.0, a)


def check_trees(ref_name: str, ref, *, check_shapes: bool = True, **others) -> None:
    """Raises ValueError naming the tree and the key where ``others`` differ from ``ref``.

    Each other tree must have ``ref``'s structure (same keys) and, for leaves with a shape, the
    same shapes (unless ``check_shapes`` is False). Runs at trace time only (no compiled cost).

    Example:
      >>> check_trees("grads", grads, params=params, mu=state.mu)
    """
    ref_leaves = dict(
        (jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(ref)[0])
    for name, tree in others.items():
        if tree is None:
            continue
        leaves = dict((jax.tree_util.keystr(p), x)
                      for p, x in jax.tree_util.tree_flatten_with_path(tree)[0])
        missing = [k for k in ref_leaves if k not in leaves]
        extra = [k for k in leaves if k not in ref_leaves]
        if missing or extra:
            parts = ([f"{name} lacks key {missing[0]} that {ref_name} has"] if missing else []) + (
                [f"{name} has key {extra[0]} that {ref_name} lacks"] if extra else [])
            raise ValueError(
                f"{name} does not match {ref_name}: {'; '.join(parts)} ({len(missing)} missing, "
                f"{len(extra)} extra); the trees must have the same keys")
        for key, x in ref_leaves.items() if check_shapes else ():
            y = leaves[key]
            if hasattr(x, "shape") and hasattr(y, "shape") and tuple(x.shape) != tuple(y.shape):
                raise ValueError(f"{name}{key} has shape {tuple(y.shape)} but {ref_name}{key} "
                                 f"has shape {tuple(x.shape)}; they must match")


def tree_update(grads, mu, nu, mu_s, nu_s, params, info: StepInfo, hp: AdamHyperparams, *,
                block_size: int, decay_mask=None, impl: str = "xla"):
    """:func:`leaf_update` over matching trees; returns ``(updates, (mu, nu, mu_s, nu_s))``.

    ``decay_mask`` is None (decay everything) or a tree of bools matching ``grads``. Trees whose
    keys or shapes differ raise ValueError naming the tree and the key. ``impl="native"`` (as
    resolved by ``native.resolve_impl``) runs the tensors ``native.supports`` with the native
    kernel when lowered for the CPU (``native.on_cpu``); the rest, and other backends, run XLA.
    """
    from lazytrain_jax.optim import native  # native imports this module

    check_trees("grads", grads, params=params, mu=mu, nu=nu)
    check_trees("grads", grads, check_shapes=False, mu_scales=mu_s, nu_scales=nu_s,
                decay_mask=decay_mask)
    g_leaves, treedef = jax.tree.flatten(grads)
    flat = [treedef.flatten_up_to(t) for t in (mu, nu, mu_s, nu_s)]
    p_leaves = [None] * len(g_leaves) if params is None else treedef.flatten_up_to(params)
    d_leaves = [True] * len(g_leaves) if decay_mask is None else treedef.flatten_up_to(decay_mask)
    fast_ok = [impl == "native" and native.supports(p, g, m, block_size=block_size, hp=hp)
               for g, p, m in zip(g_leaves, p_leaves, flat[0])]
    threads = native.thread_shares([g.size if ok else 0 for g, ok in zip(g_leaves, fast_ok)])
    outs = []
    for g, p, m, v, ms, vs, d, ok, th in zip(g_leaves, p_leaves, *flat, d_leaves, fast_ok, threads):
        kw = dict(block_size=block_size, decay=bool(d))
        xla = functools.partial(leaf_update, info=info, hp=hp, **kw)
        if ok:
            fast = functools.partial(native.leaf_update, info=info, hp=hp, threads=th, **kw)
            outs.append(native.on_cpu(fast, xla, g, p, m, v, ms, vs))
        else:
            outs.append(xla(g, p, m, v, ms, vs))
    cols = list(zip(*outs)) if outs else [()] * 5
    updates, *moments = (treedef.unflatten(list(c)) for c in cols)
    return updates, tuple(moments)
