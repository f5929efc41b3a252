"""The union LP's rounding (``search.round_relaxation``, ``milp._rounding``, ``milp._Solve.round_union``):
a plan from the LP's fractional decisions, fitted and improved by the search's local search; checked
against the plans it rounds, the LP bound and the exact optimum, and its place in the solve."""

import math
import types

import pytest

from lazytrain_jax.schedule import memory, milp, search, steps

from tests.schedule.test_highs_mip import _random_instance

S, K = 8, 8


def _shares_of(plan, union):
    """``plan``'s decisions as 0/1 shares over the union model's decisions (``round_relaxation``'s
    arguments)."""
    chosen = set(memory.segments(plan.boundary_tiers))
    off = memory.offloaded_residuals(plan)
    return dict(edges={edge: float(edge in chosen) for edge in union.x},
                host={i: float(plan.boundary_tiers[i] == "host") for i in union.host},
                nvme={i: float(plan.boundary_tiers[i] == "nvme") for i in union.nv},
                keep={l: float(plan.keep_residuals[l]) for l in union.res},
                offload={l: float(off[l]) for l in union.off},
                tail={l: float(l >= plan.costs.num_layers - plan.resident_tail) for l in union.r})


def _fits_in_the_space(plan, costs, hw):
    fm = search.FastModel(costs, hw, max_segment_length=S, max_resident_tail=K,
                          weight_prefetch_depth=plan.weight_prefetch_depth, act_prefetch_depth=plan.act_prefetch_depth)
    sol = search._solution(plan)
    return plan.fits() and fm.allowed(*sol) and fm.fits(*sol)


@pytest.mark.parametrize("seed,depths,room", [
    (3, (1, 1), 1.5), (5, (2, 1), 1.5), (8, (1, 2), 1.5), (11, (2, 2), 1.5),   # host and NVMe tiers, residuals kept
    (1, (1, 1), 2.5),   # a dropped boundary, a residual on the host, a resident tail of 7
])
def test_a_plans_own_decisions_round_to_that_plan(seed, depths, room):
    """Integral shares (a plan's own decisions) round to that plan, decision for decision, when the
    local search is given nothing to spend: the most likely path is the plan's, each boundary's tier
    and residual decision is the one its share says, and a plan that fits needs no freeing."""
    costs, hw = _random_instance(12, seed)
    hw = hw.replace(device_memory=room * hw.device_memory)   # (1.5: room for the deeper prefetch buffers)
    plan = search.heuristic_plan(costs, hw, weight_prefetch_depth=depths[0], act_prefetch_depth=depths[1])
    assert plan is not None
    if room == 2.5:
        assert "drop" in plan.boundary_tiers and any(memory.offloaded_residuals(plan)) and plan.resident_tail == 7
    union = milp.build(costs, hw, union=True)
    q = search.round_relaxation(costs, hw, **_shares_of(plan, union), weight_prefetch_depth=depths[0],
                                act_prefetch_depth=depths[1], max_evaluations=0)
    assert q is not None and q.name == "rounding"
    assert q.boundary_tiers == plan.boundary_tiers and q.keep_residuals == plan.keep_residuals
    assert memory.offloaded_residuals(q) == memory.offloaded_residuals(plan)
    assert q.resident_tail == plan.resident_tail
    assert q.predicted_step_time_s == pytest.approx(plan.predicted_step_time_s, rel=1e-12)


@pytest.mark.parametrize("seed", [2, 4, 7, 9])
def test_the_union_lps_rounding_fits_and_is_never_below_the_lp_nor_the_optimum(monkeypatch, seed):
    """The union LP's solution rounded at each depth pair: a plan inside the MILP's space that fits
    every budget, timed by the step model (``steps.step_time``), and no faster than the union LP
    (a relaxation of every pair) nor than the exact optimum at its pair (CBC, rel_gap 0)."""
    costs, hw = _random_instance(10, seed)
    hw = hw.replace(device_memory=1.3 * hw.device_memory)   # a plan fits at every depth pair
    union = milp.build(costs, hw, union=True)
    arrays = milp._highs_arrays(union.model)
    point = []
    lp = milp._highs_solve(arrays, point)
    assert lp is not None and point
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    for depths in milp.MILP_DEPTHS:
        q = milp._rounding(union, point[0], depths, costs, hw, S, K, True, search.DEFAULT_EVALUATIONS)
        assert q is not None, depths
        assert (q.weight_prefetch_depth, q.act_prefetch_depth) == depths
        assert _fits_in_the_space(q, costs, hw)
        assert q.predicted_step_time_s == pytest.approx(steps.step_time(costs, hw, q), rel=1e-12)
        assert q.predicted_step_time_s >= lp * (1 - 1e-9)
        optimum = milp.solve(costs, hw, rel_gap=0.0, depths=[depths])
        assert q.predicted_step_time_s >= optimum.predicted_step_time_s * (1 - 1e-9)


@pytest.mark.parametrize("host_gb,nvme_gb", [(0.0, 0.0), (0.6, 0.0), (0.6, 1.0), (3.0, 2.0)])
def test_shares_past_the_budgets_are_cut_back_to_a_plan_that_fits(host_gb, nvme_gb):
    """Shares that keep every boundary on the host, on NVMe and on the device at once, every residual
    on the host and the whole tail resident: the rounding takes the off-device tiers and host residuals
    only while the host and NVMe hold them, frees the device by the construction's moves, and
    returns a plan that fits."""
    costs, hw = _random_instance(12, 6)
    hw = hw.replace(device_memory=1.3 * hw.device_memory, host_memory=host_gb * 1e9, nvme_memory=nvme_gb * 1e9)
    L = costs.num_layers
    union = milp.build(costs, hw, union=True)
    shares = dict(edges={(s, e): 1.0 if e == s + 1 else 0.0 for s, e in union.x},
                  host={i: 0.6 for i in union.host}, nvme={i: 0.7 for i in union.nv},
                  keep={l: 1.0 for l in union.res}, offload={l: 1.0 for l in union.off},
                  tail={l: 1.0 for l in union.r})
    q = search.round_relaxation(costs, hw, **shares, weight_prefetch_depth=1, act_prefetch_depth=1)
    assert search.heuristic_plan(costs, hw) is not None   # a plan fits
    assert q is not None and _fits_in_the_space(q, costs, hw)
    assert memory.host_peak_bytes(costs, q) <= hw.host_memory
    assert memory.nvme_peak_bytes(costs, q) <= hw.nvme_memory
    assert len(q.boundary_tiers) == L + 1


@pytest.mark.parametrize("rounded,early,expected_union,incumbent", [
    (10.05, None, 10.0, 10.05),    # the union LP proves the rounding: the splits neither started nor waited for
    (10.2, 10.1, 10.1, 10.2),      # the split's first bounds prove it: the union LP raised to them
    (10.2, 10.02, 10.0, 10.2),     # they do not: left for the neighbourhood (the split not joined)
    (10.25, 10.2, 10.0, 10.25),    # more than ROUNDING_WAIT_GAPS rel_gaps above the union LP: not waited for
    (10.6, None, 10.0, 10.5),      # slower than the incumbent: the incumbent stays
    (None, None, 10.0, 10.5),      # nothing fits
])
def test_round_union_takes_a_faster_plan_and_prove_early_waits_only_for_the_splits_first_bounds(
        monkeypatch, rounded, early, expected_union, incumbent):
    """``_Solve.round_union``: the rounding at the pair the union LP leans to replaces a slower
    incumbent (once per solve); then ``prove_early``: where the union LP does not prove it, only the
    depth split's first bounds are waited for (``depth_split_proves_early``), not the split's end."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff = 1e-2, 10.0, math.inf, None
    run.direct, run.union_point, run.union_built, run.depths = True, ["point"], None, milp.MILP_DEPTHS
    run.rounded, run.search_evaluations, run.S, run.K, run.residual_offload = False, 100, S, K, True
    run.costs = run.hardware = None
    run.depth_bounds, run.weights = {}, [1, 2]
    run.stats = {"search_s": 0.0}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.5)
    calls = []
    monkeypatch.setattr(milp, "_leaning", lambda point, built, depths, tie=None: [(2, 1), (1, 1)])
    monkeypatch.setattr(run, "tie", lambda: None, raising=False)
    monkeypatch.setattr(milp, "_rounding", lambda built, point, d, *a: calls.append(("round", d)) or (
        None if rounded is None else types.SimpleNamespace(predicted_step_time_s=rounded)))
    monkeypatch.setattr(run, "polish", lambda q, quick=False: calls.append(("polish", q.predicted_step_time_s)) or q,
                        raising=False)
    for name in ("start_offload_split", "start_depth_split"):
        monkeypatch.setattr(run, name, lambda name=name: calls.append(name), raising=False)
    split_end = types.SimpleNamespace(result=lambda: calls.append("split end") or (({1: 10.3, 2: 10.3}, {}), 0.0))
    run.depth_split = split_end
    run.depth_early = {dw: milp.concurrent.futures.Future() for dw in (1, 2)}
    for future in run.depth_early.values():
        future.set_result(lambda cutoff: early if early is not None else -math.inf)
    run.round_union()
    run.round_union()   # once
    run.prove_early()
    # the rest of the local search's budget (polish) where the quick rounding beats the incumbent
    # or lies within ROUNDING_WAIT_GAPS rel_gaps of the union LP; there the splits started first,
    # to run beside the polish, unless the union LP proves the rounding already
    near = rounded is not None and rounded - 10.0 <= milp.ROUNDING_WAIT_GAPS * 1e-2 * rounded
    proved = rounded is not None and rounded - 10.0 <= 1e-2 * rounded
    assert calls == [("round", (2, 1))] + (["start_offload_split", "start_depth_split"] if near and not proved
                                           else []) + \
        ([("polish", rounded)] if rounded is not None and rounded < 10.5 else [])
    assert run.incumbent.predicted_step_time_s == incumbent
    assert run.union == expected_union and run.rounded
