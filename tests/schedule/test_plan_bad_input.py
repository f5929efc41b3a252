"""The planner under tight budgets and bad input: optimal plans instead of assertion errors, clear
ValueErrors naming the field, nothing printed to stdout."""

import dataclasses
import itertools
import json
import random
import types

import pytest

import lazytrain_jax as lt
from lazytrain_jax.schedule import memory, milp, timing
from lazytrain_jax.schedule.costs import synthetic_costs
from lazytrain_jax.schedule.hardware import Hardware
from lazytrain_jax.schedule.plan import Plan

GB = 1e9


def reproducer():
    costs = synthetic_costs(num_layers=4, weight_bytes=[1.2e9, 0.8e9, 1.9e9, 0.6e9],
                            boundary_bytes=[0.5e9, 0.9e9, 0.3e9, 0.7e9, 0.4e9], fwd_time=[0.05, 0.15, 0.1, 0.2],
                            residual_bytes=[2e9, 1e9, 3e9, 0.5e9], head_bytes=1e9, head_time=0.05)
    hw = Hardware(device_memory=13.2e9, h2d_bw=20e9, d2h_bw=3e9, device_flops=1e14, host_memory=10e9)
    return costs, hw


def decision_space(costs, max_segment_length=8, max_resident_tail=8):
    """Every plan of the MILP's space without NVMe (tiers, residuals, resident tail)."""
    L = costs.num_layers
    for inner in itertools.product(("device", "drop", "host"), repeat=L - 1):
        tiers = ("device",) + inner + ("device",)
        if any(e - s > max_segment_length for s, e in memory.segments(tiers)):
            continue
        for keep in itertools.product((False, True), repeat=L):
            for k in range(min(L, max_resident_tail) + 1):
                yield types.SimpleNamespace(boundary_tiers=tiers, keep_residuals=keep, resident_tail=k,
                                            weight_prefetch_depth=1, act_prefetch_depth=1, optimizer_mode="pipelined")


def test_reproducer_returns_the_optimal_plan():
    costs, hw = reproducer()
    plan = lt.plan(costs, hw, rel_gap=0.0)
    best = min(timing.step_time(costs, hw, p) for p in decision_space(costs)
               if memory.device_peak_bytes(costs, hw, p) <= hw.device_memory
               and memory.host_peak_bytes(costs, p) <= hw.host_memory)
    assert plan.fits()
    assert plan.predicted_step_time_s == pytest.approx(best, rel=1e-9)
    assert 0.0 <= plan.gap <= 1e-5  # CBC's value sits ~1e-5 s below the exact model's; never negative


def tight_instances(seed, num_instances):
    """(index, costs, hardware, enumerated optimum): 3-4 layers, the device budget 0-1.2 % above
    the smallest feasible peak (where CBC's objective drifts from the exact model's)."""
    rng = random.Random(seed)
    for i in range(num_instances):
        L = rng.choice([3, 4])
        costs = synthetic_costs(
            num_layers=L, weight_bytes=[rng.uniform(0.5, 2.0) * GB for _ in range(L)],
            boundary_bytes=[rng.uniform(0.3, 1.0) * GB for _ in range(L + 1)],
            fwd_time=[rng.uniform(0.05, 0.2) for _ in range(L)],
            residual_bytes=[rng.uniform(0.5, 3.0) * GB for _ in range(L)], head_bytes=1e9, head_time=0.05)
        roomy = Hardware(device_memory=1e15, h2d_bw=20e9, d2h_bw=3e9, device_flops=1e14,
                         host_memory=rng.uniform(0, 3) * GB)
        squeeze = 1 + rng.uniform(0.0, 0.012)
        peaks = [(memory.device_peak_bytes(costs, roomy, p), p) for p in decision_space(costs)
                 if memory.host_peak_bytes(costs, p) <= roomy.host_memory]
        smallest = min(peak for peak, _ in peaks)
        hw = roomy.replace(device_memory=smallest * squeeze)
        best = min(timing.step_time(costs, hw, p) for peak, p in peaks if peak <= hw.device_memory)
        yield i, costs, hw, best


def test_randomized_tight_budgets_match_enumeration(count=40):
    """No assertion error at tight budgets: every plan fits, its gap is >= 0, the MILP at rel_gap=0
    finds the enumerated optimum, and lt.plan at its default gap stays within 1 % of it (40 draws
    here, 200 in the slow run)."""
    for i, costs, hw, best in tight_instances(2026, count):
        exact = milp.solve(costs, hw, rel_gap=0.0)
        assert exact is not None and exact.fits(), i
        assert exact.gap >= 0.0 and exact.predicted_step_time_s >= best * (1 - 1e-9), i
        assert exact.predicted_step_time_s == pytest.approx(best, rel=1e-6), i
        assert exact.gap <= 1e-5, i
        default = lt.plan(costs, hw)
        assert default.fits(), i
        assert best * (1 - 1e-9) <= default.predicted_step_time_s, i
        assert default.predicted_step_time_s <= best * (1 + 1e-2), i



@pytest.mark.slow
def test_randomized_tight_budgets_match_enumeration_many():
    test_randomized_tight_budgets_match_enumeration(200)


@pytest.mark.parametrize("kw, match", [
    (dict(rel_gap=-1), r"rel_gap=-1 must be a number in \[0, 1\)"),
    (dict(rel_gap=5), r"rel_gap=5 must be"),
    (dict(rel_gap=float("nan")), r"rel_gap=nan must be"),
    (dict(rel_gap="0.01"), r"rel_gap='0.01' must be"),
    (dict(rel_gap=True), r"rel_gap=True must be"),
    (dict(time_limit_s=-5), r"time_limit_s=-5 must be a finite number of seconds > 0"),
    (dict(time_limit_s=0), r"time_limit_s=0 must be"),
    (dict(time_limit_s=float("inf")), r"time_limit_s=inf must be"),
    (dict(time_limit_s="30"), r"time_limit_s='30' must be"),
    (dict(max_resident_tail=-1), r"max_resident_tail=-1 must be an integer >= 0"),
    (dict(max_resident_tail="8"), r"max_resident_tail='8' must be"),
    (dict(max_resident_tail=2.0), r"max_resident_tail=2.0 must be"),
    (dict(max_segment_length=0), r"max_segment_length=0 must be a positive integer"),
    (dict(hardware=Hardware.preset("rtx3090", device_memory=float("inf"))), r"device_memory=inf must be finite"),
    # the profiler's arguments, ignored by a Hardware: an error, not a plan for the preset's budget
    (dict(device_memory=20e9), r"device_memory=20000000000\.0 applies only with hardware='measure'"),
    (dict(stream_dtype="float32"), r"stream_dtype='float32' applies only with hardware='measure'"),
    (dict(offload_dir="/tmp"), r"offload_dir='/tmp' applies only with hardware='measure'"),
])
@pytest.mark.parametrize("model", ["qwen3-debug", "costs"])
def test_plan_validates_solver_arguments(kw, match, model, capfd):
    target = reproducer()[0] if model == "costs" else model
    kw = {"hardware": "rtx3090", **kw}
    with pytest.raises(ValueError, match=match.replace("must be finite", "must be a finite number of bytes")):
        lt.plan(target, **kw)
    assert capfd.readouterr().out == ""


def test_cbc_prints_nothing(capfd):
    costs, hw = reproducer()
    lt.plan(costs, hw, rel_gap=0.0)  # CBC branches
    lt.plan(costs, hw)  # root LP stop
    lt.plan("qwen3-debug", "rtx3090", batch_size=4, seq_len=64)  # micro-batch loop with LP relaxations
    assert capfd.readouterr().out == ""


def test_costs_that_do_not_fit_name_the_memory_needed():
    costs, hw = reproducer()
    with pytest.raises(ValueError, match=r"needs at least 13\.10 GB of device memory \(device_memory=9\.00 GB\)"):
        lt.plan(costs, hw.replace(device_memory=9e9))
    with pytest.raises(ValueError, match=r"needs at least .* GB of device memory \(device_memory=2\.00 GB\)"):
        lt.plan(costs, hw.replace(device_memory=2e9, device_margin=0.5e9))  # below the constant terms


# ---- Plan JSON ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plan_dict():
    costs, hw = reproducer()
    return lt.plan(costs, hw).to_dict()


def changed(d, path, value=None, delete=False):
    d = json.loads(json.dumps(d))
    target = d
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return d


@pytest.mark.parametrize("path, value, delete, match", [
    (("hardware",), None, True, r"Plan: required field 'hardware' is missing"),
    (("name",), None, True, r"Plan: required field 'name' is missing"),
    (("costs",), None, False, r"Plan.costs=None must be an object"),
    (("hardware",), "rtx3090", False, r"Plan.hardware='rtx3090' must be an object"),
    (("costs", "weight_bytes", 2), "1e9", False, r"Plan.costs.weight_bytes=.* must be a list of finite numbers"),
    (("costs", "boundary_bytes", 0), float("nan"), False, r"Plan.costs.boundary_bytes=.* must be a list of finite"),
    (("costs", "batch_size"), 1.0, False, r"Plan.costs.batch_size=1.0 must be an integer"),
    (("costs", "unit_names"), "embed", False, r"Plan.costs.unit_names='embed' must be a list of strings"),
    (("costs", "seq_len"), None, True, r"Plan.costs: required field 'seq_len' is missing"),
    (("costs", "colour"), "red", False, r"Plan.costs: unknown field 'colour'"),
    (("keep_residuals",), 3, False, r"Plan.keep_residuals=3 must be a list of true/false"),
    (("keep_residuals",), [0, 1, 0, 1], False, r"Plan.keep_residuals=\[0, 1, 0, 1\] must be a list of true/false"),
    (("boundary_tiers",), "device", False, r"Plan.boundary_tiers='device' must be a list of strings"),
    (("offload_residuals",), [1, 0, 0, 0], False, r"Plan.offload_residuals=\[1, 0, 0, 0\] must be a list of true/false"),
    (("offload_residuals",), [True, False], False, r"Plan.offload_residuals has 2 entries; expected 4"),
    (("resident_tail",), "2", False, r"Plan.resident_tail='2' must be an integer"),
    (("predicted_step_time_s",), "fast", False, r"Plan.predicted_step_time_s='fast' must be a finite number"),
    (("gap",), "small", False, r"Plan.gap='small' must be a finite number or null"),
    (("solver_status",), 1, False, r"Plan.solver_status=1 must be a string"),
    (("hardware", "h2d_bw"), "fast", False, r"Plan.hardware.h2d_bw='fast' must be a number"),
    (("hardware", "device_memory"), None, True, r"Plan.hardware: required field 'device_memory' is missing"),
    (("hardware", "h2d_bw"), -1.0, False, r"Hardware.h2d_bw=-1.0 must be a number > 0"),
    (("version",), 2, False, r"Plan.version=2 is not supported"),
    (("colour",), "red", False, r"Plan: unknown field 'colour'"),
])
def test_plan_from_dict_names_the_field(plan_dict, path, value, delete, match):
    with pytest.raises(ValueError, match=match):
        Plan.from_dict(changed(plan_dict, path, value, delete))


def test_plan_from_json_accepts_what_plan_accepts():
    plan = lt.plan("qwen2.5-0.5b", "rtx3090", batch_size=1, seq_len=128)
    text = plan.to_json()
    for model in ("qwen2.5-0.5b", lt.get_preset("qwen2.5-0.5b"), types.SimpleNamespace(config=lt.get_preset("qwen2.5-0.5b")),
                  plan.costs, None):
        assert Plan.from_json(text, model=model) == plan
    with pytest.raises(ValueError, match="was solved for another model"):
        Plan.from_json(text, model="qwen3-8b")
    with pytest.raises(ValueError, match="unknown model preset 'qwen9'"):
        Plan.from_json(text, model="qwen9")
    with pytest.raises(ValueError, match="model=42 must be None, a Model"):
        Plan.from_json(text, model=42)
    with pytest.raises(ValueError, match="needs the JSON text; got dict"):
        Plan.from_json(plan.to_dict())
    with pytest.raises(ValueError, match="a Plan must be a JSON object; got list"):
        Plan.from_json("[]")
    assert dataclasses.replace(plan) == Plan.from_dict(json.loads(text))


def test_plan_json_without_offload_residuals_loads_with_no_offload(plan_dict):
    """Plans written before ``offload_residuals`` existed load unchanged: no residual on the host."""
    old = changed(plan_dict, ("offload_residuals",), delete=True)
    plan = Plan.from_dict(old)
    assert plan.offload_residuals == (False,) * plan.num_layers
    assert plan == Plan.from_dict(plan_dict) and plan.to_dict()["offload_residuals"] == [False] * plan.num_layers


def test_offload_residuals_needs_kept_residuals_and_a_layer_below_the_last(plan_dict):
    L = len(plan_dict["keep_residuals"])
    keep = [True] * L
    with pytest.raises(ValueError, match=r"Plan.offload_residuals\[0\]=True needs Plan.keep_residuals\[0\]=True"):
        Plan.from_dict({**plan_dict, "keep_residuals": [False] * L, "offload_residuals": [True] + [False] * (L - 1)})
    with pytest.raises(ValueError, match=rf"Plan.offload_residuals\[{L - 1}\]=True is not allowed; residual offload "
                                         rf"is for layers 0..{L - 2}"):
        Plan.from_dict({**plan_dict, "keep_residuals": keep, "offload_residuals": [False] * (L - 1) + [True]})
    ok = Plan.from_dict({**plan_dict, "keep_residuals": keep, "offload_residuals": [True] * (L - 1) + [False]})
    assert Plan.from_json(ok.to_json()) == ok
