"""Host optimizer step on this CPU: hybrid 8-bit AdamW vs optax fp32 vs torch 8-bit peers.

One update = global-norm clip (1.0) + AdamW + fp32 master update + bf16 streaming copy, over a
params set of N parameters (1024 x 1024 fp32 matrices), every method in one run of this script.
Our rows: ``optax transform`` = ``adamw_8bit`` inside a jitted, donated train-step tail (global
norm computed inside; ``impl='auto'``, the default, which for dynamic8 is the native kernel
writing the codes and scales while XLA computes the update inside ``apply_updates``, and
``impl='xla'``, XLA alone); ``fused_layer_step`` = the host executor's path (norm computed by a
separate jitted call, then ``begin_step`` + ``fused_layer_step`` on the whole params tree);
``norm given`` = the same with the norm already known (the executor sums squares per layer
during backward, so on the host the norm is free). The host step writes its bf16 copy into the
previous step's (donated), as the executor does; ``fresh copy buffer`` = the same without that
(a newly allocated copy each step, page-faulted in: the cost the reuse removes).
Prints the median time per update over several repeats (methods interleaved round by round, so
machine noise hits all alike), the ratio to optax fp32, and Adam-state bytes per parameter.

The torch peers (DeepSpeed's ``DeepSpeedCPUAdam`` -- ZeRO-Offload's vectorised C++ fp32 Adam, the
host optimizer offloading users run --, bitsandbytes AdamW8bit, torchao AdamW8bit, torch AdamW fp32;
each after ``clip_grad_norm_``) run in a subprocess with a separate python, installed in a
throwaway environment -- never a dependency of this project::

    python -m venv --system-site-packages /tmp/dsenv   # reuses the CPU torch already installed
    /tmp/dsenv/bin/pip install deepspeed bitsandbytes torchao
    # DeepSpeedCPUAdam builds its C++ op (g++, ninja) on first use: minutes, cached afterwards

Columns: median ms per update; ratio to optax fp32; params/s; ``HLO B/param`` = bytes the
compiled XLA program reads and writes per parameter (``cost_analysis``: every top-level op's
operands + results, a custom call's included, which is the state kernel's own traffic, 8 B; for
the host step's kernel its own traffic, 18 B); Adam-state bytes per parameter. Below the table: the
memory bandwidth measured here (a jitted copy) and each method's byte limit, the time its minimum
traffic takes at that bandwidth (fp32 AdamW + clip + bf16 copy: read g for the norm, read p g m v,
write p m v and the copy = 34 B; the 8-bit optax transform as it runs here = 28 B (see
``LIMIT_TRANSFORM``: the transform returns updates, so its work splits in two passes over g); the
fused 8-bit update with the norm given: read p g and 2 code bytes, write p, 2 code bytes and the
copy = 18 B, + 16 / block_size of scales).

``--cores 1,2`` adds params/s of the fused host update and of DeepSpeedCPUAdam with the process
pinned to 1 and to 2 cores (``os.sched_setaffinity`` before jax / torch start their pools).

Usage (from the repository root; ``PYTHONPATH=.`` so that this checkout is what is measured)::

    PYTHONPATH=. python benchmarks/optimizer_cpu.py --torch-python /tmp/dsenv/bin/python \
        --sizes 100M --cores 1,2
    PYTHONPATH=. python benchmarks/optimizer_cpu.py --sizes 10M --repeats 3   # quick, JAX only
    PYTHONPATH=. python benchmarks/optimizer_cpu.py --embedding 151936x896 --repeats 7   # fp32 state

Rows a peer cannot run on CPU say so (with the error) instead of a time.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import os
import subprocess
import sys
import time

MAT = 1024  # every tensor is MAT x MAT (block sizes divide it)
OPTAX = "optax adamw + clip_by_global_norm (fp32)"
DEEPSPEED = "DeepSpeedCPUAdam + clip_grad_norm_ (fp32)"
NATIVE = "adamw_8bit dynamic8: fused, impl='native', norm given"
TRANSFORM = "adamw_8bit dynamic8: optax transform (impl='auto' = 'native')"
# minimum bytes per parameter of one update (see the module docstring)
LIMIT_FP32 = 4 + 16 + 12 + 2
LIMIT_8BIT = 4 + 1 + 1 + 4 + 1 + 1 + 4 + 2
LIMIT_FP32_STEP = 16 + 12 + 2  # the host step with fp32 moments, norm given: read p g m v, write p m v, copy
# the optax transform as it runs here (updates returned, then apply_updates): read g for the norm;
# XLA's update fused into p + u and the copy: read p g mc vc, write p and the bf16 copy; the state
# kernel: read g mc vc, write mc vc (+ scales: read by both, written by the kernel: 24 / block_size)
LIMIT_TRANSFORM = 4 + (4 + 4 + 1 + 1 + 4 + 2) + (4 + 1 + 1 + 1 + 1)


def _num_mats(n: int) -> int:
    return max(1, round(n / (MAT * MAT)))


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMB")) * mult)


# ----------------------------------------------------------------------------------------- JAX
def _hlo_bytes(jitted, *args) -> float:
    """Bytes the compiled program reads + writes (XLA cost analysis of its top-level ops)."""
    cost = jitted.lower(*args).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost.get("bytes accessed", float("nan")))


def _jax_methods(n: int, formats: list[str], fused_only: bool = False):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from lazytrain_jax import optim
    from lazytrain_jax.optim import native

    k = _num_mats(n)
    num_params = k * MAT * MAT
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((MAT, MAT), dtype=np.float32) * 0.02 for _ in range(k)]
    grads = {f"w{i}": jnp.asarray(h * 0.01) for i, h in enumerate(host)}
    del host

    def make(tx):
        def step(master, state, g):
            u, state = tx.update(g, state, master)
            master = optax.apply_updates(master, u)
            return master, jax.tree.map(lambda p: p.astype(jnp.bfloat16), master), state

        fn = jax.jit(step, donate_argnums=(0, 1))
        master = jax.tree.map(lambda g: g * 2.0, grads)
        box = {"master": master, "state": tx.init(master)}
        nbytes = _hlo_bytes(jax.jit(step), box["master"], box["state"], grads)

        def run():
            box["master"], copy, box["state"] = fn(box["master"], box["state"], grads)
            jax.block_until_ready((box["master"], copy, box["state"]))

        return run, nbytes / num_params

    norm_fn = jax.jit(optim.global_norm_fp32)
    hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.01)

    def make_fused(tx, fmt, norm_given, impl="xla", reuse_copy=True):
        """The host executor's path: begin_step + fused_layer_step (donated master, state; the
        previous copy donated too, unless ``reuse_copy`` is False: a fresh copy buffer per step);
        ``fmt``: ``tx``'s state format."""
        master = jax.tree.map(lambda g: g * 2.0, grads)
        st = tx.init(master)
        # the previous step's copy is donated and holds the new one, as in the executor
        box = {"master": master, "moments": optim.LayerMoments(st.mu, st.nu, st.mu_scales,
                                                               st.nu_scales), "copy": None}
        info0, _, _ = optim.begin_step(0, 0, jnp.float32(0.5), 1.0)
        # XLA's cost analysis does not see inside the native custom call: its own traffic instead
        own = LIMIT_FP32_STEP if fmt == "fp32" else LIMIT_8BIT + 16 / 256
        nbytes = own * num_params if impl == "native" else _hlo_bytes(
            jax.jit(functools.partial(optim.fused_layer_step, impl="xla")), box["master"], grads, box["moments"], info0, hp)
        if not norm_given:
            nbytes += _hlo_bytes(norm_fn, grads)

        def run():
            norm = jnp.float32(0.5) if norm_given else norm_fn(grads)
            info, _, _ = optim.begin_step(0, 0, norm, 1.0)
            box["master"], box["copy"], box["moments"] = optim.fused_layer_step(
                box["master"], grads, box["moments"], info, hp, impl=impl,
                copy=box["copy"] if reuse_copy else None)
            jax.block_until_ready((box["master"], box["copy"], box["moments"]))

        return run, nbytes / num_params

    methods = {}
    if not fused_only:
        ref = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
        methods[OPTAX] = (*make(ref), 8.0)
    for fmt in formats:
        tx = optim.adamw_8bit(1e-3, weight_decay=0.01, max_grad_norm=1.0, state_format=fmt)
        bpp = optim.state_bytes_per_param(grads, state_format=fmt)["bytes_per_param"]
        if not fused_only:
            if fmt == "dynamic8" and native.available():
                methods[TRANSFORM] = (*make(tx), bpp)
                tx_xla = optim.adamw_8bit(1e-3, weight_decay=0.01, max_grad_norm=1.0,
                                          state_format=fmt, impl="xla")
                methods[f"adamw_8bit {fmt}: optax transform, impl='xla'"] = (*make(tx_xla), bpp)
            else:  # the kernel takes dynamic8 state only
                methods[f"adamw_8bit {fmt}: optax transform (impl='auto' = 'xla')"] = (
                    *make(tx), bpp)
            methods[f"adamw_8bit {fmt}: fused_layer_step"] = (*make_fused(tx, fmt, False), bpp)
        methods[f"adamw_8bit {fmt}: fused_layer_step, norm given"] = (*make_fused(tx, fmt, True), bpp)
        if fmt == "fp32" and native.available():  # fp32 moments: the kernel's one-pass fp32 loop
            methods[f"adamw_8bit {fmt}: fused_layer_step, norm given, native"] = (
                *make_fused(tx, fmt, True, "native"), bpp)
        if fmt == "dynamic8" and native.available():
            methods[NATIVE] = (*make_fused(tx, fmt, True, "native"), bpp)
            if not fused_only:
                methods[NATIVE + ", fresh copy buffer"] = (*make_fused(tx, fmt, True, "native", False), bpp)
                methods[NATIVE.replace("norm given", "norm computed")] = (
                    *make_fused(tx, fmt, False, "native"), bpp)
        elif fmt == "dynamic8":
            print(f"native kernel not run: {native.unavailable_reason()}")
    return methods, num_params


def _bandwidth(num_floats: int, repeats: int) -> float:
    """Bytes/s of a jitted, donated in-place scale of ``num_floats`` fp32 (read + write)."""
    import jax
    import jax.numpy as jnp

    fn = jax.jit(lambda x: x * 1.0000001, donate_argnums=0)
    x = jnp.ones(num_floats, jnp.float32)
    times = []
    for i in range(repeats + 2):
        t0 = time.perf_counter()
        x = jax.block_until_ready(fn(x))
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 8.0 * num_floats / statistics.median(times)


def _time_jax(n: int, formats: list[str], repeats: int, fused_only: bool = False,
              peers: "TorchPeers | None" = None):
    methods, num_params = _jax_methods(n, formats, fused_only)
    times = {name: [] for name in methods}
    for run, *_ in methods.values():  # compile + warm up
        run()
        run()
    for _ in range(repeats):
        for name, (run, *_) in methods.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
        if peers is not None:
            peers.round()
    rows = {name: (statistics.median(t), methods[name][2], methods[name][1])
            for name, t in times.items()}
    return rows, num_params


# --------------------------------------------------------------------------------------- torch
def torch_worker(n: int, only: str | None = None) -> None:
    """Runs inside the torch venv: builds the peers, then times one step of each per input line.

    Prints ``READY``; for each line read from stdin prints ``ROUND {name: seconds}``; at end of
    input prints one ``RESULT`` line per peer (state bytes per param, or the error that stopped it).
    """
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    k = _num_mats(n)
    steps, results = {}, {}

    def _tensors(st):
        for v in st.values():
            if torch.is_tensor(v):
                # torchao keeps codes and scales inside a tensor subclass
                inner = [getattr(v, a) for a in ("codes", "scale", "qmap") if hasattr(v, a)]
                yield from (inner if inner else [v])

    def peer(name, make_opt):
        if only is not None and name != only:
            return
        try:
            params = [torch.nn.Parameter(torch.randn(MAT, MAT) * 0.02) for _ in range(k)]
            for p in params:
                p.grad = torch.randn(MAT, MAT) * 1e-4
            copies = [torch.empty(MAT, MAT, dtype=torch.bfloat16) for _ in range(k)]
            opt = make_opt(params)

            def step():
                torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
                opt.step()
                with torch.no_grad():
                    for c, p in zip(copies, params):
                        c.copy_(p)

            for _ in range(2):
                step()
            state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                              for t in _tensors(st) if t.numel() > 1)
            steps[name] = step
            results[name] = {"name": name, "bpp": state_bytes / (k * MAT * MAT),
                             "threads": torch.get_num_threads()}
        except Exception as e:  # a peer that does not run on CPU is reported, not hidden
            results[name] = {"name": name,
                             "error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}

    def ds_opt(ps):
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(ps, lr=1e-3, weight_decay=0.01, adamw_mode=True)

    def bnb_opt(ps):
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(ps, lr=1e-3, weight_decay=0.01)

    def ao_opt(ps):
        try:
            from torchao.optim import AdamW8bit
        except ImportError:
            from torchao.prototype.low_bit_optim import AdamW8bit
        return AdamW8bit(ps, lr=1e-3, weight_decay=0.01)

    peer(DEEPSPEED, ds_opt)
    peer("torch AdamW fp32 (foreach)", lambda ps: torch.optim.AdamW(ps, 1e-3, weight_decay=0.01))
    peer("bitsandbytes AdamW8bit", bnb_opt)
    peer("torchao AdamW8bit", ao_opt)
    print("READY", flush=True)
    for _ in sys.stdin:
        times = {}
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[name] = time.perf_counter() - t0
        print("ROUND " + json.dumps(times), flush=True)
    for r in results.values():
        print("RESULT " + json.dumps(r), flush=True)


class TorchPeers:
    """The torch worker as a subprocess, stepped once per round between the JAX methods."""

    def __init__(self, python: str, n: int, pin: int | None = None, only: str | None = None):
        cmd = [python, __file__, "--torch-worker", str(n)]
        cmd += [] if pin is None else ["--pin", str(pin)]
        cmd += [] if only is None else ["--only", only]
        self.error = None
        self.times: dict[str, list[float]] = {}
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
            self._read("READY")
        except (OSError, RuntimeError) as e:
            self.error = f"not run: {type(e).__name__}: {e}"

    def _read(self, tag):
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag):].strip()
        tail = (self.proc.stderr.read().strip().splitlines() or ["no output"])[-1][:120]
        raise RuntimeError(tail)

    def round(self):
        if self.error:
            return
        self.proc.stdin.write("round\n")
        self.proc.stdin.flush()
        for name, t in json.loads(self._read("ROUND")).items():
            self.times.setdefault(name, []).append(t)

    def finish(self) -> dict:
        """``{name: (median seconds, state bytes/param) or error text}``."""
        if self.error:
            return {"torch peers": self.error}
        self.proc.stdin.close()
        rows = {}
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                rows[r["name"]] = r.get("error") or (statistics.median(self.times[r["name"]]),
                                                     r["bpp"])
        self.proc.wait()
        return rows


# ---------------------------------------------------------------------------------------- main
def _pinned_jax_rate(n: int, repeats: int, cores: int) -> dict:
    """Params/s of the fused host update (norm given; XLA and native) pinned to ``cores``."""
    cmd = [sys.executable, __file__, "--pin", str(cores), "--fused-worker", str(n),
           "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:120]}


def _print_table(rows, num_params, n):
    base = rows[OPTAX][0]
    print(f"\n{num_params / 1e6:.1f}M parameters ({_num_mats(n)} x {MAT}x{MAT} fp32)")
    print(f"| {'method':<56} | {'median ms':>9} | {'vs optax':>8} | {'Mparam/s':>8} "
          f"| {'HLO B/param':>11} | {'state B/param':>13} |")
    print(f"|{'-' * 58}|{'-' * 11}|{'-' * 10}|{'-' * 10}|{'-' * 13}|{'-' * 15}|")
    for name, r in rows.items():
        if isinstance(r, str):
            print(f"| {name:<56} | {r}")
            continue
        t, bpp, hlo = r
        hlo_txt = "" if hlo is None else f"{hlo:.1f}"
        print(f"| {name:<56} | {t * 1e3:9.1f} | {t / base:7.2f}x | {num_params / t / 1e6:8.0f} "
              f"| {hlo_txt:>11} | {bpp:13.3f} |")


def _interleaved_host_steps(setups: dict, repeats: int) -> dict:
    """Seconds of the executor's host step (``fused_layer_step``, norm given, the previous copy
    donated and holding the new one) per setup, interleaved medians. ``setups``: name -> (master,
    moments, a function giving the step's gradients, impl)."""
    import jax.numpy as jnp

    from lazytrain_jax import optim
    from lazytrain_jax.executor.profiler import median_seconds_interleaved

    hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.01)
    info, _, _ = optim.begin_step(0, 0, jnp.float32(0.5), 1.0)
    boxes = {name: [master, moments, None] for name, (master, moments, _, _) in setups.items()}

    def run(name):
        b, (_, _, grads, impl) = boxes[name], setups[name]
        b[0], b[2], b[1] = optim.fused_layer_step(b[0], grads(), b[1], info, hp, impl=impl, copy=b[2])
        return b
    return median_seconds_interleaved({name: (lambda name=name: run(name)) for name in setups}, repeats=repeats,
                                      warmup=2)


def embedding_step(vocab: int, hidden: int, repeats: int) -> None:
    """The host step of one embedding whose Adam state ``adamw_8bit``'s default policy keeps in fp32
    (``fp32_state_filter``), as the executor runs it (norm given, the previous copy donated): the
    XLA path against the native kernel's fp32 loop, interleaved medians."""
    import jax.numpy as jnp
    import numpy as np

    from lazytrain_jax import optim
    from lazytrain_jax.optim import native

    rng = np.random.default_rng(0)
    g = {"embed": jnp.asarray(rng.standard_normal((vocab, hidden), dtype=np.float32) * 1e-3)}
    impls = ("xla", "native") if native.available() else ("xla",)
    setups = {}
    for impl in impls:
        master = {"embed": jnp.asarray(rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.02)}
        moments = optim.layer_moments(optim.adamw_8bit(1e-3).init(master))
        assert moments.mu["embed"].dtype == jnp.float32  # the default policy's fp32 state
        setups[impl] = (master, moments, lambda: g, impl)
    t = _interleaved_host_steps(setups, repeats)
    n = vocab * hidden
    print(f"embedding {vocab} x {hidden} ({n / 1e6:.1f}M parameters, fp32 Adam state), one host step: "
          + "; ".join(f"{i} {t[i] * 1e3:.1f} ms ({n / t[i] / 1e9:.2f} G params/s)" for i in impls)
          + ("" if len(impls) > 1 else f" (native kernel not run: {native.unavailable_reason()})"))


def bf16_grad_step(n: int, repeats: int) -> None:
    """The host step of a layer (4 tensors, ``n`` parameters, 8-bit state, norm given, the previous
    copy donated) on bfloat16 gradients as the executor runs it now (the kernel reads them as they
    are) against the way before: the gradients first cast to an fp32 copy on the host (a jitted
    convert into a fresh buffer, as the engine's download did), then the step. Interleaved medians."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from lazytrain_jax import optim
    from lazytrain_jax.optim import native

    rng = np.random.default_rng(0)
    shape = (n // 4 // 1024, 1024)
    names = ("q", "o", "up", "down")
    g16 = {k: jnp.asarray((rng.standard_normal(shape, dtype=np.float32) * 1e-3).astype(jnp.bfloat16)) for k in names}
    to_f32 = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t))
    setups = {}
    for way, grads in (("cast, then the step", lambda: to_f32(g16)), ("the step on bf16", lambda: g16)):
        master = {k: jnp.asarray(rng.standard_normal(shape, dtype=np.float32) * 0.02) for k in names}
        moments = optim.layer_moments(optim.adamw_8bit(1e-3, fp32_state_filter="none").init(master))
        setups[way] = (master, moments, grads, native.DEFAULT_IMPL)
    t = _interleaved_host_steps(setups, repeats)
    num = 4 * shape[0] * shape[1]
    print(f"host step of {num / 1e6:.1f}M parameters (8-bit state) on bf16 gradients, impl "
          f"{native.resolve_impl('auto')}: " + "; ".join(f"{w} {t[w] * 1e3:.1f} ms" for w in setups)
          + f" ({t['cast, then the step'] / t['the step on bf16']:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10M,100M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--formats", default="dynamic8")
    ap.add_argument("--torch-python", default=None, help="python of the torch/deepspeed venv")
    ap.add_argument("--cores", default="", help="e.g. 1,2: params/s pinned to that many cores")
    ap.add_argument("--embedding", default=None, metavar="VOCABxHIDDEN",
                    help="only the host step of one embedding with fp32 Adam state, e.g. 151936x896 "
                         "(qwen2.5-0.5b's): XLA against the native kernel")
    ap.add_argument("--bf16-grads", default=None, metavar="SIZE",
                    help="only the host step of a layer of SIZE parameters on bf16 gradients: read as "
                         "they are against cast to fp32 first")
    ap.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--torch-worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fused-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pin is not None:  # before jax / torch size their thread pools
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.pin])
    if args.torch_worker is not None:
        torch_worker(args.torch_worker, args.only)
        return
    if args.bf16_grads is not None:
        bf16_grad_step(_parse_size(args.bf16_grads), args.repeats)
        return
    if args.embedding is not None:
        vocab, hidden = (int(x) for x in args.embedding.lower().split("x"))
        embedding_step(vocab, hidden, args.repeats)
        return
    if args.fused_worker is not None:
        rows, num_params = _time_jax(args.fused_worker, ["dynamic8"], args.repeats, True)
        print("RESULT " + json.dumps({name: num_params / r[0] for name, r in rows.items()}),
              flush=True)
        return
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {len(os.sched_getaffinity(0))} "
          f"cores, load average {os.getloadavg()[0]:.1f}, {args.repeats} repeats, one update = "
          "clip 1.0 + AdamW + fp32 master + bf16 copy")
    for size in args.sizes.split(","):
        n = _parse_size(size)
        peers = TorchPeers(args.torch_python, n) if args.torch_python else None
        rows, num_params = _time_jax(n, args.formats.split(","), args.repeats, peers=peers)
        if peers is not None:
            for name, r in peers.finish().items():
                rows[name] = r if isinstance(r, str) else (*r, None)
        else:
            rows["torch peers"] = "not run: pass --torch-python"
        _print_table(rows, num_params, n)
        bw = _bandwidth(num_params, args.repeats)
        t_opt = rows[OPTAX][0]
        print(f"\nmemory bandwidth here (jitted in-place scale, read + write): {bw / 1e9:.1f} GB/s")
        for label, limit in (("fp32 AdamW + clip + copy", LIMIT_FP32),
                             ("8-bit optax transform as split here", LIMIT_TRANSFORM + 24 / 256),
                             ("fused 8-bit, norm given", LIMIT_8BIT + 16 / 256)):
            t = limit * num_params / bw
            print(f"byte limit, {label}: {limit:.1f} B/param -> {t * 1e3:.1f} ms "
                  f"({t / t_opt:.2f}x optax measured)")
        for cores in [int(c) for c in args.cores.split(",") if c]:
            r = _pinned_jax_rate(n, args.repeats, cores)
            line = r.get("error") or "; ".join(
                f"{name.split(': ', 1)[1]} {rate / 1e6:.0f} Mparam/s" for name, rate in r.items())
            if args.torch_python:
                peers = TorchPeers(args.torch_python, n, pin=cores, only=DEEPSPEED)
                for _ in range(args.repeats):
                    peers.round()
                d = peers.finish()
                d = d.get(DEEPSPEED, next(iter(d.values())))
                line += ("; DeepSpeedCPUAdam " + (d if isinstance(d, str) else
                                                  f"{num_params / d[0] / 1e6:.0f} Mparam/s"))
            print(f"pinned to {cores} core(s): {line}")
            if cores == 1 and NATIVE in r:
                rate1 = r[NATIVE]
                print(f"scaling model for a c-core host (native kernel): rate(c) = "
                      f"min(c * {rate1:.3g}, bandwidth / {LIMIT_8BIT + 16 / 256:.1f} B) params/s "
                      "(per-core rate measured here; use the host's own bandwidth)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
