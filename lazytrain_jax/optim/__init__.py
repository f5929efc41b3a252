"""Hybrid 8-bit optimizer: blockwise 8-bit Adam state with fused global-norm clipping.

Public API:
  * :func:`adamw_8bit`, :func:`scale_by_adam_8bit` -- optax transforms (``ScaleByAdam8bitState``).
  * :class:`AdamW8bitConfig` -- the frozen hyperparameters ``adamw_8bit`` is built from (the
    transform and the executor's per-unit update share it); :func:`hyperparams_of` recovers it.
  * :func:`quantize`, :func:`dequantize` -- the blockwise code maps (``blockwise.py`` documents
    them and their error bounds).
  * :func:`default_fp32_state_filter`, :func:`state_bytes_per_param` -- the hybrid policy.
  * :func:`begin_step`, :func:`apply_layer_update`, :func:`fused_layer_step`,
    :func:`layer_moments`, :func:`set_layer_moments` -- layer-by-layer host updates
    (``fused_layer_step(impl="native")``: the one-pass C++ kernel of ``native.py``).

Example:
    >>> import lazytrain_jax as lt
    >>> tx = lt.optim.adamw_8bit(learning_rate=1e-5, weight_decay=0.01, max_grad_norm=1.0)
"""

from lazytrain_jax.optim.config import AdamW8bitConfig, hyperparams_of
from lazytrain_jax.optim.adam8bit import (
    DEFAULT_WEIGHT_DECAY,
    STATIC_ARGS,
    ScaleByAdam8bitState,
    adamw_8bit,
    init_moments,
    scale_by_adam_8bit,
)
from lazytrain_jax.optim.kernel import AdamHyperparams, StepInfo, begin_step, global_norm_fp32
from lazytrain_jax.optim.layerwise import (
    LayerMoments,
    apply_layer_update,
    fused_layer_step,
    layer_moments,
    set_layer_moments,
)
from lazytrain_jax.optim.policy import (
    default_fp32_state_filter,
    no_fp32_state_filter,
    state_bytes_per_param,
)
from lazytrain_jax.optim.blockwise import STATE_FORMATS, dequantize, quantize

__all__ = [
    "DEFAULT_WEIGHT_DECAY",
    "STATE_FORMATS",
    "STATIC_ARGS",
    "AdamHyperparams",
    "AdamW8bitConfig",
    "LayerMoments",
    "ScaleByAdam8bitState",
    "StepInfo",
    "adamw_8bit",
    "apply_layer_update",
    "begin_step",
    "default_fp32_state_filter",
    "dequantize",
    "fused_layer_step",
    "global_norm_fp32",
    "hyperparams_of",
    "init_moments",
    "layer_moments",
    "no_fp32_state_filter",
    "quantize",
    "scale_by_adam_8bit",
    "set_layer_moments",
    "state_bytes_per_param",
]
