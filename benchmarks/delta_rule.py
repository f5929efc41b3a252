"""Gated delta rule on CPU: chunked form (training) vs the per-token scan (reference), seq 2048.

Both jitted; forward and forward+backward, median of repeats, measured side by side in one run.
Head geometry of Qwen3.6-27B's Gated DeltaNet (key and value dim 128), a few heads.

Run: python benchmarks/delta_rule.py [--heads 4] [--seq 2048] [--repeats 5]
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.model.delta_rule import delta_rule_chunked, delta_rule_scan, l2norm


def make_inputs(batch, seq, heads, dk, dv, seed=0):
    rng = np.random.default_rng(seed)
    q = l2norm(jnp.asarray(rng.standard_normal((batch, seq, heads, dk)), jnp.float32)) * dk ** -0.5
    k = l2norm(jnp.asarray(rng.standard_normal((batch, seq, heads, dk)), jnp.float32))
    v = jnp.asarray(rng.standard_normal((batch, seq, heads, dv)), jnp.float32)
    g = -jnp.asarray(rng.uniform(0.0, 2.0, (batch, seq, heads)), jnp.float32)
    beta = jax.nn.sigmoid(jnp.asarray(rng.standard_normal((batch, seq, heads)), jnp.float32))
    return q, k, v, g, beta


def timed(fn, args, repeats):
    jax.block_until_ready(fn(*args))  # compile
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    args = make_inputs(a.batch, a.seq, a.heads, a.dk, a.dv)
    print(f"gated delta rule, CPU ({jax.devices()[0].device_kind}), batch {a.batch}, seq {a.seq}, heads {a.heads}, "
          f"dk {a.dk}, dv {a.dv}; median of {a.repeats}; shared machine, expect noise")
    forms = {"scan (per token)": delta_rule_scan, "chunked C=64": delta_rule_chunked}
    results = {}
    for name, fn in forms.items():
        fwd = jax.jit(fn)
        bwd = jax.jit(jax.grad(lambda *x, fn=fn: jnp.sum(fn(*x) ** 2), argnums=(0, 1, 2, 3, 4)))
        results[name] = (timed(fwd, args, a.repeats), timed(bwd, args, a.repeats))
    ref = np.asarray(delta_rule_scan(*args))
    err = np.max(np.abs(np.asarray(delta_rule_chunked(*args)) - ref)) / np.max(np.abs(ref))
    print(f"  {'form':18s} {'forward ms':>11s} {'fwd+bwd ms':>11s}")
    for name, (f, b) in results.items():
        print(f"  {name:18s} {f * 1e3:11.1f} {b * 1e3:11.1f}")
    (sf, sb), (cf, cb) = results.values()
    print(f"  speed-up of the chunked form: forward {sf / cf:.1f}x, forward+backward {sb / cb:.1f}x; "
          f"max relative difference {err:.1e}")


if __name__ == "__main__":
    main()
