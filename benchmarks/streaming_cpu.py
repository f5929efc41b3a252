"""Streaming engine on the CPU backend: measured side by side in one run (medians of repeats).

(a) streamed loss_and_grad with every boundary kept on device / resident ``lt.loss_and_grad``;
    the full streamed step (8-bit pipelined update) / a resident jitted step with optax adamw.
(b) under device budgets that force trade-offs: the MILP plan / ``megatrain(K=4)``, measured (both
    played by this engine; MegaTrain's resident embedding/head is not reproduced). Two budgets:
    megatrain(K=4)'s own predicted peak (x --budget-slack), the tightest at which it runs, and midway
    between that and the peak of the best plan without a memory limit.
(c) the measured step / the prediction of the timing model and the simulator with profiled costs,
    per phase (tail, forward, head, backward).
(d) serial / pipelined optimizer tail, measured.

    python benchmarks/streaming_cpu.py [--layers 8 --hidden 1024 --batch 2 --seq 256 --repeats 3 --c-rounds 5]

fp32 streaming throughout (the CPU has no fast bf16). Numbers on a shared machine are noisy: read
the ratios, each the median over rounds that run the compared variants in turn (interleaved); in
(c) the prediction for each round's step is the mean of the predictions under profiles taken right
before and right after it. On the CPU backend the profiled Hardware has ``host_shares_device``: the
host optimizer runs on the cores the compute uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import interleaved_seconds, profile
from lazytrain_jax.schedule import heuristics, timing
from lazytrain_jax.schedule.api import plan_for_costs
from lazytrain_jax.schedule.plan import Plan
from lazytrain_jax.schedule.simulator import simulate

TIER_CHARS = {"device": "D", "host": "H", "nvme": "N", "drop": "."}
PHASES = ("tail", "forward", "head", "recompute", "backward")


def plan_letters(plan) -> tuple[str, str]:
    """A plan's boundary tiers (D device, H host, N NVMe, . dropped) and per layer its residuals
    (r kept on the device, o kept on the host, . recomputed), as two strings."""
    return ("".join(TIER_CHARS[c] for c in plan.boundary_tiers),
            "".join(("o" if o else "r") if r else "." for r, o in zip(plan.keep_residuals, plan.offload_residuals)))


def make_model(args):
    cfg = lt.get_preset("llama-debug").replace(
        hidden_size=args.hidden, intermediate_size=int(args.hidden * 2.75), num_layers=args.layers,
        layer_kinds=("decoder",) * args.layers, num_heads=args.hidden // 64, num_kv_heads=max(1, args.hidden // 256),
        head_dim=64, vocab_size=args.vocab)
    return lt.init_model(cfg, seed=0)


def make_batch(model, args):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (args.batch, args.seq)).astype(np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}


def phase_sums(names_times, items):
    phase_of = {it.name: it.phase for it in items}
    out = dict.fromkeys(PHASES, 0.0)
    for name, seconds in names_times:
        out[phase_of[name]] += seconds
    return out


def row(name, times, a, b):
    """(name, median A, median B, median of the per-round ratios A/B)."""
    ratios = [x / y for x, y in zip(times[a], times[b])]
    return name, float(np.median(times[a])), float(np.median(times[b])), float(np.median(ratios))


def add_model_args(ap):
    """The model and batch options (``make_model``, ``make_batch``), shared with other benchmarks."""
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--depths", type=int, nargs=2, default=None, metavar=("WEIGHTS", "ACTS"),
                    help="(c) plays the plan at these prefetch depths (predictions recomputed)")
    ap.add_argument("--c-rounds", type=int, default=5,
                    help="(c): rounds of (profile, two steps); the per-phase ratios are medians over them")
    ap.add_argument("--c-plan", choices=("milp", "megatrain"), default="milp",
                    help="the plan (c) measures per phase: the tight budget's MILP plan or megatrain(K=4)")
    ap.add_argument("--budget-slack", type=float, default=1.02,
                    help="device budget for (b): megatrain(K=4)'s predicted peak times this factor")
    args = ap.parse_args()
    model = make_model(args)
    batch = make_batch(model, args)
    print(f"model: {args.layers} layers, hidden {args.hidden}, {model.num_params() / 1e6:.1f} M params, "
          f"batch {args.batch} x {args.seq}, fp32, {jax.devices()[0].platform}, {args.repeats} repeats "
          f"(medians of interleaved rounds); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    costs, hw = profile(model, args.batch, args.seq, stream_dtype="float32", device_memory=1e12, repeats=args.repeats)
    L = model.config.num_layers
    rows = []

    # (a) everything on device vs resident
    all_dev = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (L + 1),
                          keep_residuals=[True] * L, optimizer_mode="pipelined")
    tx8 = lt.optim.adamw_8bit(1e-5, weight_decay=0.01, max_grad_norm=1.0)
    eng = lt.StreamingEngine(model, all_dev, tx8, stream_dtype="float32")
    tx = optax.adamw(1e-5, weight_decay=0.01)
    params = jax.tree.map(lambda x: jnp.array(x, copy=True), model.params)  # its own buffers: donated below
    cfg = model.config

    @functools.partial(jax.jit, donate_argnums=(0, 1))  # params and state updated in place, as a user's step would
    def resident_step(params, state, batch):
        from lazytrain_jax.model.reference import _loss_and_grad_fn
        loss, grads = _loss_and_grad_fn(cfg)(params, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    holder = {"p": params, "s": tx.init(params)}

    def res_step():
        holder["p"], holder["s"] = resident_step(holder["p"], holder["s"], jb)
        return holder["p"]

    def stream_step():
        eng.step(batch)
        eng.flush()

    t = interleaved_seconds({"stream": lambda: eng.loss_and_grad(batch),
                             "resident": lambda: lt.loss_and_grad(model, batch),
                             "stream_step": stream_step, "resident_step": res_step}, args.repeats)
    eng.close()
    del eng, holder, params, jb  # each engine holds fp32 master, stream copy, state and gradients
    gc.collect()
    rows.append(row("(a) loss_and_grad: streamed all-device / resident", t, "stream", "resident"))
    rows.append(row("(a) full step: streamed (8-bit, pipelined) / resident jit (optax adamw)", t, "stream_step",
                    "resident_step"))

    # (b) budgets that force trade-offs: MILP vs megatrain(K=4). The tightest is megatrain(K=4)'s own
    # peak (times --budget-slack); the second lies midway between that and what the best plan without
    # a memory limit needs (still short of it, so trade-offs are still forced)
    mega = heuristics.megatrain(costs, hw, K=4)
    mega_peak = mega.predicted_peak_device_bytes
    free = plan_for_costs(costs, dataclasses.replace(hw, device_memory=1e15))
    budgets = [("tight", args.budget_slack * mega_peak)]
    if free is not None and free.predicted_peak_device_bytes > budgets[0][1]:
        budgets.append(("midway", 0.5 * (budgets[0][1] + free.predicted_peak_device_bytes)))
    milp = None
    for label, budget in budgets:
        hw_b = dataclasses.replace(hw, device_memory=budget)
        plans = {"milp": plan_for_costs(costs, hw_b), "megatrain(K=4)": heuristics.megatrain(costs, hw_b, K=4)}
        if label == "tight":
            milp = plans["milp"]
        engines = {}
        for name, plan in plans.items():
            if plan is None or not plan.fits():
                print(f"(b) {label}: {name}: no plan fits {budget / 1e6:.1f} MB")
                continue
            engines[name] = lt.StreamingEngine(model, plan, tx8, stream_dtype="float32")
        t = interleaved_seconds({name: (lambda e=e: (e.step(batch), e.flush())[1]) for name, e in engines.items()},
                                args.repeats)
        for name, e in engines.items():
            plan = e.plan
            tiers, residuals = plan_letters(plan)
            print(f"(b) {label} {budget / 1e6:.1f} MB: {name}: tiers {tiers} residuals {residuals}"
                  f" mode {plan.optimizer_mode} predicted {plan.predicted_step_time_s:.3f} s measured "
                  f"{np.median(t[name]):.3f} s; peak predicted {plan.predicted_peak_device_bytes / 1e6:.1f} MB, "
                  f"engine-held {e.last_metrics['peak_device_bytes'] / 1e6:.1f} MB")
            e.close()
        if len(engines) == 2 and free is not None:
            rows.append(row(f"(b) {label} budget: megatrain(K=4) / MILP (predicted "
                            f"{plans['megatrain(K=4)'].predicted_step_time_s / plans['milp'].predicted_step_time_s:.2f})",
                            t, "megatrain(K=4)", "milp"))
        engines.clear()
        e = None
        gc.collect()
    # what any plan could gain over megatrain(K=4) on this profile, memory unlimited: the ceiling of (b)
    if free is not None:
        print(f"(b) ceiling on this profile: megatrain(K=4) predicted {mega.predicted_step_time_s:.3f} s / best plan "
              f"without a memory limit {free.predicted_step_time_s:.3f} s = "
              f"{mega.predicted_step_time_s / free.predicted_step_time_s:.2f}x; that plan needs "
              f"{free.predicted_peak_device_bytes / 1e6:.1f} MB, megatrain(K=4) {mega_peak / 1e6:.1f} MB "
              f"(budgets: tight = {args.budget_slack:.2f} x megatrain's, midway between the two)")
    budget = budgets[0][1]

    # (c) measured vs predicted per phase, on the MILP plan (or all-device if none fits): each round
    # profiles the costs afresh and then measures a steady-state step (the second of two), so the
    # prediction and the measurement see the same load
    plan_c = milp if milp is not None else all_dev
    if args.c_plan == "megatrain":
        plan_c = mega
    if args.depths:
        plan_c = plan_c.repredict(weight_prefetch_depth=args.depths[0], act_prefetch_depth=args.depths[1],
                                  name=f"{plan_c.name}@depths{tuple(args.depths)}")
    ratios = {ph: [] for ph in PHASES}
    totals = []

    def predicted():
        """The plan's per-phase prediction, step time and simulated step under a fresh profile."""
        costs_r, hw_r = profile(model, args.batch, args.seq, stream_dtype="float32", device_memory=budget,
                                repeats=args.repeats, cached=False)
        plan_r = plan_c.repredict(costs_r, hw_r)  # every decision (the residual offload too)
        pred = [(w.item.name, w.time) for w in timing.windows(plan_r.costs, plan_r.hardware, plan_r)]
        return phase_sums(pred, items), plan_r.predicted_step_time_s, simulate(plan_r).step_time_s

    with lt.StreamingEngine(model, plan_c, tx8, stream_dtype="float32") as e:
        items = e.items
        e.step(batch)
        e.flush()  # the last step's pipelined update would run beside the profiler
        before = predicted()
        for _ in range(args.c_rounds):
            e.step(batch)
            e.step(batch)
            windows = [(n, t1 - t0) for n, t0, t1 in e.timeline.item_windows]
            measured_step, stalls = e.last_metrics["step_time_s"], e.last_metrics["stalls"]
            e.flush()
            after = predicted()
            # the prediction for these steps: the mean of the predictions under the profiles taken
            # right before and right after them (the load drifts over seconds on a shared machine)
            ps = {ph: 0.5 * (before[0][ph] + after[0][ph]) for ph in PHASES}
            ms = phase_sums(windows, items)
            for ph in PHASES:
                if ms[ph] or ps[ph]:
                    ratios[ph].append((ms[ph], ps[ph]))
            totals.append((measured_step, 0.5 * (before[1] + after[1]), 0.5 * (before[2] + after[2])))
            before = after
    del e
    gc.collect()
    t_meas, t_pred, t_sim = (float(np.median(x)) for x in zip(*totals))
    print(f"\n(c) plan {plan_c.name} (depths {plan_c.weight_prefetch_depth}/{plan_c.act_prefetch_depth}, "
          f"{'shared' if hw.host_shares_device else 'separate'} host/device cores): measured step {t_meas:.3f} s, "
          f"timing model {t_pred:.3f} s, simulator {t_sim:.3f} s (medians); last stalls "
          f"{', '.join(f'{k} {v * 1e3:.1f} ms' for k, v in stalls.items()) or 'none'}")
    print(f"{'phase':<10} {'measured s':>11} {'predicted s':>12} {'measured/pred':>14}")
    for ph in PHASES:
        if ratios[ph]:
            m, p = (float(np.median(x)) for x in zip(*ratios[ph]))
            r = float(np.median([a / max(b, 1e-12) for a, b in ratios[ph]]))
            print(f"{ph:<10} {m:>11.4f} {p:>12.4f} {r:>14.2f}")
    print(f"{'step':<10} {t_meas:>11.4f} {t_pred:>12.4f} {float(np.median([a / b for a, b, _ in totals])):>14.2f}")
    print("per round (measured / predicted step, s): "
          + ", ".join(f"{a:.3f} / {b:.3f} = {a / b:.2f}" for a, b, _ in totals)
          + "  (each round's prediction: the mean under the profiles taken right before and after its steps)")

    # (d) pipelined vs serial
    engines = {mode: lt.StreamingEngine(model, all_dev.replace(optimizer_mode=mode), tx8, stream_dtype="float32")
               for mode in ("pipelined", "serial")}

    def two_steps(e):
        e.step(batch)
        e.step(batch)
        e.flush()

    t = interleaved_seconds({mode: (lambda e=e: two_steps(e)) for mode, e in engines.items()}, args.repeats)
    for e in engines.values():
        e.close()
    engines.clear()
    e = None
    rows.append(row("(d) two steps: serial / pipelined optimizer", t, "serial", "pipelined"))

    print(f"\n{'comparison':<76} {'A s':>8} {'B s':>8} {'A/B':>6}")
    for name, a, b, r in rows:
        print(f"{name:<76} {a:>8.3f} {b:>8.3f} {r:>6.2f}")
    print(f"(A/B: median of the per-round ratios; load average {os.getloadavg()[0]:.2f} at the end)")


if __name__ == "__main__":
    main()
