"""GPU check of the streaming engine (run by benchmarks/gpu_check.sh; finishes in minutes).

On the first accelerator: a random model of the given preset (default a Qwen2.5-3B shape) in bf16,
  1. streamed step (every boundary on device, pipelined 8-bit host update) vs the resident step,
     TFLOPS by the 6 * params * tokens / step-time convention, peak device memory vs the plan;
  2. under a device budget (default 24 GB): the MILP plan vs megatrain(K=4), measured, with stalls;
  3. adamw_8bit vs optax adamw (fp32 state) as a plain optax update on the accelerator: the
     compiled 8-bit step is checked for custom calls, float8 types and host transfers first.

    python benchmarks/gpu_check.py --preset qwen2.5-3b --batch 4 --seq 1024 --budget-gb 24
    python benchmarks/gpu_check.py --optimizer-only --opt-params 4000000   # 3. alone (CPU dry run)
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

from streaming_cpu import plan_letters  # benchmarks/, beside this script


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen2.5-3b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--budget-gb", type=float, default=24.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--opt-params", type=int, default=100_000_000, help="params of the optimizer check")
    ap.add_argument("--optimizer-only", action="store_true", help="only the optimizer check (3.)")
    args = ap.parse_args()
    if args.optimizer_only:
        optimizer_check(args.opt_params, args.repeats + 2)
        return
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
        print(f"{name} plan: {describe(plan)}")
        with lt.StreamingEngine(model, plan, tx) as eng:
            t = median_seconds(lambda: (eng.step(batch), eng.flush()), args.repeats)
            m = eng.last_metrics
        rows.append((f"{name} under {args.budget_gb:g} GB (pred {plan.predicted_step_time_s:.2f} s)", t,
                     m["peak_device_bytes"], plan.predicted_peak_device_bytes, m["stall_s"]))
    print(f"\n{'run':<44} {'step s':>8} {'TFLOPS':>7} {'held GB':>8} {'plan GB':>8} {'held/plan':>9} {'stall s':>8}")
    for name, t, held, pred, stall in rows:
        print(f"{name:<44} {t:>8.3f} {6 * n * tokens / t / 1e12:>7.1f} {held / 1e9:>8.3f} {pred / 1e9:>8.3f} "
              f"{held / pred:>9.2f} {stall:>8.3f}")
    print(f"device peak_bytes_in_use (whole run): {peak / 1e9:.2f} GB")
    optimizer_check(args.opt_params, args.repeats + 2)


def describe(plan: Plan) -> str:
    """Boundary tiers and residuals as letters (``streaming_cpu.plan_letters``), tail, depths, mode."""
    tiers, residuals = plan_letters(plan)
    kept = sum(bool(k) for k in plan.keep_residuals)
    return (f"{tiers}, residuals kept {kept}/{plan.num_layers} ({residuals}), resident tail {plan.resident_tail}, "
            f"prefetch depths ({plan.weight_prefetch_depth},{plan.act_prefetch_depth}), {plan.optimizer_mode} update")


def optimizer_check(num_params: int, repeats: int) -> None:
    """adamw_8bit vs optax fp32 AdamW (+ clip) as a user's jitted update on the default device.

    Checks the compiled 8-bit step first: no custom call (the CPU kernel is chosen only where the
    step is lowered for the CPU), no float8 type (dynamic8 codes are int8/uint8), no transfer to
    host memory. Then times both, interleaved, medians of ``repeats``.
    """
    dev = jax.devices()[0]
    cols = 4096
    shape = (max(1, num_params // cols), cols)
    on_cpu = dev.platform == "cpu"
    txs = {"optax adamw + clip (fp32 state)": optax.chain(optax.clip_by_global_norm(1.0),
                                                          optax.adamw(1e-5, weight_decay=0.01)),
           "lt.optim.adamw_8bit (impl='auto')": lt.optim.adamw_8bit(1e-5, max_grad_norm=1.0)}
    grads = {"w": jnp.full(shape, 1e-3, jnp.float32)}
    runs = {}
    for name, tx in txs.items():
        def step(p, s, g, tx=tx):
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s

        params = {"w": jnp.zeros(shape, jnp.float32)}
        holder = {"p": params, "s": tx.init(params)}
        jitted = jax.jit(step, donate_argnums=(0, 1))
        hlo = jitted.lower(holder["p"], holder["s"], grads).compile().as_text()
        if "8bit" in name:
            found = {"custom-call": "custom-call(" in hlo, "float8": "f8e4m3" in hlo.lower(),
                     "host memory": "S(5)" in hlo or "MoveToHost" in hlo}
            bad = [k for k, v in found.items() if v and not (on_cpu and k == "custom-call")]
            assert not bad, f"adamw_8bit on {dev.platform} compiled with {bad}"
            print(f"adamw_8bit compiled for {dev.platform}: custom call "
                  f"{'yes (the native CPU kernel)' if found['custom-call'] else 'none'}, no float8, "
                  "no host transfer")

        def run(jitted=jitted, holder=holder):
            holder["p"], holder["s"] = jitted(holder["p"], holder["s"], grads)
            jax.block_until_ready(holder["p"])

        run()
        runs[name] = run
    times = {name: [] for name in runs}
    for _ in range(repeats):  # interleaved: noise hits both alike
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    base = float(np.median(times[next(iter(times))]))
    n = shape[0] * shape[1]
    print(f"\noptimizer update on {dev.device_kind} ({dev.platform}), {n / 1e6:.0f}M params, "
          f"medians of {repeats}, interleaved")
    for name, ts in times.items():
        t = float(np.median(ts))
        print(f"{name:<36} {t * 1e3:9.2f} ms  {t / base:5.2f}x  {n / t / 1e9:6.2f} G params/s")


if __name__ == "__main__":
    main()
