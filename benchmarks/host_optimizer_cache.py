"""The host optimizer's rate, as the profiler times it and as the engine's steps meet it.

The profiler (``lt.profile``) times the per-unit fused 8-bit update on one layer. In a step the
engine updates every unit in turn, so each unit's master, moments and gradients were last touched
a whole model's traffic earlier; where that traffic exceeds the last-level cache the profiler now
times the update with its buffers pushed out of the caches (``profiler._cache_evictor``). This
prints, in ms per million parameters (medians; the warm and cold timings interleaved):

  warm      the update timed right after the previous one (its buffers in the caches)
  cold      the same with the caches overwritten first (what the profiler does for this model)
  engine    layer 0's update inside steps of the streaming engine (its timeline's optimizer
            interval): the one the step's tail waits for with nothing else running (the later
            layers' updates run beside the forward's compute on the same cores, so their
            intervals measure the sharing, not the update)

    python benchmarks/host_optimizer_cache.py [--layers 8 --hidden 1024 --rounds 5 --steps 8]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
from jax.sharding import SingleDeviceSharding

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import _last_level_cache_bytes, _measure_host_optimizer, profile
from lazytrain_jax.schedule.plan import Plan
from streaming_cpu import add_model_args, make_batch, make_model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    model = make_model(args)
    cfg = model.config
    layer_m = cfg.layer_num_params(cfg.layer_kinds[0]) / 1e6
    host = SingleDeviceSharding(jax.devices("cpu")[0], memory_kind="pinned_host")
    print(f"model: {args.layers} layers, {model.num_params() / 1e6:.1f} M params ({layer_m:.1f} M per layer), "
          f"last-level cache {_last_level_cache_bytes() / 2**20:.0f} MiB")
    ms = {"warm": [], "cold": []}
    for _ in range(args.rounds):
        for name, cold in (("warm", False), ("cold", True)):
            ms[name].append(1e9 / _measure_host_optimizer(cfg, host, "float32", 3, cold=cold))
    costs, hw = profile(model, args.batch, args.seq, stream_dtype="float32", device_memory=1e12, repeats=3)
    plan = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (args.layers + 1),
                       keep_residuals=[True] * args.layers, optimizer_mode="pipelined")
    batch = make_batch(model, args)
    tx = lt.optim.adamw_8bit(1e-5, weight_decay=0.01, max_grad_norm=1.0)
    ms["engine"] = []
    with lt.StreamingEngine(model, plan, tx, stream_dtype="float32") as eng:
        eng.step(batch)
        for _ in range(args.steps):
            eng.step(batch)
            for iv in eng.timeline.to_dicts():   # layer 0's update (unit 1), in the step's tail
                if iv.get("channel") == "optimizer" and iv["name"] == "opt1" and iv["start_s"] >= 0:
                    ms["engine"].append(1e3 * (iv["end_s"] - iv["start_s"]) / (costs.num_params[1] / 1e6))
        eng.flush()
    print(f"\n{'update':<8} {'ms per M params (median)':>25}  {'range':>14}  n")
    for name, v in ms.items():
        print(f"{name:<8} {np.median(v):>25.2f}  {min(v):>6.2f}-{max(v):<6.2f}  {len(v)}")
    print(f"the profiler's rate for this model: {1e9 / hw.host_opt_rate:.2f} ms per M params")


if __name__ == "__main__":
    main()
