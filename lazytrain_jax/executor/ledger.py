"""Device-byte accounting: every array the engine holds on the device, tagged, against the plan's peak."""

from __future__ import annotations

import jax


class DeviceMemoryError(RuntimeError):
    """The engine's device bytes exceeded the plan's predicted peak."""


def device_bytes(tree, device) -> int:
    """Bytes of the arrays of ``tree`` that live on ``device`` (one shard per device for sharded arrays)."""
    total = 0
    for x in jax.tree.leaves(tree):
        if not isinstance(x, jax.Array):
            continue
        for shard in x.addressable_shards:
            if shard.device == device:
                total += shard.data.nbytes
    return total


class DeviceLedger:
    """Tagged device allocations of one step; raises when the held bytes exceed ``limit``.

    Example:
      >>> ledger = DeviceLedger(limit=2e9, device=dev)
      >>> ledger.add("weights F3", arrays); ledger.free("weights F3")
    """

    def __init__(self, limit: float, device):
        self.limit = float(limit)
        self.device = device
        self.held: dict[str, int] = {}
        self.current = 0
        self.peak = 0
        self.where = ""

    def reset(self) -> None:
        self.held.clear()
        self.current = 0
        self.peak = 0

    def add(self, tag: str, tree, *, item: str = "") -> None:
        if tag in self.held:
            raise RuntimeError(f"internal: device allocation {tag!r} accounted twice")
        self.add_bytes(tag, device_bytes(tree, self.device), item=item)

    def add_bytes(self, tag: str, nbytes: int, *, item: str = "") -> None:
        """Accounts ``nbytes`` per device under ``tag`` (for a transfer issued before its array exists)."""
        if tag in self.held:
            raise RuntimeError(f"internal: device allocation {tag!r} accounted twice")
        self.held[tag] = int(nbytes)
        self.current += int(nbytes)
        if self.current > self.peak:
            self.peak = self.current
            self.where = f"{tag} at {item}"
        if self.current > self.limit * (1 + 1e-9):
            raise DeviceMemoryError(
                f"device bytes {self.current:,} exceed the plan's predicted peak {self.limit:,.0f} at item {item}, "
                f"allocating {tag} ({int(nbytes):,} bytes); largest holdings: {self.largest()}")

    def free(self, tag: str) -> None:
        self.current -= self.held.pop(tag)

    def free_prefix(self, prefix: str) -> None:
        for tag in [t for t in self.held if t.startswith(prefix)]:
            self.free(tag)

    def largest(self, n: int = 4) -> str:
        top = sorted(self.held.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{t}={b:,}" for t, b in top)


def _device_buffers(x, device):
    """``(buffer address, bytes)`` of ``x``'s shards on ``device`` in the ``device`` memory kind."""
    if x.sharding.memory_kind not in (None, "device"):
        return []
    if len(x.sharding.device_set) == 1:
        if device not in x.sharding.device_set:
            return []
        return [(x.unsafe_buffer_pointer(), x.nbytes)]
    return [(s.data.unsafe_buffer_pointer(), s.data.nbytes) for s in x.addressable_shards if s.device == device]


def live_device_buffers(devices) -> dict[int, int]:
    """Every live device buffer in the ``device`` memory kind on the first of ``devices``: address -> bytes.

    Keyed by buffer, not by array object: several ``jax.Array`` objects can share one buffer
    (a shard's ``data``, an output forwarded from an input), and ``jax.live_arrays()`` lists each
    of them; summing per object counts such a buffer more than once.
    """
    dev = devices[0]
    out: dict[int, int] = {}
    for x in jax.live_arrays():
        try:
            out.update(_device_buffers(x, dev))
        except Exception:  # deleted or donated meanwhile
            continue
    return out


def live_device_bytes(devices, exclude_buffers=frozenset()) -> int:
    """Bytes of the live device buffers on the first of ``devices``, each counted once, except
    those whose address is in ``exclude_buffers`` (buffers that existed before the step)."""
    return sum(n for ptr, n in live_device_buffers(devices).items() if ptr not in exclude_buffers)
