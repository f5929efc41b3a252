"""The build's fast forms of python-mip's arithmetic (``milp._scaled_sum`` for ``mip.xsum(c * t for
c, t in terms)``, ``milp._ge``/``_le``/``_eq`` for ``lhs >= rhs`` and the others) must give the very
expression mip gives: the same variables in the same order, coefficients and constant to the last
bit, the same sense (the model's arrays, and so HiGHS' runs and the plans, stay the same)."""
import random

import mip

from lazytrain_jax.schedule import milp


def _mixed_terms(rng, variables):
    terms = []
    for _ in range(rng.randint(0, 12)):
        kind = rng.random()
        coeff = rng.choice([1.0, 1.0 + 1e-15, -1.0, 0.0, rng.uniform(-3, 3), 1e-12])
        if kind < 0.5:
            term = rng.choice(variables)
        elif kind < 0.85:  # an expression with a constant, some variables repeated
            picked = rng.sample(variables, rng.randint(1, 4))
            term = mip.xsum(rng.uniform(-2, 2) * v for v in picked) + rng.uniform(-1, 1)
            if rng.random() < 0.3:
                term = 1 - term
        else:
            term = rng.uniform(-5, 5)
        terms.append((coeff, term))
    return terms


def test_scaled_sum_is_mips_xsum_of_the_products_bit_for_bit():
    rng = random.Random(0)
    m = mip.Model(solver_name="CBC")
    variables = [m.add_var(lb=0.0) for _ in range(6)]
    for _ in range(300):
        terms = _mixed_terms(rng, variables)
        ours = milp._scaled_sum(terms)
        theirs = mip.xsum(c * t for c, t in terms)
        assert ours.const == theirs.const
        assert list(ours.expr.items()) == list(theirs.expr.items())
        assert ours.sense == theirs.sense == ""


def test_relations_are_mips_rows_bit_for_bit():
    rng = random.Random(1)
    m = mip.Model(solver_name="CBC")
    variables = [m.add_var(lb=0.0) for _ in range(6)]

    def side(numbers=True):
        kind = rng.random()
        if kind < 0.4:
            return rng.choice(variables)
        if kind < 0.8 or not numbers:
            picked = rng.sample(variables, rng.randint(1, 4))
            return mip.xsum(rng.uniform(-2, 2) * v for v in picked) + rng.choice([0.0, -1, rng.uniform(-1, 1)])
        return rng.choice([0, 0.0, -0.0, 1, rng.uniform(-5, 5)])

    for _ in range(500):
        lhs, rhs = side(numbers=False), side()
        if lhs is rhs:
            continue  # (mip writes x >= x as -x: never in the model)
        for ours, theirs in ((milp._ge(lhs, rhs), lhs >= rhs), (milp._le(lhs, rhs), lhs <= rhs),
                             (milp._eq(lhs, rhs), lhs == rhs)):
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
    monkeypatch.setattr(milp, "_scaled_sum", lambda terms: mip.xsum(c * t for c, t in terms))
    monkeypatch.setattr(milp, "_ge", lambda a, b: a >= b)
    monkeypatch.setattr(milp, "_le", lambda a, b: a <= b)
    monkeypatch.setattr(milp, "_eq", lambda a, b: a == b)
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
    m.hand_over()
    row = m.add_constr(mip.xsum(built.x.values()) >= 1)
    added = milp._highs_arrays(m)
    assert added[1]["A_ub"].shape[0] == first[1]["A_ub"].shape[0] + 1
    m.remove(row)
    m.rows.pop()
    other = m.add_constr(mip.xsum(built.x.values()) >= 2)   # as many rows as ``added``, another last row
    changed = milp._highs_arrays(m)
    assert changed[1]["b_ub"][-1] == -2.0 and added[1]["b_ub"][-1] == -1.0
    m.remove(other)
    m.rows.pop()
    same(milp._highs_arrays(m), fixed)
