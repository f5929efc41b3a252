"""lt.profile and lt.plan(hardware="measure"): measured costs, rates and a plan the engine runs."""

import dataclasses

import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import unit_costs
from plans import tiny_batch, tiny_model


def test_profile_measures_and_plans_for_this_machine():
    model = tiny_model("qwen3")
    costs, hw = lt.profile(model, 4, 16, num_micro_batches=2, stream_dtype="float32", device_memory=5e6,
                           repeats=1, link_bytes=1 << 20, disk_bytes=1 << 20)
    assert costs.source == "measured" and hw.name == "measured"
    for name in ("h2d_bw", "d2h_bw", "nvme_read_bw", "nvme_write_bw", "host_opt_rate", "device_flops"):
        assert np.isfinite(getattr(hw, name)) and getattr(hw, name) > 0, name
    assert all(t > 0 for t in costs.fwd_time[1:]) and all(t > 0 for t in costs.bwd_recompute_time[1:-1])
    assert costs.bwd_time[0] > 0  # the embedding's backward on the host (the engine's BE item), timed
    # the byte figures are the units' real arrays (same as unit_costs), the times measured
    ref = unit_costs(model, batch_size=4, seq_len=16, num_micro_batches=2, stream_dtype="float32")
    assert costs.residual_bytes == ref.residual_bytes and costs.weight_bytes == ref.weight_bytes
    again = lt.profile(model, 4, 16, num_micro_batches=2, stream_dtype="float32", device_memory=5e6,
                       repeats=1, link_bytes=1 << 20, disk_bytes=1 << 20)
    assert again[0] == costs                 # cached per (model, shapes, backend): the same measured figures
    # the host optimizer's work per unit: the embedding's and head's fp32-state tensors weighed by
    # their own measured rate (the layers as timed)
    assert costs.opt_params is not None and costs.optimizer_params[1:-1] == tuple(map(float, costs.num_params[1:-1]))
    assert costs.optimizer_params[0] > 0 and costs.optimizer_params[-1] > 0
    # the head's own upload and gradient download, timed against the link probe's rate
    assert len(costs.head_link_factor) == 2 and all(np.isfinite(f) and f > 0 for f in costs.head_link_factor)
    assert costs.link_weight_bytes[-1] == costs.weight_bytes[-1] * costs.head_link_factor[0]
    assert type(costs).from_dict(costs.to_dict()) == costs
    other_costs, other = lt.profile(model, 2, 16, stream_dtype="float32", device_memory=5e6, repeats=1,
                                    link_bytes=1 << 20, disk_bytes=1 << 20)
    assert other_costs.batch_size == 2 and other_costs.fwd_time != costs.fwd_time
    for name in ("h2d_bw", "d2h_bw", "nvme_read_bw", "nvme_write_bw", "host_opt_rate"):  # not per shape
        assert getattr(other, name) == getattr(hw, name), name
    assert other_costs.head_link_factor == costs.head_link_factor
    plan = lt.plan(costs, hw)
    assert plan.fits() and plan.predicted_peak_device_bytes <= 5e6
    batch = tiny_batch(model, 0, batch=4)
    with lt.StreamingEngine(model, plan, stream_dtype="float32", audit_memory=True) as eng:
        metrics = eng.step(batch)
    assert metrics["peak_device_bytes"] <= plan.predicted_peak_device_bytes


@pytest.mark.slow
def test_profile_host_and_nvme_room_are_this_machines(tmp_path):
    """Host room for activations: 80 % of the RAM available now less the model's host store; NVMe
    room: 90 % of the offload directory's free space; either can be given instead."""
    import shutil

    from lazytrain_jax.schedule import host
    model = tiny_model("qwen3")
    kw = dict(device_memory=5e6, repeats=1, link_bytes=1 << 20, disk_bytes=1 << 20, offload_dir=str(tmp_path))
    _, hw = lt.profile(model, 4, 16, **kw)
    store = host.store_bytes(model.config)["total"]
    assert 0 < hw.host_memory <= host.HOST_SHARE * host.available_bytes() * 1.05 - store
    assert 0 < hw.nvme_memory <= 0.9 * shutil.disk_usage(tmp_path).free * 1.05
    _, given = lt.profile(model, 4, 16, host_memory=3e9, nvme_memory=0.0, **kw)
    assert given.host_memory == 3e9 and given.nvme_memory == 0.0
    # an offload directory not made yet (the engine and the profiler make it): its disk's room
    fresh = tmp_path / "not" / "yet"
    _, later = lt.profile(model, 4, 16, **{**kw, "offload_dir": str(fresh)})
    assert 0 < later.nvme_memory <= 0.9 * shutil.disk_usage(tmp_path).free * 1.05
    plan = lt.plan(model, "measure", batch_size=4, seq_len=16, num_micro_batches=1, device_memory=5e6,
                   offload_dir=str(tmp_path / "p"))  # one count: the choice of counts is tested below
    assert plan.fits()


def test_profile_bad_input():
    model = tiny_model("qwen3")
    with pytest.raises(ValueError, match="device_memory is required"):
        lt.profile(model, 4, 16)
    with pytest.raises(ValueError, match="num_micro_batches=3"):
        lt.profile(model, 4, 16, num_micro_batches=3, device_memory=1e9)
    with pytest.raises(ValueError, match="batch_size='many'"):
        lt.plan(model, hardware="measure", batch_size="many", seq_len=16, device_memory=1e9)
    with pytest.raises(ValueError, match="num_micro_batches=3 must divide batch_size=4"):
        lt.plan(model, hardware="measure", batch_size=4, num_micro_batches=3, seq_len=16, device_memory=1e9)
    with pytest.raises(ValueError, match="rel_gap=2"):
        lt.plan(model, hardware="measure", batch_size=4, seq_len=16, device_memory=1e9, rel_gap=2)


def _measured_needs(model, batch, seq, counts):
    """The least peak device bytes of any plan at each micro-batch count (the units' real bytes,
    the memory objective of the MILP), under the rates ``plan(hardware="measure")`` measures."""
    from lazytrain_jax.executor import profiler
    from lazytrain_jax.schedule import api
    _, hw = lt.profile(model, 1, seq, stream_dtype="float32", device_memory=1e12)

    def byte_costs(b, m):
        return profiler.unit_costs(model.config, batch_size=b, seq_len=seq, num_micro_batches=m, stream_dtype="float32")
    return {m: api.min_device_bytes(model.config, hw, batch, seq, num_micro_batches=m, costs_for=byte_costs)
            for m in counts}


def test_measured_plan_splits_the_batch_into_micro_batches_where_one_does_not_fit(monkeypatch):
    """A budget below what any plan needs with one micro-batch and above what two need: the
    measured plan takes micro-batches (each count profiled at its own shapes, never a count at
    which nothing fits) and the engine runs it within the plan's peak; fixing one micro-batch is a
    clear error naming the largest batch."""
    from lazytrain_jax.executor import profiler
    model = tiny_model("qwen3")
    need = _measured_needs(model, 4, 16, (1, 2))
    assert need[2] < need[1]
    budget = 0.5 * (need[1] + need[2])
    kw = dict(seq_len=16, device_memory=budget, stream_dtype="float32")
    profiled, measure = [], profiler.measured_costs  # profile() calls it for each shape it times
    monkeypatch.setattr(profiler, "measured_costs", lambda *a, **k: profiled.append(
        (a[1], k["num_micro_batches"])) or measure(*a, **k))
    plan = lt.plan(model, "measure", batch_size=4, **kw)
    assert set(profiled) == {(4, 2), (4, 4)}  # 1 cannot fit: not profiled
    assert plan.num_micro_batches >= 2 and plan.fits() and plan.predicted_peak_device_bytes <= budget
    assert plan.costs.source == "measured" and plan.costs.num_micro_batches == plan.num_micro_batches
    with lt.StreamingEngine(model, plan, stream_dtype="float32", audit_memory=True) as eng:
        metrics = eng.step(tiny_batch(model, 0, batch=4))
    assert np.isfinite(metrics["loss"]) and metrics["peak_device_bytes"] <= plan.predicted_peak_device_bytes
    with pytest.raises(ValueError, match=r"no plan fits batch_size=4, seq_len=16, num_micro_batches=1 .*largest batch "
                                         r"that fits is [1-3]$"):
        lt.plan(model, "measure", batch_size=4, num_micro_batches=1, **kw)


def test_measured_max_batch_is_the_largest_that_fits():
    """``batch_size="max"`` with measured costs: the plan's batch fits and the next one does not
    (planned at a fixed batch, every micro-batch count profiled); ``"best"`` is at least as fast
    in tokens/s as the largest batch."""
    model = tiny_model("qwen3")
    budget = 0.5 * sum(_measured_needs(model, 4, 16, (1, 2)).values())
    kw = dict(seq_len=16, device_memory=budget, stream_dtype="float32")
    largest = lt.plan(model, "measure", batch_size="max", **kw)
    assert largest.fits() and largest.predicted_peak_device_bytes <= budget and largest.costs.source == "measured"
    with pytest.raises(ValueError, match=f"no plan fits batch_size={largest.batch_size + 1}"):
        lt.plan(model, "measure", batch_size=largest.batch_size + 1, **kw)
    best = lt.plan(model, "measure", batch_size="best", **kw)
    assert best.fits() and best.batch_size <= largest.batch_size
    assert best.tokens_per_s >= largest.tokens_per_s * (1 - 1e-9)


def test_optimizer_measurement_evicts_the_caches_only_where_a_step_would(monkeypatch):
    """The host optimizer's rate is timed with the unit's buffers out of the caches where the
    model's optimizer traffic per step exceeds the last-level cache (as in the engine's steps),
    writing twice that cache at most ``EVICT_MAX_BYTES``; a model whose traffic fits is timed warm."""
    from lazytrain_jax.executor import profiler
    monkeypatch.setattr(profiler, "_last_level_cache_bytes", lambda default=0: 1 << 20)
    allocated = []
    zeros = profiler.np.zeros

    def spy(n, *a, **k):
        allocated.append(n * 8)
        return zeros(n, *a, **k)

    monkeypatch.setattr(profiler.np, "zeros", spy)
    profiler._cache_evictor(1 << 20)()          # fits the cache: nothing written
    assert allocated == []
    evict = profiler._cache_evictor(1 << 30)
    evict()
    assert allocated == [2 << 20]
    monkeypatch.setattr(profiler, "EVICT_MAX_BYTES", 1 << 19)
    profiler._cache_evictor(1 << 30)
    assert allocated[-1] == 1 << 19


def test_optimizer_params_weigh_the_fp32_state_tensors_by_their_rate():
    """``profiler.optimizer_params``: the embedding's and head's tensors with fp32 Adam state (the
    default policy's embeddings, LM head, norms, biases) count rate / fp32 rate times; 8-bit ones
    and whole layers count once. The timing model then gives the unit that many parameters'
    time at ``host_opt_rate``."""
    from lazytrain_jax.executor import profiler
    from lazytrain_jax.model.config import get_preset
    from lazytrain_jax.schedule import timing
    from lazytrain_jax.schedule.costs import analytic_costs
    from lazytrain_jax.schedule.hardware import Hardware
    for name in ("qwen2.5-0.5b", "llama3-8b"):  # tied (head: a norm) and untied (head: lm_head + norm)
        cfg = get_preset(name, num_layers=2)
        costs = analytic_costs(cfg, batch_size=2, seq_len=64, device_flops=1e14)
        n32_embed, n32_head = profiler.fp32_state_params(cfg, "embed"), profiler.fp32_state_params(cfg, "head")
        assert n32_embed == costs.num_params[0]  # the whole table keeps fp32 state
        assert n32_head == costs.num_params[-1]  # lm_head (untied) and the final norm
        n32_layer = profiler.fp32_state_params(cfg, cfg.layer_kinds[0])
        assert 0 < n32_layer < costs.num_params[1] // 100  # norms (and biases): a sliver of a layer
        weighed = profiler.optimizer_params(costs, cfg, host_opt_rate=3e9, fp32_state_rate=1e9)
        assert weighed[0] == pytest.approx(3 * costs.num_params[0]) and weighed[-1] == pytest.approx(3 * costs.num_params[-1])
        assert weighed[1:-1] == tuple(map(float, costs.num_params[1:-1]))
        hw = Hardware(device_memory=80e9, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e14, host_opt_rate=3e9)
        c2 = dataclasses.replace(costs, opt_params=weighed)
        assert timing.unit_opt_time(c2, hw, 0) == pytest.approx(costs.num_params[0] / 1e9)
        assert timing.unit_opt_time(c2, hw, 1) == pytest.approx(costs.num_params[1] / 3e9)
        assert type(costs).from_dict(c2.to_dict()) == c2 and type(costs).from_dict(costs.to_dict()).opt_params is None
        plan = lt.Plan.create(c2, hw, name="x", boundary_tiers=["device"] * 3)
        assert lt.Plan.from_json(plan.to_json()).costs.opt_params == c2.opt_params
    with pytest.raises(ValueError, match=r"Costs.opt_params has 2 entries; expected 4"):
        dataclasses.replace(costs, opt_params=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"Costs.opt_params\[1\]=-1.0 must be >= 0"):
        dataclasses.replace(costs, opt_params=[1.0, -1.0, 1.0, 1.0])
