"""HiGHS' branch and cut (``milp.MIP_SOLVER``, scipy's ``milp``) as the planner's branch and bound:
the same optimum as the enumeration and as CBC, its cutoff's meaning, and the large-model path
(``direct``: the depth pairs' LPs, then HiGHS on each pair they leave open) proving its plan
within ``rel_gap`` of the exact optimum."""

import math
import pathlib
import random
import sys
import threading

import mip
import pytest

from lazytrain_jax.schedule import milp
from lazytrain_jax.schedule.hardware import Hardware

from tests.schedule.test_milp_exhaustive import CASES, enumerate_best, hardware_for, instance
from tests.schedule.test_search import _benchmark_module, _heterogeneous_costs, _room_for


def _decisions(plan):
    return (plan.boundary_tiers, plan.keep_residuals, plan.offload_residuals, plan.resident_tail,
            plan.weight_prefetch_depth, plan.act_prefetch_depth)


@pytest.mark.parametrize("num_layers,seed,dev,host,nvme,bw", CASES[:4] + [
    pytest.param(5, 9, 9, 20, 0, 60, marks=pytest.mark.slow)])   # the host residual tier wins (enumeration: 12 s)
def test_highs_matches_enumeration(monkeypatch, num_layers, seed, dev, host, nvme, bw):
    monkeypatch.setattr(milp, "MIP_SOLVER", "highs")
    costs = instance(num_layers, seed)
    hw = hardware_for(costs, dev, host, nvme, bw)
    expected = enumerate_best(costs, hw, max_segment_length=4, max_resident_tail=num_layers)
    stats = {}
    solved = milp.solve(costs, hw, max_segment_length=4, max_resident_tail=num_layers, rel_gap=0.0, stats=stats)
    assert stats["bb_runs"] >= 1 and stats["proof"] == "highs"
    assert abs(solved.predicted_step_time_s - expected) <= 1e-6
    assert solved.fits() and solved.gap <= 1e-9


def _random_instance(num_layers, seed):
    costs = _heterogeneous_costs(random.Random(seed), num_layers)
    hw = Hardware(device_memory=_room_for(costs, 0.3), host_memory=2e9, nvme_memory=5e9, h2d_bw=12e9, d2h_bw=12e9,
                  device_flops=1e14, host_opt_rate=3e9)
    return costs, hw


# HiGHS' root LP method through scipy's HiGHS object (its dual simplex, its interior point), and
# scipy's public milp where that object is missing (``_highs_scipy``, without presolve)
ROOT_LPS = pytest.mark.parametrize("root_lp", ["choose", "ipm", "scipy"])


def _direct_path_taken(monkeypatch, root_lp):
    """Counts the runs that drive scipy's HiGHS object directly (``_highs_direct``); the list. For
    "scipy", that object is hidden (``_highs_scipy`` runs instead) and the root LP is "choose"."""
    runs = []
    if root_lp == "scipy":
        monkeypatch.setattr(milp, "_highs_object", lambda: None)
    else:
        assert milp._highs_object() is not None, "scipy's bundled HiGHS no longer offers mip_lp_solver"
    direct = milp._highs_direct
    monkeypatch.setattr(milp, "_highs_direct", lambda *a: runs.append(a[-1]) or direct(*a))
    return runs


def _root_lp(root_lp):
    return "choose" if root_lp == "scipy" else root_lp


@ROOT_LPS
def test_highs_mip_finds_cbcs_optimum_and_decodes_to_the_step_model(monkeypatch, root_lp):
    runs = _direct_path_taken(monkeypatch, root_lp)
    costs, hw = _random_instance(8, 4)
    built = milp.build(costs, hw)
    exact = milp._highs_mip(built.model, 0.0, 60.0, 10_000, root_lp=_root_lp(root_lp))
    assert exact.status == mip.OptimizationStatus.OPTIMAL
    assert exact.objective_bound == pytest.approx(exact.objective_value, rel=1e-9)
    cbc = milp._cbc_here(built.model, 60.0, 10_000)
    assert cbc.objective_value == pytest.approx(exact.objective_value, rel=1e-7)
    built.solved = exact
    plan = milp.decode(built, costs, hw, status="optimal", bound=None, solve_time_s=0.0)
    assert plan.predicted_step_time_s == pytest.approx(exact.objective_value, rel=1e-7)   # the MILP is the step model
    # a gap: HiGHS stops within it of its incumbent, and its bound stays below the optimum
    loose = milp._highs_mip(built.model, 0.05, 60.0, 10_000, root_lp=_root_lp(root_lp))
    assert loose.objective_bound <= exact.objective_value * (1 + 1e-9)
    assert loose.objective_value - loose.objective_bound <= 0.05 * loose.objective_value * (1 + 1e-9)
    # no plan at all: INFEASIBLE
    tiny = milp.build(costs, hw.replace(device_memory=hw.device_memory * 0.2))
    assert milp._highs_mip(tiny.model, 0.0, 60.0, 10_000, root_lp=_root_lp(root_lp)).status == mip.OptimizationStatus.INFEASIBLE
    assert runs == ([] if root_lp == "scipy" else [root_lp] * 3)


@ROOT_LPS
def test_highs_mip_cutoff_keeps_only_plans_at_or_below_it(monkeypatch, root_lp):
    """``_highs_mip``'s cutoff (a row on the objective): INFEASIBLE just below the optimum, the
    optimum itself when the cutoff lies above it, and a plan at or below the cutoff within
    ``rel_gap`` of a bound that stays below the optimum; with either root LP method."""
    runs = _direct_path_taken(monkeypatch, root_lp)
    costs, hw = _random_instance(8, 4)
    built = milp.build(costs, hw)
    optimum = milp._highs_mip(built.model, 0.0, 60.0, 10_000).objective_value
    below = milp._highs_mip(built.model, 0.0, 60.0, 10_000, cutoff=optimum * (1 - 1e-4), root_lp=_root_lp(root_lp))
    assert below.status == mip.OptimizationStatus.INFEASIBLE and below.values is None
    above = milp._highs_mip(built.model, 0.0, 60.0, 10_000, cutoff=optimum * 1.02, root_lp=_root_lp(root_lp))
    assert above.objective_value == pytest.approx(optimum, rel=1e-7)
    loose = milp._highs_mip(built.model, 0.05, 60.0, 10_000, cutoff=optimum * 1.001, root_lp=_root_lp(root_lp))
    assert loose.objective_value <= optimum * 1.001 * (1 + 1e-9)
    assert loose.objective_bound <= optimum * (1 + 1e-9)
    # through _optimize, as solve's branch and bound calls it
    assert milp._optimize(built, 0.0, 60.0, optimum * (1 - 1e-4), 10_000, solver="highs", root_lp=_root_lp(root_lp)) is None
    assert built.solved.status == mip.OptimizationStatus.INFEASIBLE
    assert runs == ([] if root_lp == "scipy" else ["choose"] + [root_lp] * 4)


@pytest.mark.parametrize("num_layers,seed", [pytest.param(12, 7, marks=pytest.mark.slow), (16, 7)])
@pytest.mark.parametrize("union_search_gaps", [0.0, pytest.param(1e9, marks=pytest.mark.slow)])
def test_large_model_path_proves_within_rel_gap(monkeypatch, num_layers, seed, union_search_gaps):
    """The large-model path (forced here on small instances): its plan is within rel_gap of the
    exact optimum (CBC, rel_gap 0), its reported bound below that optimum, and the same plan twice;
    both where the union phase searches the other depth pairs and where HiGHS starts at the pair
    the union LP leans to (``UNION_SEARCH_GAPS`` 0: every start counts as far)."""
    monkeypatch.setattr(milp, "UNION_SEARCH_GAPS", union_search_gaps)
    costs, hw = _random_instance(num_layers, seed)
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    exact = milp.solve(costs, hw, rel_gap=0.0)
    assert exact.solver_status == "optimal"
    optimum = exact.predicted_step_time_s
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    plans = []
    for _ in range(2):
        stats = {}
        plans.append(milp.solve(costs, hw, rel_gap=1e-2, stats=stats))
        assert stats["proof"] in ("union_lp", "depth_lps", "highs") and stats["neighbourhood_s"] == 0.0
    p = plans[0]
    assert _decisions(p) == _decisions(plans[1])
    assert p.fits() and p.solver_status == "optimal" and p.gap <= 1e-2 * (1 + 1e-9)
    assert p.predicted_step_time_s >= optimum - 1e-9
    assert p.predicted_step_time_s - optimum <= 1e-2 * p.predicted_step_time_s
    assert p.predicted_step_time_s * (1 - p.gap) <= optimum * (1 + 1e-9)   # a valid bound
    assert math.isfinite(p.gap)


@pytest.mark.parametrize("settles", [pytest.param("halves", marks=pytest.mark.slow), "pair",
                                     pytest.param("neither", marks=pytest.mark.slow)])
def test_large_model_path_asks_highs_root_for_a_plan_rel_gap_faster(monkeypatch, settles):
    """With the LP neighbourhoods' plan in hand and the union model split on the weight prefetch
    depth, HiGHS' root runs alone (``HIGHS_CUTOFF_NODES``) on each half of the union model the
    split left open (``_half_roots``; where one half is open, on that half's depth pairs' own
    models, ``_pair_roots``), asked only for a plan ``rel_gap`` faster. Where none exists
    on every half that proves the plan in hand (the bound reported is the cutoff) and no depth
    pair's own model is branched on. Where the halves settle nothing (forced here), the depth
    pairs follow: HiGHS' root on a pair's own model with the same cutoff, and where that settles
    nothing either (forced), HiGHS' plain run. Each way the plan is within ``rel_gap`` of the
    exact optimum (CBC, rel_gap 0) and its bound below that optimum. Seed 3's halves settle it (seed
    1's did until the union LP carried every depth pair's case cuts: that LP proves it now); the
    forced cases take seed 13, where a depth pair still needs branching (seeds 3 and 15 too, slower)."""
    costs, hw = _random_instance(16, 3 if settles == "halves" else 13)
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    optimum = milp.solve(costs, hw, rel_gap=0.0).predicted_step_time_s
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "HIGHS_MIN_NONZEROS", 0)   # the union LP's solution, so its neighbourhoods
    halves, half_roots, pair_roots = [], milp._half_roots, milp._pair_roots

    def recorded_halves(union_built, arrays, bar, depths, *args):
        found = half_roots(union_built, arrays, bar, depths, *args)
        halves.append((bar, dict(found)))
        return found if settles == "halves" else dict.fromkeys(found, False)

    def recorded_pairs(builts, bar, *args):   # one half open: the roots on its depth pairs' models
        found = pair_roots(builts, bar, *args)
        assert len({b.weight_prefetch_depth for b in builts}) == 1 and len(builts) == 2
        none_below = all(s.status == mip.OptimizationStatus.INFEASIBLE for s in found)
        halves.append((bar, {builts[0].weight_prefetch_depth: none_below}))
        unsettled = milp.Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                                objective_bound=-math.inf, values=None)
        return found if settles == "halves" else [unsettled] * len(found)

    calls, root_lps, highs_mip = [], [], milp._highs_mip

    def recorded(m, rel_gap, time_limit_s, max_nodes, cutoff=None, **kw):
        if cutoff is not None and settles == "neither":
            solved = milp.Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                                 objective_bound=-math.inf, values=None)
        else:
            solved = highs_mip(m, rel_gap, time_limit_s, max_nodes, cutoff, **kw)
        calls.append((cutoff, max_nodes, solved))
        root_lps.append((cutoff, kw.get("root_lp", "choose")))
        return solved

    runs, optimize = [], milp._optimize

    def counted(built, rel_gap, time_limit_s, cutoff, max_nodes=milp.DEFAULT_MAX_NODES, *args, **kw):
        runs.append((cutoff, max_nodes))
        return optimize(built, rel_gap, time_limit_s, cutoff, max_nodes, *args, **kw)

    monkeypatch.setattr(milp, "_half_roots", recorded_halves)
    monkeypatch.setattr(milp, "_pair_roots", recorded_pairs)
    monkeypatch.setattr(milp, "_highs_mip", recorded)
    monkeypatch.setattr(milp, "_optimize", counted)
    stats = {}
    p = milp.solve(costs, hw, rel_gap=1e-2, stats=stats)
    assert stats["proof"] == "highs" and stats["rens_runs"] >= 1
    assert len(halves) == 1
    bar, found = halves[0]
    assert found and all(found.values())   # on this instance every open half has nothing below the bar
    assert bar <= optimum * (1 + 1e-9)      # so nothing rel_gap faster than the plan in hand exists
    plain = [c for c, n in runs if n == milp.DEFAULT_MAX_NODES]   # branch and bound's own runs (no cutoff)
    assert all(c is None for c in plain)
    probes = [(c, n, s) for c, n, s in calls if c is not None]
    assert all(n == milp.HIGHS_CUTOFF_NODES for _, n, _ in probes)
    # the roots with a cutoff solve their first LP by the interior point method, the other runs as HiGHS chooses
    assert all(lp == (milp.CUTOFF_ROOT_LP if c is not None else "choose") for c, lp in root_lps)
    if settles == "halves":
        assert not probes and not plain   # no depth pair's own model branched on (neighbourhoods only)
        assert p.gap == pytest.approx(1e-2) and p.predicted_step_time_s * (1 - p.gap) == pytest.approx(bar)
    elif settles == "pair":
        cutoff, _, solved = probes[-1]
        assert solved.status == mip.OptimizationStatus.INFEASIBLE and cutoff <= optimum * (1 + 1e-9)
        assert p.gap == pytest.approx(1e-2) and p.predicted_step_time_s * (1 - p.gap) == pytest.approx(cutoff)
        assert not plain   # the root's proof spared HiGHS' plain run
    else:
        assert probes and plain    # the pair's root settled nothing: the plain run followed
    assert p.fits() and p.solver_status == "optimal" and p.gap <= 1e-2
    assert optimum - 1e-9 <= p.predicted_step_time_s <= optimum * (1 + 1e-2 * (1 + 1e-9))
    assert p.predicted_step_time_s * (1 - p.gap) <= optimum * (1 + 1e-9)   # a valid bound


@pytest.mark.parametrize("num_layers,seed", [(8, 4), (12, 7)])
def test_half_roots_never_rule_out_a_half_that_holds_a_plan_below_the_bar(num_layers, seed):
    """``_half_roots`` (and ``_pair_roots`` on the half's depth pairs) rules out a weight prefetch depth only where no depth pair with it has a plan
    at or below the bar: with the bar just above the exact optimum of the half (CBC, rel_gap 0, on
    each of its pairs) the half stays open; with the bar below the half's LP bound it is ruled out."""
    costs, hw = _random_instance(num_layers, seed)
    union = milp.build(costs, hw, union=True)
    arrays = milp._highs_arrays(union.model)
    bounds, _ = milp._depth_split(union, arrays)
    checked = 0
    for dw in (1, 2):
        best = [milp.solve(costs, hw, depths=((dw, da),), rel_gap=0.0)
                for da in (1, 2)]
        values = [q.predicted_step_time_s for q in best if q is not None]
        checked += bool(values)
        if values:   # (no plan fits at this weight prefetch depth: nothing to keep open)
            assert bounds[dw] <= min(values) * (1 + 1e-9)
            assert milp._half_roots(union, arrays, min(values) * (1 + 1e-6), [dw], 0.0, 60.0) == {dw: False}
        if math.isfinite(bounds[dw]):
            assert milp._half_roots(union, arrays, bounds[dw] * (1 - 1e-3), [dw], 0.0, 60.0) == {dw: True}
        # the same on the half's depth pairs' own models (``_pair_roots``, where one half is open)
        pairs = [milp.build(costs, hw, weight_prefetch_depth=dw, act_prefetch_depth=da) for da in (1, 2)]
        infeasible = mip.OptimizationStatus.INFEASIBLE
        if values:
            found = milp._pair_roots(pairs, min(values) * (1 + 1e-6), 0.0, 60.0)
            assert not all(s.status == infeasible for s in found)
            for built, s in zip(pairs, found):   # a plan a root finds is one of its pair, at or below the bar
                if s.values is not None:
                    built.solved = s
                    q = milp.decode(built, costs, hw, status="feasible", bound=None, solve_time_s=0.0)
                    assert q.fits() and q.predicted_step_time_s == pytest.approx(s.objective_value, rel=1e-6)
                    assert q.predicted_step_time_s <= min(values) * (1 + 1e-5)
        if math.isfinite(bounds[dw]):
            found = milp._pair_roots(pairs, bounds[dw] * (1 - 1e-3), 0.0, 60.0)
            assert all(s.status == infeasible for s in found)
    assert checked


def test_highs_stopped_by_its_time_limit_still_returns_a_plan(monkeypatch):
    """HiGHS ended by its time limit before any solution: the union phase's plan comes back,
    unproved (``feasible``, a gap above rel_gap), never None. Each branch-and-bound run returns what
    HiGHS returns when its limit passes first (no solution), whatever the machine's
    speed: a real 1 ms limit is raised to ``MIN_RUN_S``, in which a fast machine proves this instance."""
    costs, hw = _random_instance(16, 7)
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp._Solve, "expired", lambda self: False)
    stopped = []

    def out_of_time(m, rel_gap, time_limit_s, max_nodes, cutoff=None, **kw):
        stopped.append(time_limit_s)
        return milp.Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                           objective_bound=-math.inf, values=None)

    monkeypatch.setattr(milp, "_highs_mip", out_of_time)
    stats = {}
    p = milp.solve(costs, hw, rel_gap=1e-3, time_limit_s=1e-3, stats=stats)
    assert stats["proof"] == "highs" and stats["bb_runs"] >= 1 and stopped
    assert p is not None and p.fits() and p.solver_status == "feasible" and p.gap > 1e-3


@pytest.mark.parametrize("rel_gap", [0.0, 1e-3])
def test_time_limit_bounds_the_whole_solve(monkeypatch, rel_gap):
    """Once the solve's time limit has passed no depth pair is branched on: the best plan of the
    search comes back, ``feasible``, with a gap against every pair's LP bound (rel_gap 0: each
    pair's own LP; otherwise the union LP, which relaxes them all, and no pair's model is built),
    which stays valid (the bound is at most the exact optimum)."""
    costs, hw = _random_instance(16, 7)
    exact = milp.solve(costs, hw, rel_gap=0.0)
    assert exact.solver_status == "optimal"
    monkeypatch.setattr(milp._Solve, "expired", lambda self: True)
    stats = {}
    p = milp.solve(costs, hw, rel_gap=rel_gap, stats=stats)
    assert stats["bb_runs"] == 0 and stats["rens_runs"] == 0 and stats["lp_solves"] >= 1
    if rel_gap > 0:
        assert stats["lp_solves"] == 1  # the union LP alone
    assert p is not None and p.fits() and p.solver_status == "feasible" and p.gap > 0
    assert p.predicted_step_time_s >= exact.predicted_step_time_s * (1 - 1e-9)
    assert p.predicted_step_time_s * (1 - p.gap) <= exact.predicted_step_time_s * (1 + 1e-9)


def test_solver_runs_get_what_is_left_of_the_time_limit(monkeypatch):
    """Every branch-and-bound run is given at most what is left of the solve's time limit (not
    the whole limit again), and at least ``MIN_RUN_S``."""
    costs, hw = _random_instance(16, 7)
    limits = []
    optimize = milp._optimize

    def recorded(built, rel_gap, time_limit_s, *args, **kw):
        limits.append(time_limit_s)
        return optimize(built, rel_gap, time_limit_s, *args, **kw)
    monkeypatch.setattr(milp, "_optimize", recorded)
    milp.solve(costs, hw, rel_gap=0.0, time_limit_s=1000.0)
    assert limits and all(milp.MIN_RUN_S <= t < 1000.0 for t in limits)
    assert limits == sorted(limits, reverse=True)  # what is left only shrinks


def test_solve_shortens_the_thread_switch_interval_and_restores_it(monkeypatch):
    """While solves run (several at once too) the interpreter switches threads at most every
    ``SWITCH_INTERVAL_S``; the caller's interval comes back when the last one ends, also after an
    error."""
    import sys
    import threading

    seen, before = [], sys.getswitchinterval()
    inner = milp._solve

    def spy(*args, **kwargs):
        seen.append(sys.getswitchinterval())
        return inner(*args, **kwargs)

    monkeypatch.setattr(milp, "_solve", spy)
    costs = instance(4, 0)
    hw = hardware_for(costs, *CASES[0][2:])
    threads = [threading.Thread(target=milp.solve, args=(costs, hw)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 3 and all(s == pytest.approx(min(before, milp.SWITCH_INTERVAL_S)) for s in seen)
    assert sys.getswitchinterval() == pytest.approx(before)

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(milp, "_solve", broken)
    with pytest.raises(RuntimeError, match="boom"):
        milp.solve(costs, hw)
    assert sys.getswitchinterval() == pytest.approx(before)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_worker_threads_a_solve_leaves_running_get_the_leftover_niceness():
    """A worker thread still running when its solve returns gets ``LEFTOVER_NICE`` (it then runs on
    idle cores only); one that ended inside the solve, the caller's thread, and threads a worker
    starts while it works for the solve (``_parallel_lps`` inside ``_depth_split``) are tracked as
    the solve's too."""
    import os
    import threading

    release, started, seen = threading.Event(), threading.Event(), {}

    def nested():
        seen.setdefault("inner", []).append(threading.get_native_id())
        release.wait(10)

    def slow():
        seen["outer"] = threading.get_native_id()
        with milp.concurrent.futures.ThreadPoolExecutor(1) as pool:
            inner = pool.submit(milp._owned(nested))
            started.set()
            inner.result()
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def quick():
        return threading.get_native_id()

    main_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    with milp._solve_threads():
        done = milp._timed(quick)
        done_tid, _ = done.result()
        left = milp._timed(slow)
        assert started.wait(10)
        assert len(milp._RUNNING) == 2
        workers = [t for t in threading.enumerate() if t.name == "lazytrain-lp"]
        assert workers and not any(t.daemon for t in workers)   # joined before the interpreter ends
    inner_nice = os.getpriority(os.PRIO_PROCESS, seen["inner"][0])
    release.set()
    outer_nice, _ = left.result()
    assert outer_nice == inner_nice == milp.LEFTOVER_NICE
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_nice
    assert not milp._RUNNING
    assert milp._owned(quick) is quick  # outside a solve nothing is tracked


@pytest.mark.parametrize("case", [(6, 0, 0), (24, 1, 2)])
def test_direct_lp_path_agrees_with_linprog(case):
    """``_highs_solve`` through scipy's bundled HiGHS object gives linprog's value and solution (the
    same interior point method and options), and says infeasible where linprog does."""
    import numpy as np

    if milp._highs_object() is None:
        pytest.skip("scipy's HiGHS object is not there")
    num_layers, seed, hardware_case = case
    costs = instance(num_layers, seed)
    built = milp.build(costs, hardware_for(costs, *CASES[hardware_case][2:]), union=True)
    arrays = milp._highs_arrays(built.model)
    direct, scipy_side = milp._highs_lp_direct(arrays), milp._highs_lp_scipy(arrays)
    assert direct[0] == scipy_side[0] == "interior"
    assert direct[1] == pytest.approx(scipy_side[1], rel=1e-9)
    np.testing.assert_allclose(direct[2], scipy_side[2], atol=1e-7)
    cost, args, const = arrays
    bounds = args["bounds"].copy()
    edges = [v.idx for v in built.x.values()]
    bounds[edges, 1] = 0.0  # no segment path: infeasible
    infeasible = (cost, {**args, "bounds": bounds}, const)
    assert milp._highs_lp_direct(infeasible)[0] == milp._highs_lp_scipy(infeasible)[0] == "infeasible"
    assert milp._highs_solve(infeasible) == math.inf


def test_a_part_of_a_solve_with_its_own_token_is_lowered_with_the_solve():
    """A worker thread registered for a token whose parent is the solve's (``_cutoff_roots``' roots,
    stopped on their own) and still running when the solve returns gets ``LEFTOVER_NICE`` as the
    solve's own threads do."""
    import os
    import threading

    release, started, seen = threading.Event(), threading.Event(), {}

    def slow():
        seen["tid"] = threading.get_native_id()
        started.set()
        release.wait(10)

    with milp._solve_threads():
        work = milp._owned(slow, milp._SolveToken(milp._OWNER.solve))
        thread = threading.Thread(target=work)
        thread.start()
        assert started.wait(10)
    nice = os.getpriority(os.PRIO_PROCESS, seen["tid"])
    release.set()
    thread.join(10)
    assert nice == milp.LEFTOVER_NICE
    assert not milp._RUNNING


def test_a_solves_leftover_lps_are_stopped_when_it_returns():
    """HiGHS runs a solve's threads still make when it returns are interrupted (``_stop``): they
    end without a value, and a run started for that solve afterwards does not start; outside a
    solve, the same LP runs to its optimum."""
    costs, hw = _random_instance(24, 7)
    union = milp.build(costs, hw, union=True)
    arrays = milp._highs_arrays(union.model)
    expected = milp._highs_solve(arrays)
    assert math.isfinite(expected)
    release = threading.Event()

    def after_release():
        release.wait(10)
        return milp._highs_solve(arrays)

    with milp._solve_threads():
        waiting = milp._timed(after_release)
        running = milp._timed(milp._highs_solve, arrays)
        token = milp._OWNER.solve
    release.set()
    assert token.stopped and not token.running
    assert waiting.result()[0] is None           # started after the solve returned: not run
    value, _ = running.result()
    assert value is None or value == expected    # stopped, or done before the stop
    assert milp._highs_solve(arrays) == expected


class _SlowHighs:
    """A stand-in for a HiGHS object (``_run``'s calls) whose run ends only when ``release`` is set
    (or after 10 s): HiGHS inside a cut separation that does not look at its time limit."""

    def __init__(self):
        self.release, self.ended, self.started = threading.Event(), threading.Event(), []

    def setCallback(self, callback, data):
        pass

    def startCallback(self, kind):
        self.started.append(kind)

    def run(self):
        self.release.wait(10)
        self.ended.set()


def test_a_highs_run_past_its_time_limit_is_not_waited_for(monkeypatch):
    """A branch and cut still running ``HIGHS_LATE_S`` past its time limit is left behind
    (``_run_by`` False; ``_highs_direct`` then "none", no solution, bound -inf) instead of holding
    the solve past its limit; a run that ends is read as before. In a solve, the run left behind
    is interrupted when the solve returns, the MIP's interrupt among the callbacks started."""
    monkeypatch.setattr(milp, "HIGHS_LATE_S", 0.01)
    slow = _SlowHighs()
    assert milp._run_by(slow, 0.01) is False and not slow.ended.is_set()
    slow.release.set()
    assert slow.ended.wait(10)
    done = _SlowHighs()
    done.release.set()
    assert milp._run_by(done, 5.0) is True and done.ended.is_set()

    slow = _SlowHighs()
    monkeypatch.setattr(milp, "_highs_model", lambda *args, **kw: slow)
    assert milp._highs_direct(None, [], None, None, None, 1e-2, 0.01, 1, "ipm") == ("none", None, None, -math.inf)
    with milp._solve_threads():
        left = _SlowHighs()
        assert milp._run_by(left, 0.01) is False
    hc = milp._highs_object()
    assert hc.cb.HighsCallbackType.kCallbackMipInterrupt in left.started
    for h in (slow, left):
        h.release.set()
        assert h.ended.wait(10)


def _held(fn, release, ended):
    """``fn`` run only once ``release`` is set (or after 60 s), ``ended`` set when it returns: an LP
    or split still running when its solve's time limit passes."""
    def held(*args, **kw):
        try:
            release.wait(60)
            return fn(*args, **kw)
        finally:
            ended.set()
    return held


@pytest.mark.parametrize("step", ["union LP", "depth split"])
def test_a_step_beside_the_solve_is_not_waited_for_past_its_time_limit(monkeypatch, step):
    """The union LP and the depth split run in threads beside the solve. One still running
    ``HIGHS_LATE_S`` past the solve's time limit is left behind, unread, and the solve returns
    its best plan without it. Without the union LP that plan is the best start, its gap taken
    against the bound on every plan (``bounds.lower_bound``). Before this, the solve waited for
    both: varied seed 10 at 128 layers, given 5 s, took 8.5 s, held by its depth split."""
    from lazytrain_jax.schedule.bounds import lower_bound

    monkeypatch.setattr(milp, "HIGHS_MIN_NONZEROS", 0)       # the HiGHS path on a small model
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "HIGHS_LATE_S", 0.05)
    release, ended, started = threading.Event(), threading.Event(), []
    if step == "union LP":
        solve_lp = milp._highs_solve

        def union_held(arrays, point=None, basis=None, **kw):
            if basis is not None and not started:  # the union LP: the one solved to a vertex first
                started.append(True)
                return _held(solve_lp, release, ended)(arrays, point, basis, **kw)
            return solve_lp(arrays, point, basis, **kw)
        monkeypatch.setattr(milp, "_highs_solve", union_held)
        time_limit = 0.5
    else:
        split = milp._depth_split
        monkeypatch.setattr(milp, "_depth_split", lambda *a, **kw: started.append(True) or
                            _held(split, release, ended)(*a, **kw))
        time_limit = 3.0
    costs, hw = _random_instance(16, 3)
    stats = {}
    try:
        plan = milp.solve(costs, hw, rel_gap=1e-2, time_limit_s=time_limit, stats=stats)
        returned_first = not ended.is_set()
    finally:
        release.set()
    assert started, f"the {step} was not started: nothing to test"
    assert returned_first, f"the solve waited for its {step}"
    assert ended.wait(60)
    assert plan is not None and plan.solver_status == "feasible"
    value = plan.predicted_step_time_s
    if step == "union LP":
        assert stats["lp_solves"] == 0
        assert plan.gap == pytest.approx((value - lower_bound(costs, hw)["total"]) / value)
    else:
        assert plan.gap > 1e-2   # not proved: the split that would have proved it was not read


@pytest.mark.parametrize("path", ["direct", "scipy"])
def test_an_lp_stopped_at_its_time_limit_says_nothing(monkeypatch, path):
    """``_highs_solve(..., time_limit_s)``: an LP HiGHS stops at its time limit is one it cannot say
    (None), not followed by a run at HiGHS' defaults without that limit (the LPs a solve runs in
    its own thread, ``union_interior_retry`` and ``half_point``, get what is left of its limit);
    without a limit, the LP's value as before. Through scipy's HiGHS object and its ``linprog``."""
    if path == "scipy":
        monkeypatch.setattr(milp, "_highs_object", lambda: None)
    costs, hw = _random_instance(48, 7)   # an LP of many interior point iterations (HiGHS looks at its
    arrays = milp._highs_arrays(milp.build(costs, hw, union=True).model)   # clock between them)
    value = milp._highs_solve(arrays, [])
    assert value is not None and math.isfinite(value)
    assert milp._highs_solve(arrays, [], time_limit_s=0.01) is None
    assert milp._highs_solve(arrays, [], time_limit_s=600.0) == pytest.approx(value)


def test_a_process_that_plans_and_ends_exits_cleanly():
    """A process whose solve leaves HiGHS runs going (the depth split's halves from the union
    basis, started and left) ends at once with status 0: those runs are stopped, and their threads
    are joined before the interpreter ends (a daemon thread returning from HiGHS into a
    finalising interpreter aborted the process: "terminate called without an active exception")."""
    import subprocess

    code = ("import sys, time\n"
            "sys.path.insert(0, %r)\n"
            "from tests.schedule.test_highs_mip import _random_instance\n"
            "from lazytrain_jax.schedule import milp\n"
            "costs, hw = _random_instance(24, 7)\n"
            "union = milp.build(costs, hw, union=True)\n"
            "arrays = milp._highs_arrays(union.model)\n"
            "basis = []\n"
            "milp._highs_solve(arrays, [], basis)\n"
            "with milp._solve_threads():\n"
            "    milp._timed(milp._depth_split, union, arrays, basis)\n"
            "    milp._timed(milp._depth_split, union, arrays)\n"
            "    time.sleep(float(sys.argv[1]))\n"
            "print('ended')\n") % str(pathlib.Path(__file__).resolve().parents[2])
    for delay in ("0", "0.01", "0.05"):
        out = subprocess.run([sys.executable, "-c", code, delay], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "ended" in out.stdout, (delay, out.returncode, out.stderr[-500:])


@pytest.mark.parametrize("first_to_end", [0, 1])
def test_cutoff_roots_take_their_results_in_order_whichever_ends_first(monkeypatch, first_to_end):
    """``_cutoff_roots`` hands ``enough`` each root's result in the order of its problems, not the
    order the roots end in, so what it accepts and returns is the same whichever root the machine
    lets end first: here both roots return a plan and ``enough`` accepts any; root 0's is taken,
    and root 1's (ended first or not) is reported as stopped. Taken as they ended, the result
    changed with the order (root 1's plan, root 0 stopped)."""
    import time as time_module

    plans = [milp.Solved(status=mip.OptimizationStatus.FEASIBLE, objective_value=10.0 + i, objective_bound=9.0,
                         values=[float(i)]) for i in range(2)]

    def fake_root(arrays, integrality, *args, **kwargs):
        i = arrays
        time_module.sleep(0.0 if i == first_to_end else 0.3)
        return plans[i]
    monkeypatch.setattr(milp, "_highs_mip_arrays", fake_root)
    calls = []

    def enough(i, found):
        calls.append((i, found.objective_value))
        return True
    found = milp._cutoff_roots([(0, None), (1, None)], 11.5, 0.01, 10.0, enough)
    assert calls == [(0, 10.0)]
    assert found[0] is plans[0]
    assert found[1].status == mip.OptimizationStatus.NO_SOLUTION_FOUND and found[1].values is None
    assert found[1].objective_bound == -math.inf
    # without enough every root's result comes back, in order
    calls.clear()
    assert milp._cutoff_roots([(0, None), (1, None)], 11.5, 0.01, 10.0) == plans
    assert calls == []


def _varied_instance(monkeypatch, seed, num_layers):
    """benchmarks/planner_probes.py's instance of varied magnitudes (``varied_instance``)."""
    return _benchmark_module(monkeypatch, "planner_probes").varied_instance(seed, num_layers)[:2]


@pytest.mark.parametrize("seed,depths", [(2, (2, 2)), (4, (2, 1)), (7, (1, 2))])
def test_highs_mip_agrees_with_cbc_where_its_full_presolve_did_not(monkeypatch, seed, depths):
    """HiGHS' doubleton-equation presolve rule is left out of every branch and cut
    (``HIGHS_MIP_OPTIONS``): on these 8-layer instances of varied magnitudes HiGHS with its whole
    presolve called seed 2 at depths (2, 2) infeasible (CBC finds a 0.5216 s plan) and ended
    "optimal" 2.6 % and 0.03 % above CBC's optimum on seeds 4 and 7. Without that rule it finds
    CBC's optimum on all three, through scipy's HiGHS object and, without presolve, through
    scipy's milp."""
    costs, hw = _varied_instance(monkeypatch, seed, 8)
    built = milp.build(costs, hw, weight_prefetch_depth=depths[0], act_prefetch_depth=depths[1])
    direct = milp._highs_mip(built.model, 0.0, 60.0, 10**6)
    monkeypatch.setattr(milp, "_highs_object", lambda: None)
    public = milp._highs_mip(built.model, 0.0, 60.0, 10**6)
    cbc = milp._cbc_here(built.model, 60.0, 10**6)
    assert cbc.status == mip.OptimizationStatus.OPTIMAL
    for highs in (direct, public):
        assert highs.status == mip.OptimizationStatus.OPTIMAL
        assert highs.objective_value == pytest.approx(cbc.objective_value, rel=1e-6)


def test_cutoff_roots_stop_the_others_once_one_is_enough(monkeypatch):
    """``_cutoff_roots``' ``enough``: called with each root's index and result in the roots' order,
    until it returns True; then the roots after it are interrupted and report no solution (bound
    -inf), where they would have run on to their own answer. Here a 32-layer root (varied seed 0,
    depths (2, 2), its bar 0.5 % above its LP: INFEASIBLE after a few seconds when left alone)
    after an 8-layer one (depths (1, 1)) that ends at once."""
    small, small_hw = _random_instance(8, 4)
    large, large_hw = _varied_instance(monkeypatch, 0, 32)
    problems, bars = [], []
    for costs, hw, depth in ((small, small_hw, 1), (large, large_hw, 2)):
        built = milp.build(costs, hw, weight_prefetch_depth=depth, act_prefetch_depth=depth)
        arrays = milp._highs_arrays(built.model)
        problems.append((arrays, milp._integrality(built.model)))
        bars.append(milp._highs_solve(arrays) * 1.005)
    # one bar for both, the large one's: the small one's plans are all below it (it ends at once with one)
    assert bars[0] < bars[1]
    bar = bars[1]
    calls = []

    def enough(i, found):
        calls.append((i, found.status))
        return i == 0
    found = milp._cutoff_roots(problems, bar, 0.0, 60.0, enough)
    assert [i for i, _ in calls] == [0]   # the first root; not called again once it said enough
    assert found[0].status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
    assert found[1].status == mip.OptimizationStatus.NO_SOLUTION_FOUND and found[1].objective_bound == -math.inf
    # left alone, the large root answers
    alone = milp._cutoff_roots(problems[1:], bar, 0.0, 60.0)
    assert alone[0].status == mip.OptimizationStatus.INFEASIBLE
