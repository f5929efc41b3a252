"""``linear.Model`` written into python-mip's CBC (``mip_model``): the same LP as HiGHS reads from
its arrays, with the bounds, rows, start and cutoff as they are at each call."""
import math

import mip
import pytest

from lazytrain_jax.schedule import linear, milp
from lazytrain_jax.schedule.costs import synthetic_costs
from lazytrain_jax.schedule.hardware import Hardware


def _built():
    costs = synthetic_costs(num_layers=8, weight_bytes=[0.3e9 * (1 + (l % 3)) for l in range(8)],
                            boundary_bytes=0.5e9, fwd_time=0.03, residual_bytes=0.5e9, head_bytes=0.3e9,
                            head_time=0.03)
    hw = Hardware(device_memory=8e9, h2d_bw=12e9, d2h_bw=10e9, device_flops=1e14, host_memory=12e9,
                  host_opt_rate=4e9)
    return milp.build(costs, hw, max_segment_length=4)


def _clp(model: linear.Model) -> float:
    solver = model.mip_model()
    with milp._quiet_stdout():
        status = solver.optimize(relax=True)
    assert status == mip.OptimizationStatus.OPTIMAL
    return solver.objective_value


def _highs(model: linear.Model) -> float:
    return milp._highs_solve(milp._highs_arrays(model))


def test_cbcs_copy_follows_the_bounds_rows_and_start():
    built = _built()
    m = built.model
    assert _clp(m) == pytest.approx(_highs(m), rel=1e-5)
    solver = m.mip_model()
    assert (solver.num_cols, solver.num_rows) == (m.num_cols, m.num_rows)
    zeros = sum(c == 0 for row in m.rows for c in row.expr.values())   # CBC drops written zeros
    assert solver.num_nz == m.num_nz - zeros
    assert m.mip_model() is solver   # written once
    # a bound fixed here is CBC's too, and restored
    edge = built.x[0, 1]
    edge.lb = edge.ub = 1.0
    fixed = _clp(m)
    assert fixed == pytest.approx(_highs(m), rel=1e-5)
    assert (solver.vars[edge.idx].lb, solver.vars[edge.idx].ub) == (1.0, 1.0)
    assert edge.x == pytest.approx(1.0)   # the value of CBC's last solve
    edge.lb, edge.ub = 0.0, 1.0
    # a row added is written there, and taken out again with pop_row
    m.add_constr(linear.xsum(built.host.values()) >= 2)
    assert _clp(m) == pytest.approx(_highs(m), rel=1e-5)
    assert m.mip_model() is solver and solver.num_rows == m.num_rows
    m.pop_row()
    assert solver.num_rows == m.num_rows
    # a row replaced (same count, another last row): written again
    last = m.rows.pop()
    m.add_constr(linear.xsum(built.host.values()) <= 0)
    rewritten = m.mip_model()
    assert rewritten is not solver and rewritten.num_rows == m.num_rows
    m.rows[-1] = last
    assert _clp(m) == pytest.approx(_highs(m), rel=1e-5)
    # start and cutoff go with each call
    m.start = [(edge, 1.0)]
    m.cutoff = 123.0
    solver = m.mip_model()
    assert solver.cutoff == 123.0
    m.start, m.cutoff = [], math.inf
    assert math.isinf(m.mip_model().cutoff)


def test_cbc_gets_a_start_only_once_one_is_given():
    """An empty start set in CBC changes which of two equally fast plans it returns: a model that
    was never given one leaves python-mip's start unset, as a python-mip model would."""
    m = _built().model
    assert m.start is None and m.mip_model().start is None and m.mip_model().cutoff > 1e300  # (CBC: its largest double)
    m.start = []
    assert m.mip_model().start == []


def test_a_fresh_variable_reads_no_value_before_a_solve():
    m = linear.Model()
    v = m.add_var()
    assert v.x is None
    m.objective = linear.minimize(v)
    m.add_constr(v >= 2.5)
    solver = m.mip_model()
    with milp._quiet_stdout():
        solver.optimize()
    assert v.x == pytest.approx(2.5) and solver.objective_value == pytest.approx(2.5)
