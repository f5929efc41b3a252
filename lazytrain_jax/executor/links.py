"""Copies between the host store and the device: one path for the engine and the profiler.

On the CPU backend the host store is the CPU device's ``pinned_host`` memory kind and each copy is
one ``jax.device_put`` between memory kinds. On an accelerator the host store lives on the CPU
backend (the host optimizer runs there), and JAX's copy between two backends is slow: on an H200,
1.3 GB/s each way for 268 MB, against 7.6 GB/s from a numpy array (20 GB/s for a layer's arrays in
pieces) and 49-50 GB/s between the accelerator and its own ``pinned_host`` memory kind
(``benchmarks/transfer_paths.py``). So:

* uploads hand the accelerator a numpy view of each CPU-backend array (no host copy);
* downloads go to the accelerator's ``pinned_host`` memory kind (a DMA). Offloaded activations and
  residuals stay there and come back the same way; gradients, which the host optimizer reads, then
  move to the CPU backend (``to_host=True``) by the fastest of :data:`TO_HOST_PATHS`, measured once
  per device (:func:`to_host_path`): from ``pinned_host`` that copy ran at 1.2 GB/s on the H200.

The host optimizer donates the old streaming copy to the update that writes the new one (a fresh
buffer is page-faulted in on every step). While a numpy view of an array lives, JAX does not donate
that array: it computes into a fresh buffer and the view stays intact (jax 0.10.2 and 0.11.2,
tested in ``tests/executor/test_links.py``). The uploads' views are dropped once the copy is done,
so the donation works again (with jax 0.11.2 a bf16 array once viewed stays undonated: the update
then writes a fresh copy, as without donation).
"""

from __future__ import annotations

import os
import time

import jax
import jax.dlpack
import numpy as np
from jax.sharding import SingleDeviceSharding


def host_store(device) -> SingleDeviceSharding:
    """Where the host store lives for a run on ``device``: the CPU device's ``pinned_host`` memory
    kind on the CPU backend (so uploads and downloads are real copies between memory kinds, as on an
    accelerator), the CPU backend's own memory elsewhere."""
    cpu = jax.devices("cpu")[0]
    return SingleDeviceSharding(cpu, memory_kind="pinned_host") if device.platform == "cpu" else SingleDeviceSharding(cpu)


def staging(device) -> SingleDeviceSharding | None:
    """The accelerator's ``pinned_host`` memory kind that downloads land in; None on the CPU backend
    (or where the device has no such memory kind): there downloads go straight to the host store."""
    if device.platform == "cpu":
        return None
    kinds = {m.kind for m in device.addressable_memories()} if hasattr(device, "addressable_memories") else set()
    return SingleDeviceSharding(device, memory_kind="pinned_host") if "pinned_host" in kinds else None


def _cpu_backend_array(x) -> bool:
    return isinstance(x, jax.Array) and all(d.platform == "cpu" for d in x.sharding.device_set)


def upload(tree, sharding):
    """``tree`` onto ``sharding`` (a device sharding, or a tree of them matching ``tree``). On an
    accelerator each CPU-backend array goes as a numpy view; arrays already in the accelerator's
    ``pinned_host`` memory kind go as they are."""
    first = jax.tree.leaves(sharding, is_leaf=lambda s: isinstance(s, jax.sharding.Sharding))[0]
    if next(iter(first.device_set)).platform != "cpu":
        tree = jax.tree.map(lambda x: np.asarray(x) if _cpu_backend_array(x) else x, tree)
    return jax.device_put(tree, sharding)


def download(tree, host_sharding, staging_sharding, *, to_host: bool):
    """Device arrays down: to ``host_sharding`` directly where ``staging_sharding`` is None, else into
    the accelerator's ``pinned_host`` memory kind, and on to the host store when ``to_host`` by the
    fastest of :data:`TO_HOST_PATHS` on this device for each array's dtype (:func:`to_host_path`)."""
    if staging_sharding is None:
        return jax.device_put(tree, host_sharding)
    if not to_host:
        return jax.device_put(tree, staging_sharding)
    return jax.tree.map(lambda x: TO_HOST_PATHS[to_host_path(staging_sharding, host_sharding, dtype=x.dtype)](
        x, staging_sharding, host_sharding), tree)


# Device array -> host store (the CPU backend) on an accelerator; every path gives the same values.
# On an H200 (jax 0.11.2) "pinned" (the JAX copy between backends after the DMA) measured 1.2 GB/s
# in lt.profile and "direct" 1.3-1.5 GB/s; the numpy and DLPack paths were not yet measured there.
def _via_dlpack(x, staging, host):
    """DMA into the accelerator's ``pinned_host`` memory, then that buffer handed to the CPU backend
    by DLPack without a host copy (``copy=False``) where JAX exports it as host memory (so on the
    CPU backend, bfloat16 included: tested). Where the CPU backend cannot take it as it is, the
    buffer is copied out by ``np.asarray``, as "pinned+numpy"; the probe times each dtype on its own
    (:func:`to_host_path`)."""
    pinned = jax.block_until_ready(jax.device_put(x, staging))
    try:
        out = jax.dlpack.from_dlpack(pinned, device=next(iter(host.device_set)), copy=False)
    except (RuntimeError, TypeError, ValueError, BufferError):
        out = np.asarray(pinned)
    return jax.device_put(out, host)


TO_HOST_PATHS = {
    "pinned": lambda x, staging, host: jax.device_put(jax.device_put(x, staging), host),
    "pinned+dlpack": _via_dlpack,
    "pinned+numpy": lambda x, staging, host: jax.device_put(np.asarray(jax.device_put(x, staging)), host),
    "numpy": lambda x, staging, host: jax.device_put(np.asarray(x), host),
    "direct": lambda x, staging, host: jax.device_put(x, host),
}
_CHOSEN: dict = {}


def to_host_path(staging_sharding, host_sharding, *, dtype=np.float32, probe_bytes: int = 32 << 20,
                 repeats: int = 3, clock=time.perf_counter) -> str:
    """The name of the fastest of :data:`TO_HOST_PATHS` from ``staging_sharding``'s device to
    ``host_sharding`` for arrays of ``dtype``: each path copies a fresh ``probe_bytes`` array of that
    dtype ``repeats`` times after one warm-up (fresh, so no path reuses a cached host copy); the
    median wins. Measured once per (device, host, dtype) in a process (the engine measures its
    gradients' dtypes when it is made, not inside a step); ``LAZYTRAIN_TO_HOST_PATH`` names one
    instead."""
    key = (staging_sharding, host_sharding, np.dtype(dtype).name)
    if key not in _CHOSEN:
        forced = os.environ.get("LAZYTRAIN_TO_HOST_PATH")
        if forced is not None:
            if forced not in TO_HOST_PATHS:
                raise ValueError(f"LAZYTRAIN_TO_HOST_PATH={forced!r}; valid: {sorted(TO_HOST_PATHS)}")
            _CHOSEN[key] = forced
        else:
            _CHOSEN[key] = fastest_path(staging_sharding, host_sharding, probe_bytes, repeats, clock, dtype=dtype)
    return _CHOSEN[key]


def to_host_paths(staging_sharding, host_sharding, dtypes) -> dict:
    """:func:`to_host_path` for each of ``dtypes``: ``{dtype name: path name}``."""
    return {np.dtype(d).name: to_host_path(staging_sharding, host_sharding, dtype=d) for d in dtypes}


def fastest_path(staging_sharding, host_sharding, probe_bytes: int, repeats: int, clock, *,
                 dtype=np.float32) -> str:
    """See :func:`to_host_path` (this measures; that caches)."""
    device = next(iter(staging_sharding.device_set))
    on_device = SingleDeviceSharding(device, memory_kind="device")
    dtype = np.dtype(dtype)
    host_np = (np.arange(max(1, probe_bytes // dtype.itemsize)) % 251).astype(dtype)
    seconds, failed = {}, {}
    for name, path in TO_HOST_PATHS.items():
        times = []
        try:
            for r in range(repeats + 1):
                x = jax.block_until_ready(jax.device_put(host_np, on_device))  # fresh: no cached host copy
                t0 = clock()
                y = jax.block_until_ready(path(x, staging_sharding, host_sharding))
                if r:
                    times.append(clock() - t0)
            if y.sharding != host_sharding or not np.array_equal(np.asarray(y), host_np):
                raise RuntimeError(f"landed in {y.sharding} or changed the values")
        except Exception as e:  # noqa: BLE001 - a path this backend cannot take is no candidate
            failed[name] = f"{type(e).__name__}: {e}"
            continue
        seconds[name] = float(np.median(times))
    if not seconds:
        raise RuntimeError(f"no way from {device} to the host store works: {failed}")
    return min(seconds, key=seconds.get)

