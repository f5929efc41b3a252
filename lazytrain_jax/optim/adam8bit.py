"""Hybrid 8-bit Adam(W) as optax transforms, with global-norm clipping fused into the update.

``scale_by_adam_8bit`` is the Adam direction (as ``optax.scale_by_adam``) with blockwise 8-bit
moments; ``adamw_8bit`` is the full AdamW step (clip, Adam, decoupled weight decay, learning rate)
in one transform, so that a skipped step (non-finite gradient norm) leaves params and state
untouched. Both are ``optax.GradientTransformationExtraArgs``: ``update`` accepts the extra
argument ``global_norm=`` (the streaming executor sums squares per layer during backward), and
computes the norm itself when it is not given.

Under ``optax.inject_hyperparams`` list the non-numeric / shape-defining arguments as static::

    tx = optax.inject_hyperparams(adamw_8bit, static_args=STATIC_ARGS,
                                  hyperparam_dtype=jnp.float32)(learning_rate=1e-3)

(``STATIC_ARGS`` = block_size, state_format, min_8bit_size, fp32_state_filter, mask,
skip_nonfinite, impl). Pass ``hyperparam_dtype=jnp.float32`` with bf16 params: optax otherwise casts
the hyperparameters to bf16, where b2=0.999 rounds to 1.0 (which is then refused).

Invalid values (a negative learning rate or weight decay, b1/b2 outside [0, 1), eps < 0,
max_grad_norm <= 0, a negative ``global_norm=``) raise ValueError naming the field wherever they
are concrete: Python numbers and concrete arrays when the transform is built, a schedule's value
and ``inject_hyperparams``' values at ``update`` outside ``jit``. Inside ``jit`` they are traced and
cannot raise: such a step is skipped instead (updates 0, state untouched, ``num_skipped`` + 1),
so a bad value never runs gradient ascent; watch ``num_skipped``.

Example:
    >>> tx = adamw_8bit(learning_rate=1e-3, weight_decay=0.01, max_grad_norm=1.0)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optax.apply_updates(params, updates)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lazytrain_jax.optim import blockwise as q
from lazytrain_jax.optim import config, kernel, native, policy
from lazytrain_jax.optim.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MIN_8BIT_SIZE,
    DEFAULT_STATE_FORMAT,
    DEFAULT_WEIGHT_DECAY,
)

STATIC_ARGS = ("block_size", "state_format", "min_8bit_size", "fp32_state_filter", "mask",
               "skip_nonfinite", "impl")


class ScaleByAdam8bitState(NamedTuple):
    """State of ``scale_by_adam_8bit`` / ``adamw_8bit``.

    Attributes:
      count: int32, steps applied (skipped steps do not count; bias correction uses count).
      num_skipped: int32, steps skipped because the global gradient norm was not finite.
      mu: first moments, param-shaped: int8 codes (``dynamic8``), float8_e4m3fn (``fp8``) or fp32.
      nu: second moments, param-shaped: uint8 / float8_e4m3fn codes or fp32.
      mu_scales: per-block fp32 absmax of m, shape ``(num_blocks, 1, ...)`` (same rank as the
        param); a zero-size array for fp32-state tensors.
      nu_scales: the same for v.

    ``mu``, ``nu`` and the scale trees mirror the params tree, so a layer's slice of the state
    is the same keys as the layer's params (see ``layerwise.py``), and ``optax.tree.map_params``
    maps over all four (the scales have the param's rank; leading-axis shardings apply to them).
    """

    count: jax.Array
    num_skipped: jax.Array
    mu: Any
    nu: Any
    mu_scales: Any
    nu_scales: Any


def init_moments(params, *, block_size: int, state_format: str, min_8bit_size: int,
                 fp32_state_filter: Callable | None):
    """Zero moments for ``params`` under the hybrid policy: ``(mu, nu, mu_scales, nu_scales)``.

    Example:
      >>> mu, nu, mu_s, nu_s = init_moments(params, block_size=256, state_format="dynamic8",
      ...                                   min_8bit_size=4096, fp32_state_filter=None)
    """

    def one(path, p):
        fmt = policy.leaf_state_format(
            path, p, state_format=state_format, min_8bit_size=min_8bit_size,
            fp32_state_filter=fp32_state_filter,
        )
        shape = jnp.shape(p)
        m_dtype, v_dtype = q.code_dtypes(fmt)
        s_shape = (0,) * len(shape) if fmt == "fp32" else q.scale_shape(shape, block_size)
        return (jnp.zeros(shape, m_dtype), jnp.zeros(shape, v_dtype),
                jnp.zeros(s_shape, jnp.float32), jnp.zeros(s_shape, jnp.float32))

    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    pieces = [one(path, p) for path, p in leaves]
    return tuple(treedef.unflatten([piece[i] for piece in pieces]) for i in range(4))


def _make(b1, b2, eps, learning_rate, weight_decay, max_grad_norm, mask, block_size, state_format,
          min_8bit_size, fp32_state_filter, skip_nonfinite, impl="xla"):
    filt = config.resolve_filter(fp32_state_filter)

    def init_fn(params):
        mu, nu, mu_s, nu_s = init_moments(
            params, block_size=block_size, state_format=state_format,
            min_8bit_size=min_8bit_size, fp32_state_filter=filt,
        )
        # two distinct buffers: a donated state must not alias one array twice
        return ScaleByAdam8bitState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.int32),
                                    mu, nu, mu_s, nu_s)

    def update_fn(updates, state, params=None, *, global_norm=None, **extra_args):
        del extra_args
        if learning_rate is not None and params is None:
            raise ValueError("adamw_8bit needs params in update() (weight decay); got params=None")
        config.check_value("global_norm", global_norm)
        if global_norm is None and (max_grad_norm is not None or skip_nonfinite):
            global_norm = kernel.global_norm_fp32(updates)
        lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        config.check_value("learning_rate", lr)
        hp = kernel.AdamHyperparams(b1, b2, eps, lr, 0.0 if weight_decay is None else weight_decay)
        info, count, num_skipped = kernel.begin_step(
            state.count, state.num_skipped, global_norm, max_grad_norm,
            valid=config.hyperparams_valid(hp, max_grad_norm))
        decay_mask = mask(params) if callable(mask) else mask
        new_updates, moments = kernel.tree_update(
            updates, state.mu, state.nu, state.mu_scales, state.nu_scales, params, info, hp,
            block_size=block_size, decay_mask=decay_mask, impl=native.resolve_impl(impl),
        )
        return new_updates, ScaleByAdam8bitState(count, num_skipped, *moments)

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def make_transform(cfg: config.AdamW8bitConfig) -> optax.GradientTransformationExtraArgs:
    """The optax transform of ``cfg`` (``cfg.transform()``); its ``update`` carries ``cfg``."""
    tx = _make(cfg.b1, cfg.b2, cfg.eps, cfg.learning_rate, cfg.weight_decay, cfg.max_grad_norm,
               cfg.mask, cfg.block_size, cfg.state_format, cfg.min_8bit_size,
               cfg.fp32_state_filter, cfg.skip_nonfinite, cfg.impl)
    tx.update.adamw_8bit_config = cfg
    return tx


def scale_by_adam_8bit(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    max_grad_norm: float | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    state_format: str = DEFAULT_STATE_FORMAT,
    min_8bit_size: int = DEFAULT_MIN_8BIT_SIZE,
    fp32_state_filter: str | Callable | None = "default",
    skip_nonfinite: bool = True,
) -> optax.GradientTransformationExtraArgs:
    """Adam direction (``optax.scale_by_adam``) with hybrid blockwise 8-bit moments.

    The Adam math runs in fp32 on dequantized moments; the new moments are requantized with new
    per-block scales. Clipping by ``max_grad_norm`` and the non-finite skip are fused into the
    same pass. Chain it like ``optax.scale_by_adam`` (note: a chained weight decay still acts on a
    skipped step; ``adamw_8bit`` does not).

    Args:
      b1, b2: moment decay rates, in [0, 1).
      eps: added to sqrt(v_hat), >= 0.
      max_grad_norm: clip the gradients to this global norm (``optax.clip_by_global_norm``
        semantics), or None.
      block_size: elements per quantization block (> 0; bitsandbytes uses 256).
      state_format: ``"dynamic8"`` (int8/uint8 power-companded codes), ``"fp8"``
        (float8_e4m3fn with block scales) or ``"fp32"`` (no quantization).
      min_8bit_size: tensors with fewer elements keep fp32 state (bitsandbytes: 4096).
      fp32_state_filter: ``"default"`` (embeddings, LM head, norms, biases keep fp32 state),
        ``"none"``/None (size rule only), or a ``callable(path_tuple, leaf) -> bool``.
      skip_nonfinite: compute the global norm even without clipping, to skip non-finite steps.

    Returns:
      An ``optax.GradientTransformationExtraArgs``; ``update(grads, state, params=None,
      global_norm=None)``.

    Example:
      >>> tx = optax.chain(scale_by_adam_8bit(max_grad_norm=1.0), optax.scale(-1e-3))
    """
    config.validate_static(b1, b2, eps, block_size, state_format, min_8bit_size, max_grad_norm)
    return _make(b1, b2, eps, None, None, max_grad_norm, None, block_size, state_format,
                 min_8bit_size, fp32_state_filter, skip_nonfinite)


def adamw_8bit(
    learning_rate: float | optax.Schedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = DEFAULT_WEIGHT_DECAY,
    max_grad_norm: float | None = None,
    *,
    mask: Any = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    state_format: str = DEFAULT_STATE_FORMAT,
    min_8bit_size: int = DEFAULT_MIN_8BIT_SIZE,
    fp32_state_filter: str | Callable | None = "default",
    skip_nonfinite: bool = True,
    impl: str = native.DEFAULT_IMPL,
) -> optax.GradientTransformationExtraArgs:
    """AdamW with hybrid 8-bit state and fused global-norm clipping, in one optax transform.

    Computes ``updates = -lr * (adam(clip(g)) + weight_decay * params)`` exactly as
    ``optax.chain(optax.clip_by_global_norm(c), optax.adamw(lr, b1, b2, eps, weight_decay))``
    would (fp32 math), but with 8-bit moments and without a separate clipping pass. A step with a
    non-finite gradient norm is skipped: updates are 0, the state is untouched and
    ``state.num_skipped`` grows.

    Args:
      learning_rate: a float or an optax schedule (evaluated at the number of applied steps).
      b1, b2, eps: Adam hyperparameters.
      weight_decay: decoupled weight decay, >= 0. Default 1e-2 (torch AdamW and the paper's
        fine-tuning recipe), not optax's 1e-4.
      max_grad_norm: global-norm clip threshold, or None.
      mask: optional tree of bools (or callable(params) -> tree) choosing where weight decay
        applies, as ``optax.adamw``'s ``mask``.
      block_size, state_format, min_8bit_size, fp32_state_filter, skip_nonfinite: as in
        :func:`scale_by_adam_8bit`.
      impl: ``"auto"`` (default: ``"native"`` where the kernel could be built, else
        ``"xla"``), ``"native"`` (where the computation is lowered for the CPU, fp32 tensors
        with dynamic8 state get their new codes and scales from the native kernel in one pass,
        in place, while the update itself stays an XLA expression that fuses into
        ``apply_updates``; raises if the kernel cannot be built; the XLA path on accelerators)
        or ``"xla"`` (XLA everywhere). The update is XLA's bit for bit given the same state; the
        kernel's codes agree with XLA's to fp32 rounding (``native.py``).

    Returns:
      An ``optax.GradientTransformationExtraArgs`` (``update`` requires params).

    Example:
      >>> tx = adamw_8bit(learning_rate=optax.cosine_decay_schedule(1e-3, 1000), max_grad_norm=1.0)
    """
    return config.AdamW8bitConfig(
        learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
        max_grad_norm=max_grad_norm, mask=mask, block_size=block_size, state_format=state_format,
        min_8bit_size=min_8bit_size, fp32_state_filter=fp32_state_filter,
        skip_nonfinite=skip_nonfinite, impl=impl,
    ).transform()
