"""Planner benchmark: solve time vs layers, the paper's 27B/H800 setting, RTX 3090 max batch, bounds.

Run: python benchmarks/planner.py
"""

import statistics
import time

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import heuristics, milp
from lazytrain_jax.schedule.api import best_heuristic, plan_fixed_batch
from lazytrain_jax.schedule.bounds import lower_bound
from lazytrain_jax.schedule.costs import analytic_costs
from lazytrain_jax.schedule.hardware import Hardware

PAPER = {"qwen2.5-3b": (192, 7933, 9801), "qwen2.5-7b": (144, 3842, 4758), "qwen2.5-14b": (96, 2047, 2528),
         "dense-27b": (72, 1075.8, 1361)}


def h800(**kw):
    return Hardware.preset("h800", device_memory=70e9, host_memory=15e9, nvme_memory=32e9, h2d_bw=12e9, d2h_bw=12e9,
                           nvme_read_bw=2.83e9, nvme_write_bw=3.35e9, **kw)


def costs(name, hw, batch, m=1, **overrides):
    return analytic_costs(get_preset(name, **overrides), batch_size=batch, seq_len=1024, device_flops=hw.device_flops,
                          num_micro_batches=m, efficiency_half_tokens=hw.efficiency_half_tokens)


def part_a():
    print("(a) MILP solve time and gap vs layers (dense-27b shape, h800, batch 72, 8 micro-batches), 3 repeats")
    hw = h800()
    for L in (28, 48, 64, 96, 128):
        c = costs("dense-27b", hw, 72, 8, num_layers=L)
        times, gaps = [], []
        for _ in range(3):
            t = time.perf_counter()
            p = milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-3, time_limit_s=30)
            times.append(time.perf_counter() - t)
            gaps.append(p.gap if p else float("nan"))
        print(f"  L={L:4d}  median {statistics.median(times):6.2f} s  max {max(times):6.2f} s  gap {max(gaps):.2e}")


def calibrate_flops(name, batch, target_tok_s):
    lo, hi = 1e13, 5e15
    for _ in range(50):
        mid = (lo * hi) ** 0.5
        hw = h800(device_flops=mid)
        tok = heuristics.megatrain(costs(name, hw, batch), hw, 4).tokens_per_s
        lo, hi = (mid, hi) if tok < target_tok_s else (lo, mid)
    return (lo * hi) ** 0.5


def part_b():
    print("(b) paper setting on h800 (70 GB cap, 15 GB host, 32 GB NVMe, PCIe 12/12, NVMe 2.83/3.35 GB/s)")
    flops = calibrate_flops("dense-27b", 72, 1075.8)
    print(f"  calibrated device_flops = {flops / 1e12:.1f} TFLOP/s on the MegaTrain 27B row (megatrain(K=4),"
          f" micro-batches 1); host_opt_rate kept at the default 1e9 params/s (not calibrated)")
    hw = h800(device_flops=flops)
    print(f"  {'model':12s} {'batch':>5s} {'MT pred':>9s} {'MT paper':>9s} {'MILP pred':>9s} {'LT paper':>9s} "
          f"{'MILP TFLOPS':>11s} {'MILP/LB':>7s} {'m':>3s}")
    for name, (batch, mt_paper, lt_paper) in PAPER.items():
        c = costs(name, hw, batch)
        mt = heuristics.megatrain(c, hw, 4)
        p = plan_fixed_batch(get_preset(name), hw, batch, 1024, time_limit_s=20, rel_gap=1e-3)
        lb = lower_bound(p.costs, hw)["total"]
        print(f"  {name:12s} {batch:5d} {mt.tokens_per_s:9.1f} {mt_paper:9.1f} {p.tokens_per_s:9.1f} {lt_paper:9.1f} "
              f"{p.tflops:11.1f} {p.predicted_step_time_s / lb:7.3f} {p.num_micro_batches:3d}"
              f"   (MT fits: {mt.fits()}, MT peak {mt.predicted_peak_device_bytes / 1e9:.1f} GB)")


def max_fitting(name, hw, make):
    b, best = 1, 0
    while b <= 64:
        if make(costs(name, hw, b), hw) is None:
            break
        best, b = b, b + 1
    return best


def part_c():
    print("(c) rtx3090 (24 GiB, 64 GB host), seq 1024, micro-batches 1: largest feasible batch")
    hw = Hardware.preset("rtx3090")
    for name, paper in zip(PAPER, ("7->8", "5->6", "3->4", "1->2")):
        mt = max_fitting(name, hw, lambda c, h: (p if (p := heuristics.megatrain(c, h, 4)).fits() else None))
        lt = max_fitting(name, hw, lambda c, h: milp.solve(c, h, rel_gap=1e-2, time_limit_s=10))
        c = costs(name, hw, max(lt, 1))
        p = milp.solve(c, hw, rel_gap=1e-3, time_limit_s=10)
        ratio = p.predicted_step_time_s / lower_bound(c, hw)["total"] if p else float("nan")
        print(f"  {name:12s} megatrain(K=4) {mt:3d}  MILP {lt:3d}   (paper MegaTrain->LazyTrain {paper});"
              f" MILP at its max batch: step/LB {ratio:.3f}")


if __name__ == "__main__":
    part_a()
    part_b()
    part_c()
