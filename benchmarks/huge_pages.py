"""Huge pages for glibc's large host blocks (``host_alloc.reexec_with_huge_pages``), measured: the same
work in fresh processes started with and without ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, the two
kinds of process alternating, medians over rounds.

(a) one large array (--mb, default 557 MB: qwen2.5-0.5b's fp32 embedding table): a copy to the
    ``pinned_host`` memory kind, a copy from numpy to the device, and a fresh elementwise result
    (CPU backend: each a new allocation above glibc's 32 MiB mmap limit); GB/s and page faults.
(b) a streamed step (all boundaries and residuals on the device, fp32, pipelined 8-bit update) of
    qwen2.5-0.5b's shape cut to --layers layers, batch 1 x --seq: seconds, page faults, system time.

    python benchmarks/huge_pages.py [--rounds 3 --mb 557 --layers 2 --seq 128]

Linux with glibc 2.35+ and transparent huge pages not ``never`` only (``host_alloc.huge_pages_supported``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

CHILD = r"""
import json, resource, sys, time
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import SingleDeviceSharding
from lazytrain_jax.host_alloc import huge_pages_on, keep_host_blocks_once
keep_host_blocks_once()
part, mb, layers, seq = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def usage():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt, r.ru_stime
out = {"huge_pages": huge_pages_on()}
if part == "a":
    dev = jax.devices()[0]
    host = SingleDeviceSharding(dev, memory_kind="pinned_host")
    rows = int(mb * 1e6 / (1024 * 4))
    x = jnp.ones((rows, 1024), jnp.float32).block_until_ready()
    x_np = np.ones((rows, 1024), np.float32)
    for name, fn in (("to pinned_host", lambda: jax.device_put(x, host)), ("numpy to device", lambda: jax.device_put(x_np, dev)),
                     ("fresh x * 2", lambda: x * 2)):
        jax.block_until_ready(fn())
        times, (f0, _) = [], usage()
        for _ in range(5):
            t = time.perf_counter(); jax.block_until_ready(fn()); times.append(time.perf_counter() - t)
        out[name] = (x.nbytes / 1e9 / float(np.median(times)), (usage()[0] - f0) / 5)
else:
    import lazytrain_jax as lt
    from lazytrain_jax.executor.profiler import unit_costs
    from lazytrain_jax.schedule.hardware import Hardware
    from lazytrain_jax.schedule.plan import Plan
    cfg = lt.get_preset("qwen2.5-0.5b").replace(num_layers=layers, layer_kinds=("decoder",) * layers)
    model = lt.init_model(cfg, seed=0)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, seq)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}
    costs = unit_costs(model, batch_size=1, seq_len=seq, stream_dtype="float32")
    hw = Hardware(device_memory=1e12, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e11, host_shares_device=True)
    plan = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (layers + 1),
                       keep_residuals=[True] * layers, optimizer_mode="pipelined")
    with lt.StreamingEngine(model, plan, stream_dtype="float32") as eng:
        for _ in range(2):
            eng.step(batch); eng.flush()
        times, (f0, s0) = [], usage()
        for _ in range(5):
            t = time.perf_counter(); eng.step(batch); eng.flush(); times.append(time.perf_counter() - t)
        f1, s1 = usage()
    out["step"] = (float(np.median(times)), (f1 - f0) / 5, (s1 - s0) / 5)
print(json.dumps(out))
"""


def run(part, huge, args):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LAZYTRAIN_REEXEC_HUGE_PAGES")}
    if huge:
        env["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"
    res = subprocess.run([sys.executable, "-c", CHILD, part, str(args.mb), str(args.layers), str(args.seq)],
                         capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(f"child process failed:\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["huge_pages"] is huge, out
    return out


def main():
    from lazytrain_jax.host_alloc import huge_pages_supported
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mb", type=float, default=557.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    if not huge_pages_supported():
        raise SystemExit("huge pages for glibc's blocks are not available here (glibc < 2.35, not glibc, or "
                         "transparent huge pages 'never')")
    print(f"{args.rounds} rounds, each a fresh process per setting, alternating; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    for part in ("a", "b"):
        results = {False: [], True: []}
        for _ in range(args.rounds):
            for huge in (False, True):
                results[huge].append(run(part, huge, args))
        keys = [k for k in results[False][0] if k != "huge_pages"]
        for k in keys:
            base = [r[k] for r in results[False]]
            huge = [r[k] for r in results[True]]
            if part == "a":
                gb = [float(np.median([v[0] for v in x])) for x in (base, huge)]
                faults = [float(np.median([v[1] for v in x])) for x in (base, huge)]
                print(f"(a) {args.mb:.0f} MB {k:16s} GB/s {gb[0]:6.2f} -> {gb[1]:6.2f} ({gb[1] / gb[0]:.2f}x)   "
                      f"page faults per copy {faults[0]:9.0f} -> {faults[1]:7.0f}")
            else:
                s = [float(np.median([v[0] for v in x])) for x in (base, huge)]
                faults = [float(np.median([v[1] for v in x])) for x in (base, huge)]
                sys_s = [float(np.median([v[2] for v in x])) for x in (base, huge)]
                print(f"(b) streamed step, qwen2.5-0.5b shape, {args.layers} layers, 1 x {args.seq}: "
                      f"{s[0]:.3f} s -> {s[1]:.3f} s ({s[0] / s[1]:.2f}x faster); page faults per step {faults[0]:.0f} -> "
                      f"{faults[1]:.0f}; system time per step {sys_s[0]:.2f} -> {sys_s[1]:.2f} s")
    print(f"(load average {os.getloadavg()[0]:.2f} at the end)")


if __name__ == "__main__":
    main()
