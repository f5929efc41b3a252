"""The union LP's neighbourhoods and splits that prove large models without HiGHS' whole branch
and cut: ``_rens`` (the LP's fractional part solved exactly at one depth pair), ``_depth_split``
(the union LP at each weight prefetch depth), ``_offload_split_gain`` (when the offload split is
worth its two LPs), checked against exact optima; and ``milp.solve``'s large-model path taking
them (forced on small instances)."""

import math
import types

import mip
import numpy
import pytest

from lazytrain_jax.schedule import memory, milp

from tests.schedule.test_highs_mip import _decisions, _random_instance
from tests.schedule.test_milp_exhaustive import CASES, SPLIT_CASES, hardware_for, instance

TOL = milp.RENS_TOLERANCE


def _union_solution(costs, hw, **kw):
    union = milp.build(costs, hw, union=True, **kw)
    arrays = milp._highs_arrays(union.model)
    point = []
    value = milp._highs_solve(arrays, point)
    return union, arrays, value, point[0]


def _assert_keeps_what_the_lp_takes_whole(plan, union, point):
    """Every segment the LP takes whole is the plan's, every one it leaves out is not; the same for
    the kept residuals."""
    chosen = set(memory.segments(plan.boundary_tiers))
    for edge, var in union.x.items():
        if point[var.idx] > 1 - TOL:
            assert edge in chosen
        elif point[var.idx] < TOL:
            assert edge not in chosen
    for l, var in union.res.items():
        if point[var.idx] > 1 - TOL:
            assert plan.keep_residuals[l]
        elif point[var.idx] < TOL:
            assert not plan.keep_residuals[l]


def _exact_at(monkeypatch, costs, hw, dw, da, **kw):
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    plan = milp.solve(costs, hw, rel_gap=0.0, depths=[(dw, da)], **kw)
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    return plan


@pytest.mark.parametrize("seed", [4, 7])
def test_rens_keeps_the_lps_integral_part_and_restores_the_model(monkeypatch, seed):
    costs, hw = _random_instance(8, seed)
    union, _, _, point = _union_solution(costs, hw)
    # the LP leans to weight depth 2 (y_w 0.34-0.52), where what it fixes leaves no room for the
    # deeper buffer: no plan there (the union phase then splits on that depth); at depths (1, 1) one
    assert milp._leaning(point, union)[0] == (2, 1)
    built = milp.build(costs, hw, weight_prefetch_depth=2, act_prefetch_depth=1)
    before = [(v.lb, v.ub) for v in built.model.vars]
    assert milp._rens(built, union, point, costs, hw, 1e-2, 60.0, 1000) is None
    assert [(v.lb, v.ub) for v in built.model.vars] == before and built.solved is None
    dw, da = 1, 1
    built = milp.build(costs, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
    before = [(v.lb, v.ub) for v in built.model.vars]
    plan = milp._rens(built, union, point, costs, hw, 1e-2, 60.0, 1000)
    assert [(v.lb, v.ub) for v in built.model.vars] == before and built.solved is None
    assert plan is not None and plan.fits()
    assert (plan.weight_prefetch_depth, plan.act_prefetch_depth) == (dw, da)
    exact = _exact_at(monkeypatch, costs, hw, dw, da)
    assert plan.predicted_step_time_s >= exact.predicted_step_time_s * (1 - 1e-9)   # a plan of the pair's space
    _assert_keeps_what_the_lp_takes_whole(plan, union, point)


def test_rens_with_everything_fixed_returns_that_plan(monkeypatch):
    """A point that is itself a plan (the exact optimum's variable values): the neighbourhood is that
    plan alone, and _rens returns it."""
    costs, hw = _random_instance(8, 4)
    union, _, _, point = _union_solution(costs, hw)
    exact = _exact_at(monkeypatch, costs, hw, 1, 1)
    built = milp.build(costs, hw)
    values = list(point)
    for var, value in milp._start_values(exact, union):
        values[var.idx] = value
    plan = milp._rens(built, union, values, costs, hw, 1e-2, 60.0, 1000)
    assert _decisions(plan) == _decisions(exact)


def _split_case(case):
    """(costs, hardware, build keywords) of a split test's case: an exhaustive-test case (every
    layer may be resident) or "random" (8 layers, seed 7)."""
    if case == "random":
        costs, hw = _random_instance(8, 7)
        return costs, hw, {}
    num_layers, seed, dev, host, nvme, bw = case
    costs = instance(num_layers, seed)
    return costs, hardware_for(costs, dev, host, nvme, bw), dict(max_segment_length=4, max_resident_tail=num_layers)


@pytest.mark.parametrize("start", ["scratch", "basis", "basis, capped"])
@pytest.mark.parametrize("case", [CASES[0], CASES[2], "random"])
def test_depth_split_bounds_each_weight_depth_and_raises_the_union_lp(monkeypatch, case, start):
    """Each half's bound lies between the union LP and every plan at that weight depth, from
    scratch (the interior point) and from the union LP's basis (dual simplex, ``_hot_lp``): both
    give the same bounds (the interior point's at most its gap below), and where the simplex
    iterations run out the halves are solved from scratch instead, with the scratch values."""
    costs, hw, kw = _split_case(case)
    union, arrays, value, _ = _union_solution(costs, hw, **kw)
    scratch, _ = milp._depth_split(union, arrays)
    if start == "scratch":
        bounds, points = scratch, milp._depth_split(union, arrays)[1]
    else:
        basis, vertex = [], []
        vertex_value = milp._highs_solve(arrays, vertex, basis)
        assert len(basis) == 1 and basis[0].valid
        assert value <= vertex_value <= value + 2 * milp.IPM_GAP * (1 + abs(value))
        if start == "basis, capped":
            monkeypatch.setattr(milp, "HOT_ITERATIONS", 1e-9)   # one iteration: never enough here
        ends, early = {}, {1: milp.concurrent.futures.Future(), 2: milp.concurrent.futures.Future()}
        bounds, points = milp._depth_split(union, arrays, basis, ends, early)
        for dw in (1, 2):   # each half's first bound: at most its value; from the cap, at least the union LP's
            first = early[dw].result()
            assert first() <= bounds[dw] + 1e-9 * (1 + abs(bounds[dw]))
            if start == "basis":
                assert first() == bounds[dw]
            elif math.isfinite(bounds[dw]):
                cutoff = bounds[dw] * 1.5
                assert value - 1e-6 * abs(value) <= first(cutoff) <= bounds[dw] + 1e-9 * (1 + abs(bounds[dw]))
        # the halves that ended from the basis are marked: both (where feasible), none when capped
        vertices = set(ends)
        assert vertices == (set() if start == "basis, capped" else {dw for dw in (1, 2) if math.isfinite(bounds[dw])})
        for dw in (1, 2):
            if start == "basis, capped":
                assert bounds[dw] == scratch[dw]
            elif math.isfinite(scratch[dw]):
                assert scratch[dw] <= bounds[dw] <= scratch[dw] + 2 * milp.IPM_GAP * (1 + abs(scratch[dw]))
            else:
                assert bounds[dw] == scratch[dw]
    assert set(bounds) == {1, 2} and set(points) <= {1, 2}
    for dw in (1, 2):
        assert bounds[dw] >= value - 1e-6 * abs(value)
        for da in (1, 2):
            exact = _exact_at(monkeypatch, costs, hw, dw, da, **kw)
            if exact is not None:
                assert bounds[dw] <= exact.predicted_step_time_s * (1 + 1e-7)
        if dw in points:  # the solution is at that depth
            assert points[dw][union.depth_indicators[0].idx] == pytest.approx(dw - 1, abs=1e-9)


@pytest.mark.parametrize("case", [CASES[0], CASES[2], "random"])
def test_hot_halves_reach_the_same_optima_by_devex_and_by_steepest_edge(monkeypatch, case):
    """``HOT_EDGE_WEIGHTS`` only chooses the dual simplex's pricing: from the union LP's basis each
    half of the depth split ends at the same optimum by Devex (1) as by HiGHS' default, dual
    steepest edge (-1), both at a vertex reached from that basis."""
    costs, hw, kw = _split_case(case)
    union, arrays, _, _ = _union_solution(costs, hw, **kw)
    basis = []
    milp._highs_solve(arrays, [], basis)
    found = {}
    for weights in (1, -1):
        monkeypatch.setattr(milp, "HOT_EDGE_WEIGHTS", weights)
        ends = {}
        bounds, _ = milp._depth_split(union, arrays, basis, ends)
        found[weights] = bounds
        assert set(ends) == {dw for dw in (1, 2) if math.isfinite(bounds[dw])}   # neither fell back
    for dw in (1, 2):
        if math.isfinite(found[-1][dw]):
            assert found[1][dw] == pytest.approx(found[-1][dw], rel=1e-9, abs=1e-12)
        else:
            assert found[1][dw] == found[-1][dw]


def _random_lp(rng, rows=12, cols=10):
    """A bounded, feasible random LP as ``_highs_arrays`` writes one: covering rows (A x ≥ b, A ≥ 0)
    over nonnegative costs, every other column's ceiling infinite; costless columns with an
    infinite ceiling that only a row x_j − x_k ≤ 0 (x_k's ceiling finite) bounds; one equality row."""
    import scipy.sparse
    a = rng.uniform(0, 1, (rows, cols)) * (rng.uniform(size=(rows, cols)) < 0.5)
    a[:, 2] = rng.uniform(0.5, 1, rows)   # column 2 (costed, no ceiling) covers every row: feasible
    b = rng.uniform(0.5, 2.0, rows)
    cost = rng.uniform(0, 1, cols) * (rng.uniform(size=cols) < 0.8)
    cost[2] = 1.0
    upper = numpy.where(numpy.arange(cols) % 2 == 0, numpy.inf, rng.uniform(1, 3, cols))
    free = [j for j in range(cols) if cost[j] == 0 and upper[j] == numpy.inf]
    extra = []
    for j in free:   # x_j − x_k ≤ 0 with x_k's ceiling finite
        k = next(k for k in range(cols) if upper[k] < numpy.inf)
        row = numpy.zeros(cols)
        row[j], row[k] = 1.0, -1.0
        extra.append(row)
    a_ub = numpy.vstack([-a] + extra) if extra else -a
    b_ub = numpy.concatenate([-b, numpy.zeros(len(extra))])
    a_eq = numpy.zeros((1, cols))
    a_eq[0, [1, 3]] = 1.0   # x_1 + x_3 = 1 (their ceilings at least 1)
    bounds = numpy.stack([numpy.zeros(cols), upper], axis=1)
    return cost, dict(A_ub=scipy.sparse.csr_matrix(a_ub), b_ub=b_ub, A_eq=scipy.sparse.csr_matrix(a_eq),
                      b_eq=numpy.ones(1), bounds=bounds), 0.25


def test_dual_bound_by_hand():
    """``_dual_bound`` on min x0 + 0.25 s.t. x0 ≥ 1, x1 − x2 ≤ 0, x1 ≥ 0.5, x0, x1 ≥ 0 without a
    ceiling, x2 ∈ [0, 1] (optimum 1.25), from the duals (−2, 3, −1): the wrong-signed 3 counts as 0;
    x0's reduced cost −1 presses on its open ceiling, which an objective at most the cutoff 1.5
    caps at 1.25; x1's (−1) on the ceiling x1 ≤ x2 ≤ 1 implies: 2 − 1.25 + 0.5 − 1 + 0.25 = 0.5.
    Without a cutoff, x0 has no ceiling: -inf."""
    import scipy.sparse
    a_ub = scipy.sparse.csr_matrix(numpy.array([[-1.0, 0, 0], [0, 1.0, -1.0], [0, -1.0, 0]]))
    problem = (numpy.array([1.0, 0, 0]), dict(A_ub=a_ub, b_ub=numpy.array([-1.0, 0, -0.5]), A_eq=None, b_eq=None,
                                               bounds=numpy.array([[0, numpy.inf], [0, numpy.inf], [0, 1.0]])), 0.25)
    rows = milp._highs_rows(problem)
    y = numpy.array([-2.0, 3.0, -1.0])
    assert milp._dual_bound(problem, rows, y, 1.5) == pytest.approx(0.5, abs=1e-8)
    assert milp._dual_bound(problem, rows, y) == -math.inf
    assert milp._dual_bound(problem, rows, numpy.array([-1.0, 0.0, 0.0])) == pytest.approx(1.25, abs=1e-8)  # optimal


@pytest.mark.parametrize("seed", range(6))
def test_dual_bound_is_a_bound_for_any_duals_and_the_optimum_at_the_optimal_ones(seed):
    """``_dual_bound``: at HiGHS' optimal row duals it is the LP's optimum; from any row duals
    (random ones, of either sign) and any cutoff it is at most the optimum; open columns are
    bounded by their rows or, with a cutoff, by the objective."""
    rng = numpy.random.default_rng(seed)
    problem = _random_lp(rng)
    cost, args, const = problem
    rows = milp._highs_rows(problem)
    h = milp._highs_model(cost, rows, args["bounds"][:, 0], args["bounds"][:, 1], None, {"solver": "simplex"})
    h.run()
    assert h.getModelStatus() == milp._highs_object().HighsModelStatus.kOptimal
    optimum = h.getInfo().objective_function_value + const
    duals = numpy.array(h.getSolution().row_dual)
    assert milp._dual_bound(problem, rows, duals) == pytest.approx(optimum, rel=1e-7)
    assert milp._dual_bound(problem, rows, duals, optimum * 2) == pytest.approx(optimum, rel=1e-7)
    assert milp._dual_bound(problem, rows, duals, optimum * 0.9) == optimum * 0.9   # the cutoff, lower
    finite = 0
    for _ in range(200):
        y = duals + rng.normal(0, rng.choice([1e-6, 1e-2, 1.0]), len(duals))
        for cutoff in (math.inf, optimum * rng.uniform(0.8, 3.0)):
            bound = milp._dual_bound(problem, rows, y, cutoff)
            assert bound <= optimum + 1e-12
            finite += math.isfinite(bound)
    assert finite > 100   # the open columns' ceilings make most of them finite


@pytest.mark.parametrize("firsts,plan,waited,union", [
    ((10.12, 10.2), None, False, 10.12),     # the halves' first bounds prove the 10.2 s incumbent
    ((10.12, 10.05), None, True, 10.08),     # one half's does not: its end is waited for
    ((10.05, 10.12), 10.15, False, 10.05),   # they prove a faster plan about to replace the incumbent
])
def test_join_depth_split_proves_from_the_halves_first_bounds(firsts, plan, waited, union):
    """``_Solve.join_depth_split``: each half's first bound (``depth_early``, a function of the best
    plan's value) is taken where the lower of them proves the best plan, without waiting for the
    halves' ends; otherwise the split's values (here 10.08 and 10.3) are joined as before."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.cutoff, run.weights, run.depth_bounds = 1e-2, 10.0, None, [1, 2], {}
    run.depth_ends, run.stats, run.deadline = {}, {"lp_s": 0.0}, math.inf
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.2)
    asked = []

    def first(value):
        def bound(cutoff=math.inf):
            asked.append(cutoff)
            return value
        return bound
    run.depth_early = {}
    for dw, value in zip((1, 2), firsts):
        run.depth_early[dw] = milp.concurrent.futures.Future()
        run.depth_early[dw].set_result(first(value))
    ended = milp.concurrent.futures.Future()
    ended.set_result((({1: 10.08, 2: 10.3}, {}), 0.5))
    run.depth_split = types.SimpleNamespace(result=lambda: (calls.append("end"), ended.result())[1])
    calls = []
    run.join_depth_split(None if plan is None else types.SimpleNamespace(predicted_step_time_s=plan))
    assert calls == (["end"] if waited else [])
    assert run.union == pytest.approx(union)
    assert set(asked) == {plan or 10.2}   # each asked with the best plan's value as its cutoff
    if waited:   # one does not prove: the other may not be asked (taken in the order they end)
        assert 1 <= len(asked) <= 2
    else:
        assert len(asked) == 2
    assert bool(run.depth_bounds) == waited


@pytest.mark.parametrize("ended_bound,waits", [(10.05, False), (10.12, True)])
def test_depth_split_proves_early_stops_at_the_first_half_that_does_not_prove(ended_bound, waits):
    """``_Solve.depth_split_proves_early`` takes the halves' first bounds in the order they end:
    one half's bound below what the plan needs ends the wait (False) while the other half still
    runs; one that proves leaves the wait on the other."""
    import threading
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.cutoff, run.weights, run.depth_bounds = 1e-2, 10.0, None, [1, 2], {}
    run.depth_split, run.deadline = types.SimpleNamespace(), math.inf
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.2)   # needs a bound of 10.098 s
    run.depth_early = {1: milp.concurrent.futures.Future(), 2: milp.concurrent.futures.Future()}
    run.depth_early[2].set_result(lambda cutoff=math.inf: ended_bound)   # the depth-1 half still runs
    answer = []
    waiting = threading.Thread(target=lambda: answer.append(run.depth_split_proves_early()), daemon=True)
    waiting.start()
    if not waits:
        waiting.join(5.0)
        assert answer == [False] and run.union == 10.0
    else:
        waiting.join(0.5)
        assert waiting.is_alive() and answer == []
        run.depth_early[1].set_result(lambda cutoff=math.inf: 10.15)
        waiting.join(5.0)
        assert answer == [True] and run.union == pytest.approx(10.12)


def _least_over_tail_counts(union, half):
    """The least over k of the half's LP with the resident-tail indicators fixed at k (the last k
    at 1), each solved to its optimum."""
    cost, args, const = half
    tail = [var.idx for _, var in sorted(union.r.items())]
    least = math.inf
    for k in range(len(tail) + 1):
        bounds = args["bounds"].copy()
        for i, j in enumerate(tail):
            bounds[j] = 1.0 if i >= len(tail) - k else 0.0
        least = min(least, milp._highs_solve((cost, {**args, "bounds": bounds}, const)))
    return least


@pytest.mark.parametrize("case", [CASES[0], CASES[2], "random"])
def test_tail_split_rules_out_a_half_below_its_least_lp_over_the_resident_count(monkeypatch, case):
    """``_tail_split`` rules a half out (True) for a bar below the least over k of its LPs with the
    resident tail fixed at k, and not for one above it; that least is at most every plan at the
    half's weight depth (exact optima by CBC), and at least the half's own LP."""
    costs, hw, kw = _split_case(case)
    union, arrays, _, _ = _union_solution(costs, hw, **kw)
    assert union.r  # a resident tail to split on
    basis = []
    milp._highs_solve(arrays, [], basis)
    bounds, points = milp._depth_split(union, arrays, basis)
    for dw in (1, 2):
        least = _least_over_tail_counts(union, milp._half_problem(union, arrays, dw))
        if math.isfinite(bounds[dw]):
            assert least >= bounds[dw] - 1e-6 * (1 + abs(bounds[dw]))
        else:  # the half is infeasible, and so at every count
            assert least == math.inf
        for da in (1, 2):
            exact = _exact_at(monkeypatch, costs, hw, dw, da, **kw)
            if exact is not None:
                assert least <= exact.predicted_step_time_s * (1 + 1e-7)
        if not math.isfinite(least):  # no plan at this depth: any bar is ruled out
            assert milp._tail_split(union, arrays, basis[0], dw, 1e9, points.get(dw))
            continue
        if case == CASES[2] and dw == 1:  # the half keeps part of its tail resident: the split raises it
            assert least > bounds[dw] * (1 + 3e-3)
        assert milp._tail_split(union, arrays, basis[0], dw, least * (1 - 1e-3), points.get(dw))
        assert not milp._tail_split(union, arrays, basis[0], dw, least * (1 + 1e-3), points.get(dw))


@pytest.mark.parametrize("plan,proved,cutoff", [(2.3636, True, None), (2.3700, False, None), (2.3636, False, 2.3636)])
def test_tail_split_proves_a_plan_whose_bar_every_half_clears(plan, proved, cutoff):
    """``_Solve.tail_split`` on a 5-layer instance whose weight-depth-1 half (2.3350 s) keeps part
    of its tail resident, its least LP over the resident count 2.3427 s; the depth-2 half is
    2.3538 s. A plan of 2.3636 s (bar 2.3400 s at 1 %) is proved: the depth-1 half is ruled out
    by the split, the depth-2 half by its own bound. At 2.3700 s (bar 2.3463 s) the depth-1 half
    stays open and nothing changes; nor where the plan does not beat the cutoff."""
    costs, hw, kw = _split_case(CASES[2])
    union, arrays, value, point = _union_solution(costs, hw, **kw)
    basis = []
    milp._highs_solve(arrays, [], basis)
    bounds, points = milp._depth_split(union, arrays, basis)
    assert bounds[1] < plan * 0.99 <= bounds[2]
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.cutoff, run.direct, run.deadline, run.t0 = 1e-2, cutoff, True, math.inf, 0.0
    run.union_built, run.arrays, run.union_basis, run.union_point = union, arrays, basis, [point]
    run.union, run.weights, run.stats = min(bounds.values()), [1, 2], {"lp_s": 0.0, "lp_solves": 0}
    run.depth_bounds, run.depth_points = dict(bounds), points
    run.depth_split = run.offload_split = None
    run.tail_proof = run.tail_split_for = None
    run.depth_ends = {}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=plan,
                                          replace=lambda **kw: types.SimpleNamespace(predicted_step_time_s=plan, **kw))
    run.tail_split()
    if proved:
        assert run.tail_proof is not None and run.tail_proof.gap == 1e-2
        assert run.tail_proof.solver_status == "optimal" and run.stats["proof"] == "tail_split"
        assert run.depth_bounds[1] == pytest.approx(plan * 0.99)
    else:
        assert run.tail_proof is None and run.depth_bounds == bounds
    ran = 0 if cutoff is not None else 1  # the depth-1 half only
    assert run.stats["lp_solves"] == ran
    run.tail_split()  # once per incumbent
    assert run.stats["lp_solves"] == ran


@pytest.mark.parametrize("num_layers,seed,dev,host,nvme,bw", SPLIT_CASES[:3])
def test_offload_split_gain_bounds_what_the_split_can_raise(num_layers, seed, dev, host, nvme, bw):
    """The "no residual on the host" branch of the split (the split is at most it) lies within the
    estimated gain of the LP; and the estimate is positive where the LP offloads."""
    costs = instance(num_layers, seed)
    hw = hardware_for(costs, dev, host, nvme, bw)
    union, arrays, value, point = _union_solution(costs, hw, max_segment_length=4, max_resident_tail=num_layers)
    gain = milp._offload_split_gain(union, [point], costs)
    cost, args, const = arrays
    bounds = args["bounds"].copy()
    bounds[[v.idx for v in union.off.values()], 1] = 0.0
    none = milp._highs_solve((cost, {**args, "bounds": bounds}, const))
    assert sum(point[v.idx] for v in union.off.values()) > 1e-3 and gain > 0
    assert none <= value + gain + 1e-7 * abs(value)
    assert milp._offload_split(union, arrays) <= value + gain + 1e-7 * abs(value)


@pytest.mark.parametrize("num_layers,seed", [(16, 7), pytest.param(16, 9, marks=pytest.mark.slow)])
def test_large_model_path_with_the_lp_neighbourhoods(monkeypatch, num_layers, seed):
    """The large-model path with the union LP solved by HiGHS (so that its solution is there for
    _rens), every start counted as far (neighbourhoods before the searches): the plan is within
    rel_gap of the exact optimum, its bound valid, the same plan twice; _rens ran, for at most
    ``RENS_MAX_NODES`` nodes (fewer than the solve's own ``max_nodes``)."""
    costs, hw = _random_instance(num_layers, seed)
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    optimum = milp.solve(costs, hw, rel_gap=0.0).predicted_step_time_s
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "HIGHS_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "UNION_SEARCH_GAPS", 0.0)
    nodes, rens = [], milp._rens
    monkeypatch.setattr(milp, "_rens", lambda *a: nodes.append(a[7]) or rens(*a))
    plans = []
    for _ in range(2):
        stats = {}
        plans.append(milp.solve(costs, hw, rel_gap=1e-2, stats=stats))
        assert stats["rens_runs"] >= 1
    assert nodes and max(nodes) <= milp.RENS_MAX_NODES < milp.DEFAULT_MAX_NODES
    p = plans[0]
    assert _decisions(p) == _decisions(plans[1])
    assert p.fits() and p.solver_status == "optimal" and p.gap <= 1e-2 * (1 + 1e-9)
    assert optimum - 1e-9 <= p.predicted_step_time_s <= optimum / (1 - 1e-2) + 1e-9
    assert p.predicted_step_time_s * (1 - p.gap) <= optimum * (1 + 1e-9)


def _all_host_plan_and_lp(seed):
    """An 8-layer random instance, its depths-(1, 1) model and that model's LP solution, and a plan
    that fits but is not the best: every interior boundary on the host."""
    from lazytrain_jax.schedule.plan import Plan
    costs, hw = _random_instance(8, seed)
    built = milp.build(costs, hw)
    point = []
    milp._highs_solve(milp._highs_arrays(built.model), point)
    plan = Plan.create(costs, hw, name="host", boundary_tiers=["device"] + ["host"] * 7 + ["device"])
    assert plan.fits() and milp._start_values(plan, built)
    return costs, hw, built, point[0], plan


@pytest.mark.parametrize("seed", [4, 7])
def test_rins_keeps_what_the_plan_and_the_lp_agree_on_and_never_loses_the_plan(monkeypatch, seed):
    costs, hw, built, point, plan = _all_host_plan_and_lp(seed)
    before = [(v.lb, v.ub) for v in built.model.vars]
    found = milp._rins(built, plan, point, costs, hw, 1e-9, 60.0, 10_000)
    assert [(v.lb, v.ub) for v in built.model.vars] == before and built.solved is None
    assert found is not None and found.fits()
    exact = _exact_at(monkeypatch, costs, hw, 1, 1)
    # the plan itself is in the neighbourhood, solved exactly here: never worse than it
    assert exact.predicted_step_time_s * (1 - 1e-9) <= found.predicted_step_time_s
    assert found.predicted_step_time_s < plan.predicted_step_time_s * (1 - 1e-3)
    chosen, kept = set(memory.segments(plan.boundary_tiers)), set(memory.segments(found.boundary_tiers))
    for edge, var in built.x.items():
        if abs(point[var.idx] - (edge in chosen)) < milp.RINS_TOLERANCE:
            assert (edge in kept) == (edge in chosen)


@pytest.mark.parametrize("seed", [4, 7])
def test_window_neighbourhood_changes_only_its_window_and_never_loses_the_plan(monkeypatch, seed):
    monkeypatch.setattr(milp, "WINDOW_LAYERS", 4)
    costs, hw, built, point, plan = _all_host_plan_and_lp(seed)
    windows = milp._windows(built, plan, point)
    assert sorted(windows) == [(0, 4), (2, 6), (4, 8)]
    exact = _exact_at(monkeypatch, costs, hw, 1, 1)
    improved = False
    for lo, hi in windows:
        before = [(v.lb, v.ub) for v in built.model.vars]
        found = milp._window_neighbourhood(built, plan, (lo, hi), costs, hw, 1e-9, 60.0, 10_000)
        assert [(v.lb, v.ub) for v in built.model.vars] == before and built.solved is None
        assert found is not None and found.fits()
        assert exact.predicted_step_time_s * (1 - 1e-9) <= found.predicted_step_time_s
        assert found.predicted_step_time_s <= plan.predicted_step_time_s * (1 + 1e-9)  # the plan is in it
        improved |= found.predicted_step_time_s < plan.predicted_step_time_s * (1 - 1e-6)
        # outside the window nothing moves: the boundaries below lo and above hi keep their tiers
        for i in list(range(0, lo)) + list(range(hi + 1, 9)):
            assert found.boundary_tiers[i] == plan.boundary_tiers[i]
        for l in list(range(0, lo)) + list(range(hi + 1, 8)):
            assert found.keep_residuals[l] == plan.keep_residuals[l]
    assert improved


def test_leaning_orders_pairs_of_the_same_weight_by_the_tie():
    """Pairs the union LP's solution weighs the same (a vertex at y = 0) follow ``tie``, smaller
    first; without it, ``depths``' order."""
    y_w, y_a = (types.SimpleNamespace(idx=0), types.SimpleNamespace(idx=1))
    union = types.SimpleNamespace(depth_indicators=(y_w, y_a))
    depths = ((1, 1), (2, 1), (1, 2), (2, 2))
    assert milp._leaning([0.0, 0.0], union, depths) == [(1, 1), (2, 1), (1, 2), (2, 2)]
    bounds = {1: 40.61, 2: 40.68}   # weight depth 1's half is lower
    assert milp._leaning([0.0, 0.0], union, depths, lambda d: bounds[d[0]]) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    # a fractional share still comes first, whatever the tie
    assert milp._leaning([0.6, 0.0], union, depths, lambda d: bounds[d[0]]) == [(2, 1), (1, 1), (1, 2), (2, 2)]


def test_a_halfs_vertex_gives_way_to_its_interior_point(monkeypatch):
    """``_Solve.half_point``: where the depth split ended a half at the vertex reached from the union
    LP's basis, its interior point (the split's solution from scratch) is solved once and then
    kept; a half the split solved from scratch (here the depth-2 half, past ``HOT_ITERATIONS``)
    keeps its own point."""
    # 27 iterations on this model's 276 rows: its depth-1 half takes 12 by Devex, its depth-2 half 44
    monkeypatch.setattr(milp, "HOT_ITERATIONS", 0.1)
    num_layers, seed, dev, host, nvme, bw = CASES[1]
    costs = instance(num_layers, seed)
    union, arrays, _, _ = _union_solution(costs, hardware_for(costs, dev, host, nvme, bw), max_segment_length=4,
                                          max_resident_tail=num_layers)
    basis = []
    milp._highs_solve(arrays, [], basis)
    _, interior_points = milp._depth_split(union, arrays)
    ends = {}
    _, points = milp._depth_split(union, arrays, basis, ends)
    vertices = set(ends)
    assert vertices == {1} and set(points) == {1, 2}
    assert not numpy.allclose(points[1], interior_points[1])       # the vertex is not the interior point
    assert numpy.array_equal(points[2], interior_points[2])         # solved from scratch: the same point
    run = milp._Solve.__new__(milp._Solve)
    run.union_built, run.arrays, run.stats = union, arrays, {"lp_s": 0.0, "lp_solves": 0}
    run.depth_points, run.depth_vertices, run.deadline = dict(points), set(vertices), math.inf
    for dw in (1, 1, 2):
        point = run.half_point(dw)
        assert point is run.depth_points[dw] and numpy.array_equal(point, interior_points[dw])
    assert run.stats["lp_solves"] == 1 and run.depth_vertices == set()   # the vertex's half once, then kept


@pytest.mark.parametrize("vertex_plan,vertex_half,enabled,retried", [
    (10.40, True, True, False),    # within HALF_RETRY_GAPS (5 %) of the half's 10.0: kept
    (10.60, True, True, True),     # beyond: _rens again at the same pair, from the interior point
    (None, True, True, True),      # no plan from the vertex: again
    (10.60, False, True, False),   # the half's point is already its interior point
    (10.60, True, False, False),   # HALF_INTERIOR off
])
def test_rens_runs_again_from_a_halfs_interior_point_where_its_vertex_gave_a_far_plan(
        monkeypatch, vertex_plan, vertex_half, enabled, retried):
    """``_Solve.rens_from_interior``: after ``_rens`` from a half's vertex gave no plan or one more
    than ``HALF_RETRY_GAPS`` rel_gaps above the half's bound, ``_rens`` runs again at the same
    depth pair from the half's interior point (``half_point``), and its plan replaces a slower
    incumbent."""
    monkeypatch.setattr(milp, "HALF_INTERIOR", enabled)
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff = 1e-2, 9.0, math.inf, None
    run.depth_bounds, run.depth_vertices = {2: 10.0}, ({2} if vertex_half else set())
    run.prebuilt = {(2, 1): "model at (2, 1)"}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.5)
    calls = []
    monkeypatch.setattr(run, "half_point", lambda dw: f"interior point of {dw}", raising=False)
    monkeypatch.setattr(run, "rens_at", lambda built, point: calls.append((built, point)) or
                        types.SimpleNamespace(predicted_step_time_s=10.2), raising=False)
    plan = None if vertex_plan is None else types.SimpleNamespace(predicted_step_time_s=vertex_plan)
    run.rens_from_interior(2, (2, 1), plan)
    assert calls == ([("model at (2, 1)", "interior point of 2")] if retried else [])
    assert run.incumbent.predicted_step_time_s == (10.2 if retried else 10.5)


@pytest.mark.parametrize("found,proved", [(None, False), (10.6, False), (10.05, True)])
def test_rens_runs_again_from_the_union_lps_interior_point_once(monkeypatch, found, proved):
    """``_Solve.union_interior_retry``: ``_rens`` from the union LP's interior point (not its vertex,
    ``union_point``), at the pair that point leans to, once; a faster plan replaces the incumbent,
    and the union LP's proof of it is returned. Nothing where the union LP's point is already its
    interior point (no basis)."""
    num_layers, seed, dev, host, nvme, bw = CASES[1]
    costs = instance(num_layers, seed)
    hw = hardware_for(costs, dev, host, nvme, bw)
    union = milp.build(costs, hw, union=True, max_segment_length=4, max_resident_tail=num_layers)
    arrays = milp._highs_arrays(union.model)
    vertex, basis, interior = [], [], []
    lp = milp._highs_solve(arrays, vertex, basis)
    milp._highs_solve(arrays, interior)
    assert basis and not numpy.allclose(vertex[0], interior[0])
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff, run.depths = 1e-2, 10.0, math.inf, None, milp.MILP_DEPTHS
    run.union_built, run.arrays, run.union_point, run.union_basis = union, arrays, vertex, basis
    run.interior_retried, run.stats, run.depth_bounds = False, {"lp_s": 0.0, "lp_solves": 0}, {}
    run.incumbent = start = types.SimpleNamespace(predicted_step_time_s=10.3)
    calls = []

    def rens_at(built, point, tail=False):
        calls.append((built, point, tail))
        return None if found is None else types.SimpleNamespace(predicted_step_time_s=found)
    monkeypatch.setattr(run, "rens_at", rens_at, raising=False)
    monkeypatch.setattr(run, "model_at", lambda d: d, raising=False)
    assert run.union_interior_retry() is proved
    assert run.union_interior_retry() is False    # once
    [(pair, point, tail)] = calls
    assert numpy.array_equal(point, interior[0]) and tail
    assert pair == milp._leaning(interior[0], union, milp.MILP_DEPTHS)[0]
    assert run.incumbent.predicted_step_time_s == (found if found is not None and found < 10.3 else 10.3)
    assert math.isfinite(lp)
    run.interior_retried, run.union_basis, run.incumbent = False, [], start
    assert run.union_interior_retry() is False and len(calls) == 1    # no vertex: nothing to retry


@pytest.mark.parametrize("one_pair,roots_settle,retry_proves,expected,order", [
    (False, True, None, "highs", ["roots"]),             # the roots prove the plan: no retry
    (False, False, True, "retry", ["roots", "retry"]),   # they do not: the retry proves it
    (False, False, False, None, ["roots", "retry"]),     # neither: unproved, carried on
    # the union LP's vertex all on one depth pair: the retry first, the roots where it proves nothing
    (True, True, True, "retry", ["retry"]),
    (True, True, False, "highs", ["retry", "roots"]),
    (True, False, False, None, ["retry", "roots"]),      # once
    # the roots rule out half 1 only; the retry's faster plan (10.15 s) clears half 2's own bound
    # (10.05 s) by rel_gap, so the halves prove it
    (False, {1: True, 2: False}, "faster", "highs", ["roots", "retry"]),
])
def test_settle_retries_from_the_interior_point_where_the_roots_leave_the_plan_open(
        monkeypatch, one_pair, roots_settle, retry_proves, expected, order):
    """``_Solve.settle``: HiGHS' roots on the open halves, and ``union_interior_retry`` where they
    leave the incumbent unproved, or before them where the union LP's vertex puts all its weight on
    one depth pair (``vertex_on_one_pair``); the proof of either returned."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff, run.direct = 1e-2, 10.0, math.inf, None, True
    run.weights, run.depths, run.depth_bounds, run.rooted = [1, 2], milp.MILP_DEPTHS, {1: 10.0, 2: 10.05}, None
    run.pair_bounds = {}
    run.union_built, run.arrays, run.pair_proof, run.tail_proof = None, None, None, None
    run.stats, run.t0 = {"bb_s": 0.0, "bb_runs": 0}, 0.0
    plan = types.SimpleNamespace(predicted_step_time_s=10.3, replace=lambda **kw: ("proved", kw.get("gap")))
    run.incumbent = plan
    for name in ("join_splits", "start_offload_split", "pair_lps", "tail_split"):
        monkeypatch.setattr(run, name, lambda *a: None, raising=False)
    steps = []

    def half_roots(union, arrays, bar, halves, rel_gap, left):
        steps.append("roots")
        return {dw: roots_settle[dw] if isinstance(roots_settle, dict) else roots_settle for dw in halves}
    monkeypatch.setattr(milp, "_half_roots", half_roots)

    def retry():
        if "retry" in steps:
            return False
        steps.append("retry")
        if retry_proves == "faster":
            run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.15, replace=plan.replace)
            return False
        if retry_proves:
            run.union = 10.25
        return bool(retry_proves)
    monkeypatch.setattr(run, "union_interior_retry", retry, raising=False)
    monkeypatch.setattr(run, "vertex_on_one_pair", lambda: one_pair, raising=False)
    result = run.settle()
    assert steps == order
    assert run.stats.get("proof") == {"highs": "highs", "retry": "union_lp", None: None}[expected]
    assert (result is None) == (expected is None)


def _settle_run(monkeypatch, *, cutoff, pair_bounds, depth_bounds, union):
    """A ``_Solve`` ready for ``settle`` (incumbent 10.3 s, rel_gap 1 %), its other steps no-ops."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff, run.direct = 1e-2, union, math.inf, cutoff, True
    run.weights, run.depths, run.depth_bounds, run.rooted = [1, 2], milp.MILP_DEPTHS, dict(depth_bounds), None
    run.pair_bounds, run.prebuilt, run.costs, run.hardware = dict(pair_bounds), {}, None, None
    run.union_built, run.arrays, run.pair_proof, run.tail_proof = None, None, None, None
    run.stats, run.t0 = {"bb_s": 0.0, "bb_runs": 0}, 0.0
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.3,
                                          replace=lambda **kw: ("proved", kw.get("solver_status")))
    for name in ("join_splits", "start_offload_split", "pair_lps", "tail_split"):
        monkeypatch.setattr(run, name, lambda *a: None, raising=False)
    monkeypatch.setattr(run, "vertex_on_one_pair", lambda: False, raising=False)
    monkeypatch.setattr(run, "build_at", lambda dw, da: types.SimpleNamespace(
        weight_prefetch_depth=dw, act_prefetch_depth=da, solved=None), raising=False)
    monkeypatch.setattr(milp, "_half_roots", lambda *a: pytest.fail("the halves' roots, where a pair's were due"))
    return run


@pytest.mark.parametrize("union,proof", [(9.9, "highs"), (10.0, "union_lp")])
def test_settle_roots_the_open_pairs_and_keeps_the_plan_a_root_finds(monkeypatch, union, proof):
    """Where the depth pairs' own LPs (``pair_lps``) leave one pair open in each open half, HiGHS'
    root runs on those two pairs' own models (``_pair_roots``, the deeper pair first), not on the
    halves; a plan a root finds below the bar becomes the incumbent as that root's result is taken,
    and the bounds prove it. With the
    union LP at 9.9 s, not by it (2 % below): the other pair's root found none below the bar, so its
    half is ruled out there, and the found plan's own half by its pairs' LPs. With the union LP at
    10.0 s it proves the plan (within 1 %) as soon as the root returns it: the roots still running
    are then stopped (``enough`` says so)."""
    run = _settle_run(monkeypatch, cutoff=None, union=union, depth_bounds={1: 10.0, 2: 10.02},
                      pair_bounds={(1, 1): 10.5, (1, 2): 10.0, (2, 1): 10.6, (2, 2): 10.02})
    rooted, bars, said = [], [], []
    found = types.SimpleNamespace(predicted_step_time_s=10.1, fits=lambda: True)

    def pair_roots(builts, bar, rel_gap, left, enough):
        rooted.extend((b.weight_prefetch_depth, b.act_prefetch_depth) for b in builts)
        bars.append(bar)
        none = milp.Solved(status=mip.OptimizationStatus.INFEASIBLE, objective_value=None,
                           objective_bound=math.inf, values=None)
        plan = milp.Solved(status=mip.OptimizationStatus.FEASIBLE, objective_value=10.1,
                           objective_bound=9.95, values=[1.0])
        said.append(enough(0, plan))   # the deeper pair's root, first in the pairs' order
        if not said[-1]:
            said.append(enough(1, none))
        return [plan, none]

    def decode(built, *a, **kw):
        assert built.solved.objective_value == 10.1 and (built.weight_prefetch_depth, built.act_prefetch_depth) == (2, 2)
        return found
    monkeypatch.setattr(milp, "_pair_roots", pair_roots)
    monkeypatch.setattr(milp, "decode", decode)
    monkeypatch.setattr(run, "union_interior_retry", lambda: pytest.fail("a retry after a proof"), raising=False)
    found.replace = lambda **kw: ("proved", kw.get("solver_status"))
    assert rooted == [] and run.settle() == ("proved", "optimal")
    assert rooted == [(2, 2), (1, 2)] and bars == [pytest.approx(10.3 * 0.99)]   # the deeper pair first
    assert run.incumbent is found and run.stats["proof"] == proof
    assert said == ([False, False] if proof == "highs" else [True])
    if proof == "highs":
        assert run.depth_bounds[1] == pytest.approx(10.3 * 0.99)   # ruled out at the first bar


@pytest.mark.parametrize("none_below", [True, False])
def test_settle_asks_the_roots_for_a_plan_rel_gap_below_a_cutoff_the_incumbent_misses(monkeypatch, none_below):
    """Where the incumbent does not beat the caller's cutoff (``lt.plan``'s solves after the
    first), the roots ask for a plan rel_gap faster than the cutoff. Where none exists on any open
    pair, settle returns None at once (no retry), every half's bound at that bar, so the per-depth
    phase rules out every pair; the incumbent is never proved, since it does not beat the cutoff."""
    run = _settle_run(monkeypatch, cutoff=10.2, union=9.9, depth_bounds={1: 10.0, 2: 10.02},
                      pair_bounds={(1, 1): 10.5, (1, 2): 10.0, (2, 1): 10.6, (2, 2): 10.02})
    bars, retried = [], []
    status = mip.OptimizationStatus.INFEASIBLE if none_below else mip.OptimizationStatus.NO_SOLUTION_FOUND

    def pair_roots(builts, bar, rel_gap, left, enough):
        bars.append(bar)
        return [milp.Solved(status=status, objective_value=None, objective_bound=9.9, values=None)] * len(builts)
    monkeypatch.setattr(milp, "_pair_roots", pair_roots)
    monkeypatch.setattr(run, "union_interior_retry", lambda: retried.append(1) or False, raising=False)
    assert run.settle() is None
    assert bars == [pytest.approx(10.2 * 0.99)]
    assert retried == ([] if none_below else [1])
    bar_reached = all(run.depth_bounds[dw] >= 10.2 * 0.99 * (1 - 1e-12) for dw in (1, 2))
    assert bar_reached is none_below


@pytest.mark.parametrize("y,basis,expected", [
    ((0.0, 1.0), True, True), ((1.0, 1.0), True, True), ((0.5, 1.0), True, False),
    ((0.0, 0.03), True, False), ((0.0, 1.0), False, False)])
def test_a_vertex_on_one_depth_pair(y, basis, expected):
    """``_Solve.vertex_on_one_pair``: the union LP's point a vertex (a basis) whose depth indicators
    are all 0 or 1 (within ``RENS_TOLERANCE``)."""
    indicators = [types.SimpleNamespace(idx=0), types.SimpleNamespace(idx=1)]
    run = milp._Solve.__new__(milp._Solve)
    run.union_built = types.SimpleNamespace(depth_indicators=indicators)
    run.union_point, run.union_basis = [list(y)], (["basis"] if basis else [])
    assert run.vertex_on_one_pair() is expected


def test_a_halfs_point_goes_to_its_next_untried_pair(monkeypatch):
    """rens_in_union_phase takes the pair the point leans to most among those not yet tried, with
    the half's weight prefetch depth: a half whose point leans to the pair the union's point took
    gets its next pair of that half, not nothing."""
    run = milp._Solve.__new__(milp._Solve)
    run.rens_done, run.prebuilt, run.union_built, run.depths = set(), {}, None, milp.MILP_DEPTHS
    run.depth_bounds = {}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.0)
    tried = []

    def rens_at(built, point, tail=False):
        assert tail  # the union phase's neighbourhoods run the tail split for their plan
        run.rens_done.add(built)
        tried.append(built)
        return types.SimpleNamespace(predicted_step_time_s=9.0 if built == (2, 1) else 11.0)
    monkeypatch.setattr(run, "build_at", lambda dw, da: (dw, da), raising=False)
    monkeypatch.setattr(run, "rens_at", rens_at, raising=False)
    monkeypatch.setattr(milp, "_leaning", lambda point, built, depths, tie=None: [(2, 2), (1, 2), (2, 1), (1, 1)])
    run.rens_in_union_phase("union point")
    run.rens_in_union_phase("half point", 2)
    run.rens_in_union_phase("half point", 1)
    assert tried == [(2, 2), (2, 1), (1, 2)]
    assert run.incumbent.predicted_step_time_s == 9.0   # the faster plan replaced the incumbent
    run.rens_in_union_phase("half point", 2)
    run.rens_in_union_phase("half point", 1)
    run.rens_in_union_phase("half point", 2)
    assert tried == [(2, 2), (2, 1), (1, 2), (1, 1)]    # every pair once, then nothing more


def test_searches_skip_the_pairs_of_a_settled_half(monkeypatch):
    """The union phase's searches at the other depth pairs skip (1, 1) (the start's) and every
    pair whose weight depth's half of the union LP (``depth_bounds``) already rules out a plan
    rel_gap faster than the incumbent; the others run in the order the union LP leans to."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.cutoff, run.union, run.far = 1e-2, None, 9.0, None
    run.search_evaluations, run.deadline = 100, math.inf
    run.union_point, run.union_built, run.depths = ["union point"], None, milp.MILP_DEPTHS
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.0)
    run.depth_bounds = {1: 9.95, 2: 9.5}   # the bar is 9.9: weight depth 1 settled, 2 open
    searched = []
    monkeypatch.setattr(milp, "_leaning", lambda point, built, depths, tie=None: [(2, 2), (1, 2), (2, 1), (1, 1)])
    monkeypatch.setattr(run, "search_at", lambda dw, da: searched.append((dw, da)), raising=False)
    monkeypatch.setattr(run, "join_splits", lambda: None, raising=False)
    monkeypatch.setattr(run, "polish", lambda plan, quick=False: plan, raising=False)
    run.searches()
    assert searched == [(2, 2), (2, 1)]
    run.depth_bounds = {1: 9.0, 2: 9.0}    # neither settled: every pair but the start's
    searched.clear()
    run.searches()
    assert searched == [(2, 2), (1, 2), (2, 1)]


def test_systematic_rounding_spreads_the_ones_as_the_values_do():
    """``_systematic_rounding``: 0/1 values whose running sums are the values' running sums rounded
    down, so the ones fall as evenly as the values spread them."""
    assert milp._systematic_rounding([0.5] * 6) == [0, 1, 0, 1, 0, 1]
    assert milp._systematic_rounding([1 / 3] * 6) == [0, 0, 1, 0, 0, 1]
    assert milp._systematic_rounding([1.0, 0.0, 1.0, 0.0]) == [1, 0, 1, 0]
    assert milp._systematic_rounding([0.3, 0.3, 0.3]) == [0, 0, 0]
    rng = numpy.random.default_rng(3)
    values = rng.uniform(0, 1, 200)
    ones = numpy.cumsum(milp._systematic_rounding(values))
    assert numpy.array_equal(ones, numpy.floor(numpy.cumsum(values) + 1e-9))


@pytest.mark.parametrize("share,bounds,plans,tried,incumbent", [
    (0.8, {}, [None, 9.5, None, None], [], 10.0),           # too few offloads taken in part: not run
    (0.9, {}, [None, 9.5, 9.0, 9.2], [0, 1, 2, 3], 9.0),    # every pair in leaning order, the fastest kept
    (1.0, {}, [10.5, 9.0, 8.05, 7.0], [0, 1, 2], 8.05),     # none once the union LP proves the incumbent
    (1.0, {1: 9.95}, [None, 9.0, 9.5, 9.0], [0, 2], 9.5),   # nor where its half rules out a plan 1 % faster
])
def test_offload_pattern_runs_where_the_union_lp_offloads_in_part(monkeypatch, share, bounds, plans, tried,
                                                                  incumbent):
    """``_Solve.offload_pattern``: where the union LP takes at least ``PATTERN_MIN_SHARE`` of the
    residual offloads in part, ``_offload_pattern`` runs at each depth pair in the order the LP
    leans to (the first pair's plan need not be the best: qwen2.5-7b shape, H200, a third of the
    room, 128 layers), the fastest plan replacing a slower incumbent; it stops once the union LP
    (8.0 here) proves the incumbent, and skips a pair whose half of the union LP rules out a plan
    rel_gap faster than the incumbent."""
    order = [(2, 2), (1, 2), (2, 1), (1, 1)]
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.deadline, run.max_nodes, run.depths = 1e-2, math.inf, 300, milp.MILP_DEPTHS
    run.costs = run.hardware = run.cutoff = run.offload_split = None
    run.direct, run.union, run.pattern_done = True, 8.0, False
    run.stats = {"rens_s": 0.0, "rens_runs": 0}
    off = {l: f"off {l}" for l in range(10)}
    run.union_built = types.SimpleNamespace(off=off)
    run.union_point = ["union point"]
    run.depth_bounds, run.prebuilt = dict(bounds), {}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=10.0)
    monkeypatch.setattr(milp, "_fractional_offloads", lambda built, point: round(share * len(off)))
    monkeypatch.setattr(milp, "_leaning", lambda point, built, depths, tie=None: order)
    monkeypatch.setattr(run, "build_at", lambda dw, da: (dw, da), raising=False)
    calls = []

    def pattern(built, union_built, point, costs, hardware, rel_gap, time_limit_s, max_nodes):
        calls.append(order.index(built))
        value = plans[order.index(built)]
        return None if value is None else types.SimpleNamespace(predicted_step_time_s=value)
    monkeypatch.setattr(milp, "_offload_pattern", pattern)
    run.offload_pattern()
    assert calls == tried
    assert run.incumbent.predicted_step_time_s == incumbent
    assert run.stats["rens_runs"] == len(tried)


def test_offload_pattern_finds_the_every_other_layer_offload_the_search_misses():
    """``_offload_pattern`` on the llama3-8b shape (H200 preset, batch 32 x 4, 48 layers, a device
    budget of the step's fixed bytes and 80 % of the boundaries), where the union LP offloads about
    half of every layer's residuals: the plan offloads exactly the systematic rounding of those
    values (about every other layer), keeps those layers' residuals, fits, and lies between the
    union LP and the search's best plan, which offloads nothing."""
    from lazytrain_jax.model.config import get_preset
    from lazytrain_jax.schedule.api import best_heuristic
    from lazytrain_jax.schedule.costs import analytic_costs
    from lazytrain_jax.schedule.hardware import Hardware

    hw = Hardware.preset("h200")
    costs = analytic_costs(get_preset("llama3-8b", num_layers=48), batch_size=32, seq_len=1024,
                           device_flops=hw.device_flops, num_micro_batches=4,
                           efficiency_half_tokens=hw.efficiency_half_tokens)
    probe = Hardware(device_memory=1e15, h2d_bw=1.0, d2h_bw=1.0, device_flops=1.0)
    hw = hw.replace(device_memory=sum(memory.constant_bytes(costs, probe).values())
                    + 0.8 * sum(costs.boundary_bytes[1:-1]))
    union, _, value, point = _union_solution(costs, hw)
    layers = sorted(union.off)
    assert milp._fractional_offloads(union, point) >= milp.PATTERN_MIN_SHARE * len(layers)
    pattern = milp._systematic_rounding([point[union.off[l].idx] for l in layers])
    assert 0.4 * len(layers) <= sum(pattern) <= 0.6 * len(layers)
    built = milp.build(costs, hw, weight_prefetch_depth=2, act_prefetch_depth=2)
    plan = milp._offload_pattern(built, union, point, costs, hw, 1e-2, 60.0, milp.RENS_MAX_NODES)
    assert plan is not None and plan.fits()
    assert [plan.offload_residuals[l] for l in layers] == [bool(z) for z in pattern]
    assert all(plan.keep_residuals[l] for l, z in zip(layers, pattern) if z)
    found = best_heuristic(costs, hw)
    assert not any(found.offload_residuals)
    assert value <= plan.predicted_step_time_s < found.predicted_step_time_s
    assert plan.predicted_step_time_s <= value * 1.015


def test_a_solve_without_a_start_takes_the_union_lps_first_neighbourhood(monkeypatch):
    """No start fits (the search finds none, no warm start): the union phase runs ``_rens`` from
    the union LP's solution for one, and carries its plan into the depth phase (before, the union
    phase ended at once and HiGHS' branch and cut looked for a first plan on each depth pair:
    varied seed 26, 128 layers, room for 15 % of the boundaries, 13.7 s where it now takes 1.9 s).
    The plan is within rel_gap of the exact optimum and its bound valid."""
    costs, hw = _random_instance(12, 7)
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    optimum = milp.solve(costs, hw, rel_gap=0.0).predicted_step_time_s
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "HIGHS_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp.search, "heuristic_plan", lambda *a, **k: None)
    runs, carried = [], []
    rens_at, depth_phase = milp._Solve.rens_at, milp._Solve.depth_phase

    def recorded(self, *a, **kw):
        runs.append((self.incumbent, rens_at(self, *a, **kw)))
        return runs[-1][1]
    monkeypatch.setattr(milp._Solve, "rens_at", recorded)
    monkeypatch.setattr(milp._Solve, "depth_phase", lambda self: carried.append(self.carried) or depth_phase(self))
    stats = {}
    p = milp.solve(costs, hw, rel_gap=1e-2, stats=stats)
    first_incumbent, first_plan = runs[0]
    assert first_incumbent is None and first_plan is not None and first_plan.fits()
    # the union phase proved its plan, or carried one no slower than the first neighbourhood's
    assert not carried or carried[0].predicted_step_time_s <= first_plan.predicted_step_time_s
    assert p.fits() and p.solver_status == "optimal" and p.gap <= 1e-2 * (1 + 1e-9)
    assert optimum - 1e-9 <= p.predicted_step_time_s <= optimum / (1 - 1e-2) + 1e-9
    assert p.predicted_step_time_s * (1 - p.gap) <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("start,proved_early,order", [
    # first, in every order: the union LP's rounding, then the splits started, then their first
    # bounds where the rounding's plan is near the union LP ("early")
    # near the union LP (within NEIGHBOURHOODS_FIRST_GAPS rel_gaps): the depth pairs' own LPs, then
    # the searches
    (10.1, False, ["round", "early", "pairs", "searches", "first", "tail", "pattern", "halves", "settle"]),
    (10.1, "pairs", ["round", "early", "pairs"]),
    # between NEIGHBOURHOODS_FIRST_GAPS and UNION_SEARCH_GAPS: the neighbourhoods (the tail split
    # right after the first), then the roots (settle), and the searches only where those leave
    # the plan unproved
    (10.2, False, ["round", "early", "first", "tail", "pattern", "halves", "settle", "searches", "settle"]),
    (10.2, True, ["round", "early", "first", "tail", "pattern", "halves", "settle"]),
    (10.2, "tail", ["round", "early", "first", "tail"]),
    # far from it: the same, the searches (which skip the other depth pairs there) before the roots
    (10.5, False, ["round", "early", "first", "tail", "pattern", "halves", "searches", "settle"]),
])
def test_union_phase_order_by_the_starts_distance_from_the_union_lp(monkeypatch, start, proved_early, order):
    """The union phase's steps in the order the start's distance from the union LP (10.0 s, rel_gap
    1 %) calls for, ``settle`` (the union LP's proof, HiGHS' roots on its halves) last, and between
    the neighbourhoods and the searches where the start is neither near nor far; near it the depth
    pairs' own LPs first (``pair_lps``); the plan a step proves is returned, an unproved one carried
    into the depth phase."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.cutoff, run.union, run.far, run.direct = 1e-2, None, 10.0, None, True
    run.union_point, run.union_built, run.depths = ["union point"], None, milp.MILP_DEPTHS
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=start)
    run.depth_bounds, run.carried, run.pair_proof, run.tail_proof = {}, None, None, None
    calls = []
    monkeypatch.setattr(milp, "_leaning", lambda point, built, depths, tie=None: [(2, 1)])
    monkeypatch.setattr(run, "tie", lambda: None, raising=False)
    for name, label in (("first_neighbourhood", "first"), ("offload_pattern", "pattern"),
                        ("half_neighbourhoods", "halves"), ("searches", "searches")):
        monkeypatch.setattr(run, name, lambda label=label: calls.append(label), raising=False)
    proof = types.SimpleNamespace(name="proved")

    monkeypatch.setattr(run, "round_union", lambda: calls.append("round"), raising=False)
    monkeypatch.setattr(run, "prove_early", lambda: calls.append("early"), raising=False)

    def pair_lps():
        calls.append("pairs")
        if proved_early == "pairs":
            run.pair_proof = proof
    monkeypatch.setattr(run, "pair_lps", pair_lps, raising=False)

    def tail_split():
        calls.append("tail")
        if proved_early == "tail":
            run.tail_proof = proof
    monkeypatch.setattr(run, "tail_split", tail_split, raising=False)
    for name in ("start_offload_split", "start_depth_split"):
        monkeypatch.setattr(run, name, lambda: None, raising=False)

    def settle():
        calls.append("settle")
        return proof if proved_early is True else None
    monkeypatch.setattr(run, "settle", settle, raising=False)
    plan = run.union_phase()
    assert calls == order
    assert plan is (proof if proved_early else None)
    assert run.far == ((2, 1) if start == 10.5 else None)
    assert run.carried is (None if proved_early else run.incumbent)


def _pair_lps_run(monkeypatch, costs, hw):
    """A ``_Solve`` of ``costs`` on ``hw`` up to its union LP, on HiGHS' path (forced for a small
    model) with ``pair_lps`` forced whatever the union LP's activation depth and staging; and its
    stats."""
    monkeypatch.setattr(milp, "HIGHS_MIP_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "HIGHS_MIN_NONZEROS", 0)
    monkeypatch.setattr(milp, "DEPTH_SPLIT_EARLY", -1.0)
    monkeypatch.setattr(milp, "_staging_paid_in_part", lambda built, point: True)
    stats = dict(search_s=0.0, lp_s=0.0, lp_solves=0, neighbourhood_s=0.0, rens_s=0.0, rens_runs=0, bb_s=0.0,
                 bb_runs=0, proof="depth_lps")
    kw = dict(max_segment_length=8, max_resident_tail=8, residual_offload=True, verbose=False)
    run = milp._Solve(costs, hw, kw, t0=__import__("time").perf_counter(), time_limit_s=60.0, rel_gap=1e-2,
                      warm_start=None, cutoff=None, depths=milp.MILP_DEPTHS,
                      search_evaluations=milp.search.DEFAULT_EVALUATIONS, max_nodes=300, stats=stats)
    return run, stats


@pytest.mark.parametrize("seed,raised", [(4, False), (7, True)])
def test_pair_lps_bound_every_depth_pair_from_below_and_raise_the_union_lp(monkeypatch, seed, raised):
    """``_Solve.pair_lps`` (each depth pair's own LP and, where it pays the residual staging in
    part, its offload split; forced here whatever the union LP's activation depth and staging):
    the union LP it leaves is at least the union LP's and at most the exact optimum of every depth
    pair; each weight depth's half bound at most the exact optimum at that weight depth; where it
    proves the incumbent, the plan returned is the incumbent and its gap is against that bound."""
    costs, hw = _random_instance(12, seed)
    monkeypatch.setattr(milp, "MIP_SOLVER", "cbc")
    exact = {d: _exact_at(monkeypatch, costs, hw, *d) for d in milp.MILP_DEPTHS}
    monkeypatch.setattr(milp, "MIP_SOLVER", "auto")
    run, stats = _pair_lps_run(monkeypatch, costs, hw)
    assert run.union_point
    run.incumbent = min((p for p in exact.values() if p is not None), key=lambda p: p.predicted_step_time_s)
    run.depth_split = milp._timed(milp._depth_split, run.union_built, run.arrays, run.union_basis, set(),
                                  background=False)
    run.join_depth_split()
    union, halves = run.union, dict(run.depth_bounds)
    best = {d: p.predicted_step_time_s for d, p in exact.items() if p is not None}
    run.pair_lps()
    assert run.pairs_done and stats["lp_solves"] >= 4
    assert union - 1e-9 <= run.union <= min(best.values()) * (1 + 1e-7)
    assert (run.union > union * (1 + 1e-3)) == raised   # seed 7: 3.068 -> 3.085 s (its optimum: 3.156 s)
    for d, bound in run.pair_bounds.items():   # each pair's own bound, for the depth phase's branch
        assert bound <= (best[d] * (1 + 1e-7) if d in best else math.inf)
    for dw, bound in run.depth_bounds.items():   # (a weight depth without any plan: any bound)
        assert halves[dw] - 1e-9 <= bound <= min([v for d, v in best.items() if d[0] == dw] + [math.inf]) * (1 + 1e-7)
    if run.pair_proof is not None:
        value = run.incumbent.predicted_step_time_s
        assert run.pair_proof.predicted_step_time_s == value and stats["proof"] == "pair_lps"
        assert run.pair_proof.gap == pytest.approx(max(0.0, (value - run.union) / value))


@pytest.mark.parametrize("proves", [True, False])
def test_pair_lps_prove_from_the_offload_splits_first_bounds(monkeypatch, proves):
    """``_Solve.pair_lps``: each depth pair's offload split tells its branches' first bounds
    (``_hot_lp``'s, functions of the incumbent's value); where those prove the incumbent, the
    splits' ends are not waited for; where they do not, every split's end is."""
    costs, hw = _random_instance(12, 7)
    run, stats = _pair_lps_run(monkeypatch, costs, hw)
    value = run.union * 1.5   # far above every LP here: only the splits' bounds can prove it
    for d in milp.MILP_DEPTHS:   # every pair split (the splits are stand-ins here)
        if not run.model_at(d).off:
            run.model_at(d).off = {None: None}
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=value, replace=lambda **kw: ("proved", kw))
    asked, ended = [], []

    def first(cutoff=math.inf):
        asked.append(cutoff)
        return value if proves else -math.inf

    def offload_split(built, arrays, basis=None, early=None):
        for future in early:
            future.set_result(first)
        return -math.inf

    def in_thread(fn, *args):
        if fn is offload_split:
            fn(*args)
            return types.SimpleNamespace(result=lambda: (ended.append(1), -math.inf)[1], done=lambda: True)
        future = milp.concurrent.futures.Future()
        future.set_result(fn(*args))
        return future
    monkeypatch.setattr(milp, "_offload_split", offload_split)
    monkeypatch.setattr(milp, "_in_thread", in_thread)
    run.pair_lps()
    splits = len(asked) // 2   # the pairs with an LP solution (an infeasible pair has none)
    assert splits >= 2 and asked == [value] * 2 * splits
    assert len(ended) == (0 if proves else splits)
    assert (run.pair_proof is not None) == proves
    if proves:
        assert run.union == pytest.approx(value) and stats["proof"] == "pair_lps"


@pytest.mark.parametrize("proves", [True, False])
def test_pair_lps_join_the_offload_split_before_their_lps(monkeypatch, proves):
    """``_Solve.pair_lps``: the union LP's offload split started beside it is joined once the
    pairs' models are built, before their LPs; where its bound proves the incumbent, no pair's LP
    is solved (the union phase's plan then comes from the union LP, so raised), else every pair's."""
    costs, hw = _random_instance(12, 7)
    run, stats = _pair_lps_run(monkeypatch, costs, hw)
    value = run.union * 1.5
    split = value * (1 - 0.5e-2) if proves else value * (1 - 2e-2)
    run.incumbent = types.SimpleNamespace(predicted_step_time_s=value, replace=lambda **kw: ("proved", kw))
    run.offload_split = milp.concurrent.futures.Future()
    run.offload_split.set_result((split, 0.25))
    solved = []
    real_in_thread = milp._in_thread

    def in_thread(fn, *args):
        if fn is milp._highs_solve:
            solved.append(args[0])
        return real_in_thread(fn, *args)
    monkeypatch.setattr(milp, "_in_thread", in_thread)
    built_at_join = []
    join = run.join_offload_split

    def join_offload_split():
        built_at_join.append(sorted(run.prebuilt))
        join()
    monkeypatch.setattr(run, "join_offload_split", join_offload_split, raising=False)
    lp_solves = stats["lp_solves"]
    run.pair_lps()
    assert built_at_join == [sorted(milp.MILP_DEPTHS)] and run.offload_split_joined
    assert run.pairs_done and run.union >= split
    assert run.union_proves(run.incumbent) == proves
    assert len(solved) == (0 if proves else len(milp.MILP_DEPTHS))
    if proves:
        assert run.pair_proof is None and stats["lp_solves"] == lp_solves


def test_rens_leaves_the_tiers_free_where_fixing_them_is_infeasible():
    """``_rens`` fixes every decision the LP takes whole; where those tiers do not fit the depth
    pair's memory (the LP's point took part of another pair's room) HiGHS says infeasible at once,
    and ``_rens`` runs again with the boundary tiers free (``RENS_FREED``), the rest fixed."""
    from tests.schedule.test_search import _link_bound_instance
    costs, hw = _link_bound_instance(12)
    union, _, _, point = _union_solution(costs, hw)
    point = numpy.array(point)
    # the LP's point with every kept boundary on the device: more than the device holds
    for i, var in union.host.items():
        point[var.idx] = 0.0
    built = milp.build(costs, hw, weight_prefetch_depth=1, act_prefetch_depth=1)
    fixings = milp._integral_fixings(built, union, point, milp.DECISION_GROUPS)
    status = []
    assert milp._fixed_neighbourhood(built, fixings, costs, hw, 0.0, 60.0, 1000, status) is None
    assert status == [milp.mip.OptimizationStatus.INFEASIBLE]
    before = [(v.lb, v.ub) for v in built.model.vars]
    plan = milp._rens(built, union, point, costs, hw, 1e-2, 60.0, 1000)
    assert [(v.lb, v.ub) for v in built.model.vars] == before and built.solved is None
    assert plan is not None and plan.fits()
    # the path and the residuals are the LP's where it takes them whole; the tiers are the plan's own
    _assert_keeps_what_the_lp_takes_whole(plan, union, point)
    assert any(t == "host" for t in plan.boundary_tiers)


@pytest.mark.parametrize("found,polished,tiers,expected,result", [
    # unproved: polished; the splits see the polished plan, the tiers the sub-MIP's own, polished in turn
    (10.5, {10.5: 10.3, 10.25: 10.2}, 10.25, ["quick polish 10.5", "join 10.3", "tiers 10.5", "quick polish 10.25"], 10.2),
    (10.5, {10.5: 10.3, 10.4: 10.35}, 10.4, ["quick polish 10.5", "join 10.3", "tiers 10.5", "quick polish 10.4"], 10.3),
    (10.5, {10.5: 10.3}, None, ["quick polish 10.5", "join 10.3", "tiers 10.5"], 10.3),   # the tiers find nothing
    (10.5, {10.5: 10.08}, None, ["quick polish 10.5"], 10.08),   # the polished plan is proved: nothing more
    (10.05, {}, None, [], 10.05),                          # proved as found: not polished
])
def test_a_neighbourhoods_plan_is_polished_before_the_splits_and_the_tiers(monkeypatch, found, polished, tiers,
                                                                            expected, result):
    """``_Solve.rens_at``: a plan of ``_rens`` that the union LP does not prove is polished first
    (``polish``, a quarter of the search's budget); the splits' bounds then see the polished plan,
    and the tier neighbourhood the sub-MIP's own, its faster plan polished in turn; the fastest
    returned."""
    run = milp._Solve.__new__(milp._Solve)
    run.rel_gap, run.union, run.deadline, run.cutoff, run.max_nodes = 1e-2, 10.0, math.inf, None, 10
    run.rens_done, run.tail_proof, run.stats = set(), None, {"rens_s": 0.0, "rens_runs": 0}
    run.union_built = run.costs = run.hardware = None
    order = []

    def plan(value):
        return None if value is None else types.SimpleNamespace(predicted_step_time_s=value)

    def polish(q, quick=False):
        order.append(("quick " if quick else "") + f"polish {q.predicted_step_time_s}")
        return plan(polished[q.predicted_step_time_s])
    monkeypatch.setattr(milp, "_rens", lambda *a, **k: plan(found))
    monkeypatch.setattr(run, "polish", polish, raising=False)
    monkeypatch.setattr(run, "join_splits", lambda q=None: order.append(f"join {q.predicted_step_time_s}"),
                        raising=False)
    monkeypatch.setattr(milp, "_tier_neighbourhood",
                        lambda built, q, *a, **k: order.append(f"tiers {q.predicted_step_time_s}") or plan(tiers))
    q = run.rens_at(types.SimpleNamespace(weight_prefetch_depth=2, act_prefetch_depth=1), point=None)
    assert order == expected
    assert q.predicted_step_time_s == result
    assert run.rens_done == {(2, 1)} and run.stats["rens_runs"] == 1
