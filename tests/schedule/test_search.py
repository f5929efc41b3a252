"""The search heuristic's incremental models equal timing.step_time / memory's peaks exactly."""

import dataclasses
import math
import random
import types

import mip
import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import memory, milp, search, timing
from lazytrain_jax.schedule.costs import analytic_costs, synthetic_costs
from lazytrain_jax.schedule.hardware import Hardware


def _probe(tiers, keep, k):
    """The plan fields of the search's (tiers, keep, k); keep[l] == "host": residuals on the host."""
    return types.SimpleNamespace(boundary_tiers=tiers, keep_residuals=[bool(kp) for kp in keep],
                                 offload_residuals=[kp == "host" for kp in keep], resident_tail=k,
                                 weight_prefetch_depth=1, act_prefetch_depth=1, optimizer_mode="pipelined")


def _heterogeneous_costs(rng, num_layers):
    """Synthetic Costs with random per-layer weights, boundaries, times and residuals."""
    from lazytrain_jax.schedule.costs import synthetic_costs
    L = num_layers
    return synthetic_costs(num_layers=L, weight_bytes=[rng.uniform(0.2, 1.5) * 1e9 for _ in range(L)],
                           boundary_bytes=[rng.uniform(0.1, 0.6) * 1e9 for _ in range(L + 1)],
                           fwd_time=[rng.uniform(0.01, 0.08) for _ in range(L)],
                           residual_bytes=[rng.uniform(0.5, 3.0) * 1e9 for _ in range(L)], workspace_bytes=0.5e9,
                           head_time=0.1, head_bytes=1e9, head_workspace_bytes=2e9)


def _room_for(costs, fraction):
    """A device budget: the step's fixed bytes plus ``fraction`` of the interior boundaries'."""
    probe = Hardware(device_memory=1e15, h2d_bw=1.0, d2h_bw=1.0, device_flops=1.0)
    return sum(memory.constant_bytes(costs, probe).values()) + fraction * sum(costs.boundary_bytes[1:-1])


@pytest.mark.parametrize("num_layers,shared", [(4, False), (9, False), (24, False), (4, True), (9, True)])
def test_incremental_models_equal_timing_and_memory(num_layers, shared):
    # shared: the device computes on the host's cores, with an optimizer slow enough to matter
    hw = Hardware.preset("h800", device_memory=70e9, **(dict(host_shares_device=True, host_opt_rate=1e9) if shared else {}))
    costs = analytic_costs(get_preset("dense-27b", num_layers=num_layers), batch_size=8, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=2)
    if num_layers == 9:  # as lt.profile measures them: the embedding's and head's updates weighed apart
        opt = list(map(float, costs.num_params))
        opt[0], opt[-1] = 3.0 * opt[0], 2.5 * opt[-1]
        costs = dataclasses.replace(costs, opt_params=opt)
    fm = search.FastModel(costs, hw, max_segment_length=num_layers, max_resident_tail=num_layers)
    rng = random.Random(num_layers)
    L = num_layers
    for _ in range(60):
        tiers = ["device"] + [rng.choice(["device", "host", "drop"] + (["nvme"] if i <= L - 3 else []))
                              for i in range(1, L)] + ["device"]
        keep = [rng.random() < 0.3 for _ in range(L)]
        keep = [("host" if kp and l <= L - 2 and rng.random() < 0.5 else kp) for l, kp in enumerate(keep)]
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
        l = rng.choice([l for l in range(L) if keep[l] != "host"])
        toggled = keep[:l] + [not keep[l]] + keep[l + 1:]
        total, peak = fm.try_res(st, l)
        assert total == pytest.approx(timing.step_time(costs, hw, _probe(tiers, toggled, k)), rel=1e-12)
        assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, _probe(tiers, toggled, k)), rel=1e-12)
        # any residual decision, host included (try_keep): time, device peak and host bytes
        l = rng.randrange(L)
        for value in (False, True) + (("host",) if fm.off_ok[l] else ()):
            changed = keep[:l] + [value] + keep[l + 1:]
            total, peak, host = fm.try_keep(st, l, value)
            assert total == pytest.approx(timing.step_time(costs, hw, _probe(tiers, changed, k)), rel=1e-12)
            assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, _probe(tiers, changed, k)), rel=1e-12)
            assert host == pytest.approx(fm.host_bytes(tiers, changed), rel=1e-12)
            assert host == pytest.approx(memory.host_peak_bytes(costs, _probe(tiers, changed, k)), rel=1e-12)


@pytest.mark.parametrize("num_layers,dw,da,heterogeneous", [(5, 2, 1, True), (5, 1, 2, True), (12, 2, 2, True),
                                                            (12, 2, 1, False), (12, 1, 2, False)])
def test_incremental_models_at_a_deeper_prefetch_equal_timing_and_memory(num_layers, dw, da, heterogeneous):
    """At prefetch depth 2 a window's idle upload time takes part of the next window's uploads, so
    the windows form one chain: every state and every move the search times (each boundary to each
    tier, each layer's residuals to each place) equals the step model's value and the memory
    model's peaks, number for number."""
    L = num_layers
    rng = random.Random(100 * L + 10 * dw + da)
    hw = Hardware.preset("h800", device_memory=70e9)
    costs = (_heterogeneous_costs(rng, L) if heterogeneous else
             analytic_costs(get_preset("dense-27b", num_layers=L), batch_size=8, seq_len=1024,
                            device_flops=hw.device_flops, num_micro_batches=2))
    fm = search.FastModel(costs, hw, max_segment_length=L, max_resident_tail=L, weight_prefetch_depth=dw,
                          act_prefetch_depth=da)
    options = lambda i: ["device", "host", "drop"] + (["nvme"] if i <= L - 3 else [])
    ahead = 0
    for _ in range(6):
        tiers = ["device"] + [rng.choice(options(i)) for i in range(1, L)] + ["device"]
        keep = [("host" if rng.random() < 0.25 and l <= L - 2 else rng.random() < 0.3) for l in range(L)]
        k = rng.randint(0, L)

        def probe(t, kp):
            return types.SimpleNamespace(**{**vars(_probe(t, kp, k)), "weight_prefetch_depth": dw,
                                            "act_prefetch_depth": da})
        st = fm.state(tiers, keep, k)
        assert st["total"] == pytest.approx(timing.step_time(costs, hw, probe(tiers, keep)), rel=1e-12)
        assert fm.peak_of(st) == pytest.approx(memory.device_peak_bytes(costs, hw, probe(tiers, keep)), rel=1e-12)
        for i in range(1, L):
            for t in options(i):
                moved = tiers[:i] + [t] + tiers[i + 1:]
                total, peak = fm.try_tier(st, i, t)
                assert total == pytest.approx(timing.step_time(costs, hw, probe(moved, keep)), rel=1e-12)
                assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, probe(moved, keep)), rel=1e-12)
        for l in range(L):
            if keep[l] != "host":
                toggled = keep[:l] + [not keep[l]] + keep[l + 1:]
                total, peak = fm.try_res(st, l)
                assert total == pytest.approx(timing.step_time(costs, hw, probe(tiers, toggled)), rel=1e-12)
                assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, probe(tiers, toggled)), rel=1e-12)
            for value in (False, True) + (("host",) if fm.off_ok[l] else ()):
                changed = keep[:l] + [value] + keep[l + 1:]
                total, peak, host = fm.try_keep(st, l, value)
                assert total == pytest.approx(timing.step_time(costs, hw, probe(tiers, changed)), rel=1e-12)
                assert peak == pytest.approx(memory.device_peak_bytes(costs, hw, probe(tiers, changed)), rel=1e-12)
                assert host == pytest.approx(memory.host_peak_bytes(costs, probe(tiers, changed)), rel=1e-12)
        # windows that upload ahead for the next one (else the checks above would not tell the
        # chain from independent windows)
        ahead += any(done > 0.0 for done in st["pres"])
    assert ahead >= 3


@pytest.mark.parametrize("num_layers,shared,depth", [(9, False, 1), (24, False, 1), (9, True, 1), (24, False, 2)])
def test_changed_states_and_kept_tier_moves_equal_whole_ones(num_layers, shared, depth):
    # a walk of small changes (tier moves, adjacent ones too, every fifth several apart, device
    # residual toggles, every third a nearby layer's residuals to or from the host): the state
    # built from the last one equals the one built whole, number for number, and every tier move
    # timed from the kept local parts equals one timed with nothing kept (at depth 2 the kept
    # parts are the changed windows' loads, and each move's time also equals the whole state's)
    hw = Hardware.preset("h800", device_memory=70e9, **(dict(host_shares_device=True, host_opt_rate=1e9) if shared else {}))
    rng = random.Random(num_layers)
    costs = _heterogeneous_costs(rng, num_layers)
    L = num_layers
    deep = dict(weight_prefetch_depth=depth, act_prefetch_depth=depth)
    fm = search.FastModel(costs, hw, max_segment_length=L, max_resident_tail=L, **deep)
    fresh = search.FastModel(costs, hw, max_segment_length=L, max_resident_tail=L, **deep)
    options = lambda i: ["device", "host", "drop"] + (["nvme"] if i <= L - 3 else [])
    tiers = ["device"] + [rng.choice(options(i)) for i in range(1, L)] + ["device"]
    keep = [("host" if rng.random() < 0.2 and l <= L - 2 else rng.random() < 0.3) for l in range(L)]
    st = fm.state(tiers, keep, rng.randint(0, L))
    hits = 0
    for step in range(40):
        tiers, keep = st["tiers"][:], st["keep"][:]
        first = rng.randint(1, L - 1)
        moves = {first, min(L - 1, first + rng.randint(0, 1))}
        if step % 5 == 4:  # several apart at once, as a compound move makes room (_room_moves)
            moves |= {rng.randint(1, L - 1) for _ in range(4)}
        for i in sorted(moves):
            tiers[i] = rng.choice(options(i))
        l = rng.randrange(L)
        if keep[l] != "host" and step % 2:
            keep[l] = not keep[l]
        if step % 3 == 2:  # a layer near the moves to or from the host: its forward item changes too
            near = min(L - 2, first + rng.randint(-2, 3))
            keep[near] = True if keep[near] == "host" else "host"
        st = fm.changed(st, tiers, keep)
        whole = fm.state(tiers, keep, st["k"])
        assert st.keys() == whole.keys()
        for key in whole:
            assert st[key] == whole[key], key
        before, calls = len(fm._tier_cache), 0
        for i in range(1, L):
            for t in options(i):
                if t != tiers[i]:
                    fresh._tier_cache.clear()
                    assert fm.try_tier(st, i, t) == fresh.try_tier(st, i, t)
                    if depth > 1:
                        moved = tiers[:i] + [t] + tiers[i + 1:]
                        total = fm.state(moved, keep, st["k"])["total"]
                        assert fm.try_tier(st, i, t)[0] == pytest.approx(total, rel=1e-12)
                    calls += 1
        hits += calls - (len(fm._tier_cache) - before)
    if depth == 1:
        assert hits > 5 * L  # many moves were timed from kept parts (141 at 9 layers)


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
    # each kept residual here needs the room of ~14 boundaries moved to host/NVMe at once: without
    # the compound move (search._room_moves) the search ended 0.44 % above the optimum
    assert found.predicted_step_time_s <= exact.predicted_step_time_s * 1.001
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


def test_counted_paths_reach_the_proven_optimum_where_the_greedy_fits_nothing():
    """Tight device and host memory on identical layers: the greedy construction and its local
    search find no fitting plan, the path program finds the optimum CBC proves (rel_gap 0)."""
    hw = Hardware.preset("h800", device_memory=31e9, host_memory=2e9, nvme_memory=0, h2d_bw=12e9, d2h_bw=12e9,
                         host_opt_rate=4e9)
    costs = analytic_costs(get_preset("dense-27b", num_layers=12), batch_size=72, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=8)
    fm = search.FastModel(costs, hw, max_segment_length=8, max_resident_tail=8)
    assert all(search._construct(fm, False, full) is None for full in (False, True))
    paths = search._counted_paths(fm)
    assert paths and all(fm.fits(*p) and fm.allowed(*p) for p in paths)
    exact = milp.solve(costs, hw, rel_gap=0.0, depths=[(1, 1)], max_nodes=100000)
    assert exact.solver_status == "optimal" and exact.gap <= 1e-9
    assert fm.step_time(*paths[0]) == pytest.approx(exact.predicted_step_time_s, rel=1e-12)
    found = search.heuristic_plan(costs, hw)
    assert found.predicted_step_time_s == pytest.approx(exact.predicted_step_time_s, rel=1e-12)


def test_solve_reports_where_its_seconds_went():
    hw = Hardware.preset("h800", device_memory=31e9, host_memory=2e9, nvme_memory=0, h2d_bw=12e9, d2h_bw=12e9,
                         host_opt_rate=4e9)
    costs = analytic_costs(get_preset("dense-27b", num_layers=12), batch_size=72, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=8)
    stats = {}
    p = milp.solve(costs, hw, rel_gap=1e-2, stats=stats)
    assert p.gap <= 1e-2
    assert stats["proof"] in ("union_lp", "depth_lps", "cbc", "highs") and stats["search_s"] > 0
    assert stats["lp_solves"] >= 1 and stats["lp_s"] > 0
    assert (stats["bb_runs"] > 0) == (stats["proof"] in ("cbc", "highs")) and (stats["bb_s"] > 0) == (stats["bb_runs"] > 0)


def test_cbc_stopped_before_its_start_still_returns_the_start(monkeypatch):
    """A time limit that strikes before CBC takes the start (a loaded machine) returns the search's
    plan as ``feasible`` with the LP's gap, not None and not a zero gap. (The solve's limit is
    made to pass only inside CBC's run: before it, no depth pair is branched on at all. Each CBC
    run returns what CBC returns then, no solution, whatever the machine's speed: a real 1 ms
    limit is raised to ``MIN_RUN_S``, in which a fast machine may prove the instance.)"""
    monkeypatch.setattr(milp._Solve, "expired", lambda self: False)
    stopped = []

    def out_of_time(m, *args):
        stopped.append(m.num_nz)
        return milp.Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                           objective_bound=-math.inf, values=None)

    monkeypatch.setattr(milp, "_cbc_here", out_of_time)
    monkeypatch.setattr(milp, "_cbc_in_child", out_of_time)
    rng = random.Random(7)
    costs = _heterogeneous_costs(rng, 16)
    budget = _room_for(costs, 0.3)
    hw = Hardware(device_memory=budget, host_memory=2e9, nvme_memory=5e9, h2d_bw=12e9, d2h_bw=12e9,
                  device_flops=1e14, host_opt_rate=3e9)
    found = search.heuristic_plan(costs, hw)
    stats = {}
    p = milp.solve(costs, hw, time_limit_s=1e-3, stats=stats)
    assert p is not None and p.fits() and p.predicted_step_time_s <= found.predicted_step_time_s + 1e-12
    assert stats["proof"] == "cbc" and stats["bb_runs"] >= 1 and stopped  # the LPs do not prove this start
    assert p.solver_status == "feasible" and p.gap > 1e-2


def test_deeper_prefetch_gets_its_own_search_start():
    """The search's plan at depths (1, 1) may not fit with a deeper prefetch's buffers. The search
    at (2, 1), its model holding the second weight buffer and playing the earlier uploads, gives a
    start that fits there and beats every (1, 1) plan the search found, and the solve returns at
    least as good a plan."""
    hw = Hardware.preset("a100-80g", host_opt_rate=2e10, device_memory=55e9)
    # layers timed at an H800's rate on an A100's memory and links: transfer-bound (benchmarks/planner.py)
    costs = analytic_costs(get_preset("qwen2.5-14b", num_layers=16), batch_size=32, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    shallow = search.heuristic_plan(costs, hw)
    assert milp._at_depths(shallow, 2, 1) is None  # does not fit with a second weight buffer
    deeper = milp._at_depths(milp._search_for_depths(costs, hw, 2, 1, 8, 8, search.DEFAULT_EVALUATIONS, True), 2, 1)
    assert deeper is not None and deeper.fits()
    assert deeper.predicted_step_time_s < shallow.predicted_step_time_s * (1 - 1e-3)
    solved = milp.solve(costs, hw)
    assert solved.predicted_step_time_s <= deeper.predicted_step_time_s + 1e-9


def test_union_lp_proves_a_deeper_prefetch_plan():
    """Where the search's depth-(1, 1) plan is not proved by the LP for all depth pairs, the search's
    plan for depths (2, 1) is tried against it before any per-depth model is built; with the union's
    depth indicators (the deeper buffer's bytes, the optimizer's earlier deadlines) that LP is tight
    enough to prove it here: no per-depth model, no CBC, and a gap it really proves. (The union LP
    takes the weight depth fractionally here, so its split on that depth runs beside the search:
    the bound proved is the union LP raised by its two halves, at most to the lower of them; by
    their first bounds where those prove the plan, ``_Solve.depth_split_proves_early``.)"""
    hw = Hardware.preset("a100-80g", host_opt_rate=2e10)
    costs = analytic_costs(get_preset("qwen2.5-14b", num_layers=64), batch_size=32, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    stats = {}
    solved = milp.solve(costs, hw, stats=stats)
    assert (solved.weight_prefetch_depth, solved.act_prefetch_depth) == (2, 1)
    # (the union LP's rounding at (2, 1) gives a plan the union LP proves alone: no split started)
    assert stats["proof"] == "union_lp" and stats["lp_solves"] in (1, 3) and stats["bb_runs"] == 0
    assert solved.fits() and solved.gap <= milp.DEFAULT_REL_GAP
    union = milp.build(costs, hw, union=True)
    arrays = milp._highs_arrays(union.model)
    halves, _ = milp._depth_split(union, arrays)
    bound = min(halves.values())
    assert bound >= milp.lp_bound(costs, hw)
    proved = solved.predicted_step_time_s * (1 - solved.gap)
    assert milp._highs_solve(arrays) * (1 - 1e-5) <= proved <= bound * (1 + 1e-5)
    shallow = milp._at_depths(search.heuristic_plan(costs, hw), 1, 1)
    assert (shallow.predicted_step_time_s - bound) / shallow.predicted_step_time_s > milp.DEFAULT_REL_GAP


def test_residual_fetch_cuts_prove_the_llama3_8b_plan():
    """Llama-3-8B's own shape (32 layers) on an H100 with room for half the boundaries. The LP for
    all depth pairs used to fetch an eighth of every residual into each backward window's idle
    upload time (which no whole residual fits) and sat 1.4 % below the best plan; CBC needed 27 s
    to close that. With the fetch's hull cuts one LP proves the search's plan: no CBC, no split.
    The split on the offload's staging still lies between that LP and the plan."""
    hw0 = Hardware.preset("h100")
    costs = analytic_costs(get_preset("llama3-8b"), batch_size=64, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    assert costs.num_layers == 32
    hw = hw0.replace(device_memory=_room_for(costs, 0.5))
    stats = {}
    solved = milp.solve(costs, hw, stats=stats)
    assert stats["proof"] == "union_lp" and stats["bb_runs"] == 0 and stats["lp_solves"] == 1
    assert solved.fits() and solved.gap <= milp.DEFAULT_REL_GAP
    value = solved.predicted_step_time_s
    union = milp.build(costs, hw, union=True)
    plain = milp._relaxed(union, solver="clp")
    assert value * (1 - solved.gap) == pytest.approx(plain, rel=1e-5)
    split = milp._offload_split(union, None)
    assert plain <= split <= value
    arrays = milp._highs_arrays(union.model)
    assert milp._offload_split(union, arrays) == pytest.approx(split, rel=1e-5)
    basis = []   # the branches from the LP's basis by dual simplex (its vertex: exact)
    milp._highs_solve(arrays, [], basis)
    assert milp._offload_split(union, arrays, basis) == pytest.approx(split, rel=1e-5)


def test_residual_fetch_cuts_at_both_activation_depths():
    """The same shape at 64 layers: with the plan's boundary tiers, path and resident tail fixed, the
    LP at every depth pair (the fetch whole in its window at activation depth 1, spread over two at
    depth 2) is within 0.6 % of the search's plan; without the cuts it was 1.5-1.6 % below."""
    costs = analytic_costs(get_preset("llama3-8b", num_layers=64), batch_size=64, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    hw = Hardware.preset("h100").replace(device_memory=_room_for(costs, 0.5))
    found = search.heuristic_plan(costs, hw, max_segment_length=8, max_resident_tail=8)
    for dw, da in milp.MILP_DEPTHS:
        plan = milp._at_depths(found, dw, da)
        assert plan is not None
        built = milp.build(costs, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
        free = {v.idx for v in list(built.res.values()) + list(built.off.values())}
        for var, value in milp._start_values(plan, built):
            if var.idx not in free:
                var.lb = var.ub = value
        lp = milp._relaxed(built, solver="clp")
        assert lp <= plan.predicted_step_time_s * (1 + 1e-9)
        assert lp >= plan.predicted_step_time_s * (1 - 0.006), (dw, da)


@pytest.mark.parametrize("seed", range(6))
def test_polish_stays_in_the_space_and_never_worsens(seed):
    """Local search at a plan's own depths: every plan it returns fits every budget, keeps its
    depths, never lengthens its resident tail, has no segment over the limit, and is never slower
    than its start; its predictions are the step and memory models' own. The starts are the
    search's plans at depths (1, 1), carried to each pair's depths, and the search's own at that
    pair; the same with the serial optimizer (the whole-window single moves)."""
    rng = random.Random(seed)
    costs = _heterogeneous_costs(rng, 10)
    budget = _room_for(costs, rng.uniform(0.4, 1.5))
    hw = Hardware(device_memory=budget, host_memory=rng.uniform(1, 6) * 1e9, nvme_memory=rng.choice([0, 5e9]),
                  h2d_bw=rng.choice([6e9, 12e9, 24e9]), d2h_bw=12e9, device_flops=1e14, host_opt_rate=3e9)
    shallow = search.heuristic_plan(costs, hw, max_segment_length=4, max_evaluations=200)
    for dw, da in milp.MILP_DEPTHS:
        own = milp._at_depths(milp._search_for_depths(costs, hw, dw, da, 4, 8, 200, True), dw, da) \
            if (dw, da) != (1, 1) else shallow
        carried = milp._at_depths(shallow, dw, da)
        serial = carried.repredict(optimizer_mode="serial") if carried is not None else None
        for start in (own, carried, serial):
            if start is None:
                continue
            q = search.polish(start, max_segment_length=4, max_evaluations=400)
            assert q.fits() and q.predicted_step_time_s <= start.predicted_step_time_s
            assert (q.weight_prefetch_depth, q.act_prefetch_depth) == (dw, da)
            assert q.resident_tail <= start.resident_tail and q.optimizer_mode == start.optimizer_mode
            assert all(e - s <= 4 for s, e in memory.segments(q.boundary_tiers))
            assert q.predicted_step_time_s == pytest.approx(timing.step_time(costs, hw, q), rel=1e-12)
            assert q.predicted_peak_device_bytes == pytest.approx(memory.device_peak_bytes(costs, hw, q), rel=1e-12)


def test_polish_improves_a_plan_carried_to_deeper_prefetch():
    """A plan made at depths (1, 1), with the room of the deeper buffers held back, and carried to
    (2, 2): the local search on the search's own model at those depths finds a faster plan every
    time (its depths kept, its predictions the models' own)."""
    for seed in range(6):
        rng = random.Random(seed)
        costs = _heterogeneous_costs(rng, 10)
        probe = Hardware(device_memory=1e15, h2d_bw=1.0, d2h_bw=1.0, device_flops=1.0)
        extra = (sum(memory.constant_bytes(costs, probe, weight_prefetch_depth=2, act_prefetch_depth=2).values())
                 - sum(memory.constant_bytes(costs, probe).values()) + 2 * max(costs.residual_bytes))
        room = _room_for(costs, rng.uniform(0.4, 1.0))
        hw = Hardware(device_memory=room + extra, host_memory=4e9, nvme_memory=0, h2d_bw=6e9, d2h_bw=12e9,
                      device_flops=1e14, host_opt_rate=3e9)
        shallow = search.heuristic_plan(costs, hw.replace(device_memory=room), max_segment_length=4,
                                        max_evaluations=200)
        carried = milp._at_depths(shallow.repredict(hardware=hw), 2, 2)
        q = search.polish(carried, max_segment_length=4, max_evaluations=400)
        assert q.fits() and q.predicted_step_time_s < carried.predicted_step_time_s * (1 - 1e-3)
        assert (q.weight_prefetch_depth, q.act_prefetch_depth) == (2, 2)
        assert q.predicted_step_time_s == pytest.approx(timing.step_time(costs, hw, q), rel=1e-12)


def test_deeper_activation_prefetch_plan_proved_without_cbc():
    """Qwen3-32B-shaped layers (32 of them) on an H200: the best plans prefetch activations two
    windows ahead. The search at depths (1, 2), its model playing the deeper prefetch and the
    deeper offload staging, finds that plan itself, and the one LP for every depth pair proves it:
    no per-depth LP, no branch and bound, and 2.6 % faster than the depth-(1, 1) search's plan (CBC
    ran for a minute on the 64-layer shape before)."""
    hw = Hardware.preset("h200")
    costs = analytic_costs(get_preset("qwen3-32b", num_layers=32), batch_size=32, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    shallow = search.heuristic_plan(costs, hw)
    stats = {}
    solved = milp.solve(costs, hw, stats=stats)
    assert (solved.weight_prefetch_depth, solved.act_prefetch_depth) == (1, 2)
    # the union LP, and at most the offload split's two LPs beside the search (start_offload_split)
    assert stats["bb_runs"] == 0 and stats["proof"] == "union_lp" and stats["lp_solves"] <= 3
    assert solved.fits() and solved.gap <= milp.DEFAULT_REL_GAP and solved.solver_status == "optimal"
    assert solved.predicted_step_time_s < shallow.predicted_step_time_s * (1 - 0.02)
    deeper = milp._at_depths(milp._search_for_depths(costs, hw, 1, 2, 8, 8, search.DEFAULT_EVALUATIONS, True), 1, 2)
    assert deeper is not None and solved.predicted_step_time_s <= deeper.predicted_step_time_s
    assert deeper.predicted_step_time_s < shallow.predicted_step_time_s * (1 - 0.02)


def test_residuals_go_to_the_host_even_when_not_all_of_them_fit():
    """The first residual sent to the host costs the offload's device working set, so single moves
    from a plan without any never start; the construction starts from residuals on the host. When
    they do not all fit there it used to give up: now the ones saving the most time per byte go,
    as many as fit, and the plan found beats every plan without host residuals the search finds."""
    hw = Hardware.preset("h200", host_memory=60e9)
    costs = analytic_costs(get_preset("qwen3-32b", num_layers=24), batch_size=32, seq_len=1024,
                           device_flops=Hardware.preset("h800").device_flops, num_micro_batches=4)
    fm = search.FastModel(costs, hw, max_segment_length=8, max_resident_tail=8)
    assert sum(fm.R[l] for l in range(24) if fm.off_ok[l]) > hw.host_memory  # not all of them fit
    with_offload = search.heuristic_plan(costs, hw)
    without = search.heuristic_plan(costs, hw, residual_offload=False)
    assert any(with_offload.offload_residuals) and with_offload.fits()
    assert with_offload.predicted_step_time_s < without.predicted_step_time_s * (1 - 2e-3)


def test_stdout_survives_the_union_lp_thread(monkeypatch):
    """The LP for all depth pairs runs in a thread beside the search, and CLP's output is silenced
    by pointing fd 1 at /dev/null. With no search plan the per-depth models follow at once; two
    overlapping redirections used to leave fd 1 on /dev/null for the rest of the process."""
    import os
    hw = Hardware.preset("rtx3090")
    costs = analytic_costs(get_preset("qwen2.5-3b", num_layers=8), batch_size=8, seq_len=1024,
                           device_flops=hw.device_flops)
    before = os.fstat(1)
    monkeypatch.setattr(search, "heuristic_plan", lambda *a, **k: None)
    for _ in range(3):
        plan = milp.solve(costs, hw)
        assert plan is not None and plan.fits()
    after = os.fstat(1)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)


def test_tier_neighbourhood_keeps_the_rest_and_restores_the_model(monkeypatch):
    """The tier neighbourhood changes only boundary tiers among kept boundaries (path, residuals,
    tail and depths stay), never returns a worse plan or one that does not fit, and leaves the
    model as it found it (its LP value and bounds). On a random 64-layer instance with NVMe it
    improves the search's depth-(1,1) plan, which single moves had left."""
    costs, hw = _benchmark_random_nvme_instance(monkeypatch, 64)
    plan = search.heuristic_plan(costs, hw, max_segment_length=8, max_resident_tail=8)
    built = milp.build(costs, hw)
    bounds = [(v.lb, v.ub) for v in built.model.vars]
    lp = milp._relaxed(built, solver="clp")
    better = milp._tier_neighbourhood(built, plan, costs, hw, 30.0)
    assert better is not None and better.fits()
    assert better.predicted_step_time_s < plan.predicted_step_time_s * (1 - 1e-3)
    assert [t == "drop" for t in better.boundary_tiers] == [t == "drop" for t in plan.boundary_tiers]
    for field in ("keep_residuals", "offload_residuals", "resident_tail", "weight_prefetch_depth",
                  "act_prefetch_depth", "optimizer_mode", "name"):
        assert getattr(better, field) == getattr(plan, field)
    assert [(v.lb, v.ub) for v in built.model.vars] == bounds
    assert milp._relaxed(built, solver="clp") == pytest.approx(lp, rel=1e-9)
    again = milp._tier_neighbourhood(built, better, costs, hw, 30.0)  # solved within 1e-4 already
    assert again is None or again.predicted_step_time_s >= better.predicted_step_time_s * (1 - 2e-4)


def test_residual_neighbourhood_keeps_residuals_with_the_room_they_need(monkeypatch):
    """Keeping one more residual may need several boundaries swapped between the device, the host
    and NVMe at once, which no single or pair move of the search makes. The residual neighbourhood
    keeps it and lets CBC choose every tier: on the random 32-layer NVMe instance the search's plan
    keeps no residual and each probe finds a faster plan that keeps one. Path, tail and depths stay,
    the plan fits, and the model is left as it was found."""
    costs, hw = _benchmark_random_nvme_instance(monkeypatch, 32)
    plan = search.heuristic_plan(costs, hw, max_segment_length=8, max_resident_tail=8)
    built = milp.build(costs, hw)
    bounds = [(v.lb, v.ub) for v in built.model.vars]
    lp = milp._relaxed(built, solver="clp")
    assert not any(plan.keep_residuals)
    better = milp._residual_neighbourhood(built, plan, costs, hw, 30.0, probes=3)
    assert better.fits() and better.predicted_step_time_s < plan.predicted_step_time_s * (1 - 5e-3)
    assert better.predicted_step_time_s == pytest.approx(better.repredict().predicted_step_time_s, rel=1e-12)
    assert any(better.keep_residuals)
    assert [t == "drop" for t in better.boundary_tiers] == [t == "drop" for t in plan.boundary_tiers]
    for field in ("resident_tail", "weight_prefetch_depth", "act_prefetch_depth", "optimizer_mode", "name"):
        assert getattr(better, field) == getattr(plan, field)
    assert [(v.lb, v.ub) for v in built.model.vars] == bounds
    assert milp._relaxed(built, solver="clp") == pytest.approx(lp, rel=1e-9)
    # one probe on a residual the plan does not keep yet: it comes back kept, with every residual
    # kept before, and faster than the plan, or nothing comes back
    first = max((l for l in built.res if not better.keep_residuals[l]),
                key=lambda l: ((costs.bwd_recompute_time[l + 1] - costs.bwd_time[l + 1]) / costs.residual_bytes[l], -l))
    one = milp._tier_neighbourhood(built, better, costs, hw, 30.0, add_residual=first)
    assert one is None or (one.keep_residuals[first] and one.predicted_step_time_s < better.predicted_step_time_s
                           and all(k for k, was in zip(one.keep_residuals, better.keep_residuals) if was))


def test_case_cuts_raise_the_lp_and_stay_below_the_plans(monkeypatch):
    """A backward or recompute window's loads depend on which segment ends at (or covers) it; the LP
    averages those cases' loads before taking the max over channels. The case cuts (one per window:
    T >= the least length of the window in each case, weighted by its indicator) take the average of
    the maxima instead. On the random 32-layer instance without NVMe they raise the depth-(2,1) LP
    by 0.4 %, and it stays below the plans of the space (the enumeration tests check them exactly on
    small instances)."""
    import dataclasses
    costs, hw = _benchmark_random_nvme_instance(monkeypatch, 32, seed=8)
    hw = dataclasses.replace(hw, nvme_memory=0.0)
    lps = {cc: milp._relaxed(milp.build(costs, hw, weight_prefetch_depth=2, case_cuts=cc), solver="clp")
           for cc in (False, True)}
    assert lps[True] > lps[False] * (1 + 3e-3)
    plan = milp.solve(costs, hw, depths=((2, 1),))
    assert plan is not None and plan.weight_prefetch_depth == 2
    searched = milp._at_depths(search.heuristic_plan(costs, hw), 2, 1)
    for p in (plan, searched):
        if p is not None:
            assert lps[True] <= p.predicted_step_time_s
    assert plan.gap <= milp.DEFAULT_REL_GAP


def test_case_cuts_count_a_segment_base_with_its_weights():
    """A backward window (and the head's forward) uploads the next segment's weights and, from the
    host, its base on one link. Each case of the window's cut carries both (the weights' share of a
    resident-tail layer's case taken off again), so at the exact plan's own path with the tiers
    left free the LP stays within 2.5 % of the plan (3.4 % without the cases), and the LP over the
    whole space rises too; both stay below the plan."""
    from lazytrain_jax.schedule.costs import synthetic_costs
    L, GB = 12, 1e9
    costs = synthetic_costs(num_layers=L, weight_bytes=0.28 * GB, boundary_bytes=1.8 * GB, fwd_time=0.05,
                            head_time=0.1, head_bytes=0.5 * GB, workspace_bytes=2 * GB, head_workspace_bytes=4 * GB)
    roomy = Hardware(device_memory=1e15, h2d_bw=11.7e9, d2h_bw=8.4e9, device_flops=1e14)
    base = sum(memory.constant_bytes(costs, roomy).values())
    hw = roomy.replace(device_memory=base + 0.3 * L * 1.8 * GB, host_memory=1e12, nvme_memory=0.0,
                       host_opt_rate=1.5e9)
    plan = milp.solve(costs, hw, depths=((1, 1),), rel_gap=0.0)
    assert "host" in plan.boundary_tiers and plan.gap == 0.0
    at_path, free = {}, {}
    for cc in (False, True):
        built = milp.build(costs, hw, case_cuts=cc)
        free[cc] = milp._relaxed(built, solver="clp")
        start = {v.idx: value for v, value in milp._start_values(plan, built)}
        for v in built.x.values():
            v.lb = v.ub = start[v.idx]
        at_path[cc] = milp._relaxed(built, solver="clp")
    t = plan.predicted_step_time_s
    assert at_path[False] < t * (1 - 0.03) and t * (1 - 0.025) <= at_path[True] <= t
    assert free[False] * (1 + 0.03) < free[True] <= t


def test_residual_fetch_cuts_span_the_overlapping_windows():
    """At activation depth 2 a residual fetched from the host may start in the window before its
    own, so the fetch cut is on a pair of windows, and the pairs of neighbouring layers share a
    window. Cut pair by pair, the LP hid a fraction of every layer's residuals under each window's
    compute, counting each window's idle link for two fetches (the qwen2.5-3b shape on an H200,
    compute-light layers whose residuals take 3x their backward to come up). With the cut over all
    those windows at once the (1, 2) LP is 0.83 % below the optimum, where it was 1.07 %, and not
    above it. (Both LPs without the windows' tightened rows, ``milp._tighten_window_rows``, to
    measure the cut alone: the tightening by itself takes the LP without the cut to 0.97 %.)"""
    L = 12
    hw = Hardware.preset("h200")
    costs = analytic_costs(get_preset("qwen2.5-3b", num_layers=L), batch_size=32, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=4,
                           efficiency_half_tokens=hw.efficiency_half_tokens)
    roomy = Hardware(device_memory=1e15, h2d_bw=1.0, d2h_bw=1.0, device_flops=1.0)
    # room for every boundary and six of the twelve layers' residuals
    hw = hw.replace(device_memory=sum(memory.constant_bytes(costs, roomy).values()) + sum(costs.boundary_bytes[1:-1])
                    + 6 * costs.residual_bytes[1])
    assert costs.residual_bytes[1] / hw.h2d_bw > 2.5 * costs.bwd_time[1]
    plan = milp.solve(costs, hw, depths=((1, 2),), rel_gap=0.0)
    assert plan.gap == 0.0
    lp = {cc: milp._relaxed(milp.build(costs, hw, weight_prefetch_depth=1, act_prefetch_depth=2, case_cuts=cc,
                                       tighten_rows=False), solver="clp") for cc in (False, True)}
    t = plan.predicted_step_time_s
    assert lp[False] < t * (1 - 0.01) and t * (1 - 0.009) <= lp[True] <= t



def _link_bound_instance(num_layers):
    """Uniform layers whose weights and boundary each take 4x the layer's forward on the link, room
    on the device for a third of the boundaries and on the host for half, residuals that could be
    kept (1.4 boundaries each)."""
    a, w, t = 1.2e9, 1.13e9, 0.023
    costs = synthetic_costs(num_layers=num_layers, weight_bytes=w, boundary_bytes=a, fwd_time=t,
                            residual_bytes=1.385 * a, workspace_bytes=0.52 * a, head_time=2.22 * t,
                            head_bytes=2.47 * w, head_workspace_bytes=2.68 * a)
    return costs, Hardware(device_memory=_room_for(costs, 0.3), host_memory=0.5 * sum(costs.boundary_bytes),
                           nvme_memory=0.0, h2d_bw=12.8e9, d2h_bw=10.9e9, device_flops=1e14, host_opt_rate=9.55e9)


def test_segment_chains_and_rows_without_kept_residuals_raise_the_lp():
    """Two families of rows of ``build``: each backward window's case cuts written also from its
    compute without the layer's kept residuals (less that saving times res), and the backward
    pass by segments (the recompute and backward windows last together at least Σ τ(s, e) ·
    x[s, e], each τ the least time of the segment's chain of windows). On link-bound layers whose
    optimum keeps no residuals the depth-(1, 1) LP was 6.2 % below the optimum (every window's
    case cut counted from the compute with kept residuals, and a fractional path averaged the
    upload-bound runs of windows); with them it is 4.4 % below, and not above it."""
    costs, hw = _link_bound_instance(12)
    optimum = milp._cbc_here(milp.build(costs, hw).model, 120.0, 10**6).objective_value
    lp = milp._relaxed(milp.build(costs, hw), solver="clp")
    assert optimum * (1 - 0.045) <= lp <= optimum


def _benchmark_module(monkeypatch, name):
    """benchmarks/``name``.py, loaded with benchmarks/ on the import path (its modules import each
    other) for the test's duration."""
    import importlib.util
    import pathlib
    here = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
    monkeypatch.syspath_prepend(str(here))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", here / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _benchmark_random_nvme_instance(monkeypatch, num_layers, seed=7):
    """benchmarks/planner.py's random heterogeneous instance with NVMe (its (a) table)."""
    planner = _benchmark_module(monkeypatch, "planner")
    costs = planner.random_heterogeneous(num_layers, seed=seed)
    return costs, planner.random_nvme_hardware(costs)


def test_offload_split_beside_the_first_step_gives_the_same_plan_whichever_ends_first(monkeypatch):
    """The hybrid qwen3.6-27b shape (48 layers, RTX 4090): the residual offload split alone proves
    the search's plan, and it runs in a thread beside the union phase's first step
    (``_Solve.start_offload_split``), joined right after that step. Made slow, or the search made
    slow, the solve returns the same plan, gap and proof: the split's bound enters the solve at a
    fixed point, not when its thread ends."""
    import time as time_module

    hw = Hardware.preset("rtx4090")
    costs = analytic_costs(get_preset("qwen3.6-27b", num_layers=48), batch_size=8, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=2,
                           efficiency_half_tokens=hw.efficiency_half_tokens)
    calls = []
    split, search_for_depths = milp._offload_split, milp._search_for_depths

    def spied(built, arrays, basis=None):
        calls.append(arrays is not None)
        return split(built, arrays, basis)

    def slow_split(built, arrays, basis=None):
        time_module.sleep(0.5)
        return split(built, arrays, basis)

    def slow_search(*args):
        time_module.sleep(0.5)
        return search_for_depths(*args)

    def counts(stats):
        return {k: stats[k] for k in ("lp_solves", "rens_runs", "bb_runs", "proof")}

    monkeypatch.setattr(milp, "_offload_split", spied)

    stats = {}
    calm = milp.solve(costs, hw, rel_gap=1e-2, stats=stats)
    assert calls == [True]  # on the HiGHS arrays, so in the thread
    # the union LP, the offload split and the depth split (two LPs each)
    assert counts(stats) == {"lp_solves": 5, "rens_runs": 0, "bb_runs": 0, "proof": "union_lp"}
    assert calm.solver_status == "optimal"
    calm_counts, results = counts(stats), []
    for slow in ("split", "search"):
        monkeypatch.setattr(milp, "_offload_split", slow_split if slow == "split" else split)
        monkeypatch.setattr(milp, "_search_for_depths", slow_search if slow == "search" else search_for_depths)
        stats = {}
        results.append((milp.solve(costs, hw, rel_gap=1e-2, stats=stats).replace(solve_time_s=0.0), counts(stats)))
    assert results == [(calm.replace(solve_time_s=0.0), calm_counts)] * 2


def test_the_segment_rows_only_tighten_the_bound(monkeypatch):
    """The backward pass's segment rows are bound rows (``_Model.add_bound_row``): one in a depth
    pair's model, two in the union relaxation (depth 2's, and depth 1's less y_w times its reach).
    Left out, as the neighbourhoods' sub-MIPs leave them out, the LP drops and HiGHS finds the
    same optimum: they cut no plan. The depth pair's model here has six more bound rows
    (``_fetch_and_base_rows``, counted apart), checked with them."""
    costs, hw = _link_bound_instance(8)
    assert len(milp.build(costs, hw, union=True).model.bound_rows) == 2
    monkeypatch.setattr(milp, "FETCH_BASE_ROWS", False)
    assert len(milp.build(costs, hw).model.bound_rows) == 1
    monkeypatch.setattr(milp, "FETCH_BASE_ROWS", True)
    built = milp.build(costs, hw)
    assert len(built.model.bound_rows) == 1 + 6
    lp = {rows: milp._highs_solve(milp._highs_arrays(built.model, bound_rows=rows)) for rows in (True, False)}
    assert lp[False] < lp[True] * (1 - 1e-3)
    optimum = {rows: milp._highs_mip(built.model, 0.0, 60.0, 10**6, bound_rows=rows).objective_value
               for rows in (True, False)}
    assert optimum[False] == pytest.approx(optimum[True], rel=1e-7)
    assert lp[True] <= optimum[True]


def test_leaning_reads_a_small_activation_indicator_as_depth_one():
    """``_leaning`` takes the union LP's weight depth indicator above 0.01 as depth 2 and its
    activation one above 0.03 (``LEAN_Y``); the other pairs by the weight the LP puts on them."""
    costs, hw = _link_bound_instance(6)
    union = milp.build(costs, hw, union=True)
    y_w, y_a = union.depth_indicators
    point = [0.0] * union.model.num_cols
    for ya, first in ((0.024, (2, 1)), (0.05, (2, 2))):
        point[y_w.idx], point[y_a.idx] = 0.66, ya
        order = milp._leaning(point, union)
        assert order[0] == first and sorted(order) == sorted(milp.MILP_DEPTHS)
    point[y_w.idx], point[y_a.idx] = 0.005, 0.2
    assert milp._leaning(point, union)[:2] == [(1, 2), (1, 1)]


def test_the_share_rows_raise_the_lp_and_cut_no_plan():
    """A resident-tail layer's shares of uploads of which at most one is made in any plan sum to at
    most its r (``build(share_rows=True)``): without those rows the LP counts a layer resident in
    part as resident in every fractional case at once. On link-bound layers they raise the LP of
    depths (2, 1) by 3.5 % and of (1, 1) by 1.5 %; HiGHS finds the same optimum with and without
    them."""
    costs, hw = _link_bound_instance(12)
    for dw in (2, 1):
        models = {rows: milp.build(costs, hw, weight_prefetch_depth=dw, share_rows=rows) for rows in (True, False)}
        lp = {rows: milp._highs_solve(milp._highs_arrays(b.model)) for rows, b in models.items()}
        assert lp[True] > lp[False] * (1 + 1e-2)
        optimum = {rows: milp._highs_mip(b.model, 0.0, 60.0, 10**6).objective_value for rows, b in models.items()}
        assert optimum[False] == pytest.approx(optimum[True], rel=1e-7)
        assert lp[True] <= optimum[True]
