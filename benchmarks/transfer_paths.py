"""Host<->device copy rates by path (numpy, CPU-backend array, the device's pinned_host memory kind).

    python benchmarks/transfer_paths.py --mb 256 --pieces 8 --repeats 5

Prints GB/s per path (median of repeats; downloads from fresh arrays), whole arrays and a layer-like list
of pieces, the paths of lazytrain_jax/executor/links.py among them, and with
--threads N the same list split across N threads. Torch's pinned copy is printed when torch with
CUDA is importable, as the machine's reference.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import time

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

from lazytrain_jax.executor import links


def rate(fn, nbytes, repeats):
    """GB/s of ``fn()`` (:func:`rate_fresh` with nothing made per repeat)."""
    return rate_fresh(lambda: None, lambda _: fn(), nbytes, repeats)


def rate_fresh(make, fn, nbytes, repeats):
    """GB/s of ``fn(make())`` with only ``fn`` timed (a fresh input each repeat), after one warm-up."""
    fn(make())
    ts = []
    for _ in range(repeats):
        x = make()
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return nbytes / float(np.median(ts)) / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--pieces", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=4)
    args = ap.parse_args()
    dev = jax.devices()[0]
    cpu = jax.devices("cpu")[0]
    kinds = [m.kind for m in dev.addressable_memories()] if hasattr(dev, "addressable_memories") else []
    n = args.mb * (1 << 20) // 2
    a = np.random.default_rng(0).standard_normal(n).astype(jax.numpy.bfloat16)
    pieces = np.array_split(a, args.pieces)
    pieces = [np.ascontiguousarray(p) for p in pieces]
    nbytes = a.nbytes
    on_dev = SingleDeviceSharding(dev, memory_kind="device") if "device" in kinds else SingleDeviceSharding(dev)
    print(f"device {dev.device_kind} ({dev.platform}), memory kinds {kinds}, {nbytes / 1e6:.0f} MB, "
          f"{args.pieces} pieces, medians of {args.repeats}")
    srcs = {"numpy": (a, pieces)}
    srcs["cpu-backend array"] = (jax.device_put(a, cpu), [jax.device_put(p, cpu) for p in pieces])
    if "pinned_host" in kinds:
        pin = SingleDeviceSharding(dev, memory_kind="pinned_host")
        srcs["device pinned_host"] = (jax.device_put(a, pin), [jax.device_put(p, pin) for p in pieces])
        jax.block_until_ready(srcs["device pinned_host"])
    jax.block_until_ready(srcs["cpu-backend array"])
    pool = cf.ThreadPoolExecutor(args.threads)
    print(f"{'H2D from':<22} {'whole GB/s':>10} {'pieces GB/s':>11} {'threads GB/s':>12}")
    for name, (whole, parts) in srcs.items():
        try:
            w = rate(lambda: jax.block_until_ready(jax.device_put(whole, on_dev)), nbytes, args.repeats)
            p = rate(lambda: jax.block_until_ready([jax.device_put(x, on_dev) for x in parts]), nbytes, args.repeats)
            t = rate(lambda: jax.block_until_ready(list(pool.map(lambda x: jax.device_put(x, on_dev), parts))),
                     nbytes, args.repeats)
            print(f"{name:<22} {w:>10.2f} {p:>11.2f} {t:>12.2f}", flush=True)
        except Exception as e:  # noqa: BLE001 - a path this backend lacks
            print(f"{name:<22} failed: {type(e).__name__}: {str(e)[:120]}")
    # D2H from fresh device arrays each time: a jax.Array caches its numpy value, so copying the
    # same array twice would time the cache
    def fresh():
        return jax.block_until_ready(jax.device_put(a, on_dev)), jax.block_until_ready([jax.device_put(x, on_dev) for x in pieces])

    dsts = {"numpy (np.asarray)": lambda x: np.asarray(x), "cpu-backend array": lambda x: jax.device_put(x, cpu)}
    if "pinned_host" in kinds:
        dsts["device pinned_host"] = lambda x: jax.device_put(x, pin)
    staging = links.staging(dev)
    if staging is not None:
        host = links.host_store(dev)
        for name, path in links.TO_HOST_PATHS.items():
            dsts[f"host store via {name}"] = lambda x, path=path: path(x, staging, host)
    print(f"{'D2H to (fresh arrays)':<30} {'whole GB/s':>10} {'pieces GB/s':>11} {'threads GB/s':>12}")
    for name, f in dsts.items():
        try:
            w = rate_fresh(lambda: fresh()[0], lambda d: jax.block_until_ready(f(d)), nbytes, args.repeats)
            p = rate_fresh(lambda: fresh()[1], lambda d: jax.block_until_ready([f(x) for x in d]), nbytes, args.repeats)
            t = rate_fresh(lambda: fresh()[1], lambda d: jax.block_until_ready(list(pool.map(f, d))), nbytes,
                           args.repeats)
            print(f"{name:<30} {w:>10.2f} {p:>11.2f} {t:>12.2f}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{name:<30} failed: {type(e).__name__}: {str(e)[:120]}")
    if staging is not None:
        chosen = links.to_host_paths(staging, links.host_store(dev), (jax.numpy.bfloat16, np.float32))
        print(f"links.to_host_path chooses: {chosen}")
    if "pinned_host" in kinds and dev.platform != "cpu":
        cw = srcs["cpu-backend array"][0]
        w = rate(lambda: jax.block_until_ready(jax.device_put(cw, pin)), nbytes, args.repeats)
        w2 = rate(lambda: jax.block_until_ready(jax.device_put(a, pin)), nbytes, args.repeats)
        w3 = rate_fresh(lambda: jax.block_until_ready(jax.device_put(a, pin)),
                        lambda x: jax.block_until_ready(jax.device_put(x, cpu)), nbytes, args.repeats)
        print(f"host copies: cpu-backend -> pinned_host {w:.2f} GB/s, numpy -> pinned_host {w2:.2f} GB/s, "
              f"pinned_host -> cpu-backend {w3:.2f} GB/s (fresh arrays)")
    w = rate(lambda: np.copyto(np.empty_like(a), a), nbytes, args.repeats)
    print(f"numpy memcpy (fresh destination) {w:.2f} GB/s")
    try:
        import torch
        if torch.cuda.is_available():
            t = torch.from_numpy(a.view(np.int16)).pin_memory()
            g = torch.empty_like(t, device="cuda")
            def h2d():
                g.copy_(t, non_blocking=True); torch.cuda.synchronize()
            def d2h():
                t.copy_(g, non_blocking=True); torch.cuda.synchronize()
            u = torch.from_numpy(a.view(np.int16))
            def h2d_unpinned():
                g.copy_(u); torch.cuda.synchronize()
            print(f"torch: pinned H2D {rate(h2d, nbytes, args.repeats):.2f} GB/s, pinned D2H {rate(d2h, nbytes, args.repeats):.2f} GB/s, "
                  f"unpinned H2D {rate(h2d_unpinned, nbytes, args.repeats):.2f} GB/s")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
