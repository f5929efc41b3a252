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
  move to the CPU backend (``to_host=True``), a view of the same host memory.

A numpy view of a CPU-backend array holds a reference to its buffer for the array's lifetime, so on
an accelerator the host optimizer does not donate the old streaming copy (``donates_stream_copy``).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding


def staging(device) -> SingleDeviceSharding | None:
    """The accelerator's ``pinned_host`` memory kind that downloads land in; None on the CPU backend
    (or where the device has no such memory kind): there downloads go straight to the host store."""
    if device.platform == "cpu":
        return None
    kinds = {m.kind for m in device.addressable_memories()} if hasattr(device, "addressable_memories") else set()
    return SingleDeviceSharding(device, memory_kind="pinned_host") if "pinned_host" in kinds else None


def donates_stream_copy(host_sharding) -> bool:
    """Whether the host optimizer may donate the old streaming copy: only where uploads take no
    numpy view of it (the CPU backend, whose host store is the ``pinned_host`` memory kind)."""
    return host_sharding.memory_kind == "pinned_host"


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
    the accelerator's ``pinned_host`` memory kind, and on to the host store when ``to_host``."""
    if staging_sharding is None:
        return jax.device_put(tree, host_sharding)
    pinned = jax.device_put(tree, staging_sharding)
    return jax.device_put(pinned, host_sharding) if to_host else pinned


def host_store(device) -> SingleDeviceSharding:
    """Where the host store lives for a run on ``device``: the CPU device's ``pinned_host`` memory
    kind on the CPU backend (so uploads and downloads are real copies between memory kinds, as on an
    accelerator), the CPU backend's own memory elsewhere."""
    cpu = jax.devices("cpu")[0]
    return SingleDeviceSharding(cpu, memory_kind="pinned_host") if device.platform == "cpu" else SingleDeviceSharding(cpu)
