"""The least-peak plan (``schedule/least_peak.py``) against enumerating every tier assignment, and
against the MILP with the memory objective; and ``lt.plan``'s fits / largest batch that use it."""

import itertools
import random
import types

import pytest

from lazytrain_jax.model.config import resolve_config
from lazytrain_jax.schedule import api, least_peak, memory, milp
from lazytrain_jax.schedule.costs import analytic_costs, synthetic_costs
from lazytrain_jax.schedule.hardware import Hardware

from tests.schedule.test_milp_exhaustive import tier_options

GB = 1e9


def uniform_instance(rng, num_layers):
    """Layers of one boundary size, varied weights, compute and residuals; host and NVMe room for a
    few boundaries (or none), sometimes a fraction over a whole number of them."""
    a = rng.uniform(0.2, 2.0) * GB
    costs = synthetic_costs(num_layers=num_layers, weight_bytes=[rng.uniform(0.1, 1.0) * GB for _ in range(num_layers)],
                            boundary_bytes=a, fwd_time=[rng.uniform(0.01, 0.1) for _ in range(num_layers)],
                            residual_bytes=[rng.uniform(0, 3) * a for _ in range(num_layers)],
                            workspace_bytes=rng.uniform(0.5, 2) * a, head_time=0.05, head_bytes=0.5 * GB,
                            head_workspace_bytes=rng.uniform(0.5, 3) * a)
    hw = Hardware(device_memory=1e30, h2d_bw=20e9, d2h_bw=20e9, device_flops=1e14, host_opt_rate=1e10,
                  host_memory=rng.choice([0.0, 0.5, 1.0, 2.0, 3.6, 6.0]) * a,
                  nvme_memory=rng.choice([0.0, 0.0, 1.0, 2.5, 4.0]) * a)
    return costs, hw


def enumerated_least_peak(costs, hw, max_segment_length):
    """The least device peak over every tier assignment with segments of at most
    ``max_segment_length`` layers within the host's and NVMe's room (no residuals, no resident
    tail, depths 1: each of those only adds device bytes)."""
    L = costs.num_layers
    best = float("inf")
    for inner in itertools.product(*tier_options(costs, hw)):
        tiers = ("device",) + inner + ("device",)
        if any(e - s > max_segment_length for s, e in memory.segments(tiers)):
            continue
        probe = types.SimpleNamespace(boundary_tiers=tiers, keep_residuals=(False,) * L, offload_residuals=(),
                                      resident_tail=0, weight_prefetch_depth=1, act_prefetch_depth=1)
        if memory.host_peak_bytes(costs, probe) > hw.host_memory or memory.nvme_peak_bytes(costs, probe) > hw.nvme_memory:
            continue
        best = min(best, memory.device_peak_bytes(costs, hw, probe))
    return best


def check_least_peak_plan(plan, costs, hw, max_segment_length):
    assert plan.costs == costs and plan.resident_tail == 0 and not any(plan.keep_residuals)
    assert (plan.weight_prefetch_depth, plan.act_prefetch_depth) == (1, 1)
    assert max(e - s for s, e in plan.segments) <= max_segment_length
    # Plan.fits' tolerance: room for exactly k boundaries holds k of them summed in floating point
    assert plan.predicted_peak_host_bytes <= hw.host_memory * (1 + 1e-9)
    assert plan.predicted_peak_nvme_bytes <= hw.nvme_memory * (1 + 1e-9)


def least_peak_cases(seed, count, layers, segment_limits):
    """``count`` uniform instances (layers and segment limit drawn from the ranges), each with its
    least-peak plan, checked: ``(trial, costs, hw, S, plan)``."""
    rng = random.Random(seed)
    for trial in range(count):
        costs, hw = uniform_instance(rng, rng.randint(*layers))
        S = rng.randint(*segment_limits)
        plan = least_peak.least_peak_plan(costs, hw, S)
        check_least_peak_plan(plan, costs, hw, S)
        yield trial, costs, hw, S, plan


def test_least_peak_equals_enumeration():
    """Every tier assignment of 3-7 layers enumerated (segment limits 2-8): the same least peak,
    on 40 instances, and the plan returned is within the host's and NVMe's room."""
    for trial, costs, hw, S, plan in least_peak_cases(7, 40, (3, 7), (2, 8)):
        want = enumerated_least_peak(costs, hw, S)
        assert plan.predicted_peak_device_bytes == pytest.approx(want, rel=1e-12), (trial, S, plan.boundary_tiers)


def test_least_peak_equals_the_memory_milp():
    """The MILP with the memory objective (proved optimal) on 8-16 layers: the same least peak."""
    for trial, costs, hw, S, plan in least_peak_cases(11, 8, (8, 16), (3, 8)):
        solved = milp.solve(costs, hw, objective="memory", max_segment_length=S, rel_gap=0.0, time_limit_s=60)
        assert solved.solver_status == "optimal", trial
        assert plan.predicted_peak_device_bytes == pytest.approx(solved.predicted_peak_device_bytes, rel=1e-9), trial


def test_boundaries_of_several_sizes_are_left_to_the_search_and_the_milp():
    costs = synthetic_costs(num_layers=6, weight_bytes=1e9, boundary_bytes=[1e9, 1e9, 2e9, 1e9, 1e9, 1e9, 1e9],
                            fwd_time=0.05)
    hw = Hardware(device_memory=80e9, h2d_bw=20e9, d2h_bw=20e9, device_flops=1e14, host_memory=3e9)
    assert not least_peak.uniform_boundaries(costs)
    assert least_peak.least_peak_plan(costs, hw) is None
    assert api.fitting_start(costs, hw) is not None  # the search's plan, as before


def test_largest_batch_of_a_real_shape_from_the_least_peak():
    """Qwen2.5-14B on an H800 (15 GB host, 32 GB NVMe): 476 sequences fit (34 micro-batches) and
    480 and 477 do not, which the MILP's first fitting plan could not say within 23-30 s. The
    largest batch and the least peaks either side of it, and the message naming what a batch needs."""
    config = resolve_config("qwen2.5-14b")
    hw = Hardware.preset("h800")
    assert api.max_batch_size(config, hw, 1024) == 476

    def least(batch):
        m = max(api.micro_batch_candidates(batch))
        costs = analytic_costs(config, batch_size=batch, seq_len=1024, device_flops=hw.device_flops,
                               num_micro_batches=m, efficiency_half_tokens=hw.efficiency_half_tokens)
        return least_peak.least_peak_plan(costs, hw)
    assert least(476).fits()
    assert not least(477).fits() and not least(480).fits()
    with pytest.raises(api.NoPlanFits, match=r"needs at least 80\.1\d GB .*the largest batch that fits is 476"):
        api.plan(config, hw, batch_size=480, seq_len=1024, time_limit_s=5)
