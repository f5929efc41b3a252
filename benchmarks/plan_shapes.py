"""``lt.plan`` on real model shapes at fixed batches: how long the calls users make take, and what
they prove.

For each (model preset, hardware preset, batch), one ``lt.plan(model, hardware, batch_size=b,
seq_len=...)`` call, as a user makes it (its default 1 % gap and 30 s per micro-batch count's
solve), timed whole. Printed per call: seconds, the micro-batch count chosen, the predicted step
and tokens/s, the plan's gap and status, and each micro-batch count's solve (``plan_for_costs``,
in the order the best-first search took them): its seconds and what it returned ("none": no plan
beat the cutoff, the best plan's step so far). Then a summary: calls, proved within the gap, the
slowest ones. Calls where no plan fits say so (``NoPlanFits``, the memory the batch needs).

Run: python benchmarks/plan_shapes.py [--models a,b] [--hardware x,y] [--batches 8,32] [--seq 2048]
(the defaults: 7 models x 5 presets x 2 batches, about 10 minutes on a 2-core machine)
"""

import argparse
import contextlib
import statistics
import time

import lazytrain_jax as lt
from lazytrain_jax.schedule import api

MODELS = ["qwen2.5-3b", "qwen2.5-7b", "qwen3-8b", "qwen2.5-14b", "qwen3.6-27b", "qwen3-32b", "llama3-70b"]
HARDWARE = ["rtx3090", "a100-80g", "h800", "h100", "h200"]


@contextlib.contextmanager
def solves_recorded(out: list):
    """Each ``api.plan_for_costs`` call made inside, as (micro-batches, seconds, step or None), into ``out``."""
    original = api.plan_for_costs

    def recorded(costs, hardware, *args, **kwargs):
        t = time.perf_counter()
        plan = original(costs, hardware, *args, **kwargs)
        out.append((costs.num_micro_batches, time.perf_counter() - t,
                    None if plan is None else plan.predicted_step_time_s))
        return plan

    api.plan_for_costs = recorded
    try:
        yield
    finally:
        api.plan_for_costs = original


def one_call(model, hardware, batch, seq):
    """(seconds, plan or None, the NoPlanFits message or None, the solves) of one ``lt.plan`` call."""
    solves = []
    t = time.perf_counter()
    with solves_recorded(solves):
        try:
            plan, error = lt.plan(model, hardware, batch_size=batch, seq_len=seq), None
        except api.NoPlanFits as e:
            plan, error = None, str(e)
    return time.perf_counter() - t, plan, error, solves


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--hardware", default=",".join(HARDWARE))
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--seq", type=int, default=2048)
    args = ap.parse_args()
    import scipy.optimize  # noqa: F401  (its import, 0.5 s, not in the first call's time)
    rows = []
    print(f"lt.plan(model, hardware, batch_size=b, seq_len={args.seq}); seconds per call, then each "
          f"micro-batch count's solve (m: seconds -> step, or none)")
    for batch in (int(b) for b in args.batches.split(",")):
        for model in args.models.split(","):
            for hw in args.hardware.split(","):
                seconds, plan, error, solves = one_call(model, hw, batch, args.seq)
                label = f"{model:12s} {hw:9s} b{batch:<4d}"
                if plan is None:
                    print(f"{label} {seconds:6.1f} s  {error[:110]}", flush=True)
                    continue
                rows.append((seconds, label, plan))
                parts = ", ".join(f"m{m}: {s:.1f} s -> " + ("none" if step is None else f"{step:.3f}")
                                  for m, s, step in solves)
                print(f"{label} {seconds:6.1f} s  m{plan.costs.num_micro_batches:<3d} step "
                      f"{plan.predicted_step_time_s:9.3f} s {plan.tokens_per_s:7.0f} tok/s  gap "
                      f"{100 * plan.gap:5.2f} % {plan.solver_status:9s} [{parts}]", flush=True)
    if rows:
        times = [r[0] for r in rows]
        proved = sum(1 for _, _, p in rows if p.solver_status == "optimal")
        print(f"\n{len(rows)} calls with a plan: {proved} proved within the gap; seconds median "
              f"{statistics.median(times):.1f}, max {max(times):.1f}; over 10 s:")
        slow = sorted((r for r in rows if r[0] > 10), key=lambda r: r[0], reverse=True)
        for seconds, label, plan in slow:
            print(f"  {label} {seconds:6.1f} s  gap {100 * plan.gap:.2f} % {plan.solver_status}")
        if not slow:
            print("  none")


if __name__ == "__main__":
    main()
