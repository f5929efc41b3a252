"""Planner costs of the Qwen3.5/3.6 hybrid kinds against the real units and the dense formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule.costs import analytic_costs, hybrid_residual_bytes_per_token, layer_fwd_flops


def vjp_residual_bytes(cfg, kind, batch, seq):
    """Bytes ``jax.vjp`` of one layer keeps besides the parameters (bf16), by ``jax.eval_shape``."""
    from lazytrain_jax.model.units import get_units

    units = get_units(cfg)
    fn = units.layer(kind)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), units.abstract_params(kind))
    h = jax.ShapeDtypeStruct((batch, seq, cfg.hidden_size), jnp.bfloat16)
    ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    leaves = jax.eval_shape(lambda p, x, i: jax.tree.leaves(jax.vjp(lambda p, x: fn(p, x, i, i), p, x)[1]),
                            params, h, ids)
    size = lambda xs: sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in xs)
    return size(leaves) - size(jax.tree.leaves(params))


def test_linear_attention_residuals_match_the_unit():
    cfg = get_preset("qwen3.6-27b", num_layers=4)
    measured = vjp_residual_bytes(cfg, "linear_attention", 1, 256)
    predicted = hybrid_residual_bytes_per_token(cfg, "linear_attention") * 256
    assert abs(predicted - measured) / measured < 0.05, (predicted, measured)


def test_mixed_stack_costs():
    cfg = get_preset("qwen3.6-27b")
    c = analytic_costs(cfg, batch_size=8, seq_len=1024, device_flops=5e14)
    kinds = c.unit_kinds[1:-1]
    assert kinds == cfg.layer_kinds
    lin = kinds.index("linear_attention")
    full = kinds.index("full_attention")
    assert c.fwd_time[1 + lin] != c.fwd_time[1 + full]
    assert c.residual_bytes[lin] > c.residual_bytes[full]  # the delta rule's fp32 chunk tensors
    assert c.weight_bytes[1 + lin] == 2 * cfg.layer_num_params("linear_attention")
    # the recurrence costs more than the matmuls' share of its state size, less than attention at 1024
    rec = layer_fwd_flops(cfg, "linear_attention", 1, 1024) - 2 * cfg.layer_num_params("linear_attention") * 1024
    att = layer_fwd_flops(cfg, "full_attention", 1, 1024) - 2 * cfg.layer_num_params("full_attention") * 1024
    assert 0 < rec and 0 < att
    assert sum(c.num_params) == cfg.num_params()
