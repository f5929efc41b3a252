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

Blocks above 32 MiB (a large vocabulary's embedding table, a 3B model's MLP matrices and their
gradients) are always fresh ``mmap`` pages under glibc, faulted in 4 KiB at a time on every
allocation. glibc 2.35+ can back them with transparent huge pages (2 MiB) instead, but only when
the process starts with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: the command,
``examples/finetune_metamathqa.py`` and ``benchmarks/gpu_check.py`` start themselves again with it
(``reexec_with_huge_pages``; ``LAZYTRAIN_HUGE_PAGES=0`` opts out); a program of your own sets it on
its command line, and ``lt.StreamingEngine`` says so once where it would help (``hint_huge_pages``). Measured (2-core machine, CPU backend, medians of
3 rounds): a 557 MB array's copy to ``pinned_host`` 1.57 -> 3.41 GB/s (136k -> 1.1k page faults), a
streamed step of a 2-layer qwen2.5-0.5b shape (its 545 MB fp32 table) 2.69 -> 2.01 s
(``benchmarks/huge_pages.py``). numpy asks for huge pages on its own large arrays already.

Measured on the demo (40 steps, 2-core shared machine): minor page faults 3.03 M -> 0.36 M, system
time 6.7 s -> 1.6 s, user time unchanged (44.7 s vs 44.8 s). On ``benchmarks/streaming_cpu.py``'s layer
(47 MB of fp32 weights, CPU backend), the profiler's upload went 4-18 ms a round with glibc's defaults
(the freed block sometimes reused, sometimes faulted in again) and 2.4-3 ms with these settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

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


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"
HUGE_PAGES_ENV = "LAZYTRAIN_HUGE_PAGES"
_REEXEC_MARK = "LAZYTRAIN_REEXEC_HUGE_PAGES"  # set in the started-again process: never twice
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages_supported() -> bool:
    """glibc 2.35 or later (``glibc.malloc.hugetlb``) and transparent huge pages not ``never``."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        if name != "glibc" or tuple(int(v) for v in version.split(".")[:2]) < (2, 35):
            return False
        with open(THP_ENABLED) as f:
            return "[never]" not in f.read()
    except (AttributeError, ValueError, OSError):
        return False


def huge_pages_on(environ=None) -> bool:
    """Whether this process started with ``GLIBC_TUNABLES`` asking for huge pages."""
    environ = os.environ if environ is None else environ
    return HUGE_PAGES_TUNABLE in environ.get("GLIBC_TUNABLES", "").split(":")


def _huge_pages_wanted(environ) -> bool:
    """Huge pages would be new here: not opted out (``LAZYTRAIN_HUGE_PAGES=0``), not on already, and
    supported (the gate :func:`reexec_with_huge_pages` and :func:`hint_huge_pages` share)."""
    return environ.get(HUGE_PAGES_ENV, "1") != "0" and not huge_pages_on(environ) and huge_pages_supported()


def runs_as_program(orig_argv=None, argv=None) -> bool:
    """Whether the interpreter's command line (``sys.orig_argv``) started the program now running
    (``sys.argv``): ``python prog.py ARGS``, an installed script, or ``python -m pkg.mod ARGS``. Not
    when the program runs inside another (``runpy`` in a test process, an interpreter started with
    ``-c``): starting that one again would restart the wrong program."""
    orig = list(getattr(sys, "orig_argv", None) or []) if orig_argv is None else list(orig_argv)
    argv = list(sys.argv) if argv is None else list(argv)
    n = len(argv)
    if n == 0 or len(orig) < n + 1 or orig[len(orig) - n + 1:] != argv[1:]:
        return False
    first = orig[len(orig) - n]
    if os.path.abspath(first) == os.path.abspath(argv[0]):
        return True
    stem = os.path.splitext(os.path.basename(argv[0]))[0]  # -m pkg.mod: argv[0] is the module's file
    return orig[len(orig) - n - 1] == "-m" and stem in (first.rsplit(".", 1)[-1], "__main__")


def reexec_with_huge_pages(*, execve=os.execve) -> bool:
    """Starts this program again (same interpreter, ``sys.orig_argv``) with huge pages for glibc's
    large blocks (see the module docstring), unless they are on already, unsupported here, the
    program was started again once, it does not run as the process's own program
    (:func:`runs_as_program`) or ``LAZYTRAIN_HUGE_PAGES=0``. Call it first in a program's
    entry point, before it prints or reads anything: on success it does not return. Returns False
    where it did nothing (``execve``: for tests).

    Example:
      >>> if __name__ == "__main__":
      ...     reexec_with_huge_pages()
      ...     main()
    """
    env = os.environ
    if env.get(_REEXEC_MARK) or not _huge_pages_wanted(env) or not sys.executable or not runs_as_program():
        return False
    tunables = ":".join(t for t in (env.get("GLIBC_TUNABLES"), HUGE_PAGES_TUNABLE) if t)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    try:
        execve(sys.executable, list(sys.orig_argv), {**env, "GLIBC_TUNABLES": tunables, _REEXEC_MARK: "1"})
    except OSError:  # the interpreter cannot be started again: run on without huge pages
        return False
    return True


_HINTED: list = []


def hint_huge_pages(largest_block_bytes: float) -> bool:
    """Warns once per process (a ``UserWarning``) where huge pages would help and are off: a block
    above glibc's 32 MiB mmap limit (``largest_block_bytes``: the largest tensor the program moves),
    huge pages supported here, the process started without them and ``LAZYTRAIN_HUGE_PAGES`` not
    ``0``. Returns whether it warned. ``lt.StreamingEngine`` calls it with the model's largest fp32
    tensor."""
    if _HINTED or largest_block_bytes <= MMAP_THRESHOLD_MAX or not _huge_pages_wanted(os.environ):
        return False
    _HINTED.append(True)
    import warnings
    warnings.warn(f"lazytrain_jax: tensors of up to {largest_block_bytes / 2**20:.0f} MiB move through host blocks "
                  "above glibc's 32 MiB mmap limit, faulted in 4 KiB at a time: start Python with "
                  f"GLIBC_TUNABLES={HUGE_PAGES_TUNABLE} (the lazytrain command does) for about 2x faster copies of "
                  f"them; {HUGE_PAGES_ENV}=0 silences this", UserWarning, stacklevel=3)
    return True
