"""Costs measured on the live backend: the real units' bytes and times at the run's shapes.

``unit_costs`` builds a ``Costs`` whose every byte figure comes from the arrays the streaming
engine really holds (``jax.eval_shape`` of each unit at the stream dtype: the streamed weights, the
boundary activations, the ``jax.vjp`` residuals the engine keeps) and whose times are measured
(``profile``) or analytic. ``profile`` also measures the host link, the NVMe directory and the host
optimizer rate, so ``lt.plan(model, hardware="measure", ...)`` plans for the machine it runs on.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.model.units import get_units, loss_chunk_tokens
from lazytrain_jax.schedule.costs import Costs, config_fingerprint, config_name

STREAM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _tree_bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _abstract(tree, dtype):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), tree)


@functools.lru_cache(maxsize=64)
def residual_bytes(cfg, kind: str, micro_batch: int, seq_len: int, stream_dtype: str) -> int:
    """Bytes of the residuals ``layer_forward_with_residuals`` keeps for one micro-batch."""
    units = get_units(cfg)
    dtype = jnp.dtype(stream_dtype)
    params = _abstract(units.abstract_params(kind), dtype)
    h = jax.ShapeDtypeStruct((micro_batch, seq_len, cfg.hidden_size), dtype)
    ids = jax.ShapeDtypeStruct((micro_batch, seq_len), jnp.int32)
    _, res = jax.eval_shape(units.layer_forward_with_residuals(kind), params, h, ids, ids)
    return _tree_bytes(res)


def unit_costs(model_or_config, *, batch_size: int, seq_len: int, num_micro_batches: int = 1,
               stream_dtype: str = "bfloat16", grad_dtype: str | None = None, times: Costs | None = None,
               device_flops: float = 1e12) -> Costs:
    """Costs whose byte figures are the engine's real arrays at these shapes.

    Args:
      model_or_config: a Model or ModelConfig.
      batch_size, seq_len, num_micro_batches: the step.
      stream_dtype: dtype of streamed weights and activations.
      grad_dtype: dtype of gradients sent to the host (default: ``float32`` for fp32 streaming,
        else ``bfloat16``).
      times: take every time field from these Costs (e.g. measured by :func:`profile`); default:
        the analytic times at ``device_flops``.
    Returns:
      Costs (``source="measured"`` when ``times`` is measured).
    Example:
      >>> costs = unit_costs(model, batch_size=4, seq_len=64, stream_dtype="float32")
    """
    from lazytrain_jax.schedule.costs import GRAD_DTYPE_BYTES, analytic_costs
    cfg = getattr(model_or_config, "config", model_or_config)
    if stream_dtype not in STREAM_BYTES:
        raise ValueError(f"stream_dtype={stream_dtype!r}; valid: {sorted(STREAM_BYTES)}")
    grad_dtype = grad_dtype or ("float32" if stream_dtype == "float32" else "bfloat16")
    if times is None:
        times = analytic_costs(cfg, batch_size=batch_size, seq_len=seq_len, device_flops=device_flops,
                               num_micro_batches=num_micro_batches, grad_dtype=grad_dtype)
    units = get_units(cfg)
    sb, gb = STREAM_BYTES[stream_dtype], GRAD_DTYPE_BYTES[grad_dtype]
    micro = batch_size // num_micro_batches
    boundary = float(batch_size * seq_len * cfg.hidden_size * sb)
    n_embed = cfg.embed_num_params()
    n_layers = [cfg.layer_num_params(k) for k in cfg.layer_kinds]
    n_head = cfg.head_num_params()
    table = cfg.vocab_size * cfg.hidden_size
    head_w = float((n_head + (table if cfg.tie_word_embeddings else 0)) * sb)
    head_g = float((n_head + (table if cfg.tie_word_embeddings else 0)) * 4)  # fp32 accumulators on device
    chunk = loss_chunk_tokens(cfg.vocab_size, micro * seq_len)
    residual = [float(residual_bytes(cfg, k, micro, seq_len, stream_dtype) * num_micro_batches)
                for k in cfg.layer_kinds]
    workspace = [float(2 * residual_bytes(cfg, k, micro, seq_len, stream_dtype)) for k in cfg.layer_kinds]
    head_ws = head_w + head_g * (2 if num_micro_batches > 1 else 1) + 2.0 * chunk * cfg.vocab_size * 4
    return Costs(model_name=times.model_name, model_fingerprint=config_fingerprint(cfg), batch_size=batch_size,
                 seq_len=seq_len, num_micro_batches=num_micro_batches, grad_dtype=grad_dtype,
                 unit_names=times.unit_names, unit_kinds=times.unit_kinds,
                 num_params=tuple([n_embed] + n_layers + [n_head]),
                 weight_bytes=tuple([boundary] + [float(n * sb) for n in n_layers] + [head_w]),
                 grad_bytes=tuple([boundary] + [float(n * gb) for n in n_layers] + [float(n_head * gb)]),
                 fwd_time=times.fwd_time, bwd_time=times.bwd_time, bwd_recompute_time=times.bwd_recompute_time,
                 boundary_bytes=(boundary,) * (cfg.num_layers + 1), residual_bytes=tuple(residual),
                 workspace_bytes=tuple(workspace), head_workspace_bytes=head_ws, source=times.source)
