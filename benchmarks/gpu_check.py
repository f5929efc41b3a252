"""GPU check of the streaming engine (run by benchmarks/gpu_check.sh; finishes in minutes).

On the first accelerator: a random model of the given preset (default a Qwen2.5-3B shape) in bf16,
  1. streamed step (every boundary on device, pipelined 8-bit host update) vs the resident step,
     TFLOPS by the 6 * params * tokens / step-time convention, peak device memory vs the plan;
  2. under a device budget (default 24 GB): the MILP plan vs megatrain(K=4), measured, with stalls;
  3. adamw_8bit vs optax adamw (fp32 state) as a plain optax update on the accelerator.

    python benchmarks/gpu_check.py --preset qwen2.5-3b --batch 4 --seq 1024 --budget-gb 24
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import median_seconds, profile
from lazytrain_jax.schedule import heuristics
from lazytrain_jax.schedule.api import plan_for_costs
from lazytrain_jax.schedule.plan import Plan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-3b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dev = jax.devices()[0]
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}")
    t0 = time.perf_counter()
    model = lt.init_model(args.preset, seed=0, dtype="bfloat16")
    n = model.num_params()
    tokens = args.batch * args.seq
    print(f"model {args.preset}: {n / 1e9:.2f} B params, batch {args.batch} x {args.seq} (init {time.perf_counter() - t0:.0f} s)")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (args.batch, args.seq)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}
    stats = dev.memory_stats() or {}
    limit = stats.get("bytes_limit", 80e9)
    costs, hw = profile(model, args.batch, args.seq, stream_dtype="bfloat16", device_memory=limit,
                        repeats=args.repeats)
    print(f"profiled: h2d {hw.h2d_bw / 1e9:.1f} GB/s, d2h {hw.d2h_bw / 1e9:.1f} GB/s, host optimizer "
          f"{hw.host_opt_rate / 1e9:.2f} G params/s, achieved {hw.device_flops / 1e12:.0f} TFLOP/s (layer fwd)")
    L = model.config.num_layers
    tx = lt.optim.adamw_8bit(1e-5, weight_decay=0.01, max_grad_norm=1.0)
    rows = []
    all_dev = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (L + 1),
                          keep_residuals=[True] * L, optimizer_mode="pipelined")
    with lt.StreamingEngine(model, all_dev, tx) as eng:
        t = median_seconds(lambda: (eng.step(batch), eng.flush()), args.repeats)
        m = eng.last_metrics
    peak = (dev.memory_stats() or {}).get("peak_bytes_in_use", float("nan"))
    rows.append(("streamed all-device", t, m["peak_device_bytes"], all_dev.predicted_peak_device_bytes, m["stall_s"]))
    lag = lt.loss_and_grad
    t_res = median_seconds(lambda: jax.block_until_ready(lag(model, batch)), args.repeats)
    rows.append(("resident loss_and_grad (no update)", t_res, float("nan"), float("nan"), 0.0))
    hw_b = hw.replace(device_memory=args.budget_gb * 1e9, device_margin=min(1e9, 0.05 * args.budget_gb * 1e9))
    for name, plan in (("MILP", plan_for_costs(costs, hw_b)), ("megatrain(K=4)", heuristics.megatrain(costs, hw_b, K=4))):
        if plan is None or not plan.fits():
            print(f"{name}: no plan fits {args.budget_gb} GB")
            continue
        with lt.StreamingEngine(model, plan, tx) as eng:
            t = median_seconds(lambda: (eng.step(batch), eng.flush()), args.repeats)
            m = eng.last_metrics
        rows.append((f"{name} under {args.budget_gb:.0f} GB (pred {plan.predicted_step_time_s:.2f} s)", t,
                     m["peak_device_bytes"], plan.predicted_peak_device_bytes, m["stall_s"]))
    print(f"\n{'run':<44} {'step s':>8} {'TFLOPS':>7} {'held GB':>8} {'plan GB':>8} {'stall s':>8}")
    for name, t, held, pred, stall in rows:
        print(f"{name:<44} {t:>8.3f} {6 * n * tokens / t / 1e12:>7.1f} {held / 1e9:>8.2f} {pred / 1e9:>8.2f} {stall:>8.3f}")
    print(f"device peak_bytes_in_use (whole run): {peak / 1e9:.2f} GB")
    # 3. the 8-bit transform on the accelerator vs optax fp32
    params = {"w": jnp.zeros((4096, 24414), jnp.float32)}
    grads = {"w": jnp.full((4096, 24414), 1e-3, jnp.float32)}
    for name, t in (("optax adamw (fp32 state)", optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5))),
                    ("lt.optim.adamw_8bit", lt.optim.adamw_8bit(1e-5, max_grad_norm=1.0))):
        state = t.init(params)
        step = jax.jit(lambda p, s, g, t=t: (lambda u, s2: (optax.apply_updates(p, u), s2))(*t.update(g, s, p)),
                       donate_argnums=(0, 1))
        holder = {"p": params, "s": state}

        def run():
            holder["p"], holder["s"] = step(holder["p"], holder["s"], grads)
            jax.block_until_ready(holder["p"])

        print(f"{name:<28} {median_seconds(run, 5) * 1e3:8.2f} ms per 100M-param update")
        params = holder["p"]


if __name__ == "__main__":
    main()
