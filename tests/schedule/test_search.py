"""The search heuristic's incremental models equal timing.step_time / memory's peaks exactly."""

import random
import types

import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import memory, milp, search, timing
from lazytrain_jax.schedule.costs import analytic_costs
from lazytrain_jax.schedule.hardware import Hardware


def _probe(tiers, keep, k):
    return types.SimpleNamespace(boundary_tiers=tiers, keep_residuals=keep, resident_tail=k, weight_prefetch_depth=1,
                                 act_prefetch_depth=1, optimizer_mode="pipelined")


@pytest.mark.parametrize("num_layers", [4, 9, 24])
def test_incremental_models_equal_timing_and_memory(num_layers):
    hw = Hardware.preset("h800", device_memory=70e9)
    costs = analytic_costs(get_preset("dense-27b", num_layers=num_layers), batch_size=8, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=2)
    fm = search.FastModel(costs, hw, max_segment_length=num_layers, max_resident_tail=num_layers)
    rng = random.Random(num_layers)
    L = num_layers
    for _ in range(60):
        tiers = ["device"] + [rng.choice(["device", "host", "drop"] + (["nvme"] if i <= L - 3 else []))
                              for i in range(1, L)] + ["device"]
        keep = [rng.random() < 0.3 for _ in range(L)]
        k = rng.randint(0, L)
        st = fm.state(tiers, keep, k)
        assert st["total"] == pytest.approx(timing.step_time(costs, hw, _probe(tiers, keep, k)), rel=1e-12)
        assert fm.peak_of(st) == pytest.approx(memory.device_peak_bytes(costs, hw, _probe(tiers, keep, k)), rel=1e-12)
        i = rng.randint(1, L - 1)
        t = rng.choice(["device", "host", "drop"] + (["nvme"] if i <= L - 3 else []))
        moved = tiers[:i] + [t] + tiers[i + 1:]
        total, peak = fm.try_tier(st, i, t)
        assert total == pytest.approx(timing.step_time(costs, hw, _probe(moved, keep, k)), rel=1e-12)
        assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, _probe(moved, keep, k)), rel=1e-12)
        l = rng.randrange(L)
        toggled = keep[:l] + [not keep[l]] + keep[l + 1:]
        total, peak = fm.try_res(st, l)
        assert total == pytest.approx(timing.step_time(costs, hw, _probe(tiers, toggled, k)), rel=1e-12)
        assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, _probe(tiers, toggled, k)), rel=1e-12)


def test_search_plan_is_in_the_milp_space_and_near_optimal():
    hw = Hardware.preset("h800", device_memory=70e9, host_memory=15e9, nvme_memory=32e9)
    costs = analytic_costs(get_preset("dense-27b", num_layers=28), batch_size=72, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=8)
    found = search.heuristic_plan(costs, hw, max_evaluations=20000)
    assert found is not None and found.fits()
    fm = search.FastModel(costs, hw, max_segment_length=8, max_resident_tail=8)
    assert fm.allowed(list(found.boundary_tiers), list(found.keep_residuals), found.resident_tail)
    assert (found.weight_prefetch_depth, found.act_prefetch_depth) == (1, 1)
    exact = milp.solve(costs, hw, rel_gap=0.0, search_evaluations=-1, depths=[(1, 1)])
    assert exact.predicted_step_time_s <= found.predicted_step_time_s + 1e-9
    assert found.predicted_step_time_s <= exact.predicted_step_time_s * 1.01
    # the default solve (heuristic start, root-LP stop) is within its reported gap of the optimum
    quick = milp.solve(costs, hw, rel_gap=1e-2, depths=[(1, 1)])
    assert quick.predicted_step_time_s <= exact.predicted_step_time_s * (1 + quick.gap) + 1e-9


def test_same_plan_whatever_the_clock(monkeypatch):
    """The search budget is a count of evaluations: a clock running 1000x faster (a loaded machine)
    changes nothing but the reported solve time."""
    import itertools
    import time as time_module

    hw = Hardware.preset("h800", device_memory=40e9, host_memory=15e9, nvme_memory=32e9)
    costs = analytic_costs(get_preset("dense-27b", num_layers=24), batch_size=72, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=8)
    calm = milp.solve(costs, hw, rel_gap=1e-2, depths=[(1, 1)])
    ticks = itertools.count()
    monkeypatch.setattr(time_module, "perf_counter", lambda: 1000.0 * next(ticks))
    loaded = milp.solve(costs, hw, rel_gap=1e-2, depths=[(1, 1)])
    assert loaded.solve_time_s > calm.solve_time_s
    assert loaded.replace(solve_time_s=0.0) == calm.replace(solve_time_s=0.0)
