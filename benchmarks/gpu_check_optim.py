"""The 8-bit optax transform inside an ordinary jitted train step, on the default JAX device.

For a user's accelerator training loop (no host round trip): times ``adamw_8bit`` (dynamic8 state)
against optax's fp32 ``clip_by_global_norm + adamw`` in the same jitted, donated step tail
(update + apply_updates), methods interleaved round by round, medians of the repeats. Also checks
the compiled program of the 8-bit step: its moments stay int8 / uint8 and no float8 conversion
appears (dynamic8 needs none; ``fp8`` state on a backend without native float8 converts
is emulated and slow, so it must never be chosen by accident).

Runs on whatever ``jax.devices()[0]`` is (a GPU when one is visible, else the CPU)::

    PYTHONPATH=. python benchmarks/gpu_check_optim.py --size 100M --repeats 20

Prints one table; exits non-zero if the compiled 8-bit step contains a float8 type.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 10**3, "M": 10**6, "B": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMB")) * mult)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100M", help="parameters (tensors of 4096 x 4096 or less)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from lazytrain_jax import optim

    n = _parse_size(args.size)
    side = 4096 if n >= 4096 * 4096 else 1024
    k = max(1, round(n / (side * side)))
    rng = np.random.default_rng(0)
    grads = {f"w{i}": jnp.asarray(rng.standard_normal((side, side), dtype=np.float32) * 1e-3)
             for i in range(k)}
    num_params = k * side * side

    def make(tx):
        def step(params, state, g):
            u, state = tx.update(g, state, params)
            return optax.apply_updates(params, u), state

        fn = jax.jit(step, donate_argnums=(0, 1))
        params = jax.tree.map(lambda g: g * 10.0, grads)
        box = [params, tx.init(params)]
        hlo = jax.jit(step).lower(box[0], box[1], grads).compile().as_text()

        def run():
            box[0], box[1] = fn(box[0], box[1], grads)
            jax.block_until_ready(box)

        return run, hlo

    methods = {
        "optax clip_by_global_norm + adamw (fp32 state)": make(optax.chain(
            optax.clip_by_global_norm(1.0), optax.adamw(1e-3, weight_decay=0.01))),
        "adamw_8bit dynamic8 (optax transform)": make(optim.adamw_8bit(
            1e-3, weight_decay=0.01, max_grad_norm=1.0, state_format="dynamic8")),
    }
    _, hlo8 = methods["adamw_8bit dynamic8 (optax transform)"]
    has_f8 = "f8e4m3" in hlo8 or "f8e5m2" in hlo8
    times = {name: [] for name in methods}
    for run, _ in methods.values():
        run()
        run()
    for _ in range(args.repeats):
        for name, (run, _) in methods.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    dev = jax.devices()[0]
    print(f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}), {num_params / 1e6:.1f}M "
          f"params ({k} x {side}x{side}), medians of {args.repeats}, interleaved")
    base = statistics.median(times[next(iter(times))])
    print(f"| {'method':<48} | {'median ms':>9} | {'vs optax':>8} |")
    print(f"|{'-' * 50}|{'-' * 11}|{'-' * 10}|")
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"| {name:<48} | {t * 1e3:9.2f} | {t / base:7.2f}x |")
    print(f"float8 types in the compiled 8-bit step: {'YES (bad)' if has_f8 else 'none'}")
    return 1 if has_f8 else 0


if __name__ == "__main__":
    sys.exit(main())
