"""Plan the 27B shape (64 layers, hidden 5120) for an H800 and an RTX 3090, without any GPU.

The planner is pure Python (python-mip / CBC): this runs on a laptop and prints each plan's table
(per-layer boundary tier, recompute, kept residuals, resident tail, transfers) and predicted step.

    python examples/plan_27b.py                      # batch 72 x 1024 on H800, batch 8 x 1024 on RTX 3090
"""

from __future__ import annotations

import argparse
import sys

import lazytrain_jax as lt


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="dense-27b", help="preset (dense-27b: the 27B shape, all layers dense)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--h800-batch", type=int, default=72, help="the paper's H800 setting")
    p.add_argument("--rtx3090-batch", type=int, default=8)
    p.add_argument("--time-limit", type=float, default=30.0, help="CBC seconds per MILP")
    args = p.parse_args(argv)
    cfg = lt.get_preset(args.model)
    print(f"{args.model}: {cfg.num_params() / 1e9:.1f}B parameters, {cfg.num_layers} layers, hidden {cfg.hidden_size}")
    for hardware, batch in (("h800", args.h800_batch), ("rtx3090", args.rtx3090_batch)):
        plan = lt.plan(cfg, hardware, batch_size=batch, seq_len=args.seq_len, time_limit_s=args.time_limit)
        print(f"\n=== {hardware}: batch {batch} x {args.seq_len} ===")
        print(plan.explain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
