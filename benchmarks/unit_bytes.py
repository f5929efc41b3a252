"""Device bytes of one decoder layer and of the head: the real units (model/unit_bytes.py) beside the
planner's formulas (schedule/costs.py).

Run: python benchmarks/unit_bytes.py [--workspace]   (--workspace compiles fp32 backwards: ~1 min)
"""

import argparse

from lazytrain_jax.model import unit_bytes
from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule.costs import analytic_costs

PRESETS = ("qwen2.5-0.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", "dense-27b")
MB = 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workspace", action="store_true", help="also compile fp32 backwards for their workspace (~1 min)")
    args = ap.parse_args()
    print("residual / boundary / head-workspace bytes, micro-batch 1, S=1024: eval_shape of the units vs costs.py")
    print(f"  {'model':13s} {'stream':8s} {'residual MB':>11s} {'predicted':>9s} {'boundary MB':>11s} "
          f"{'predicted':>9s} {'head ws GB':>10s} {'predicted':>9s} {'workspace pred MB':>17s}")
    for name in PRESETS:
        cfg = get_preset(name)
        for stream in ("bfloat16", "float32"):
            c = analytic_costs(cfg, batch_size=1, seq_len=1024, device_flops=1e14, stream_dtype=stream)
            m = unit_bytes.layer_bytes(cfg, "decoder", micro_batch_size=1, seq_len=1024, stream_dtype=stream,
                                       workspace="none")
            head = unit_bytes.head_workspace_bytes(cfg, micro_batch_size=1, seq_len=1024, stream_dtype=stream)
            print(f"  {name:13s} {stream:8s} {m.residual / MB:11.2f} {c.residual_bytes[0] / MB:9.2f} "
                  f"{m.boundary / MB:11.2f} {c.boundary_bytes[1] / MB:9.2f} {head / 1e9:10.3f} "
                  f"{c.head_workspace_bytes / 1e9:9.3f} {c.workspace_bytes[0] / MB:17.1f}")
    if args.workspace:
        print("backward workspace, fp32 stream: XLA compiled temp bytes (max of recompute / from-residuals backward)")
        for name, micro, seq in (("qwen2.5-0.5b", 1, 256), ("qwen2.5-0.5b", 1, 1024), ("qwen2.5-0.5b", 2, 1024),
                                 ("qwen3-8b", 1, 128), ("qwen3-8b", 1, 1024)):
            m = unit_bytes.layer_bytes(get_preset(name), "decoder", micro_batch_size=micro, seq_len=seq,
                                       stream_dtype="float32")
            pred = analytic_costs(get_preset(name), batch_size=micro, seq_len=seq, device_flops=1e14,
                                  stream_dtype="float32").workspace_bytes[0]
            print(f"  {name:13s} B={micro} S={seq:5d} measured {m.workspace / MB:8.1f} MB ({m.workspace_source}) "
                  f"predicted {pred / MB:8.1f} MB  measured/predicted {m.workspace / pred:.2f}")


if __name__ == "__main__":
    main()
