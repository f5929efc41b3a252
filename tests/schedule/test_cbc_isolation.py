"""CBC's branch and bound runs in a child process (``milp.ISOLATE_CBC``, models of
``milp.ISOLATE_CBC_MIN_NONZEROS`` and more): a crash or a hang there costs only that run. Same
plans as in this process; the plan found so far stands otherwise."""

import os
import signal
import time

import pytest

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import milp
from lazytrain_jax.schedule.costs import analytic_costs
from lazytrain_jax.schedule.hardware import Hardware

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="CBC runs in this process where nothing forks")


@pytest.fixture(autouse=True)
def every_model_in_a_child(monkeypatch):
    """The 8-layer instance below is under the size from which CBC runs in a child: here every model is."""
    monkeypatch.setattr(milp, "ISOLATE_CBC_MIN_NONZEROS", 0)


def _instance():
    hw = Hardware.preset("rtx3090")
    costs = analytic_costs(get_preset("qwen2.5-3b", num_layers=8), batch_size=8, seq_len=1024,
                           device_flops=hw.device_flops)
    return costs, hw


def _decisions(plan):
    return (plan.boundary_tiers, plan.keep_residuals, plan.offload_residuals, plan.resident_tail,
            plan.weight_prefetch_depth, plan.act_prefetch_depth)


def test_child_and_in_process_cbc_give_the_same_plan(monkeypatch):
    costs, hw = _instance()
    stats = {}
    child = milp.solve(costs, hw, rel_gap=0.0, stats=stats)   # rel_gap 0: CBC always branches
    assert stats["bb_runs"] >= 1
    monkeypatch.setattr(milp, "ISOLATE_CBC", False)
    here = milp.solve(costs, hw, rel_gap=0.0)
    assert _decisions(child) == _decisions(here)
    assert child.predicted_step_time_s == here.predicted_step_time_s and child.gap == here.gap


@pytest.mark.parametrize("failure", ["crash", "hang"])
def test_a_failed_cbc_child_leaves_the_search_plan(monkeypatch, failure):
    """The child is killed by a signal (as an abort in CBC would) or never answers (as CBC's own
    crash handler, deadlocked, did): a warning, and the solve returns the search's plan, unproved."""
    costs, hw = _instance()

    def broken(*_):
        if failure == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(3600)

    monkeypatch.setattr(milp, "_cbc_here", broken)
    monkeypatch.setattr(milp, "CBC_GRACE_S", 0.5)
    monkeypatch.setattr(milp._Solve, "expired", lambda self: False)  # CBC runs, given MIN_RUN_S at least
    t = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="without a result"):
        plan = milp.solve(costs, hw, rel_gap=0.0, time_limit_s=0.5, depths=((1, 1),))
    assert time.perf_counter() - t < 60
    assert plan is not None and plan.fits() and plan.solver_status in ("feasible", "optimal")
    monkeypatch.undo()
    reference = milp.solve(costs, hw, rel_gap=0.0, depths=((1, 1),))   # CBC working again, in a fresh child
    assert plan.predicted_step_time_s >= reference.predicted_step_time_s * (1 - 1e-9)


def test_only_models_from_the_threshold_up_go_to_a_child(monkeypatch):
    """Below ``ISOLATE_CBC_MIN_NONZEROS`` CBC runs in this process (no fork), from it in a child."""
    costs, hw = _instance()
    sizes = []
    child = milp._cbc_in_child

    def counted(m, *args):
        sizes.append(m.num_nz)
        return child(m, *args)

    monkeypatch.setattr(milp, "_cbc_in_child", counted)
    stats = {}
    milp.solve(costs, hw, rel_gap=0.0, depths=((1, 1),), stats=stats)
    assert stats["bb_runs"] >= 1 and len(sizes) == stats["bb_runs"]  # threshold 0 (the fixture): all in children
    smallest = min(sizes)
    monkeypatch.setattr(milp, "ISOLATE_CBC_MIN_NONZEROS", smallest + 1)
    sizes.clear()
    plan = milp.solve(costs, hw, rel_gap=0.0, depths=((1, 1),), stats=stats)
    assert stats["bb_runs"] >= 1 and sizes == [] and plan.gap == 0.0
