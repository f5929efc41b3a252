"""Streaming engine on the CPU backend: measured side by side in one run (medians of repeats).

(a) streamed loss_and_grad with every boundary kept on device / resident ``lt.loss_and_grad``;
    the full streamed step (8-bit pipelined update) / a resident jitted step with optax adamw.
(b) under a device budget that forces trade-offs: the MILP plan / ``megatrain(K=4)``, measured
    (both played by this engine; MegaTrain's resident embedding/head is not reproduced).
(c) the measured step / the prediction of the timing model and the simulator with profiled costs,
    per phase (tail, forward, head, backward).
(d) pipelined / serial optimizer tail, measured.

    python benchmarks/streaming_cpu.py [--layers 8 --hidden 1024 --batch 2 --seq 128 --repeats 3]

fp32 streaming throughout (the CPU has no fast bf16). Numbers on a shared machine are noisy: read
the ratios, which are measured interleaved in one run.
"""

from __future__ import annotations

import argparse
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import median_seconds, profile
from lazytrain_jax.schedule import heuristics, timing
from lazytrain_jax.schedule.api import plan_for_costs
from lazytrain_jax.schedule.plan import Plan
from lazytrain_jax.schedule.simulator import simulate

TIER_CHARS = {"device": "D", "host": "H", "nvme": "N", "drop": "."}
PHASES = ("tail", "forward", "head", "recompute", "backward")


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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--depths", type=int, nargs=2, default=None, metavar=("WEIGHTS", "ACTS"),
                    help="(c) plays the plan at these prefetch depths (predictions recomputed)")
    ap.add_argument("--budget-slack", type=float, default=1.02,
                    help="device budget for (b): megatrain(K=4)'s predicted peak times this factor")
    args = ap.parse_args()
    model = make_model(args)
    batch = make_batch(model, args)
    print(f"model: {args.layers} layers, hidden {args.hidden}, {model.num_params() / 1e6:.1f} M params, "
          f"batch {args.batch} x {args.seq}, fp32, {jax.devices()[0].platform}, {args.repeats} repeats (medians)")
    costs, hw = profile(model, args.batch, args.seq, stream_dtype="float32", device_memory=1e12, repeats=args.repeats)
    L = model.config.num_layers
    rows = []

    # (a) everything on device vs resident
    all_dev = Plan.create(costs, hw, name="all-device", boundary_tiers=["device"] * (L + 1),
                          keep_residuals=[True] * L, optimizer_mode="pipelined")
    tx8 = lt.optim.adamw_8bit(1e-5, weight_decay=0.01, max_grad_norm=1.0)
    eng = lt.StreamingEngine(model, all_dev, tx8, stream_dtype="float32")
    t_stream = median_seconds(lambda: eng.loss_and_grad(batch), args.repeats)
    t_res = median_seconds(lambda: jax.block_until_ready(lt.loss_and_grad(model, batch)), args.repeats)
    rows.append(("(a) loss_and_grad: streamed all-device / resident", t_stream, t_res))

    def stream_step():
        eng.step(batch)
        eng.flush()

    t_step = median_seconds(stream_step, args.repeats)
    eng.close()
    tx = optax.adamw(1e-5, weight_decay=0.01)
    params = jax.tree.map(jnp.asarray, model.params)
    state = tx.init(params)
    cfg = model.config

    @jax.jit
    def resident_step(params, state, batch):
        from lazytrain_jax.model.reference import _loss_and_grad_fn
        loss, grads = _loss_and_grad_fn(cfg)(params, batch)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    jb = {k: jnp.asarray(v) for k, v in batch.items()}
    holder = {"p": params, "s": state}

    def res_step():
        holder["p"], holder["s"] = resident_step(holder["p"], holder["s"], jb)
        jax.block_until_ready(holder["p"])

    t_res_step = median_seconds(res_step, args.repeats)
    rows.append(("(a) full step: streamed (8-bit, pipelined) / resident jit (optax adamw)", t_step, t_res_step))

    # (b) a budget that forces trade-offs: MILP vs megatrain(K=4)
    budget = args.budget_slack * heuristics.megatrain(costs, hw, K=4).predicted_peak_device_bytes
    hw_b = dataclasses.replace(hw, device_memory=budget)
    milp = plan_for_costs(costs, hw_b)
    mega = heuristics.megatrain(costs, hw_b, K=4)
    measured = {}
    for name, plan in (("milp", milp), ("megatrain(K=4)", mega)):
        if plan is None or not plan.fits():
            print(f"(b) {name}: no plan fits {budget / 1e6:.1f} MB")
            continue
        with lt.StreamingEngine(model, plan, tx8, stream_dtype="float32") as e:
            measured[name] = median_seconds(lambda: (e.step(batch), e.flush()), args.repeats)
            last = dict(e.last_metrics)
        print(f"(b) {name}: tiers {''.join(TIER_CHARS[t] for t in plan.boundary_tiers)} residuals "
              f"{''.join('r' if r else '.' for r in plan.keep_residuals)} mode {plan.optimizer_mode} "
              f"predicted {plan.predicted_step_time_s:.3f} s measured {measured[name]:.3f} s "
              f"peak {last['peak_device_bytes'] / 1e6:.1f} MB of {budget / 1e6:.1f}")
    if len(measured) == 2:
        rows.append(("(b) step under budget: megatrain(K=4) / MILP  (speed-up)", measured["megatrain(K=4)"],
                     measured["milp"]))

    # (c) measured vs predicted per phase, on the MILP plan (or all-device if none fits)
    plan_c = milp if milp is not None else all_dev
    if args.depths:
        plan_c = Plan.create(plan_c.costs, plan_c.hardware, name=f"{plan_c.name}@depths{tuple(args.depths)}",
                             boundary_tiers=plan_c.boundary_tiers, keep_residuals=plan_c.keep_residuals,
                             resident_tail=plan_c.resident_tail, weight_prefetch_depth=args.depths[0],
                             act_prefetch_depth=args.depths[1], optimizer_mode=plan_c.optimizer_mode)
    with lt.StreamingEngine(model, plan_c, tx8, stream_dtype="float32") as e:
        for _ in range(args.repeats):
            e.step(batch)
        windows = [(n, t1 - t0) for n, t0, t1 in e.timeline.item_windows]
        t_meas = e.last_metrics["step_time_s"]
        stalls = e.last_metrics["stalls"]
    pred = [(w.item.name, w.time) for w in timing.windows(plan_c.costs, plan_c.hardware, plan_c)]
    sim = simulate(plan_c)
    ms, ps = phase_sums(windows, e.items), phase_sums(pred, e.items)
    print(f"\n(c) plan {plan_c.name}: measured step {t_meas:.3f} s, timing model {plan_c.predicted_step_time_s:.3f} s, "
          f"simulator {sim.step_time_s:.3f} s; stalls {', '.join(f'{k} {v * 1e3:.1f} ms' for k, v in stalls.items()) or 'none'}")
    print(f"{'phase':<10} {'measured s':>11} {'predicted s':>12} {'measured/pred':>14}")
    for ph in PHASES:
        if ms[ph] or ps[ph]:
            print(f"{ph:<10} {ms[ph]:>11.4f} {ps[ph]:>12.4f} {ms[ph] / max(ps[ph], 1e-12):>14.2f}")

    # (d) pipelined vs serial
    plan_d = all_dev
    t_mode = {}
    for mode in ("pipelined", "serial"):
        with lt.StreamingEngine(model, plan_d.replace(optimizer_mode=mode), tx8, stream_dtype="float32") as e:
            def two_steps():
                e.step(batch)
                e.step(batch)
                e.flush()
            t_mode[mode] = median_seconds(two_steps, args.repeats) / 2
    rows.append(("(d) step: serial / pipelined optimizer", t_mode["serial"], t_mode["pipelined"]))

    print(f"\n{'comparison':<76} {'A s':>8} {'B s':>8} {'A/B':>6}")
    for name, a, b in rows:
        print(f"{name:<76} {a:>8.3f} {b:>8.3f} {a / b:>6.2f}")


if __name__ == "__main__":
    main()
