"""The native optimizer kernel's threads: every call given every core vs the cores shared.

XLA runs one program's independent custom calls side by side. Before ``native.thread_shares``
each native call started one thread per core, oversubscribing the cores when many tensors update
at once. This prints, side by side in one process (variants interleaved round by round, medians),
the executor's native step (``fused_layer_step``, impl="native", norm given) and the optax
transform (``adamw_8bit`` inside a jitted, donated ``update`` + ``apply_updates``), each compiled
with every call given every core ("all cores per call", ``threads=0``) and with the shares.

Usage (from the repository root)::

    PYTHONPATH=. python benchmarks/kernel_threads.py                # 95 x [1024, 1024] tensors
    PYTHONPATH=. python benchmarks/kernel_threads.py --one-tensor   # one [4096, 24414] tensor
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import optax

from lazytrain_jax import optim
from lazytrain_jax.optim import layerwise, native


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one-tensor", action="store_true", help="one 100M tensor instead of 95 of 1M")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    if not native.available():
        raise SystemExit(f"native kernel not built: {native.unavailable_reason()}")
    key = jax.random.PRNGKey(0)
    if args.one_tensor:
        params = {"w": jax.random.normal(key, (4096, 24414), jnp.float32) * 0.02}
    else:
        params = {f"w{i}": jax.random.normal(jax.random.fold_in(key, i), (1024, 1024), jnp.float32) * 0.02
                  for i in range(95)}
    grads = jax.tree.map(lambda p: p * 0.1 + 0.001, params)
    tx = optim.adamw_8bit(1e-3, weight_decay=0.01, max_grad_norm=1.0)
    hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.01)
    info, _, _ = optim.begin_step(0, 0, jnp.float32(0.5), 1.0)
    shares = native.thread_shares
    every_core = lambda sizes: [0] * len(sizes)  # noqa: E731  (0: one thread per core, per call)
    decay = tuple(True for _ in params)

    def host_step(policy):
        native.thread_shares = policy  # read while tracing, i.e. at the first call below
        fn = jax.jit(layerwise._fused_layer_step.__wrapped__, donate_argnums=(0, 2),
                     static_argnames=("block_size", "copy_dtype", "decay", "impl"))
        st = tx.init(params)
        box = [jax.tree.map(jnp.copy, params), optim.LayerMoments(st.mu, st.nu, st.mu_scales, st.nu_scales)]

        def run():
            box[0], copy, box[1] = fn(box[0], grads, box[1], info, hp, block_size=256,
                                      copy_dtype=jnp.bfloat16, decay=decay, impl="native")
            jax.block_until_ready((box[0], copy, box[1]))
        run()
        native.thread_shares = shares
        return run

    def transform(policy):
        native.thread_shares = policy

        @functools.partial(jax.jit, donate_argnums=(0, 1))
        def step(p, s, g):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s
        box = [jax.tree.map(jnp.copy, params), tx.init(params)]

        def run():
            box[0], box[1] = step(box[0], box[1], grads)
            jax.block_until_ready(box)
        run()
        native.thread_shares = shares
        return run

    variants = {"native step, all cores per call": host_step(every_core),
                "native step, cores shared": host_step(shares),
                "optax transform, all cores per call": transform(every_core),
                "optax transform, cores shared": transform(shares)}
    times = {k: [] for k in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            t = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t)
    what = "one [4096, 24414] tensor" if args.one_tensor else "95 x [1024, 1024] tensors"
    print(f"{what}, {native.thread_shares([1])[0]} core(s), medians of {args.repeats}, variants interleaved")
    print("| variant | median ms |")
    print("|---|---|")
    for name, ts in times.items():
        print(f"| {name} | {statistics.median(ts) * 1e3:.1f} |")


if __name__ == "__main__":
    main()
