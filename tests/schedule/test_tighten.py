"""``milp._tighten_window_rows``: coefficient tightening of the rows that bound a window's time from
below. It must keep every integer point's least window time (so every plan's value) and may only
raise the LP."""

import itertools
import random

import numpy as np
import pytest
from scipy.optimize import linprog

from lazytrain_jax.schedule import linear, milp

from tests.schedule.test_highs_mip import _varied_instance
from tests.schedule.test_step_model import random_instance

VARIED_LAYERS = 24


def test_tighten_by_hand():
    """A backward window's compute row t >= 0.2454 - 0.0818 res (floor 0.1636 s) and its upload row
    t >= 0.0891 + 0.0891 xa - 0.0891 xb (varied seed 3's shape): the upload row's binaries count only
    above the floor, t >= 0.1636 + 0.0146 xa - 0.0146 xb; the compute row is left as it is (its
    binary lifts it from its own floor); a row that never passes the floor is left too."""
    m = linear.Model()
    t = m.add_var(lb=0.0)
    res, xa, xb, xc = (m.add_var(var_type=linear.BINARY) for _ in range(4))
    compute = m.add_constr(t >= 0.2454 - 0.0818 * res)
    upload = m.add_constr(t >= 0.0891 + 0.0891 * xa - 0.0891 * xb)
    low = m.add_constr(t >= 0.05 + 0.1 * xc)   # at most 0.15 < 0.1636: never binding
    assert milp._tighten_window_rows(m, [t]) == 2
    # the rows are written t - (...) >= 0: a coefficient of a variable is minus its share of t
    assert compute.expr[res] == pytest.approx(0.0818) and compute.const == pytest.approx(-0.2454)
    floor = 0.2454 - 0.0818
    lift = 0.0891 + 0.0891 - floor
    assert -upload.expr[xa] == pytest.approx(lift) and upload.expr[xb] == pytest.approx(lift)
    assert -upload.const == pytest.approx(floor)
    assert low.expr[xc] == pytest.approx(-0.1) and low.const == pytest.approx(-0.05)


def _random_window_model(rng):
    """One window t with 2-5 lower-bound rows over 1-4 binaries and 0-2 bounded continuous
    variables each (some shared), and t's own lower bound."""
    m = linear.Model()
    t = m.add_var(lb=rng.choice([0.0, rng.uniform(0, 1)]))
    binaries = [m.add_var(var_type=linear.BINARY) for _ in range(rng.randint(2, 5))]
    continuous = [m.add_var(lb=0.0, ub=rng.uniform(0.2, 1.0)) for _ in range(rng.randint(0, 2))]
    for _ in range(rng.randint(2, 5)):
        terms = rng.sample(binaries, rng.randint(1, min(4, len(binaries))))
        terms += rng.sample(continuous, rng.randint(0, len(continuous)))
        expr = linear.xsum(rng.uniform(-1, 1) * v for v in terms) + rng.uniform(-0.5, 1.0)
        row = t >= expr if rng.random() < 0.5 else -t <= -expr   # both senses
        m.add_constr(row)
    return m, t, binaries, continuous


def _least_t(m, t, binaries, fixed):
    """min t over the LP of ``m`` with ``binaries`` fixed at ``fixed`` (None: relaxed to [0, 1])."""
    n = len(m.vars)
    cost = np.zeros(n)
    cost[t.idx] = 1.0
    rows, rhs = [], []
    for row in m.rows:
        a = np.zeros(n)
        for var, c in row.expr.items():
            a[var.idx] = c
        # row: a.x + const (sense) 0
        if row.sense == ">":
            rows.append(-a)
            rhs.append(row.const)
        else:
            rows.append(a)
            rhs.append(-row.const)
    bounds = [(v.lb, v.ub if v.ub != float("inf") else None) for v in m.vars]
    if fixed is not None:
        for z, value in zip(binaries, fixed):
            bounds[z.idx] = (value, value)
    result = linprog(cost, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=bounds, method="highs")
    assert result.status == 0
    return result.fun


def test_tightening_keeps_every_integer_point_and_never_lowers_the_lp():
    """Random one-window models: at every 0/1 assignment of the binaries the least t is the same
    before and after (so every plan keeps its value), the LP's least t never falls, and on some
    models it rises."""
    rng = random.Random(7)
    raised = changed = 0
    for trial in range(60):
        m, t, binaries, continuous = _random_window_model(rng)
        before_points = {bits: _least_t(m, t, binaries, bits)
                         for bits in itertools.product((0.0, 1.0), repeat=len(binaries))}
        before_lp = _least_t(m, t, binaries, None)
        changed += milp._tighten_window_rows(m, [t]) > 0
        for bits, value in before_points.items():
            assert _least_t(m, t, binaries, bits) == pytest.approx(value, abs=1e-9), (trial, bits)
        after_lp = _least_t(m, t, binaries, None)
        assert after_lp >= before_lp - 1e-9, (trial, before_lp, after_lp)
        raised += after_lp > before_lp + 1e-6
    assert changed >= 20 and raised >= 5, (changed, raised)


def _milp_optimum(built):
    solved = milp._highs_mip(built.model, 0.0, 120.0, 10 ** 9)
    assert solved.values is not None
    return solved.objective_value


def test_build_with_tightened_rows_raises_the_lps_and_keeps_the_optimum(monkeypatch):
    """The planning MILP with and without the tightening: the union LP and each depth pair's LP
    only rise and each MILP's optimum (HiGHS, to optimality) is the same, on random instances; on
    varied seed 3's shape (a backward window's compute floor above its upload's cases) the union
    LP rises."""
    rng = random.Random(13)
    for trial in range(4):
        costs, hw = random_instance(rng, rng.randint(4, 8))
        for kw in (dict(union=True), dict(weight_prefetch_depth=2, act_prefetch_depth=1), {}):
            built = [milp.build(costs, hw, tighten_rows=tr, **kw) for tr in (False, True)]
            lps = [milp._relaxed(b, solver="clp") for b in built]
            assert lps[1] >= lps[0] - 1e-9 * (1 + abs(lps[0])), (trial, kw, lps)
            if "union" not in kw:
                optima = [_milp_optimum(b) for b in built]
                assert optima[1] == pytest.approx(optima[0], rel=1e-9), (trial, kw, optima)
    costs, hw = _varied_instance(monkeypatch, 3, VARIED_LAYERS)
    lps = [milp._relaxed(milp.build(costs, hw, union=True, tighten_rows=tr), solver="clp") for tr in (False, True)]
    assert lps[1] > lps[0] * (1 + 1e-3), lps
