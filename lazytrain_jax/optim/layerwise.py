"""Layer-by-layer host updates: one shared step, one layer's slice of the state at a time.

The streaming executor knows the global gradient norm when backward ends (it summed squares per
layer), then updates the host master weights layer by layer while the next step's uploads start.
The optimizer state mirrors the params tree, so a layer's slice of the state is the same keys as
the layer's params. One step::

    cfg = hyperparams_of(tx)                     # the AdamW8bitConfig tx was built from
    info, count, skipped = begin_step(state.count, state.num_skipped, global_norm,
                                      cfg.max_grad_norm)
    hp, mask = cfg.adam_hyperparams(state.count), cfg.decay_mask(params)
    for i in range(num_layers):                  # forward order (embed, layers, head)
        moments = layer_moments(state, "layers", i)
        master_i, bf16_i, moments = fused_layer_step(master_i, grads_i, moments, info, hp,
                                                     block_size=cfg.block_size,
                                                     decay_mask=mask and mask["layers"][i])
        state = set_layer_moments(state, ("layers", i), moments)   # and upload bf16_i
    state = state._replace(count=count, num_skipped=skipped)

The result equals one whole-tree ``cfg.transform()`` update, params and moments bit for bit
(tested on a real model's tree).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from lazytrain_jax.optim import kernel, native
from lazytrain_jax.optim.kernel import AdamHyperparams, StepInfo


class LayerMoments(NamedTuple):
    """A subtree's slice of ``ScaleByAdam8bitState``: moments and per-block scales."""

    mu: Any
    nu: Any
    mu_scales: Any
    nu_scales: Any


def _get(tree, keys):
    for key in keys:
        tree = tree[key]
    return tree


def _set(tree, keys, value):
    if not keys:
        return value
    key, rest = keys[0], keys[1:]
    if isinstance(tree, dict):
        out = dict(tree)
        out[key] = _set(tree[key], rest, value)
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        out = list(tree)
        out[key] = _set(tree[key], rest, value)
        return out if isinstance(tree, list) else tuple(out)
    raise ValueError(f"cannot index a {type(tree).__name__} with key {key!r}; valid containers: dict, list, tuple")


def layer_moments(state, *keys) -> LayerMoments:
    """The moments of the params subtree at ``keys`` (e.g. ``"layers", 3``).

    Args:
      state: a ``ScaleByAdam8bitState``.
      *keys: dict keys / sequence indices leading from the params root to the subtree.

    Returns:
      :class:`LayerMoments` with the four matching subtrees.

    Example:
      >>> moments = layer_moments(state, "layers", 0)
    """
    return LayerMoments(*(_get(t, keys) for t in
                          (state.mu, state.nu, state.mu_scales, state.nu_scales)))


def set_layer_moments(state, keys: Sequence[Any], moments: LayerMoments):
    """A copy of ``state`` whose subtree at ``keys`` holds ``moments`` (no arrays are copied).

    Example:
      >>> state = set_layer_moments(state, ("layers", 0), moments)
    """
    keys = tuple(keys)
    return state._replace(
        mu=_set(state.mu, keys, moments.mu), nu=_set(state.nu, keys, moments.nu),
        mu_scales=_set(state.mu_scales, keys, moments.mu_scales),
        nu_scales=_set(state.nu_scales, keys, moments.nu_scales),
    )


def apply_layer_update(grads, moments: LayerMoments, params, step: StepInfo, hp: AdamHyperparams,
                       *, block_size: int = 256, decay_mask=None,
                       impl: str = native.DEFAULT_IMPL):
    """Updates one subtree (e.g. a layer) for a step decided by :func:`begin_step`.

    Args:
      grads: the subtree's gradients (unclipped; ``step.clip_factor`` is applied here).
      moments: the subtree's :class:`LayerMoments` (from :func:`layer_moments`).
      params: the subtree's parameters (for weight decay and the updates' dtype), or None.
      step: the step's :class:`StepInfo`, shared by every subtree of the step.
      hp: :class:`AdamHyperparams` (``learning_rate=None`` for the bare Adam direction).
      block_size: the block size the state was created with.
      decay_mask: None (decay all) or a tree of Python bools matching ``grads``.
      impl: as in ``adamw_8bit`` (give the transform's, to equal it bit for bit).

    Returns:
      ``(updates, new_moments)``; apply with ``optax.apply_updates``.

    Example:
      >>> updates, moments = apply_layer_update(g, moments, p, info, hp)
    """
    updates, new = kernel.tree_update(grads, *moments, params, step, hp, block_size=block_size,
                                      decay_mask=decay_mask,
                                      impl=native.resolve_impl(impl))
    return updates, LayerMoments(*new)


def fused_layer_step(master, grads, moments: LayerMoments, step: StepInfo, hp: AdamHyperparams,
                     *, block_size: int = 256, copy_dtype=jnp.bfloat16,
                     decay_filter: Callable | None = None, decay_mask=None,
                     impl: str = native.DEFAULT_IMPL, copy=None):
    """One jitted pass over a layer: clip, Adam, fp32 master update and low-precision copy.

    ``master`` and ``moments`` are donated (their buffers hold the results); run it on the CPU
    backend on host-resident arrays. Hyperparameters are traced, so a schedule never recompiles.
    Give the previous step's copy as ``copy`` (donated) and the new one is written into its
    buffers: a fresh copy buffer is newly mapped memory, page-faulted in on every step (about a
    third of the native step's time at 100M parameters, measured).

    Args:
      master: the layer's fp32 master weights (donated).
      grads: the layer's gradients (any float dtype).
      moments: the layer's :class:`LayerMoments` (donated).
      step: :class:`StepInfo` of the step; hp: :class:`AdamHyperparams`
        (``AdamW8bitConfig.adam_hyperparams``).
      block_size: the state's block size (static).
      copy_dtype: dtype of the streaming copy (static, default bf16).
      decay_filter: optional static ``callable(path, leaf) -> bool``; False exempts a leaf from
        weight decay (paths are relative to the layer).
      decay_mask: alternatively, a tree of Python bools matching ``master`` (the unit's slice of
        ``AdamW8bitConfig.decay_mask(params)``); static. Not both.
      impl: as in ``adamw_8bit``: ``"auto"`` (default), ``"native"`` (the one-pass C++ kernel
        of ``native.py`` for fp32 masters with dynamic8 or fp32 state, the cores shared between
        the tensors, ``native.thread_shares``; other tensors take the XLA path) or ``"xla"``. With
        ``"xla"`` here and in the transform the results equal the transform's update bit for bit;
        the native kernel computes the update itself, so it agrees with the transform (whose
        update is XLA's) to fp32 rounding.
      copy: optionally the previous copy (``master``'s tree in ``copy_dtype``; donated, its
        contents unread), whose buffers then hold the new copy.

    Returns:
      ``(new_master, new_copy, new_moments)``.

    Example:
      >>> master, bf16, moments = fused_layer_step(master, grads, moments, info, hp)
    """
    if decay_mask is not None and decay_filter is not None:
        raise ValueError("fused_layer_step got both decay_filter and decay_mask; give one")
    moments = LayerMoments(*moments)
    impl = native.resolve_impl(impl)
    kernel.check_trees("master", master, grads=grads, mu=moments.mu, nu=moments.nu)
    kernel.check_trees("master", master, check_shapes=False, mu_scales=moments.mu_scales,
                       nu_scales=moments.nu_scales, decay_mask=decay_mask)
    if copy is not None:
        kernel.check_trees("master", master, copy=copy)
        bad = [x.dtype for x in jax.tree.leaves(copy) if x.dtype != jnp.dtype(copy_dtype)]
        if bad:
            raise ValueError(f"copy has dtype {bad[0]}; the previous copy must be in "
                             f"copy_dtype={jnp.dtype(copy_dtype)}")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(master)
    if decay_mask is None:
        decay = tuple(True if decay_filter is None else bool(decay_filter(path, p))
                      for path, p in leaves)
    else:
        decay = tuple(bool(d) for d in treedef.flatten_up_to(decay_mask))
    new_master, new_moments, new_copy = _fused_layer_step(master, grads, moments, step, hp, copy,
                                                          block_size=block_size, copy_dtype=copy_dtype,
                                                          decay=decay, impl=impl)
    return new_master, new_copy, new_moments


@functools.partial(jax.jit, static_argnames=("block_size", "copy_dtype", "decay", "impl"),
                   donate_argnums=(0, 2, 5))
def _fused_layer_step(master, grads, moments, step, hp, copy=None, *, block_size, copy_dtype, decay, impl):
    treedef = jax.tree.structure(master)
    leaves = treedef.flatten_up_to(master)
    g_leaves = treedef.flatten_up_to(grads)
    state = [treedef.flatten_up_to(t) for t in moments]
    # the previous copy, donated: each tensor's new copy is written into its buffer
    old_copies = treedef.flatten_up_to(copy) if copy is not None else [None] * len(leaves)
    fast_ok = [impl == "native" and native.supports(p, g, mu, block_size=block_size,
                                                    copy_dtype=copy_dtype, hp=hp, host_step=True)
               for p, g, mu in zip(leaves, g_leaves, state[0])]
    threads = native.thread_shares([p.size if ok else 0 for p, ok in zip(leaves, fast_ok)])
    outs = []
    for p, g, mu, nu, mu_s, nu_s, d, ok, th, old in zip(leaves, g_leaves, *state, decay, fast_ok, threads,
                                                        old_copies):
        xla = functools.partial(_xla_leaf_step, info=step, hp=hp, block_size=block_size, decay=d,
                                copy_dtype=copy_dtype)
        args = (p, g, mu, nu, mu_s, nu_s) + (() if old is None else (old,))
        if ok:
            fast = functools.partial(_native_leaf_step, info=step, hp=hp, block_size=block_size, decay=d,
                                     threads=th, copy_dtype=copy_dtype)
            outs.append(native.on_cpu(fast, xla, *args))
        else:
            outs.append(xla(*args))
    cols = [treedef.unflatten(list(c)) for c in zip(*outs)] if outs else [master] * 6
    # the results in the donated arguments' order (master, moments, copy): jit gives each result
    # the first unused donated buffer of its shape and dtype, so with the copy second an fp32 copy
    # of a tensor with fp32 moments took m's buffer, m took v's and v the copy's, each moved by a
    # whole-buffer copy (6 per tensor, seen in the compiled program)
    return cols[0], LayerMoments(*cols[2:]), cols[1]


def _native_leaf_step(p, g, mu, nu, mu_s, nu_s, old=None, **kw):
    """``native.leaf_master_step``, the previous copy (if any) as its in-place ``copy``."""
    return native.leaf_master_step(p, g, mu, nu, mu_s, nu_s, copy=old, **kw)


def _xla_leaf_step(p, g, mu, nu, mu_s, nu_s, old=None, **kw):
    """``kernel.leaf_master_step``; with ``old`` (the previous copy, donated) the new copy is written
    over it (an update of the whole buffer, done in place) instead of into a fresh buffer."""
    out = kernel.leaf_master_step(p, g, mu, nu, mu_s, nu_s, **kw)
    if old is None:
        return out
    return out[:1] + (jax.lax.dynamic_update_slice(old, out[1], (0,) * old.ndim),) + out[2:]


fused_layer_step._cache_size = _fused_layer_step._cache_size  # compilations, for tests
