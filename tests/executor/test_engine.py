"""StreamingEngine: the NVMe tier's files, bad input, compilations, timeline, bf16 streaming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import optax
import pytest

import lazytrain_jax as lt
from lazytrain_jax.executor import OffloadError
from lazytrain_jax.executor.engine import device_fns, head_fn
from lazytrain_jax.schedule.plan import Plan
from plans import HARDWARE, costs_for, rel_err, tiny_batch, tiny_model
from tests.trace_check import assert_valid_trace

FAMILY = "qwen3"


def nvme_plan(model, M=2, batch=4):
    L = model.config.num_layers
    tiers = ["device", "nvme", "drop", "nvme"] + ["device"] * (L - 3)
    return Plan.create(costs_for(model, M, "float32", batch), HARDWARE, name="nvme", boundary_tiers=tiers,
                       keep_residuals=[False] * L, optimizer_mode="serial")


def test_nvme_tier_writes_reads_and_removes_files(tmp_path, monkeypatch):
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    batch = tiny_batch(model, 0, batch=plan.batch_size)
    ref_loss, ref_grads = lt.loss_and_grad(model, batch)
    seen = []
    from lazytrain_jax.executor import nvme as nvme_mod
    orig_read = nvme_mod.NvmeStore.read

    def spy_read(self, key, **kw):
        seen.append(sorted(os.listdir(self.directory)))
        return orig_read(self, key, **kw)

    monkeypatch.setattr(nvme_mod.NvmeStore, "read", spy_read)
    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32", offload_dir=str(tmp_path)) as eng:
        loss, grads = eng.loss_and_grad(batch)
        assert rel_err(ref_grads, grads) <= 1e-5 and abs(loss - float(ref_loss)) <= 1e-5 * float(ref_loss)
        assert any(f.startswith("b1_m") for files in seen for f in files)   # files really on disk
        assert any(f.startswith("b3_m") for files in seen for f in files)
        assert os.listdir(tmp_path) == []                                   # all removed after use
        assert 0 < eng.nvme.peak_bytes_on_disk <= plan.predicted_peak_nvme_bytes
        assert eng.nvme.bytes_written == eng.nvme.bytes_read == 2 * plan.costs.boundary_bytes[1]


def test_corrupted_offload_file_raises_and_keeps_params(tmp_path, monkeypatch):
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    batch = tiny_batch(model, 0, batch=plan.batch_size)
    from lazytrain_jax.executor import nvme as nvme_mod
    orig_write = nvme_mod.NvmeStore.write

    def corrupt_write(self, key, array):
        orig_write(self, key, array)
        if key == "b3_m1":
            with open(self.path(key), "r+b") as f:
                f.seek(5)
                f.write(b"\x7f")

    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32", offload_dir=str(tmp_path)) as eng:
        eng.step(batch)
        before = eng.params
        monkeypatch.setattr(nvme_mod.NvmeStore, "write", corrupt_write)
        with pytest.raises(OffloadError, match="corrupted"):
            eng.step(batch)
        after = eng.params
        assert rel_err(before, after) == 0.0       # the failed step applied nothing
        monkeypatch.setattr(nvme_mod.NvmeStore, "write", orig_write)
        eng.step(batch)                            # and the engine keeps working


def test_missing_offload_file_raises(tmp_path, monkeypatch):
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    batch = tiny_batch(model, 0, batch=plan.batch_size)
    from lazytrain_jax.executor import nvme as nvme_mod
    orig_write = nvme_mod.NvmeStore.write

    def vanish(self, key, array):
        orig_write(self, key, array)
        os.remove(self.path(key))

    monkeypatch.setattr(nvme_mod.NvmeStore, "write", vanish)
    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32", offload_dir=str(tmp_path)) as eng:
        with pytest.raises(OffloadError, match="reading"):
            eng.loss_and_grad(batch)


def test_unwritable_and_full_offload_dir(tmp_path, monkeypatch):
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OffloadError, match="offload_dir"):
        lt.StreamingEngine(model, plan, optax.sgd(0.1), offload_dir=str(blocker / "sub"))
    from lazytrain_jax.executor import nvme as nvme_mod

    def full(self, key, array):  # what a full disk does at the failing write
        raise OffloadError(f"NVMe tier: writing {self.path(key)} failed: No space left on device")

    batch = tiny_batch(model, 0, batch=plan.batch_size)
    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32", offload_dir=str(tmp_path / "o")) as eng:
        before = eng.params
        monkeypatch.setattr(nvme_mod.NvmeStore, "write", full)
        with pytest.raises(OffloadError, match="No space left"):
            eng.step(batch)
        assert rel_err(before, eng.params) == 0.0


def test_bad_input_is_refused():
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    other = tiny_model("llama")
    with pytest.raises(ValueError, match="another model"):
        lt.StreamingEngine(other, plan)
    with pytest.raises(ValueError, match="stream_dtype"):
        lt.StreamingEngine(model, plan, stream_dtype="int8")
    with pytest.raises(ValueError, match="serial"):
        lt.StreamingEngine(model, plan.replace(optimizer_mode="pipelined"), optax.sgd(0.1))
    with lt.StreamingEngine(model, plan, optax.sgd(0.1)) as eng:
        with pytest.raises(ValueError, match=r"\[2, 16\].*\[4, 16\]"):
            eng.loss_and_grad(tiny_batch(model, 0, batch=2))
        bad = tiny_batch(model, 0, batch=4)
        bad["input_ids"][2, 5] = model.config.vocab_size
        with pytest.raises(ValueError, match="input_ids"):
            eng.loss_and_grad(bad)
    mesh = jax.make_mesh((1,), ("model",))
    with pytest.raises(ValueError, match="'data'"):
        lt.StreamingEngine(model, plan, optax.sgd(0.1), mesh=mesh)


def test_one_compilation_per_kind_and_shape():
    """Forward and backward compile once per layer kind and shape, whatever the number of layers."""
    model = tiny_model(FAMILY)
    plan = Plan.create(costs_for(model, 1, "float32", 4), HARDWARE, name="all",
                       boundary_tiers=["device", "drop", "device", "drop", "host", "drop", "device"],
                       keep_residuals=[True, False] * 3, optimizer_mode="serial")
    batch = tiny_batch(model, 0, batch=4)
    fns = device_fns(model.config, "decoder")
    before = {k: f._cache_size() for k, f in fns.items()}
    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32") as eng:
        eng.loss_and_grad(batch)
        eng.step(batch)
        eng.step(batch)
    grew = {k: fns[k]._cache_size() - before[k] for k in fns}
    assert all(v <= 1 for v in grew.values()), grew            # at most one new compilation each ...
    assert sum(grew.values()) >= 0
    after = {k: f._cache_size() for k, f in fns.items()}
    assert all(v == 1 for v in after.values()) or all(v <= 3 for v in after.values())  # ... per shape seen
    assert head_fn(model.config)._cache_size() <= 3


def test_timeline_and_trace(tmp_path):
    model = tiny_model(FAMILY)
    plan = nvme_plan(model)
    batch = tiny_batch(model, 0, batch=plan.batch_size)
    with lt.StreamingEngine(model, plan, optax.sgd(0.1), stream_dtype="float32") as eng:
        eng.step(batch)
        metrics = eng.step(batch)
        path = tmp_path / "trace.json"
        eng.save_trace(str(path))
    names = [w[0] for w in eng.timeline.item_windows]
    assert names == [it.name for it in eng.items]                   # one measured window per item
    channels = {iv.channel for iv in eng.timeline.intervals}
    assert {"compute", "h2d", "d2h", "nvme_write", "nvme_read", "optimizer"} <= channels
    events = assert_valid_trace(path)
    assert {ev["pid"] for ev in events} == {1, 2}     # measured and predicted
    assert metrics["step_time_s"] > 0 and metrics["busy"]["compute"] > 0


def test_bf16_streaming_against_bf16_resident():
    """bf16 weights and activations (fp32 master) against the resident path on a bf16 copy of the
    model: the loss within 1e-2 relative and the gradient's direction within cosine 0.99 (bf16 has
    8 mantissa bits; the two paths round at different places)."""
    model = tiny_model(FAMILY)
    costs = costs_for(model, 2, "bfloat16", 4)
    plan = Plan.create(costs, HARDWARE, name="bf16", boundary_tiers=["device", "host", "drop", "device", "drop",
                                                                     "device", "device"],
                       keep_residuals=[True] * 6, optimizer_mode="pipelined")
    batch = tiny_batch(model, 0, batch=4)
    bf16 = lt.Model(config=model.config.replace(dtype="bfloat16"),
                    params=jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16), model.params))
    ref_loss, ref_grads = lt.loss_and_grad(bf16, batch)
    with lt.StreamingEngine(model, plan) as eng:
        loss, grads = eng.loss_and_grad(batch)
        eng.step(batch)
    assert abs(loss - float(ref_loss)) <= 1e-2 * abs(float(ref_loss))
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(ref_grads)])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(grads)])
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= 0.99


DP_SCRIPT = textwrap.dedent("""
    import os, sys, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    sys.path.insert(0, {tests!r})
    import jax, numpy as np, optax
    import lazytrain_jax as lt
    from plans import tiny_model, tiny_batch, costs_for, HARDWARE, rel_err
    from lazytrain_jax.schedule.plan import Plan
    assert len(jax.devices()) == 2
    model = tiny_model("qwen3")
    plan = Plan.create(costs_for(model, 2, "float32", 4), HARDWARE, name="dp",
                       boundary_tiers=["device", "host", "drop", "nvme", "drop", "device", "device"],
                       keep_residuals=[True, False] * 3, offload_residuals=[True, False, True, False, False, False],
                       resident_tail=1, optimizer_mode="pipelined")
    batch = tiny_batch(model, 0, batch=4)
    tx = lt.optim.adamw_8bit(learning_rate=1e-3, eps=1e-3, state_format="fp32", max_grad_norm=1.0)
    out = {{}}
    runs = {{}}
    for name, mesh in (("single", None), ("dp", jax.make_mesh((2,), ("data",)))):
        with lt.StreamingEngine(model, plan, tx, stream_dtype="float32", mesh=mesh) as eng:
            loss, grads = eng.loss_and_grad(batch)
            for _ in range(3):
                eng.step(batch)
            runs[name] = (loss, grads, eng.params)
    out["loss"] = abs(runs["dp"][0] - runs["single"][0]) / abs(runs["single"][0])
    out["grads"] = rel_err(runs["single"][1], runs["dp"][1])
    out["params"] = rel_err(runs["single"][2], runs["dp"][2])
    print("RESULT" + json.dumps(out))
""")


def test_data_parallel_two_fake_devices_equals_single_device():
    script = DP_SCRIPT.format(tests=os.path.dirname(__file__))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT")[1])
    assert result["loss"] <= 1e-5 and result["grads"] <= 1e-5 and result["params"] <= 1e-5, result


def test_live_device_bytes_counts_each_buffer_once():
    """``jax.device_put`` to where an array already is returns a second array object on the same
    buffer; ``jax.live_arrays()`` lists every such object, the audit counts the buffer once."""
    from lazytrain_jax.executor.ledger import live_device_buffers, live_device_bytes
    dev = jax.devices()[0]
    before = frozenset(live_device_buffers([dev]))
    x = jax.device_put(np.ones((256, 256), np.float32), dev)
    alias = jax.device_put(x, dev)
    assert alias is not x and alias.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()
    assert sum(1 for a in jax.live_arrays() if a.unsafe_buffer_pointer() == x.unsafe_buffer_pointer()) >= 2
    assert live_device_bytes([dev], exclude_buffers=before) == x.nbytes
    y = x + 1
    assert live_device_bytes([dev], exclude_buffers=before) == x.nbytes + y.nbytes


def test_gradient_copies_down_meet_their_deadline(monkeypatch):
    """A gradient's copy to the host is due by the end of the next item (the step model's window
    j + 1), so at most two gradients are on the device, as ``memory.py`` counts. With a slow D2H
    worker the engine waits for it there; before, the gradients of later layers piled up and the
    ledger refused the step (``DeviceMemoryError`` at B3 on this all-device plan)."""
    import time
    from lazytrain_jax.executor import run as run_mod
    model = tiny_model(FAMILY)
    L = model.config.num_layers
    plan = Plan.create(costs_for(model, 2, "bfloat16", 4), HARDWARE, name="all-device",
                       boundary_tiers=["device"] * (L + 1), optimizer_mode="pipelined")
    slow = run_mod.StepRun._host_f32

    def slow_host_f32(self, tree):
        time.sleep(0.05)
        return slow(self, tree)

    monkeypatch.setattr(run_mod.StepRun, "_host_f32", slow_host_f32)
    batch = tiny_batch(model, 0, batch=4)
    with lt.StreamingEngine(model, plan) as eng:
        for _ in range(2):
            eng.step(batch)
        assert eng.last_metrics["peak_device_bytes"] <= plan.predicted_peak_device_bytes
        # the update writes each unit's new streaming copy into the old one's buffers
        before = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(eng._stream)]
        eng.step(batch)
        eng.flush()
        assert [x.unsafe_buffer_pointer() for x in jax.tree.leaves(eng._stream)] == before


def test_pipelined_updates_wait_for_their_windows_compute_on_cpu():
    """On the CPU backend the device computes on the host's cores, and the step model plays a
    window's loads one after another (``schedule.steps``): each unit's pipelined update starts
    once the compute of the window it is due in has ended, and ends before that window does."""
    model = tiny_model(FAMILY)
    L = model.config.num_layers
    plan = Plan.create(costs_for(model, 1, "float32", 2), HARDWARE, name="all-device",
                       boundary_tiers=["device"] * (L + 1), keep_residuals=[True] * L, optimizer_mode="pipelined")
    batch = tiny_batch(model, 0, batch=2)

    def updates_and_windows(gated):
        with lt.StreamingEngine(model, plan, stream_dtype="float32") as eng:
            assert eng._gate_updates  # the CPU backend
            eng._gate_updates = gated
            eng.step(batch)
            eng.step(batch)
            tl = eng.timeline
            due = {u: k for k, units in eng.updates_due.items() for u in units}
            compute_end = {iv.item: iv.end_s for iv in tl.intervals if iv.channel == "compute"}
            updates = {int(iv.name[3:]): iv for iv in tl.intervals if iv.channel == "optimizer"
                       and iv.name.startswith("opt")}
            return due, compute_end, updates, tl.item_windows

    due, compute_end, updates, windows = updates_and_windows(True)
    assert sorted(due) == list(range(L + 2)) and sorted(updates) == list(range(L + 2))
    for u, iv in updates.items():
        k = due[u]
        _, w0, w1 = windows[k]
        assert iv.start_s >= compute_end.get(k, w0) and iv.end_s <= w1, (u, k, iv, windows[k])
    # run free (as on an accelerator), the chain starts with the step: the check above can fail
    due, compute_end, updates, windows = updates_and_windows(False)
    assert any(iv.start_s < compute_end.get(due[u], windows[due[u]][1]) for u, iv in updates.items()
               if due[u] > 2)


@pytest.mark.parametrize("stream_dtype", ["float32", "bfloat16"])
def test_host_unit_update_keeps_each_donated_buffer_in_its_role(stream_dtype):
    """The engine's per-unit update (``UnitAdamW8bit.update_unit``'s jitted step) moves no whole
    tensor: with an fp32 copy and fp32 moments (the embedding under the default policy) all of
    one shape and dtype, jit once gave the copy m's buffer, m v's and v the copy's, each moved by
    a copy every step; and the previous copy's buffer holds the new one."""
    import jax.numpy as jnp
    from lazytrain_jax.executor import host_optim
    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    cfg = lt.optim.hyperparams_of(lt.optim.adamw_8bit(1e-3))
    opt = host_optim.UnitAdamW8bit(cfg, host, 0, jnp.dtype(stream_dtype))
    # XLA-owned buffers (a device_put of a numpy array may alias numpy's memory, which is never donated)
    embed = {"embed_tokens": {"weight": jnp.full((96, 40), 0.5, jnp.float32, device=host)}}
    units = host_optim.join_units([embed, {}], 0)
    state = opt.init(units)
    moments = host_optim.layerwise.layer_moments(state, *host_optim.unit_path(0, 0))
    assert jax.tree.leaves(moments.mu)[0].dtype == jnp.float32  # the default policy: fp32 state
    info, hp, _, _ = opt.begin(state, 1.0)
    grads = jax.tree.map(lambda a: jnp.full(a.shape, 1e-2, jnp.float32, device=host), embed)
    copy = jax.tree.map(lambda a: jnp.zeros(a.shape, stream_dtype, device=host), embed)
    fn = host_optim._fused_step(host, cfg.block_size, jnp.dtype(stream_dtype), opt._filters[0], cfg.impl)
    compiled = fn.lower(embed, grads, moments, info, hp, copy).compile().as_text()
    assert not [line for line in compiled.splitlines() if " copy(" in line and "[96,40]" in line]
    where = copy["embed_tokens"]["weight"].unsafe_buffer_pointer()
    master, new_copy, _ = opt.update_unit(state, 0, embed, grads, info, hp, copy)
    assert new_copy["embed_tokens"]["weight"].unsafe_buffer_pointer() == where
    np.testing.assert_array_equal(np.asarray(new_copy["embed_tokens"]["weight"]),
                                  np.asarray(master["embed_tokens"]["weight"].astype(stream_dtype)))
