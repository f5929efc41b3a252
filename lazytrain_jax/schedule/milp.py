"""The MILP (python-mip, CBC): the step-time-optimal plan for one Costs (batch, seq, micro-batches).

Variables (L layers, S = max segment length, K = max resident tail):

- x[s,e] ∈ {0,1}, 0 ≤ s < e ≤ L, e − s ≤ S: boundaries s and e kept, the ones between dropped
  (LazyTrain's edges). Flow: one edge leaves 0, one enters L, inflow = outflow at every other
  boundary, so the kept edges form one path 0 → L. kept_i = Σ_e x[i,e], drop_i = 1 − kept_i.
- dev_i, host_i, nvme_i ∈ {0,1}, dev + host + nvme = kept_i (interior boundaries; 0 and L on device).
- res_l ∈ {0,1}: keep layer l's interior residuals (backward without in-layer recompute).
- r_l ∈ {0,1} for the last K layers, r_l ≤ r_{l+1}: resident tail (k = Σ r).
- u[s,e] ≥ x[s,e] + off_s − 1 and v[s,e] ≥ x[s,e] + nvme_s − 1 (≥ 0, continuous): the base of
  segment (s,e) is offloaded / on NVMe (products linearised; minimisation makes them tight).
- p, q ≤ both factors: products of "dropped"/edge and "resident" (enter with a minus sign).
- T_w ≥ each channel's load / rate in window w (continuous), for every window whose loads depend
  on the decisions; windows with constant loads add their max to the objective directly.

Windows and loads are exactly ``timing.py``'s (see its docstring); the recompute window of layer
j exists iff drop_{j+1}. Objective: Σ_w T_w + constants = the predicted step time (pipelined
optimizer). Memory: ``memory.py``'s peak, linearised with ws ≥ working set of each chosen segment.

The number of micro-batches and the batch size are enumerated outside (each changes Costs); the
resident tail is inside. Model size is O(L·S) variables and constraints.

Solving (what makes 128 layers take seconds, not minutes): the products u, v are disaggregated
(u ≤ x, Σ_e u[s,e] = off_s, Σ_e v[s,e] = nv_s: exactly one edge leaves a kept boundary) and the
device tier is a continuous slack (dev = kept − host − nvme), which tightens the LP and removes L
binaries. The LP bound is then within ~0.5% of the optimum on the 27B shapes, but its solution is
fractional and symmetric over identical layers (every boundary dropped by a few percent), so CBC's
rounding heuristics find good incumbents slowly. ``search.heuristic_plan`` (greedy construction +
local search on exact incremental re-implementations of the timing and memory models) provides
the start; when the root LP bound already proves it within ``rel_gap`` the solve stops there
(the conclusion CBC would reach at its root, without its seconds of preprocessing), otherwise CBC
branches from it. With ``rel_gap=0`` CBC always runs (the exhaustive tests).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import mip

TIGHT = True

from lazytrain_jax.schedule import memory, search
from lazytrain_jax.schedule.plan import Plan


def solve(costs, hardware, *, max_segment_length: int = 8, max_resident_tail: int = 8,
          time_limit_s: float = 30.0, rel_gap: float = 1e-4, warm_start: Plan | None = None,
          objective: str = "time", cutoff: float | None = None, relax: bool = False,
          heuristic_budget_s: float = 0.3, verbose: bool = False) -> Plan | float | None:
    """Solves the planning MILP for ``costs`` on ``hardware``.

    Args:
      costs: Costs (batch, seq and micro-batches fixed); hardware: Hardware (budgets, rates).
      max_segment_length: longest recompute segment (edges (s, e) with e − s ≤ this).
      max_resident_tail: largest resident tail considered.
      time_limit_s: CBC time limit; the incumbent is returned with its gap when it is reached.
      rel_gap: relative optimality gap at which CBC stops.
      warm_start: a Plan inside the decision space to start from (e.g. the best heuristic).
      objective: ``time`` (predicted step time) or ``memory`` (minimum peak device bytes, ignoring
        the device budget: used to report what would be feasible).
      cutoff: only plans with an objective below this are of interest (None when there is none).
      relax: solve only the LP relaxation and return its objective (a lower bound), inf if infeasible.
    Returns:
      The optimal (or best found) Plan, or None when no plan fits the budgets (or beats ``cutoff``).
    Example:
      >>> plan = solve(costs, Hardware.preset("h800"))
    """
    t0 = time.perf_counter()
    L = costs.num_layers
    S = max(1, min(max_segment_length, L))
    K = max(0, min(max_resident_tail, L))
    A = costs.boundary_bytes
    W = [costs.weight_bytes[l + 1] for l in range(L)]
    G = [costs.grad_bytes[l + 1] for l in range(L)]
    fwd = [costs.fwd_time[l + 1] for l in range(L)]
    bwd = [costs.bwd_time[l + 1] for l in range(L)]
    bwd_rc = [costs.bwd_recompute_time[l + 1] for l in range(L)]
    R = costs.residual_bytes
    h2d, d2h, nr, nw = hardware.h2d_bw, hardware.d2h_bw, hardware.nvme_read_bw, hardware.nvme_write_bw
    opt = [p / hardware.host_opt_rate for p in costs.num_params]
    a_max = max(A)
    const_mem = memory.constant_bytes(costs, hardware)
    base_mem = sum(const_mem.values())
    budget = hardware.device_memory
    slack = budget - base_mem

    m = mip.Model(sense=mip.MINIMIZE, solver_name="CBC")
    m.verbose = 1 if verbose else 0
    m.threads = 1
    xs = mip.xsum
    x = {(s, e): m.add_var(var_type=mip.BINARY) for s in range(L) for e in range(s + 1, min(L, s + S) + 1)}
    out_edges = {i: [] for i in range(L + 1)}
    in_edges = {i: [] for i in range(L + 1)}
    for (s, e), var in x.items():
        out_edges[s].append(var)
        in_edges[e].append(var)
    m += xs(out_edges[0]) == 1
    m += xs(in_edges[L]) == 1
    for i in range(1, L):
        m += xs(in_edges[i]) == xs(out_edges[i])
    kept = {i: xs(out_edges[i]) for i in range(L)}
    kept[L] = 1

    def drop(i):
        return 1 - kept[i]

    host_ok = [1 <= i <= L - 1 and A[i] <= hardware.host_memory for i in range(L + 1)]
    nvme_ok = [1 <= i <= L - 3 and A[i] <= hardware.nvme_memory and 2 * a_max <= hardware.host_memory
               for i in range(L + 1)]
    dev, host, nv = {}, {}, {}
    for i in range(1, L):
        dev[i] = m.add_var(var_type=mip.CONTINUOUS if TIGHT else mip.BINARY, ub=1.0)
        terms = [dev[i]]
        if host_ok[i]:
            host[i] = m.add_var(var_type=mip.BINARY)
            terms.append(host[i])
        if nvme_ok[i]:
            nv[i] = m.add_var(var_type=mip.BINARY)
            terms.append(nv[i])
        m += xs(terms) == kept[i]
    u, v = {}, {}
    for (s, e), var in x.items():
        if s in host or s in nv:
            u[s, e] = m.add_var(lb=0.0)
            m += u[s, e] >= var + xs([t[s] for t in (host, nv) if s in t]) - 1
            if TIGHT:
                m += u[s, e] <= var
        if s in nv:
            v[s, e] = m.add_var(lb=0.0)
            m += v[s, e] >= var + nv[s] - 1
            if TIGHT:
                m += v[s, e] <= u[s, e]
    if TIGHT:
        # exactly one edge leaves a kept boundary: the products sum to the tier indicator
        for s in set(host) | set(nv):
            m += xs(uu for (s2, _), uu in u.items() if s2 == s) == xs([t[s] for t in (host, nv) if s in t])
        for s in nv:
            m += xs(vv for (s2, _), vv in v.items() if s2 == s) == nv[s]
    res = {l: m.add_var(var_type=mip.BINARY) for l in range(L) if R[l] <= slack and bwd_rc[l] > bwd[l]}
    r = {l: m.add_var(var_type=mip.BINARY) for l in range(L - K, L) if W[l] <= slack}
    for l in r:
        if l + 1 in r:
            m += r[l] <= r[l + 1]
        elif l + 1 < L:
            m += r[l] == 0  # a layer can only be resident if every later layer is

    def w_res(l, indicator):
        """W'_l · indicator (weights not uploaded when l is resident), linear."""
        if l not in r:
            return W[l] * indicator
        p = m.add_var(lb=0.0)
        m.add_constr(p <= indicator)
        m.add_constr(p <= r[l])
        return W[l] * indicator - W[l] * p

    def gprev(e):
        return costs.grad_bytes[-1] if e == L else G[e]

    def first(s, e):
        return s if e - s >= 2 else e - 1

    objective_const = 0.0
    T = []

    def window(compute=0.0, up=0.0, down=0.0, read=0.0, write=0.0, optim=0.0):
        nonlocal objective_const
        loads = [(compute, 1.0), (up, h2d), (down, d2h), (read, nr), (write, nw), (optim, 1.0)]
        variable = [(ld, rate) for ld, rate in loads if not isinstance(ld, (int, float))]
        consts = [ld / rate for ld, rate in loads if isinstance(ld, (int, float))]
        if not variable:
            objective_const += max(consts)
            return
        t = m.add_var(lb=max(consts))
        for ld, rate in variable:
            m.add_constr(t >= ld * (1.0 / rate))
        T.append(t)

    # tail and forward
    window(optim=opt[0])                                    # P0 (pipelined)
    window(up=costs.weight_bytes[0], optim=opt[1])          # P1
    window(compute=costs.fwd_time[0], up=W[0], optim=opt[2] if L >= 2 else opt[L + 1])  # FE
    for l in range(L):
        up = W[l + 1] if l + 1 < L else costs.weight_bytes[-1]
        down = A[l] * xs([t[l] for t in (host, nv) if l in t]) if l >= 1 and (l in host or l in nv) else 0.0
        write = A[l - 1] * nv[l - 1] if l - 1 in nv else 0.0
        read = xs(A[s] * v[s, L] for s in range(L) if (s, L) in v) if l == L - 1 else 0.0
        optim = opt[l + 3] if l + 3 <= L + 1 else 0.0
        if isinstance(read, mip.LinExpr) and not read.expr:
            read = 0.0
        window(compute=fwd[l], up=up, down=down, read=read, write=write, optim=optim)

    def prefetch_for_segment_top(e):
        """H2D to prefetch the first item of the segment ending at e (and its offloaded base)."""
        terms = []
        for s in range(max(0, e - S), e):
            f = first(s, e)
            terms.append(w_res(f, x[s, e]))
            if (s, e) in u:
                terms.append(A[s] * u[s, e])
        return xs(terms)

    read_fh = [A[s] * v[s, L - 1] for s in range(L) if (s, L - 1) in v]
    window(compute=costs.fwd_time[-1], up=prefetch_for_segment_top(L), read=xs(read_fh) if read_fh else 0.0)  # FH
    # recompute windows (active iff drop_{j+1})
    for j in range(L - 1):
        down = xs(gprev(e) * x[j, e] for e in range(j + 2, min(L, j + S) + 1))
        window(compute=fwd[j] * drop(j + 1), up=w_res(j + 1, drop(j + 1)), down=down if j + 2 <= min(L, j + S) else 0.0)
    # backward windows
    for l in range(L - 1, -1, -1):
        compute = bwd_rc[l] - (bwd_rc[l] - bwd[l]) * res[l] if l in res else bwd_rc[l]
        up = (w_res(l - 1, drop(l)) + prefetch_for_segment_top(l)) if l >= 1 else 0.0
        if l + 1 == L:
            down = gprev(L) * x[L - 1, L]
        else:
            down = gprev(l + 1) * (drop(l + 1) + x[l, l + 1])
        read_terms = [A[s] * v[s, l - 1] for s in range(L) if (s, l - 1) in v] if l >= 2 else []
        window(compute=compute, up=up, down=down, read=xs(read_terms) if read_terms else 0.0)
    window(compute=costs.bwd_time[0], down=G[0] + costs.grad_bytes[0])  # BE

    # memory
    ws = m.add_var(lb=0.0)
    for (s, e), var in x.items():
        if e - s >= 2:
            m += ws >= sum(A[s + 1:e]) * var + (A[s] * u[s, e] if (s, e) in u else 0)
    device_terms = [A[i] * dev[i] for i in dev] + [R[l] * res[l] for l in res] + [W[l] * r[l] for l in r] + [ws]
    peak = base_mem + xs(device_terms)
    if host:
        any_nv = m.add_var(var_type=mip.BINARY) if nv else None
        for i in nv:
            m += any_nv >= nv[i]
        m += xs(A[i] * host[i] for i in host) + (2 * a_max * any_nv if nv else 0) <= hardware.host_memory
    if nv:
        m += xs(A[i] * nv[i] for i in nv) <= hardware.nvme_memory

    if objective == "memory":
        m.objective = mip.minimize(peak)
    elif objective == "time":
        m += peak <= budget
        m.objective = mip.minimize(xs(T) + objective_const)
    else:
        raise ValueError(f"objective={objective!r}; valid: ['time', 'memory']")
    found = None
    if objective == "time" and not relax and heuristic_budget_s > 0:
        found = search.heuristic_plan(costs, hardware, max_segment_length=S, max_resident_tail=K,
                                      time_budget_s=heuristic_budget_s, starts=[warm_start])
        if found is not None and (warm_start is None
                                  or found.predicted_step_time_s <= warm_start.predicted_step_time_s):
            warm_start = found
    start = _start_values(warm_start, x, dev, host, nv, res, r) if warm_start is not None else []
    if start:
        m.start = start
    if relax or (found is not None and rel_gap > 0):
        with _quiet_stdout():
            status = m.optimize(relax=True)
        ok = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
        lp_bound = float(m.objective_value) if ok else float("inf")
        if relax:
            return lp_bound
        if cutoff is not None and lp_bound >= cutoff:
            return None  # no plan of this space beats the cutoff
        value = found.predicted_step_time_s
        if found is warm_start and start and (cutoff is None or value < cutoff) and value - lp_bound <= rel_gap * value:
            # the root LP bound already proves the search's plan within rel_gap: what CBC would
            # conclude at its root, without its preprocessing (seconds at 100+ layers)
            return found.replace(name="milp", solver_status="optimal", gap=max(0.0, (value - lp_bound) / value),
                                 solve_time_s=time.perf_counter() - t0)
    if cutoff is not None:
        m.cutoff = cutoff
    m.max_mip_gap = rel_gap
    m.max_mip_gap_abs = 1e-9
    with (contextlib.nullcontext() if verbose else _quiet_stdout()):
        status = m.optimize(max_seconds=time_limit_s)
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return None
    tiers = ["device"] * (L + 1)
    for i in range(1, L):
        if kept_value(out_edges[i]) < 0.5:
            tiers[i] = "drop"
        elif i in host and host[i].x > 0.5:
            tiers[i] = "host"
        elif i in nv and nv[i].x > 0.5:
            tiers[i] = "nvme"
    keep = [l in res and res[l].x > 0.5 for l in range(L)]
    k = sum(1 for l in r if r[l].x > 0.5)
    plan = Plan.create(costs, hardware, name="milp", boundary_tiers=tiers, keep_residuals=keep, resident_tail=k,
                       solver_status=status.name.lower(), solve_time_s=time.perf_counter() - t0)
    # CBC's objective value can sit slightly below the exact model's value of its own solution
    # (tolerances): the gap is measured from the plan's own value to the lower of CBC's bound and value.
    own = plan.predicted_step_time_s if objective == "time" else plan.predicted_peak_device_bytes
    lower = min(m.objective_bound, m.objective_value)
    return plan.replace(gap=max(0.0, (own - lower) / own) if own > 0 else 0.0)


def kept_value(edges) -> float:
    return sum(var.x for var in edges)


def _start_values(plan, x, dev, host, nv, res, r):
    """Variable values of ``plan`` for mip's warm start, or [] if it is outside the MILP's space."""
    L = plan.num_layers
    tiers = plan.boundary_tiers
    start = []
    chosen = set(memory.segments(tiers))
    if any(edge not in x for edge in chosen):
        return []
    for edge, var in x.items():
        start.append((var, 1.0 if edge in chosen else 0.0))
    for i in range(1, L):
        t = tiers[i]
        if (t == "host" and i not in host) or (t == "nvme" and i not in nv):
            return []
        start.append((dev[i], 1.0 if t == "device" else 0.0))
        if i in host:
            start.append((host[i], 1.0 if t == "host" else 0.0))
        if i in nv:
            start.append((nv[i], 1.0 if t == "nvme" else 0.0))
    for l, var in res.items():
        start.append((var, 1.0 if plan.keep_residuals[l] else 0.0))
    if any(plan.keep_residuals[l] and l not in res for l in range(L)):
        return []
    for l, var in r.items():
        start.append((var, 1.0 if l >= L - plan.resident_tail else 0.0))
    if plan.resident_tail and any(l not in r for l in range(L - plan.resident_tail, L)):
        return []
    return start


@contextlib.contextmanager
def _quiet_stdout():
    """CBC's LP relaxation prints to the C-level stdout even with verbose=0: silence fd 1."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)
