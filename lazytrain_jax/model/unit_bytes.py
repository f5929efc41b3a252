"""Device bytes of the streaming units, measured on the real units (the truth the planner follows).

For a ModelConfig, a layer kind, a micro-batch size, a sequence length and a stream dtype:

- boundary bytes: ``jax.eval_shape`` of the layer's forward output;
- residual bytes: ``jax.eval_shape`` of ``ModelUnits.layer_forward_with_residuals`` (the ``jax.vjp``
  residuals the executor keeps, the layer's own weights excluded);
- backward workspace: XLA's compiled memory analysis (temp bytes) of the layer's backward on the
  current backend, the larger of the recompute backward and the backward from kept residuals
  (``source="xla:<backend>"``); where the backend gives no memory analysis, an upper bound from the
  backward's jaxpr: every intermediate it creates, summed, one loop iteration of each loop
  (``source="jaxpr-bound"``);
- head workspace: head weights (stream dtype) + their gradient accumulated in fp32 (twice with
  several micro-batches, as the executor holds it) + the fp32 logits of one loss chunk and their
  gradient, the chunk read off the traced head loss.

``schedule.costs.analytic_costs`` follows the same rules in pure Python; ``tests/model/test_unit_bytes``
holds the two together on real shapes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.units import get_units

STREAM_DTYPES = ("bfloat16", "float16", "float32")
WORKSPACE_METHODS = ("compiled", "bound", "none")


@dataclasses.dataclass(frozen=True)
class LayerBytes:
    """Bytes of one layer unit for one micro-batch.

    Args:
      boundary: the layer's output [B, S, D]; residual: its kept ``jax.vjp`` residuals;
      workspace: its backward's workspace (0 when not measured); workspace_source: how it was
        obtained (``xla:<backend>``, ``jaxpr-bound`` or ``none``).
    """

    boundary: int
    residual: int
    workspace: int
    workspace_source: str


def _nbytes(tree) -> int:
    return int(sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _check(stream_dtype, micro_batch_size, seq_len):
    if stream_dtype not in STREAM_DTYPES:
        raise ValueError(f"stream_dtype={stream_dtype!r}; valid: {list(STREAM_DTYPES)}")
    for name, value in (("micro_batch_size", micro_batch_size), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive integer")


def _layer_args(config: ModelConfig, kind: str, micro_batch_size: int, seq_len: int, stream_dtype: str):
    dtype = jnp.dtype(stream_dtype)
    units = get_units(config)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), units.abstract_params(kind))
    h = jax.ShapeDtypeStruct((micro_batch_size, seq_len, config.hidden_size), dtype)
    ints = jax.ShapeDtypeStruct((micro_batch_size, seq_len), jnp.int32)
    return units, params, h, ints


def layer_bytes(config: ModelConfig, kind: str, *, micro_batch_size: int, seq_len: int,
                stream_dtype: str = "bfloat16", workspace: str = "compiled") -> LayerBytes:
    """Boundary, residual and backward-workspace bytes of one layer kind.

    Args:
      config: the model; kind: a layer kind of it; micro_batch_size, seq_len: one micro-batch.
      stream_dtype: ``bfloat16`` | ``float32`` (weights and activations on the device).
      workspace: ``compiled`` (XLA memory analysis, falling back to the jaxpr bound), ``bound``
        (the jaxpr bound only) or ``none`` (skip; 0).
    Returns:
      LayerBytes.
    Example:
      >>> layer_bytes(get_preset("qwen2.5-0.5b"), "decoder", micro_batch_size=1, seq_len=1024).residual
      31780864
    """
    _check(stream_dtype, micro_batch_size, seq_len)
    if workspace not in WORKSPACE_METHODS:
        raise ValueError(f"workspace={workspace!r}; valid: {list(WORKSPACE_METHODS)}")
    units, params, h, ints = _layer_args(config, kind, micro_batch_size, seq_len, stream_dtype)
    forward = units.layer_forward_with_residuals(kind)
    out, residuals = jax.eval_shape(forward, params, h, ints, ints)
    ws, source = 0, "none"
    if workspace != "none":
        backward_args = ((units.layer_backward(kind), (params, h, ints, ints, h)),
                         (units.layer_backward_from_residuals(kind), (params, residuals, h)))
        if workspace == "compiled":
            temps = [_compiled_temp_bytes(fn, args) for fn, args in backward_args]
            if all(t is not None for t in temps):
                ws, source = max(temps), f"xla:{jax.default_backend()}"
        if source == "none":
            ws = max(jaxpr_bound_bytes(fn, *args) for fn, args in backward_args)
            source = "jaxpr-bound"
    return LayerBytes(boundary=_nbytes(out), residual=_nbytes(residuals), workspace=int(ws),
                      workspace_source=source)


def _compiled_temp_bytes(fn, args) -> int | None:
    try:
        analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
    except NotImplementedError:
        return None
    return None if analysis is None else int(analysis.temp_size_in_bytes)


def jaxpr_bound_bytes(fn, *args) -> int:
    """Upper bound of ``fn``'s workspace: the bytes of every value its jaxpr creates (outputs
    excluded), sub-jaxprs (loop bodies, checkpointed and custom-vjp regions) counted once each.

    Example:
      >>> jaxpr_bound_bytes(lambda x: jnp.sin(x) * 2, jax.ShapeDtypeStruct((4,), jnp.float32))
      16
    """
    closed = jax.make_jaxpr(fn)(*args)
    return _jaxpr_bytes(closed.jaxpr, exclude=set(map(id, closed.jaxpr.outvars)))


def _sub_jaxprs(value):
    if isinstance(value, jex_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jex_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _sub_jaxprs(v)


def _jaxpr_bytes(jaxpr, exclude=frozenset()) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            if id(v) not in exclude and hasattr(v.aval, "shape"):
                total += int(v.aval.size) * jnp.dtype(v.aval.dtype).itemsize
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                total += _jaxpr_bytes(sub)
    return total


def _largest_fp32_value_bytes(jaxpr) -> int:
    best = 0
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            if hasattr(v.aval, "shape") and v.aval.dtype == jnp.float32:
                best = max(best, int(v.aval.size) * jnp.dtype(v.aval.dtype).itemsize)
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                best = max(best, _largest_fp32_value_bytes(sub))
    return best


def head_workspace_bytes(config: ModelConfig, *, micro_batch_size: int, seq_len: int,
                         stream_dtype: str = "bfloat16", num_micro_batches: int = 1) -> int:
    """Head/loss window bytes: head weights + their fp32 gradient accumulator (twice with several
    micro-batches) + one loss chunk's fp32 logits and their gradient.

    The weights are the final norm and the (possibly tied) [V, D] LM-head matrix; the chunk's logits
    are the largest fp32 value of the traced chunked loss (``ModelUnits.head_loss``).

    Args:
      config: the model; micro_batch_size, seq_len: one micro-batch; stream_dtype: weights on the
        device; num_micro_batches: micro-batches per step (the executor keeps one micro-batch's
        gradient beside the fp32 sum when there are several).
    Returns:
      Bytes.
    Example:
      >>> head_workspace_bytes(get_preset("qwen2.5-0.5b"), micro_batch_size=1, seq_len=1024)
    """
    _check(stream_dtype, micro_batch_size, seq_len)
    if isinstance(num_micro_batches, bool) or not isinstance(num_micro_batches, int) or num_micro_batches <= 0:
        raise ValueError(f"num_micro_batches={num_micro_batches!r} must be a positive integer")
    units = get_units(config)
    dtype = jnp.dtype(stream_dtype)
    head = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, dtype), units.abstract_params("head"))
    matrix = jax.ShapeDtypeStruct((config.vocab_size, config.hidden_size), dtype)
    weights = [head, matrix] if config.tie_word_embeddings else [head]  # untied: lm_head is in ``head``
    h = jax.ShapeDtypeStruct((micro_batch_size, seq_len, config.hidden_size), dtype)
    labels = jax.ShapeDtypeStruct((micro_batch_size, seq_len), jnp.int32)
    closed = jax.make_jaxpr(lambda p, w, x, t: units.head_loss(p, w, x, t)[0])(head, matrix, h, labels)
    logits_chunk = _largest_fp32_value_bytes(closed.jaxpr)
    num_weights = sum(x.size for x in jax.tree.leaves(weights))
    accumulators = 2 if num_micro_batches > 1 else 1
    return int(num_weights * (dtype.itemsize + 4 * accumulators) + 2 * logits_chunk)
