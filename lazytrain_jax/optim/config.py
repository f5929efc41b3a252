"""``AdamW8bitConfig``: the one frozen description of an ``adamw_8bit`` optimizer.

The optax transform (``cfg.transform()``) and the streaming executor's per-unit host update
(``begin_step`` + ``fused_layer_step`` with ``cfg.adam_hyperparams`` / ``cfg.decay_mask``) are
both built from it, so the two cannot disagree about a hyperparameter. ``hyperparams_of(tx)``
recovers the config from a transform built by ``adamw_8bit``.

Validation: a hyperparameter given as a Python number or a concrete array is checked when the
config is built (``__post_init__``); a schedule's value is checked when it is evaluated
(:meth:`AdamW8bitConfig.adam_hyperparams`) if the step count is concrete. A value traced by
``jax.jit`` (``optax.inject_hyperparams`` inside a jitted step, a schedule of a traced count)
cannot raise; :func:`hyperparams_valid` turns it into a skipped step instead (see its docstring).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from lazytrain_jax.optim import blockwise as q
from lazytrain_jax.optim import native, policy
from lazytrain_jax.optim.kernel import AdamHyperparams

# Chosen by benchmarks/optimizer_cpu.py (2-core CPU): dynamic8 runs at ~1.0-1.2x optax fp32 AdamW,
# fp8 at 2.5-4x (XLA CPU emulates float8 conversions); dynamic8 is also the more accurate
# (worst free-running loss ratio 1.0003 vs 1.0013 over the 48-config grid).
DEFAULT_STATE_FORMAT = "dynamic8"
DEFAULT_BLOCK_SIZE = 256
DEFAULT_MIN_8BIT_SIZE = 4096
# torch.optim.AdamW's default, and the fine-tuning recipe this library targets (lr 1e-5, wd 0.01);
# optax.adamw defaults to 1e-4 and bitsandbytes' Adam8bit to 0: compare like with like.
DEFAULT_WEIGHT_DECAY = 1e-2

_RULES = {  # field -> (predicate on a float or a jnp array (no `and`/`not`), what would be valid)
    "learning_rate": (lambda x: x >= 0.0, "must be >= 0 (a negative rate ascends the loss)"),
    "b1": (lambda x: (x >= 0.0) & (x < 1.0), "must be in [0, 1)"),
    "b2": (lambda x: (x >= 0.0) & (x < 1.0), "must be in [0, 1)"),
    "eps": (lambda x: x >= 0.0, "must be >= 0"),
    "weight_decay": (lambda x: x >= 0.0, "must be >= 0 (a negative decay grows the weights)"),
    "max_grad_norm": (lambda x: x > 0.0, "must be > 0 or None"),
    # a non-finite norm is a legal input (the step is skipped); a negative one is a caller's bug
    "global_norm": (lambda x: (x >= 0.0) | (x != x),
                    "must be >= 0 (a global L2 norm), inf/NaN or None"),
}


def concrete_float(value) -> float | None:
    """``value`` as a Python float when it is a concrete scalar, else None (traced, or no number).

    Example:
      >>> concrete_float(jnp.float32(0.5)), concrete_float(None)
      (0.5, None)
    """
    if value is None or isinstance(value, bool) or isinstance(value, jax.core.Tracer):
        return None
    if isinstance(value, (int, float, np.number)):
        return float(value)
    if isinstance(value, (jax.Array, np.ndarray)) and value.size == 1:
        return float(np.asarray(value).reshape(()))
    return None


def check_value(name: str, value) -> None:
    """Raises ValueError naming ``name``, the value and the valid range if a concrete value breaks
    the rule for ``name`` (one of learning_rate, b1, b2, eps, weight_decay, max_grad_norm,
    global_norm). Traced values and None pass.

    Example:
      >>> check_value("b2", 1.0)  # ValueError: b2=1.0 is invalid; b2 must be in [0, 1)
    """
    x = concrete_float(value)
    ok, valid = _RULES[name]
    if x is not None and not ok(x):
        raise ValueError(f"{name}={value!r} is invalid; {name} {valid}")


def hyperparams_valid(hp: AdamHyperparams, max_grad_norm=None):
    """A traced bool: do the traced hyperparameters of one step obey the rules; None if none is.

    Concrete values were already checked (and raised); traced ones cannot raise inside ``jit``,
    so the optimizer skips a step whose traced hyperparameters are invalid (NaN included): params
    and moments stay untouched and ``num_skipped`` grows, as for a non-finite gradient norm.
    None (nothing traced) adds no work to the compiled step.

    Example:
      >>> hyperparams_valid(AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.0))  # None: all concrete
    """
    named = dict(zip(("b1", "b2", "eps", "learning_rate", "weight_decay"), hp))
    named["max_grad_norm"] = max_grad_norm
    ok = None
    for name, value in named.items():
        if isinstance(value, jax.core.Tracer):
            good = jnp.all(_RULES[name][0](jnp.asarray(value, jnp.float32)))
            ok = good if ok is None else ok & good
    return ok


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"{name}={value!r} is invalid; it must be a Python int >= {low} (under "
            "optax.inject_hyperparams list it in static_args)"
        )


def resolve_filter(fp32_state_filter):
    """``fp32_state_filter`` as a callable or None; ValueError for anything else."""
    if isinstance(fp32_state_filter, str) and fp32_state_filter == "default":
        return policy.default_fp32_state_filter
    if fp32_state_filter is None or (isinstance(fp32_state_filter, str)
                                     and fp32_state_filter == "none"):
        return None
    if callable(fp32_state_filter):
        return fp32_state_filter
    raise ValueError(
        f"fp32_state_filter={fp32_state_filter!r} is invalid; valid: 'default', 'none', None or "
        "a callable(path_tuple, leaf) -> bool"
    )


def validate_static(b1, b2, eps, block_size, state_format, min_8bit_size, max_grad_norm):
    """The checks shared by ``scale_by_adam_8bit`` and ``AdamW8bitConfig``."""
    for name, value in (("b1", b1), ("b2", b2), ("eps", eps), ("max_grad_norm", max_grad_norm)):
        check_value(name, value)
    _check_int("block_size", block_size, 1)
    q.check_state_format(state_format)
    _check_int("min_8bit_size", min_8bit_size, 0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdamW8bitConfig:
    """Every argument of :func:`adamw_8bit`, validated; builds the transform and the per-unit step.

    Attributes:
      learning_rate: a float (or scalar array) >= 0, or an optax schedule of the applied-step count.
      b1, b2: moment decay rates in [0, 1); eps: >= 0.
      weight_decay: decoupled weight decay >= 0, or None (no decay).
      max_grad_norm: global-norm clip threshold > 0, or None.
      mask: None (decay everything), a tree of bools matching the params, or a
        ``callable(params) -> tree`` (``optax.adamw``'s ``mask``).
      block_size, state_format, min_8bit_size, fp32_state_filter, skip_nonfinite: as in
        :func:`scale_by_adam_8bit`; impl: as in :func:`adamw_8bit` (the per-unit host step
        takes the same, so the two paths stay equal bit for bit).

    Example:
      >>> cfg = AdamW8bitConfig(learning_rate=1e-5, max_grad_norm=1.0)
      >>> tx = cfg.transform()                      # == adamw_8bit(1e-5, max_grad_norm=1.0)
      >>> hp = cfg.adam_hyperparams(state.count)    # for fused_layer_step
    """

    learning_rate: float | optax.Schedule
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float | None = DEFAULT_WEIGHT_DECAY
    max_grad_norm: float | None = None
    mask: Any = None
    block_size: int = DEFAULT_BLOCK_SIZE
    state_format: str = DEFAULT_STATE_FORMAT
    min_8bit_size: int = DEFAULT_MIN_8BIT_SIZE
    fp32_state_filter: str | Callable | None = "default"
    skip_nonfinite: bool = True
    impl: str = native.DEFAULT_IMPL

    def __post_init__(self):
        if self.learning_rate is None:
            raise ValueError("learning_rate=None is invalid; give a float >= 0 or an optax "
                             "schedule (scale_by_adam_8bit is the transform without one)")
        if not callable(self.learning_rate):
            check_value("learning_rate", self.learning_rate)
        check_value("weight_decay", self.weight_decay)
        validate_static(self.b1, self.b2, self.eps, self.block_size, self.state_format,
                        self.min_8bit_size, self.max_grad_norm)
        resolve_filter(self.fp32_state_filter)
        native.check_impl(self.impl)
        if not isinstance(self.skip_nonfinite, bool):
            raise ValueError(f"skip_nonfinite={self.skip_nonfinite!r} is invalid; it must be a "
                             "Python bool (under optax.inject_hyperparams list it in static_args)")

    def transform(self) -> optax.GradientTransformationExtraArgs:
        """The optax transform (what :func:`adamw_8bit` returns); ``hyperparams_of`` finds self.

        Example:
          >>> tx = AdamW8bitConfig(learning_rate=1e-3).transform()
        """
        from lazytrain_jax.optim import adam8bit  # adam8bit builds its configs from this module

        return adam8bit.make_transform(self)

    def adam_hyperparams(self, count) -> AdamHyperparams:
        """The step's numeric hyperparameters (for ``fused_layer_step`` / ``apply_layer_update``).

        Args:
          count: the state's ``count`` before the step (applied steps so far); a schedule is
            evaluated at it, as the whole-tree transform does.

        Returns:
          :class:`AdamHyperparams` (weight decay 0 when ``weight_decay`` is None). A schedule value
          that is concrete and negative raises ValueError.

        Example:
          >>> hp = cfg.adam_hyperparams(state.count)
        """
        lr = self.learning_rate
        if callable(lr):
            lr = lr(count)
            check_value("learning_rate", lr)
        wd = 0.0 if self.weight_decay is None else self.weight_decay
        return AdamHyperparams(self.b1, self.b2, self.eps, lr, wd)

    def decay_mask(self, params):
        """Where weight decay applies: a tree of Python bools matching ``params``, or None (all).

        Args:
          params: the whole params tree (a callable ``mask`` is applied to it).

        Returns:
          None when ``mask`` is None, else the mask tree with every leaf a Python bool (slice it
          per unit, e.g. ``mask["layers"][3]``, for ``fused_layer_step(decay_mask=...)``).

        Example:
          >>> cfg.decay_mask(params)["head"]["norm"]["weight"]   # False with a norm-excluding mask
        """
        mask = self.mask(params) if callable(self.mask) else self.mask
        if mask is None:
            return None

        def to_bool(path, x):
            if isinstance(x, jax.core.Tracer) or jnp.size(x) != 1:
                raise ValueError(
                    f"mask leaf at {jax.tree_util.keystr(path)} is {x!r}; mask leaves must be "
                    "concrete scalar bools")
            return bool(x)

        mask_leaves = jax.tree_util.tree_flatten_with_path(mask)[0]
        treedef = jax.tree.structure(mask)
        return treedef.unflatten([to_bool(p, x) for p, x in mask_leaves])


def hyperparams_of(tx) -> AdamW8bitConfig | None:
    """The :class:`AdamW8bitConfig` a transform was built from, or None for any other transform.

    Transforms from :func:`adamw_8bit` / ``AdamW8bitConfig.transform`` carry their config;
    ``optax.inject_hyperparams(adamw_8bit)`` keeps its hyperparameters in the optimizer state
    instead, so it gives None (as every other optax transform does).

    Example:
      >>> hyperparams_of(adamw_8bit(1e-3)).learning_rate
      0.001
    """
    cfg = getattr(getattr(tx, "update", None), "adamw_8bit_config", None)
    return cfg if isinstance(cfg, AdamW8bitConfig) else None
