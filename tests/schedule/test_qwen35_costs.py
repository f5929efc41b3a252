"""Planner costs of the Qwen3.5/3.6 hybrid kinds against the real units (model/unit_bytes.py).

Tolerance policy: residual bytes within 1 % of ``jax.eval_shape`` of the units (per-token terms
exact; a few [B, 1, *] constants are left out of the per-token formula), bf16 and fp32 streams. The
backward workspace is a model of XLA's compiled temp bytes: on the CPU backend in fp32 the
measured temp lies in [0.5, 1.1] x the formula (the project's rule for decoder layers).
"""

import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule.costs import analytic_costs, layer_fwd_flops, layer_residual_and_workspace

SHAPES = [("qwen3.6-27b", dict(num_layers=4), 256),
          ("qwen3.5-debug", dict(linear_num_key_heads=1, linear_num_value_heads=3, linear_key_head_dim=24,
                                 linear_value_head_dim=8, linear_conv_kernel_dim=3, partial_rotary_factor=0.5), 100)]


@pytest.mark.parametrize("stream_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("kind", ["linear_attention", "full_attention"])
@pytest.mark.parametrize("preset, overrides, seq", SHAPES)
def test_residuals_match_the_units(preset, overrides, seq, kind, stream_dtype):
    from lazytrain_jax.model import unit_bytes

    cfg = get_preset(preset, **overrides)
    measured = unit_bytes.layer_bytes(cfg, kind, micro_batch_size=2, seq_len=seq, stream_dtype=stream_dtype,
                                      workspace="none").residual
    predicted = layer_residual_and_workspace(cfg, kind, 2, seq, stream_dtype)[0] * 2 * seq
    assert abs(predicted - measured) / measured < 1e-2, (predicted, measured)


@pytest.mark.parametrize("kind", ["linear_attention", "full_attention"])
def test_workspace_model_brackets_xla_temps(kind):
    from lazytrain_jax.model import unit_bytes

    cfg = get_preset("qwen3.5-debug")
    measured = unit_bytes.layer_bytes(cfg, kind, micro_batch_size=2, seq_len=256, stream_dtype="float32").workspace
    predicted = layer_residual_and_workspace(cfg, kind, 2, 256, "float32")[1]
    assert 0.5 <= measured / predicted <= 1.1, (measured, predicted)


def test_mixed_stack_costs():
    cfg = get_preset("qwen3.6-27b")
    c = analytic_costs(cfg, batch_size=8, seq_len=1024, device_flops=5e14)
    kinds = c.unit_kinds[1:-1]
    assert kinds == cfg.layer_kinds
    lin, full = kinds.index("linear_attention"), kinds.index("full_attention")
    assert c.fwd_time[1 + lin] != c.fwd_time[1 + full]
    assert c.residual_bytes[lin] > c.residual_bytes[full]
    assert sum(c.num_params) == cfg.num_params()
    recurrence = layer_fwd_flops(cfg, "linear_attention", 1, 1024) - 2 * cfg.layer_num_params("linear_attention") * 1024
    assert 0 < recurrence < 0.05 * 2 * cfg.layer_num_params("linear_attention") * 1024
