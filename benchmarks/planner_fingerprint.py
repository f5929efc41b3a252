"""milp.solve's decisions on a fixed set of instances, as JSON, to check that a change to the solver's
code leaves them alone. For each instance: the plan (tiers, residuals, tail, depths, predicted step,
status, gap), ``stats`` without its seconds, and how often each solver step ran (``_rens``,
``_rins``, ``_depth_split``, ``_half_roots``, ``_optimize``, builds, polishes, ...).

Instances: the solve-time rows of ``planner.py`` (``solve_cases``) at 64 layers; random seeds
(``planner_probes.seed_instance``) at 24-64 layers (rel_gap 1 % and 0.3 %) and at 128 layers;
6/10/16-layer cases with rel_gap 0 (CBC), a cutoff, the memory objective, one depth pair without
the search, and a warm start. 7-9 minutes on 2 cores (``--quick``: without the 128-layer seeds).
Where the solve's 20 s limit strikes (on a 2-core machine at load: the 40-layer seeds 8 H, 13 H
and 14 N at rel_gap 0.3 %, 13 H at 1 %), the plan and gap can differ from one run to the next with
the same code.

    python benchmarks/planner_fingerprint.py run OUT.json [--quick]
    python benchmarks/planner_fingerprint.py compare BEFORE.json AFTER.json
"""

from __future__ import annotations

import argparse
import collections
import json

import scipy.optimize  # noqa: F401  (imported before the first solve, as planner.py does)

import planner
from lazytrain_jax.atomic import atomic_write_text
from lazytrain_jax.schedule import milp, search
from lazytrain_jax.schedule.api import best_heuristic
from planner_probes import seed_instance

STEPS = ["_rins", "_window_neighbourhood", "_tier_neighbourhood", "_residual_neighbourhood", "_half_roots",
         "_optimize", "_rens", "_search_for_depths", "_depth_split", "_offload_split", "_relaxed",
         "_background_lps", "build"]


def counting(calls):
    """Wraps the solver's steps (and ``search.polish``) so that ``calls`` counts them."""
    def wrap(module, name):
        f = getattr(module, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)
        setattr(module, name, counted)
    for name in STEPS:
        wrap(milp, name)
    wrap(search, "polish")


def plan_key(p):
    if p is None:
        return None
    return dict(tiers=list(p.boundary_tiers), res=list(p.keep_residuals), off=list(p.offload_residuals),
                tail=p.resident_tail, depths=[p.weight_prefetch_depth, p.act_prefetch_depth],
                step=round(p.predicted_step_time_s, 9), status=p.solver_status, gap=round(p.gap, 9), name=p.name)


def run(out_path: str, quick: bool) -> None:
    calls = collections.Counter()
    counting(calls)
    out = {}

    def solve(label, c, hw, **kw):
        stats = {}
        calls.clear()
        p = milp.solve(c, hw, stats=stats, **kw)
        entry = {k: v for k, v in stats.items() if not k.endswith("_s")}
        entry["calls"] = dict(sorted(calls.items()))
        out[label] = dict(plan=plan_key(p), stats=entry)
        print(label, None if p is None else f"{p.predicted_step_time_s:.6f} s", entry, flush=True)

    for label, make in planner.solve_cases():  # planner.py's solve-time rows, at 64 layers
        c, hw = make(64)
        solve(f"{label}-64", c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20)
    for spec in ["7:1", "8:0", "11:0", "12:0", "13:0", "14:0", "14:1"]:
        c, hw = seed_instance(spec, 64)
        solve(f"seed{spec}-64", c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20)
    for n in (24, 32, 40):
        for spec in ["8:0", "13:0", "9:1", "14:1"]:
            c, hw = seed_instance(spec, n)
            solve(f"seed{spec}-{n}", c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20)
            solve(f"seed{spec}-{n}-g3", c, hw, rel_gap=3e-3, time_limit_s=20)
    if not quick:
        for spec in ["14:0", "9:1"]:
            c, hw = seed_instance(spec, 128)
            solve(f"seed{spec}-128", c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20)
    for n in (6, 10, 16):
        c = planner.random_heterogeneous(n, seed=n)
        hw = planner.random_nvme_hardware(c)
        solve(f"small{n}-exact", c, hw, rel_gap=0.0)
        solve(f"small{n}-gap", c, hw, rel_gap=1e-2)
        solve(f"small{n}-nosearch", c, hw, rel_gap=1e-2, search_evaluations=-1, depths=[(1, 1)])
        solve(f"small{n}-memory", c, hw, objective="memory")
        p = milp.solve(c, hw, rel_gap=1e-2)
        if p is not None:
            solve(f"small{n}-cutoff", c, hw, rel_gap=1e-2, cutoff=p.predicted_step_time_s * 1.001)
            solve(f"small{n}-cutoff-tight", c, hw, rel_gap=1e-2, cutoff=p.predicted_step_time_s * 0.9)
            solve(f"small{n}-warm", c, hw, rel_gap=1e-2, warm_start=p, residual_offload=False)
    atomic_write_text(out_path, json.dumps(out, indent=1, sort_keys=True))


def compare(before_path: str, after_path: str) -> None:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    same = 0
    for label in sorted(set(before) | set(after)):
        a, b = before.get(label), after.get(label)
        if a == b:
            same += 1
            continue
        if a is None or b is None:
            print(f"{label}: only in {'after' if a is None else 'before'}")
            continue
        for part in ("plan", "stats"):
            x, y = a[part], b[part]
            if x != y and isinstance(x, dict) and isinstance(y, dict):
                print(f"{label} {part}: " + ", ".join(f"{k} {x.get(k)} -> {y.get(k)}" for k in sorted(set(x) | set(y))
                                                     if x.get(k) != y.get(k)))
            elif x != y:
                print(f"{label} {part}: {x} -> {y}")
    print(f"{same} of {len(set(before) | set(after))} instances identical")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("out")
    r.add_argument("--quick", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args()
    if args.command == "run":
        run(args.out, args.quick)
    else:
        compare(args.before, args.after)


if __name__ == "__main__":
    main()
