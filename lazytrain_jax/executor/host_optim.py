"""Optimizers on the host store: the per-unit 8-bit path (pipelined) and any optax transform (serial).

``adamw_8bit`` transforms carry their hyperparameters (``lt.optim.hyperparams_of``), so the engine
runs the same update one unit at a time with ``fused_layer_step`` (clip, 8-bit Adam, fp32 master,
low-precision streaming copy in one jitted, donated pass on the host; with the config's ``impl``,
by default the native one-pass kernel where it could be built). Any other optax
``GradientTransformation`` runs on the whole host tree after backward (``serial`` mode only).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import SingleDeviceSharding

from lazytrain_jax import optim as lt_optim
from lazytrain_jax.optim import layerwise

UNIT_KEYS = ("embed", "layers", "head")


@functools.lru_cache(maxsize=256)
def _host_jit_cached(fn, host_sharding, jit_items):
    return _host_jit(fn, host_sharding, **dict(jit_items))


def host_jit(fn, host_sharding, **jit_kwargs):
    """One cached :func:`_host_jit` per (function, sharding, jit arguments): engines built for the
    same model and optimizer share compilations."""
    return _host_jit_cached(fn, host_sharding, tuple(sorted(jit_kwargs.items())))


def _host_jit(fn, host_sharding, **jit_kwargs):
    """``jax.jit(fn)`` running on the host store's arrays and returning arrays in its memory kind.

    On the CPU backend the host store is the ``pinned_host`` memory kind of the CPU device, and XLA
    computes only on the ``device`` kind: the inputs are moved there inside the jit and the outputs
    written back to ``pinned_host``. Elsewhere the host store is the CPU device's own memory and
    the move is a no-op.
    """
    compute = SingleDeviceSharding(host_sharding._device, memory_kind="device") \
        if host_sharding.memory_kind == "pinned_host" else None

    def inner(*args, **kwargs):
        if compute is not None:
            args = jax.device_put(args, compute)
        return fn(*args, **kwargs)

    return jax.jit(inner, out_shardings=host_sharding, **jit_kwargs)


def unit_path(u: int, num_layers: int) -> tuple:
    """Keys of unit ``u`` (0 = embed, 1..L = layers, L + 1 = head) in ``model.params``."""
    if u == 0:
        return ("embed",)
    if u == num_layers + 1:
        return ("head",)
    return ("layers", u - 1)


def get_unit(tree, u: int, num_layers: int):
    for key in unit_path(u, num_layers):
        tree = tree[key]
    return tree


def split_units(tree, num_layers: int) -> list:
    return [get_unit(tree, u, num_layers) for u in range(num_layers + 2)]


def join_units(units: list, num_layers: int) -> dict:
    return {"embed": units[0], "layers": list(units[1:num_layers + 1]), "head": units[num_layers + 1]}


@dataclasses.dataclass(frozen=True)
class DecayFilter:
    """A hashable ``callable(path, leaf) -> bool`` from the set of paths exempt from weight decay."""

    exempt: frozenset

    def __call__(self, path, leaf) -> bool:
        return _path_key(path) not in self.exempt


def _path_key(path) -> tuple:
    return tuple(getattr(k, "key", getattr(k, "idx", k)) for k in path)


@functools.lru_cache(maxsize=None)
def _fused_step(host_sharding, block_size: int, copy_dtype, decay_filter, impl: str):
    def step(master, grads, moments, info, hp, copy):
        new_master, new_copy, new_moments = lt_optim.fused_layer_step(
            master, grads, moments, info, hp, block_size=block_size, copy_dtype=copy_dtype,
            decay_filter=decay_filter, impl=impl, copy=copy)
        # in the donated arguments' order (master, moments, copy), as ``_fused_layer_step`` returns
        # them: jit gives each result the first unused donated buffer of its shape and dtype, and
        # with an fp32 copy and fp32 moments the other order moved every such tensor by copies
        return new_master, new_moments, new_copy

    return host_jit(step, host_sharding, donate_argnums=(0, 2, 5))


class UnitAdamW8bit:
    """``adamw_8bit`` one unit at a time (pipelined mode). ``state`` is the whole-tree optax state."""

    splittable = True

    def __init__(self, config, host_sharding, num_layers: int, copy_dtype):
        self.config = config
        self.tx = config.transform()
        self.host = host_sharding
        self.num_layers = num_layers
        self.copy_dtype = jnp.dtype(copy_dtype)
        self._filters = None

    def init(self, master: dict):
        state = host_jit(self.tx.init, self.host)(master)
        mask = self.config.decay_mask(master)
        filters = []
        for u in range(self.num_layers + 2):
            exempt = set()
            if mask is not None:
                sub = get_unit(mask, u, self.num_layers)
                for path, keep in jax.tree_util.tree_flatten_with_path(sub)[0]:
                    if not keep:
                        exempt.add(_path_key(path))
            filters.append(DecayFilter(frozenset(exempt)))
        self._filters = filters
        return state

    def begin(self, state, global_norm: float):
        info, count, skipped = lt_optim.begin_step(state.count, state.num_skipped, jnp.float32(global_norm),
                                                   self.config.max_grad_norm)
        hp = self.config.adam_hyperparams(state.count)
        hp = lt_optim.AdamHyperparams(*(None if v is None else jnp.asarray(v, jnp.float32) for v in hp))
        return info, hp, count, skipped

    def update_unit(self, state, u: int, master_u, grads_u, info, hp, copy_u=None):
        """Returns ``(new_master_u, new_copy_u, new_moments_u)``; ``master_u``, its moments and
        ``copy_u`` (the unit's previous streaming copy, if given: the new one is written into its
        buffers instead of freshly mapped memory) are donated."""
        moments = layerwise.layer_moments(state, *unit_path(u, self.num_layers))
        # the config's impl (default "auto": the native one-pass kernel on the CPU backend where it
        # could be built), so the engine runs exactly lt.optim's per-unit update for this optimizer
        fn = _fused_step(self.host, self.config.block_size, self.copy_dtype, self._filters[u], self.config.impl)
        new_master, new_moments, new_copy = fn(master_u, grads_u, moments, info, hp, copy_u)
        return new_master, new_copy, new_moments

    def finish(self, state, moments_by_unit: list, count, skipped):
        for u, moments in enumerate(moments_by_unit):
            state = layerwise.set_layer_moments(state, unit_path(u, self.num_layers), moments)
        return state._replace(count=jax.device_put(count, self.host), num_skipped=jax.device_put(skipped, self.host))


@functools.lru_cache(maxsize=32)
def _apply_fn(tx):
    def apply(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    return apply


class WholeTreeOptax:
    """Any optax transform on the whole host tree after backward (serial mode)."""

    splittable = False

    def __init__(self, tx, host_sharding):
        self.tx = tx
        self.host = host_sharding
        self._update = host_jit(_apply_fn(tx), host_sharding, donate_argnums=(1, 2))

    def init(self, master: dict):
        return host_jit(self.tx.init, self.host)(master)

    def update(self, grads, state, params):
        return self._update(grads, state, params)


def make_host_optimizer(optimizer, host_sharding, num_layers: int, copy_dtype):
    """The host optimizer for ``optimizer`` (None: ``adamw_8bit`` with its defaults)."""
    if optimizer is None:
        optimizer = lt_optim.adamw_8bit(learning_rate=1e-5, weight_decay=0.01, max_grad_norm=1.0)
    if not hasattr(optimizer, "init") or not hasattr(optimizer, "update"):
        raise ValueError(f"optimizer={optimizer!r} is not an optax GradientTransformation (needs init and update)")
    config = lt_optim.hyperparams_of(optimizer) if hasattr(lt_optim, "hyperparams_of") else None
    if config is not None:
        return UnitAdamW8bit(config, host_sharding, num_layers, copy_dtype)
    return WholeTreeOptax(optimizer, host_sharding)


def to_numpy_tree(tree, dtype=None):
    """``tree``'s leaves as numpy arrays (in ``dtype`` where given: the gradients the engine hands a
    user are fp32 whatever dtype they came down in)."""
    return jax.tree.map(lambda x: np.asarray(x) if dtype is None else np.asarray(x).astype(dtype, copy=False), tree)
