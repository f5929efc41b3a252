"""lt.profile and lt.plan(hardware="measure"): measured costs, rates and a plan the engine runs."""

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
    # the byte figures are the units' real arrays (same as unit_costs), the times measured
    ref = unit_costs(model, batch_size=4, seq_len=16, num_micro_batches=2, stream_dtype="float32")
    assert costs.residual_bytes == ref.residual_bytes and costs.weight_bytes == ref.weight_bytes
    again = lt.profile(model, 4, 16, num_micro_batches=2, stream_dtype="float32", device_memory=5e6,
                       repeats=1, link_bytes=1 << 20, disk_bytes=1 << 20)
    assert again[0] is costs                                    # cached per (model, shapes, backend)
    plan = lt.plan(costs, hw)
    assert plan.fits() and plan.predicted_peak_device_bytes <= 5e6
    batch = tiny_batch(model, 0, batch=4)
    with lt.StreamingEngine(model, plan, stream_dtype="float32", audit_memory=True) as eng:
        metrics = eng.step(batch)
    assert metrics["peak_device_bytes"] <= plan.predicted_peak_device_bytes


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


def test_profile_bad_input():
    model = tiny_model("qwen3")
    with pytest.raises(ValueError, match="device_memory is required"):
        lt.profile(model, 4, 16)
    with pytest.raises(ValueError, match="num_micro_batches=3"):
        lt.profile(model, 4, 16, num_micro_batches=3, device_memory=1e9)
    with pytest.raises(ValueError, match="hardware='measure'"):
        lt.plan(model, hardware="measure", batch_size="max", seq_len=16, device_memory=1e9)


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
