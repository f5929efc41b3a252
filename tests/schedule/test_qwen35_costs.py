"""Planner costs of the Qwen3.5/3.6 hybrid kinds against the real units and the dense formulas."""

import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule.costs import analytic_costs, hybrid_residual_bytes_per_token, layer_fwd_flops


@pytest.mark.parametrize("preset, overrides, seq", [
    ("qwen3.6-27b", dict(num_layers=4), 256),
    ("qwen3.5-debug", dict(linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=24,
                           linear_value_head_dim=8, linear_conv_kernel_dim=3), 100)])
def test_linear_attention_residuals_match_the_unit(preset, overrides, seq):
    """The formula against the residuals the streaming engine keeps (``jax.eval_shape`` of the unit)."""
    from lazytrain_jax.executor.profiler import residual_bytes

    cfg = get_preset(preset, **overrides)
    measured = residual_bytes(cfg, "linear_attention", 2, seq, "bfloat16")
    predicted = hybrid_residual_bytes_per_token(cfg, "linear_attention") * 2 * seq
    assert abs(predicted - measured) / measured < 0.02, (predicted, measured)


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
