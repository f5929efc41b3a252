"""Keeps freed host blocks for reuse instead of handing them back to the OS after every step.

A training step allocates and frees the same large host buffers over and over (uploads, downloads,
gradients, XLA's CPU temporaries). glibc's malloc serves blocks above a moving threshold with fresh
``mmap`` pages and trims the heap top after frees, so every step pays for the kernel zero-filling
those pages again (page faults, system time). ``keep_freed_host_blocks`` fixes the mmap threshold
at glibc's largest (32 MiB on 64-bit) and raises the trim threshold, so freed blocks go back into
the heap and the next step reuses them. It changes the process's allocator: the command, ``lt.profile``
and ``lt.StreamingEngine`` set it once per process (``keep_host_blocks_once``), so the profile measures
under the allocator the engine's steps run with; ``LAZYTRAIN_KEEP_FREED_HOST_BLOCKS=0`` leaves glibc's
defaults. Not glibc (macOS, musl): a no-op.

Measured on the demo (40 steps, 2-core shared machine): minor page faults 3.03 M -> 0.36 M, system
time 6.7 s -> 1.6 s, user time unchanged (44.7 s vs 44.8 s). On ``benchmarks/streaming_cpu.py``'s layer
(47 MB of fp32 weights, CPU backend), the profiler's upload went 4-18 ms a round with glibc's defaults
(the freed block sometimes reused, sometimes faulted in again) and 2.4-3 ms with these settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's <malloc.h>
MMAP_THRESHOLD_MAX = 32 * 2**20
TRIM_THRESHOLD = 4 * 2**30
TOP_PAD = 256 * 2**20


def keep_freed_host_blocks() -> bool:
    """Sets glibc's mmap and trim thresholds (see the module docstring). Returns True when glibc took
    all three settings, False where there is no glibc ``mallopt``.

    Example:
      >>> keep_freed_host_blocks()
      True
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX),
                                                                (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
                                                                (M_TOP_PAD, TOP_PAD)))


ENV = "LAZYTRAIN_KEEP_FREED_HOST_BLOCKS"
_SET: list = []  # the result of the process's one call (keep_host_blocks_once)


def keep_host_blocks_once() -> bool:
    """:func:`keep_freed_host_blocks`, once per process, unless ``LAZYTRAIN_KEEP_FREED_HOST_BLOCKS``
    is ``0``: whether the settings are in place."""
    if not _SET:
        _SET.append(os.environ.get(ENV, "1") != "0" and keep_freed_host_blocks())
    return _SET[0]
