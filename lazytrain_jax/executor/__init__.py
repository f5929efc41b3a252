"""The streaming executor: runs a Plan one unit at a time from a host master copy.

Public API:
  * :class:`StreamingEngine` -- ``loss_and_grad(batch)``, ``step(batch)``, ``params``, ``timeline``.
  * :class:`DeviceMemoryError`, :class:`OffloadError` -- what the engine raises when the plan's
    device peak is exceeded or an NVMe offload file cannot be written or read back intact.
"""

from lazytrain_jax.executor.engine import StreamingEngine
from lazytrain_jax.executor.ledger import DeviceMemoryError
from lazytrain_jax.executor.nvme import OffloadError

__all__ = ["DeviceMemoryError", "OffloadError", "StreamingEngine"]
