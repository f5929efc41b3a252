"""Where the planner's LP bound and plans lose, on the random heterogeneous NVMe instance of
``benchmarks/planner.py`` (the one row no LP proves). Probes, not part of the planner:

  lps       each depth pair's LP and the union LP
  groups    the depth pair's LP with the solve's plan's decisions fixed except some groups
            (x: the kept-boundary path, host/nv: tiers, res/off: residuals kept / on the host, r: tail)
  cbc       CBC from that plan (unlimited nodes, rel_gap 1 %), with and without its preprocessing
  windows   CBC on windows of layers (everything outside fixed, a node limit each), one pass
  seeds     ``milp.solve`` as ``planner.py`` (a) runs it, on other random instances (SEED:NVME,
            NVME 0 = no NVMe room), as ``lt.plan`` runs it (``milp.MIP_SOLVER``; where CBC
            branches, with its preprocessing or without: --no-preprocess)
  root      on those instances, at --depths: HiGHS' plain run on the pair's model against its root
            alone asked for a plan rel_gap (1 %) faster than the solve's plan (``milp._highs_mip``
            with a cutoff, ``milp.HIGHS_CUTOFF_NODES``), and the pair's LP with the solve's path
            (the x group) fixed
  varied    ``milp.solve`` on instances of varied magnitudes (``varied_instance``: every scale drawn
            log-uniformly, per seed; --seeds are plain integers here): seconds, gap, status, proof, and
            each instance's link-to-compute ratios (a boundary's and a layer's weights' transfer time
            over the layer's forward time)
  varied-lps  on those instances (--seeds): each depth pair's LP and the union LP (CLP)
  kept      on those instances, at --depths, every boundary kept (the tiers free): the LP against
            the MILP's optimum at that path (CBC, rel_gap 0), where the case cuts were loose
  shape-lps on those instances (--seeds: label substrings): each depth pair's LP and the union LP
  pair-lps  on those instances: the union LP (its activation depth indicator, whether it pays the
            residuals' staging in part) and each depth pair's LP, with no residual on the host,
            with the least staging paid in full (about ``milp._offload_split``'s branches, whose
            second also asks for one residual on the host), and the pair's bound as
            ``milp._Solve.pair_lps`` takes it (its LP, raised by its offload split where its
            solution pays the staging in part)
  lp-paths  the union LP of three ``planner.py`` rows at --layers and twice that, through scipy's
            bundled HiGHS object (``milp._highs_lp_direct``, what the planner uses) and through
            ``linprog`` (``milp._highs_lp_scipy``), alone and beside a thread running Python (min of 2)
  leftover  in one process: the random row at 128 layers, then the qwen3-32b row at 64 layers twice,
            with the solve's leftover LP threads left at their niceness (``milp.LEFTOVER_NICE`` 0)
            and demoted (19), each sequence after every thread of the one before has ended
  search    ``search.heuristic_plan`` (the solve's start, pure Python) on instances at --layers: "random"
            (``instance``) or a varied seed (an integer): the median and spread of five runs, and the plan's
            predicted step
  polish    each ``search.polish`` one ``milp.solve`` makes on those instances (its rounding's plan,
            its neighbourhoods'), replayed alone: the median and spread of five runs each
  timeline  one ``milp.solve`` per instance ("random" or a varied seed, --seeds) as ``planner.py`` (a)
            runs it, each of its steps as it ends: its start and end in seconds from the solve's
            start, its thread, and the plan's step time where the step returns one (nested steps
            indented, in the order they ended; steps that took under a millisecond and return no plan
            are left out)
  builds    ``milp.build``'s seconds on the random row of ``planner.py`` at --layers: the union model
            and each depth pair's, median of five, and the models' sizes (to compare two commits)
  shapes    ``milp.solve`` on real model shapes at --layers layers (``shape_instances``: every model
            preset of 3-32B on each hardware preset, at the device's own memory and at a budget with
            room for a third of the boundaries; --seeds filters by label substring): seconds, gap, proof

Run: python benchmarks/planner_probes.py [lps|groups|cbc|windows|seeds|root|varied|varied-lps|kept|search|polish|shapes|
     shape-lps|pair-lps|lp-paths|leftover|builds|timeline] [--layers 64] [--depths 2 1]
     [--width 32 --nodes 100] [--seeds ...] [--no-preprocess]

--seeds by probe: seeds and root take random instances SEED:NVME (default 7:1 8:1 9:1 8:0 11:0);
varied, varied-lps and kept take varied seeds, plain integers (default 0 ... 39, the family the
planner's aims are quoted on); search, polish and timeline take "random" or varied seeds (default random); shapes,
shape-lps and pair-lps take label substrings (default: every shape). The other probes ignore
--seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import statistics
import time

from lazytrain_jax.schedule import milp

from lazytrain_jax.schedule.api import best_heuristic
from lazytrain_jax.schedule.costs import synthetic_costs
from lazytrain_jax.schedule.hardware import Hardware
from planner import random_heterogeneous, random_nvme_hardware, tight_device_memory

GROUPS = milp.DECISION_GROUPS


def instance(layers):
    c = random_heterogeneous(layers)
    return c, random_nvme_hardware(c)


def depth_plan(c, hw, dw, da):
    """The solve's plan for one depth pair (one CBC node: the heuristics, the LP and the tier
    neighbourhood; CBC's path, which the large-model path with HiGHS skips)."""
    solver, milp.MIP_SOLVER = milp.MIP_SOLVER, "cbc"
    try:
        return milp.solve(c, hw, depths=((dw, da),), max_nodes=1, rel_gap=1e-2)
    finally:
        milp.MIP_SOLVER = solver


def lps(args):
    c, hw = instance(args.layers)
    for dw, da in milp.MILP_DEPTHS:
        t = time.perf_counter()
        value = milp._relaxed(milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da))
        print(f"depths ({dw},{da}): LP {value:.4f} s ({time.perf_counter() - t:.2f} s)")
    print(f"union: LP {milp._relaxed(milp.build(c, hw, union=True)):.4f} s")


def _groups(b):
    return {"x": b.x, "host": b.host, "nv": b.nv, "res": b.res, "off": b.off, "r": b.r}


def _fix(b, start, is_free):
    """Every decision variable fixed at its value in ``start`` unless ``is_free(group, key)``."""
    for g, d in _groups(b).items():
        for key, v in d.items():
            if is_free(g, key):
                v.lb, v.ub = 0.0, 1.0
            else:
                v.lb = v.ub = start[v.idx]


def groups(args):
    c, hw = instance(args.layers)
    dw, da = args.depths
    p = depth_plan(c, hw, dw, da)
    print(f"plan at depths ({dw},{da}): {p.predicted_step_time_s:.4f} s")
    b = milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
    start = {v.idx: val for v, val in milp._start_values(p, b)}
    for free in (["x"], ["host"], ["nv"], ["res"], ["x", "host", "nv"], ["res", "off", "r"], list(GROUPS)):
        _fix(b, start, lambda g, _, free=free: g in free)
        lp = milp._relaxed(b, solver="clp")
        print(f"free {'+'.join(free):22s} LP {lp:.4f} s, {100 * (p.predicted_step_time_s - lp) / p.predicted_step_time_s:5.2f} % "
              f"below the plan")
    _fix(b, start, lambda g, _: True)
    milp._relaxed(b, solver="clp")
    R = c.residual_bytes
    kept = {l: round(v.x, 2) for l, v in b.res.items() if v.x > 0.01}
    print(f"LP residuals kept (layer: share): {kept}, {sum(R[l] * v for l, v in kept.items()) / 1e9:.2f} GB; the plan "
          f"keeps {sum(R[l] for l in range(c.num_layers) if p.keep_residuals[l]) / 1e9:.2f} GB")
    dev_lp = sum(c.boundary_bytes[i] * v.x for i, v in b.dev.items())
    dev_plan = sum(c.boundary_bytes[i] for i in range(1, c.num_layers) if p.boundary_tiers[i] == "device")
    print(f"boundaries on the device: LP {dev_lp / 1e9:.2f} GB, plan {dev_plan / 1e9:.2f} GB")


def cbc(args):
    c, hw = instance(args.layers)
    dw, da = args.depths
    p = depth_plan(c, hw, dw, da)
    if p is None:
        print(f"no plan fits at depths ({dw},{da})")
        return
    print(f"plan at depths ({dw},{da}): {p.predicted_step_time_s:.4f} s")
    for preprocess in (True, False):
        b = milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
        b.model.start = milp._start_values(p, b)
        t = time.perf_counter()
        status = milp._optimize(b, 1e-2, args.time_limit or 120.0, None, 100_000, preprocess=preprocess, solver="cbc")
        print(f"CBC preprocessing {'on ' if preprocess else 'off'}: {status}, plan {b.solved.objective_value or float('nan'):.4f} s, "
              f"bound {b.solved.objective_bound:.4f} s, {time.perf_counter() - t:.2f} s")


def windows(args):
    c, hw = instance(args.layers)
    dw, da = args.depths
    t0 = time.perf_counter()
    plan = depth_plan(c, hw, dw, da)
    print(f"plan at depths ({dw},{da}): {plan.predicted_step_time_s:.4f} s")
    b = milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
    L = c.num_layers
    t1 = time.perf_counter()
    for lo in range(0, L, args.width // 2):
        hi = lo + args.width
        start = {v.idx: val for v, val in milp._start_values(plan, b)}
        # a decision is free when every layer it touches lies in the window (an edge: both ends)
        _fix(b, start, lambda g, key: lo <= (key[0] if g == "x" else key) and (key[1] if g == "x" else key) <= hi)
        b.model.start = [(v, start[v.idx]) for d in _groups(b).values() for v in d.values()]
        t = time.perf_counter()
        status = milp._optimize(b, 1e-4, 60, plan.predicted_step_time_s, args.nodes, solver="cbc")
        if status is not None:
            q = milp.decode(b, c, hw, status=status, bound=None, solve_time_s=0.0)
            if q.predicted_step_time_s < plan.predicted_step_time_s - 1e-9:
                plan = q
        print(f"layers {lo}-{min(hi, L)}: {plan.predicted_step_time_s:.4f} s ({time.perf_counter() - t:.2f} s)")
        if hi >= L:
            break
    print(f"after one pass: {plan.predicted_step_time_s:.4f} s; the pass took {time.perf_counter() - t1:.1f} s "
          f"(the start {t1 - t0:.1f} s)")


def seed_instance(spec: str, layers: int):
    """The random instance ``SEED:NVME`` (NVME 0: no NVMe room) with ``layers`` layers: (costs, hardware)."""
    seed, nvme = (int(v) for v in spec.split(":"))
    c = random_heterogeneous(layers, seed=seed)
    hw = random_nvme_hardware(c)
    return c, hw if nvme else dataclasses.replace(hw, nvme_memory=0.0)


def seeds(args):
    if args.no_preprocess:
        optimize = milp._optimize
        milp._optimize = lambda *a, **k: optimize(*a, **{**k, "preprocess": False})
    for spec in args.seeds:
        seed, nvme = (int(v) for v in spec.split(":"))
        c, hw = seed_instance(spec, args.layers)
        stats = {}
        t = time.perf_counter()
        p = milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20, stats=stats)
        print(f"seed {seed} {'NVMe' if nvme else 'host only'}, {args.layers} layers: {time.perf_counter() - t:.2f} s, "
              f"gap {100 * p.gap:.2f} %, step {p.predicted_step_time_s:.3f} s, depths ({p.weight_prefetch_depth},"
              f"{p.act_prefetch_depth}), proof {stats['proof']}, RENS {stats['rens_s']:.1f} s x{stats['rens_runs']}, "
              f"B&B {stats['bb_s']:.1f} s x{stats['bb_runs']}",
              flush=True)


def root(args):
    for spec in args.seeds:
        c, hw = seed_instance(spec, args.layers)
        plan = milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=20)
        b = milp.build(c, hw, weight_prefetch_depth=args.depths[0], act_prefetch_depth=args.depths[1])
        lp = milp._relaxed(b)
        t = time.perf_counter()
        plain = milp._highs_mip(b.model, 1e-2, 120.0, 10**6)
        t_plain = time.perf_counter() - t
        bar = plan.predicted_step_time_s * (1 - 1e-2)
        t = time.perf_counter()
        cut = milp._highs_mip(b.model, 1e-2, 120.0, milp.HIGHS_CUTOFF_NODES, cutoff=bar)
        t_cut = time.perf_counter() - t
        fixed = None
        if (plan.weight_prefetch_depth, plan.act_prefetch_depth) == tuple(args.depths):
            start = {v.idx: val for v, val in milp._start_values(plan, b)}
            _fix(b, start, lambda g, _: g != "x")
            fixed = milp._relaxed(b)
            _fix(b, start, lambda g, _: True)
        print(f"seed {spec}, {args.layers} layers, depths {tuple(args.depths)}: solve's plan "
              f"{plan.predicted_step_time_s:.3f} s (depths ({plan.weight_prefetch_depth},{plan.act_prefetch_depth})), "
              f"pair LP {lp:.3f} s{f', with its path fixed {fixed:.3f} s' if fixed is not None else ''}; "
              f"HiGHS plain {t_plain:.2f} s -> {plain.status.name} {plain.objective_value or float('nan'):.3f} s; "
              f"root with cutoff {bar:.3f} s: {t_cut:.2f} s -> {cut.status.name}", flush=True)


def varied_instance(seed: int, layers: int):
    """An instance whose scales are drawn per seed (the same scales at every layer count): a layer's
    weights 0.05-3 GB, a boundary 0.02-2 GB, a layer's forward 3-300 ms (log-uniform), residuals
    none or 1-8 boundaries, per-layer spread 0, +-20 % or +-60 %, links 5-60 GB/s, device room for
    15-80 % of the boundaries, host room for 0.1-4 times them, NVMe none or 1 time, a host
    optimizer of 1e9-3e10 params/s. Returns (costs, hardware, the scales)."""
    rng = random.Random(1000 + seed)

    def log_uniform(a, b):
        return math.exp(rng.uniform(math.log(a), math.log(b)))
    w, a, t = log_uniform(0.05e9, 3e9), log_uniform(0.02e9, 2e9), log_uniform(0.003, 0.3)
    r = rng.choice([0.0, 1.0]) * log_uniform(1, 8)
    spread = rng.choice([0.0, 0.2, 0.6])
    bw, d2h = log_uniform(5e9, 60e9), rng.uniform(0.7, 1.0)
    room, host, nvme = rng.choice([0.15, 0.3, 0.5, 0.8]), rng.choice([0.1, 0.5, 4.0]), rng.choice([0.0, 0.0, 1.0])
    work, head_t, head_w, head_work = rng.uniform(0.5, 3), rng.uniform(1, 4), rng.uniform(0.5, 3), rng.uniform(1, 6)
    opt = log_uniform(1e9, 3e10)
    per_layer = random.Random(f"{seed}:{layers}")

    def vary(x, n=layers):
        return [x * (1 + spread * per_layer.uniform(-1, 1)) for _ in range(n)]
    boundaries = vary(a, layers + 1)
    c = synthetic_costs(num_layers=layers, weight_bytes=vary(w), boundary_bytes=boundaries, fwd_time=vary(t),
                        residual_bytes=[r * b for b in boundaries[:layers]], workspace_bytes=a * work,
                        head_time=t * head_t, head_bytes=w * head_w, head_workspace_bytes=a * head_work)
    hw = Hardware(device_memory=tight_device_memory(c, room), host_memory=host * sum(c.boundary_bytes),
                  nvme_memory=nvme * sum(c.boundary_bytes), h2d_bw=bw, d2h_bw=bw * d2h, device_flops=1e14,
                  host_opt_rate=opt)
    return c, hw, dict(boundary_link=a / bw / t, weight_link=w / bw / t, residuals=r, spread=spread, room=room)


def print_summary(label, runs, rel_gap=1e-2):
    """One line over ``runs`` ((seconds, plan or None) per solve): how many proved within ``rel_gap``, how
    many of those within 1 s and 5 s (the planner's aims at 64 and 128 layers), and the seconds in all."""
    proved = [t for t, p in runs if p is not None and p.gap is not None and p.gap <= rel_gap * (1 + 1e-9)]
    print(f"{label}: {len(runs)} solves, {len(proved)} proved within {100 * rel_gap:g} %, "
          f"{sum(t <= 1.0 for t in proved)} of them within 1 s, {sum(t <= 5.0 for t in proved)} within 5 s; "
          f"{sum(t for t, _ in runs):.1f} s in all", flush=True)


def varied(args):
    runs = []
    for spec in args.seeds:
        c, hw, scales = varied_instance(int(spec), args.layers)
        stats = {}
        t = time.perf_counter()
        p = milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2, time_limit_s=args.time_limit or 20.0,
                       stats=stats)
        runs.append((time.perf_counter() - t, p))
        if p is None:
            print(f"varied {spec}, {args.layers} layers: {runs[-1][0]:.2f} s, no plan fits", flush=True)
            continue
        print(f"varied {spec}, {args.layers} layers: {runs[-1][0]:.2f} s, gap {100 * p.gap:.2f} %, "
              f"step {p.predicted_step_time_s:.4f} s, "
              f"{p.solver_status}, proof {stats['proof']}, B&B {stats['bb_s']:.1f} s x{stats['bb_runs']}; "
              f"boundary/forward {scales['boundary_link']:.2f}, weights/forward {scales['weight_link']:.2f} "
              f"(link seconds per forward second), residuals {scales['residuals']:.1f}, spread {scales['spread']}, "
              f"room {scales['room']}", flush=True)
    print_summary(f"varied, {args.layers} layers", runs)


def _five_runs(fn):
    """``fn()`` run five times: (its last value, the seconds of each run)."""
    seconds = []
    for _ in range(5):
        t = time.perf_counter()
        value = fn()
        seconds.append(time.perf_counter() - t)
    return value, seconds


def _search_instance(spec, layers):
    """(Costs, Hardware) of a ``search``/``polish`` seed: "random" (``instance``) or a varied seed."""
    return instance(layers) if spec == "random" else varied_instance(int(spec), layers)[:2]


def search_time(args):
    from lazytrain_jax.schedule import search
    for spec in args.seeds:
        c, hw = _search_instance(spec, args.layers)
        p, times = _five_runs(lambda: search.heuristic_plan(c, hw))
        step = f"{p.predicted_step_time_s:.4f} s" if p is not None else "none fits"
        print(f"search, {spec}, {args.layers} layers: median {statistics.median(times):.3f} s "
              f"(min {min(times):.3f}, max {max(times):.3f}), plan {step}", flush=True)


def polish_time(args):
    """Each ``search.polish`` a solve makes (its rounding's and its neighbourhoods' plans), replayed
    alone: the median and spread of five runs each, and the plan it gives."""
    from lazytrain_jax.schedule import search
    for spec in args.seeds:
        c, hw = _search_instance(spec, args.layers)
        calls, polish = [], search.polish

        def caught(plan, **kw):
            calls.append((plan, kw))
            return polish(plan, **kw)
        search.polish = caught
        try:
            milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2)
        finally:
            search.polish = polish
        for n, (plan, kw) in enumerate(calls):
            q, times = _five_runs(lambda: polish(plan, **kw))
            print(f"polish {n + 1} of {len(calls)}, {spec}, {args.layers} layers, depths "
                  f"({plan.weight_prefetch_depth}, {plan.act_prefetch_depth}): median {statistics.median(times):.3f} s "
                  f"(min {min(times):.3f}, max {max(times):.3f}), {plan.predicted_step_time_s:.4f} -> "
                  f"{q.predicted_step_time_s:.4f} s", flush=True)


# the steps ``timeline`` reports: ``milp._Solve``'s phases, and the module's builds, LPs, splits and neighbourhoods
TIMELINE_STEPS = ("union_phase", "depth_phase", "round_union", "prove_early", "first_neighbourhood", "tail_split",
                  "offload_pattern", "half_neighbourhoods", "searches", "settle", "pair_lps", "rens_at", "polish",
                  "branch")
TIMELINE_FUNCTIONS = ("build", "_highs_arrays", "_highs_solve", "_depth_split", "_offload_split", "_rens",
                      "_offload_pattern", "_tier_neighbourhood", "_rounding", "_highs_mip")


def timeline(args):
    """One ``milp.solve`` per instance, each step (``TIMELINE_STEPS`` of ``milp._Solve``,
    ``TIMELINE_FUNCTIONS`` of ``milp``, and ``search.heuristic_plan``) printed as it ends."""
    import threading

    import scipy.optimize  # noqa: F401  (its import, 0.5-0.6 s once per process, kept out of the first solve)

    from lazytrain_jax.schedule import search
    starts = []  # each solve's start (a step is timed from its solve's, and printed with it)
    depth = threading.local()
    # printed after each solve, in the order the steps ended: a line printed while a HiGHS run
    # silences the process's stdout (``milp._quiet_stdout``) from another thread would be lost.
    # A step a solve leaves running that ends during the next solve is not printed
    lines = []

    def timed(fn, label):
        def run(*a, **kw):
            level = getattr(depth, "level", 0)
            depth.level = level + 1
            solve, begun = len(starts), starts[-1] if starts else 0.0
            t = time.perf_counter() - begun
            try:
                value = fn(*a, **kw)
            finally:
                depth.level = level
            end = time.perf_counter() - begun
            step = getattr(value, "predicted_step_time_s", None)
            if end - t < 1e-3 and step is None:
                return value  # a step with nothing to do
            lines.append((solve, end, f"  {'  ' * level}{label:24s} {t:7.3f} -> {end:7.3f} s ({end - t:6.3f} s) "
                               f"[{threading.current_thread().name}]" +
                               (f"  plan {step:.5f} s" if step is not None else "")))
            return value
        return run

    owners = [(milp._Solve, name) for name in TIMELINE_STEPS] + [(milp, name) for name in TIMELINE_FUNCTIONS] + \
        [(search, "heuristic_plan")]
    saved = [(owner, name, getattr(owner, name)) for owner, name in owners]
    try:
        for owner, name, fn in saved:
            setattr(owner, name, timed(fn, name))
        for spec in args.seeds:
            c, hw = _search_instance(spec, args.layers)
            warm = best_heuristic(c, hw)
            stats = {}
            print(f"timeline, {spec}, {args.layers} layers:")
            starts.append(time.perf_counter())
            p = milp.solve(c, hw, warm_start=warm, rel_gap=1e-2, time_limit_s=args.time_limit or 20.0, stats=stats)
            total = time.perf_counter() - starts[-1]
            ended = [(end, line) for solve, end, line in list(lines) if solve == len(starts)]
            for _, line in sorted(ended):
                print(line)
            lines.clear()
            plan = "none fits" if p is None else \
                f"plan {p.predicted_step_time_s:.5f} s, gap {100 * p.gap:.2f} %, proof {stats['proof']}"
            print(f"  solve {total:.3f} s, {plan}", flush=True)
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def varied_lps(args):
    for spec in args.seeds:
        c, hw, _ = varied_instance(int(spec), args.layers)
        values = [milp._relaxed(milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da), solver="clp")
                  for dw, da in milp.MILP_DEPTHS]
        union = milp._relaxed(milp.build(c, hw, union=True), solver="clp")
        print(f"varied {spec}, {args.layers} layers: " + ", ".join(f"({dw},{da}) {v:.4f}" for (dw, da), v in
                                                             zip(milp.MILP_DEPTHS, values)) + f", union {union:.4f} s")


def kept(args):
    dw, da = args.depths
    for spec in args.seeds:
        c, hw, _ = varied_instance(int(spec), args.layers)
        values = []
        for relax in (True, False):
            b = milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da)
            for (s, e), var in b.x.items():
                var.lb = var.ub = 1.0 if e == s + 1 else 0.0
            if relax:
                values.append(milp._relaxed(b, solver="clp"))
            else:
                solver = b.model.mip_model()
                with milp._quiet_stdout():
                    solver.optimize(max_seconds=args.time_limit or 120.0)
                values.append(solver.objective_value)
        if values[1] is None or not math.isfinite(values[0]):
            print(f"varied {spec}, {args.layers} layers, depths ({dw},{da}), every boundary kept: no plan fits")
            continue
        print(f"varied {spec}, {args.layers} layers, depths ({dw},{da}), every boundary kept: LP {values[0]:.4f} s, "
              f"optimum {values[1]:.4f} s ({100 * (1 - values[0] / values[1]):.2f} % below)")


SHAPE_MODELS = ("qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b", "qwen3-8b", "llama3-8b", "qwen3-32b", "dense-27b",
                "qwen3.6-27b")
# (hardware preset, batch, micro-batches): a 24 GB card at a small batch, the larger cards at LazyTrain's
SHAPE_MACHINES = (("rtx3090", 4, 1), ("rtx4090", 8, 2), ("a100-80g", 32, 4), ("h800", 72, 8), ("h100", 64, 4),
                  ("h200", 32, 4))


def shape_instances(layers):
    """(label, costs, hardware) for each model preset in SHAPE_MODELS on each machine of
    SHAPE_MACHINES at ``layers`` layers, at the device's own memory and at a budget that holds the
    step's fixed bytes and a third of the boundaries (``tight_device_memory``)."""
    from lazytrain_jax.model.config import get_preset
    from lazytrain_jax.schedule.costs import analytic_costs
    for name in SHAPE_MODELS:
        for machine, batch, m in SHAPE_MACHINES:
            hw = Hardware.preset(machine)
            c = analytic_costs(get_preset(name, num_layers=layers), batch_size=batch, seq_len=1024,
                               device_flops=hw.device_flops, num_micro_batches=m,
                               efficiency_half_tokens=hw.efficiency_half_tokens)
            yield f"{name} {machine} b{batch} m{m}", c, hw
            yield f"{name} {machine} b{batch} m{m} 1/3", c, dataclasses.replace(
                hw, device_memory=tight_device_memory(c, 1 / 3))


def selected_shapes(args):
    """``shape_instances(args.layers)`` whose label contains one of ``args.seeds`` (every shape
    where none is given)."""
    keys = args.seeds
    return ((label, c, hw) for label, c, hw in shape_instances(args.layers)
            if not keys or any(k in label for k in keys))


def shapes(args):
    runs = []
    for label, c, hw in selected_shapes(args):
        stats = {}
        t = time.perf_counter()
        try:
            p = milp.solve(c, hw, warm_start=best_heuristic(c, hw), rel_gap=1e-2,
                           time_limit_s=args.time_limit or 20.0, stats=stats)
        except ValueError as e:
            print(f"{label}, {args.layers} layers: no plan ({str(e).splitlines()[0][:80]})", flush=True)
            continue
        runs.append((time.perf_counter() - t, p))
        print(f"{label}, {args.layers} layers: {runs[-1][0]:.2f} s, gap {100 * p.gap:.2f} %, "
              f"step {p.predicted_step_time_s:.3f} s, {p.solver_status}, proof {stats['proof']}, "
              f"search {stats['search_s']:.2f} s, LP {stats['lp_s']:.2f} s x{stats['lp_solves']}, "
              f"RENS {stats['rens_s']:.2f} s x{stats['rens_runs']}, B&B {stats['bb_s']:.1f} s x{stats['bb_runs']}",
              flush=True)
    print_summary(f"shapes, {args.layers} layers", runs)


def shape_lps(args):
    for label, c, hw in selected_shapes(args):
        values = [milp._relaxed(milp.build(c, hw, weight_prefetch_depth=dw, act_prefetch_depth=da))
                  for dw, da in milp.MILP_DEPTHS]
        union = milp._relaxed(milp.build(c, hw, union=True))
        print(f"{label}, {args.layers} layers: " + ", ".join(f"({dw},{da}) {v:.4f}" for (dw, da), v in
                                                         zip(milp.MILP_DEPTHS, values)) + f", union {union:.4f} s",
              flush=True)


def pair_lps(args):
    """See the module docstring (pair-lps)."""
    for label, c, hw in selected_shapes(args):
        union = milp.build(c, hw, union=True)
        point = []
        value = milp._highs_solve(milp._highs_arrays(union.model), point)
        y_a = float(point[0][union.depth_indicators[1].idx]) if point else float("nan")
        print(f"{label}, {args.layers} layers: union LP {value:.4f} s, activation depth indicator {y_a:.2f}, "
              f"staging paid in part: {milp._staging_paid_in_part(union, point)}", flush=True)
        for d in milp.MILP_DEPTHS:
            built = milp.build(c, hw, weight_prefetch_depth=d[0], act_prefetch_depth=d[1])
            arrays = milp._highs_arrays(built.model)
            point, basis, branches = [], [], []
            lp = milp._highs_solve(arrays, point, basis)
            in_part = bool(built.off and point and milp._staging_paid_in_part(built, point))
            # the pair's bound as _Solve.pair_lps takes it: its offload split where it pays the staging in part
            bound = max(lp, milp._offload_split(built, arrays, basis) if in_part else -math.inf)
            if built.off:
                for fix in ("none", "full"):
                    for v in built.off.values():
                        v.ub = 0.0 if fix == "none" else 1.0
                    built.res_max.lb = built.res_floor if fix == "full" else 0.0
                    branches.append(milp._highs_solve(milp._highs_arrays(built.model)))
                built.res_max.lb = 0.0
            text = (f"no residual on the host {branches[0]:.4f}, staging paid in full {branches[1]:.4f}, "
                    if branches else "no residual offload, ")
            print(f"  ({d[0]},{d[1]}) LP {lp:.4f}, {text}staging paid in part: {in_part}, bound {bound:.4f} s",
                  flush=True)


def _planner_row(label):
    from planner import solve_cases
    return dict(solve_cases())[label]


def builds(args):
    c, hw = instance(args.layers)
    for label, kw in [("union", dict(union=True))] + [(f"depths {dw},{da}", dict(weight_prefetch_depth=dw, act_prefetch_depth=da))
                                                     for dw, da in milp.MILP_DEPTHS]:
        b, seconds = _five_runs(lambda: milp.build(c, hw, **kw))
        m = b.model
        print(f"{args.layers} layers, {label:12s}: build {statistics.median(seconds):.3f} s (median of 5; "
              f"{min(seconds):.3f}-{max(seconds):.3f}), {m.num_cols} columns, {m.num_rows} rows, {m.num_nz} nonzeros")


def lp_paths(args):
    import threading

    def python_loop(stop):
        while not stop.is_set():
            sum(i * i for i in range(1000))

    for label in ("random heterogeneous, NVMe", "qwen3-32b h200 b32 m4", "dense-27b h800 b72 m8"):
        for layers in (args.layers, 2 * args.layers):
            c, hw = _planner_row(label)(layers)
            built = milp.build(c, hw, union=True)
            arrays = milp._highs_arrays(built.model)
            seconds, values = {}, {}
            for _ in range(2):
                for name, fn in (("HiGHS object", milp._highs_lp_direct), ("linprog", milp._highs_lp_scipy)):
                    for beside in (False, True):
                        stop = threading.Event()
                        other = threading.Thread(target=python_loop, args=(stop,))
                        if beside:
                            other.start()
                        t = time.perf_counter()
                        values[name] = fn(arrays)[1]
                        seconds.setdefault((name, beside), []).append(time.perf_counter() - t)
                        stop.set()
                        if beside:
                            other.join()
            print(f"{label}, {layers} layers: " + ", ".join(
                f"{name}{' beside Python' if beside else ''} {min(v):.3f} s" for (name, beside), v in seconds.items())
                + f"; values {values['HiGHS object']:.6f} / {values['linprog']:.6f}", flush=True)


def leftover(args):
    import os
    import sys
    import threading

    sequence = [("random heterogeneous, NVMe", 128), ("qwen3-32b h200 b32 m4", 64), ("qwen3-32b h200 b32 m4", 64)]
    instances = [(label, layers, *_planner_row(label)(layers)) for label, layers in sequence]
    starts = [best_heuristic(c, hw) for _, _, c, hw in instances]
    for nice in (0, milp.LEFTOVER_NICE):
        for th in threading.enumerate():  # every thread of the sequence before ended
            if th is not threading.current_thread():
                th.join()
        previous, milp.LEFTOVER_NICE = milp.LEFTOVER_NICE, nice
        line = []
        for (label, layers, c, hw), start in zip(instances, starts):
            t = time.perf_counter()
            milp.solve(c, hw, warm_start=start, rel_gap=1e-2, time_limit_s=20)
            seconds = time.perf_counter() - t
            with milp._RUNNING_LOCK:
                left = [os.getpriority(os.PRIO_PROCESS, tid) for tid in milp._RUNNING] \
                    if sys.platform.startswith("linux") else list(milp._RUNNING)
            line.append(f"{label} {layers} layers {seconds:.2f} s (LP threads left: {len(left)}, niceness {left})")
        milp.LEFTOVER_NICE = previous
        print(f"leftover niceness {nice}: " + "; ".join(line), flush=True)


# (what a probe's --seeds are, a pattern each must match, the default)
RANDOM_FORM = ("random instances SEED:NVME (integers)", r"\d+:\d+", ["7:1", "8:1", "9:1", "8:0", "11:0"])
VARIED_FORM = ("varied seeds (non-negative integers)", r"\d+", [str(seed) for seed in range(40)])
SEARCH_FORM = ("'random' or varied seeds (non-negative integers)", r"random|\d+", ["random"])
SEED_FORMS = {"seeds": RANDOM_FORM, "root": RANDOM_FORM, "varied": VARIED_FORM, "varied-lps": VARIED_FORM,
              "kept": VARIED_FORM,
              "search": SEARCH_FORM, "polish": SEARCH_FORM, "timeline": SEARCH_FORM}


def checked_seeds(ap, probe: str, given):
    """``given`` (the --seeds) for ``probe``, or its default; a clear error where one is not of the
    probe's form (``SEED_FORMS``; shapes, shape-lps and pair-lps take any label substring, none:
    every shape)."""
    form = SEED_FORMS.get(probe)
    if form is None:
        return given if given is not None else []
    what, pattern, default = form
    if given is None:
        return list(default)
    for spec in given:
        if not re.fullmatch(pattern, spec):
            ap.error(f"--seeds {spec!r}: {probe} takes {what}")
    return given


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probe", choices=["lps", "groups", "cbc", "windows", "seeds", "root", "varied", "varied-lps", "kept",
                                          "search", "polish", "shapes", "shape-lps", "pair-lps", "lp-paths", "leftover",
                                          "builds", "timeline"])
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--depths", type=int, nargs=2, default=(2, 1))
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--time-limit", type=float, default=None, help="cbc: 120 s; varied, timeline: milp.solve's, 20 s")
    ap.add_argument("--seeds", nargs="+", default=None, help="instances to run (their form and default by probe: above)")
    ap.add_argument("--no-preprocess", action="store_true")
    args = ap.parse_args()
    args.seeds = checked_seeds(ap, args.probe, args.seeds)
    {"lps": lps, "groups": groups, "cbc": cbc, "windows": windows, "seeds": seeds, "root": root, "varied": varied,
     "varied-lps": varied_lps, "kept": kept, "search": search_time, "polish": polish_time, "shapes": shapes, "shape-lps": shape_lps, "pair-lps": pair_lps,
     "lp-paths": lp_paths, "builds": builds, "timeline": timeline,
     "leftover": leftover}[args.probe](args)


if __name__ == "__main__":
    main()
