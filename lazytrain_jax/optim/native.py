"""A native CPU kernel for the fused host update (dynamic8 state, and fp32 moments in the host
step): one pass over memory, multi-threaded.

XLA on the CPU has no multi-output loop fusion, so ``kernel.leaf_master_step`` runs as several
passes (scale bounds, master, bf16 copy, m codes, v codes) that each read the gradient again:
~40 B/param of traffic against the 18 B the update needs, and about one fifth of DeepSpeed's
CPU Adam per core (``benchmarks/optimizer_cpu.py``). ``csrc/adam8bit_cpu.cc`` does the same
math per block of ``block_size`` elements while the block is in L1 (read p g mc vc, write p copy
mc vc), split across threads, as an XLA FFI custom call on donated buffers (the process's
cores are shared between the calls of one program: :func:`thread_shares`). Two
entry points share the loop: :func:`leaf_master_step` (the host step: master in place + a bf16
or fp32 copy) and the state half of :func:`leaf_update` (the optax transform: the kernel writes
only the new codes and scales, in place; the update ``u`` is XLA's own elementwise expression,
which XLA fuses into the user's ``apply_updates``). The host step of a tensor whose Adam state
stays fp32 (``fp32_state_filter``: an embedding, an LM head, norms and biases by default) has a
loop of its own, plain AdamW elementwise (read p g m v, write p copy m v: 30 B/param), where
XLA's path took several passes: a 136M-parameter embedding's update 374.6 -> 108.2 ms on 2 cores
(``benchmarks/optimizer_cpu.py --embedding``). Both are chosen with ``impl`` (:data:`IMPLS`;
``"auto"`` by default, for the transform and the per-unit step alike) and only where the
computation is lowered for the CPU (:func:`on_cpu`).

The C++ source is compiled on first use with the system's ``g++`` (``-O3 -march=native``, no
fast-math, no FMA contraction; no errno / trapping math, so the loops vectorize) into
``~/.cache/lazytrain_jax`` (atomic rename; keyed by the source, flags, jaxlib and CPU). Without
a compiler :func:`available` is False and ``"auto"`` keeps the XLA path. ``LAZYTRAIN_NATIVE=0`` disables it.

The loop is bound by the divider unit, not by memory (a block in L2 runs no faster than 100M
parameters): per element a square root and a division for the update, and two more square roots
for the code estimates; with AVX-512 those two are 14-bit reciprocal-root estimates (the exact
midpoint test that follows only needs the right pair of codes), bit-identical codes, 1.2-1.6x the
throughput of the full-precision roots on a 2-core Xeon (``benchmarks/optimizer_cpu.py``).

Why the transform splits the work: a ``u`` written by the kernel is a fresh XLA temporary each
step (4 B/param written, read again by ``apply_updates``, and one page fault per 4 KiB: 100k
faults per step at 100M parameters, a quarter of the step in ``perf``). XLA's own ``u`` needs no
reduction (the old scales are per-block inputs), so it fuses into ``p + u``; the kernel then
writes the codes after that fusion has read the old ones (a data dependency, so XLA updates
them in place instead of copying them).

Results agree with the XLA path to fp32 rounding, not bit for bit (XLA rewrites some divisions
into reciprocal multiplies): master weights within a few ulp, codes within one step where a value
sits on a rounding boundary (tested). The transform's update ``u`` is XLA's, bit for bit, given
the same state (tested).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.optim import blockwise as q, kernel
from lazytrain_jax.optim.kernel import AdamHyperparams, StepInfo

TARGET = "lazytrain_adam8bit_cpu"  # the host step: master in place + bf16 copy
INTO_TARGET = "lazytrain_adam8bit_into_cpu"  # the host step writing its copy into the previous one's buffer
STATE_TARGET = "lazytrain_adam8bit_state_cpu"  # the optax transform: codes and scales only
F32_TARGET = "lazytrain_adam_f32_cpu"  # the host step of a tensor with fp32 moments
F32_INTO_TARGET = "lazytrain_adam_f32_into_cpu"  # the same, writing its copy into the previous one's buffer
COPY_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))  # the host step's streaming copy
GRAD_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))  # the gradients the host step reads
IMPLS = ("auto", "native", "xla")
DEFAULT_IMPL = "auto"  # the optax transform and the per-unit host step alike (one default)
_SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "adam8bit_cpu.cc")
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
          "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-pthread", "-w")
_lock = threading.Lock()
_state: dict = {}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") or line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor()


def _build(extra_flags: tuple[str, ...] = ()) -> str:
    """Compiles the kernel (once per source/flags/jaxlib/CPU) and returns the library's path.

    ``extra_flags`` are appended to the compiler's (the tests build a ``-mno-avx512f`` variant to
    check the AVX-512 code estimates against the portable loop)."""
    import jaxlib

    flags = _FLAGS + tuple(extra_flags)
    with open(_SOURCE, "rb") as f:
        src = f.read()
    key = hashlib.sha256(src + repr((flags, jaxlib.__version__, _cpu_name())).encode())
    cache = os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")),
                         "lazytrain_jax")
    path = os.path.join(cache, f"adam8bit_cpu_{key.hexdigest()[:16]}.so")
    if os.path.exists(path):
        return path
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX) on PATH")
    os.makedirs(cache, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=cache)
    os.close(fd)
    try:
        cmd = [compiler, *flags, f"-I{jax.ffi.include_dir()}", _SOURCE, "-o", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, path)  # atomic: a reader sees no library or a whole one
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def available() -> bool:
    """Whether the native kernel is built and registered (builds it on the first call).

    False when ``LAZYTRAIN_NATIVE=0``, without a C++ compiler, or when the build fails
    (:func:`unavailable_reason` says why).

    Example:
      >>> impl = "native" if available() else "xla"
    """
    with _lock:
        if "ok" not in _state:
            try:
                if os.environ.get("LAZYTRAIN_NATIVE", "1") == "0":
                    raise RuntimeError("disabled by LAZYTRAIN_NATIVE=0")
                lib = ctypes.cdll.LoadLibrary(_build())
                jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.LtAdam8bitCpu),
                                            platform="cpu")
                jax.ffi.register_ffi_target(INTO_TARGET, jax.ffi.pycapsule(lib.LtAdam8bitIntoCpu),
                                            platform="cpu")
                jax.ffi.register_ffi_target(
                    STATE_TARGET, jax.ffi.pycapsule(lib.LtAdam8bitStateCpu), platform="cpu")
                jax.ffi.register_ffi_target(F32_TARGET, jax.ffi.pycapsule(lib.LtAdamF32Cpu), platform="cpu")
                jax.ffi.register_ffi_target(F32_INTO_TARGET, jax.ffi.pycapsule(lib.LtAdamF32IntoCpu),
                                            platform="cpu")
                _state.update(ok=True, lib=lib, reason=None)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                _state.update(ok=False, reason=f"{type(e).__name__}: {e}")
        return _state["ok"]


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True or was not asked yet)."""
    return _state.get("reason")


def check_impl(impl: str) -> str:
    """Validates ``impl`` (one of :data:`IMPLS`) and returns it; ValueError naming the valid ones.

    ``"native"`` also requires :func:`available` (it raises with :func:`unavailable_reason`).

    Example:
      >>> check_impl("auto")
      'auto'
    """
    if not isinstance(impl, str) or impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is invalid; valid: {', '.join(map(repr, IMPLS))}")
    if impl == "native" and not available():
        raise ValueError(f"impl='native' is unavailable here ({unavailable_reason()}); "
                         "use impl='xla' or 'auto'")
    return impl


def resolve_impl(impl: str) -> str:
    """``"native"`` or ``"xla"``: what ``impl`` runs on the CPU backend. ``"auto"`` picks the
    native kernel when it could be built (the faster path for the host step and for the optax
    transform alike: ``benchmarks/optimizer_cpu.py``), else XLA. Other backends always run the XLA
    path (:func:`on_cpu`).

    Example:
      >>> resolve_impl("auto")   # 'native' where g++ built the kernel
    """
    check_impl(impl)
    if impl == "auto":
        return "native" if available() else "xla"
    return impl


def on_cpu(native_fn, xla_fn, *args):
    """``native_fn(*args)`` when the enclosing computation is lowered for the CPU, else
    ``xla_fn(*args)`` (``jax.lax.platform_dependent``: only the chosen branch is compiled, so an
    accelerator never sees the custom call and the CPU no branch)."""
    return jax.lax.platform_dependent(*args, cpu=native_fn, default=xla_fn)


def supports(master, g, mu, *, block_size: int, hp: AdamHyperparams, copy_dtype=None,
             host_step: bool = False) -> bool:
    """Whether one tensor's update can run natively (else the XLA path runs it): fp32 params,
    AdamW (a learning rate), a bf16 or fp32 copy if any, fp32 gradients and dynamic8 state in
    whole blocks. ``host_step``: the host step (:func:`leaf_master_step`), not the optax transform,
    which also takes fp32 moments of any size and reads bf16 gradients as they are
    (:data:`GRAD_DTYPES`: no fp32 copy of the gradient on the host)."""
    fmt = q.format_of(mu.dtype)
    grad_ok = g.dtype == jnp.float32 or (host_step and jnp.dtype(g.dtype) in GRAD_DTYPES)
    return (master is not None and master.dtype == jnp.float32 and grad_ok
            and (copy_dtype is None or jnp.dtype(copy_dtype) in COPY_DTYPES)
            and master.size > 0 and hp.learning_rate is not None
            and ((fmt == "dynamic8" and master.size % block_size == 0)
                 or (fmt == "fp32" and host_step and mu.dtype == jnp.float32)))


def thread_shares(sizes) -> list[int]:
    """Worker threads for each native call of one program, given each call's element count
    (0 for a tensor that takes no native call: it gets a count it does not use).

    XLA runs a program's independent calls side by side, so giving every call all the cores
    oversubscribes them (measured: the optax transform over 95 tensors of 1M took 0.61-0.65x
    optax's time with one thread per call, 0.66-0.81x with every core per call). The cores this
    process may run on are shared in proportion to each call's elements, at least one each:
    a single large tensor still gets them all.

    Example:
      >>> thread_shares([1 << 20] * 95)  # on 2 cores: [1, 1, ...]
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    total = sum(sizes)
    return [max(1, min(cores, round(cores * n / total))) if total > 0 else 1 for n in sizes]


def _scalars(info: StepInfo, hp: AdamHyperparams):
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    b1, b2 = f32(hp.b1), f32(hp.b2)
    bc1 = (1.0 - b1**info.count).astype(jnp.float32)
    bc2 = (1.0 - b2**info.count).astype(jnp.float32)
    return jnp.stack([f32(info.clip_factor), info.apply.astype(jnp.float32), b1, b2,
                      f32(hp.eps), f32(hp.learning_rate), f32(hp.weight_decay), 1.0 / bc1,
                      1.0 / bc2])


def leaf_update(g, p, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *,
                block_size: int, decay: bool, threads: int = 0):
    """``kernel.leaf_update`` (the optax update of one tensor): ``u`` by XLA, the state natively.

    Returns ``(updates, mu, nu, mu_s, nu_s)``. ``u`` is ``kernel.leaf_update``'s expression (bit
    for bit, given the same state), left to XLA so that it fuses into ``apply_updates``; the
    native kernel writes the new codes and scales, in place when the state is donated, ordered
    after ``p + u`` (which reads the old codes). ``p`` is only read. Requires :func:`available`
    and :func:`supports`.

    Example:
      >>> u, mu, nu, mu_s, nu_s = leaf_update(g, p, mu, nu, mu_s, nu_s, info, hp, block_size=256,
      ...                                     decay=True)
    """
    nb = mu_s.shape[0]
    g32 = g.astype(jnp.float32)
    u = kernel.leaf_direction(g32, p, mu, nu, mu_s, nu_s, info, hp, block_size=block_size,
                              decay=decay)
    # always the scalars (the gate is always true); the data dependency on p + u (the user's
    # apply_updates, merged by XLA) writes the codes after that fusion has read the old ones
    scalars = jnp.where(kernel.after(p + u), _scalars(info, hp), jnp.nan)
    out = (jax.ShapeDtypeStruct(mu.shape, mu.dtype), jax.ShapeDtypeStruct(nu.shape, nu.dtype),
           jax.ShapeDtypeStruct((nb,), jnp.float32), jax.ShapeDtypeStruct((nb,), jnp.float32))
    call = jax.ffi.ffi_call(STATE_TARGET, out, input_output_aliases={1: 0, 2: 1, 3: 2, 4: 3},
                            vmap_method="sequential")  # under jax.vmap: one call per member
    m, v, ms, vs = call(g32, mu, nu, mu_s.reshape(nb), nu_s.reshape(nb), scalars,
                        block_size=np.int64(block_size), threads=np.int64(threads))
    return u, m, v, ms.reshape(mu_s.shape), vs.reshape(nu_s.shape)


def leaf_master_step(master, g, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *,
                     block_size: int, decay: bool, threads: int = 0, copy=None, copy_dtype=jnp.bfloat16):
    """``kernel.leaf_master_step`` as one native call: ``(master, copy, mu, nu, mu_s, nu_s)``.

    Call inside ``jit`` with ``master``, ``mu``, ``nu`` and the scales donated (they are written
    in place). Requires :func:`available` and :func:`supports` (``host_step=True``): dynamic8
    moments take the fused 8-bit loop, fp32 moments (``fp32_state_filter``'s tensors) a one-pass
    AdamW (read p g m v, write p copy m v), their scales passed through.

    Args:
      threads: worker threads (0: one per core this process may run on).
      copy: optionally the previous copy (donated too): the new copy is written into its
        buffer, so the step maps no fresh memory (a new copy buffer is page-faulted in every step).
      copy_dtype: the streaming copy's dtype, bf16 (rounded to nearest even) or fp32.

    Example:
      >>> new = leaf_master_step(p, g, mu, nu, mu_s, nu_s, info, hp, block_size=256, decay=True)
    """
    copy_dtype = jnp.dtype(copy_dtype)
    if copy_dtype not in COPY_DTYPES:
        raise ValueError(f"copy_dtype={copy_dtype}; valid: {', '.join(map(str, COPY_DTYPES))}")
    if copy is not None and (copy.shape != master.shape or copy.dtype != copy_dtype):
        raise ValueError(f"copy: {copy.dtype}{list(copy.shape)}; expected {copy_dtype}{list(master.shape)}")
    if q.format_of(mu.dtype) == "fp32":
        return _fp32_master_step(master, g, mu, nu, mu_s, nu_s, info, hp, decay=decay, threads=threads,
                                 copy=copy, copy_dtype=copy_dtype)
    nb = mu_s.shape[0]
    out = (jax.ShapeDtypeStruct(master.shape, jnp.float32),
           jax.ShapeDtypeStruct(master.shape, copy_dtype),
           jax.ShapeDtypeStruct(mu.shape, mu.dtype), jax.ShapeDtypeStruct(nu.shape, nu.dtype),
           jax.ShapeDtypeStruct((nb,), jnp.float32), jax.ShapeDtypeStruct((nb,), jnp.float32))
    aliases = {0: 0, 2: 2, 3: 3, 4: 4, 5: 5}
    args = [master, g, mu, nu, mu_s.reshape(nb), nu_s.reshape(nb), _scalars(info, hp)]
    if copy is not None:
        args.append(copy)
        aliases[7] = 1
    call = jax.ffi.ffi_call(TARGET if copy is None else INTO_TARGET, out, input_output_aliases=aliases,
                            vmap_method="sequential")
    p, c, m, v, ms, vs = call(*args, block_size=np.int64(block_size), decay=bool(decay),
                              threads=np.int64(threads))
    return p, c, m, v, ms.reshape(mu_s.shape), vs.reshape(nu_s.shape)


def _fp32_master_step(master, g, mu, nu, mu_s, nu_s, info: StepInfo, hp: AdamHyperparams, *, decay: bool,
                      threads: int, copy, copy_dtype):
    """:func:`leaf_master_step` for fp32 moments: one native call (master, m and v in place)."""
    out = (jax.ShapeDtypeStruct(master.shape, jnp.float32), jax.ShapeDtypeStruct(master.shape, copy_dtype),
           jax.ShapeDtypeStruct(mu.shape, jnp.float32), jax.ShapeDtypeStruct(nu.shape, jnp.float32))
    args = [master, g, mu, nu, _scalars(info, hp)]
    aliases = {0: 0, 2: 2, 3: 3}
    if copy is not None:
        args.append(copy)
        aliases[5] = 1
    call = jax.ffi.ffi_call(F32_TARGET if copy is None else F32_INTO_TARGET, out, input_output_aliases=aliases,
                            vmap_method="sequential")
    p, c, m, v = call(*args, decay=bool(decay), threads=np.int64(threads))
    return p, c, m, v, mu_s, nu_s
