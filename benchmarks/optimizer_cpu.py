"""Host optimizer step on this CPU: hybrid 8-bit AdamW vs optax fp32 vs torch 8-bit peers.

One update = global-norm clip (1.0) + AdamW + fp32 master update + bf16 streaming copy, over a
params set of N parameters (1024 x 1024 fp32 matrices), every method in one run of this script.
Our rows: ``optax transform`` = ``adamw_8bit`` inside a jitted, donated train-step tail (global
norm computed inside); ``fused_layer_step`` = the host executor's path (norm computed by a
separate jitted call, then ``begin_step`` + ``fused_layer_step`` on the whole params tree);
``norm given`` = the same with the norm already known (the executor sums squares per layer
during backward, so on the host the norm is free).
Prints the median time per update over several repeats (methods interleaved round by round, so
machine noise hits all alike), the ratio to optax fp32, and Adam-state bytes per parameter.

The torch peers (bitsandbytes AdamW8bit, torchao AdamW8bit, torch AdamW fp32) run in a
subprocess with a separate python, installed in a throwaway environment -- never the main one::

    python -m venv /tmp/bnbenv
    /tmp/bnbenv/bin/pip install torch==2.13.0 bitsandbytes torchao

Usage::

    python benchmarks/optimizer_cpu.py --torch-python /tmp/bnbenv/bin/python
    python benchmarks/optimizer_cpu.py --sizes 10M --repeats 3          # quick, JAX rows only

Rows a peer cannot run on CPU say so (with the error) instead of a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

MAT = 1024  # every tensor is MAT x MAT (block sizes divide it)


def _num_mats(n: int) -> int:
    return max(1, round(n / (MAT * MAT)))


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMB")) * mult)


# ----------------------------------------------------------------------------------------- JAX
def _jax_methods(n: int, formats: list[str]):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from lazytrain_jax import optim

    k = _num_mats(n)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((MAT, MAT), dtype=np.float32) * 0.02 for _ in range(k)]
    grads = {f"w{i}": jnp.asarray(h * 0.01) for i, h in enumerate(host)}
    del host

    def make(tx, precomputed_norm=False):
        def step(master, state, g):
            if precomputed_norm:  # the executor's path: norm summed per layer during backward
                u, state = tx.update(g, state, master, global_norm=jnp.float32(0.5))
            else:
                u, state = tx.update(g, state, master)
            master = optax.apply_updates(master, u)
            return master, jax.tree.map(lambda p: p.astype(jnp.bfloat16), master), state

        fn = jax.jit(step, donate_argnums=(0, 1))
        master = jax.tree.map(lambda g: g * 2.0, grads)
        box = {"master": master, "state": tx.init(master)}

        def run():
            box["master"], copy, box["state"] = fn(box["master"], box["state"], grads)
            jax.block_until_ready((box["master"], copy, box["state"]))

        return run, box

    norm_fn = jax.jit(optim.global_norm_fp32)
    hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.01)

    def make_fused(tx, norm_given):
        """The host executor's path: begin_step + fused_layer_step (donated master, state)."""
        master = jax.tree.map(lambda g: g * 2.0, grads)
        st = tx.init(master)
        box = {"master": master, "moments": optim.LayerMoments(st.mu, st.nu, st.mu_scales,
                                                               st.nu_scales)}

        def run():
            norm = jnp.float32(0.5) if norm_given else norm_fn(grads)
            info, _, _ = optim.begin_step(0, 0, norm, 1.0)
            box["master"], copy, box["moments"] = optim.fused_layer_step(
                box["master"], grads, box["moments"], info, hp)
            jax.block_until_ready((box["master"], copy, box["moments"]))

        return run

    methods = {}
    ref = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))
    run, box = make(ref)
    methods["optax adamw + clip_by_global_norm (fp32)"] = (run, 8.0)
    for fmt in formats:
        tx = optim.adamw_8bit(1e-3, weight_decay=0.01, max_grad_norm=1.0, state_format=fmt)
        bpp = optim.state_bytes_per_param(grads, state_format=fmt)["bytes_per_param"]
        methods[f"adamw_8bit {fmt}: optax transform"] = (make(tx)[0], bpp)
        methods[f"adamw_8bit {fmt}: fused_layer_step"] = (make_fused(tx, False), bpp)
        if fmt != "fp32":
            methods[f"adamw_8bit {fmt}: fused_layer_step, norm given"] = (make_fused(tx, True),
                                                                          bpp)
    return methods, k * MAT * MAT


def _time_jax(n: int, formats: list[str], repeats: int):
    methods, num_params = _jax_methods(n, formats)
    times = {name: [] for name in methods}
    for run, _ in methods.values():  # compile + warm up
        run()
        run()
    for _ in range(repeats):
        for name, (run, _) in methods.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    rows = {name: (statistics.median(t), methods[name][1]) for name, t in times.items()}
    return rows, num_params


# --------------------------------------------------------------------------------------- torch
def torch_worker(n: int, repeats: int) -> None:
    """Runs inside the torch venv; prints one JSON line per peer."""
    import torch

    torch.manual_seed(0)
    k = _num_mats(n)

    def peer(name, make_opt):
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
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t0)
            state_bytes = sum(t.numel() * t.element_size() for st in opt.state.values()
                              for t in _tensors(st) if t.numel() > 1)
            out = {"name": name, "time": statistics.median(ts),
                   "bpp": state_bytes / (k * MAT * MAT)}
        except Exception as e:  # a peer that does not run on CPU is reported, not hidden
            out = {"name": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}
        print("RESULT " + json.dumps(out), flush=True)

    def _tensors(st):
        for v in st.values():
            if torch.is_tensor(v):
                # torchao keeps codes and scales inside a tensor subclass
                inner = [getattr(v, a) for a in ("codes", "scale", "qmap") if hasattr(v, a)]
                yield from (inner if inner else [v])

    peer("torch AdamW fp32 (foreach)", lambda ps: torch.optim.AdamW(ps, 1e-3, weight_decay=0.01))

    def bnb_opt(ps):
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(ps, lr=1e-3, weight_decay=0.01)

    peer("bitsandbytes AdamW8bit", bnb_opt)

    def ao_opt(ps):
        try:
            from torchao.optim import AdamW8bit
        except ImportError:
            from torchao.prototype.low_bit_optim import AdamW8bit
        return AdamW8bit(ps, lr=1e-3, weight_decay=0.01)

    peer("torchao AdamW8bit", ao_opt)


def _time_torch(python: str, n: int, repeats: int):
    cmd = [python, __file__, "--torch-worker", str(n), "--repeats", str(repeats)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"torch peers": f"not run: {type(e).__name__}: {e}"}
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            rows[r["name"]] = r.get("error") or (r["time"], r["bpp"])
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:120]
        rows["torch peers"] = f"not run: {tail}"
    return rows


# ---------------------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10M,100M")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--formats", default="dynamic8,fp8,fp32")
    ap.add_argument("--torch-python", default=None, help="python of the torch/bnb/torchao venv")
    ap.add_argument("--torch-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_worker is not None:
        torch_worker(args.torch_worker, args.repeats)
        return
    import jax

    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.repeats} repeats, "
          "one update = clip 1.0 + AdamW + fp32 master + bf16 copy")
    for size in args.sizes.split(","):
        n = _parse_size(size)
        rows, num_params = _time_jax(n, args.formats.split(","), args.repeats)
        if args.torch_python:
            rows.update(_time_torch(args.torch_python, n, args.repeats))
        else:
            rows["torch peers"] = "not run: pass --torch-python"
        base = rows["optax adamw + clip_by_global_norm (fp32)"][0]
        print(f"\n{num_params / 1e6:.1f}M parameters ({_num_mats(n)} x {MAT}x{MAT} fp32)")
        print(f"| {'method':<46} | {'median ms':>9} | {'vs optax':>8} | {'state B/param':>13} |")
        print(f"|{'-' * 48}|{'-' * 11}|{'-' * 10}|{'-' * 15}|")
        for name, r in rows.items():
            if isinstance(r, str):
                print(f"| {name:<46} | {r}")
                continue
            t, bpp = r
            print(f"| {name:<46} | {t * 1e3:9.1f} | {t / base:7.2f}x | {bpp:13.3f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
