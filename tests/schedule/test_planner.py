import json
import subprocess
import sys

import pytest

import lazytrain_jax.schedule as sch
from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import heuristics, timing
from lazytrain_jax.schedule.api import plan
from lazytrain_jax.schedule.bounds import lower_bound
from lazytrain_jax.schedule.costs import analytic_costs
from lazytrain_jax.schedule.hardware import Hardware
from lazytrain_jax.schedule.plan import Plan
from lazytrain_jax.schedule.simulator import simulate
from lazytrain_jax.schedule.trace import chrome_trace, save_gantt_png


def test_schedule_never_imports_jax():
    code = "import lazytrain_jax.schedule, lazytrain_jax.schedule.api, sys; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


SHAPES = [("qwen2.5-7b", "rtx3090", 4),
          # 11 s and 66 s on the 2-core CI machine (several micro-batch counts, each a CBC run): slow run
          pytest.param("qwen2.5-14b", "h800", 96, marks=pytest.mark.slow),
          pytest.param("qwen2.5-3b", "a100-80g", 64, marks=pytest.mark.slow),
          ("qwen3.6-27b", "h800", 72)]


@pytest.mark.parametrize("model,hw,batch", SHAPES)
def test_milp_beats_heuristics_and_sim_agrees(model, hw, batch):
    hardware = Hardware.preset(hw, device_memory=70e9) if hw == "h800" else Hardware.preset(hw)
    p = plan(model, hardware, batch_size=batch, seq_len=1024, time_limit_s=10)
    sim = simulate(p, num_steps=2)
    assert sim.peak_device_bytes <= p.predicted_peak_device_bytes <= hardware.device_memory
    assert abs(sim.step_time_s - p.predicted_step_time_s) <= 0.05 * p.predicted_step_time_s
    assert lower_bound(p.costs, hardware)["total"] <= p.predicted_step_time_s + 1e-9
    for h in heuristics.all_heuristics(p.costs, hardware):
        hs = simulate(h, num_steps=2)
        assert abs(hs.step_time_s - h.predicted_step_time_s) <= 0.05 * h.predicted_step_time_s, h.name
        assert hs.peak_device_bytes <= h.predicted_peak_device_bytes
        if h.fits():
            assert sim.step_time_s <= hs.step_time_s * (1 + 1e-3), h.name


def test_plan_json_round_trip_and_explain(tmp_path):
    p = plan("qwen2.5-3b", "rtx3090", batch_size=2, seq_len=512)
    assert Plan.from_json(p.to_json(), model=get_preset("qwen2.5-3b")) == p
    path = tmp_path / "plan.json"
    p.save(str(path))
    assert Plan.load(str(path)) == p
    lines = p.explain().splitlines()
    rows = [ln.split() for ln in lines[2:2 + p.num_layers]]
    assert [int(r[0]) for r in rows] == list(range(p.num_layers))
    assert [r[1] for r in rows] == list(p.boundary_tiers[:-1])          # each layer's input tier
    total = lines[2 + p.num_layers].split()
    assert total[0] == "total" and int(total[1]) == sum(p.recompute) and int(total[3]) == p.resident_tail
    assert float(total[4]) == pytest.approx(sum(float(r[-3]) for r in rows), abs=0.02)  # H2D GB column sums
    assert f"{p.predicted_step_time_s:.3f} s" in p.explain()
    d = json.loads(p.to_json())
    d["version"] = 99
    with pytest.raises(ValueError, match="version"):
        Plan.from_json(json.dumps(d))
    with pytest.raises(ValueError, match="another model"):
        Plan.from_json(p.to_json(), model=get_preset("qwen2.5-7b"))


def _check_max_batch(model, hw, seq_len):
    p = plan(model, hw, batch_size="max", seq_len=seq_len, num_micro_batches=1)
    assert p.fits()
    with pytest.raises(ValueError, match=f"largest batch that fits is {p.batch_size}"):
        plan(model, hw, batch_size=p.batch_size + 1, seq_len=seq_len, num_micro_batches=1)
    return p


def test_max_batch_and_infeasible_message():
    p = _check_max_batch("qwen2.5-0.5b", Hardware.preset("rtx3090", device_memory=8e9, host_memory=1e9), 512)
    assert p.batch_size > 8


@pytest.mark.slow
def test_max_batch_and_infeasible_message_7b():
    # the memory-minimisation MILPs near the feasibility frontier take tens of seconds here
    _check_max_batch("qwen2.5-7b", Hardware.preset("rtx3090", host_memory=2e9), 1024)


@pytest.mark.slow  # 15 s: a plan per candidate batch
def test_best_batch_has_highest_predicted_throughput():
    hw = Hardware.preset("rtx3090", device_memory=5e9, host_memory=1e9)
    best = plan("qwen2.5-0.5b", hw, batch_size="best", seq_len=512, num_micro_batches=1)
    largest = plan("qwen2.5-0.5b", hw, batch_size="max", seq_len=512, num_micro_batches=1)
    assert best.fits() and best.batch_size <= largest.batch_size
    # "best" is best within its reported gap (batches whose bound is within rel_gap are not solved)
    assert 0.0 <= best.gap <= 1e-2 + 1e-9
    assert best.tokens_per_s >= largest.tokens_per_s * (1 - best.gap - 1e-9)
    for b in sorted({1, 2, max(1, largest.batch_size // 2), largest.batch_size - 1} - {0}):
        fixed = plan("qwen2.5-0.5b", hw, batch_size=b, seq_len=512)
        assert best.tokens_per_s >= fixed.tokens_per_s * (1 - best.gap - 1e-9), b


@pytest.mark.parametrize("kwargs,match", [
    (dict(device_memory=0), "device_memory"), (dict(h2d_bw=-1), "h2d_bw"), (dict(nvme_read_bw=0), "nvme_read_bw"),
    (dict(host_memory=-5), "host_memory"),
])
def test_bad_hardware(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Hardware.preset("h100", **kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="Valid presets"):
        Hardware.preset("tpu-v9")
    with pytest.raises(ValueError, match="seq_len=0"):
        plan("qwen2.5-3b", "rtx3090", batch_size=1, seq_len=0)
    with pytest.raises(ValueError, match="batch_size=0"):
        plan("qwen2.5-3b", "rtx3090", batch_size=0, seq_len=128)
    with pytest.raises(ValueError, match="batch_size='most'"):
        plan("qwen2.5-3b", "rtx3090", batch_size="most", seq_len=128)
    with pytest.raises(ValueError, match="unknown model preset"):
        plan("qwen9-1t", "rtx3090", batch_size=1, seq_len=128)
    costs = analytic_costs(get_preset("qwen2.5-0.5b"), batch_size=1, seq_len=64, device_flops=1e13)
    with pytest.raises(ValueError, match="boundary_tiers"):
        Plan.create(costs, Hardware.preset("h100"), name="x", boundary_tiers=["device"] * 3)


def test_costs_round_trip_and_heterogeneous_layers():
    """Layers of different kinds and sizes are first class: every per-unit list is read per layer."""
    import dataclasses

    from lazytrain_jax.schedule import memory, steps, timing
    from lazytrain_jax.schedule.costs import synthetic_costs
    base = synthetic_costs(num_layers=4, weight_bytes=[1e8, 4e8, 2e8, 3e8], boundary_bytes=[1e7, 2e7, 3e7, 4e7, 5e7],
                           fwd_time=[0.01, 0.04, 0.02, 0.03], residual_bytes=[5e7, 6e7, 7e7, 8e7], head_bytes=5e8,
                           head_time=0.02)
    costs = dataclasses.replace(base, unit_kinds=("embed", "decoder", "gated_deltanet", "decoder", "gated_deltanet",
                                                  "head"))
    assert sch.Costs.from_json(costs.to_json()) == costs
    hw = Hardware(device_memory=80e9, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e14)
    p = Plan.create(costs, hw, name="x", boundary_tiers=["device", "host", "drop", "device", "device"],
                    keep_residuals=[True, False, True, False])
    seq = {it.name: it for it in timing.items(costs, p)}
    for l in range(4):
        assert seq[f"F{l}"].compute == costs.fwd_time[l + 1] and seq[f"F{l}"].weight_bytes == costs.weight_bytes[l + 1]
        expect = costs.bwd_time[l + 1] if p.keep_residuals[l] else costs.bwd_recompute_time[l + 1]
        assert seq[f"B{l}"].compute == expect
        assert costs.unit_names[seq[f"B{l}"].weight_unit] == f"layer_{l}"
    assert seq["RC1"].compute == costs.fwd_time[2] and seq["RC1"].boundary_in == 1  # segment (1, 3) from host
    moved = {t.kind: t for t in steps.transfers(costs, p) if t.ref == 1 and t.kind in ("offload", "boundary")}
    assert moved["offload"].amount == moved["boundary"].amount == costs.boundary_bytes[1]
    d = memory.device_breakdown(costs, hw, p)
    assert d["weight_buffers"] == 2 * 4e8 and d["residuals"] == 5e7 + 7e7 and d["boundaries_device"] == 4e7
    assert d["recompute_working_set"] == costs.boundary_bytes[2] + costs.boundary_bytes[1]


def test_unit_addressing():
    from lazytrain_jax.schedule import steps
    costs = analytic_costs(get_preset("qwen2.5-0.5b"), batch_size=1, seq_len=64, device_flops=1e13)
    L = costs.num_layers
    for u, name in enumerate(costs.unit_names):
        assert steps.unit_name(u, L) == name and steps.unit_index(name, L) == u
    assert steps.unit_param_path(0, L) == ("embed",) and steps.unit_param_path(3, L) == ("layers", 2)
    assert steps.unit_param_path(L + 1, L) == ("head",) and steps.layer_unit(2) == 3
    for bad in ("layer_99", "layers_1", "lm_head"):
        with pytest.raises(ValueError, match="unit name"):
            steps.unit_index(bad, L)
    with pytest.raises(ValueError, match="unit="):
        steps.unit_name(L + 2, L)


def test_trace_and_gantt(tmp_path):
    p = plan("qwen2.5-0.5b", "rtx3090", batch_size=2, seq_len=256)
    r = simulate(p)
    trace = chrome_trace(r)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert xs and {e["tid"] for e in xs} >= {1, 2, 3}
    pytest.importorskip("matplotlib")
    save_gantt_png(r, str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").stat().st_size > 1000


@pytest.mark.parametrize("model,tied", [("qwen2.5-3b", True), ("qwen2.5-7b", False)])
def test_megatrain_keeps_embedding_and_head_resident(model, tied):
    config = get_preset(model)
    hw = Hardware.preset("rtx3090")
    costs = analytic_costs(config, batch_size=2, seq_len=512, device_flops=hw.device_flops)
    mt = heuristics.megatrain(costs, hw, 4)
    table = config.vocab_size * config.hidden_size
    extra = 0 if tied else table * 2 * 2  # bf16 weights and bf16 gradients of the untied table
    assert mt.costs.head_workspace_bytes == pytest.approx(costs.head_workspace_bytes + extra)
    assert mt.costs.weight_bytes[-1] == 0 and mt.costs.grad_bytes[-1] == 0  # head not streamed
    assert mt.costs.weight_bytes[0] == pytest.approx(costs.weight_bytes[-1] + (0 if tied else table * 2))
    assert mt.optimizer_mode == "serial" and set(mt.boundary_tiers) <= {"device", "drop"}
    assert not any(mt.keep_residuals) and mt.weight_prefetch_depth == 1
    assert [i for i, t in enumerate(mt.boundary_tiers) if t == "device"] == \
        sorted({i for i in range(0, config.num_layers + 1, 4)} | {config.num_layers})
    sim = simulate(mt, num_steps=2)
    assert abs(sim.step_time_s - mt.predicted_step_time_s) <= 0.05 * mt.predicted_step_time_s


def test_plan_save_is_atomic(tmp_path, monkeypatch):
    import os

    from lazytrain_jax import atomic
    from lazytrain_jax.schedule import heuristics
    from lazytrain_jax.schedule.costs import synthetic_costs
    from lazytrain_jax.schedule.hardware import Hardware

    hw = Hardware.preset("rtx3090")
    plan = heuristics.every_layer(synthetic_costs(num_layers=4, weight_bytes=1e6, boundary_bytes=1e5, fwd_time=1e-3), hw)
    path = tmp_path / "plan.json"
    plan.save(path)
    before = path.read_text()

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        heuristics.full_recompute(synthetic_costs(num_layers=4, weight_bytes=1e6, boundary_bytes=1e5, fwd_time=1e-3), hw).save(path)
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["plan.json"]
    # a directory whose permission bits let root write but where no file can be made: the error
    # names the path asked for, not the temporary file's name
    monkeypatch.undo()
    if os.path.isdir("/proc/self"):
        with pytest.raises(PermissionError, match=r"^cannot write /proc/plan\.json: .+ in /proc$"):
            plan.save("/proc/plan.json")
        with pytest.raises(PermissionError, match=r"^cannot write /proc/plan\.json: .+ in /proc$"):
            atomic.check_writable_file_path("/proc/plan.json")
    assert atomic.check_writable_file_path(tmp_path / "new.json") == str(tmp_path / "new.json")
    assert os.listdir(tmp_path) == ["plan.json"]   # the probe file is gone


def test_plan_residual_offload_option():
    """lt.plan keeps residuals on the host where that wins, and not when asked not to."""
    from tests.schedule.test_milp_exhaustive import hardware_for, instance
    costs = instance(5, 9)
    hw = hardware_for(costs, 9, 20, 0, 60)
    with_host = plan(costs, hw, max_segment_length=4, rel_gap=0.0)
    without = plan(costs, hw, max_segment_length=4, rel_gap=0.0, residual_offload=False)
    assert any(with_host.offload_residuals) and not any(without.offload_residuals)
    assert with_host.predicted_step_time_s < without.predicted_step_time_s
    with pytest.raises(ValueError, match="residual_offload='no' must be True or False"):
        plan(costs, hw, residual_offload="no")


def test_repredict_keeps_every_decision():
    """Plan.repredict carries every decision (the residual offload too) to other costs, hardware or
    depths, and its predictions are those of a plan created there from scratch."""
    from tests.schedule.test_milp_exhaustive import hardware_for, instance
    costs = instance(5, 9)
    hw = hardware_for(costs, 9, 20, 0, 60)
    p = plan(costs, hw, max_segment_length=4, rel_gap=0.0)
    assert any(p.offload_residuals)
    decisions = ("boundary_tiers", "keep_residuals", "offload_residuals", "resident_tail", "weight_prefetch_depth",
                 "act_prefetch_depth", "optimizer_mode", "name", "solver_status")
    slower = hw.replace(h2d_bw=hw.h2d_bw / 3, d2h_bw=hw.d2h_bw / 3)
    moved = p.repredict(hardware=slower)
    assert all(getattr(moved, f) == getattr(p, f) for f in decisions)
    fresh = Plan.create(costs, slower, **{f: getattr(p, f) for f in decisions})
    assert moved.predicted_step_time_s == fresh.predicted_step_time_s > p.predicted_step_time_s
    assert moved.predicted_peak_device_bytes == fresh.predicted_peak_device_bytes
    deeper = p.repredict(act_prefetch_depth=2)
    assert deeper.act_prefetch_depth == 2 and deeper.offload_residuals == p.offload_residuals
    assert deeper.predicted_peak_device_bytes > p.predicted_peak_device_bytes
    assert p.repredict().replace(gap=p.gap, solve_time_s=p.solve_time_s) == p  # the solve's own, not carried
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['tiers'\]"):
        p.repredict(tiers=p.boundary_tiers)


def test_one_layer_model_plans_under_a_tight_budget():
    """A model with one layer has no interior boundary: under a budget just above the least peak
    any plan needs (all-device does not fit), the planner still returns a fitting plan, and below
    that peak it says how much memory would fit (its Costs planned as ``plan="auto"`` does)."""
    from lazytrain_jax.schedule.api import NoPlanFits, min_device_bytes
    cfg = get_preset("qwen3-debug").replace(num_layers=1, layer_kinds=("decoder",))
    hw = Hardware.preset("rtx3090", device_margin=0.0)
    costs = analytic_costs(cfg, batch_size=4, seq_len=64, device_flops=hw.device_flops)
    least = min_device_bytes(cfg, hw, 4, 64, num_micro_batches=1)
    all_device = plan(costs, hw.replace(device_memory=1e12))
    assert least < all_device.predicted_peak_device_bytes  # the budget below forces a trade-off
    p = plan(costs, hw.replace(device_memory=1.001 * least))
    assert p.fits() and p.predicted_peak_device_bytes <= 1.001 * least
    for budget in (0.99 * least, 1e5):
        with pytest.raises(NoPlanFits, match=r"needs at least \d+\.\d\d MB of device memory"):
            plan(costs, hw.replace(device_memory=budget))


def test_a_plan_is_returned_wherever_one_fits(monkeypatch):
    """Near the least peak no heuristic fits and the MILP's node budget may end without a plan;
    ``plan_for_costs`` then starts from a fitting plan (the memory-first search's, else the
    least-peak plan, else the first fitting plan of the memory MILP) and returns a fitting plan
    whenever one exists, None only below the least peak."""
    from lazytrain_jax.schedule import api, least_peak, milp, search
    cfg = get_preset("qwen2.5-0.5b")
    hw = Hardware.preset("rtx3090", device_margin=0.0, host_memory=0.0)  # no host tier: no offload_all_host
    costs = analytic_costs(cfg, batch_size=4, seq_len=1024, device_flops=hw.device_flops)
    least = api.min_device_bytes(cfg, hw, 4, 1024, num_micro_batches=1)
    tight = hw.replace(device_memory=least * (1 + 1e-9))
    assert api.best_heuristic(costs, tight) is None          # no heuristic fits there
    start = api.fitting_start(costs, tight)
    assert start is not None and start.fits() and start.predicted_peak_device_bytes <= tight.device_memory
    # the searches finding nothing: the least-peak plan (one boundary size), else the memory
    # MILP's first plan under this budget
    monkeypatch.setattr(search, "heuristic_plan", lambda *a, **k: None)
    monkeypatch.setattr(search, "spaced_checkpoints", lambda *a, **k: None)
    start = api.fitting_start(costs, tight)
    assert start.name == "least-peak" and start.fits() and start.hardware == tight
    assert api.fitting_start(costs, hw.replace(device_memory=0.999 * least)) is None
    monkeypatch.setattr(least_peak, "least_peak_plan", lambda *a, **k: None)
    start = api.fitting_start(costs, tight)
    assert start.name == "first-fitting" and start.fits() and start.hardware == tight
    assert api.fitting_start(costs, hw.replace(device_memory=0.999 * least)) is None
    # the time MILP ending with no plan: the fitting start is returned
    solve = milp.solve
    monkeypatch.setattr(milp, "solve", lambda c, h, **k: solve(c, h, **k) if k.get("objective") == "memory" else None)
    p = api.plan_for_costs(costs, tight)
    assert p is not None and p.fits()


def test_ideal_plan_bounds_every_plan_when_recompute_measures_faster():
    """Measured times can put a layer's backward with in-layer recompute below its backward from
    kept residuals (timing noise on small layers). The pruning bound of the micro-batch loop
    (``ideal_plan``) must still be below every plan, so the loop never prunes a count that holds
    the only fitting plans."""
    import dataclasses

    from lazytrain_jax.schedule import api
    cfg = get_preset("qwen3-debug")
    hw = Hardware.preset("rtx3090", device_margin=0.0, host_memory=0.0)
    costs = analytic_costs(cfg, batch_size=4, seq_len=256, device_flops=hw.device_flops)
    L = costs.num_layers
    # the recompute backward measured at 0.75x the plain one on every other layer
    bwd_rc = tuple(costs.bwd_time[i] * 0.75 if 1 <= i <= L and i % 2 else costs.bwd_recompute_time[i]
                   for i in range(L + 2))
    costs = dataclasses.replace(costs, bwd_recompute_time=bwd_rc)
    ideal = timing.step_time(costs, hw, api.ideal_plan(costs, hw))
    least = api.min_device_bytes(cfg, hw, 4, 256, num_micro_batches=1,
                                 costs_for=lambda b, m: costs)
    for budget in (least * (1 + 1e-9), 2 * least, 1e12):
        tight = hw.replace(device_memory=budget)
        plans = [p for p in heuristics.all_heuristics(costs, tight) if p.fits()]
        best = api.best_over_micro_batches([(1, costs, tight)])
        assert best is not None and best.fits()
        for p in plans + [best]:
            assert ideal <= p.predicted_step_time_s + 1e-12, (p.name, ideal, p.predicted_step_time_s)


def test_best_first_over_batches_within_its_gap_of_every_candidate_solved():
    """``batch_size="best"``'s search over every (batch, micro-batch count) at once: its plan's
    time per token is within its reported gap of every candidate solved on its own, and the
    candidates whose bounds leave no room for a better plan are never solved."""
    from lazytrain_jax.schedule import api
    cfg = get_preset("qwen2.5-0.5b", num_layers=6)
    hw = Hardware.preset("rtx3090", device_memory=6e9, host_memory=4e9)
    candidates = [(m, api._costs_for(cfg, hw, b, 512, m, "bfloat16"), hw)
                  for b in (4, 8, 16, 32) for m in api.micro_batch_candidates(b)]
    solved = []
    plan_for_costs = api.plan_for_costs

    def counted(costs, hardware, **kw):
        solved.append((costs.batch_size, costs.num_micro_batches))
        return plan_for_costs(costs, hardware, **kw)

    api.plan_for_costs = counted
    try:
        best = api.best_over_micro_batches(candidates, rel_gap=1e-2)
    finally:
        api.plan_for_costs = plan_for_costs
    assert best is not None and best.fits() and best.solver_status == "optimal" and best.gap <= 1e-2
    best_tpt = best.predicted_step_time_s / (best.batch_size * 512)
    each = [api.plan_for_costs(c, h, rel_gap=1e-2) for _, c, h in candidates]
    least = min(p.predicted_step_time_s / (p.batch_size * 512) for p in each if p is not None)
    assert best_tpt * (1 - best.gap) <= least * (1 + 1e-9)
    assert len(solved) < len(candidates) and (best.batch_size, best.num_micro_batches) in solved


def test_best_first_computes_each_candidates_heuristic_once(monkeypatch):
    """The best fitting heuristic of each candidate is computed once: for the upper bound, and
    handed to the solves as their warm start (same plan as each solve computing its own)."""
    from lazytrain_jax.schedule import api
    cfg = get_preset("qwen2.5-0.5b", num_layers=6)
    hw = Hardware.preset("rtx3090", device_memory=6e9, host_memory=4e9)
    candidates = [(m, api._costs_for(cfg, hw, b, 512, m, "bfloat16"), hw)
                  for b in (4, 8, 16) for m in api.micro_batch_candidates(b)]
    before = api.best_over_micro_batches(candidates, rel_gap=1e-2)
    calls = []
    best_heuristic = api.best_heuristic

    def counted(costs, hardware):
        calls.append((costs.batch_size, costs.num_micro_batches))
        return best_heuristic(costs, hardware)

    monkeypatch.setattr(api, "best_heuristic", counted)
    best = api.best_over_micro_batches(candidates, rel_gap=1e-2)
    assert len(calls) == len(set(calls)) == sum(api._constants_fit(c, h) for _, c, h in candidates) > 1
    assert (best.boundary_tiers, best.keep_residuals, best.batch_size, best.num_micro_batches,
            best.predicted_step_time_s) == (before.boundary_tiers, before.keep_residuals, before.batch_size,
                                            before.num_micro_batches, before.predicted_step_time_s)
    calls.clear()
    api.plan_for_costs(candidates[0][1], hw)  # on its own, a solve computes its heuristic itself
    assert len(calls) == 1


def test_spaced_checkpoints_fit_where_the_greedy_search_finds_nothing():
    """Qwen3.6-27B on an H800 at 392 sequences in 56 micro-batches: 4 GB boundaries, 15 GB of host
    memory and 32 GB of NVMe. Only boundaries every 7 layers, on NVMe and the host, fit the device;
    the memory-first greedy search finds no plan, ``search.spaced_checkpoints`` finds one (so the
    largest-batch test needs no MILP there), with every segment within the segment limit."""
    from lazytrain_jax.schedule import api, search
    cfg, hw = get_preset("qwen3.6-27b"), Hardware.preset("h800")
    costs = api._costs_for(cfg, hw, 392, 1024, 56, "bfloat16")
    assert search.heuristic_plan(costs, hw, max_evaluations=0, memory_first=True) is None
    assert not any(h.fits() for h in heuristics.all_heuristics(costs, hw))
    p = search.spaced_checkpoints(costs, hw, max_segment_length=8)
    assert p is not None and p.fits()
    kept = [i for i, t in enumerate(p.boundary_tiers) if t != "drop"]
    assert max(b - a for a, b in zip(kept, kept[1:])) <= 8
    assert {"nvme", "host"} <= set(p.boundary_tiers)
    assert api.fits_by_search(cfg, hw, 392, 1024, num_micro_batches=56)
    # 396 sequences in 44 micro-batches do not fit (the memory MILP proves it): nothing spaced fits either
    assert search.spaced_checkpoints(api._costs_for(cfg, hw, 396, 1024, 44, "bfloat16"), hw) is None
