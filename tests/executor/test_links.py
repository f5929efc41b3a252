"""executor/links.py: the copy paths between device and host give the same values wherever they land,
and the gradients' way to the host is the fastest measured (a fake clock here: no timing is asserted)."""

import jax
import numpy as np
import pytest
from jax.sharding import SingleDeviceSharding

from lazytrain_jax.executor import links

CPU = jax.devices("cpu")[0]
# The CPU backend stands in for an accelerator: its pinned_host memory kind plays the accelerator's
# staging memory, its device memory kind the host store.
STAGING = SingleDeviceSharding(CPU, memory_kind="pinned_host")
HOST = SingleDeviceSharding(CPU, memory_kind="device")


def _tree():
    rng = np.random.default_rng(0)
    return {"w": rng.standard_normal((5, 7)).astype(np.float32),
            "b": rng.standard_normal(7).astype(jax.numpy.bfloat16)}


@pytest.mark.parametrize("name", sorted(links.TO_HOST_PATHS))
def test_every_to_host_path_copies_exactly_into_the_host_store(name):
    for a in jax.tree.leaves(_tree()):
        x = jax.device_put(a, SingleDeviceSharding(CPU))
        y = links.TO_HOST_PATHS[name](x, STAGING, HOST)
        assert y.sharding == HOST and y.dtype == a.dtype
        np.testing.assert_array_equal(np.asarray(y), a)


def test_download_lands_in_staging_or_goes_on_to_the_host(monkeypatch):
    monkeypatch.setenv("LAZYTRAIN_TO_HOST_PATH", "pinned+numpy")
    monkeypatch.setattr(links, "_CHOSEN", {})
    tree = jax.device_put(_tree(), SingleDeviceSharding(CPU))
    kept = links.download(tree, HOST, STAGING, to_host=False)
    on_host = links.download(tree, HOST, STAGING, to_host=True)
    assert all(x.sharding == STAGING for x in jax.tree.leaves(kept))
    assert all(x.sharding == HOST for x in jax.tree.leaves(on_host))
    for a, b, c in zip(jax.tree.leaves(_tree()), jax.tree.leaves(kept), jax.tree.leaves(on_host)):
        np.testing.assert_array_equal(np.asarray(b), a)
        np.testing.assert_array_equal(np.asarray(c), a)
    # without staging (the CPU backend's engine) a download goes straight to the host store
    direct = links.download(tree, STAGING, None, to_host=False)
    assert all(x.sharding == STAGING for x in jax.tree.leaves(direct))


def test_to_host_path_takes_the_fastest_by_the_clock_and_measures_once(monkeypatch):
    now = [0.0]
    calls = {}

    def fake(seconds, name):
        def path(x, staging, host):
            calls[name] = calls.get(name, 0) + 1
            now[0] += seconds
            return jax.device_put(x, host)
        return path

    monkeypatch.delenv("LAZYTRAIN_TO_HOST_PATH", raising=False)
    monkeypatch.setattr(links, "TO_HOST_PATHS", {"slow": fake(3.0, "slow"), "fast": fake(0.5, "fast"),
                                                 "middling": fake(1.0, "middling")})
    monkeypatch.setattr(links, "_CHOSEN", {})
    assert links.to_host_path(STAGING, HOST, probe_bytes=1024, repeats=3, clock=lambda: now[0]) == "fast"
    assert calls == {"slow": 4, "fast": 4, "middling": 4}  # one warm-up and three timed each
    assert links.to_host_path(STAGING, HOST, clock=lambda: now[0]) == "fast"
    assert calls == {"slow": 4, "fast": 4, "middling": 4}  # cached: not measured again
    # another dtype is measured on its own (bfloat16 gradients may take another path than fp32)
    assert links.to_host_path(STAGING, HOST, dtype=jax.numpy.bfloat16, probe_bytes=1024, repeats=3,
                              clock=lambda: now[0]) == "fast"
    assert calls == {"slow": 8, "fast": 8, "middling": 8}
    assert sorted(k[2] for k in links._CHOSEN) == ["bfloat16", "float32"]


def test_the_probe_copies_arrays_of_the_dtype_asked_for(monkeypatch):
    seen = []

    def path(x, staging, host):
        seen.append(x.dtype)
        return jax.device_put(x, host)

    monkeypatch.setattr(links, "TO_HOST_PATHS", {"only": path})
    assert links.fastest_path(STAGING, HOST, 1024, 1, clock=lambda: 0.0, dtype=jax.numpy.bfloat16) == "only"
    assert set(seen) == {np.dtype(jax.numpy.bfloat16)}


def test_dlpack_path_hands_over_the_staging_buffer_without_a_copy_on_the_cpu_backend():
    """On the CPU backend the staging buffer becomes the host-store array as it is (the same
    address), fp32 and bfloat16 alike."""
    import unittest.mock
    real_put = jax.device_put
    for dtype in (np.float32, jax.numpy.bfloat16):
        x = jax.device_put(np.arange(1024, dtype=np.float32).astype(dtype), SingleDeviceSharding(CPU))
        staged = []

        def put(a, sharding=None, **kw):
            out = real_put(a, sharding, **kw)
            if sharding == STAGING:
                staged.append(out)
            return out

        with unittest.mock.patch.object(links.jax, "device_put", put):
            y = links.TO_HOST_PATHS["pinned+dlpack"](x, STAGING, HOST)
        assert y.sharding == HOST and y.dtype == x.dtype
        assert y.unsafe_buffer_pointer() == staged[0].unsafe_buffer_pointer()
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_to_host_path_override_and_its_bad_value(monkeypatch):
    monkeypatch.setattr(links, "_CHOSEN", {})
    monkeypatch.setenv("LAZYTRAIN_TO_HOST_PATH", "numpy")
    assert links.to_host_path(STAGING, HOST) == "numpy"
    monkeypatch.setattr(links, "_CHOSEN", {})
    monkeypatch.setenv("LAZYTRAIN_TO_HOST_PATH", "fastest")
    with pytest.raises(ValueError, match=r"LAZYTRAIN_TO_HOST_PATH='fastest'; valid: \['direct', 'numpy'"):
        links.to_host_path(STAGING, HOST)


def test_upload_and_the_host_store_by_backend():
    dev = SingleDeviceSharding(CPU, memory_kind="device")
    host = links.host_store(CPU)
    assert host.memory_kind == "pinned_host"
    assert links.staging(CPU) is None  # the CPU backend downloads straight into its host store
    tree = jax.device_put(_tree(), host)
    up = links.upload(tree, dev)
    assert all(x.sharding == dev for x in jax.tree.leaves(up))
    for a, b in zip(jax.tree.leaves(_tree()), jax.tree.leaves(up)):
        np.testing.assert_array_equal(np.asarray(b), a)
    # a tree of shardings (one per leaf) is accepted as jax.device_put accepts it
    shardings = jax.tree.map(lambda _: dev, tree)
    assert all(x.sharding == dev for x in jax.tree.leaves(links.upload(tree, shardings)))


@pytest.mark.parametrize("dtype", [np.float32, jax.numpy.bfloat16])
def test_a_numpy_view_blocks_donation_and_stays_intact(dtype):
    """What the uploads' numpy views rely on: while a view of a CPU-backend array lives, a jit that
    donates the array computes into a fresh buffer and the view keeps its values; with no view
    taken the array is donated."""
    double = jax.jit(lambda a: a * 2, donate_argnums=0)
    values = np.arange(1 << 16).astype(dtype)
    x = jax.device_put(values, SingleDeviceSharding(CPU))
    view = np.asarray(x)
    assert view.ctypes.data == x.unsafe_buffer_pointer()  # a view, not a copy
    y = jax.block_until_ready(double(x))
    assert y.unsafe_buffer_pointer() != view.ctypes.data
    np.testing.assert_array_equal(view, values)
    np.testing.assert_array_equal(np.asarray(y), values * 2)
    assert not x.is_deleted()  # not donated while viewed
    z = jax.device_put(values, SingleDeviceSharding(CPU))
    w = jax.block_until_ready(double(z))
    assert z.is_deleted()
    np.testing.assert_array_equal(np.asarray(w), values * 2)


def test_timeline_interval_that_spans_the_steps_restart_keeps_its_length():
    """A pipelined update launched by the last step ends inside this one: its interval begins before
    the step's clock restarted (negative start), and busy() counts only the part inside the step."""
    import time

    from lazytrain_jax.executor.timeline import Timeline
    tl = Timeline()
    began = time.perf_counter()
    time.sleep(0.02)
    tl.start()
    time.sleep(0.01)
    ended = time.perf_counter()
    tl.add_since("optimizer", "opt3", began, ended, 3)
    (iv,) = tl.intervals
    assert iv.start_s < 0 < iv.end_s
    assert iv.end_s - iv.start_s == pytest.approx(ended - began)
    assert tl.busy()["optimizer"] == pytest.approx(iv.end_s)
    assert all(v >= 0 for v in tl.busy().values())


def test_a_path_that_fails_or_lands_elsewhere_is_no_candidate(monkeypatch):
    def broken(x, staging, host):
        raise NotImplementedError("this backend has no such copy")

    def misplaced(x, staging, host):
        return jax.device_put(x, staging)  # fast, but not in the host store

    def good(x, staging, host):
        return jax.device_put(x, host)

    monkeypatch.setattr(links, "TO_HOST_PATHS", {"broken": broken, "misplaced": misplaced, "good": good})
    assert links.fastest_path(STAGING, HOST, 1024, 1, clock=lambda: 0.0) == "good"
    monkeypatch.setattr(links, "TO_HOST_PATHS", {"broken": broken, "misplaced": misplaced})
    with pytest.raises(RuntimeError, match=r"no way from .* to the host store works: .*broken.*NotImplementedError"):
        links.fastest_path(STAGING, HOST, 1024, 1, clock=lambda: 0.0)
