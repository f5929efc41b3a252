"""A process's profiles one after another: does the first plan for the machine the later ones see?

    python benchmarks/profile_repeat.py [--profiles 3 --layers 8 --hidden 1024 --batch 2 --seq 256]
    LAZYTRAIN_KEEP_FREED_HOST_BLOCKS=0 python benchmarks/profile_repeat.py --warmup 1   # as before both

Profiles ``streaming_cpu.py``'s model (fp32, the default backend) ``--profiles`` times in one process
(``cached=False`` after the first), and under each profile predicts the two plans of
``streaming_cpu.py`` (b) at its tight budget (``megatrain(K=4)``'s own peak x 1.02), both planned
from the first profile: per profile, a layer's forward / backward / backward with in-layer
recompute, H2D / D2H and the host optimizer rate, then each plan's predicted step. A first profile
that runs slow (a process's first calls, its allocator not yet grown into its working set) shows
as a first row above the others; ``lt.profile``'s ``PROFILE_WARMUP`` untimed rounds and its host
allocator setting are what keep it in line (benchmarks/RESULTS.md, "A process's first profile").
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from streaming_cpu import add_model_args, make_model

from lazytrain_jax.executor import profiler
from lazytrain_jax.executor.profiler import profile
from lazytrain_jax.host_alloc import keep_host_blocks_once
from lazytrain_jax.schedule import heuristics
from lazytrain_jax.schedule.api import plan_for_costs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--profiles", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="lt.profile's repeats")
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed rounds before each timing (default: profiler.PROFILE_WARMUP)")
    args = ap.parse_args()
    if args.warmup is not None:
        profiler.PROFILE_WARMUP = args.warmup
    model = make_model(args)
    rows = []
    for i in range(args.profiles):
        t = time.perf_counter()
        c, hw = profile(model, args.batch, args.seq, stream_dtype="float32", device_memory=1e12,
                        repeats=args.repeats, cached=False)
        seconds = time.perf_counter() - t
        if i == 0:  # both plans from the first profile
            mega = heuristics.megatrain(c, hw, K=4)
            tight = dataclasses.replace(hw, device_memory=1.02 * mega.predicted_peak_device_bytes)
            plans = {"milp": plan_for_costs(c, tight), "megatrain(K=4)": heuristics.megatrain(c, tight, K=4)}
        hw = dataclasses.replace(hw, device_memory=tight.device_memory)
        steps = [p.repredict(c, hw).predicted_step_time_s for p in plans.values()]
        rows.append((i, seconds, c.fwd_time[1], c.bwd_time[1], c.bwd_recompute_time[1], hw.h2d_bw, hw.d2h_bw,
                     hw.host_opt_rate, *steps))
    print(f"PROFILE_WARMUP {profiler.PROFILE_WARMUP}; host allocator keeps freed blocks: "
          f"{keep_host_blocks_once()}")
    print(f"{'profile':>7} {'s':>5} {'fwd ms':>7} {'bwd ms':>7} {'rc ms':>7} {'H2D GB/s':>9} {'D2H GB/s':>9} "
          f"{'opt Gp/s':>9} " + " ".join(f"{name + ' s':>18}" for name in plans))
    for i, s, f, b, r, up, down, opt, *steps in rows:
        print(f"{i:>7} {s:>5.1f} {f * 1e3:>7.1f} {b * 1e3:>7.1f} {r * 1e3:>7.1f} {up / 1e9:>9.2f} {down / 1e9:>9.2f} "
              f"{opt / 1e9:>9.3f} " + " ".join(f"{x:>18.3f}" for x in steps))


if __name__ == "__main__":
    main()
