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
import dataclasses
import gc
import os
import time
import traceback

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
    ap.add_argument("--trace-dir", default="", help="write each streamed run's Chrome trace here")
    args = ap.parse_args()
    if args.optimizer_only:
        optimizer_check(args.opt_params, args.repeats + 2)
        return
    dev = jax.devices()[0]
    from lazytrain_jax.host_alloc import huge_pages_on
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}; host huge pages for large blocks: "
          f"{'on' if huge_pages_on() else 'off'}")
    t0 = time.perf_counter()
    model = lt.init_model(args.preset, seed=0, dtype="bfloat16")
    n = model.num_params()
    tokens = args.batch * args.seq
    flops = 6 * n * tokens
    print(f"model {args.preset}: {n / 1e9:.2f} B params, batch {args.batch} x {args.seq} "
          f"(init {time.perf_counter() - t0:.0f} s)")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (args.batch, args.seq)).astype(np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}
    limit = device_stat(dev, "bytes_limit", 80e9)
    t0 = time.perf_counter()
    costs, hw = profile(model, args.batch, args.seq, stream_dtype="bfloat16", device_memory=limit,
                        repeats=args.repeats)
    print(f"profiled in {time.perf_counter() - t0:.0f} s: h2d {hw.h2d_bw / 1e9:.1f} GB/s, d2h {hw.d2h_bw / 1e9:.1f} GB/s, "
          f"host optimizer {hw.host_opt_rate / 1e9:.2f} G params/s, achieved {hw.device_flops / 1e12:.0f} TFLOP/s "
          f"(layer fwd); device peak_bytes_in_use so far {device_stat(dev, 'peak_bytes_in_use') / 1e9:.2f} GB",
          flush=True)
    from lazytrain_jax.executor import links
    staging = links.staging(dev)
    way = (", ".join(f"{d} {p}" for d, p in links.to_host_paths(staging, links.host_store(dev),
                                                                 (jnp.bfloat16, np.float32)).items())
           if staging is not None else "direct (no staging)")
    print(f"gradients to the host store by: {way}; the embedding's update counts as "
          f"{costs.optimizer_params[0] / 1e6:.0f}M of its {costs.num_params[0] / 1e6:.0f}M parameters "
          f"(fp32 Adam state, timed apart)", flush=True)
    L = model.config.num_layers
    tx = lt.optim.adamw_8bit(1e-5, weight_decay=0.01, max_grad_norm=1.0)
    all_dev = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (L + 1),
                          keep_residuals=[True] * L, optimizer_mode="pipelined")
    hw_b = hw.replace(device_memory=args.budget_gb * 1e9, device_margin=min(1e9, 0.05 * args.budget_gb * 1e9))
    # the budget plans first, then the all-device one: memory_stats' peak only rises, so each row's
    # device peak says something where it rises above the rows before it
    runs = []
    for name, make in (("MILP", lambda: plan_for_costs(costs, hw_b)),
                       ("megatrain(K=4)", lambda: heuristics.megatrain(costs, hw_b, K=4))):
        t0 = time.perf_counter()
        plan = make()
        if plan is None or not plan.fits():
            print(f"{name}: no plan fits {args.budget_gb} GB")
            continue
        print(f"{name} plan ({time.perf_counter() - t0:.1f} s): {describe(plan)}", flush=True)
        runs.append((f"{name} under {args.budget_gb:g} GB", plan))
    runs.append(("streamed all-device", all_dev))
    rows = []
    for name, plan in runs:
        try:
            rows.append(run_streamed(name, plan, model, tx, batch, dev, args))
        except Exception as e:  # one failing plan must not hide the others' figures
            traceback.print_exc()
            print(f"{name}: FAILED ({type(e).__name__}: {e})", flush=True)
    base = device_stat(dev, "bytes_in_use")
    res_model = dataclasses.replace(model, params=jax.device_put(model.params, dev))
    lag = lt.loss_and_grad
    t_res = median_seconds(lambda: jax.block_until_ready(lag(res_model, batch)), args.repeats)
    res_peak = device_stat(dev, "peak_bytes_in_use")
    del res_model
    gc.collect()
    rows.append(dict(name="resident loss_and_grad (no update)", steady=t_res, fb=t_res, pred=float("nan"),
                     held=float("nan"), plan=float("nan"), live=float("nan"), base=base, peak=res_peak, stall=0.0))
    print(f"\n{'run':<36} {'s/step':>7} {'fwd+bwd':>7} {'pred s':>7} {'TFLOPS':>7} {'held GB':>8} {'plan GB':>8} "
          f"{'held/plan':>9} {'live GB':>8} {'dev0 GB':>8} {'devpk GB':>8} {'stall s':>8}")
    for r in rows:
        print(f"{r['name']:<36} {r['steady']:>7.3f} {r['fb']:>7.3f} {r['pred']:>7.3f} {flops / r['steady'] / 1e12:>7.1f} "
              f"{r['held'] / 1e9:>8.3f} {r['plan'] / 1e9:>8.3f} {r['held'] / r['plan']:>9.2f} {r['live'] / 1e9:>8.3f} "
              f"{r['base'] / 1e9:>8.3f} {r['peak'] / 1e9:>8.3f} {r['stall']:>8.3f}")
    print("s/step: steady state, (repeats consecutive steps + the last update) / repeats, update included; "
          "fwd+bwd: the engine's median forward-backward time (a pipelined step waits there for the update "
          "its uploads need); TFLOPS: 6 * params * tokens / (s/step); held: the engine's ledger peak; live: "
          "jax.live_arrays() on the device sampled at every item boundary (one audited step); dev0: "
          "memory_stats bytes_in_use before the run; devpk: memory_stats peak_bytes_in_use after it "
          "(monotonic over the process: a row raised it only if it exceeds the rows above)")
    optimizer_check(args.opt_params, args.repeats + 2)


def device_stat(dev, key: str, default: float = float("nan")) -> float:
    return float((dev.memory_stats() or {}).get(key, default))


def run_streamed(name: str, plan: Plan, model, tx, batch, dev, args) -> dict:
    """Steady-state step of ``plan`` (``repeats`` consecutive steps, then the last update), per-phase
    measured against predicted windows, one audited step (live device arrays), stalls per channel."""
    from streaming_cpu import PHASES, phase_sums
    from lazytrain_jax.schedule import timing
    base = device_stat(dev, "bytes_in_use")
    t0 = time.perf_counter()
    with lt.StreamingEngine(model, plan, tx) as eng:
        eng.step(batch)
        eng.flush()
        print(f"{name}: engine built and first step in {time.perf_counter() - t0:.0f} s", flush=True)
        fb, windows = [], []
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            m = eng.step(batch)
            fb.append(m["step_time_s"])
            windows.append([(n, t1 - s0) for n, s0, t1 in eng.timeline.item_windows])
        eng.flush()
        steady = (time.perf_counter() - t0) / args.repeats
        held, stalls, busy = m["peak_device_bytes"], m["stalls"], m["busy"]
        if args.trace_dir:
            eng.save_trace(os.path.join(args.trace_dir, name.split()[0].replace("(", "").replace(")", "").replace("=", "")
                                        + ".trace.json"))
        eng.audit_memory = True
        eng.step(batch)
        eng.flush()
        live = eng.last_metrics["live_peak_device_bytes"]
        items = eng.items
    peak = device_stat(dev, "peak_bytes_in_use")
    pred = phase_sums([(w.item.name, w.time) for w in timing.windows(plan.costs, plan.hardware, plan)], items)
    meas = [phase_sums(w, items) for w in windows]
    print(f"{name}: steady {steady:.3f} s/step, fwd+bwd median {float(np.median(fb)):.3f} s, predicted "
          f"{plan.predicted_step_time_s:.3f} s; loss {m['loss']:.4f}")
    print(f"  {'phase':<10} {'measured s':>11} {'predicted s':>12} {'ratio':>6}")
    for ph in PHASES:
        ms = float(np.median([x[ph] for x in meas]))
        if ms or pred[ph]:
            print(f"  {ph:<10} {ms:>11.4f} {pred[ph]:>12.4f} {ms / max(pred[ph], 1e-12):>6.2f}")
    print("  busy s: " + ", ".join(f"{k} {v:.3f}" for k, v in busy.items())
          + " | stalls s: " + (", ".join(f"{k} {v:.3f}" for k, v in stalls.items()) or "none"), flush=True)
    gc.collect()
    return dict(name=name, steady=steady, fb=float(np.median(fb)), pred=plan.predicted_step_time_s, held=held,
                plan=plan.predicted_peak_device_bytes, live=live, base=base, peak=peak, stall=sum(stalls.values()))


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
    from lazytrain_jax.host_alloc import reexec_with_huge_pages
    reexec_with_huge_pages()  # as the command runs: huge pages for glibc's large host blocks
    main()
