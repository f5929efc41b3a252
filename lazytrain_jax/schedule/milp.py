"""The MILP (written with ``linear``'s expressions, python-mip's arithmetic; solved by HiGHS, or by
python-mip's CBC for small models): the step-time-optimal plan for one Costs (batch, seq,
micro-batches).

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

Windows and loads are exactly the step model's (``steps.py``); the recompute window of layer
j exists iff drop_{j+1}. Prefetch depth 2 (weights and/or host activations) adds split variables:
a window's upload for the item after it may be done partly in the window before it
(``pre`` ≥ 0, at most the upload; in the backward the window before is decided by the segments, so
each candidate's share is bounded by its indicator — a sum of edge variables — times the most that
window uploads when that candidate precedes it). With these splits
the LP reaches the step model's earliest-deadline-first value. Each depth pair is one MILP (the
memory's constant part depends on it); ``solve`` tries (1, 1) first and the others while their LP
bound can still beat the best plan. Objective: Σ_w T_w + constants = the predicted step time
(pipelined optimizer). Memory: ``memory.py``'s peak, linearised with ws ≥ working set of each
chosen segment.

The number of micro-batches and the batch size are enumerated outside (each changes Costs); the
resident tail is inside. Model size is O(L·S) variables and constraints.

Solving (what makes 128 layers take seconds, not minutes): the products u, v are disaggregated
(u ≤ x, Σ_e u[s,e] = off_s, Σ_e v[s,e] = nv_s: exactly one edge leaves a kept boundary) and the
device tier is a continuous slack (dev = kept − host − nvme), which tightens the LP and removes L
binaries. Valid inequalities raise the LP bound where the memory budget is tight (a 64-layer
27B-like instance at 45 GB, depths (1, 1): 28.53 → 28.68 s, the best plan 28.81 s): (i) the path
crosses every gap (i, i + 1) on exactly one edge, so the working set ws is at least the sum of the
working sets of the edges crossing a gap (not only each one's); (ii) one binary per segment length
n (some segment is at least n long) with ws ≥ the least working set of a segment of that length;
(iii) Chvátal–Gomory rounding of the host and NVMe knapsacks (``_rounded_knapsack``; on the
device knapsack it added little and tripled the LP's time at 128 layers); (iv) hull cuts on a
window's binary-triggered loads, T ≥ base + (load − base)⁺·z (a boundary's copy down or NVMe write,
an NVMe read, a residual's copy down and its fetch), and in a backward window whose compute depends
on its layer's kept residuals, the same from the base without them, T ≥ base0 − (base0 − base)·res
+ (load − base0)⁺·z; a fetch that depth 2 may spread over two windows gets the cut on their sum
(and, in the union relaxation, depth 1's cut in its own window less y_a times its reach); (v) case cuts: a
backward window's loads depend on which segment ends at it, a recompute window's on which edge
covers its dropped boundary, and exactly one case holds, so T ≥ Σ_case (the window's least length
in that case) · its indicator (the LP otherwise averages the cases' loads before taking the max
over channels; on random host-only instances this raised the depth LPs by 1-1.5 %). A backward
window's (and the head's forward's) cases carry the next segment's base with its weights (same
link; only what no depth-2 split moves); a resident-tail layer's case gets p ≤ ind, p ≤ r that
takes the weights' share off; and two of a window's case families at once (weights and base,
gradients down, an NVMe read, a residual fetch) give T ≥ C_P + Σ_Q (C_q − max C_P)⁺·z_q (varied
seed 0, 32 layers, depths (1, 1): the LP from 9.382 to 9.885 s against a 10.094 s plan).
Without the fetch cuts the LP fetched a fraction of every residual into each backward window's idle
upload time (llama3-8b, 64 layers: 1.6 % below the plan; 0.14-0.5 % with them). (vi) Share rows:
the uploads of a resident-tail layer's weights of which at most one is made in any plan (decided
by its own boundary, or by the one above) have resident shares summing to at most its r, in the
windows' loads and in the case cuts; without them a layer resident in part counted as resident in
every fractional case at once (varied seed 35, 128 layers, depths (2, 1): 30.950 -> 31.051 s).
(vii) Coefficient tightening of the rows that bound one window's time from below
(``_tighten_window_rows``, what a MIP presolve does with them): every window lasts at least its
floor (the most any of its rows asks at every point), so a binary's term in one of its rows counts
only for what it lifts that row above the floor (varied seed 3, 128 layers: the union LP 32.979 ->
33.229 s against a 33.375 s plan, which it then proves where HiGHS' roots took 1.5 s).
The memory rows are written in units of the largest boundary, weight or residual: in bytes, CLP
returned LP values above the optimum once the aggregated rows were added.
The LP bound is then within ~0.5% of the optimum on the 27B shapes, but its solution is
fractional and symmetric over identical layers (every boundary dropped by a few percent), so CBC's
rounding heuristics find good incumbents slowly. ``search.heuristic_plan`` (greedy construction +
local search on exact incremental re-implementations of the timing and memory models) provides
the start; when the root LP bound already proves it within ``rel_gap`` the solve stops there
(the conclusion CBC would reach at its root, without its seconds of preprocessing). The one LP for
every depth pair is tried first, against the best of the search's plans for each pair and then
that plan polished at its own depths. Otherwise every
depth pair first gets its LP, the search for its depths (its model plays them) and local search on
the step model at those depths (``search.polish``) and, if still unproved,
the best boundary tiers for that plan's path and residuals (``_tier_neighbourhood``: the same
model with everything else fixed, a few hundred nodes of CBC), then more residuals kept, each
with the tiers that make its room (``_residual_neighbourhood``), and CBC branches only
afterwards, for the pairs whose LP still leaves room below the best plan any of them gave. With
``rel_gap=0`` CBC always runs (the exhaustive tests). Large models (from ``HIGHS_MIP_MIN_NONZEROS``
nonzeros, about 22 layers; ``MIP_SOLVER``) branch with HiGHS' branch and cut (scipy's ``milp``)
instead, and skip the depth pairs' cheap part. Where the union LP (solved by HiGHS, so that its
solution is at hand) does not prove the union phase's plan, the LP's solution is used first:
it is rounded at the depth pair the LP leans to (``_leaning``) and the rounding fitted and
improved by the search's local search (``search.round_relaxation``, ``_Solve.round_union``: tenths
of a second); where neither the union LP nor the first bounds of its depth split (below) prove that
plan, ``_rens`` fixes every binary decision the LP takes whole and solves the rest exactly at that
depth pair, and the union LP is split on the weight prefetch depth
(``_depth_split``: two LPs in parallel, each by dual simplex from the union LP's vertex
(``_hot_lp``), one bound per half of the depth pairs; a half whose dual simplex reaches its
iteration cap gives at once the bound its row duals give there (``_dual_bound``), which proves a
plan without waiting for that half's LP from scratch; and ``_rens`` again from the solution of a
half that leaves room: from its interior point again where its vertex gave a far plan,
``_Solve.rens_from_interior``). Where the LP offloads most layers' residuals in part,
``_offload_pattern`` fixes the offloads at their systematic rounding (every other layer at 0.5
each) and solves the rest. More than ``NEIGHBOURHOODS_FIRST_GAPS`` rel_gaps from the union LP all
this comes before the searches at the other depth pairs (far from it, ``UNION_SEARCH_GAPS``, they
are skipped), near it after them (and after each depth pair's own LP, where the union LP takes the
activation depth and the residuals' staging in part: ``_Solve.pair_lps``); where no start fits,
``_rens`` gives the first plan. A half of the union LP that keeps part of a resident-tail layer
is split on the number of resident layers (``_tail_split``: each count's LP by dual simplex,
stopped once its bound passes the plan's ``rel_gap`` bar), right after the first neighbourhood
and again before the roots. Still unproved, HiGHS'
root alone runs on each half of the union model the split left open (``_half_roots``: the weight
prefetch depth fixed, both halves in parallel), asked only for a plan ``rel_gap`` faster (than the
caller's cutoff, where the plan in hand misses it): where none exists the half's depth pairs are
ruled out. Where one half is open, or the depth pairs' own LPs leave one pair open in each, the
roots run on those pairs' own models instead (``_pair_roots``), and a plan one of them finds is
kept (``_Solve.settle``; between
``NEIGHBOURHOODS_FIRST_GAPS`` and ``UNION_SEARCH_GAPS`` before the searches, which then run only
where the roots leave the plan unproved). Then each depth pair's LP (two in parallel)
prunes it; a pair it does not is tried with ``_rens``, ``_rins`` (the best plan and the pair's
LP agreeing, fixed), HiGHS' root on the pair's own model with the same cutoff and
``_window_neighbourhood`` (32 consecutive layers re-routed) before HiGHS' whole branch and cut
runs on it. On the
random 128-layer NVMe instance of ``benchmarks/planner.py`` this proves a 35.81 s plan within
0.94 % of the union LP in 4.6-4.9 s; before it, HiGHS on the pairs took 17 s (35.91 s, 0.89 %)
and CBC 80 s (36.14 s, 1.65 % unproved). The reported gap is
(value − min(bound, value)) / value: never negative, whatever CBC's bound at its limits. The
LP relaxations (the bounds that prove a plan within ``rel_gap``) are solved by HiGHS' interior
point method through scipy (``_relaxed``; CLP, CBC's own LP solver, as the fallback): the same
optimum, 2-6x faster on 64-128 layers. The
code is split into ``build`` (the model), ``lp_bound`` (its relaxation), ``solve`` (``_Solve``: the
union phase, the depth phase, ``branch`` on one depth pair and the result) and ``decode``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import itertools
import math
import operator
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings

import mip

from lazytrain_jax.schedule import linear, memory, search, steps
from lazytrain_jax.schedule.bounds import lower_bound
from lazytrain_jax.schedule.plan import Plan

DEFAULT_REL_GAP = 1e-2
DEFAULT_MAX_NODES = 300
MILP_DEPTHS = ((1, 1), (2, 1), (1, 2), (2, 2))   # (weight_prefetch_depth, act_prefetch_depth)


class _Model(linear.Model):
    """The planner's model (``linear.Model``: held here, read by HiGHS as arrays, written into
    python-mip's CBC only where CBC or CLP solves it), with the rows that only tighten its bound
    marked (``bound_rows``: their indices into ``rows``) and ``_highs_arrays``' reads of the rows
    kept (``arrays_kept``)."""

    def __init__(self, verbose: bool = False):
        super().__init__(verbose)
        self.bound_rows = set()
        self.arrays_kept = {}

    def add_bound_row(self, lin_expr):
        """A valid inequality that every plan meets and only the LP bound needs: the neighbourhoods'
        sub-MIPs, which look for plans, leave it out (``_highs_arrays(..., bound_rows=False)``)."""
        self.bound_rows.add(len(self.rows))
        self.add_constr(lin_expr)


@dataclasses.dataclass
class Built:
    """A built MILP: the model (``_Model``) and the decision variables ``decode`` reads."""

    model: _Model
    x: dict
    out_edges: dict
    dev: dict
    host: dict
    nv: dict
    res: dict
    off: dict
    r: dict
    objective_const: float
    weight_prefetch_depth: int
    act_prefetch_depth: int
    num_layers: int
    res_max: linear.Var | None = None   # the largest residual on the host (memory rows' units), if any may go there
    res_floor: float = 0.0           # the least of those residuals, in the same units
    solved: "Solved | None" = None   # the last CBC run's result (``_optimize``)
    depth_indicators: tuple | None = None  # the union relaxation's (y_w, y_a) variables


@dataclasses.dataclass
class Solved:
    """What a CBC run on a Built's model found: its status, objective value and bound, and every
    variable's value by index (None without a solution)."""

    status: mip.OptimizationStatus
    objective_value: float | None
    objective_bound: float
    values: list | None

    def value(self, var) -> float:
        return self.values[var.idx]


def _relation(lhs, rhs, sense: str) -> linear.LinExpr:
    """``lhs >= rhs`` (sense ">"), ``<=`` ("<") or ``==`` ("=") as python-mip writes it (lhs − rhs
    with that sense; lhs a variable or an expression, rhs either or a number): the same row, each
    coefficient computed as mip computes it, without the expressions mip copies on the way. (Not
    for one variable on both sides, which mip writes as its last term alone: no row of the model.)"""
    if isinstance(lhs, linear.Var):
        if not isinstance(rhs, (linear.Var, linear.LinExpr)):
            return linear.LinExpr.of({lhs: 1}, -1 * rhs, sense)
        expr, const = {lhs: 1}, 0.0
    else:
        expr, const = dict(lhs.expr), lhs.const
    if isinstance(rhs, linear.Var):
        expr[rhs] = expr.get(rhs, 0) + -1
    elif isinstance(rhs, linear.LinExpr):
        const += rhs.const * -1
        get = expr.get
        for var, c in rhs.expr.items():
            expr[var] = get(var, 0) + c * -1
    else:
        const += -rhs
    return linear.LinExpr.of(expr, const, sense)


def _ge(lhs, rhs) -> linear.LinExpr:
    return _relation(lhs, rhs, ">")


def _le(lhs, rhs) -> linear.LinExpr:
    return _relation(lhs, rhs, "<")


def _eq(lhs, rhs) -> linear.LinExpr:
    return _relation(lhs, rhs, "=")


def _scaled_sum(terms) -> linear.LinExpr:
    """``mip.xsum(c * t for c, t in terms)`` (each t a variable, an expression or a number): the
    same expression, each coefficient computed and summed as mip computes them, without the
    expression mip makes for each product (``build``'s busiest sums use it)."""
    expr, const = {}, 0.0
    get = expr.get
    for coeff, term in terms:
        if isinstance(term, linear.Var):
            expr[term] = get(term, 0) + coeff
        elif isinstance(term, linear.LinExpr):
            const += term.const * coeff
            for var, c in term.expr.items():
                expr[var] = get(var, 0) + c * coeff
        else:
            const += coeff * term
    return linear.LinExpr.of(expr, const)


def build(costs, hardware, *, max_segment_length: int = 8, max_resident_tail: int = 8,
          weight_prefetch_depth: int = 1, act_prefetch_depth: int = 1, objective: str = "time",
          union: bool = False, residual_offload: bool = True, case_cuts: bool = True,
          share_rows: bool = True, tighten_rows: bool = True, verbose: bool = False) -> Built:
    """The planning MILP for ``costs`` on ``hardware`` at fixed prefetch depths (see the module docstring).

    Args:
      costs, hardware: the problem; max_segment_length, max_resident_tail: the decision space;
      weight_prefetch_depth, act_prefetch_depth: 1 or 2; objective: ``time`` or ``memory``.
      union: a relaxation of every depth pair at once (only for its LP bound): the memory and the
        optimizer deadlines of depth 1, plus, per prefetch kind, a relaxed depth indicator y that
        bounds the depth-2 upload splits (each at most y of its share), adds y of the deeper buffer's
        bytes and moves the deadlines y of the way to depth 2's (each depth pair is a point y ∈ {0, 1});
        its case cuts are every depth pair's, each shallower pair's less y times its reach, so that
        at y = (0, 0) it is depth (1, 1)'s LP with its cuts.
      residual_offload: whether kept residuals may go to the host (``Plan.offload_residuals``).
      case_cuts: add the windows' case cuts and the residual fetch cuts over several windows (valid
        inequalities; off only to measure what they add).
      share_rows: add the rows that bound a resident-tail layer's shares of uploads that exclude
        each other by its r (valid inequalities; off only to measure what they add).
      tighten_rows: tighten the binaries' coefficients in the rows that bound one window's time
        from below by that window's floor (``_tighten_window_rows``; the same plans, each at the
        same time; off only to measure what it adds).
    Returns:
      A Built (the model and its variables).
    Example:
      >>> b = build(costs, Hardware.preset("h800")); b.model.mip_model().optimize()
    """
    if objective not in ("time", "memory"):
        raise ValueError(f"objective={objective!r}; valid: ['time', 'memory']")
    for name, value in (("weight_prefetch_depth", weight_prefetch_depth), ("act_prefetch_depth", act_prefetch_depth)):
        if value not in (1, 2):
            raise ValueError(f"{name}={value!r}: the MILP handles depths 1 and 2")
    dw, da = weight_prefetch_depth, act_prefetch_depth
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
    opt = steps.unit_opt_times(costs, hardware)
    if union:
        dw = da = 2
    const_mem = memory.constant_bytes(costs, hardware, weight_prefetch_depth=1 if union else dw,
                                      act_prefetch_depth=1 if union else da)
    base_mem = sum(const_mem.values())
    budget = hardware.device_memory
    slack = budget - base_mem

    m = _Model(verbose=verbose)
    xs = linear.xsum
    # the union relaxation's depth indicators (y = 1: depth 2), relaxed: a depth-2 split may use at
    # most y of a window's upload and costs y of the deeper buffer's bytes, and the optimizer's
    # deadlines move y of the way to depth 2's earlier ones (each depth pair is the point y ∈ {0, 1})
    y_w = m.add_var(lb=0.0, ub=1.0) if union else None
    y_a = m.add_var(lb=0.0, ub=1.0) if union else None
    x = {(s, e): m.add_var(var_type=mip.BINARY) for s in range(L) for e in range(s + 1, min(L, s + S) + 1)}
    out_edges = {i: [] for i in range(L + 1)}
    in_edges = {i: [] for i in range(L + 1)}
    for (s, e), var in x.items():
        out_edges[s].append(var)
        in_edges[e].append(var)
    m.add_constr(_eq(xs(out_edges[0]), 1))
    m.add_constr(_eq(xs(in_edges[L]), 1))
    for i in range(1, L):
        m.add_constr(_eq(xs(in_edges[i]), xs(out_edges[i])))
    kept = {i: xs(out_edges[i]) for i in range(L)}
    kept[L] = 1

    def drop(i):
        return 1 - kept[i]

    opts = {i: steps.tier_options(costs, hardware, i) for i in range(1, L)}
    dev, host, nv = {}, {}, {}
    for i in range(1, L):
        dev[i] = m.add_var(ub=1.0)  # continuous: dev = kept - host - nvme
        terms = [dev[i]]
        if "host" in opts[i]:
            host[i] = m.add_var(var_type=mip.BINARY)
            terms.append(host[i])
        if "nvme" in opts[i]:
            nv[i] = m.add_var(var_type=mip.BINARY)
            terms.append(nv[i])
        m.add_constr(_eq(xs(terms), kept[i]))
    u, v = {}, {}
    for (s, e), var in x.items():
        if s in host or s in nv:
            u[s, e] = m.add_var(lb=0.0)
            m.add_constr(_ge(u[s, e], var + xs([t[s] for t in (host, nv) if s in t]) - 1))
            m.add_constr(_le(u[s, e], var))
        if s in nv:
            v[s, e] = m.add_var(lb=0.0)
            m.add_constr(_ge(v[s, e], var + nv[s] - 1))
            m.add_constr(_le(v[s, e], u[s, e]))
    # exactly one edge leaves a kept boundary: the products sum to the tier indicator
    u_from, v_from = {}, {}
    for (s, _), uu in u.items():
        u_from.setdefault(s, []).append(uu)
    for (s, _), vv in v.items():
        v_from.setdefault(s, []).append(vv)
    for s in set(host) | set(nv):
        m.add_constr(_eq(xs(u_from.get(s, [])), xs([t[s] for t in (host, nv) if s in t])))
    for s in nv:
        m.add_constr(_eq(xs(v_from.get(s, [])), nv[s]))
    res = {l: m.add_var(var_type=mip.BINARY) for l in range(L) if R[l] <= slack and bwd_rc[l] > bwd[l]}
    # off_l: layer l's kept residuals live on the host (down after F_l, fetched back before B_l)
    off = {l: m.add_var(var_type=mip.BINARY) for l in res
           if residual_offload and steps.residual_offload_allowed(l, L) and R[l] <= hardware.host_memory}
    for l in off:
        m.add_constr(_le(off[l], res[l]))
    r = {l: m.add_var(var_type=mip.BINARY) for l in range(L - K, L) if W[l] <= slack}
    for l in r:
        if l + 1 in r:
            m.add_constr(_le(r[l], r[l + 1]))
        elif l + 1 < L:
            m.add_constr(_eq(r[l], 0))  # a layer can only be resident if every later layer is

    # (layer l, group) -> the shares p of uploads of a resident-tail layer's weights of which at most
    # one is made in any plan, so that their shares sum to at most r_l: "own", decided by boundary
    # l (dropped: in RC_{l-1}; kept: at the top of the segment (l, e), in B_e) and "above", decided
    # by boundary l + 1 (dropped: in B_{l+1}; kept by the edge (l, l + 1): at that segment's top).
    # Each share alone is only below its indicator and r_l: the LP counted a layer a twentieth
    # resident as resident in every fractional case at once (varied seed 35, 128 layers, depths
    # (2, 1): 0.165 of each tail layer resident, the LP 30.950 s; 31.240 s with none resident)
    upload_shares = {}

    def w_res(l, indicator, groups):
        """W'_l · indicator (weights not uploaded when l is resident), linear; its share in
        ``groups`` of upload_shares."""
        if l not in r:
            return W[l] * indicator
        p = m.add_var(lb=0.0)
        m.add_constr(_le(p, indicator))
        m.add_constr(_le(p, r[l]))
        for group in groups:
            upload_shares.setdefault((l, group), []).append(p)
        return W[l] * indicator - W[l] * p

    def top_groups(s, e):
        return ("own", "above") if e == s + 1 else ("own",)

    def gprev(e):
        return costs.link_grad_bytes[-1] if e == L else G[e]

    def first(s, e):
        return s if e - s >= 2 else e - 1

    def segment_top(e):
        """Uploads for the first item of the segment ending at e: (weights, host base, NVMe base)."""
        wts, hb, nb = [], [], []
        for s in range(max(0, e - S), e):
            wts.append(w_res(first(s, e), x[s, e], top_groups(s, e)))
            if (s, e) in u:
                hb.append(A[s] * u[s, e])
                if (s, e) in v:
                    hb.append(-A[s] * v[s, e])
                    nb.append(A[s] * v[s, e])
        return xs(wts), (xs(hb) if hb else 0.0), (xs(nb) if nb else 0.0)

    # windows: name -> loads; 'up_w' / 'up_a' may be split into the window before (depth 2)
    win = {}
    order = []

    def window(name, compute=0.0, up_w=0.0, up_a=0.0, up_fixed=0.0, down=0.0, read=0.0, write=0.0, optim=0.0,
               cuts=(), floor=0.0, kept=None):
        win[name] = dict(compute=compute, up_w=up_w, up_a=up_a, up_fixed=up_fixed, down=down, read=read,
                         write=write, optim=optim, pre_out=[], pre_in=[], cuts=cuts, floor=floor, kept=kept,
                         whole_fetches=[])
        order.append(name)

    # tail and forward: item positions P0=0, P1=1, FE=2, F_l=3+l, FH=L+3; update of the unit of the
    # forward item at position j in window max(0, j - dw - 1)
    # the host optimizer: one chain from the step's start; o_k seconds of it in forward window k,
    # at least the updates due by k done by then (the update of the unit at position j is due in
    # window j - dw - 1; the union relaxation takes depth 1's later deadlines, moved y_w of the way
    # to depth 2's)
    def due_by(depth):
        due = [0.0] * (L + 4)
        for j, unit in [(2, 0)] + [(3 + l, l + 1) for l in range(L)] + [(L + 3, L + 1)]:
            due[max(0, j - depth - 1)] += opt[unit]
        return [sum(due[:k + 1]) for k in range(L + 4)], due

    cum, due = due_by(1 if union else dw)
    cum2 = due_by(2)[0] if union else cum
    opt_at = [m.add_var(lb=0.0) for _ in range(L + 4)]
    for k in range(L + 4):
        if cum2[k] > cum[k]:
            m.add_constr(_ge(xs(opt_at[:k + 1]), cum[k] + (cum2[k] - cum[k]) * y_w))
        elif due[k] > 0:
            m.add_constr(_ge(xs(opt_at[:k + 1]), cum[k]))
    window("P0", optim=opt_at[0])
    window("P1", up_w=costs.weight_bytes[0], optim=opt_at[1])
    window("FE", compute=costs.fwd_time[0], up_w=W[0], optim=opt_at[2])
    for l in range(L):
        up = W[l + 1] if l + 1 < L else costs.link_weight_bytes[-1]
        down = A[l] * xs([t[l] for t in (host, nv) if l in t]) if l >= 1 and (l in host or l in nv) else 0.0
        write = A[l - 1] * nv[l - 1] if l - 1 in nv else 0.0
        read = xs(A[s] * v[s, L] for s in range(L) if (s, L) in v) if l == L - 1 else 0.0
        if isinstance(read, linear.LinExpr) and not read.expr:
            read = 0.0
        # cuts: with a binary z, T >= max(c, a z) implies T >= c + (a - c)⁺ z (the hull of the two cases)
        cuts = []
        if l >= 1 and (l in host or l in nv):
            cuts.append([(A[l] / d2h, xs([t[l] for t in (host, nv) if l in t]))])
        if l - 1 in nv:
            cuts.append([(A[l - 1] / nw, nv[l - 1])])
        window(f"F{l}", compute=fwd[l], up_w=up, down=down, read=read, write=write, optim=opt_at[3 + l], cuts=cuts)
    top_w, top_h, top_n = segment_top(L)
    read_fh = [A[s] * v[s, L - 1] for s in range(L) if (s, L - 1) in v]
    window("FH", compute=costs.fwd_time[-1], up_w=top_w, up_a=top_h, up_fixed=top_n,
           read=xs(read_fh) if read_fh else 0.0)
    for j in range(L - 1):  # recompute windows (active iff drop_{j+1})
        down = _scaled_sum((gprev(e), x[j, e]) for e in range(j + 2, min(L, j + S) + 1))
        window(f"RC{j}", compute=fwd[j] * drop(j + 1), up_w=w_res(j + 1, drop(j + 1), ("own",)),
               down=down if j + 2 <= min(L, j + S) else 0.0)
    for l in range(L - 1, -1, -1):  # backward windows
        compute = bwd_rc[l] - (bwd_rc[l] - bwd[l]) * res[l] if l in res else bwd_rc[l]
        if l >= 1:
            top_w, top_h, top_n = segment_top(l)
            up_w, up_a, up_fixed = w_res(l - 1, drop(l), ("above",)) + top_w, top_h, top_n
        else:
            up_w = up_a = up_fixed = 0.0
        down = gprev(L) * x[L - 1, L] if l + 1 == L else gprev(l + 1) * (drop(l + 1) + x[l, l + 1])
        read_terms = [A[s] * v[s, l - 1] for s in range(L) if (s, l - 1) in v] if l >= 2 else []
        # at most one segment starts at an NVMe base read here: the same hull cut over its terms
        cuts = [[(A[s] / nr, v[s, l - 1]) for s in range(L) if (s, l - 1) in v]] if read_terms else []
        window(f"B{l}", compute=compute, up_w=up_w, up_a=up_a, up_fixed=up_fixed, down=down,
               read=xs(read_terms) if read_terms else 0.0, cuts=cuts, floor=bwd[l] if l in res else bwd_rc[l],
               kept=(res[l], bwd_rc[l]) if l in res else None)
    window("BE", compute=costs.bwd_time[0], down=G[0] + costs.grad_bytes[0])
    def add_share_rows(groups):
        """Σ p ≤ r_l for each (layer l, group) of ``groups`` with more than one share p."""
        for (layer, _), ps in groups.items() if share_rows else ():
            if len(ps) > 1:
                m.add_constr(_le(xs(ps), r[layer]))

    add_share_rows(upload_shares)

    # residuals on the host: D2H in the window after the layer's forward; the fetch is due in the
    # window before its backward, which is RC_{l-1} when a recompute segment ends at l + 1 (that
    # placement linearised: z = off · Σ x[s, l+1]), else the window of the item above
    spread_cuts = []  # (window, seconds, indicator): a fetch that window or the one before it makes
    fetched_in = {}   # layer l -> the indicator of its residuals' fetch in the window above (B_{l+1} or FH)
    fetch_max = {}    # window -> the most bytes of residuals fetched in it
    for l, o in off.items():
        win[f"F{l + 1}"]["down"] = win[f"F{l + 1}"]["down"] + R[l] * o
        win[f"F{l + 1}"]["cuts"].append([(R[l] / d2h, o)])
        above = "FH" if l + 1 == L else f"B{l + 1}"
        longer = [x[s, l + 1] for s in range(max(0, l + 1 - S), l) if (s, l + 1) in x]
        if longer:
            z = m.add_var(lb=0.0, ub=1.0)
            m.add_constr(_le(z, o))
            m.add_constr(_le(z, xs(longer)))
            m.add_constr(_ge(z, o + xs(longer) - 1))
            win[f"RC{l - 1}"]["up_a"] = win[f"RC{l - 1}"]["up_a"] + R[l] * z
            win[above]["up_a"] = win[above]["up_a"] + R[l] * o - R[l] * z
            fetched_above = o - z
            fetch_max[f"RC{l - 1}"] = fetch_max.get(f"RC{l - 1}", 0.0) + R[l]
        else:
            win[above]["up_a"] = win[above]["up_a"] + R[l] * o
            fetched_above = o
        fetch_max[above] = fetch_max.get(above, 0.0) + R[l]
        fetched_in[l] = fetched_above
        # the fetch's hull cut (as the copy down's): without it the LP fetches an eighth of every
        # residual into each backward window's idle upload time, which no whole residual fits
        # (llama3-8b, 64 layers: the LP 1.6 % below the plan, 0.14 % with it). Whole in the window
        # above at activation depth 1; at depth 2 part of it may move to the window before, so
        # the cut is on the two windows' sum (``spread_cuts``, after the windows' variables)
        if da == 1:
            win[above]["cuts"].append([(R[l] / h2d, fetched_above)])
        else:
            spread_cuts.append((above, R[l] / h2d, fetched_above))
            if union:
                # and depth 1's cut, less y_a times its reach (``whole_fetches``)
                win[above]["whole_fetches"].append((R[l] / h2d, fetched_above))

    # depth 2: part of a window's upload done in the window before it
    cap_w = max(list(W) + [costs.weight_bytes[0], costs.link_weight_bytes[-1]])
    # a window may fetch a segment's base and a layer's residuals both: its share of up to both
    # (the largest of one alone kept the MILP from moving both where the step model does)
    cap_a = max(A) + max([R[l] for l in off], default=0.0)

    def preds(name):
        """(window before, indicator or None) candidates of window ``name``."""
        if name in ("P0",):
            return []
        if name == "P1":
            return [("P0", None)]
        if name == "FE":
            return [("P1", None)]
        if name == "FH":
            return [(f"F{L - 1}", None)]
        kind, idx = name[:2] if name.startswith("RC") else name[:1], int(name[2:] if name.startswith("RC") else name[1:])
        if kind == "F":
            return [("FE" if idx == 0 else f"F{idx - 1}", None)]
        if kind == "B":
            above = "FH" if idx + 1 == L else f"B{idx + 1}"
            longer = [x[s, idx + 1] for s in range(max(0, idx + 1 - S), idx) if (s, idx + 1) in x]
            if not longer:
                return [(above, None)]
            ind = xs(longer)
            return [(f"RC{idx - 1}", ind), (above, 1 - ind)]
        cands = [(f"RC{idx - 1}", drop(idx))] if idx >= 1 else []
        for e in range(idx + 2, min(L, idx + S) + 1):
            cands.append(("FH" if e == L else f"B{e}", x[idx, e]))
        return cands

    def most_moved(name, pred, part):
        """The most bytes of ``name``'s upload ``part`` there are when ``pred`` is the window before it
        (a backward or recompute window: which one precedes it is decided by the segments)."""
        if name.startswith("RC"):
            j = int(name[2:])
            return W[j + 1] if part == "up_w" else fetch_max.get(name, 0.0)
        l = int(name[1:])
        dropped = pred.startswith("RC")  # B_l follows RC_{l-1} iff boundary l is dropped
        if part == "up_w":
            if dropped:
                return W[l - 1] if l >= 1 else 0.0
            return max([W[first(s, l)] for s in range(max(0, l - S), l)] + [0.0]) if l >= 1 else 0.0
        base = 0.0 if dropped or l < 1 else max([A[s] for s in range(max(0, l - S), l) if (s, l) in u] + [0.0])
        return base + fetch_max.get(name, 0.0)

    for name in order:
        w = win[name]
        for part, depth, cap in (("up_w", dw, cap_w), ("up_a", da, cap_a)):
            load = w[part]
            if depth < 2 or isinstance(load, (int, float)) and load == 0.0:
                continue
            fracs = []
            for pred, ind in preds(name):
                pv = m.add_var(lb=0.0, ub=1.0)  # share of ``cap`` bytes (unit-free: keeps CBC's scaling sane)
                if ind is not None:
                    # none of it unless ``pred`` is the window before, and then at most what this
                    # window can hold in that case (not the largest upload of the model: on
                    # heterogeneous layers that let the LP move a small layer's whole upload on a
                    # fraction of its indicator)
                    m.add_constr(_le(pv, ind * (min(cap, most_moved(name, pred, part)) / cap)))
                if union:
                    m.add_constr(_le(pv, y_w if part == "up_w" else y_a))
                fracs.append(pv)
                win[pred]["pre_in"].append(cap * pv)
            if fracs:
                m.add_constr(_le(xs(fracs), load * (1.0 / cap)))
                w["pre_out"].extend(cap * pv for pv in fracs)

    def hull_rows(t, base, base0, res_l, cut, less=None):
        """A window's hull rows over ``cut`` (its loads, each (seconds, indicator)): t >= base + Σ (sec
        − base)⁺ · z; and for a backward window whose compute is base0 without its layer's kept
        residuals (res = 0) and base with them, the same from the base of each case, t >= base0 −
        (base0 − base) · res + Σ (sec − base0)⁺ · z (valid at the four corners of (res, z)).
        ``less``: an indicator y, each row less y times the sum of its terms' coefficients (its
        reach: at y = 1 the row says no more than that the window lasts its compute)."""
        for floor in (base,) + ((base0,) if res_l is not None and base0 > base else ()):
            terms = [(sec - floor, z) for sec, z in cut if sec > floor]
            if not terms:
                continue
            start = base if floor == base else base0 - (base0 - base) * res_l
            row = start + xs(c * z for c, z in terms)
            m.add_constr(_ge(t, row if less is None else row - sum(c for c, _ in terms) * less))

    objective_const = 0.0
    T = []
    window_time = {}  # name -> its t variable, or its constant seconds
    window_base = {}  # name -> (base, base without the layer's kept residuals, their indicator or None)
    for name in order:
        w = win[name]
        up = xs([w["up_w"], w["up_a"], w["up_fixed"]] + [-p for p in w["pre_out"]] + w["pre_in"]) \
            if (w["pre_out"] or w["pre_in"]) else w["up_w"] + w["up_a"] + w["up_fixed"]
        loads = [(w["compute"], 1.0), (up, h2d), (w["down"], d2h), (w["read"], nr), (w["write"], nw),
                 (w["optim"], 1.0)]
        variable = [(ld, rate) for ld, rate in loads if not isinstance(ld, (int, float))]
        consts = [ld / rate for ld, rate in loads if isinstance(ld, (int, float))]
        # on shared cores a window lasts the sum of its loads, else their maximum (steps.py)
        const = sum(consts) if hardware.host_shares_device else max(consts)
        if not variable:
            objective_const += const
            window_time[name] = const
            window_base[name] = (const, const, None)
            continue
        t = m.add_var(lb=const)
        T.append(t)
        window_time[name] = t
        if hardware.host_shares_device:
            m.add_constr(_ge(t, const + xs(ld * (1.0 / rate) for ld, rate in variable)))
            continue
        for ld, rate in variable:
            m.add_constr(_ge(t, ld * (1.0 / rate)))
        base = max(consts + [w["floor"]])
        res_l, c0 = w["kept"] if w["kept"] is not None else (None, w["floor"])
        base0 = max(consts + [c0])
        window_base[name] = (base, base0, res_l)
        for sec, z in w["whole_fetches"]:
            # the union relaxation: at activation depth 1 (y_a = 0) a residual's fetch is made whole
            # in this window, so depth 1's cut holds there; each row less y_a times its reach holds
            # at depth 2 too (the union's rows of shallower pairs, as its case cuts). With the
            # fetch's cut on two windows alone (depth 2's), the union LP at y_a = 0 was far below
            # the LPs at activation depth 1: the Llama-3-70B shape on an H100, batch 32 of 2,048
            # tokens in 2 micro-batches, 115.11 s at y = (0, 0) against 117.78 s for depth (1, 1)
            # (the pair LPs it gates and their offload splits were then never run, and the solve
            # ended unproved at 2.37 %: benchmarks/RESULTS.md, "The union LP keeps depth 1's fetch cut")
            hull_rows(t, base, base0, res_l, [(sec, z)], less=y_a)
        for cut in w["cuts"]:
            hull_rows(t, base, base0, res_l, cut)
    if FETCH_BASE_ROWS and not hardware.host_shares_device and da == 1 and not union:
        _fetch_and_base_rows(m, window_time, fetched_in, u, res, L, S, A, R, bwd, bwd_rc, h2d)
    if case_cuts and not hardware.host_shares_device:
        # case cuts (the hull of a window over the cases that decide its loads): a window's loads
        # depend on which of several mutually exclusive indicators holds (which segment ends at a
        # backward item, which edge covers a dropped boundary), and the LP's max of their averaged
        # loads is below the average of their maxima when the cases are bound by different
        # channels. Exactly one case holds in every plan, so T ≥ Σ_case (the least window length
        # in that case) · its indicator. Only the loads no depth-2 split can move count (weights
        # at weight depth 1; compute and gradients down always); a resident-tail layer uploads
        # nothing (its case's weights less p).
        # On random host-only instances they raised the LPs by 1-1.5 % (64 layers, seed 8:
        # depths (2,1) 19.540 -> 19.769 s against a 19.933 s plan)
        # In the union relaxation every depth pair's lengths are written: (2, 2)'s as they are
        # (valid at every pair), and each shallower pair's less y_w (y_a) times the most any of
        # the row's cases shortens when the weight (activation) depth goes to 2, so that each row
        # holds at every corner of the indicators. Without them the union LP at y = (0, 0) was
        # depth 1's model less its case cuts: varied seed 4, 128 layers, 28.57 s at y = (0, 0)
        # where the (1, 1) LP is 30.20 s and the (1, 2) LP 28.63 s; the solve's first neighbourhood
        # went to (1, 1) and found nothing within 1 %
        variants = [(2, 2), (1, 2), (2, 1), (1, 1)] if union else [(dw, da)]
        shares = {}  # a resident case's p, one per case (shared by the variants)
        groups_of = {}  # a case's key -> its upload's groups (as upload_shares; spec)
        case_shares = {}  # (layer, group) -> the cases' shares (as upload_shares)

        def up_time(layer, wd):
            return 0.0 if wd > 1 else W[layer] / h2d

        def base_up(s, ad):
            return A[s] / h2d if ad == 1 else 0.0

        def spec(key, ind, layer, lengths, groups=()):
            """A case: its key (for its p), indicator, layer (whose residency takes its weights off)
            and lengths(wd, ad) -> (its least length, that length when the layer is resident),
            kept as the case's lengths(v) for v = (wd, ad), each depth pair's computed once (the
            rows ask for each several times). ``groups``: its upload's (as upload_shares)."""
            groups_of[key] = groups
            memo = {}

            def at(v):
                found = memo.get(v)
                if found is None:
                    found = memo[v] = lengths(*v)
                return found
            return key, ind, layer, at

        def cases_at(specs, v, floor, above=None):
            """The cases of ``specs`` at depth pair ``v``, as (length, indicator, resident length, p),
            each length at least ``floor`` (the window's compute); only those longer than ``above``
            where it is given. p ≤ ind, p ≤ r_layer (a
            resident-tail layer uploads nothing) takes the weights' share off; only upper bounds,
            so the LP raises it to min(ind, r) and every integer point keeps a p that holds."""
            out = []
            for key, ind, layer, lengths in specs:
                least, resident_least = lengths(v)
                value = least if least > floor else floor   # max(floor, ·), as max picks on a tie
                resident_value = resident_least if resident_least > floor else floor
                if above is not None and value <= above:
                    continue
                if layer not in r or resident_value >= value:
                    out.append((value, ind, value, None))
                    continue
                if key not in shares:
                    p = shares[key] = m.add_var(lb=0.0, ub=1.0)
                    m.add_constr(_le(p, ind))
                    m.add_constr(_le(p, r[layer]))
                    for group in groups_of[key]:
                        case_shares.setdefault((layer, group), []).append(p)
                out.append((value, ind, resident_value, shares[key]))
            return out

        def reach(specs, v, floor):
            """How much the rows at depth pair ``v`` over ``specs`` may overstate the window at the
            pair with the weight (then the activation) depth 2 instead: the most any case's length
            drops (the window lasts at least ``floor`` at every pair)."""
            out = []
            for dim in (0, 1):
                if v[dim] == 2 or not union:
                    out.append(0.0)
                    continue
                deeper = (2, v[1]) if dim == 0 else (v[0], 2)
                drop_most = 0.0
                for case in specs:
                    lengths = case[3]
                    (h0, h1), (t0, t1) = lengths(v), lengths(deeper)
                    d0 = max(floor, h0) - max(t0, floor)
                    d1 = max(floor, h1) - max(t1, floor)
                    if d0 > drop_most or d1 > drop_most:
                        drop_most = max(drop_most, d0, d1)
                out.append(drop_most)
            return out

        def weakened(bound, reaches):
            """``bound`` less y_w and y_a times their reaches (the union's rows of shallower pairs)."""
            terms = [c * y for c, y in zip(reaches, (y_w, y_a)) if c > 0]
            return bound - xs(terms) if terms else bound

        def over(cases, top):
            """Σ_case (length − top)⁺ · indicator, less each resident case's share."""
            terms = []
            for value, ind, resident_value, p in cases:
                if value > top:
                    terms.append((value - top, ind))
                    if p is not None:
                        terms.append((-(value - top - max(resident_value - top, 0.0)), p))
            return _scaled_sum(terms)

        def fixed(value, resident_value=None):
            return lambda wd, ad: (value, value if resident_value is None else resident_value)

        for l in list(range(L)) + [L]:  # the backward windows, then FH (the head's forward: l = L)
            name = f"B{l}" if l < L else "FH"
            t = window_time[name]
            if isinstance(t, (int, float)):
                continue
            if l == L:
                cmin = costs.fwd_time[-1]
            else:
                cmin = bwd[l] if l in res else bwd_rc[l]
            # families of exclusive cases, each case with the least window length it implies:
            # B_l's next item (layer l - 1's backward when l is dropped, else the first item of the
            # segment ending at l: its weights and the segment's base), whether layer l + 1's
            # gradients go down here (unless layer l starts a segment of length >= 2 below it), and
            # each one-channel cut of the window (an NVMe read, a residual fetch). One family:
            # T ≥ cmin + Σ_case (its length − cmin) · its indicator (a one-channel cut alone is in
            # the window's rows already, from the window's constant loads)
            families = []  # (case specs, whether the family's own row is added here)
            if l >= 1:
                # (boundary L is always kept: FH's next item is the top of the last segment)
                path = []
                if l < L:
                    path.append(spec((name, "drop"), drop(l), l - 1,
                                     lambda wd, ad, k=l - 1: (up_time(k, wd), 0.0), ("above",)))
                for s in range(max(0, l - S), l):
                    f = first(s, l)
                    weights_only = (lambda wd, ad, f=f: (up_time(f, wd), 0.0))
                    groups = top_groups(s, l)
                    if (s, l) not in u:
                        path.append(spec((name, s), x[s, l], f, weights_only, groups))
                        continue
                    # the segment's base comes up with its weights (same link): from the host (at
                    # activation depth 1 nothing of it moves to the window before) or, read from
                    # NVMe a window earlier, from the host's staging (never moved)
                    on_host = u[s, l] - v[s, l] if (s, l) in v else u[s, l]
                    path += [spec((name, s, "device"), x[s, l] - u[s, l], f, weights_only, groups),
                             spec((name, s, "host"), on_host, f,
                                  lambda wd, ad, f=f, s=s: (up_time(f, wd) + base_up(s, ad), base_up(s, ad)), groups)]
                    if (s, l) in v:
                        path.append(spec((name, s, "nvme"), v[s, l], f,
                                         lambda wd, ad, f=f, s=s: (up_time(f, wd) + A[s] / h2d, A[s] / h2d), groups))
                families.append((path, True))
            z = None if l == L else x[L - 1, L] if l + 1 == L else drop(l + 1) + x[l, l + 1]
            if z is not None and gprev(l + 1) / d2h > cmin:
                families.append(([spec(None, z, None, fixed(gprev(l + 1) / d2h, 0.0))], True))
            # the one-channel cuts' own rows are the window's already
            for cut in win[name]["cuts"]:
                families.append(([spec(None, zc, None, fixed(sec)) for sec, zc in cut], False))
            # each row from the compute with the layer's kept residuals (cmin), and, where the layer
            # may keep them, from the compute without (c0) less its saving times res: valid at both
            # values of res (max(c0, U) − δ ≤ max(c0 − δ, U)), and the tighter row where the LP keeps
            # few residuals: the rows from cmin alone let a plan that keeps none count each case's
            # length above the smaller compute only
            floors = [(cmin, 0.0)]
            if l < L and l in res and bwd_rc[l] > cmin:
                floors.append((bwd_rc[l], (bwd_rc[l] - cmin) * res[l]))
            for variant, (floor, saved) in itertools.product(variants, floors):
                at = []  # (top, cases, own row, reaches)
                for specs, own in families:
                    cases = cases_at(specs, variant, floor, None if own else floor)
                    if cases:
                        at.append((max(c[0] for c in cases), cases, own, reach(specs, variant, floor)))
                bounds = [floor - saved + over(cases, floor) for _, cases, _, _ in at]
                for (top, _, own, reaches), bound in zip(at, bounds):
                    # (a shallower pair's row whose lengths do not reach past (2, 2)'s is that row:
                    # not written twice, which upset HiGHS' interior point: qwen3-32b shape, H100,
                    # 128 layers, a solve error)
                    if own and top > floor and (variant == variants[0] or any(c > 0 for c in reaches)):
                        m.add_constr(_ge(t, weakened(bound, reaches)))
                # two families at once: T ≥ max(C_P, C_Q) ≥ C_P + Σ_Q (C_q − max C_P)⁺ · z_q. A cut
                # alone counts only its own case: an NVMe read's cut from the compute, not from the
                # weights or gradients every case moves too (varied seed 0, 32 layers, every boundary
                # kept: the LP 9.97 s against a 10.47 s optimum with single families only). In the
                # union relaxation only at (2, 2) (the shallower pairs' pair rows moved no LP: varied
                # seeds 2, 4, 16 at 128 layers, 800-1,300 rows)
                for i, (top, _, _, reaches) in enumerate(at):
                    for j2, (_, others, _, reaches2) in enumerate(at):
                        terms = over(others, top) if j2 != i and variant == variants[0] else None
                        if terms is not None and terms.expr:
                            m.add_constr(_ge(t, weakened(bounds[i] + terms, [max(a, b) for a, b in zip(reaches, reaches2)])))
        covering = [[] for _ in range(L - 1)]  # per j, the edges (s, e) with s <= j and e >= j + 2, in x's order
        for (s, e), var in x.items():
            for j in range(s, e - 1):
                covering[j].append((s, e, var))
        for j in range(L - 1):
            t = window_time[f"RC{j}"]
            if isinstance(t, (int, float)):
                continue
            # RC_j exists iff boundary j + 1 is dropped: one edge (s, e) covers it; s = j sends down
            # the gradients of the layer above the segment
            specs = []
            for s, e, var in covering[j]:
                down = gprev(e) / d2h if s == j else 0.0
                specs.append(spec((f"RC{j}", s, e), var, j + 1,
                                  lambda wd, ad, down=down: (max(fwd[j], up_time(j + 1, wd), down),
                                                             max(fwd[j], down)),
                                  ("own",)))
            for variant in (variants if not union else [(2, 2), (1, 2)]) if specs else ():  # (no activation depth here)
                reaches = reach(specs, variant, 0.0)
                if variant != variants[0] and not any(c > 0 for c in reaches):
                    continue
                m.add_constr(_ge(t, weakened(over(cases_at(specs, variant, 0.0), 0.0), reaches)))
        # the cases' shares by upload, as the windows' own (upload_shares); a recompute window has
        # up to S (S - 1) / 2 covering edges, each a case of its layer
        add_share_rows(case_shares)

    def least_weights(name):
        """The fewest weight bytes backward window ``name`` (B_l or FH) uploads in any plan: its next
        item's (layer l - 1's when boundary l is dropped, else the first layer of the segment
        ending at l), none where one of those may be in the resident tail."""
        l = L if name == "FH" else int(name[1:])
        if l < 1:
            return 0.0
        layers = ([l - 1] if l < L else []) + [first(s, l) for s in range(max(0, l - S), l)]
        return 0.0 if any(k in r for k in layers) else min(W[k] for k in layers)

    def total_time(windows):
        """Σ of ``windows``' times as (the variables' sum, the constant windows' seconds)."""
        fixed = sum(window_time[g] for g in windows if isinstance(window_time[g], (int, float)))
        return xs([window_time[g] for g in windows if not isinstance(window_time[g], (int, float))]), fixed

    def kept_share(windows):
        """What each of ``windows`` saves when its layer keeps its residuals, times that indicator."""
        return _scaled_sum([(window_base[g][1] - window_base[g][0], window_base[g][2]) for g in windows
                            if window_base[g][2] is not None and window_base[g][1] > window_base[g][0]])

    if case_cuts and not hardware.host_shares_device:
        # the backward pass by segments: in every plan each recompute and backward window belongs to
        # exactly one chosen segment (s, e), in this order: RC_s … RC_{e-2}, B_{e-1} … B_s. Those
        # windows last together at least τ(s, e), the least chain time of their compute, gradients
        # down and weight uploads (each window's upload may be done in part in the window before it
        # at weight depth 2, the first window's all outside the chain), so Σ t ≥ Σ τ(s, e) · x[s, e],
        # less what keeping residuals saves (δ_l · res_l: the chain is at most that shorter). The
        # per-window rows take each window's hull alone; with fractional segments they let a run of
        # upload-bound windows count the mean of its cases (varied seed 11, 128 layers, depths
        # (2, 2): the recompute windows 0.88 s in the LP against 1.03 s at the plan's segments, the
        # LP 5.577 s against a 5.711 s plan; 5.696 s with this row)
        def chain_time(loads, moves):
            """The least total time of windows (compute or gradient seconds, upload bytes) in order;
            with ``moves`` (weight depth 2) each upload may be done in part in the window before
            (the first one's all before the chain): greedy, each window's idle link taken by the
            next window's upload."""
            total, idle = 0.0, None
            for busy, up in loads:
                if moves:
                    up = 0.0 if idle is None else max(0.0, up - idle)
                span = max(busy, up / h2d)
                total += span
                idle = (span - up / h2d) * h2d
            return total

        def busy_last(s):
            """B_s's least length as the last window of its segment: its gradients always go down
            (s + 1 dropped, or the segment (s, s + 1))."""
            return max(bwd_rc[s], gprev(s + 1) / d2h)

        chains = {}
        for (s, e), var in x.items():
            loads = [(max(fwd[j], gprev(e) / d2h if j == s else 0.0), W[j + 1]) for j in range(s, e - 1)]
            loads += [(max(bwd_rc[l], gprev(l + 1) / d2h if l + 1 < e else 0.0), W[l - 1]) for l in range(e - 1, s, -1)]
            # B_s last; its upload, the top of the segment below, is counted with that segment's
            # edge (``tops``)
            loads.append((busy_last(s), 0.0))
            chains[s, e] = (chain_time(loads, dw > 1), chain_time(loads, False))

        def tops():
            """What B_s's upload of the top of the segment (s', s) ending at it (its first item's
            weights, and its base where it lies off the device) adds to B_s beyond its compute and
            gradients: per edge, and per edge whose base comes up from the host or from NVMe (an
            NVMe base is staged on the host a window earlier and never moved; a host base may move
            at activation depth 2, then counted as nothing). At weight depth 2 the weights may move
            to the window before: counted as nothing."""
            terms = []
            for (s2, s), var in x.items():
                if s == L:
                    continue  # (FH uploads the last segment's top: a window of its own)
                busy = busy_last(s)
                w_top = W[first(s2, s)] / h2d if dw == 1 else 0.0
                with_w = max(busy, w_top)
                terms.append((with_w - busy, var))
                if (s2, s) in u:
                    with_base = max(busy, w_top + A[s2] / h2d) - with_w
                    if da == 1:
                        terms.append((with_base, u[s2, s]))
                    elif (s2, s) in v:
                        terms.append((with_base, v[s2, s]))
            return _scaled_sum(terms)

        lhs, fixed_s = total_time([f"RC{j}" for j in range(L - 1)] + [f"B{l}" for l in range(L)])
        # (a resident-tail layer's weights come up at most twice in the backward pass: for its
        # recompute and its backward item; each byte less shortens a chain by at most 1 / h2d)
        saved = _scaled_sum([(bwd_rc[l] - bwd[l], res[l]) for l in res] + [(2 * W[l] / h2d, r[l]) for l in r])
        rest = tops() - fixed_s - saved
        m.add_bound_row(_ge(lhs, _scaled_sum((chains[edge][0], var) for edge, var in x.items()) + rest))
        if union:
            # weight depth 1's chains, less y_w times the most they exceed depth 2's on any path
            most = [0.0] + [-math.inf] * L
            for e in range(1, L + 1):
                most[e] = max(most[s] + chains[s, e][1] - chains[s, e][0] for s in range(max(0, e - S), e))
            m.add_bound_row(_ge(lhs, _scaled_sum((chains[edge][1], var) for edge, var in x.items()) + rest - most[L] * y_w))

    if not hardware.host_shares_device:
        run_terms = []  # (group, seconds with the window's weights, indicator, bases, bases without kept residuals)
        for name, sec, ind in spread_cuts:
            # the window and every candidate for the one before it last at least their bases (each
            # with or without its own layer's kept residuals), and together at least the fetch: the
            # hull of the two, valid at every corner of those indicators and the fetch's (each
            # window's t is at least 0)
            group = [name] + [p for p, _ in preds(name)]
            base0 = sum(window_base[g][1] for g in group)
            lhs, fixed = total_time(group)
            if sec > base0:
                m.add_constr(_ge(lhs, base0 - fixed + (sec - base0) * ind - kept_share(group)))
            # and from the least bases (every window's layer keeping its residuals; the cut above,
            # at its corner with all kept and the fetch made, gives the fetch less what keeping
            # saves), with the weights the window uploads in every case: they share the link with
            # the fetch and move only to the window before, inside the group
            base = sum(window_base[g][0] for g in group)
            sec_w = sec + least_weights(name) / h2d
            if case_cuts and sec_w > base:
                m.add_constr(_ge(lhs, base - fixed + (sec_w - base) * ind))
            run_terms.append((group, sec_w, ind, base, base0))
        if case_cuts and run_terms:
            # The groups overlap (a window is the one above one fetch and the one before the
            # next), so the cuts of single groups let one window's idle link serve two fetches:
            # on the qwen2.5-3b shape at 128 layers on an H200 the LP sent a quarter of every
            # layer's residuals to the host, each quarter hidden under a backward window's
            # compute, which no whole residual is (the (1, 2) LP 12.306 s, 12.311 s with the
            # cut from the least bases above, against plans of 12.48 s). Over every window of
            # every group at once: T ≥ Σ base + Σ_fetch (its seconds − its group's bases)⁺ ·
            # its indicator (that LP 12.374 s). Valid at every plan: the fetches made whose term
            # is positive all happen inside the union of their groups (with the weights counted
            # in their seconds, each its own window's), and that union's bases sum to at most
            # their groups' bases. The same from each window's base with or without its layer's
            # kept residuals (base0 less the kept share)
            covered = list(dict.fromkeys(g for group, *_ in run_terms for g in group))
            lhs, fixed = total_time(covered)
            lean = [(sec_w - base) * ind for _, sec_w, ind, base, _ in run_terms if sec_w > base]
            if lean:
                m.add_constr(_ge(lhs, sum(window_base[g][0] for g in covered) - fixed + xs(lean)))
            lean0 = [(sec_w - base0) * ind for _, sec_w, ind, _, base0 in run_terms if sec_w > base0]
            if lean0:
                m.add_constr(_ge(lhs, sum(window_base[g][1] for g in covered) - fixed + xs(lean0) - kept_share(covered)))

    # memory, every row in units of the largest boundary/weight/residual (byte-sized coefficients
    # upset CLP's scaling: with the aggregated rows below they gave LP values above the optimum)
    unit = max(list(A) + W + list(R) + [1.0])
    a = [ai / unit for ai in A]
    ws = m.add_var(lb=0.0)
    seg_ws = {(s, e): sum(a[s + 1:e]) * var + (a[s] * u[s, e] if (s, e) in u else 0)
              for (s, e), var in x.items() if e - s >= 2}
    for load in seg_ws.values():
        m.add_constr(_ge(ws, load))
    # valid inequalities (they cut fractional points only; see the module docstring, "Solving"):
    # the path crosses each gap (i, i + 1) on exactly one edge, so ws is at least the sum over the
    # edges that cross it; and ws is at least the least working set of the longest segment chosen
    # (longer[n] = 1 iff some segment has length >= n: one binary per length, cheap to branch on)
    crossings = [[] for _ in range(L)]
    for (s, e), load in seg_ws.items():
        for i in range(s, min(e, L)):
            crossings[i].append(load)
    for crossing in crossings:
        if len(crossing) > 1:
            m.add_constr(_ge(ws, xs(crossing)))
    least = [0.0, 0.0] + [min(sum(a[s + 1:s + n]) for s in range(L - n + 1)) for n in range(2, S + 1)]
    longer = {n: m.add_var(var_type=mip.BINARY) for n in range(2, S + 1)}
    for (s, e), var in x.items():
        if e - s >= 2:
            m.add_constr(_le(var, longer[e - s]))
    for n in range(3, S + 1):
        m.add_constr(_le(longer[n], longer[n - 1]))
    if longer:
        m.add_constr(_ge(ws, xs((least[n] - least[n - 1]) * longer[n] for n in longer)))
    device_terms = [a[i] * dev[i] for i in dev] + [R[l] / unit * res[l] for l in res] + [W[l] / unit * r[l] for l in r]
    device_terms += [-R[l] / unit * o for l, o in off.items()]
    res_max = None
    if off:  # memory.offload_working_bytes: (1 + a) · the largest residual on the host
        res_max = m.add_var(lb=0.0)
        for l, o in off.items():
            m.add_constr(_ge(res_max, R[l] / unit * o))
        if not union:
            # one binary "some residual is on the host": CBC branches on it first, and a fractional
            # offload then pays the least residual's working set in full (64 layers where the tier
            # wins: 28 s instead of 63 s); left out of the union LP, which it slowed 1.7x at 128 layers
            some = m.add_var(var_type=mip.BINARY)
            for o in off.values():
                m.add_constr(_ge(some, o))
            m.add_constr(_ge(res_max, min(R[l] for l in off) / unit * some))
        device_terms.append((1 + (1 if union else da)) * res_max)
        if union:  # y_a · res_max, bounded below (McCormick) by res_max − (1 − y_a) · the largest
            extra = m.add_var(lb=0.0)
            r_top = max(R[l] for l in off) / unit
            m.add_constr(_ge(extra, res_max - r_top + r_top * y_a))
            device_terms.append(extra)
    if union:
        deeper = {d: sum(memory.constant_bytes(costs, hardware, weight_prefetch_depth=d[0],
                                               act_prefetch_depth=d[1]).values()) - base_mem for d in ((2, 1), (1, 2))}
        device_terms += [deeper[2, 1] / unit * y_w, deeper[1, 2] / unit * y_a]
    peak = base_mem / unit + xs(device_terms + [ws])
    host_res = [(R[l] / unit, o) for l, o in off.items()]
    if host or off:
        any_nv = m.add_var(var_type=mip.BINARY) if nv else None
        for i in nv:
            m.add_constr(_ge(any_nv, nv[i]))
        host_terms = [(a[i], host[i]) for i in host] + ([(2 * max(a), any_nv)] if nv else []) + host_res
        m.add_constr(_le(xs(c * z for c, z in host_terms), hardware.host_memory / unit))
        _rounded_knapsack(m, host_terms, hardware.host_memory / unit)
    if nv:
        # the NVMe knapsack's capacity times "some boundary is on NVMe" (any_nv, which pays the host's
        # staging buffers): valid, since with any_nv 0 no boundary is there; without it the LP paid
        # the staging only at the largest single NVMe share (any_nv ≥ nv_i), e.g. 0.115 of it where
        # the LP spread eight boundaries over 70 (Llama-3-70B shape on an H800, batch 238)
        some = any_nv if (host or off) else None
        m.add_constr(_le(xs(a[i] * nv[i] for i in nv), _times(hardware.nvme_memory / unit, some)))
        _rounded_knapsack(m, [(a[i], nv[i]) for i in nv], hardware.nvme_memory / unit, some)
    if tighten_rows:
        _tighten_window_rows(m, T)
    if objective == "memory":
        m.objective = linear.minimize(peak * unit)
    else:
        m.add_constr(_le(peak, budget / unit))
        m.objective = linear.minimize(xs(T) + objective_const)
    return Built(model=m, x=x, out_edges=out_edges, dev=dev, host=host, nv=nv, res=res, off=off, r=r,
                 objective_const=objective_const, weight_prefetch_depth=dw, act_prefetch_depth=da, num_layers=L,
                 res_max=res_max, res_floor=min(R[l] for l in off) / unit if off else 0.0,
                 depth_indicators=(y_w, y_a) if union else None)


# whether ``build`` writes ``_fetch_and_base_rows``
FETCH_BASE_ROWS = True


def _fetch_and_base_rows(m: _Model, window_time: dict, fetched_in: dict, u: dict, res: dict, L: int, S: int,
                         A, R, bwd, bwd_rc, h2d: float) -> None:
    """Rows for a backward window B_l at activation depth 1 that fetches, whole, both layer l − 1's
    residuals (indicator f) and the base of the segment ending at l from the host or NVMe (U =
    Σ_s u[s, l], at most one such segment): with layer l's residuals dropped the window computes
    bwd_rc[l], and its upload then lasts at least (R[l − 1] + the least such base) / h2d. Each
    fetch alone may fit under that compute while both together do not; the window's hull rows,
    one load at a time, miss it. So

        t_l ≥ compute_l + c · (f + U − 1),   c = (R[l − 1] + min_s A[s]) / h2d − bwd_rc[l] > 0,

    with compute_l = bwd_rc[l] − (bwd_rc[l] − bwd[l]) · res_l. Valid at every plan: where f + U ≤ 1
    the row says no more than the compute; where both fetches are made it says (R + A_min) / h2d
    with the residuals dropped, and less than that with them kept (bwd ≤ bwd_rc). Written as bound
    rows (``_Model.add_bound_row``) of the depth pairs' own models only: the neighbourhoods'
    sub-MIPs leave them out, and the union LP, whose solution the rounding and the first
    neighbourhoods start from, is without them. Written into every model (the union's less c · y_a)
    they proved one more real shape but changed the plans of 9 of 40 varied 128-layer seeds,
    three of them at the time limit slower by 0.06-0.4 % (benchmarks/RESULTS.md, "A residual's
    fetch beside a segment base's").

    Why: qwen2.5-3b shape on the A100 with room for a third of the boundaries, 128 layers, depths
    (2, 1): the LP took half of every layer's residuals to the host and half of every window's
    recompute, each window 0.0712 s, where a plan alternates windows of 0.0572 s (residuals kept,
    nothing fetched) and 0.0903 s (recomputed, with a residual of 0.0847 s and a base of 0.0056 s to
    fetch): the LP 19.733 s against a plan of 20.046 s that HiGHS proves within 0.1 % in 123 s."""
    for l in range(1, L):
        t = window_time.get(f"B{l}")
        if l - 1 not in fetched_in or isinstance(t, (int, float)):
            continue
        tops = [(s, u[s, l]) for s in range(max(0, l - S), l) if (s, l) in u]
        if not tops:
            continue
        c = (R[l - 1] + min(A[s] for s, _ in tops)) / h2d - bwd_rc[l]
        if c <= 0.0:
            continue
        compute = bwd_rc[l] - (bwd_rc[l] - bwd[l]) * res[l] if l in res else bwd_rc[l]
        m.add_bound_row(_ge(t, compute + c * (fetched_in[l - 1] + linear.xsum(var for _, var in tops) - 1)))


def _tighten_window_rows(m: _Model, windows) -> int:
    """Coefficient tightening (Savelsbergh 1994; what HiGHS' MIP presolve does to these rows) of
    the rows of ``m`` that bound one window time t of ``windows`` from below: written as t ≥ a0 +
    Σ a·v, each has a least right-hand side over the variables' bounds, and t's floor B is the
    most of those and of t's own lower bound (every point has t ≥ B). A binary z whose row stays at
    most B while z is 0 (a > 0) or 1 (a < 0) counts only for what it lifts the row above B: with
    M the row's most over the bounds, a > 0 and M − a < B give a − d, a0 + d for d = B − M + a;
    a < 0 and M + a < B give B − M. Each step keeps every integer point that has t ≥ B (the row
    there is the same, or at most B), so the plans and their times are the same; the LP loses the
    fractional binaries that paid less than a window's floor. The number of coefficients changed.

    Why: a window's rows are one per load (compute, each link, the optimizer) and its hull and
    case cuts; at fractional indicators the LP took the least of them all as the floor of each
    (varied seed 3, 128 layers: a backward window's upload row t ≥ 0.089 + 0.089·(x_a − Σ x_b)
    under a compute row with floor 0.164 s became t ≥ 0.164 + 0.015·(x_a − Σ x_b); the union LP
    32.979 -> 33.229 s, its depth pairs' LPs +0.6-0.9 %; seed 38 2.656 -> 2.686 s). On the
    depth-pair models of varied seeds 0, 3, 5, 8, 9, 10, 17, 27 and 35 at 128 layers the LP is
    then the LP of HiGHS' own presolved model (which sees these rows only in its branch and cut)."""
    windows = set(windows)
    rows_of = {}
    for row in m.rows:
        found = windows.intersection(row.expr)
        if len(found) != 1 or row.sense not in (">", "<"):
            continue
        t, = found
        c = row.expr[t]
        if c != 0 and (c > 0) == (row.sense == ">"):   # written ≥ with t's coefficient positive: a lower bound on t
            rows_of.setdefault(t, []).append(row)
    changed = 0
    for t, rows in rows_of.items():
        floor, parts = t.lb, []
        for row in rows:
            sign = 1.0 if row.sense == ">" else -1.0
            k = sign * row.expr[t]
            terms = [(v, -sign * c / k) for v, c in row.expr.items() if v is not t and c != 0]
            a0 = -sign * row.const / k
            least = most = a0
            for v, a in terms:
                least += a * (v.lb if a > 0 else v.ub)
                most += a * (v.ub if a > 0 else v.lb)
            floor = max(floor, least)
            parts.append((row, sign * k, terms, a0, most))
        for row, scale, terms, a0, most in parts:
            if not most > floor or not math.isfinite(most):
                continue
            lift = 0.0
            for v, a in terms:
                if v.var_type != mip.BINARY or v.lb != 0.0 or v.ub != 1.0:
                    continue
                if a > 0 and most - a < floor:
                    d = floor - most + a
                    lift += d
                    row.expr[v] = -(a - d) * scale
                elif a < 0 and most + a < floor:
                    row.expr[v] = -(floor - most) * scale
                else:
                    continue
                changed += 1
            if lift:   # (only then: a row written back unchanged could move in its last digit)
                row.const = -(a0 + lift) * scale
    return changed


def _times(capacity: float, indicator=None):
    """``capacity``, or ``capacity · indicator`` (a binary that must be 1 for anything to use it)."""
    return capacity if indicator is None else capacity * indicator


def _rounded_knapsack(m, terms, capacity, indicator=None):
    """Chvátal–Gomory rounding of Σ a·z ≤ capacity over integer z ≥ 0 with the divisor the least
    positive a: Σ ⌊a / a_min⌋·z ≤ ⌊capacity / a_min⌋ (valid; it cuts the fractional fill-up), the
    right-hand side times ``indicator`` where one is given (a binary that is 1 wherever a z is)."""
    terms = [(a, z) for a, z in terms if a > 0]
    if len(terms) < 2:
        return
    unit = min(a for a, _ in terms)
    # a relative epsilon keeps exact multiples (homogeneous layers) from rounding down
    m.add_constr(_le(linear.xsum(math.floor(a / unit * (1 + 1e-12)) * z for a, z in terms),
                     _times(math.floor(capacity / unit * (1 + 1e-12)), indicator)))


def lp_bound(costs, hardware, **build_kw) -> float:
    """A lower bound on every plan of the space, any depth pair: the LP of the union relaxation
    (``build(..., union=True)``); inf if infeasible.

    Example:
      >>> lp_bound(costs, Hardware.preset("h800")) <= solve(costs, Hardware.preset("h800")).predicted_step_time_s
    """
    return lp_bound_started(costs, hardware, **build_kw)()


def lp_bound_started(costs, hardware, **build_kw):
    """:func:`lp_bound` begun: the union model built here and its LP handed to a thread of its own
    where HiGHS takes it (``_relaxed``'s choice; the interpreter lock is the caller's meanwhile),
    else solved here. Returns a function that gives its value (waiting for the thread; CLP here
    where HiGHS cannot say). For ``lt.plan``'s best-first search, which builds the next candidate's
    model while the LP of the one before runs."""
    built = build(costs, hardware, union=True, **build_kw)
    arrays = _highs_arrays(built.model) if _lp_solver(built.model) == "highs" else None
    if arrays is None:
        value = _relaxed(built)
        return lambda: value
    running = _in_thread(_highs_solve, arrays)

    def value():
        found = running.result()
        return found if found is not None else _relaxed(built, solver="clp")
    return value


IPM_GAP = 1e-6  # relative primal-dual gap at which HiGHS' interior point stops; the bound is lowered by it
HIGHS_MIN_NONZEROS = 20_000  # below this CLP answers in milliseconds and HiGHS' overhead dominates


def _staging_paid_in_part(built: Built, point) -> bool:
    """Whether the LP solution (``point``: [x] from HiGHS, or [] after CLP, which leaves its values
    on the model's variables) sends residuals to the host while paying less than the least such
    residual's staging: where :func:`_offload_split` can raise the bound."""
    if not built.off:
        return False
    value = (lambda v: point[0][v.idx]) if point else (lambda v: v.x)
    offloaded, staging = [value(v) for v in built.off.values()], value(built.res_max)
    if staging is None or any(o is None for o in offloaded):  # no CLP solution to read: try the split
        return True
    return sum(offloaded) > 1e-6 and staging < built.res_floor * (1 - 1e-6)


def _offload_split_gain(built: Built, point, costs) -> float:
    """About the most :func:`_offload_split` can raise the LP's value: its "no residual on the host"
    branch has a solution that keeps on the device what the LP's solution keeps there and recomputes
    what it offloads, costing each layer's backward (recompute − plain) seconds times its offloaded
    fraction (window cuts that read a layer's residual indicator can add up to as much again, hence
    the factor 2). inf where the LP's values cannot be read. On random NVMe instances the interior
    point's solution offloaded ~1e-6 of a residual (the union LP's vertex none): the split (two
    LPs, 2-5 s at 128 layers) cannot help there, and is skipped."""
    value = (lambda v: point[0][v.idx]) if point else (lambda v: v.x)
    total = 0.0
    for l, v in built.off.items():
        o = value(v)
        if o is None:
            return math.inf
        total += max(0.0, costs.bwd_recompute_time[l + 1] - costs.bwd_time[l + 1]) * max(0.0, o)
    return 2.0 * total


def _offload_split(built: Built, arrays, basis=None, early: list | None = None) -> float:
    """A bound at least the LP's, for a model whose residuals may go to the host: the smaller of two
    LPs, one with no residual on the host, one with at least one there and its device staging
    (``memory.offload_working_bytes``: at least the least such residual) paid in full. The plain LP
    pays that staging only in the fraction it offloads: on the llama3-8b shape at 32 layers it sends
    an eighth of every residual to the host and sits 1.4 % below the best plan; the two branches
    (on the LP for all depth pairs) bring that to 0.40 %. ``arrays``: the model's HiGHS arrays (``_highs_arrays``), None for CLP.
    ``basis``: the model's LP basis (``_highs_solve``'s list), where its branches start from it by
    dual simplex (``_hot_lp``; the second's added row basic). ``early``: if a list, two futures, one
    per branch, each told a bound on its branch as soon as one is known (``_hot_lp``)."""
    try:
        return _offload_branches(built, arrays, basis, early)
    finally:
        for future in early or ():  # told already, unless the branches were not solved by HiGHS
            _tell(future, -math.inf)


def _offload_branches(built: Built, arrays, basis, early) -> float:
    """:func:`_offload_split`'s two LPs."""
    if not built.off:
        return -math.inf
    offs = [v.idx for v in built.off.values()]
    if arrays is not None:
        import numpy as np
        import scipy.sparse
        cost, args, const = arrays
        problems = []
        for branch in ("none", "some"):
            bounds = args["bounds"].copy()
            a_ub, b_ub = args["A_ub"], args["b_ub"]
            if branch == "none":
                bounds[offs, 1] = 0.0
            else:
                bounds[built.res_max.idx, 0] = built.res_floor
                row = scipy.sparse.csr_matrix((-np.ones(len(offs)), ([0] * len(offs), offs)), shape=(1, len(cost)))
                a_ub, b_ub = scipy.sparse.vstack([a_ub, row]).tocsr(), np.append(b_ub, -1.0)   # Σ off >= 1
            problems.append((cost, {**args, "bounds": bounds, "A_ub": a_ub, "b_ub": b_ub}, const))
        if basis:
            # from the basis: qwen3-32b on the H200, 64 layers, the two branches 0.042 s against
            # 0.158 s from scratch, the whole solve 0.79-0.82 -> 0.70 s; llama3-8b's took 0.44
            # against 0.28 s (its solves never split on the offload); the rest the same
            hc = _highs_object()
            extended = hc.HighsBasis()
            rows = list(basis[0].row_status)
            n_ub = args["A_ub"].shape[0] if args["A_ub"] is not None else 0
            extended.col_status = list(basis[0].col_status)
            extended.row_status = rows[:n_ub] + [hc.HighsBasisStatus.kBasic] + rows[n_ub:]
            extended.valid = True
            values = _parallel_lps(problems, bases=[basis[0], extended], early=early)
        else:
            values = _parallel_lps(problems, early=early)
        return -math.inf if None in values else min(values)
    for v in built.off.values():  # no residual on the host
        v.ub = 0.0
    none = _relaxed(built, solver="clp")
    for v in built.off.values():
        v.ub = 1.0
    m = built.model  # at least one, its staging paid in full
    built.res_max.lb = built.res_floor
    m.add_constr(linear.xsum(built.off.values()) >= 1)
    some = _relaxed(built, solver="clp")
    m.pop_row()
    built.res_max.lb = 0.0
    return min(none, some)


def _in_thread(fn, *args) -> concurrent.futures.Future:
    """``fn(*args)`` in a thread of its own, for the calling solve (``_owned``): a future of its
    value. Not a daemon: the interpreter waits for it at exit, so that HiGHS never returns into a
    finalising interpreter (a daemon thread doing so ends by a forced unwind through HiGHS' C++
    frames: "terminate called without an active exception", exit status 134, in about half the
    processes that planned and ended at once on varied seed 14, 128 layers). What a solve leaves
    running is stopped when it returns (``_solve_threads``), so that wait is short: a thread pool's
    workers running to the end held a script's exit 1 s on idle cores, 54 s beside two busy
    processes."""
    future = concurrent.futures.Future()
    work = _owned(fn)

    def run():
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(work(*args))
            except BaseException as error:  # noqa: BLE001  (handed to the caller with the future)
                future.set_exception(error)
    threading.Thread(target=run, name="lazytrain-lp").start()
    return future


def _parallel_lps(problems: list, points=None, bases=None, hot=None, early=None) -> list:
    """``_highs_solve`` of each of ``problems`` (prepared arrays), side by side in threads (HiGHS
    releases the interpreter lock); ``points``: one list per problem for its solution, or None;
    ``bases``: one HiGHS basis per problem to start it from (``_hot_lp``), or None; ``hot``: one
    list per problem, given HiGHS' basis where its solution is the vertex reached from its basis;
    ``early``: one future per problem, told a bound on it as soon as one is known (``_hot_lp``)."""
    points = points if points is not None else [None] * len(problems)
    bases = bases if bases is not None else [None] * len(problems)
    hot = hot if hot is not None else [None] * len(problems)
    early = early if early is not None else [None] * len(problems)
    futures = [_in_thread(_hot_lp, problem, basis, point, h, e)
               for problem, point, basis, h, e in zip(problems, points, bases, hot, early)]
    return [f.result() for f in futures]


def _hot_lp(problem, basis, point: list | None, hot: list | None = None, early=None):
    """The LP of ``problem`` (prepared arrays) by dual simplex (priced by ``HOT_EDGE_WEIGHTS``)
    from ``basis`` (HiGHS' basis of a model with the same rows and columns and other bounds: the
    union LP's, for one of its halves), at most ``HOT_ITERATIONS`` iterations per row; where that
    does not end optimal or infeasible (or ``basis`` is None), ``_highs_solve`` from scratch. The
    value is the exact vertex optimum; ``point`` as in ``_highs_solve`` (that vertex, or the
    interior point from scratch); ``hot``: if a list, HiGHS' basis at the vertex is appended where
    the solution is that vertex. Whether the fallback runs depends on the iteration count alone,
    not on the machine's load.

    ``early``: if a future, it is told a bound on the LP as soon as one is known, as a function of
    a cutoff (``_dual_bound``'s): where the iteration cap ends the dual simplex, the bound its row
    duals give there, before the fallback starts; else the value (-inf where there is none).
    Varied seed 16, 128 layers: the half at weight depth 1 ends its 1,703 iterations at 11.816 s
    (its optimum 11.877 s, from scratch 1.4 s later), already above the bar of the plan it has to
    prove (11.747 s)."""
    value = None
    try:
        if basis is not None:
            import numpy as np
            hc = _highs_object()
            cost, args, const = problem
            rows = _highs_rows(problem)
            h = _highs_model(cost, rows, args["bounds"][:, 0], args["bounds"][:, 1], None,
                             _from_basis_options(rows, HOT_ITERATIONS))
            if h.setBasis(basis) != hc.HighsStatus.kError:
                if not _run(h):
                    return None
                model_status = h.getModelStatus()
                if model_status == hc.HighsModelStatus.kInfeasible:
                    value = float("inf")
                    return value
                if model_status == hc.HighsModelStatus.kOptimal:
                    if point is not None:
                        point.append(np.array(h.getSolution().col_value))
                    if hot is not None:
                        hot.append(h.getBasis())
                    value = float(h.getInfo().objective_function_value) + const
                    return value
                if early is not None and model_status == hc.HighsModelStatus.kIterationLimit:
                    early.set_result(functools.partial(_dual_bound, problem, rows, np.array(h.getSolution().row_dual)))
        value = _highs_solve(problem, point)
        return value
    finally:
        if early is not None:
            _tell(early, -math.inf if value is None else value)


def _tell(future, value: float):
    """Tells ``future`` (an ``early`` future of ``_hot_lp``), unless told already, the bound
    ``value`` whatever the cutoff."""
    if not future.done():
        future.set_result(lambda cutoff=math.inf: value)


def _dual_bound(problem, rows, row_dual, cutoff: float = math.inf) -> float:
    """A lower bound on the LP of ``problem`` (``_highs_rows``' ``rows``) from any row duals (HiGHS'
    signs: d = c − Aᵀy), or ``cutoff`` where that is lower: the Lagrangian ``Σ y·(the row's bound y
    presses on) + Σ d·(the column's bound d presses on)``, each dual pressing on an infinite row
    bound taken as 0 (any duals give a bound). A column whose reduced cost presses on an infinite
    bound takes, where the objective is a sum of nonnegative terms and it has a cost, the ceiling
    that an objective at most ``cutoff`` puts on it (every solution above ``cutoff`` is above the
    value returned), else the bound one of its rows implies (``_implied_bound``); -inf where
    neither exists. A dual simplex stopped early leaves a few such columns (reduced costs of 1e-12
    to 1e-6: the duals' wrong signs, taken as 0, and its perturbed costs). Lowered by
    ``DUAL_ROUND_OFF`` of its size for the sums' round-off."""
    import numpy as np
    import scipy.sparse
    cost, args, const = problem
    cost = np.asarray(cost, dtype=float)
    lower = np.concatenate([r[1] for r in rows])
    upper = np.concatenate([r[2] for r in rows])
    y = np.where((row_dual > 0) & np.isfinite(lower), row_dual, 0.0) + \
        np.where((row_dual < 0) & np.isfinite(upper), row_dual, 0.0)
    d = cost.copy()
    scale = np.abs(d)  # |c| + |A|ᵀ|y|: the size of the terms each reduced cost sums
    start = 0
    for matrix, _, _ in rows:
        part = y[start:start + matrix.shape[0]]
        d -= matrix.T @ part
        scale += abs(matrix).T @ np.abs(part)
        start += matrix.shape[0]
    col_lower, col_upper = args["bounds"][:, 0], args["bounds"][:, 1]
    d[np.abs(d) <= DUAL_ZERO * scale] = 0.0  # the sums' round-off
    pressed = np.where(d > 0, col_lower, np.where(d < 0, col_upper, 0.0))  # the bound each column's d presses on
    open_columns = ~np.isfinite(pressed)
    if open_columns.any() and math.isfinite(cutoff) and (cost >= 0).all() and (col_lower[cost > 0] >= 0).all():
        # an objective of nonnegative terms at most cutoff: c_j·x_j at most cutoff − const
        ceiling = open_columns & (d < 0) & (cost > 0)
        pressed[ceiling] = (cutoff - const) / cost[ceiling] * (1.0 + DUAL_ROUND_OFF)
        open_columns &= ~ceiling
    if open_columns.any():
        a = scipy.sparse.vstack([r[0] for r in rows]).tocsr()
        by_column = a.tocsc()
        for j in np.flatnonzero(open_columns):
            pressed[j] = _implied_bound(a, by_column, lower, upper, col_lower, col_upper, j, d[j] < 0)
            if not np.isfinite(pressed[j]):
                return -math.inf
    value = float(y[y > 0] @ lower[y > 0] + y[y < 0] @ upper[y < 0] + d @ pressed)
    return min(cutoff, value - DUAL_ROUND_OFF * (1.0 + abs(value)) + const)


def _implied_bound(a, by_column, row_lower, row_upper, col_lower, col_upper, j: int, upper: bool) -> float:
    """The tightest ceiling (``upper``) or floor on column ``j`` that one row of ``a`` (a CSR
    matrix, ``by_column`` the same as CSC; row bounds ``row_lower``/``row_upper``) implies with
    every other column at its bounds, widened by ``DUAL_ROUND_OFF`` of its size; ±inf where no row
    implies one."""
    import numpy as np
    best = math.inf if upper else -math.inf
    for k in range(by_column.indptr[j], by_column.indptr[j + 1]):
        i, coef = by_column.indices[k], by_column.data[k]
        if coef == 0:
            continue
        cols, vals = a.indices[a.indptr[i]:a.indptr[i + 1]], a.data[a.indptr[i]:a.indptr[i + 1]]
        others = cols != j
        cols, vals = cols[others], vals[others]
        with np.errstate(invalid="ignore"):  # a stored 0 times an infinite bound: nan, taken as unbounded
            least = np.where(vals > 0, vals * col_lower[cols], vals * col_upper[cols])  # each other term's least
            most = np.where(vals > 0, vals * col_upper[cols], vals * col_lower[cols])   # and greatest
        found = []
        if np.isfinite(row_upper[i]) and np.isfinite(least).all():  # coef·x ≤ row_upper − Σ least
            found.append(((row_upper[i] - least.sum()) / coef, coef > 0))
        if np.isfinite(row_lower[i]) and np.isfinite(most).all():   # coef·x ≥ row_lower − Σ most
            found.append(((row_lower[i] - most.sum()) / coef, coef < 0))
        for value, ceiling in found:
            if ceiling and upper:
                best = min(best, value)
            elif not ceiling and not upper:
                best = max(best, value)
    return best + (1.0 if upper else -1.0) * DUAL_ROUND_OFF * (1.0 + abs(best)) if math.isfinite(best) else best


DUAL_ROUND_OFF = 1e-9
DUAL_ZERO = 1e-12  # a reduced cost this small against the terms it sums is their round-off: 0


# _hot_lp's iteration cap per row of the model. The halves of the union LP from its basis took
# 0-1,300 iterations on the planner.py rows at 64-128 layers (0.01-0.7 s, where the interior point
# from scratch took 0.15-1.3 s a half) but 4,000-20,000 on the hardest varied 128-layer instances
# (1.4-6.6 s against 0.7-2.2 s): at 0.2 a row (about 1,700-2,700 iterations at 64-128 layers, by
# Devex 0.6-1.7 s at 128) the latter fall back early. Varied seeds 11 and 21 at 128
# layers need 2,500-2,900 Devex iterations a half: at 0.1 a row they fell back to the interior
# point (1.1-1.7 s more)
HOT_ITERATIONS = 0.2
# HiGHS' dual simplex edge weights in the LPs started from another LP's basis (_hot_lp,
# _tail_split): 1, Devex. HiGHS' default (dual steepest edge) first computes every basic row's
# weight, one backward solve per row, from an advanced basis: 0.06 s at 64 layers and 0.2-0.5 s
# at 128 before the first iteration, and each iteration costs it about twice Devex's. The random
# row at 64 layers: its depth-2 half 0.079 -> 0.019 s (82 -> 135 iterations), its depth-1 half
# 0.099 -> 0.065 s; varied seed 11 at 128 layers 1.19 and 1.71 s -> 0.58 and 0.50 s a half (2,662
# and 3,017 -> 2,499 and 2,577 iterations). The same optima (``benchmarks/RESULTS.md``, "Devex in
# the LPs from a basis")
HOT_EDGE_WEIGHTS = 1


def _from_basis_options(rows, per_row: float, **extra) -> dict:
    """HiGHS' options for an LP run by dual simplex from another LP's basis (``_hot_lp``,
    ``_tail_split``) on ``rows`` (``_highs_rows``'): no presolve, priced by ``HOT_EDGE_WEIGHTS``,
    at most ``per_row`` iterations per row (at least one); ``extra`` added."""
    limit = max(1, int(per_row * sum(r[0].shape[0] for r in rows)))
    return dict(presolve="off", solver="simplex", simplex_iteration_limit=limit,
                simplex_dual_edge_weight_strategy=HOT_EDGE_WEIGHTS, **extra)

# ``_Solve.rens_from_interior``: whether ``_rens`` from a half of the union LP whose vertex gave a
# plan more than HALF_RETRY_GAPS rel_gaps above the half's bound (or none) runs again from the
# half's interior point
HALF_INTERIOR = True
HALF_RETRY_GAPS = 5.0


def _depth_split(union_built: Built, arrays, basis=None, ends: dict | None = None, early: dict | None = None) -> tuple:
    """The union relaxation's LP with its weight depth indicator fixed at 0 and at 1, solved in
    parallel (HiGHS releases the interpreter lock): ``({1: bound, 2: bound}, {1: solution, 2:
    solution})``, each bound one on every depth pair with that weight prefetch depth (-inf where
    HiGHS could not say; no solution then). At a corner the
    union LP equals the depth pair's own LP or lies a little below it (random 128-layer instance,
    seed 8: 36.437 s at weight depth 2, that pair's LP 36.437 s; 36.773 s at depth 1, its pairs'
    LPs 36.815 s and 36.898 s): two LPs on the model already built stand for four models to build
    and solve. ``ends``: if a dict, HiGHS' basis at each weight depth whose solution is the vertex
    reached from ``basis``, by weight depth (the others' solutions are interior points;
    ``_tail_split`` starts from these bases). ``early``: if a dict, a future per weight depth, told
    a bound on its half as soon as one is known (``_hot_lp``)."""
    problems = [_half_problem(union_built, arrays, dw) for dw in (1, 2)]
    points, hot = ([], []), ([], [])
    # each half from the union LP's basis (_highs_solve's), where there is one (_hot_lp)
    try:
        values = _parallel_lps(problems, points, [basis[0]] * len(problems) if basis else None, hot,
                               [early[dw] for dw in (1, 2)] if early is not None else None)
    finally:
        for future in (early or {}).values():  # told already, unless the LPs failed
            _tell(future, -math.inf)
    if ends is not None:
        ends.update((dw, h[0]) for dw, h in zip((1, 2), hot) if h)
    return ({dw: -math.inf if v is None else v for dw, v in zip((1, 2), values)},
            {dw: pt[0] for dw, pt in zip((1, 2), points) if pt})


def _half_problem(union_built: Built, arrays, weight_prefetch_depth: int):
    """The union model's arrays (``_highs_arrays``) with its weight depth indicator fixed at
    ``weight_prefetch_depth`` (1: 0, 2: 1): the half of the depth pairs with that depth."""
    cost, args, const = arrays
    bounds = args["bounds"].copy()
    bounds[union_built.depth_indicators[0].idx] = 0.0 if weight_prefetch_depth == 1 else 1.0
    return cost, {**args, "bounds": bounds}, const


# _tail_split: how far above its bar each LP's bound must be (relative). HiGHS stops its dual
# simplex on the dual objective of a basis that is dual feasible for its perturbed costs, computed
# with the exact costs (its ``objective_bound`` check): within about 1e-6 of the optimum's bound
TAIL_SPLIT_MARGIN = 1e-5
TAIL_ITERATIONS = 0.2  # _tail_split's dual simplex iterations per row of the model and count, at most


def _tail_split(union_built: Built, arrays, basis, weight_prefetch_depth: int, bar: float, point=None,
                time_limit_s: float = math.inf) -> bool:
    """Whether no plan at ``weight_prefetch_depth`` is faster than ``bar``, by the union LP's half
    at that depth (``_half_problem``) split on the resident tail: every plan keeps some number k of
    the last layers resident, so the least over k of the half's LP with the resident-tail
    indicators fixed at k (the last k at 1, the rest at 0) bounds the half. Each LP runs by dual
    simplex (priced by ``HOT_EDGE_WEIGHTS``) from ``basis`` (the half's vertex, or the union LP's;
    then from a neighbouring k's), stopped as soon as its bound passes ``bar`` (HiGHS'
    ``objective_bound``), from the count nearest the share ``point`` keeps resident; the first
    count whose LP ends below ``bar`` (or in more than ``TAIL_ITERATIONS`` iterations a row) ends
    the split: False.

    Why: the LP keeps tail layers resident in part, and a layer resident in part counts for less
    memory and for less upload time where both bind at once (varied seed 35, 128 layers, depths
    (2, 1): each of the 8 tail layers 0.338 resident, the LP 31.051 s, the least LP over k 31.233 s).
    The LPs to optimality took 9.7 s for the nine counts; stopped at the bar, 0.3-1 s a half on
    varied seeds 10, 17 and 35 at 128 layers, each of whose halves they rule out."""
    import numpy as np
    hc = _highs_object()
    if hc is None or not union_built.r:
        return False
    problem = _half_problem(union_built, arrays, weight_prefetch_depth)
    cost, args, const = problem
    rows = _highs_rows(problem)
    target = bar + TAIL_SPLIT_MARGIN * abs(bar)
    options = _from_basis_options(rows, TAIL_ITERATIONS, objective_bound=target - const, **_time_limit(time_limit_s))
    h = _highs_model(cost, rows, args["bounds"][:, 0], args["bounds"][:, 1], None, options)
    if h.setBasis(basis) == hc.HighsStatus.kError:
        return False
    tail = np.array([var.idx for _, var in sorted(union_built.r.items())], dtype=np.int32)
    n = len(tail)
    start = min(n, max(0, round(sum(point[i] for i in tail)))) if point is not None else 0
    at_start = None
    # up from the count nearest the LP's, then down from it (its basis again): each LP one
    # indicator away from the last (varied seed 17, 128 layers, the depth-2 half: 0.70 s, where
    # the counts by distance from the LP's, alternating sides, took 1.11 s)
    for k in list(range(start, n + 1)) + list(range(start - 1, -1, -1)):
        if k == start - 1 and at_start is not None and h.setBasis(at_start) == hc.HighsStatus.kError:
            return False
        fixed = np.array([1.0 if i >= n - k else 0.0 for i in range(n)])
        h.changeColsBounds(n, tail, fixed, fixed)
        if not _run(h):
            return False
        status = h.getModelStatus()
        if k == start:
            at_start = h.getBasis()
        if status in (hc.HighsModelStatus.kObjectiveBound, hc.HighsModelStatus.kInfeasible):
            continue
        if status == hc.HighsModelStatus.kOptimal and h.getInfo().objective_function_value + const >= target:
            continue
        return False
    return True


def _lp_solver(m: _Model) -> str:
    """The LP solver ``_relaxed``'s "auto" takes for ``m``: HiGHS from ``HIGHS_MIN_NONZEROS`` up, else CLP."""
    return "highs" if m.num_nz >= HIGHS_MIN_NONZEROS else "clp"


def _relaxed(built: Built, *, solver: str = "auto") -> float:
    """The LP relaxation's optimum (inf if infeasible). ``solver="highs"``: HiGHS' interior point
    method (through scipy) on the model's rows, falling back to CLP if it does not end optimal or
    infeasible; ``"clp"``: CBC's LP solver; ``"auto"``: HiGHS from ``HIGHS_MIN_NONZEROS`` nonzeros
    (about 40 layers) up. The same optimum, HiGHS' at most its stopping gap ``IPM_GAP`` below
    (tested); HiGHS took 1.2 s where CLP took 7.1 s on a 128-layer model (10k rows, 66k
    nonzeros), CLP 0.2 s where HiGHS took 0.5 s on an easy 64-layer one."""
    if solver == "auto":
        solver = _lp_solver(built.model)
    if solver == "highs":
        value = _highs_lp(built.model)
        if value is not None:
            return value
    model = built.model.mip_model()
    with _quiet_stdout():
        status = model.optimize(relax=True)
    ok = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
    return float(model.objective_value) if ok else float("inf")


def _timed(fn, *args, background: bool = True) -> concurrent.futures.Future:
    """``fn(*args)`` with its seconds: a future of ``(value, seconds)``, run in a thread of its own
    (HiGHS releases the interpreter lock) unless ``background`` is False (then run here, done)."""
    def timed():
        t = time.perf_counter()
        value = fn(*args)
        return value, time.perf_counter() - t
    if not background:
        future = concurrent.futures.Future()
        future.set_result(timed())
        return future
    return _in_thread(timed)


def _background_lps(builts: list, workers: int = 1, points: list | None = None):
    """Starts ``_relaxed`` of every model in ``builts`` in ``workers`` threads (HiGHS releases the
    interpreter lock; the arrays are read here first, which holds it); returns a function that
    waits for the values (CLP, in this thread, where HiGHS could not say). Two threads solved four
    128-layer LPs in 4.0 s where one took 7.9 s (2 cores). ``points``: if a list, one list per
    model is appended to it, which receives that LP's solution (HiGHS only). The function takes
    ``late``, a predicate on each LP's future (``_Solve.late``): a late LP's value is None."""
    if points is not None:
        points.extend([] for _ in builts)
    arrays = [_highs_arrays(b.model) for b in builts]
    if any(a is None for a in arrays):
        return lambda late=None: [_relaxed(b) for b in builts]
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    futures = [pool.submit(_owned(_highs_solve), a, points[-len(builts) + i] if points is not None else None)
               for i, a in enumerate(arrays)]
    pool.shutdown(wait=False)

    def values(late=None):
        out = []
        for b, f in zip(builts, futures):
            if late is not None and late(f):
                out.append(None)
                continue
            v = f.result()
            out.append(v if v is not None else _relaxed(b, solver="clp"))
        return out
    return values


def _highs_lp(m: _Model) -> float | None:
    """The LP relaxation of ``m`` (a minimisation) solved by HiGHS: its optimum (a bound within
    ``IPM_GAP`` below it), inf when infeasible, None when HiGHS cannot say (or scipy is missing)."""
    arrays = _highs_arrays(m)
    return None if arrays is None else _highs_solve(arrays)


def _highs_arrays(m: _Model, bound_rows: bool = True):
    """``m``'s LP as scipy ``linprog`` arrays, ``(cost, args, objective constant)`` (None without
    scipy). Reads the model: holds the interpreter, unlike :func:`_highs_solve`."""
    try:
        import numpy as np
        import scipy.sparse
        import scipy.optimize  # noqa: F401  (imported here, not in the solver's thread)
    except ImportError:
        return None
    num_vars = m.num_cols
    # the rows and objective are read once per kind (with or without the bound rows) and kept
    # while the rows stay the same ones (as many, the last the same object, held here so that no
    # other row takes its id); only the bounds (which the neighbourhoods fix and restore) are read
    # each time. Nobody changes the arrays in place (the splits copy them)
    key = (num_vars, len(m.rows))
    last = m.rows[-1] if m.rows else None
    kept = m.arrays_kept.get(bound_rows)
    if kept is not None and kept[0] == key and kept[1] is last:
        mats, cost, const = kept[2:]
    else:
        # per kind: each row's sign, length and right-hand side, and all rows' columns and values
        parts = {"ub": ([], [], [], [], []), "eq": ([], [], [], [], [])}
        skip = m.bound_rows if not bound_rows else ()
        column = operator.attrgetter("idx")
        for i, expr in enumerate(m.rows):
            if i in skip:
                continue
            sign = -1.0 if expr.sense == ">" else 1.0
            signs, lengths, rhs, cols, vals = parts["eq" if expr.sense == "=" else "ub"]
            signs.append(sign)
            lengths.append(len(expr.expr))
            rhs.append(-sign * expr.const)
            cols.extend(map(column, expr.expr))
            vals.extend(expr.expr.values())
        mats = {}
        for kind, (signs, lengths, rhs, cols, vals) in parts.items():
            if not rhs:
                mats[kind] = (None, None)
                continue
            lengths = np.array(lengths, dtype=np.int64)
            values = np.array(vals, dtype=float) * np.repeat(np.array(signs), lengths)  # (sign · coefficient)
            rows = np.repeat(np.arange(len(rhs)), lengths)
            mats[kind] = (scipy.sparse.csr_matrix((values, (rows, np.array(cols, dtype=np.int64))),
                                                  shape=(len(rhs), num_vars)), np.asarray(rhs))
        objective = m.objective
        cost = np.zeros(num_vars)
        for var, coef in objective.expr.items():
            cost[var.idx] = coef
        const = float(objective.const)
        m.arrays_kept[bound_rows] = (key, last, mats, cost, const)
    lb = np.array([v.lb for v in m.vars], dtype=float)
    ub = np.array([v.ub for v in m.vars], dtype=float)
    ub[ub >= 1e30] = np.inf
    args = dict(A_ub=mats["ub"][0], b_ub=mats["ub"][1], A_eq=mats["eq"][0], b_eq=mats["eq"][1],
                bounds=np.stack([lb, ub], axis=1), method="highs-ipm")
    return cost, args, const


def _highs_solve(arrays, point: list | None = None, basis: list | None = None,
                 time_limit_s: float = math.inf) -> float | None:
    """:func:`_highs_lp` on prepared arrays (HiGHS itself releases the interpreter lock).
    ``point``: if a list, the LP's solution (its variable values) is appended to it when optimal.

    Only a bound is needed: HiGHS' interior point method ends without a crossover to a vertex and
    without presolve (nothing to undo; a quarter less time at 64-128 layers), its value lowered
    by its gap tolerance; where it does not end optimal or infeasible, HiGHS' defaults (crossover:
    an exact vertex optimum). Through scipy's bundled HiGHS object where it is there
    (``_highs_object``), whose run never takes the interpreter lock, else scipy's ``linprog``,
    whose wrapper takes it back now and then.

    ``basis``: if a list (and HiGHS' object is there), the interior point is followed by its
    crossover to a vertex (the value then exact, the solution that vertex) and HiGHS' basis there
    is appended to it, for ``_hot_lp``: 5-25 % more time on the union LP at 64-128 layers, and its
    halves then take 0.02-0.7 s where they took 0.15-1.3 s.

    ``time_limit_s``: HiGHS' time limit (each of its runs); an LP it stops is one HiGHS cannot say
    (None)."""
    const = arrays[2]
    if _highs_object() is not None:
        status, fun, x = _highs_lp_direct(arrays, basis, time_limit_s)
    else:
        status, fun, x = _highs_lp_scipy(arrays, time_limit_s)
    if status == "infeasible":
        return float("inf")
    if status is None:
        return None
    if point is not None:
        point.append(x)
    return fun - (IPM_GAP * (1.0 + abs(fun)) if status == "interior" else 0.0) + const


IPM_OPTIONS = dict(presolve="off", solver="ipm", run_crossover="off", ipm_optimality_tolerance=IPM_GAP)


def _time_limit(time_limit_s: float) -> dict:
    """HiGHS' ``time_limit`` option for ``time_limit_s`` (none where it is infinite)."""
    return {"time_limit": float(time_limit_s)} if math.isfinite(time_limit_s) else {}


def _highs_lp_direct(arrays, basis: list | None = None, time_limit_s: float = math.inf):
    """The LP of ``arrays`` by scipy's bundled HiGHS object: ``(status, objective, x)``, status
    "interior" (the interior point's end), "vertex" (HiGHS' defaults, where the interior point did
    not end optimal; or its crossover, where ``basis`` is a list, which then receives the basis),
    "infeasible" or None (HiGHS could not say, or stopped at ``time_limit_s``)."""
    import numpy as np
    hc = _highs_object()
    cost, args, _ = arrays
    bounds, rows = args["bounds"], _highs_rows(arrays)
    limit = _time_limit(time_limit_s)
    first = ("interior", IPM_OPTIONS) if basis is None else ("vertex", {**IPM_OPTIONS, "run_crossover": "on"})
    for status, options in (first, ("vertex", {})):
        h = _highs_model(cost, rows, bounds[:, 0], bounds[:, 1], None, {**options, **limit})
        if not _run(h):
            return None, None, None
        model_status = h.getModelStatus()
        if model_status == hc.HighsModelStatus.kTimeLimit:
            return None, None, None
        if model_status == hc.HighsModelStatus.kInfeasible:
            return "infeasible", None, None
        if model_status == hc.HighsModelStatus.kOptimal:
            if basis is not None and h.getBasis().valid:
                basis.append(h.getBasis())
            return status, float(h.getInfo().objective_function_value), np.array(h.getSolution().col_value)
    return None, None, None


def _highs_lp_scipy(arrays, time_limit_s: float = math.inf):
    """:func:`_highs_lp_direct` through scipy's ``linprog``."""
    from scipy.optimize import linprog
    cost, args, _ = arrays
    limit = _time_limit(time_limit_s)
    # scipy passes HiGHS options it does not list on to HiGHS, with a warning; ours is meant. A
    # filter for that message alone (put first again on each call: catch_warnings around the call
    # is not thread-safe, and these LPs run in threads side by side)
    warnings.filterwarnings("ignore", message=r"Unrecognized options detected: \{'run_crossover': 'off'\}")
    res = linprog(cost, **args, options=dict(presolve=False, run_crossover="off", ipm_optimality_tolerance=IPM_GAP,
                                             **limit))
    if res.status == 0 and res.fun is not None:
        return "interior", float(res.fun), res.x
    if res.status == 2:
        return "infeasible", None, None
    if limit and res.status == 1:  # its time limit (or iteration limit) reached
        return None, None, None
    res = linprog(cost, **args, options=limit)  # HiGHS' defaults (crossover): exact vertex optimum
    if res.status == 0:
        return "vertex", float(res.fun), res.x
    if res.status == 2:
        return "infeasible", None, None
    return None, None, None


def decode(built: Built, costs, hardware, *, status: str, bound: float | None, solve_time_s: float) -> Plan:
    """The Plan of a solved model's variable values, its predictions from the step model.

    The gap is (predicted − min(bound, predicted)) / predicted (never negative).
    """
    L = built.num_layers
    val = built.solved.value if built.solved is not None and built.solved.values is not None else (lambda v: v.x)
    tiers = ["device"] * (L + 1)
    for i in range(1, L):
        if sum(val(v) for v in built.out_edges[i]) < 0.5:
            tiers[i] = "drop"
        elif i in built.host and val(built.host[i]) > 0.5:
            tiers[i] = "host"
        elif i in built.nv and val(built.nv[i]) > 0.5:
            tiers[i] = "nvme"
    keep = [l in built.res and val(built.res[l]) > 0.5 for l in range(L)]
    offload = [l in built.off and val(built.off[l]) > 0.5 for l in range(L)]
    k = sum(1 for l in built.r if val(built.r[l]) > 0.5)
    plan = Plan.create(costs, hardware, name="milp", boundary_tiers=tiers, keep_residuals=keep,
                       offload_residuals=offload, resident_tail=k,
                       weight_prefetch_depth=built.weight_prefetch_depth, act_prefetch_depth=built.act_prefetch_depth,
                       solver_status=status, solve_time_s=solve_time_s)
    value = plan.predicted_step_time_s
    gap = 0.0 if bound is None or value <= 0 else max(0.0, (value - min(bound, value)) / value)
    return plan.replace(gap=gap)


def solve(costs, hardware, *, max_segment_length: int = 8, max_resident_tail: int = 8,
          time_limit_s: float = 30.0, rel_gap: float = DEFAULT_REL_GAP, warm_start: Plan | None = None,
          objective: str = "time", cutoff: float | None = None, depths=MILP_DEPTHS,
          search_evaluations: int = search.DEFAULT_EVALUATIONS, max_nodes: int = DEFAULT_MAX_NODES,
          residual_offload: bool = True, verbose: bool = False, stats: dict | None = None) -> Plan | None:
    """Solves the planning MILP for ``costs`` on ``hardware``, choosing the prefetch depths too.

    Args:
      costs: Costs (batch, seq and micro-batches fixed); hardware: Hardware (budgets, rates).
      max_segment_length: longest recompute segment (edges (s, e) with e − s ≤ this).
      max_resident_tail: largest resident tail considered.
      time_limit_s: the whole solve's time limit. Every branch-and-bound run (CBC or HiGHS, the
        neighbourhoods' small ones too) may take what is left of it, and HiGHS' runs, and the LPs
        and splits run beside the solve (the union LP, its depth and offload splits, the tail
        split), are waited for at most ``HIGHS_LATE_S`` past it (``_run_by``, ``_Solve.late``),
        and the LPs it solves in its own thread get what is left of it; once it has passed, no
        depth pair is branched on (its LP is its bound) and the best plan comes back with its gap:
        without the union LP, the best start against the bound on every plan
        (``bounds.lower_bound``). The model's build and the search always run (about 0.3-1 s at 64
        layers and 1.5-2.5 s at 128 on a 2-core machine).
      rel_gap: relative optimality gap at which the solve stops (``lt.plan`` uses the same default).
      warm_start: a Plan inside the decision space to start from (e.g. the best heuristic).
      objective: ``time`` (predicted step time) or ``memory`` (minimum peak device bytes, ignoring
        the device budget: used to report what would be feasible; depths 1).
      cutoff: only plans with an objective below this are of interest (None when there is none).
      depths: the (weight_prefetch_depth, act_prefetch_depth) pairs to choose from (1 or 2 each).
      search_evaluations: move evaluations of the search heuristic that provides the start.
      max_nodes: branch-and-bound nodes per depth pair. Node and evaluation counts, not
        seconds, bound the work, so the same input gives the same plan whatever the machine load
        (as long as ``time_limit_s``, a safety net, is not reached first).
      residual_offload: whether kept residuals may live on the host (``Plan.offload_residuals``).
      stats: if a dict, filled with where the seconds went: ``search_s`` (the search at depths
        (1, 1), and again at a depth pair the union LP or that pair's LP leaves room for, and
        ``search.polish`` at a pair's depths), ``lp_s`` (LP relaxations,
        ``lp_solves`` of them; the LP for all depth pairs is solved while the search runs, so the
        two overlap), ``neighbourhood_s`` (``_tier_neighbourhood``: the best boundary tiers for an
        unproved start's path and residuals, a small MILP per depth pair, then
        ``_residual_neighbourhood``'s probes), ``rens_s`` (the LP neighbourhoods of large models,
        ``rens_runs`` of them: ``_rens`` with its tier neighbourhood, ``_rins``), ``bb_s`` (branch and
        bound, ``bb_runs`` of them: CBC's or HiGHS', ``MIP_SOLVER``; HiGHS' root with a cutoff
        counts as one), ``bound`` (a lower bound on every plan's step time, also where nothing beats
        ``cutoff`` and None is returned) and ``proof``
        (``union_lp``: the LP for every depth pair, split in two on the residual offload where it leaves
        room (``_offload_split``), proved the gap; ``depth_lps``: each depth pair's LP
        did; ``cbc`` / ``highs``: that solver branched).
    Returns:
      The optimal (or best found) Plan, or None when no plan fits the budgets (or beats ``cutoff``).
    Example:
      >>> plan = solve(costs, Hardware.preset("h800"))
    """
    with _quick_thread_switches(), _solve_threads():
        return _solve(costs, hardware, max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                      time_limit_s=time_limit_s, rel_gap=rel_gap, warm_start=warm_start, objective=objective,
                      cutoff=cutoff, depths=depths, search_evaluations=search_evaluations, max_nodes=max_nodes,
                      residual_offload=residual_offload, verbose=verbose, stats=stats)


SWITCH_INTERVAL_S = 5e-4  # the interpreter's thread switch interval during a solve (Python's default: 5 ms)
_SWITCH_LOCK = threading.Lock()
_SWITCH_DEPTH = [0, None]  # solves running now, the interval to restore when the last ends


@contextlib.contextmanager
def _quick_thread_switches():
    """The interpreter's thread switch interval at most ``SWITCH_INTERVAL_S`` while solves run (the
    previous one restored when the last ends). HiGHS runs in threads beside the search and the
    model building, which hold the interpreter lock, and scipy's HiGHS wrapper takes that lock back
    now and then: at Python's default 5 ms it waited for it, at 0.5 ms not (the union LP of the
    random row at 64 layers beside the search: 0.58 s against 0.48 s alone and beside it;
    ``benchmarks/RESULTS.md``, "Thread switches during a solve"). The plans are the same."""
    with _SWITCH_LOCK:
        if _SWITCH_DEPTH[0] == 0:
            _SWITCH_DEPTH[1] = sys.getswitchinterval()
            sys.setswitchinterval(min(_SWITCH_DEPTH[1], SWITCH_INTERVAL_S))
        _SWITCH_DEPTH[0] += 1
    try:
        yield
    finally:
        with _SWITCH_LOCK:
            _SWITCH_DEPTH[0] -= 1
            if _SWITCH_DEPTH[0] == 0:
                sys.setswitchinterval(_SWITCH_DEPTH[1])


LEFTOVER_NICE = 19  # the niceness a solve's unfinished LP threads get when it returns (Linux)


class _SolveToken:
    """One solve, for its worker threads (``_owned``): ``stopped`` once it has returned, and the
    HiGHS objects they are running (``_run``), to be stopped then."""

    def __init__(self, parent=None):
        self.stopped = False
        self.running = set()
        self.parent = parent   # the solve's token, for a part of it stopped on its own (``_cutoff_roots``)


def _interrupt(callback_type, message, data_out, data_in, user_data):
    data_in.user_interrupt = True


def _run(h) -> bool:
    """``h.run()`` (a HiGHS object of ``_highs_model``), stoppable by the calling thread's solve
    once that has returned (``_solve_threads``): False where it was stopped, before or during the
    run (its result is then not to be read). HiGHS' interrupt callback is set here but started only
    to stop the run: started from the outset, it takes the interpreter lock at every inner
    iteration (10,634 calls in one 128-layer LP)."""
    owner = getattr(_OWNER, "solve", None)
    if owner is None:
        h.run()
        return True
    h.setCallback(_interrupt, None)
    with _RUNNING_LOCK:
        if owner.stopped:
            return False
        owner.running.add(h)
    try:
        h.run()
    finally:
        with _RUNNING_LOCK:
            owner.running.discard(h)
    return not owner.stopped


def _stop(owner: _SolveToken):
    """Marks ``owner``'s solve as returned and interrupts the HiGHS runs its threads still make."""
    with _RUNNING_LOCK:
        owner.stopped = True
        running, owner.running = list(owner.running), set()
    hc = _highs_object() if running else None
    for h in running:
        for kind in (hc.cb.HighsCallbackType.kCallbackIpmInterrupt, hc.cb.HighsCallbackType.kCallbackSimplexInterrupt,
                     hc.cb.HighsCallbackType.kCallbackMipInterrupt):
            h.startCallback(kind)
_OWNER = threading.local()  # .solve: the token of the solve the current thread works for
_RUNNING = {}               # native thread id -> the token of the solve it works for, while it works
_RUNNING_LOCK = threading.Lock()


def _owned(fn, owner=None):
    """``fn`` to run in a worker thread for the calling thread's solve (``_solve_threads``), or for
    ``owner`` (a token) where given: while it runs, its thread is registered as that token's (and
    threads it starts are too)."""
    owner = owner or getattr(_OWNER, "solve", None)
    if owner is None:
        return fn

    def run(*args):
        tid = threading.get_native_id()
        _OWNER.solve = owner
        with _RUNNING_LOCK:
            _RUNNING[tid] = owner
        try:
            return fn(*args)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.pop(tid, None)
            _OWNER.solve = None
    return run


@contextlib.contextmanager
def _solve_threads():
    """One solve's worker threads: when it returns, the HiGHS runs they still make (LPs started
    beside a step and not waited for once the plan was proved) are interrupted (``_stop``), and
    those threads get niceness ``LEFTOVER_NICE`` on Linux, so that what is left of them runs on
    idle cores only. The random row of
    ``benchmarks/planner.py`` at 128 layers leaves three LPs running; the qwen3-32b row at 64
    layers right after it took 1.47 s with them at niceness 0, 0.89 s at 19, 0.82 s once they had
    ended (``benchmarks/planner_probes.py leftover``)."""
    token = _SolveToken()
    previous = getattr(_OWNER, "solve", None)
    _OWNER.solve = token
    try:
        yield
    finally:
        _OWNER.solve = previous
        _stop(token)
        if sys.platform.startswith("linux"):
            # under the lock: a registered thread is still in its task, so its id is still its own
            with _RUNNING_LOCK:
                for tid in [tid for tid, owner in _RUNNING.items() if token in (owner, owner.parent)]:
                    try:
                        os.setpriority(os.PRIO_PROCESS, tid, LEFTOVER_NICE)
                    except OSError:
                        pass


def stopping_threads():
    """A context in which the HiGHS runs started in threads of their own (``lp_bound_started``) are
    stopped where still running at its end, as a solve's are (``_solve_threads``)."""
    return _solve_threads()


def _solve(costs, hardware, *, max_segment_length, max_resident_tail, time_limit_s, rel_gap, warm_start, objective,
           cutoff, depths, search_evaluations, max_nodes, residual_offload, verbose, stats):
    """:func:`solve` (its thread switch interval set)."""
    t0 = time.perf_counter()
    stats = {} if stats is None else stats
    stats.update(search_s=0.0, lp_s=0.0, lp_solves=0, neighbourhood_s=0.0, rens_s=0.0, rens_runs=0, bb_s=0.0, bb_runs=0,
                 proof="depth_lps")
    kw = dict(max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
              residual_offload=residual_offload, verbose=verbose)
    if objective == "memory":
        built = build(costs, hardware, objective="memory", **kw)
        status = _optimize(built, rel_gap, time_limit_s, None)
        if status is None:
            return None
        return decode(built, costs, hardware, status=status, bound=None, solve_time_s=time.perf_counter() - t0)
    if objective != "time":
        raise ValueError(f"objective={objective!r}; valid: ['time', 'memory']")
    run = _Solve(costs, hardware, kw, t0=t0, time_limit_s=time_limit_s, rel_gap=rel_gap, warm_start=warm_start,
                 cutoff=cutoff, depths=depths, search_evaluations=search_evaluations, max_nodes=max_nodes,
                 stats=stats)
    plan = run.union_phase()
    if plan is not None:
        stats["bound"] = plan.predicted_step_time_s * (1 - plan.gap)
        return plan
    plan = run.depth_phase()
    stats["bound"] = run.best_bound
    return plan


def first_fitting(costs, hardware, *, max_segment_length: int = 8, max_resident_tail: int = 8,
                  time_limit_s: float = 30.0, residual_offload: bool = True,
                  rel_gap: float | None = None) -> Plan | None:
    """The first plan the branch and bound finds whose peak fits ``hardware``'s budgets, on the
    memory model cut off at the device budget (None when it finds none within ``time_limit_s``, or
    proves that none exists). Where the question is only whether something fits (the largest
    batch, a start for the time MILP), it stops at a fitting plan or a root bound above the budget
    instead of proving the least peak: the 64-layer Qwen3.6-27B shape on an H800 at batches
    393-512, 11-31 s a batch to the least peak (most at the 30 s limit).
    ``rel_gap``: accepted with the other options of a time solve (``lt.plan``'s), not used: the
    first fitting plan is the answer."""
    built = build(costs, hardware, objective="memory", max_segment_length=max_segment_length,
                  max_resident_tail=max_resident_tail, residual_offload=residual_offload)
    # a relative gap of 1 stops at the first plan (the peak's bound is never negative); the cutoff
    # leaves only plans under the budget
    status = _optimize(built, 1.0, time_limit_s, hardware.device_memory * (1 + 1e-9))  # Plan.fits' tolerance
    if status is None:
        return None
    plan = decode(built, costs, hardware, status="feasible", bound=None, solve_time_s=0.0)
    return plan.replace(name="first-fitting", gap=None) if plan.fits() else None


class _Solve:
    """One ``solve(objective="time")``: the state its phases share and the phases themselves.

    ``union_phase`` (one LP for every depth pair, beside the search; then the LP's neighbourhoods,
    the searches at the other depth pairs, the splits of the union LP and HiGHS' roots on its
    halves) returns the plan where that proves it; ``depth_phase`` then takes each depth pair (its
    LP, the search for it, local search and neighbourhoods at its depths) and ``branch``es on the
    pairs still open, and ``result`` reports the best plan with the gap of every pair's bound.
    """

    def __init__(self, costs, hardware, kw, *, t0, time_limit_s, rel_gap, warm_start, cutoff, depths,
                 search_evaluations, max_nodes, stats):
        self.costs, self.hardware, self.kw, self.t0 = costs, hardware, kw, t0
        self.rel_gap, self.cutoff, self.depths = rel_gap, cutoff, depths
        self.deadline = t0 + time_limit_s  # the whole solve's (``left``, ``expired``)
        self.search_evaluations, self.max_nodes, self.stats = search_evaluations, max_nodes, stats
        self.residual_offload = kw["residual_offload"]
        L = self.L = costs.num_layers
        self.S = max(1, min(kw["max_segment_length"], L))
        self.K = max(0, min(kw["max_resident_tail"], L))
        self.found = None          # the search's plan (depths 1)
        self.union_built = None    # the LP for every depth pair (built when rel_gap > 0 and depths vary)
        self.arrays = None         # its HiGHS arrays (large models)
        self.union_point = []      # the union LP's solution, when HiGHS solved it
        self.union_basis = []      # HiGHS' basis at that solution (a vertex), for the depth split
        self.union = None          # its value (raised by the splits)
        self.searched = {}         # (dw, da) -> the search's plan for that depth pair (_search_for_depths)
        self.polished = {}         # id(plan) -> (plan, its polished plan, whether with the full budget)
        self.prebuilt = {}         # (dw, da) -> that depth pair's model, built by the union phase (_rens)
        self.depth_bounds = {}     # weight prefetch depth -> a bound on its depth pairs (_depth_split)
        self.depth_points = {}     # weight prefetch depth -> that bound's LP solution
        self.depth_vertices = set()  # the weight depths whose depth_points are vertices (depth_ends' at the join; half_point)
        self.depth_ends = {}       # weight depth -> HiGHS' basis at that vertex (tail_split starts there)
        self.rens_done = set()     # the depth pairs rens_at has run at
        self.rounded = False       # round_union has run
        self.offload_split = None  # the offload split's future (start_offload_split), once started
        self.offload_split_joined = False  # its bound taken into the union LP (join_splits)
        self.halves_done = False       # half_neighbourhoods has run
        self.pattern_done = False      # offload_pattern has run
        self.rooted = None             # the plan HiGHS' roots on the union LP's halves were last asked to beat (settle)
        self.interior_retried = False  # union_interior_retry has run
        self.pair_proof = None         # the plan the depth pairs' own LPs prove (pair_lps)
        self.tail_proof = None         # the plan the union LP's halves split on the resident tail prove (tail_split)
        self.tail_split_for = None     # the plan tail_split last ran for
        self.pair_bounds = {}          # (dw, da) -> that pair's LP raised by its offload split (pair_lps)
        self.pairs_done = False        # pair_lps has run
        self.depth_split = None    # the depth split's future (split_on_depth), until joined into depth_bounds
        self.depth_early = {}      # weight depth -> a future of its half's first bound (join_depth_split)
        self.carried = None        # the union phase's best plan, when the union LP does not prove it
        self.far = None            # the depth pair HiGHS starts with, when that plan is far from the union LP
        self.best, self.best_bound = None, float("inf")
        self.heuristic = None      # the best unproved plan of the depth phase (rel_gap > 0)
        self.incumbent = None      # the union phase's best plan
        self.weights = sorted({d[0] for d in depths})  # the weight prefetch depths (halves of the union LP)
        union_lp = None
        if rel_gap > 0 and len(depths) > 1 and (search_evaluations >= 0 or warm_start is not None):
            # one LP for all depth pairs (its plan is checked against it below). Built here; a large
            # one is then solved by HiGHS in a thread while the search runs (HiGHS releases the
            # interpreter lock, building and reading the model do not)
            t = time.perf_counter()
            self.union_built = build(costs, hardware, union=True, **kw)
            arrays = self.arrays = (_highs_arrays(self.union_built.model)
                                    if _lp_solver(self.union_built.model) == "highs" else None)
            stats["lp_s"] += time.perf_counter() - t
            if arrays is not None:
                union_lp = _timed(_highs_solve, arrays, self.union_point, self.union_basis)
        if search_evaluations >= 0:
            t = time.perf_counter()
            self.found = search.heuristic_plan(costs, hardware, max_segment_length=self.S, max_resident_tail=self.K,
                                               max_evaluations=search_evaluations, starts=[warm_start],
                                               residual_offload=self.residual_offload)
            stats["search_s"] = time.perf_counter() - t
        if warm_start is not None and not self.residual_offload and any(warm_start.offload_residuals):
            warm_start = None  # outside the space asked for
        self.warm_start = warm_start
        starts = [q for q in (_at_depths(p, dw, da) for p in (self.found, warm_start) for dw, da in depths)
                  if q is not None]
        self.incumbent = min(starts, key=lambda q: q.predicted_step_time_s, default=None)
        self.union_late = union_lp is not None and self.late(union_lp)
        if union_lp is not None and not self.union_late:
            self.union, seconds = union_lp.result()
            stats["lp_s"] += seconds
            stats["lp_solves"] += 1
        if self.union_built is not None and self.union is None and not self.union_late:
            # a small model (CLP), or HiGHS could not say
            self.union = self.timed_lp(self.union_built, "auto" if union_lp is None else "clp")
        # HiGHS' branch and cut follows for models this large (``_mip_solver``): the depth pairs'
        # cheap part (LP, search, neighbourhoods) is then left to it
        self.direct = rel_gap > 0 and self.union_built is not None and _mip_solver(self.union_built.model) == "highs"

    # -- shared steps ------------------------------------------------------------------------

    def left(self) -> float:
        """The seconds a solver run started now may take: what is left of the solve's time limit
        (at least ``MIN_RUN_S``)."""
        return max(MIN_RUN_S, self.deadline - time.perf_counter())

    def expired(self) -> bool:
        """Whether the solve's time limit has passed (no depth pair is branched on after it)."""
        return time.perf_counter() >= self.deadline

    def late(self, future) -> bool:
        """Whether ``future`` (a step run beside this thread: an LP, a split) has not ended by
        ``HIGHS_LATE_S`` past the solve's time limit, waited for until then. What a late one runs is
        left behind, unread, and stopped when the solve returns (``_solve_threads``). Varied seed 10
        at 128 layers with a 5 s limit: the depth split's second half, from scratch after its
        iteration cap, held the solve to 8.5 s; the union LP at 128 layers takes 2-4 s."""
        if not math.isfinite(self.deadline) or future.done():
            return False
        try:
            future.result(timeout=self.wait_s())
        except concurrent.futures.TimeoutError:
            return True
        return False

    def wait_s(self) -> float | None:
        """How long a step run beside this thread may still be waited for: until ``HIGHS_LATE_S``
        past the solve's time limit (None: no limit)."""
        if not math.isfinite(self.deadline):
            return None
        return max(0.0, self.deadline + HIGHS_LATE_S - time.perf_counter())

    def union_bound(self, dw: int) -> float:
        """The union LP's bound on the depth pairs with weight prefetch depth ``dw``: its half's
        where the union LP was split (``_depth_split``), else the union LP's own."""
        return self.depth_bounds.get(dw, self.union)

    def timed_lp(self, built, solver="auto"):
        t = time.perf_counter()
        value = _relaxed(built, solver=solver)
        self.stats["lp_s"] += time.perf_counter() - t
        self.stats["lp_solves"] += 1
        return value

    def search_at(self, dw, da):
        if (dw, da) not in self.searched:
            t = time.perf_counter()
            self.searched[dw, da] = _at_depths(_search_for_depths(self.costs, self.hardware, dw, da, self.S, self.K,
                                                                  self.search_evaluations, self.residual_offload),
                                               dw, da)
            self.stats["search_s"] += time.perf_counter() - t
        return self.searched[dw, da]

    def polish(self, plan, quick=False):
        """``search.polish(plan)``, once per plan. ``quick``: a quarter of the search's budget (most
        of a full budget goes to the last pass, which finds no move); a later full polish continues
        from the quick one's plan."""
        entry = self.polished.get(id(plan))
        if entry is not None and (entry[2] or quick):
            return entry[1]
        t = time.perf_counter()
        budget = max(1, search.DEFAULT_EVALUATIONS // 4) if quick else None
        result = search.polish(entry[1] if entry is not None else plan, max_segment_length=self.S,
                               max_evaluations=budget, residual_offload=self.residual_offload)
        self.polished[id(plan)] = (plan, result, not quick)
        self.polished.setdefault(id(result), (result, result, not quick))  # a later polish continues from it
        self.stats["search_s"] += time.perf_counter() - t
        return result

    def improve(self, built, plan, lp):
        """``plan``, or where its depth pair's LP does not prove it, the best boundary tiers for its
        path and residuals (``_tier_neighbourhood``: a small MILP on this model, the rest fixed),
        then more residuals kept with the tiers that make their room (``_residual_neighbourhood``)."""
        if plan is None or plan.predicted_step_time_s - lp <= self.rel_gap * plan.predicted_step_time_s:
            return plan
        t = time.perf_counter()
        q = _tier_neighbourhood(built, plan, self.costs, self.hardware, self.left())
        if q is not None and q.predicted_step_time_s < plan.predicted_step_time_s:
            plan = q
        plan = _residual_neighbourhood(built, plan, self.costs, self.hardware, self.left())
        self.stats["neighbourhood_s"] += time.perf_counter() - t
        return plan

    def union_proves(self, plan, raised=0.0):
        """Whether the union LP (``raised`` seconds higher) proves ``plan`` within rel_gap."""
        value = plan.predicted_step_time_s
        return (self.cutoff is None or value < self.cutoff) and value - (self.union + raised) <= self.rel_gap * value

    def counted(self, neighbourhood, *args):
        """``neighbourhood(*args)``, its seconds and run counted in ``stats`` (``rens_s``, ``rens_runs``)."""
        t = time.perf_counter()
        found = neighbourhood(*args)
        self.stats["rens_s"] += time.perf_counter() - t
        self.stats["rens_runs"] += 1
        return found

    def rens_at(self, built, point, tail=False):
        """_rens at ``built``'s depth pair from ``point`` (a solution of the union LP, or of one of
        its halves): the plan, or None. Once per depth pair. Where the union LP does not prove the
        sub-MIP's plan, it is polished (``polish``, quick), the splits started beside this step are joined
        and, with ``tail``, the tail split is run for the polished plan (``tail_split``); where
        none proves it, the sub-MIP plan's boundary tiers are chosen again
        (``_tier_neighbourhood``), that plan polished in turn, and the faster of the two kept."""
        self.rens_done.add((built.weight_prefetch_depth, built.act_prefetch_depth))

        def run():
            found = _rens(built, self.union_built, point, self.costs, self.hardware, self.rel_gap, self.left(),
                          min(self.max_nodes, RENS_MAX_NODES))
            if found is None or self.union_proves(found):
                return found
            # polished first (local search on the step model at the plan's depths, a quarter of the
            # search's budget: 0.05-0.3 s at 128 layers): the sub-MIP's plans leave moves the
            # search finds at once (varied seeds at 128 layers: 8, 11.0668 -> 11.0214 s and 0,
            # 36.749 -> 36.630 s, both at the limit; 17, 13.1347 -> 13.1333 s, which the depth
            # split then proves where the tail split had to). The full budget gave 8 of 80 varied
            # plans at 64 and 128 layers up to 0.08 % faster, but took seeds 11 and 16 at 128
            # layers 0.35-0.9 s longer, to 4.4-5.0 s (benchmarks/RESULTS.md)
            q = self.polish(found, quick=True)
            if self.union_proves(q):
                return q
            # the splits' bounds first (joined after this step anyway): where they prove the plan,
            # its tiers are not chosen again (random heterogeneous instance, 64 layers: the depth
            # split, done before the neighbourhood ends, proves its 17.40 s plan; the tiers took
            # 0.11 s more and found nothing); so the tail split (varied seed 10, 128 layers: it
            # proves the plan, the tiers took 0.16 s more before it)
            self.join_splits(q)
            if tail and not self.union_proves(q):
                self.tail_split(q)
            if self.tail_proof is None and not self.union_proves(q) and not self.expired():
                # the tiers chosen again for the sub-MIP's own plan, not the polished one, whose
                # moves may lead away from the better tiers (varied seed 0, 64 layers: 18.9034 s,
                # polished 18.8755 s, its tiers 18.8718 s; the plan's own tiers 18.8598 s), and
                # the result polished in turn
                better = _tier_neighbourhood(built, found, self.costs, self.hardware, self.left(),
                                             gap=RENS_GAP * self.rel_gap)
                if better is not None and better.predicted_step_time_s < found.predicted_step_time_s:
                    better = self.polish(better, quick=True)
                    if better.predicted_step_time_s < q.predicted_step_time_s:
                        q = better
            return q
        return self.counted(run)

    def build_at(self, dw, da):
        return build(self.costs, self.hardware, weight_prefetch_depth=dw, act_prefetch_depth=da, **self.kw)

    def model_at(self, d):
        """Depth pair ``d``'s model, built once for the solve (``prebuilt``; the neighbourhoods
        restore the bounds they fix)."""
        if d not in self.prebuilt:
            self.prebuilt[d] = self.build_at(*d)
        return self.prebuilt[d]

    # -- the union phase ---------------------------------------------------------------------

    def union_phase(self):
        """The union LP against the best start, then (unproved) the LP's neighbourhoods and the
        searches at the other depth pairs, in the order that suits the start's distance from the
        LP, the residual offload split and HiGHS' roots on the union model's halves: the plan where
        these prove it, else None (the best plan so far carried into ``depth_phase``)."""
        if self.union is None:
            return None
        if self.incumbent is None and self.direct and self.union_point and not self.expired():
            # no start fits (the search found none, no warm start): the union LP's first
            # neighbourhood may give one (varied seed 26, 128 layers, room for 15 % of the
            # boundaries: HiGHS' branch and cut on depths (1, 1) took 11.3 s to its first plan)
            self.rens_in_union_phase(self.union_point[0])
        if self.incumbent is None:
            return None
        rel_gap, cutoff = self.rel_gap, self.cutoff
        # one LP for all depth pairs: when it proves the best start, no per-depth model is needed.
        # Where it does not, the search's plans for the other depth pairs are tried against it
        # before the per-depth LPs, and then the best of them polished at its own depths
        value = self.incumbent.predicted_step_time_s
        if self.direct and self.union_point and value - self.union > UNION_SEARCH_GAPS * rel_gap * value:
            # far from the union LP: the search at the other depth pairs (2.5 s each at 128
            # layers) is skipped, and HiGHS, if it branches, starts at the pair the LP leans to
            self.far = _leaning(self.union_point[0], self.union_built, self.depths, self.tie())[0]
        # a start far from the union LP: the LP's neighbourhoods first (the searches found nothing
        # within 1 % on the random instances); more than NEIGHBOURHOODS_FIRST_GAPS above it, the
        # same order, the searches last (after the first neighbourhood they took 2.0-2.1 s on the
        # qwen3-32b and dense-27b shapes on the H200 with room for a third of the boundaries at 128
        # layers, where the offload pattern then proved a faster plan: 4.5 -> 2.3 s each; llama3-8b
        # H200 at 64 layers 2.2 -> 1.5 s; varied seeds 3 and 7 at 64 layers, whose searches found
        # the plan, 0.1-0.2 s more); near it, the searches first (qwen2.5-3b shape on an H200 with room for a third of the
        # boundaries, 64 layers: proved by the searches in 2.2 s where the neighbourhood took 7 s).
        # The first step runs beside the offload split where that alone may prove the start
        # (start_offload_split)
        neighbourhood_first = self.direct and self.union_point and \
            value - self.union > NEIGHBOURHOODS_FIRST_GAPS * rel_gap * value
        # the depth split, where the union LP takes the weight depth fractionally, runs beside the
        # first step too when that step is a neighbourhood (random heterogeneous instance, 64
        # layers: the split proves the start; after the first neighbourhood 1.09-1.16 s, beside
        # it 1.00-1.05 s; the varied 128-layer instances take the same time or less)
        self.round_union()
        self.start_offload_split()
        self.start_depth_split()
        self.prove_early()
        # the offload pattern (offload_pattern) right after the first neighbourhood where the searches
        # come last, after the searches where they come first (qwen3-32b
        # on the H200 at 64 layers: the search at (1, 2) proves the plan, and the pattern before it
        # found nothing and cost 0.13 s). Near it, the depth pairs' own LPs come first where the
        # union LP takes the activation depth and the residual staging in part (pair_lps: qwen2.5-3b
        # on the H200 at 128 layers, 20 s unproved -> 6.2 s proved; before the searches, 1.9 s less
        # than after them). The union LP's rounding (round_union, tenths of a second) comes before
        # all of these, and before the splits start
        for phase in ((self.first_neighbourhood, self.tail_split, self.offload_pattern, self.half_neighbourhoods,
                       self.searches)
                      if self.far or neighbourhood_first else
                      (self.pair_lps, self.searches, self.first_neighbourhood, self.tail_split, self.offload_pattern,
                       self.half_neighbourhoods)):
            if phase == self.searches and neighbourhood_first and not self.far:
                # the roots on the union LP's halves before these searches, which only look for a
                # better plan (varied seed 27, 128 layers: the roots proved the first
                # neighbourhood's plan after the searches had taken 4.5 s and found nothing better)
                plan = self.settle()
                if plan is not None:
                    return plan
            phase()
            if self.pair_proof is not None or self.tail_proof is not None:
                return self.pair_proof or self.tail_proof
        plan = self.settle()
        if plan is None and rel_gap > 0 and (cutoff is None or self.incumbent.predicted_step_time_s < cutoff):
            self.carried = self.incumbent  # kept: the per-depth phase rebuilds its starts and may not find it again
        return plan

    def settle(self):
        """The union phase's plan where the union LP, its splits or HiGHS' roots on its halves (or
        on the open depth pairs' own models) prove it (the splits started beside the steps joined
        first), else None. The roots run once per plan; where the plan does not beat the caller's
        cutoff they ask for a plan rel_gap below the cutoff, and where none exists every half is
        bounded there (None: the per-depth phase then rules out every pair)."""
        rel_gap, cutoff = self.rel_gap, self.cutoff
        self.join_splits()
        incumbent = self.incumbent
        self.start_offload_split()  # for the phases' plan, where the split was not started for the start
        self.join_splits()
        if not self.union_proves(incumbent) and self.direct and self.depth_bounds and not self.expired() and \
                self.rooted is not incumbent:
            self.pair_lps()
            if self.pair_proof is not None:
                return self.pair_proof
            self.tail_split()
            if self.tail_proof is not None:
                return self.tail_proof
            if self.vertex_on_one_pair() and self.union_interior_retry():
                return self.proved_by_union("union_lp")
            incumbent = self.incumbent
            # HiGHS' root on each half of the union model the split left open, asked only for a
            # plan rel_gap faster: where none exists the half's depth pairs are ruled out (random
            # host-only 128-layer instances: 1.1-3.7 s a half, both halves side by side, where each
            # depth pair's neighbourhoods and root took 1.8-4.6 s)
            self.rooted = incumbent
            # (where the incumbent does not beat the caller's cutoff, a plan rel_gap faster than the
            # cutoff: none proves that nothing here beats it by more than rel_gap)
            beats = cutoff is None or incumbent.predicted_step_time_s < cutoff
            bar = (incumbent.predicted_step_time_s if beats else cutoff) * (1 - rel_gap)
            halves = [dw for dw in self.weights if self.depth_bounds[dw] < bar]
            # the depth pairs left open: those of the open halves whose own LP (pair_lps, where it
            # ran) is below the bar, the deeper first: their roots' plans are taken in this order
            # (_cutoff_roots), and in both cases where a root's plan stopped the others it was the
            # deeper pair's (the Llama-3-70B shape on the H100: (2, 2) against (1, 2), at 4,096 and
            # 8,192 tokens)
            pairs = sorted((d for d in self.depths if d[0] in halves and self.pair_bounds.get(d, -math.inf) < bar),
                           key=lambda d: (-d[0], -d[1]))
            t = time.perf_counter()
            if len(halves) == 1 or len(pairs) <= len(halves):
                # one half open, or one pair per open half: the root on each open pair's own model
                # instead, side by side (tighter than the half, which relaxes the other depth, and
                # both cores at work): varied seed 5, 128 layers, 12.48 -> 10.67 s; 64 layers:
                # seed 4 6.27 -> 5.59 s, 11 2.04 -> 1.59 s; random host-only seeds 12 and 13 at 128
                # layers 4.76 -> 4.10 s and 5.26 -> 4.88 s; the same plans. A plan a root finds
                # below the bar is a plan of its pair, kept (the Llama-3-70B shape on the H100,
                # batch 16 at 4,096 tokens, 4 micro-batches: the halves' roots ran 22 s to the
                # limit; the root at (2, 2) finds a plan 1.1 % faster in 9 s, which the pairs'
                # LPs then prove)
                builts = [self.model_at(d) for d in pairs]

                def found_proved(i, found):
                    """A root's plan kept where it fits and beats the incumbent and the cutoff; True
                    (the other roots stopped) where the union LP, as the pairs' LPs raised it, proves
                    it (the 70B shape at batch 8 of 8,192 tokens: its root at (1, 2) ran 11 s past
                    the plan the one at (2, 2) returned)."""
                    q = _fitting_plan(builts[i], found, self.costs, self.hardware)
                    if q is None:
                        return False
                    if q.predicted_step_time_s < self.incumbent.predicted_step_time_s and (
                            cutoff is None or q.predicted_step_time_s < cutoff):
                        self.incumbent = q
                    return self.union_proves(self.incumbent)
                solved = _pair_roots(builts, bar, rel_gap, self.left(), found_proved)
                settled = {dw: all(s.status == mip.OptimizationStatus.INFEASIBLE
                                   for d, s in zip(pairs, solved) if d[0] == dw) for dw in halves}
                self.stats["bb_runs"] += len(pairs)
            else:
                settled = _half_roots(self.union_built, self.arrays, bar, halves, rel_gap, self.left())
                self.stats["bb_runs"] += len(halves)
            self.stats["bb_s"] += time.perf_counter() - t
            for dw, none_below in settled.items():
                if none_below:
                    self.depth_bounds[dw] = bar  # the per-depth phase below skips this half's pairs
            plan = self.proved_at_bar(incumbent, bar, "highs") or self.faster_proved(incumbent)
            if plan is not None:
                return plan
            if self.incumbent is incumbent and not beats and self.halves_bounded(bar):
                return None   # nothing beats the cutoff by rel_gap: the per-depth phase skips every pair
            if self.union_interior_retry():
                return self.proved_by_union("union_lp")
            plan = self.faster_proved(incumbent)
            if plan is not None:
                return plan
        if self.union_proves(incumbent):
            return self.proved_by_union("union_lp")
        return None

    def vertex_on_one_pair(self) -> bool:
        """Whether the union LP's point is a vertex whose depth indicators are all integral (within
        ``RENS_TOLERANCE``): all its weight on one depth pair."""
        if not self.union_basis or not self.union_point or self.union_built.depth_indicators is None:
            return False
        point = self.union_point[0]
        return not any(RENS_TOLERANCE < point[v.idx] < 1.0 - RENS_TOLERANCE for v in self.union_built.depth_indicators)

    def union_interior_retry(self) -> bool:
        """Once, in ``settle``, where the union LP's point is a vertex (``union_basis``): ``_rens``
        again, from the union LP's interior point (solved here), at the depth pair that point leans
        to (tried before or not). Whether the union LP proves the incumbent then. Before HiGHS'
        roots on the halves where that vertex puts all its weight on one depth pair
        (``vertex_on_one_pair``), else after them, where they leave the incumbent unproved.

        The union LP ends at a vertex so that the depth split's halves start from its basis, and
        ``_rens`` from a vertex fixes more binaries: qwen2.5-3b shape, A100, room for a third of
        the boundaries, 64 layers: the vertex's depth indicators are (0, 1), and from it the
        neighbourhoods' best was 9.4598 s, 1.6 % above the union LP, and the roots took 12-14 s to
        prove nothing; the interior point's are (0.19, 0.69), it leans to (2, 2), and its
        neighbourhood gives 9.3995 s, which the union LP proves. Where the vertex's indicators are
        fractional (varied seeds 0, 3, 5, 8, 27, 35 and 38 at 128 layers) the interior point's are
        the same and so is its pair; before the roots there, the retry cost where the roots prove
        the plan: seed 5, 15.0 s proved -> 20.5 s unproved, seed 27 6.7 -> 8.6 s."""
        if not INTERIOR_RETRY or self.interior_retried or not self.union_basis or self.expired():
            return False
        self.interior_retried = True
        t = time.perf_counter()
        point = []
        solved = _highs_solve(self.arrays, point, time_limit_s=self.left()) is not None and bool(point)
        self.stats["lp_s"] += time.perf_counter() - t
        self.stats["lp_solves"] += 1
        if not solved:
            return False
        d = _leaning(point[0], self.union_built, self.depths, self.tie())[0]
        q = self.rens_at(self.model_at(d), point[0], tail=True)
        if q is not None and q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
            self.incumbent = q
        return self.union_proves(self.incumbent)

    def faster_proved(self, incumbent):
        """Where a plan faster than ``incumbent`` has become the incumbent (a root's, or the
        interior retry's): that plan, if the union LP as raised so far, or the halves the roots
        ruled out with the others' bounds, prove it; else None."""
        if self.incumbent is incumbent:
            return None
        if self.union_proves(self.incumbent):
            return self.proved_by_union("union_lp")   # (its gap against that bound: below rel_gap)
        return self.proved_at_bar(self.incumbent, self.incumbent.predicted_step_time_s * (1 - self.rel_gap), "highs")

    def half_rules_out(self, dw) -> bool:
        """Whether the union LP's half at weight depth ``dw`` (the depth split, where joined) rules
        out a plan rel_gap faster than the incumbent."""
        return dw in self.depth_bounds and \
            self.depth_bounds[dw] >= self.incumbent.predicted_step_time_s * (1 - self.rel_gap)

    def halves_bounded(self, bar) -> bool:
        """Whether every half's bound (``depth_bounds``) has reached ``bar``."""
        return all(self.depth_bounds[dw] >= bar for dw in self.weights)

    def proved_at_bar(self, plan, bar, proof):
        """``plan`` as proved within rel_gap where every half's bound (``depth_bounds``) has reached
        ``bar`` (its value less rel_gap), ``proof`` recorded in ``stats``; else None."""
        if not self.halves_bounded(bar) or (self.cutoff is not None and plan.predicted_step_time_s >= self.cutoff):
            return None
        self.stats["proof"] = proof
        return plan.replace(name="milp", solver_status="optimal", gap=self.rel_gap,
                            solve_time_s=time.perf_counter() - self.t0)

    def proved_by_union(self, proof):
        """The incumbent as the plan the union LP (as raised so far) proves, its gap against that
        bound; ``proof`` recorded in ``stats``."""
        value = self.incumbent.predicted_step_time_s
        self.stats["proof"] = proof
        return self.incumbent.replace(name="milp", solver_status="optimal", gap=max(0.0, (value - self.union) / value),
                                      solve_time_s=time.perf_counter() - self.t0)

    def pair_lps(self):
        """Once, where the union LP takes the activation prefetch depth in part and pays the
        residuals' device staging in part: each depth pair's own LP, and where that too pays the
        staging in part its offload split (``_offload_split``), side by side. The union LP relaxes
        the depth pair, and there it offloads a fraction of many residuals at depth 2, whose
        deeper staging it also pays only in part (qwen2.5-3b shape, H200, room for a third of the
        boundaries, 128 layers: the union LP 12.749 s, each pair's LP 12.756-12.931 s, with the
        offload split at activation depth 2 12.929-12.931 s, the plan 12.934 s). Where every pair's
        bound proves the incumbent, that plan (``pair_proof``); else the union LP and its halves
        (``depth_bounds``) are raised to the pairs' bounds, and each pair's is kept for ``branch``
        (``pair_bounds``). Near the union LP before the searches; elsewhere in ``settle``, before
        the roots (qwen2.5-3b A100 and 7b H200 with a third of the room, 128 layers: the same plans
        at the 20 s limit, reported 1.67 % and 1.47 % above their bound instead of 4.30 and 3.30 %)."""
        if self.pairs_done or not self.neighbourhoods_open() or self.union_built.depth_indicators is None:
            return
        self.pairs_done = True
        y_a = float(self.union_point[0][self.union_built.depth_indicators[1].idx])
        if not DEPTH_SPLIT_EARLY < y_a < 1.0 - DEPTH_SPLIT_EARLY or \
                not _staging_paid_in_part(self.union_built, self.union_point):
            return
        builts = [self.model_at(d) for d in self.depths]
        # the offload split started beside this step (start_offload_split, which starts it only
        # where it may prove the incumbent) joined once the pairs' models are built, before their
        # LPs: where it proves the incumbent, they are not needed (qwen2.5-3b shape on the H200,
        # 128 layers: the split's bound, 12.3768 s, proves the plan's bar of 12.3733 s; it ended
        # at 6.1 s beside the four pairs' LPs, and the pairs' proof came at 8.2 s)
        self.join_offload_split()
        if not self.neighbourhoods_open():
            return
        t = time.perf_counter()
        arrays = [_highs_arrays(b.model) for b in builts]
        points, bases = [[] for _ in builts], [[] for _ in builts]
        futures = [_in_thread(_highs_solve, a, point, basis) for a, point, basis in zip(arrays, points, bases)]
        if any(self.late(f) for f in futures):
            return   # past the time limit: no bound from this step
        values = [f.result() for f in futures]
        if None in values:
            return   # HiGHS could not say: no bound from this step
        early = [[concurrent.futures.Future(), concurrent.futures.Future()] for _ in builts]
        splits = [_in_thread(_offload_split, b, a, basis, e)
                  if b.off and point and _staging_paid_in_part(b, point) else None
                  for b, a, point, basis, e in zip(builts, arrays, points, bases, early)]
        self.stats["lp_solves"] += len(builts) + sum(2 for f in splits if f is not None)
        # the splits' first bounds (each branch's, as soon as its dual simplex ends or reaches its
        # cap: _hot_lp) where those prove the incumbent, else the splits' ends
        cutoff = self.incumbent.predicted_step_time_s
        if any(self.late(f) for split, e in zip(splits, early) if split is not None for f in e):
            return
        bounds = {d: max(value, min(f.result()(cutoff) for f in e) if split is not None else -math.inf)
                  for d, value, split, e in zip(self.depths, values, splits, early)}
        if not self.union_proves(self.incumbent, raised=min(bounds.values()) - self.union):
            if any(self.late(split) for split in splits if split is not None):
                return
            bounds = {d: max(value, split.result() if split is not None else -math.inf)
                      for d, value, split in zip(self.depths, values, splits)}
        self.stats["lp_s"] += time.perf_counter() - t
        self.pair_bounds = bounds
        least = min(bounds.values())
        self.union = max(self.union, least)
        for dw in self.weights:
            ours = [v for d, v in bounds.items() if d[0] == dw]
            if ours and dw in self.depth_bounds:
                self.depth_bounds[dw] = max(self.depth_bounds[dw], min(ours))
        if self.union_proves(self.incumbent):
            self.pair_proof = self.proved_by_union("pair_lps")

    def tail_split(self, plan=None):
        """Once per plan (the faster of ``plan`` and the incumbent), after the depth split is
        joined: each half of the union LP that leaves room below it (by ``rel_gap``) and keeps part
        of a tail layer resident split on the resident tail (``_tail_split``; the halves side by
        side). A half it rules out gets the bar as its bound; where every half is ruled out, that
        proves the plan (``tail_proof``). Not for a plan that does not beat the cutoff. Varied
        instances at 128 layers, seeds 10, 17 and 35: the union LP and its halves 0.4-1.1 % below
        the first neighbourhood's plan, the tail split proves it (before, the roots on the halves
        after the other neighbourhoods, 11-13 s, or the time limit)."""
        incumbent = min((p for p in (plan, self.incumbent) if p is not None),
                        key=lambda p: p.predicted_step_time_s, default=None)
        if incumbent is None or self.tail_proof is not None or not self.direct or not self.union_point or \
                self.expired() or self.union_proves(incumbent) or not self.union_basis or \
                not self.union_built.r or self.tail_split_for is incumbent or \
                self.cutoff is not None and incumbent.predicted_step_time_s >= self.cutoff:
            return
        self.join_splits()
        if not self.depth_bounds or self.union_proves(incumbent):
            return
        self.tail_split_for = incumbent
        bar = incumbent.predicted_step_time_s * (1 - self.rel_gap)
        halves = [dw for dw in self.weights if self.depth_bounds[dw] < bar and self.tail_in_part(dw)]
        if not halves:
            return
        t = time.perf_counter()
        futures = [_in_thread(_tail_split, self.union_built, self.arrays, self.depth_ends.get(dw, self.union_basis[0]),
                              dw, bar, self.depth_points.get(dw), self.left()) for dw in halves]
        for dw, future in zip(halves, futures):
            if not self.late(future) and future.result():
                self.depth_bounds[dw] = bar
        self.union = max(self.union, min(self.depth_bounds[dw] for dw in self.weights))
        self.stats["lp_s"] += time.perf_counter() - t
        self.stats["lp_solves"] += len(halves)
        self.tail_proof = self.proved_at_bar(incumbent, bar, "tail_split")

    def tail_in_part(self, dw) -> bool:
        """Whether the solution of the union LP's half at weight depth ``dw`` keeps some tail layer
        resident in part (a share between ``RENS_TOLERANCE`` and 1 − it)."""
        point = self.depth_points.get(dw)
        return point is not None and any(RENS_TOLERANCE < point[var.idx] < 1 - RENS_TOLERANCE
                                         for var in self.union_built.r.values())

    def start_offload_split(self):
        """Where the union LP pays the residual offload's staging only in part and splitting on it
        (``_offload_split``: two LPs) may raise the LP enough to prove the incumbent, that split is
        started beside the union phase's first step (HiGHS releases the interpreter lock); the
        first ``join_splits`` after that step waits for it, so the union LP is raised at the
        same point of the solve whatever the machine load. Hybrid qwen3.6-27b shape, RTX 4090, 128
        layers: the split alone proves the search's plan (0.07 %) where the searches at the other
        depth pairs, the LP's neighbourhoods and the depth split before it took 5.4 s and found
        nothing better; where it does not prove (dense shapes on the H200: it raises the LP by
        0.03-0.1 %) its two LPs run under the first step. Small models (CLP, which solves the
        model's own rows) split at once."""
        if self.offload_split is not None or self.union_proves(self.incumbent) or \
                not _staging_paid_in_part(self.union_built, self.union_point) or \
                not self.union_proves(self.incumbent,
                                      raised=_offload_split_gain(self.union_built, self.union_point, self.costs)):
            return
        # CLP solves the model's own rows (changed and restored by the split): not beside a step
        self.offload_split = _timed(_offload_split, self.union_built, self.arrays, self.union_basis,
                                    background=self.arrays is not None)
        self.stats["lp_solves"] += 2

    def join_splits(self, plan=None):
        """The started offload split's bound taken into the union LP (once), and the depth split's
        (``join_depth_split``), started beside the same step. Neither is waited for where the
        union LP already proves the incumbent (varied seed 15, 128 layers: the LP's first
        neighbourhood gave a plan 0.47 % above it at 4.8 s, and the offload split's wait ended the
        solve at 6.6 s). ``plan``: as in ``join_depth_split``."""
        self.join_depth_split(plan)
        self.join_offload_split()

    def join_offload_split(self):
        """The started offload split's bound taken into the union LP (once; not waited for where
        the union LP already proves the incumbent)."""
        if self.offload_split is None or self.offload_split_joined or self.union_proves(self.incumbent):
            return
        self.offload_split_joined = True
        if self.late(self.offload_split):
            return
        value, seconds = self.offload_split.result()
        self.union = max(self.union, value)
        self.stats["lp_s"] += seconds

    def start_depth_split(self):
        """The LP split on the weight prefetch depth (``_depth_split``) started beside the union
        phase's first step, and joined after it (``join_splits``), not left to
        ``half_neighbourhoods``: always where its halves start from the union LP's basis (cheap:
        0.02-0.7 s at 64-128 layers), else where the union LP's solution takes that depth
        fractionally (y_w between DEPTH_SPLIT_EARLY and 1 − it; there the split raises its bound
        most) and no offload split runs beside."""
        if self.depth_split is not None or self.depth_bounds or \
                not self.neighbourhoods_open() or len(self.weights) < 2:
            return
        if self.union_basis:
            self.split_on_depth()
            return
        y_w = float(self.union_point[0][self.union_built.depth_indicators[0].idx])
        if self.offload_split is None and DEPTH_SPLIT_EARLY < y_w < 1.0 - DEPTH_SPLIT_EARLY:
            self.split_on_depth()

    def tie(self):
        """For ``_leaning``: depth pairs the union LP's solution weighs the same (a vertex often
        puts none on any but its own pair) in the order of their half's bound, the lower first,
        once the depth split is joined (qwen3-32b on the H200, 64 layers: the search at (1, 2),
        whose half is lower, proves the plan; at (2, 1) first, 0.25 s more)."""
        if not self.depth_bounds:
            return None
        return lambda d: self.depth_bounds.get(d[0], -math.inf)

    def split_on_depth(self, background=True):
        """``_depth_split`` of the union LP, in a thread (or here, done); ``join_depth_split`` takes it."""
        self.depth_early = {dw: concurrent.futures.Future() for dw in (1, 2)}
        self.depth_split = _timed(_depth_split, self.union_built, self.arrays, self.union_basis, self.depth_ends,
                                  self.depth_early, background=background)
        self.stats["lp_solves"] += 2

    def join_depth_split(self, plan=None):
        """The depth split's halves taken as ``depth_bounds`` / ``depth_points``, the union LP raised
        to the lower half's bound (once). Not waited for where the union LP already proves the
        incumbent (nothing the split says is used then; its thread ends on its own). Whether it
        is joined depends only on those two values, not on which thread ends first.

        Each half's first bound (``depth_early``: where its dual simplex from the union LP's basis
        reaches its iteration cap, the bound there, else its value) is waited for first: where
        those prove the incumbent (or ``plan``, a faster one about to replace it), the union LP is
        raised to the lower of them and the halves' ends (an LP from scratch after the cap) are not
        waited for. Varied seed 16, 128 layers: 5.06 -> 4.00 s, the same plan."""
        if self.depth_split is None or self.depth_bounds or self.union_proves(self.incumbent) or \
                self.depth_split_proves_early(plan) or self.late(self.depth_split):
            return
        (self.depth_bounds, self.depth_points), seconds = self.depth_split.result()
        self.depth_vertices = set(self.depth_ends)
        self.stats["lp_s"] += seconds
        self.union = max(self.union, min(self.depth_bounds[dw] for dw in self.weights))

    def depth_split_proves_early(self, plan=None) -> bool:
        """Whether the first bounds of the depth split's halves (``depth_early``, waited for) prove
        the incumbent or ``plan`` (see ``join_depth_split``); the union LP is then raised to them.

        The halves are waited for in the order they end, and the first whose bound does not prove
        the plan ends the wait: the least of the bounds proves it only where each does, so the
        answer is the same whichever half ends first. Varied seed 17, 128 layers: the depth-2
        half's bound (13.0021 s, 0.2 s after the split started) is below what the rounding's plan
        needs (13.0296 s), and the solve waited 0.86 s more for the depth-1 half's, at its
        iteration cap, before it went on."""
        if self.depth_split is None or self.depth_bounds or not self.depth_early:
            return False
        best = min((q for q in (self.incumbent, plan) if q is not None), key=lambda q: q.predicted_step_time_s)
        value = best.predicted_step_time_s
        bounds = []
        try:
            for future in concurrent.futures.as_completed([self.depth_early[dw] for dw in self.weights],
                                                          timeout=self.wait_s()):
                bound = future.result()(value)
                if not (bound > self.union and self.union_proves(best, raised=bound - self.union)):
                    return False
                bounds.append(bound)
        except concurrent.futures.TimeoutError:  # past the time limit: not waited for (``late``)
            return False
        self.union = min(bounds)
        return True

    def rens_in_union_phase(self, point, weight_depth=None):
        """rens_at the depth pair of ``depths`` that ``point`` leans to most (with weight prefetch
        depth ``weight_depth``, for a half's point) among those not yet tried; the incumbent is
        replaced by a faster plan. A half's point that leans to the pair the union's point took
        goes to its next one (random seed 13 host only, 64 layers, after the case cuts of the
        segment's base: the union LP leaned to (2, 2), 19.04 s, the weight-depth-2 half's point
        too, and (2, 1) with its 18.91 s plan was never tried: 1.68 % unproved at 20 s). Returns
        (that pair, its plan or None), or None where no pair was left."""
        d = next((d for d in _leaning(point, self.union_built, self.depths, self.tie())
                  if d not in self.rens_done and weight_depth in (None, d[0])), None)
        if d is None:
            return
        q = self.rens_at(self.model_at(d), point, tail=True)
        if q is not None and (self.incumbent is None or q.predicted_step_time_s < self.incumbent.predicted_step_time_s):
            self.incumbent = q
        return d, q

    def round_union(self):
        """Once: the union LP's solution rounded at the depth pair it leans to, fitted and improved
        by the search's local search (``_rounding``): first with a quarter of the search's
        evaluations; where that plan beats the incumbent or lies within ``ROUNDING_WAIT_GAPS``
        rel_gaps of the union LP, on from there in ``polish`` (the search's full budget); the
        incumbent replaced by a faster plan.

        The union phase runs it before it starts the splits (``start_offload_split``,
        ``start_depth_split``), which are then not started where the union LP proves the plan:
        alone on the cores it took 0.3-0.5 s at 128 layers (polish included) where beside the
        splits it took 0.6-0.7 s (varied seeds 5, 17, 38). Only where the quick plan is near the
        union LP but not proved by it, and the depth split's first bounds may be needed to prove
        it (``prove_early``), are the splits started before the polish, to run beside it (the
        random row of ``benchmarks/planner.py`` at 64 layers: 0.19-0.24 s of polish, then
        0.19-0.22 s of split, where side by side they take 0.22-0.27 s). Where the union LP proves
        the quick plan, nothing the splits say is used, and beside the polish they took its cores
        (varied seed 2 at 128 layers: a polish of 0.31-0.35 s beside them, 0.15 s alone)."""
        if self.rounded or not self.neighbourhoods_open() or self.search_evaluations < 0:
            return
        self.rounded = True
        point = self.union_point[0]
        t = time.perf_counter()
        q = _rounding(self.union_built, point, _leaning(point, self.union_built, self.depths, self.tie())[0],
                      self.costs, self.hardware, self.S, self.K, self.residual_offload,
                      max(1, self.search_evaluations // 4))
        self.stats["search_s"] += time.perf_counter() - t
        if q is None:
            return
        near = self.near_union(q)
        if near and not self.union_proves(q):
            self.start_offload_split()
            self.start_depth_split()
        if near or q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
            q = self.polish(q)
        if q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
            self.incumbent = q

    def prove_early(self):
        """Where the union LP does not prove the incumbent but it lies within ``ROUNDING_WAIT_GAPS``
        rel_gaps of it: the depth split's first bounds (``depth_split_proves_early``, waited for).
        Not its end: where they do not prove the plan, the first neighbourhood runs beside the rest
        of the split, as it would without this step (varied seed 17, 128 layers: waiting for the
        whole split took the solve 5.4 -> 9.1 s)."""
        if not self.union_proves(self.incumbent) and self.near_union(self.incumbent):
            self.depth_split_proves_early()

    def near_union(self, plan) -> bool:
        """Whether ``plan`` lies within ``ROUNDING_WAIT_GAPS`` rel_gaps of the union LP (as raised so
        far): where the depth split's first bounds may prove it (``round_union``, ``prove_early``)."""
        value = plan.predicted_step_time_s
        return value - self.union <= ROUNDING_WAIT_GAPS * self.rel_gap * value

    def neighbourhoods_open(self) -> bool:
        """Whether the union LP's neighbourhoods may run now: HiGHS' path with the LP's solution at
        hand, the incumbent not proved, time left."""
        return self.direct and bool(self.union_point) and not self.union_proves(self.incumbent) and \
            not self.expired()

    def first_neighbourhood(self):
        """``rens_at`` the depth pair the union LP's solution leans to (once)."""
        if not self.neighbourhoods_open() or self.rens_done:
            return
        self.rens_in_union_phase(self.union_point[0])
        self.join_splits()  # started beside that neighbourhood (start_offload_split)

    def offload_pattern(self):
        """Once, after the first neighbourhood (``union_phase``; before it, varied seed 6 at 128
        layers took 4.9 s where ``_rens`` proves a plan in 2.4 s, its neighbourhood 2.7 s):
        ``_offload_pattern`` from the union LP's solution where it takes at least
        ``PATTERN_MIN_SHARE`` of the residual offloads in part: at each depth pair in the order that
        solution leans to (a pattern's staging may not fit at activation depth 2; an infeasible
        neighbourhood takes 0.0-0.1 s), until the union LP proves the incumbent, skipping a pair
        whose half of the union LP rules out a plan rel_gap faster; the incumbent replaced by a
        faster plan. Not only up to the first pair that gives one: qwen2.5-7b shape, H200, room for
        a third of the boundaries, 128 layers, the pairs in the LP's order gave none, none and
        39.354 s at (1, 1), and (2, 1) after them 38.838 s (the solve's plan 39.025 s, 1.47 %
        unproved at its 20 s limit; with (2, 1) tried, 38.735 s proved at 0.79 % in 10.6 s). Real
        shapes at 128 layers (H200, room for a third of the boundaries), the union LP's, the
        solve's plan before, this neighbourhood's (before that change): llama3-8b 35.289, 36.564
        (3.5 % unproved), 35.464 s; dense-27b 62.492, 63.371 (1.36 % unproved), 62.694 s; qwen3-8b
        31.722, 31.975 (proved in 19.5 s), 32.019 s; where it finds nothing better (qwen2.5-3b on
        the H200 and A100: 1.9-8.4 % above the union LP, worse than the search's) it costs 0.3-1.3 s."""
        if not self.neighbourhoods_open() or self.pattern_done:
            return
        self.pattern_done = True
        point = self.union_point[0]
        off = self.union_built.off
        if not off or _fractional_offloads(self.union_built, point) < PATTERN_MIN_SHARE * len(off):
            return
        # the offload split started beside the first step first: alone it proves the hybrid
        # qwen3.6-27b shapes' starts (RTX 3090/4090, A100), where the pattern cost 0.6-0.7 s more
        self.join_offload_split()
        if not self.neighbourhoods_open():
            return
        for d in _leaning(point, self.union_built, self.depths, self.tie()):
            if self.expired() or self.union_proves(self.incumbent):
                return
            if self.half_rules_out(d[0]):
                continue
            q = self.counted(_offload_pattern, self.model_at(d), self.union_built, point, self.costs, self.hardware,
                             self.rel_gap, self.left(), min(self.max_nodes, RENS_MAX_NODES))
            if q is not None and q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
                self.incumbent = q

    def half_neighbourhoods(self):
        """The union LP split on the weight prefetch depth, and ``rens_at`` each half's solution
        that leaves room, the lower half first (again from its interior point where its vertex
        gave a far plan: ``rens_from_interior``)."""
        weights = self.weights
        if not self.neighbourhoods_open() or len(weights) < 2 or self.halves_done:
            return
        self.halves_done = True
        if self.depth_split is None:
            self.split_on_depth(background=False)
        self.join_depth_split()
        for dw in sorted(weights, key=lambda dw: self.depth_bounds[dw]):
            if self.union_proves(self.incumbent) or self.expired():
                break
            if dw in self.depth_points and self.depth_bounds[dw] < _limit(self.cutoff, self.incumbent) * (1 - self.rel_gap):
                tried = self.rens_in_union_phase(self.depth_points[dw], dw)
                if tried is not None:
                    self.rens_from_interior(dw, *tried)

    def rens_from_interior(self, dw, pair, plan):
        """``rens_at`` ``pair`` again, from the interior point of the union LP's half at weight depth
        ``dw`` (``half_point``), where ``_rens`` from that half's vertex gave no plan or one more
        than ``HALF_RETRY_GAPS`` rel_gaps above the half's bound. The depth split's halves end at
        a vertex where they start from the union LP's basis (``_hot_lp``), and ``_rens`` from a
        vertex fixes more binaries, some of them at values far from any good plan: qwen2.5-3b
        shape, A100, room for a third of the boundaries, 128 layers: from the depth-2 half's vertex
        a 21.531 s plan, 12 % above the half's 19.20 s, from its interior point 20.046 s (the
        solve: 21.502 s, 10.7 % unproved, against 20.046 s, 4.3 %). On the varied 128-layer
        instances the vertex's plans came 1.6-4.5 % above their half (seeds 3, 5, 10, 11, 17).
        Retried only there: from the interior point every time (an interior point more to solve,
        0.3-0.9 s) varied seed 3 took 4.4 -> 5.3 s, seed 5 10.9 -> 11.5-12.1 s, host-only seeds 8
        and 13 at 64 layers 1.5 -> 1.9 s and 1.8 -> 2.5 s."""
        if not HALF_INTERIOR or dw not in self.depth_vertices or self.union_proves(self.incumbent) or \
                self.expired():
            return
        if plan is not None and plan.predicted_step_time_s <= \
                self.depth_bounds[dw] * (1 + HALF_RETRY_GAPS * self.rel_gap):
            return
        q = self.rens_at(self.prebuilt[pair], self.half_point(dw))
        if q is not None and q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
            self.incumbent = q

    def half_point(self, dw):
        """The solution of the union LP's half at weight depth ``dw``, as an interior point: where
        the depth split's is the vertex it reached from the union LP's basis, the half's interior
        point is solved here (once, in this thread: 0.5 s a half on the 3b A100 shape above) and
        replaces it (``rens_from_interior``)."""
        if dw in self.depth_vertices:
            self.depth_vertices.discard(dw)
            t = time.perf_counter()
            point = []
            if _highs_solve(_half_problem(self.union_built, self.arrays, dw), point,
                            time_limit_s=self.left()) is not None and point:
                self.depth_points[dw] = point[0]
            self.stats["lp_s"] += time.perf_counter() - t
            self.stats["lp_solves"] += 1
        return self.depth_points[dw]

    def searches(self):
        """The search at the other depth pairs (not where the start is far from the union LP, nor
        at pairs whose half of the union LP rules out a plan rel_gap faster), then the best plan
        polished at its own depths."""
        if self.union_proves(self.incumbent) or self.search_evaluations < 0 or self.expired():
            return
        pairs = (() if self.far else _leaning(self.union_point[0], self.union_built, self.depths, self.tie()) if self.union_point
                 else self.depths)
        for dw, da in pairs:
            if self.union_proves(self.incumbent) or self.expired():
                break
            if (dw, da) == (1, 1):
                continue
            if self.half_rules_out(dw):
                # its half of the union LP (the depth split, joined beside an earlier search)
                # already rules out a plan rel_gap faster there: varied seed 3, 128 layers,
                # 5.26 -> 4.47 s, the same plan; every other planner.py row and varied seed
                # (64 and 128 layers) the same plan in the same time
                continue
            q = self.search_at(dw, da)
            self.join_splits()  # started beside this search (start_offload_split)
            if q is not None and q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
                self.incumbent = q
                if self.union_point and not self.union_proves(self.incumbent):
                    # polished at once (local search on the step model itself)
                    q = self.polish(self.incumbent, quick=True)
                    if q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
                        self.incumbent = q
        self.join_splits()
        if not self.union_proves(self.incumbent) and not self.expired():
            q = self.polish(self.incumbent, quick=True)
            if q.predicted_step_time_s < self.incumbent.predicted_step_time_s:
                self.incumbent = q

    # -- the depth phase ---------------------------------------------------------------------

    def depth_phase(self):
        """Per depth pair, first the cheap part (its LP, the search for it, local search at its
        depths), for every pair; branch and bound only afterwards, for the pairs whose LP still
        leaves room below the best plan any of them gave (a plan found at depths (1, 2) can spare
        CBC's run at (1, 1)). Returns ``result()``."""
        rel_gap, cutoff = self.rel_gap, self.cutoff
        self.heuristic = self.carried   # the best unproved plan of the cheap part (rel_gap > 0)
        if self.union_late:
            # the union LP did not end by the time limit: the best start, its gap against the bound
            # on every plan (``bounds.lower_bound``; none where it does not beat the cutoff); no
            # depth pair's model is built
            if self.incumbent is not None and (self.cutoff is None or
                                               self.incumbent.predicted_step_time_s < self.cutoff):
                self.heuristic = self.incumbent
            self.best_bound = min(self.best_bound, lower_bound(self.costs, self.hardware)["total"])
            return self.result()
        pending = []
        depths = self.depths
        if self.carried is not None:  # its own depth pair first (or the one the union LP leans to)
            own = self.far or (self.carried.weight_prefetch_depth, self.carried.act_prefetch_depth)
            depths = sorted(depths, key=lambda d: d != own)
        for dw, da in depths:
            if self.expired() and self.union is not None:
                # out of time: the union LP (or its half) bounds this pair; its starts are in the
                # union phase's plan already
                self.best_bound = min(self.best_bound, self.union_bound(dw))
                continue
            limit = _limit(cutoff, self.best, self.heuristic)
            if dw in self.depth_bounds and limit is not None and self.depth_bounds[dw] >= limit * (1 - rel_gap):
                self.best_bound = min(self.best_bound, self.depth_bounds[dw])
                continue  # ruled out with its whole half of the depth pairs, before its model is built
            built = self.model_at((dw, da))
            start_plan = _at_depths(self.found, dw, da) or _at_depths(self.warm_start, dw, da)
            if self.best is not None and (start_plan is None or
                                          self.best.predicted_step_time_s <= start_plan.predicted_step_time_s):
                start_plan = None
            if self.direct and _mip_solver(built.model) == "highs":
                # HiGHS' branch and cut proves or improves the best plan so far at these depths by
                # itself: the cheap part below (search, neighbourhoods) would only repeat its work.
                # The pair's LP still rules it out first, unless it is the union phase's own pair
                # (which the union LP did not prove: HiGHS solves that LP at its root anyway)
                pending.append((built, None, start_plan))
                continue
            limit = _limit(cutoff, self.best, self.heuristic)
            lp = self.timed_lp(built) if rel_gap > 0 or self.best is not None else None
            if lp is not None:
                if limit is not None and lp >= limit * (1 - rel_gap):
                    self.best_bound = min(self.best_bound, lp)
                    continue  # nothing at these depths beats the best by more than the tolerance
                if self.search_evaluations >= 0 and (dw, da) != (1, 1):
                    # a better plan may exist here: search again at these depths (a start that fits
                    # here); if the LP does not prove the better of it and the start, improve that by
                    # local search on the step model itself at these depths
                    q = self.search_at(dw, da)
                    if start_plan is not None and (q is None or
                                                   start_plan.predicted_step_time_s <= q.predicted_step_time_s):
                        q = start_plan
                    if q is not None and q.predicted_step_time_s - lp > rel_gap * q.predicted_step_time_s:
                        q = self.polish(q)
                    q = self.improve(built, q, lp)
                    if q is not None and (limit is None or q.predicted_step_time_s < limit) and (
                            start_plan is None or q.predicted_step_time_s < start_plan.predicted_step_time_s):
                        start_plan = q
                elif self.search_evaluations >= 0:
                    start_plan = self.improve(built, start_plan, lp)
                value = start_plan.predicted_step_time_s if start_plan is not None else None
                if start_plan is not None and (limit is None or value < limit) and value - lp <= rel_gap * value:
                    # the root LP bound already proves the start within rel_gap: what CBC would
                    # conclude at its root, without its preprocessing (seconds at 100+ layers)
                    self.best = start_plan.replace(name="milp", solver_status="optimal")
                    self.best_bound = min(self.best_bound, lp)
                    continue
                if start_plan is not None and rel_gap > 0 and (
                        self.heuristic is None or value < self.heuristic.predicted_step_time_s):
                    self.heuristic = start_plan
            pending.append((built, lp, start_plan))
        if self.direct and pending:
            # HiGHS on the union phase's own depth pair first (depths sorted so) while the other
            # pairs' LPs are solved beside it (HiGHS releases the interpreter lock), then on those
            # pairs in order of their LP, each while its LP leaves room below the best plan so far
            # (after _rens, whose plan a pair's LP may well prove or rule out, every pair's LP first;
            # not where no plan is at hand: varied seed 26, 64 layers, no start and _rens' first
            # neighbourhood infeasible, the LPs first took 0.6 s more to the same branch)
            first, rest = ([], pending) if self.stats["rens_runs"] and _limit(cutoff, self.carried) is not None \
                else (pending[:1], pending[1:])
            points = []
            lps = _background_lps([b for b, _, _ in rest], workers=1 if first else 2, points=points)
            for entry in first:
                self.branch(*entry)
            t = time.perf_counter()
            values = lps(self.late)   # (one past the time limit: None, its pair bounded by the union LP)
            self.stats["lp_s"] += time.perf_counter() - t
            self.stats["lp_solves"] += len(rest)
            for (built, _, start_plan), value, point in sorted(zip(rest, values, points),
                                                               key=lambda e: math.inf if e[1] is None else e[1]):
                self.branch(built, value, start_plan, point[0] if point else None)
        else:
            for entry in pending:
                self.branch(*entry)
        return self.result()

    def branch(self, built, lp, start_plan, point=None):
        """Branch and bound on one depth pair's model, unless its LP rules it out (or, on the
        large-model path, the LP neighbourhoods' plans let it; ``point``: the LP's solution)."""
        costs, hardware, rel_gap, cutoff, stats = self.costs, self.hardware, self.rel_gap, self.cutoff, self.stats
        max_nodes = self.max_nodes
        direct, union_point = self.direct, self.union_point
        limit = _limit(cutoff, self.best, self.heuristic)
        pair_bound = self.pair_bounds.get((built.weight_prefetch_depth, built.act_prefetch_depth), -math.inf)
        if lp is not None:
            lp = max(lp, pair_bound)   # its offload split (pair_lps) where the union phase took it
        if self.expired():
            # the solve's time limit has passed: no branch and bound here, this pair's LP is its
            # bound, and its start (a plan of this space) is kept if it is the best
            if lp is None:
                lp = self.union_bound(built.weight_prefetch_depth) if self.union is not None else self.timed_lp(built)
                lp = max(lp, pair_bound)
            self.best_bound = min(self.best_bound, lp)
            if start_plan is not None and (cutoff is None or start_plan.predicted_step_time_s < cutoff) and (
                    self.best is None or start_plan.predicted_step_time_s < self.best.predicted_step_time_s):
                self.best = start_plan.replace(name="milp", solver_status="feasible")
            return
        if lp is None and (self.best is not None or cutoff is not None):
            lp = max(self.timed_lp(built), pair_bound)  # a plan to compare with (rel_gap 0: from a CBC run), or the caller's cutoff
        if lp is not None and limit is not None and lp >= limit * (1 - rel_gap):
            self.best_bound = min(self.best_bound, lp)
            return

        def adopt(q):
            """``q`` becomes the best unproved plan; True if this pair's LP then rules the pair out."""
            nonlocal limit
            self.heuristic = q
            limit = _limit(cutoff, self.best, self.heuristic)
            if lp >= limit * (1 - rel_gap):
                self.best_bound = min(self.best_bound, lp)
                return True
            return False

        def faster(q):
            """Whether ``q`` beats the best unproved plan (of this pair) and the cutoff."""
            return q is not None and q.predicted_step_time_s < self.heuristic.predicted_step_time_s and (
                cutoff is None or q.predicted_step_time_s < cutoff)

        if lp is not None and direct and union_point and (
                built.weight_prefetch_depth, built.act_prefetch_depth) not in self.rens_done:
            # before HiGHS on the whole model (6-9 s at 128 layers), the union LP's neighbourhood
            # at these depths (0.3-1.5 s), whose plan this pair's LP may prove
            q = self.rens_at(built, self.depth_points.get(built.weight_prefetch_depth, union_point[0]))
            if q is not None and (cutoff is None or q.predicted_step_time_s < cutoff) and (
                    limit is None or q.predicted_step_time_s < limit) and adopt(q):
                return

        def take(status):
            """The solver's plan on this pair: its bound (the solver's, which at its time limit may
            not yet have reached the root LP's value, or the root LP's own: both valid) counted,
            the plan kept if it beats the best so far and the cutoff (HiGHS' plain run has no
            cutoff: its plan may be worse than the best so far)."""
            bound = max(built.solved.objective_bound, lp if lp is not None else -math.inf)
            plan = decode(built, costs, hardware, status=status, bound=bound, solve_time_s=0.0)
            self.best_bound = min(self.best_bound, bound)
            if (cutoff is None or plan.predicted_step_time_s < cutoff) and (
                    self.best is None or plan.predicted_step_time_s < self.best.predicted_step_time_s):
                self.best = plan

        def own_pair():
            """Whether the best plan so far is of this pair (and this pair's LP solution at hand)."""
            return lp is not None and direct and point is not None and self.heuristic is not None and (
                self.heuristic.weight_prefetch_depth, self.heuristic.act_prefetch_depth) == (
                built.weight_prefetch_depth, built.act_prefetch_depth)

        def root_settles():
            """With the LP neighbourhoods' plan in hand, HiGHS' root alone (``HIGHS_CUTOFF_NODES``),
            asked only for a plan rel_gap faster: True where that settles this pair. That none
            exists proves the plan in hand (the root's cuts often show it); a plan the root proves
            within rel_gap is taken."""
            in_hand = _limit(None, self.best, self.heuristic)
            if not (direct and union_point) or in_hand is None or _mip_solver(built.model) != "highs":
                return False
            bar = in_hand * (1 - rel_gap) if cutoff is None else min(in_hand * (1 - rel_gap), cutoff)
            t = time.perf_counter()
            status = _optimize(built, rel_gap, self.left(), bar, HIGHS_CUTOFF_NODES, solver="highs",
                               root_lp=CUTOFF_ROOT_LP)
            stats["bb_s"] += time.perf_counter() - t
            stats["bb_runs"] += 1
            stats["proof"] = "highs"
            if built.solved.status == mip.OptimizationStatus.INFEASIBLE:
                self.best_bound = min(self.best_bound, bar)
                return True
            if status != "optimal":
                return False
            take(status)
            return True

        if own_pair():
            # the best plan so far is of this pair: the neighbourhood where it and this pair's LP agree
            q = self.counted(_rins, built, self.heuristic, point, costs, hardware, rel_gap, self.left(), max_nodes)
            if faster(q) and adopt(q):
                return
        if root_settles():
            return
        if own_pair():
            # then windows of layers re-routed, where the plan and the LP disagree most (only for
            # a plan near the proof: a window gained 0.05-0.2 % on the random instances)
            heuristic = self.heuristic
            near = heuristic.predicted_step_time_s - lp <= WINDOW_GAPS * rel_gap * heuristic.predicted_step_time_s
            for window in _windows(built, heuristic, point)[:WINDOW_PROBES] if near else ():
                q = self.counted(_window_neighbourhood, built, self.heuristic, window, costs, hardware, rel_gap,
                                 self.left(), max_nodes)
                if faster(q) and adopt(q):
                    return
        if start_plan is not None and (limit is None or start_plan.predicted_step_time_s < limit
                                       or start_plan is self.heuristic):
            start = _start_values(start_plan, built)
        else:
            start_plan, start = None, []
        if start:
            built.model.start = start
        t = time.perf_counter()
        # with CBC's preprocessing: without it CBC was faster on three random NVMe instances but
        # returned worse plans on four of five random instances
        # (benchmarks/RESULTS.md, "CBC without its preprocessing")
        solver = _mip_solver(built.model)
        # CBC: nothing at or above the best plan so far (or the caller's cutoff); HiGHS: no cutoff
        status = _optimize(built, rel_gap, self.left(), limit if solver == "cbc" else None, max_nodes, solver=solver)
        stats["bb_s"] += time.perf_counter() - t
        stats["bb_runs"] += 1
        stats["proof"] = "cbc" if solver == "cbc" else "highs"
        if status is None:
            # no solution (infeasible below the cutoff, or the time limit struck before CBC took
            # the start): the start is still a plan of this space
            if start and (self.best is None or start_plan.predicted_step_time_s < self.best.predicted_step_time_s):
                self.best = start_plan.replace(name="milp", solver_status="feasible")
            if built.solved.status == mip.OptimizationStatus.INFEASIBLE:
                # nothing below CBC's cutoff (the limit); for HiGHS, no plan at all
                if solver == "cbc" and limit is not None:
                    self.best_bound = min(self.best_bound, limit)
                return
            # CBC's bound without a solution is not to be trusted (it may not have reached its
            # root); HiGHS reports a valid dual bound (-inf before its root)
            trusted = built.solved.objective_bound if solver == "highs" else -math.inf
            self.best_bound = min(self.best_bound, max(lp if lp is not None else 0.0, trusted))
            return
        take(status)

    def result(self):
        """The best plan (None if none fits or beats the cutoff), with the gap to the least bound of
        every depth pair and "optimal" where that is within rel_gap."""
        best = self.best
        if self.heuristic is not None and (best is None or
                                           self.heuristic.predicted_step_time_s < best.predicted_step_time_s):
            best = self.heuristic.replace(name="milp", solver_status="feasible")
        if best is None:
            return None
        value = best.predicted_step_time_s
        gap = max(0.0, (value - min(self.best_bound, value)) / value)
        # the status is the whole solve's: a plan one depth pair's solver proved is only "optimal" if
        # every other pair is ruled out within rel_gap too (HiGHS stopped by its time limit on a second
        # pair, without a plan, leaves that pair's LP as its bound: random 128-layer seed 9, 1.04 %)
        proved = gap <= self.rel_gap * (1 + 1e-9) + 1e-12
        if proved:
            gap = min(gap, self.rel_gap)  # (a bound at (1 - rel_gap) x the plan, HiGHS' cutoff, less its rounding)
        best = best.replace(solver_status="optimal" if proved else "feasible")
        return best.replace(gap=gap, solve_time_s=time.perf_counter() - self.t0)


NEIGHBOURHOOD_NODES = 200
MIN_RUN_S = 0.05  # the least time limit a solver run is given (``_Solve.left``; CBC reads 0 as none)
# where HiGHS branches next (large models) and the union phase's best start is more than this many
# rel_gaps above the union LP, the union phase starts with the LP's neighbourhoods (_rens) and does
# not search the other depth pairs (2.5 s each at 128 layers); HiGHS, if it runs, starts at the pair
# the union LP leans to. The real-shape rows of benchmarks/planner.py start within 0.1-2.5 % of the
# union LP (qwen3-32b at 64 layers, 2.5 %, is proved by its search at depths (1, 2), polished, where
# the LP leans to (1, 1)); its random rows at 4.1-4.4 %, where those searches proved nothing
UNION_SEARCH_GAPS = 3.0
# where the start is more than this many rel_gaps above the union LP (but within UNION_SEARCH_GAPS)
# the LP's first neighbourhood comes before the searches at the other depth pairs, which still
# run if it does not prove the start, as the last step (after the offload pattern and the
# neighbourhoods of the LP's halves: ``_Solve.union_phase``).
# Real shapes (planner_probes.py shapes, every 3-32B preset on every hardware preset) start
# 2.0-3.1 rel_gaps above it where the searches first took 6-12 s at 128 layers and
# the neighbourhood first 3.6-7.5 s, with the same or faster plans (qwen3-8b A100 with a third of
# the room: 11.5 -> 4.9 s; qwen3-32b H200: 6.3 -> 3.6 s); at 1.4 the searches first won once
# (qwen2.5-3b H200, a third of the room, 64 layers: 2.2 s against 9.2 s) and lost once
# (qwen3-8b A100, 64 layers: 2.5 s against 1.3 s)
NEIGHBOURHOODS_FIRST_GAPS = 1.5
INTERIOR_RETRY = True  # _Solve.union_interior_retry
DEPTH_SPLIT_EARLY = 0.05  # start_depth_split: a union LP weight depth indicator this far from 0 and 1
RESIDUAL_PROBES = 6  # residuals _residual_neighbourhood tries to add, at most
# prove_early waits for the depth split's first bounds only where the incumbent is within this many
# rel_gaps of the union LP (round_union polishes its plan further and starts the splits beside that
# polish within the same reach). Those bounds proved the rounding's plan (or the start) 1.0-1.83 % above
# the union LP (varied seeds 7, 14, 16 at 64 layers, 16 at 128, the random row at 64); where they
# did not, the wait (up to 2.1 s at 128 layers: seed 0, 3.9 % above) held up the neighbourhood
ROUNDING_WAIT_GAPS = 2.0


def _tier_neighbourhood(built: Built, plan: Plan, costs, hardware, time_limit_s: float,
                        add_residual: int | None = None, gap: float = 1e-4) -> Plan | None:
    """The best plan with ``plan``'s kept-boundary path, residual decisions and resident tail, its
    boundary tiers (device, host, NVMe) chosen by branch and bound on ``built`` with everything else
    fixed (``_optimize``: CBC from ``plan`` with it as the cutoff, or on large models HiGHS, which
    takes neither; at most ``NEIGHBOURHOOD_NODES`` nodes); None if ``plan`` is outside the model's space or nothing is
    found. The model's bounds, start and cutoff are restored afterwards. Single moves of the local
    search miss what several tiers changed together give: on a random 128-layer instance with NVMe
    this took the plan for depths (2, 1) from 36.657 s to 36.137 s in 0.7-1.4 s, where CBC on the whole
    model, given 80 s, had not left 36.657 s.

    ``add_residual``: layer l's residuals kept too (on the device or the host, CBC's choice), the
    room they need made by the tiers; only plans faster than ``plan`` count (``plan`` itself, which
    does not keep them, is no start). ``gap``: the relative gap at which the solver stops."""
    start = _start_values(plan, built)
    if not start:
        return None
    free = {v.idx for group in (built.host, built.nv, built.dev) for v in group.values()}
    if add_residual is not None and add_residual in built.off:
        free.add(built.off[add_residual].idx)
    fixed = [(var, var.lb, var.ub) for var, _ in start if var.idx not in free]
    m = built.model
    try:
        for var, value in start:
            if var.idx not in free:
                var.lb = var.ub = value
        if add_residual is not None:
            built.res[add_residual].lb = built.res[add_residual].ub = 1.0
        else:
            m.start = start
        # the plan's value as CBC's cutoff; HiGHS (large models) runs without it: with it as a row
        # it stopped at other, slower plans (random NVMe instance, 64 layers: 17.338 s for 17.306 s)
        cut = plan.predicted_step_time_s if _mip_solver(m) == "cbc" else None
        status = _optimize(built, gap, time_limit_s, cut, NEIGHBOURHOOD_NODES)
        found = decode(built, costs, hardware, status=status, bound=None, solve_time_s=0.0) if status else None
    finally:
        for var, lb, ub in fixed:
            var.lb, var.ub = lb, ub
        m.start = []
        m.cutoff = math.inf
    if found is None or not found.fits():
        return None
    found = found.repredict(name=plan.name, solver_status=plan.solver_status)
    return found if add_residual is None or found.predicted_step_time_s < plan.predicted_step_time_s else None


DECISION_GROUPS = ("x", "host", "nv", "res", "off", "r")  # Built's binary decisions: the neighbourhoods fix these


def _decision_indices(built: Built) -> set:
    """The column indices of ``built``'s binary decisions (``DECISION_GROUPS``)."""
    return {v.idx for group in DECISION_GROUPS for v in getattr(built, group).values()}


RENS_GAP = 0.5        # _rens stops at this fraction of rel_gap from its own bound
# ... or after this many nodes (in ``solve``; also the offload pattern's): HiGHS' root alone. Its
# plans come from the root's heuristics; what a second node costs first is the root's strong
# branching, which only closes the neighbourhood's own gap: varied seed 17, 128 layers, the
# sub-MIP of its first neighbourhood 4.1 s at 30 nodes (ending at the root, 2 s of it strong
# branching), 2.2 s at 1, the same 13.156 s plan. At 30 nodes against 1, the same plans on the 40
# varied seeds at 128 and 64 layers (but seed 0 at 64 layers, which reaches the time limit either
# way), the 96 `shapes` instances at 128 and 64 layers, `planner.py`'s rows and the 63 fingerprint
# instances; varied seeds 17 and 35 at 64 layers were proved in 9.0 and 8.6 s where they took 20.1
# (unproved, 1.63 %) and 18.7 s (benchmarks/RESULTS.md, "The neighbourhoods' sub-MIPs at their root")
RENS_MAX_NODES = 1
RENS_TOLERANCE = 1e-4  # an LP value this close to 0 or 1 counts as integral (fixed by _rens)
RENS_FREED = ("host", "nv")  # the decisions _rens leaves free where fixing them all is infeasible


def _rens(built: Built, union_built: Built, point, costs, hardware, rel_gap: float, time_limit_s: float,
          max_nodes: int) -> Plan | None:
    """Relaxation-enforced neighbourhood search (RENS, Berthold 2009) at ``built``'s depth pair:
    every binary decision (edges, tiers, residuals, residual offload, resident tail) whose value in
    the union LP's solution ``point`` is integral is fixed there, and HiGHS' branch and cut solves
    what is left to ``RENS_GAP`` · ``rel_gap`` of its own bound (at most ``max_nodes`` nodes). The
    plan found, or None. The model's bounds are restored afterwards.

    Why: on random heterogeneous instances the search's plans start 3-4 % above the union LP, and
    the LP's solution is integral in all but 100-150 of 1,500 binaries at 128 layers; the rest,
    solved exactly at the pair the LP leans to, gave plans within 0.9-1.0 % of the union LP (seeds
    7-9), in 0.3-2.9 s, where HiGHS on the whole pair model took 6-9 s.

    Where HiGHS finds those fixings infeasible, it runs again with the boundary tiers
    (``RENS_FREED``) left free."""
    status = []
    plan = _fixed_neighbourhood(built, _integral_fixings(built, union_built, point, DECISION_GROUPS), costs, hardware,
                                RENS_GAP * rel_gap, time_limit_s, max_nodes, status)
    if plan is None and status == [mip.OptimizationStatus.INFEASIBLE]:
        # the LP's boundary tiers may not fit this pair's memory where the LP took part of another
        # pair's (a fractional depth indicator): the rest fixed, the tiers left free (varied seed 11,
        # 128 layers, the union LP at y_w = 0.64: infeasible in 0.1 s at (2, 1), 5.725 s in 0.26 s)
        kept = [g for g in DECISION_GROUPS if g not in RENS_FREED]
        plan = _fixed_neighbourhood(built, _integral_fixings(built, union_built, point, kept), costs, hardware,
                                    RENS_GAP * rel_gap, time_limit_s, max_nodes)
    return plan


def _integral_fixings(built: Built, union_built: Built, point, groups) -> list:
    """(``built``'s variable, 0 or 1) for each decision of ``groups`` whose value in the union LP's
    solution ``point`` is integral (within ``RENS_TOLERANCE``): what ``_rens`` fixes."""
    out = []
    for group in groups:
        relaxed = getattr(union_built, group)
        for key, var in getattr(built, group).items():
            if key not in relaxed:
                continue
            value = point[relaxed[key].idx]
            if value < RENS_TOLERANCE:
                out.append((var, 0.0))
            elif value > 1.0 - RENS_TOLERANCE:
                out.append((var, 1.0))
    return out


def _systematic_rounding(values) -> list:
    """0/1 values with the same running sums as ``values`` (each in [0, 1]) rounded down: a 1 where
    the running sum passes the next integer. Spreads the ones as evenly as the values: 0.5 each
    gives every other one, 1/3 each every third."""
    out, total, reached = [], 0.0, 0
    for value in values:
        total += value
        ones = math.floor(total + 1e-9)
        out.append(1 if ones > reached else 0)
        reached = ones
    return out


def _offload_pattern(built: Built, union_built: Built, point, costs, hardware, rel_gap: float,
                     time_limit_s: float, max_nodes: int) -> Plan | None:
    """A neighbourhood for a union LP solution that offloads every layer's residuals in part: the
    residual offloads fixed at ``_systematic_rounding`` of the LP's values in layer order (and
    those layers' residuals kept), every other decision left free, solved as ``_rens`` solves its
    neighbourhood. The plan found, or None (none fits, e.g. the pattern's staging on the device at
    activation depth 2; or no layer's residuals to offload at this depth pair).

    Why: where offloading a residual pays off only once many are (the first pays the device
    staging, ``memory.offload_working_bytes``), the LP offloads about half of each layer's, the
    search offloads none and ``_rens`` (every offload free) finds nothing better: llama3-8b shape,
    H200, room for a third of the boundaries, 128 layers: every offload at 0.50-0.59, the solve's
    plan 36.564 s (3.5 % above the union LP, unproved at 20 s); HiGHS on depths (1, 2) for 150 s
    found 35.377 s, offloading every other layer's residuals; this neighbourhood 35.46 s in 0.4 s."""
    layers = [l for l in sorted(union_built.off) if l in built.off]
    pattern = _systematic_rounding([min(1.0, max(0.0, float(point[union_built.off[l].idx]))) for l in layers])
    if not any(pattern):
        return None   # no residual to offload here: the neighbourhood would be the whole model
    fixings = [(built.off[l], float(z)) for l, z in zip(layers, pattern)]
    fixings += [(built.res[l], 1.0) for l, z in zip(layers, pattern) if z and l in built.res]
    return _fixed_neighbourhood(built, fixings, costs, hardware, RENS_GAP * rel_gap, time_limit_s, max_nodes)


def _fractional_offloads(union_built: Built, point) -> int:
    """How many residual offloads the union LP's solution ``point`` takes in part."""
    return sum(1 for v in union_built.off.values() if RENS_TOLERANCE < point[v.idx] < 1.0 - RENS_TOLERANCE)


# the union phase's offload pattern step runs where the union LP takes at least this share of the
# residual offloads in part (``_Solve.offload_pattern``). The real shapes
# whose residuals may go to the host: 98-99 % at 128 layers; the varied instances: 0-62 % but seed 6,
# 100 % (seed 5, 62 %, values near 0.03: the pattern's neighbourhood ran 17 s and found nothing)
PATTERN_MIN_SHARE = 0.9

RINS_TOLERANCE = 0.1  # _rins fixes a decision where the plan's value and the LP's differ by less


def _rins(built: Built, plan: Plan, point, costs, hardware, rel_gap: float, time_limit_s: float,
          max_nodes: int) -> Plan | None:
    """Relaxation-induced neighbourhood search (RINS, Danna, Rothberg and Le Pape 2005) at
    ``built``'s depth pair: every binary decision where ``plan`` (a plan of that pair) and the
    pair's own LP solution ``point`` agree (within ``RINS_TOLERANCE``) is fixed to the plan's value,
    and HiGHS solves the rest as in :func:`_rens`. The plan found, or None (``plan`` outside the
    model's space, or nothing found).

    Why: after _rens, a plan can sit just above 1 % of the pair's LP; the decisions the LP takes
    otherwise are where a better one lies. Random 64-layer host-only instance (seed 8), depths
    (2, 1): 20.007 s, 1.19 % above the pair's LP, -> 19.939 s, 0.85 %, in 0.6 s, where HiGHS on the
    whole model took 6-8 s."""
    start = _start_values(plan, built)
    if not start:
        return None
    decisions = _decision_indices(built)
    fixings = [(var, value) for var, value in start
               if var.idx in decisions and abs(point[var.idx] - value) < RINS_TOLERANCE]
    return _fixed_neighbourhood(built, fixings, costs, hardware, RENS_GAP * rel_gap, time_limit_s, max_nodes)


WINDOW_LAYERS = 32  # a window neighbourhood frees the decisions of this many consecutive layers
WINDOW_PROBES = 2   # window neighbourhoods tried per depth pair before HiGHS' whole run, at most
# ... and only for a plan within this many rel_gaps of the pair's LP: on random instances a window
# gained 0.05-0.2 %; host-only seed 13 at 128 layers started 1.30 % above and went to HiGHS anyway
WINDOW_GAPS = 1.25


def _windows(built: Built, plan: Plan, point) -> list:
    """The windows of ``WINDOW_LAYERS`` consecutive layers (half-overlapping) for
    :func:`_window_neighbourhood`, those where ``plan`` and the LP solution ``point`` disagree on
    the most decisions first (ties: lower layers first). [] if ``plan`` is outside the model."""
    start = {v.idx: value for v, value in _start_values(plan, built)}
    if not start:
        return []
    L = built.num_layers
    width = min(WINDOW_LAYERS, L)
    stride = max(1, width // 2)
    spans = [((s, e), v) for (s, e), v in built.x.items()]
    spans += [((k, k), v) for group in (built.host, built.nv, built.res, built.off) for k, v in group.items()]
    windows = sorted({(max(0, min(a, L - width)), max(0, min(a, L - width)) + width) for a in range(0, L, stride)})

    def disagreement(window):
        lo, hi = window
        return sum(1 for (a, b), v in spans if a < hi and b >= lo and abs(point[v.idx] - start[v.idx]) >= RINS_TOLERANCE)
    return sorted(windows, key=lambda w: (-disagreement(w), w))


def _window_neighbourhood(built: Built, plan: Plan, window, costs, hardware, rel_gap: float, time_limit_s: float,
                          max_nodes: int) -> Plan | None:
    """``plan`` with every decision of the layers in ``window`` = (lo, hi) free (the edges that
    start or end there, those boundaries' tiers, those layers' residuals) and every other decision
    fixed, solved by HiGHS as in :func:`_rens`: the plan found, or None. Where _rens and _rins
    keep the plan's recompute path, a window re-routes it: random host-only instance (seed 11), 128
    layers, depths (2, 1): 40.416 s, 1.02 % above the pair's LP, -> 40.379 s in the first window
    (0.8 s), where HiGHS' whole branch and cut took 11-18 s for 40.282 s."""
    lo, hi = window
    start = _start_values(plan, built)
    if not start:
        return None
    free = {v.idx for (s, e), v in built.x.items() if s < hi and e >= lo}
    free |= {v.idx for group in (built.host, built.nv, built.res, built.off) for k, v in group.items() if lo <= k <= hi}
    decisions = _decision_indices(built)
    fixings = [(var, value) for var, value in start if var.idx in decisions and var.idx not in free]
    return _fixed_neighbourhood(built, fixings, costs, hardware, RENS_GAP * rel_gap, time_limit_s, max_nodes)


def _fixed_neighbourhood(built: Built, fixings, costs, hardware, gap: float, time_limit_s: float,
                         max_nodes: int, status: list | None = None) -> Plan | None:
    """HiGHS' branch and cut on ``built`` with each (variable, value) of ``fixings`` fixed, to
    ``gap`` of its own bound (at most ``max_nodes`` nodes): the plan found if it fits, else None.
    The model's bounds are restored afterwards. Without the rows that only tighten the bound: the
    backward pass's segment row, dense in the windows' times, made HiGHS' sub-MIP of the random
    64-layer row's first neighbourhood take 0.54 s instead of 0.29 s, for the same plan.
    ``status``: if a list, HiGHS' status (a ``mip.OptimizationStatus``) is appended to it."""
    saved = [(var, var.lb, var.ub) for var, _ in fixings]
    try:
        for var, value in fixings:
            if var.lb <= value <= var.ub:
                var.lb = var.ub = value
        solved = _highs_mip(built.model, gap, time_limit_s, max_nodes, bound_rows=False)
        if status is not None:
            status.append(solved.status)
        return _fitting_plan(built, solved, costs, hardware)
    finally:
        for var, lb, ub in saved:
            var.lb, var.ub = lb, ub


def _fitting_plan(built: Built, solved: Solved, costs, hardware) -> Plan | None:
    """The plan of ``solved``'s values on ``built`` (a run on its model or its arrays), if it has
    values and the plan fits, else None (``built.solved`` left None)."""
    if solved.values is None:
        return None
    built.solved = solved
    try:
        plan = decode(built, costs, hardware, status="feasible", bound=None, solve_time_s=0.0)
    finally:
        built.solved = None
    return plan if plan.fits() else None


# the depth indicators' values above which ``_leaning`` reads the union LP as leaning to depth 2.
# The activation one is raised a little where the shallower activation depth's rows (each less y_a
# times its reach) pay the LP to lift it: on the random 64-layer row of benchmarks/planner.py y_a
# was 0.024 with the rows written from the compute without kept residuals, its first neighbourhood
# went to (2, 2) and found a plan 1.3 % above the union LP (1.8 s in all, against 1.2 s at (2, 1)).
# Every other instance of planner.py and planner_probes.py (varied seeds 0-39 at 64 and 128 layers,
# the shapes at 128) had y_a below 0.01 or above 0.03.
LEAN_Y = (0.01, 0.03)


def _leaning(point, union_built: Built, depths=MILP_DEPTHS, tie=None) -> list:
    """``depths`` in the order the union LP's solution ``point`` leans to. First the pair that
    reads each relaxed depth indicator above its ``LEAN_Y`` as depth 2 (a fractional indicator
    means the LP pays for some of the deeper buffer to use its overlap; on the random 128-layer
    instances y_w was 0.36-0.66 and depth 2 won), then the others by the weight the LP puts on them: the product
    of the indicators' shares (y for depth 2, 1 − y for depth 1); pairs of the same weight by
    ``tie(pair)`` (smaller first) where given, else in ``depths``' order."""
    y_w, y_a = (min(1.0, max(0.0, float(point[v.idx]))) for v in union_built.depth_indicators)
    lean = (2 if y_w > LEAN_Y[0] else 1, 2 if y_a > LEAN_Y[1] else 1)

    def weight(d):
        return (y_w if d[0] == 2 else 1.0 - y_w) * (y_a if d[1] == 2 else 1.0 - y_a)

    return sorted(depths, key=lambda d: (d != lean, -weight(d), 0.0 if tie is None else tie(d)))


def _rounding(union_built: Built, point, depth, costs, hardware, max_segment_length: int, max_resident_tail: int,
              residual_offload: bool, evaluations: int) -> Plan | None:
    """``search.round_relaxation`` of the union LP's solution ``point`` at depth pair ``depth``."""
    def shares(group):
        return {key: float(point[var.idx]) for key, var in getattr(union_built, group).items()}
    return search.round_relaxation(costs, hardware, edges=shares("x"), host=shares("host"), nvme=shares("nv"),
                                   keep=shares("res"), offload=shares("off"), tail=shares("r"),
                                   weight_prefetch_depth=depth[0], act_prefetch_depth=depth[1],
                                   max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                                   residual_offload=residual_offload, max_evaluations=evaluations)


def _residual_neighbourhood(built: Built, plan: Plan, costs, hardware, time_limit_s: float,
                            probes: int = RESIDUAL_PROBES) -> Plan:
    """``plan`` improved by keeping more residuals, each with the tiers that make its room
    (``_tier_neighbourhood(..., add_residual=l)``): the first ``probes`` layers it does not keep, in
    order of backward seconds saved per byte, each taken when it gives a faster plan. A residual's
    room may take several boundaries swapped between the device, the host and NVMe at once, which
    the search's moves do not make: on the random 64-layer NVMe instance at depths (2, 1) the first
    probe took the plan from 17.343 s to 17.287 s (0.4 s), which that depth pair's LP (17.154 s)
    proves, where CBC took 10.7 s to prove 17.343 s. Every probe runs, proved or not: stopping at
    the first plan the LP proves left a worse plan on another instance (18.828 s instead of
    18.776 s, random seed 8 with NVMe)."""
    R = costs.residual_bytes
    saving = {l: costs.bwd_recompute_time[l + 1] - costs.bwd_time[l + 1] for l in built.res}
    order = sorted((l for l in built.res if not plan.keep_residuals[l]), key=lambda l: (-saving[l] / max(R[l], 1.0), l))
    for l in order[:probes]:
        q = _tier_neighbourhood(built, plan, costs, hardware, time_limit_s, add_residual=l)
        if q is not None:
            plan = q
    return plan


def _limit(cutoff, *plans):
    """The objective every further plan must beat: the cutoff or the best of ``plans`` (None: none)."""
    values = [p.predicted_step_time_s for p in plans if p is not None] + ([cutoff] if cutoff is not None else [])
    return min(values) if values else None


MIP_SOLVER = "auto"  # "cbc" | "highs" | "auto" (``_mip_solver``: HiGHS for large models)
# where "auto" branches with HiGHS: random NVMe instances (benchmarks/planner.py's family, seeds
# 7-9, rel_gap 1 %) took 0.8-1.1 s with CBC and 1.2-1.3 s with HiGHS at 16 layers (5,000 nonzeros),
# 2.3-8.2 s and 2.2-5.3 s at 24 (8,700-9,200), 4.3-21.8 s (one left at 1.01 %) and 3.4-5.5 s at 32
HIGHS_MIP_MIN_NONZEROS = 8_000
# HiGHS' nodes when asked only for a plan rel_gap faster than the LP neighbourhoods' plan in hand
# (``solve``, large models): its root, whose cuts proved none exists on random host-only 128-layer
# instances (1.8-2.7 s, where the run without the cutoff took 8.5-15 s to find nothing better); where
# they do not, the plain run follows. Not for the search's plans: on a 32-layer instance the root
# with that cutoff took 3.7 s without settling it, where the plain run found a plan 0.7 % faster in 0.3 s
HIGHS_CUTOFF_NODES = 1
ISOLATE_CBC = hasattr(os, "fork")  # run CBC's branch and bound in a child process (see _optimize)
# models with fewer nonzeros run CBC in this process (up to about 8 layers): the abort was seen on
# 128-layer models only, and a fork costs this process's page tables each time (0.04-0.11 s from a
# process holding 0.9 GB of JAX state, against a CBC run of a few milliseconds on such a model)
ISOLATE_CBC_MIN_NONZEROS = 2_000
CBC_GRACE_S = 60.0                  # how long past its time limit a CBC child may run before it is stopped


def _optimize(built: Built, rel_gap: float, time_limit_s: float, cutoff: float | None,
              max_nodes: int = DEFAULT_MAX_NODES, preprocess: bool = True, *,
              solver: str | None = None, root_lp: str = "choose") -> str | None:
    """Branch and bound on ``built.model``; the status name, or None without a solution. What it
    found is in ``built.solved`` (``decode`` reads the values from there).

    ``solver``: "cbc" (python-mip's CBC, from the model's start if set, nothing at or above
    ``cutoff``) or "highs" (HiGHS' branch and cut through scipy, without a start, nothing above
    ``cutoff``: ``_highs_mip``); None: ``MIP_SOLVER``'s choice for this model (``_mip_solver``).
    ``preprocess=False`` skips CBC's preprocessing (``benchmarks/planner_probes.py cbc`` compares).
    ``root_lp``: HiGHS' root LP method (``_highs_mip_arrays``).

    Where the platform forks (``ISOLATE_CBC``) and the model has ``ISOLATE_CBC_MIN_NONZEROS`` or
    more, CBC runs in a child process on a copy of the model and sends back its status, bound and
    values: CBC's branch and bound has aborted with a double free in its postprocessing on a
    128-layer model and then hung in its own crash handler (benchmarks/RESULTS.md, "CBC can
    abort"). A child that dies, or outlives its time limit by ``CBC_GRACE_S``, counts as a run
    without a solution; the model in this process is never solved, so the next run starts clean."""
    m = built.model
    if solver is None:
        solver = _mip_solver(m)
    if solver == "highs":
        built.solved = _highs_mip(m, rel_gap, time_limit_s, max_nodes, cutoff, root_lp=root_lp)
    else:
        if cutoff is not None:
            m.cutoff = cutoff
        model = m.mip_model()
        model.max_mip_gap = rel_gap
        model.max_mip_gap_abs = 1e-9
        model.preprocess = -1 if preprocess else 0
        with (contextlib.nullcontext() if m.verbose else _quiet_stdout()):
            if ISOLATE_CBC and m.num_nz >= ISOLATE_CBC_MIN_NONZEROS:
                built.solved = _cbc_in_child(model, time_limit_s, max_nodes)
            else:
                built.solved = _cbc_here(model, time_limit_s, max_nodes)
    status = built.solved.status
    if status not in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE):
        return None
    return status.name.lower()


def _mip_solver(m: linear.Model) -> str:
    """``MIP_SOLVER`` for model ``m``: "auto" is HiGHS from ``HIGHS_MIP_MIN_NONZEROS`` nonzeros up
    where scipy has ``milp``, CBC otherwise."""
    if MIP_SOLVER in ("cbc", "highs"):
        return MIP_SOLVER if MIP_SOLVER == "cbc" or _scipy_milp() is not None else "cbc"
    return "highs" if m.num_nz >= HIGHS_MIP_MIN_NONZEROS and _scipy_milp() is not None else "cbc"


def _scipy_milp():
    try:
        from scipy.optimize import milp
    except ImportError:
        return None
    return milp


def _highs_mip(m: _Model, rel_gap: float, time_limit_s: float, max_nodes: int,
               cutoff: float | None = None, *, root_lp: str = "choose", bound_rows: bool = True) -> Solved:
    """HiGHS' branch and cut (scipy's bundled HiGHS) on ``m``, to ``rel_gap`` of its own incumbent;
    ``cutoff``: only plans whose objective is at most this (a row on the objective), so INFEASIBLE
    then says that nothing at these depths reaches it.

    The cutoff is a row, not HiGHS' ``objective_bound`` option: HiGHS 1.12 compares that option
    with the presolved model's objective, which differs by the presolve's offset (with a bound 10 %
    below the optimum it still returned the optimum). With a plan in hand the solve asks for one
    ``rel_gap`` faster (``solve``): where none exists, HiGHS' root cuts usually show it at once
    (random host-only 128-layer instances, depths (2, 1): infeasible in 1.8 s where the run without
    the row took 8.5-9 s to find nothing better; at (2, 2), 2.7 s against 15.1 s). Asking for less
    (half of ``rel_gap``: 20 s; the plan's own value: 9 s, as without the row) gains nothing.
    ``bound_rows=False`` leaves out the model's rows that only tighten its bound (``_Model.add_bound_row``)."""
    with _quiet_stdout():  # HiGHS prints some of its solution repairs to fd 1
        return _highs_mip_arrays(_highs_arrays(m, bound_rows), _integrality(m), rel_gap, time_limit_s, max_nodes,
                                 cutoff, root_lp=root_lp)


def _integrality(m: linear.Model):
    """scipy ``milp``'s integrality of ``m``'s variables (1: binary or integer)."""
    import numpy as np
    return np.array([1 if v.var_type in (mip.BINARY, mip.INTEGER) else 0 for v in m.vars])


def _highs_mip_arrays(arrays, integrality, rel_gap: float, time_limit_s: float, max_nodes: int,
                      cutoff: float | None = None, *, root_lp: str = "choose") -> Solved:
    """:func:`_highs_mip` on prepared arrays (``_highs_arrays``, ``_integrality``). HiGHS releases
    the interpreter lock; fd 1 is left as it is (the caller silences it, ``_quiet_stdout``).

    ``root_lp``: HiGHS' ``mip_lp_solver`` for the root's first LP ("choose": its dual simplex;
    "ipm": the interior point method, then a crossover, so the cuts and nodes still run dual
    simplex from a basis). Every run drives scipy's bundled HiGHS object directly
    (``_highs_object``), with ``HIGHS_MIP_OPTIONS``, which scipy's ``milp`` does not pass on;
    scipy's ``milp`` without presolve where that object is missing. The roots asked only for a
    plan ``rel_gap`` faster (``CUTOFF_ROOT_LP``) spend most of their time in that first LP: on the 128-layer host-only seed 13 at weight depth 2, 2.4-2.8 s
    with "ipm" against 4.1-4.8 s (the same INFEASIBLE)."""
    import numpy as np
    cost, args, const = arrays
    rows = _highs_rows(arrays)
    if cutoff is not None and math.isfinite(cutoff):
        rows.append((cost.reshape(1, -1), np.array([-np.inf]), np.array([cutoff - const])))
    lower, upper = args["bounds"][:, 0], args["bounds"][:, 1]
    if _highs_object() is not None:
        status, x, fun, bound = _highs_direct(cost, rows, lower, upper, integrality, rel_gap, time_limit_s,
                                              max_nodes, root_lp)
    else:
        status, x, fun, bound = _highs_scipy(cost, rows, lower, upper, integrality, rel_gap, time_limit_s, max_nodes)
    bound = float(bound) + const if bound is not None and math.isfinite(bound) else -math.inf
    if x is None:
        if status == "infeasible":
            return Solved(status=mip.OptimizationStatus.INFEASIBLE, objective_value=None,
                          objective_bound=math.inf, values=None)
        return Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                      objective_bound=bound, values=None)
    status = mip.OptimizationStatus.OPTIMAL if status == "optimal" else mip.OptimizationStatus.FEASIBLE
    return Solved(status=status, objective_value=float(fun) + const, objective_bound=bound,
                  values=[float(v) for v in x])


# HiGHS' presolve rules left out of its branch and cut: its doubleton-equation reduction (bit 9 of
# presolve_rule_off) returned wrong optima on these models. On random 8-layer instances (varied
# seeds 0-29, four depth pairs each: 120 models) HiGHS 1.12 as scipy 1.17 bundles it called seed
# 2 at depths (2, 2) infeasible where CBC finds a plan of 0.5216 s, and with the segment-chain row
# (``build``) it also ended "optimal" 2.6 % and 0.03 % above CBC's optimum on seeds 4 (2, 1) and
# 7 (1, 2); without that one rule (or without presolve) it agrees with CBC on all three
HIGHS_MIP_OPTIONS = {"presolve_rule_off": 1 << 9}

CUTOFF_ROOT_LP = "ipm"  # the root LP method of HiGHS' roots with a cutoff (``_highs_mip_arrays``)


def _highs_object():
    """scipy's bundled HiGHS module (``_highspy._core``) where it offers the ``mip_lp_solver``
    option, else None (scipy's ``milp`` is then used: a private module may change)."""
    global _HIGHS_CORE
    if _HIGHS_CORE is None:
        try:
            from scipy.optimize._highspy import _core
            h = _core._Highs()
            ok = h.setOptionValue("mip_lp_solver", "ipm") == _core.HighsStatus.kOk
        except Exception:  # noqa: BLE001  (a private module: anything missing means the public path)
            ok = False
        _HIGHS_CORE = _core if ok else False
    return _HIGHS_CORE or None


_HIGHS_CORE = None


def _highs_rows(arrays) -> list:
    """``_highs_arrays``' rows as (matrix, lower, upper) triples."""
    import numpy as np
    cost, args, const = arrays
    rows = [(args["A_ub"], np.full(args["A_ub"].shape[0], -np.inf), args["b_ub"])] if args["A_ub"] is not None else []
    if args["A_eq"] is not None:
        rows.append((args["A_eq"], args["b_eq"], args["b_eq"]))
    return rows


def _highs_model(cost, rows, lower, upper, integrality, options: dict):
    """A HiGHS object of scipy's bundled module (``_highs_object``) holding the model, options set."""
    import numpy as np
    import scipy.sparse
    hc = _highs_object()   # its infinity (kHighsInf) is float inf: numpy's bounds pass as they are
    a = scipy.sparse.vstack([r[0] for r in rows]).tocsc() if rows else scipy.sparse.csc_matrix((0, len(cost)))
    lp = hc.HighsLp()
    lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
    lp.a_matrix_.format_ = hc.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.col_lower_, lp.col_upper_ = lower, upper
    lp.row_lower_ = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0)
    lp.row_upper_ = np.concatenate([r[2] for r in rows]) if rows else np.zeros(0)
    if integrality is not None:
        lp.integrality_ = [hc.HighsVarType.kInteger if i else hc.HighsVarType.kContinuous for i in integrality]
    h = hc._Highs()
    for key, value in {"output_flag": False, **options}.items():
        if h.setOptionValue(key, value) != hc.HighsStatus.kOk:
            raise RuntimeError(f"HiGHS refused option {key}={value!r}")
    if h.passModel(lp) == hc.HighsStatus.kError:
        raise RuntimeError("HiGHS refused the model")
    return h


def _highs_direct(cost, rows, lower, upper, integrality, rel_gap, time_limit_s, max_nodes, root_lp):
    """One HiGHS branch and cut through scipy's bundled HiGHS object: ``(status, x, objective,
    dual bound)``, status "optimal" | "feasible" | "infeasible" | "none" (x None unless a solution
    exists; "none" with bound -inf where the run had not ended ``HIGHS_LATE_S`` past its time
    limit, ``_run_by``)."""
    import numpy as np
    hc = _highs_object()
    options = dict(mip_rel_gap=float(rel_gap), mip_max_nodes=int(max_nodes), mip_lp_solver=root_lp,
                   **HIGHS_MIP_OPTIONS, **_time_limit(time_limit_s))
    h = _highs_model(cost, rows, lower, upper, integrality, options)
    if not _run_by(h, time_limit_s):
        return "none", None, None, -math.inf
    model_status = h.getModelStatus()
    info = h.getInfo()
    bound = info.mip_dual_bound
    if model_status == hc.HighsModelStatus.kInfeasible:
        return "infeasible", None, None, bound
    has_solution = info.primal_solution_status == hc.kSolutionStatusFeasible
    if not has_solution:
        return "none", None, None, bound
    status = "optimal" if model_status == hc.HighsModelStatus.kOptimal else "feasible"
    return status, np.array(h.getSolution().col_value), info.objective_function_value, bound


# how long past its time limit a HiGHS branch and cut is waited for (``_run_by``)
HIGHS_LATE_S = 0.25


def _run_by(h, time_limit_s: float) -> bool:
    """``_run(h)`` (a branch and cut of ``_highs_direct``) in a thread of its own, waited for at most
    ``time_limit_s`` + ``HIGHS_LATE_S``: False where it was stopped or had not ended by then (its
    result is then not to be read). HiGHS checks its time limit between its steps, not inside its
    cut separation: on varied seed 54 at 128 layers (``benchmarks/planner_probes.py``) the root on
    each half of the union model, side by side in one process and asked to stop at 7.3 s, ended at
    7.7-10.9 s, and the solve took up to 23.9 s against its 20 s limit. A run left behind ends at
    its own limit, its result unread; where it works for a solve, that solve's return interrupts it
    and lowers its priority (``_solve_threads``)."""
    if not math.isfinite(time_limit_s):
        return _run(h)
    future = _in_thread(_run, h)
    try:
        return future.result(timeout=max(0.0, time_limit_s) + HIGHS_LATE_S)
    except concurrent.futures.TimeoutError:
        return False


def _highs_scipy(cost, rows, lower, upper, integrality, rel_gap, time_limit_s, max_nodes):
    """:func:`_highs_direct` through scipy's public ``milp`` (where scipy's HiGHS object is missing),
    whose options cannot leave out single presolve rules (``HIGHS_MIP_OPTIONS``): without presolve."""
    from scipy.optimize import Bounds, LinearConstraint
    milp = _scipy_milp()
    constraints = [LinearConstraint(a, lo, hi) for a, lo, hi in rows]
    options = dict(mip_rel_gap=rel_gap, node_limit=int(max_nodes), disp=False, presolve=False,
                   **_time_limit(time_limit_s))
    res = milp(cost, constraints=constraints, integrality=integrality, bounds=Bounds(lower, upper), options=options)
    bound = getattr(res, "mip_dual_bound", None)
    if res.x is None:
        return ("infeasible" if res.status == 2 else "none"), None, None, bound
    return ("optimal" if res.status == 0 else "feasible"), res.x, res.fun, bound


def _cutoff_roots(problems: list, bar: float, rel_gap: float, time_limit_s: float, enough=None) -> list:
    """HiGHS' root alone (``HIGHS_CUTOFF_NODES``) on each of ``problems`` ((arrays, integrality)
    pairs), asked only for a plan whose objective is at most ``bar``, side by side in threads: each
    root's ``Solved`` (INFEASIBLE where none exists).

    ``enough``: called with each root's index and ``Solved`` in the order of ``problems`` (a root
    that ends before those listed ahead of it waits for them), until it returns True; then the roots
    after it are interrupted, and each of them, ended or not, reports no solution (bound -inf). In
    that order, and not the order they end in, what ``enough`` sees and what comes back do not
    depend on which root the machine's load lets end first (a caller that keeps the plans its
    roots return would otherwise keep different plans under another load). The roots run for a
    token of their own (``_owned``), so that stops them and nothing else of the solve; any still
    running once this returns (past their time limit, ``_run_by``) are stopped too, and their
    threads lowered in priority with the solve's when it returns (``_solve_threads``)."""
    def root(problem):
        return _highs_mip_arrays(*problem, rel_gap, time_limit_s, HIGHS_CUTOFF_NODES, bar, root_lp=CUTOFF_ROOT_LP)
    token = _SolveToken(getattr(_OWNER, "solve", None))
    work = _owned(root, token)
    try:
        with _quiet_stdout(), concurrent.futures.ThreadPoolExecutor(max(1, len(problems))) as pool:
            futures = [pool.submit(work, problem) for problem in problems]
            found = []
            for i, future in enumerate(futures):
                if token.stopped:
                    found.append(_STOPPED_ROOT)
                    continue
                found.append(future.result())
                if enough is not None and enough(i, found[-1]):
                    _stop(token)
            return found
    finally:
        _stop(token)


# what ``_cutoff_roots`` reports for a root after the one ``enough`` accepted, ended or not
_STOPPED_ROOT = Solved(status=mip.OptimizationStatus.NO_SOLUTION_FOUND, objective_value=None,
                       objective_bound=-math.inf, values=None)


def _half_roots(union_built: Built, arrays, bar: float, halves, rel_gap: float, time_limit_s: float) -> dict:
    """``_cutoff_roots`` on the union model with its weight prefetch depth fixed at each of
    ``halves`` (1 or 2): ``{depth: True where no plan at or below ``bar`` exists}``. The union model
    relaxes every depth pair's own (its depth indicators are continuous), so True rules out every
    pair with that weight prefetch depth (tested against the exact optimum)."""
    integrality = _integrality(union_built.model)
    problems = [(_half_problem(union_built, arrays, dw), integrality) for dw in halves]
    return {dw: found.status == mip.OptimizationStatus.INFEASIBLE
            for dw, found in zip(halves, _cutoff_roots(problems, bar, rel_gap, time_limit_s))}


def _pair_roots(builts: list, bar: float, rel_gap: float, time_limit_s: float, enough=None) -> list:
    """``_cutoff_roots`` on each of ``builts`` (depth pairs' models): each root's ``Solved``
    (INFEASIBLE where that pair holds no plan at or below ``bar``; its values where the root found
    one). ``enough``: as ``_cutoff_roots``'."""
    # the models read here, not in the threads (reading them holds the interpreter lock)
    problems = [(_highs_arrays(b.model), _integrality(b.model)) for b in builts]
    return _cutoff_roots(problems, bar, rel_gap, time_limit_s, enough)


def _cbc_here(m: mip.Model | linear.Model, time_limit_s: float, max_nodes: int) -> Solved:
    """CBC's branch and bound on ``m`` (a ``linear.Model``: in its python-mip model)."""
    if isinstance(m, linear.Model):
        m = m.mip_model()
    status = m.optimize(max_seconds=time_limit_s, max_nodes=max_nodes)
    found = status in (mip.OptimizationStatus.OPTIMAL, mip.OptimizationStatus.FEASIBLE)
    bound = m.objective_bound
    return Solved(status=status, objective_value=float(m.objective_value) if found else None,
                  objective_bound=float(bound) if bound is not None else -math.inf,
                  values=[v.x for v in m.vars] if found else None)


def _cbc_in_child(m: mip.Model | linear.Model, time_limit_s: float, max_nodes: int) -> Solved:
    """:func:`_cbc_here` in a forked child; ``Solved`` with status ERROR if the child dies or hangs."""
    if isinstance(m, linear.Model):
        m = m.mip_model()  # here, once, not in each child
    failed = Solved(status=mip.OptimizationStatus.ERROR, objective_value=None, objective_bound=-math.inf, values=None)
    read_fd, write_fd = os.pipe()
    sys.stdout.flush()
    with warnings.catch_warnings():  # JAX warns on any fork; the child only runs CBC and exits
        warnings.simplefilter("ignore")
        pid = os.fork()
    if pid == 0:  # the child: solve, send the result, leave without any of the parent's cleanup
        code = 1
        try:
            os.close(read_fd)
            solved = _cbc_here(m, time_limit_s, max_nodes)
            payload = pickle.dumps((solved.status.value, solved.objective_value, solved.objective_bound,
                                    solved.values))
            with os.fdopen(write_fd, "wb") as out:
                out.write(payload)
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    deadline = time.monotonic() + (time_limit_s if math.isfinite(time_limit_s) else 1e9) + CBC_GRACE_S
    chunks = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)   # hung (or past its limit): stop it
                break
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        _, wait_status = os.waitpid(pid, 0)
    if not chunks or not os.WIFEXITED(wait_status) or os.WEXITSTATUS(wait_status) != 0:
        warnings.warn(f"CBC's run in a child process ended without a result (wait status {wait_status}); "
                      f"the plan found so far stands", RuntimeWarning, stacklevel=3)
        return failed
    status, value, bound, values = pickle.loads(b"".join(chunks))
    return Solved(status=mip.OptimizationStatus(status), objective_value=value, objective_bound=bound, values=values)


def _search_for_depths(costs, hardware, dw, da, max_segment_length, max_resident_tail, evaluations,
                       residual_offload) -> Plan | None:
    """The search's plan for depths (dw, da), made at those depths (its model plays the deeper
    prefetch: ``search.FastModel``); None for (1, 1), or when nothing fits."""
    if (dw, da) == (1, 1):
        return None
    return search.heuristic_plan(costs, hardware, max_segment_length=max_segment_length,
                                 max_resident_tail=max_resident_tail, max_evaluations=evaluations,
                                 residual_offload=residual_offload, weight_prefetch_depth=dw, act_prefetch_depth=da)


def _at_depths(plan: Plan | None, dw: int, da: int) -> Plan | None:
    """``plan`` with the given prefetch depths, if it still fits (None otherwise)."""
    if plan is None or plan.optimizer_mode != "pipelined":
        return None
    if (plan.weight_prefetch_depth, plan.act_prefetch_depth) == (dw, da):
        return plan
    moved = plan.repredict(weight_prefetch_depth=dw, act_prefetch_depth=da)
    return moved if moved.fits() else None


def _start_values(plan, built: Built):
    """Variable values of ``plan`` for CBC's warm start (``linear.Model.start``), or [] if it is
    outside the MILP's space."""
    x, dev, host, nv, res, r = built.x, built.dev, built.host, built.nv, built.res, built.r
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
    offload = memory.offloaded_residuals(plan)
    if any(offload[l] and l not in built.off for l in range(L)):
        return []
    for l, var in built.off.items():
        start.append((var, 1.0 if offload[l] else 0.0))
    for l, var in r.items():
        start.append((var, 1.0 if l >= L - plan.resident_tail else 0.0))
    if plan.resident_tail and any(l not in r for l in range(L - plan.resident_tail, L)):
        return []
    return start


@contextlib.contextmanager
def _quiet_stdout():
    """CBC's LP relaxation prints to the C-level stdout even with verbose=0: silence fd 1.

    One at a time (a lock): two overlapping redirections from two threads restore each other's
    saved descriptor and leave fd 1 on /dev/null for good (seen when the union LP's CLP ran in a
    thread; only HiGHS, which prints nothing, runs there now)."""
    with _STDOUT_LOCK:
        yield from _redirect_stdout()


_STDOUT_LOCK = threading.RLock()


def _redirect_stdout():
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
