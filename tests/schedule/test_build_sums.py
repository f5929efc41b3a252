"""The planner's linear expressions (``linear``) and the build's fast forms of their arithmetic
(``milp._scaled_sum`` for ``xsum(c * t for c, t in terms)``, ``milp._ge``/``_le``/``_eq`` for
``lhs >= rhs`` and the others) must give the very expression python-mip gives: the same variables in
the same order, coefficients and constant to the last bit, the same sense (the model's arrays, and
so HiGHS' runs and the plans, stay those of a model written with python-mip)."""
import math
import random

import mip
import pytest

from lazytrain_jax.schedule import linear, milp


class _Twins:
    """The same variables in python-mip (CBC) and in ``linear``: a term made of one is made of the
    other by the same operations."""

    def __init__(self, n):
        self.ours = linear.Model()
        self.theirs = mip.Model(solver_name="CBC")
        self.vars = [(self.ours.add_var(lb=0.0), self.theirs.add_var(lb=0.0)) for _ in range(n)]


def _same(ours, theirs):
    """``ours`` (linear) is ``theirs`` (python-mip), bit for bit."""
    if isinstance(theirs, mip.Var):
        assert isinstance(ours, linear.Var) and ours.idx == theirs.idx
        return
    assert isinstance(ours, linear.LinExpr) and isinstance(theirs, mip.LinExpr)
    assert ours.sense == theirs.sense
    assert repr(ours.const) == repr(theirs.const) and type(ours.const) is type(theirs.const)
    assert [(v.idx, repr(c), type(c)) for v, c in ours.expr.items()] == \
        [(v.idx, repr(c), type(c)) for v, c in theirs.expr.items()]


def _number(rng):
    return rng.choice([0, 0.0, -0.0, 1, -1, 1.0 + 1e-15, 1e-12, rng.uniform(-5, 5)])


def _term(rng, twins, depth=0):
    """A random term built the same way on both sides: (ours, theirs)."""
    kind = rng.random()
    if kind < 0.3 or depth > 2:
        return rng.choice(twins.vars)
    if kind < 0.45:
        picked = rng.sample(twins.vars, rng.randint(0, 4))
        coeffs = [_number(rng) for _ in picked]
        return (linear.xsum(c * a for c, (a, _) in zip(coeffs, picked)),
                mip.xsum(c * b for c, (_, b) in zip(coeffs, picked)))
    a, b = _term(rng, twins, depth + 1)
    op = rng.choice(["add", "radd", "sub", "rsub", "mul", "rmul", "div", "neg", "addt", "subt"])
    if op in ("addt", "subt"):
        c, d = _term(rng, twins, depth + 1)
        return (a + c, b + d) if op == "addt" else (a - c, b - d)
    if op == "neg":
        return -a, -b
    n = _number(rng)
    if op == "div":
        n = n if abs(n) > 1e-9 else 2.5
        return a / n, b / n
    return {"add": (a + n, b + n), "radd": (n + a, n + b), "sub": (a - n, b - n), "rsub": (n - a, n - b),
            "mul": (a * n, b * n), "rmul": (n * a, n * b)}[op]


def test_linear_arithmetic_is_pythons_mips_bit_for_bit():
    rng = random.Random(2)
    twins = _Twins(6)
    for _ in range(3000):
        ours, theirs = _term(rng, twins)
        _same(ours, theirs)
        (c, d) = _term(rng, twins)
        if ours is not c and not (isinstance(ours, linear.Var) and isinstance(c, linear.Var) and ours is c):
            _same(ours >= c, theirs >= d)
            _same(ours <= c, theirs <= d)
            _same(_plain_row(ours, c, "="), theirs == d)
        n = _number(rng)
        _same(ours >= n, theirs >= n)
        _same(ours <= n, theirs <= n)
        _same(_plain_row(ours, n, "="), theirs == n)
    rows = [linear.xsum([]) + 1, linear.xsum(twins.ours.vars[:2]) * 2.0]
    for row in rows:
        with pytest.raises(TypeError, match="is not a row"):
            twins.ours.add_constr(row)


def test_model_variables_check_their_bounds_and_type():
    m = linear.Model()
    b = m.add_var(var_type=linear.BINARY)
    assert (b.lb, b.ub, b.idx) == (0.0, 1.0, 0)
    with pytest.raises(ValueError, match=r"bounds must lie in \[0, 1\], not \[0.0, 2.0\]"):
        m.add_var(ub=2.0, var_type=linear.BINARY)
    with pytest.raises(ValueError, match="var_type='X'"):
        m.add_var(var_type="X")
    assert m.add_var().ub == math.inf and m.num_cols == 2


def _mixed_terms(rng, variables):
    terms = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        coeff = rng.choice([1.0, 1.0 + 1e-15, -1.0, 0.0, rng.uniform(-3, 3), 1e-12])
        if kind < 0.5:
            term = rng.choice(variables)
        elif kind < 0.85:  # an expression with a constant, some variables repeated
            picked = rng.sample(variables, rng.randint(1, 4))
            term = linear.xsum(rng.uniform(-2, 2) * v for v in picked) + rng.uniform(-1, 1)
            if rng.random() < 0.3:
                term = 1 - term
        else:
            term = rng.uniform(-5, 5)
        terms.append((coeff, term))
    return terms


def test_scaled_sum_is_xsum_of_the_products_bit_for_bit():
    rng = random.Random(0)
    m = linear.Model()
    variables = [m.add_var(lb=0.0) for _ in range(6)]
    for _ in range(300):
        terms = _mixed_terms(rng, variables)
        ours = milp._scaled_sum(terms)
        theirs = linear.xsum(c * t for c, t in terms)
        assert repr(ours.const) == repr(theirs.const)
        assert list(ours.expr.items()) == list(theirs.expr.items())
        assert ours.sense == theirs.sense == ""


def _plain_row(lhs, rhs, sense):
    """``lhs >= rhs`` (and the others) by the expressions' own arithmetic, as python-mip writes a
    row (for "=", as its ``==``: ``linear`` keeps ``==`` on variables for identity)."""
    return lhs._row(rhs, sense)


def test_relations_are_the_plain_rows_bit_for_bit():
    rng = random.Random(1)
    m = linear.Model()
    variables = [m.add_var(lb=0.0) for _ in range(6)]

    def side(numbers=True):
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(variables)
        if kind < 0.8 or not numbers:
            picked = rng.sample(variables, rng.randint(1, 4))
            return linear.xsum(rng.uniform(-2, 2) * v for v in picked) + rng.choice([0.0, -1, rng.uniform(-1, 1)])
        return rng.choice([0, 0.0, -0.0, 1, rng.uniform(-5, 5)])

    for _ in range(500):
        lhs, rhs = side(numbers=False), side()
        if lhs is rhs:
            continue  # (mip writes x >= x as -x: never in the model)
        for ours, theirs in ((milp._ge(lhs, rhs), lhs >= rhs), (milp._le(lhs, rhs), lhs <= rhs),
                             (milp._eq(lhs, rhs), _plain_row(lhs, rhs, "="))):
            assert ours.sense == theirs.sense
            assert repr(ours.const) == repr(theirs.const) and type(ours.const) is type(theirs.const)
            assert list(ours.expr.items()) == list(theirs.expr.items())


def test_build_with_the_fast_sums_gives_the_arrays_of_the_plain_sums(monkeypatch):
    """The whole model: built once with the fast forms and once with them replaced by mip's own
    arithmetic, the HiGHS arrays are equal (union and depth-pair models)."""
    from lazytrain_jax.schedule.costs import synthetic_costs
    from lazytrain_jax.schedule.hardware import Hardware
    costs = synthetic_costs(num_layers=10, weight_bytes=[0.3e9 * (1 + (l % 3)) for l in range(10)],
                            boundary_bytes=0.4e9, fwd_time=[0.02 + 0.01 * (l % 4) for l in range(10)],
                            residual_bytes=0.6e9, head_bytes=0.3e9, head_time=0.03)
    hw = Hardware(device_memory=9e9, h2d_bw=12e9, d2h_bw=10e9, nvme_read_bw=3e9, nvme_write_bw=2e9,
                  device_flops=1e14, host_memory=12e9, nvme_memory=1e12, host_opt_rate=4e9)

    def arrays(**kw):
        cost, args, const = milp._highs_arrays(milp.build(costs, hw, max_segment_length=4, **kw).model)
        ub, eq = args["A_ub"], args["A_eq"]  # as HiGHS' rows are read: each row's entries in the model's order
        return (cost, ub.indptr, ub.indices, ub.data, args["b_ub"], eq.indptr, eq.indices, eq.data, args["b_eq"],
                args["bounds"], const)

    kinds = [dict(union=True), dict(weight_prefetch_depth=2, act_prefetch_depth=2), dict()]
    fast = [arrays(**kw) for kw in kinds]
    monkeypatch.setattr(milp, "_scaled_sum", lambda terms: linear.xsum(c * t for c, t in terms))
    monkeypatch.setattr(milp, "_ge", lambda a, b: a >= b)
    monkeypatch.setattr(milp, "_le", lambda a, b: a <= b)
    monkeypatch.setattr(milp, "_eq", lambda a, b: _plain_row(a, b, "="))
    plain = [arrays(**kw) for kw in kinds]
    for a, b in zip(fast, plain):
        for x, y in zip(a, b):
            assert (x.shape == y.shape and (x == y).all()) if hasattr(x, "all") else x == y


def test_highs_arrays_keep_the_rows_and_read_the_bounds_each_time():
    """``_highs_arrays`` reads a model's rows once (per kind: with or without its bound rows) and its
    variables' bounds on every call: a bound fixed between two calls shows in the second, and a row
    added (the offload split's CLP path) or left out is read again; each call's arrays equal those
    of a model built afresh with the same bounds."""
    from lazytrain_jax.schedule.costs import synthetic_costs
    from lazytrain_jax.schedule.hardware import Hardware
    costs = synthetic_costs(num_layers=8, weight_bytes=0.4e9, boundary_bytes=0.5e9, fwd_time=0.03,
                            residual_bytes=0.5e9, head_bytes=0.3e9, head_time=0.03)
    hw = Hardware(device_memory=8e9, h2d_bw=12e9, d2h_bw=10e9, device_flops=1e14, host_memory=12e9,
                  host_opt_rate=4e9)
    built = milp.build(costs, hw, max_segment_length=4)
    m = built.model

    def same(a, b):
        (ca, aa, ka), (cb, ab, kb) = a, b
        assert ka == kb and (ca == cb).all() and (aa["bounds"] == ab["bounds"]).all()
        for k in ("A_ub", "A_eq"):
            assert (aa[k] != ab[k]).nnz == 0 and aa[k].shape == ab[k].shape
        for k in ("b_ub", "b_eq"):
            assert (aa[k] == ab[k]).all()

    first = milp._highs_arrays(m)
    var = next(iter(built.x.values()))
    var.lb = var.ub = 1.0
    fixed = milp._highs_arrays(m)
    assert fixed[1]["A_ub"] is first[1]["A_ub"]          # the rows kept
    assert fixed[1]["bounds"][var.idx].tolist() == [1.0, 1.0] != first[1]["bounds"][var.idx].tolist()
    fresh = milp.build(costs, hw, max_segment_length=4)
    twin = list(fresh.x.values())[0]
    twin.lb = twin.ub = 1.0
    same(fixed, milp._highs_arrays(fresh.model))
    assert m.bound_rows
    without = milp._highs_arrays(m, bound_rows=False)
    assert without[1]["A_ub"].shape[0] == first[1]["A_ub"].shape[0] - len(m.bound_rows)
    assert milp._highs_arrays(m)[1]["A_ub"] is first[1]["A_ub"]   # each kind kept apart
    m.add_constr(linear.xsum(built.x.values()) >= 1)
    added = milp._highs_arrays(m)
    assert added[1]["A_ub"].shape[0] == first[1]["A_ub"].shape[0] + 1
    m.pop_row()
    m.add_constr(linear.xsum(built.x.values()) >= 2)   # as many rows as ``added``, another last row
    changed = milp._highs_arrays(m)
    assert changed[1]["b_ub"][-1] == -2.0 and added[1]["b_ub"][-1] == -1.0
    m.pop_row()
    same(milp._highs_arrays(m), fixed)
