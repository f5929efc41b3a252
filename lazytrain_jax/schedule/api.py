"""``lt.plan``: the step-time-optimal Plan for a model on a hardware, batch and sequence length.

Outer loop (each choice changes Costs, so each is its own small MILP): the number of micro-batches
(divisors of the batch, tried in order of their ideal lower bound and pruned once that bound
cannot beat the best plan found) and, for ``batch_size="max" | "best"``, the batch size. Inside
the MILP: checkpoints, tiers, recompute, residuals and the resident tail (see ``milp.py``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time

from lazytrain_jax.schedule import heuristics, least_peak, memory, milp, search, timing
from lazytrain_jax.schedule.costs import Costs, analytic_costs
from lazytrain_jax.schedule.hardware import Hardware, as_hardware, check_positive_int
from lazytrain_jax.schedule.plan import Plan

MAX_MICRO_BATCHES = 64
# plan(hardware="measure"): micro-batch counts profiled beyond the fewest at which a plan fits
MEASURED_EXTRA_COUNTS = 2


class NoPlanFits(ValueError):
    """No plan fits the device budget (the message names the memory it would need)."""


def resolve_config(model):
    """A ModelConfig from a preset name, a ModelConfig or anything with ``.config``."""
    from lazytrain_jax.model.config import resolve_config as resolve
    return resolve(model, what="a Model, a ModelConfig, a preset name or a Costs")


def _check_positive_int(name, value):
    check_positive_int(name, value)


def _check_solver_args(max_segment_length, max_resident_tail, time_limit_s, rel_gap) -> None:
    _check_positive_int("max_segment_length", max_segment_length)
    if isinstance(max_resident_tail, bool) or not isinstance(max_resident_tail, int) or max_resident_tail < 0:
        raise ValueError(f"max_resident_tail={max_resident_tail!r} must be an integer >= 0")
    if (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float))
            or not (math.isfinite(time_limit_s) and time_limit_s > 0)):
        raise ValueError(f"time_limit_s={time_limit_s!r} must be a finite number of seconds > 0")
    if isinstance(rel_gap, bool) or not isinstance(rel_gap, (int, float)) or not 0 <= rel_gap < 1:
        raise ValueError(f"rel_gap={rel_gap!r} must be a number in [0, 1) (a relative optimality gap; "
                         f"0 = prove optimality, 1e-2 = within 1%)")


def _solver_kw(max_segment_length, max_resident_tail, time_limit_s, rel_gap, residual_offload) -> dict:
    """The MILP's keyword arguments, checked."""
    _check_solver_args(max_segment_length, max_resident_tail, time_limit_s, rel_gap)
    if not isinstance(residual_offload, bool):
        raise ValueError(f"residual_offload={residual_offload!r} must be True or False")
    return dict(max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                time_limit_s=float(time_limit_s), rel_gap=float(rel_gap), residual_offload=residual_offload)


def _check_batch_args(batch_size, seq_len, num_micro_batches) -> None:
    """``batch_size`` a positive integer (divisible by a fixed ``num_micro_batches``), "max" or "best"."""
    _check_positive_int("seq_len", seq_len)
    if num_micro_batches is not None:
        _check_positive_int("num_micro_batches", num_micro_batches)
    if batch_size in ("max", "best"):
        return
    if batch_size is None or isinstance(batch_size, str):
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer, 'max' or 'best'")
    _check_positive_int("batch_size", batch_size)
    if num_micro_batches is not None and batch_size % num_micro_batches:
        raise ValueError(f"num_micro_batches={num_micro_batches} must divide batch_size={batch_size}")


def ideal_plan(costs: Costs, hardware: Hardware) -> Plan:
    """Every boundary on device, every layer resident and each layer's residuals kept where its
    backward from them is the faster one (ignores memory): no plan on these Costs has a shorter
    step, so its time is a lower bound for pruning. (Measured times can have a layer's backward
    with in-layer recompute below the one from kept residuals; keeping them there would make
    this "ideal" slower than plans that do not, and prune every candidate.)"""
    num_layers = costs.num_layers
    keep = [costs.bwd_time[l + 1] < costs.bwd_recompute_time[l + 1] for l in range(num_layers)]
    return Plan.create(costs, hardware, name="ideal", boundary_tiers=["device"] * (num_layers + 1),
                       keep_residuals=keep, resident_tail=num_layers)


def best_heuristic(costs: Costs, hardware: Hardware) -> Plan | None:
    fitting = [p for p in heuristics.all_heuristics(costs, hardware) if p.fits() and p.costs == costs]
    return min(fitting, key=lambda p: p.predicted_step_time_s, default=None)


_NOT_GIVEN = object()


def plan_for_costs(costs: Costs, hardware: Hardware, cutoff: float | None = None, stats: dict | None = None,
                   heuristic=_NOT_GIVEN, **solver_kw) -> Plan | None:
    """The MILP plan for fixed Costs, warm-started from the best fitting heuristic (None if none fits,
    or none beats ``cutoff``; where the interior boundaries are all one size, None at once when the
    least-peak plan does not fit). ``stats``: ``milp.solve``'s (its ``bound`` among them).
    ``heuristic``: ``best_heuristic(costs, hardware)`` where the caller has it already (None: none
    fits), so it is not computed twice."""
    if heuristic is _NOT_GIVEN:
        heuristic = best_heuristic(costs, hardware)
    warm = heuristic or fitting_start(costs, hardware, **solver_kw)
    if warm is None and least_peak.uniform_boundaries(costs):
        return None  # the least-peak plan does not fit (fitting_start): no plan does
    if warm is not None and cutoff is not None and warm.predicted_step_time_s >= cutoff:
        warm = None
    solved = milp.solve(costs, hardware, warm_start=warm, cutoff=cutoff, stats=stats, **solver_kw)
    if warm is not None and (solved is None or warm.predicted_step_time_s < solved.predicted_step_time_s - 1e-9):
        return warm  # a heuristic outside the MILP's space (e.g. longer segments) can win a time-out
    return solved


def fitting_start(costs: Costs, hardware: Hardware, **solver_kw) -> Plan | None:
    """A plan that fits wherever one exists, for the MILP to start from where no heuristic fits
    (budgets near the least peak, where its branch and bound may end its node budget with no plan):
    the memory-first search's plan, else the least-peak plan (``least_peak.least_peak_plan``, exact
    where the interior boundaries are all one size: every real model), else the least-peak of
    ``search.spaced_checkpoints``, else the first fitting plan of the MILP with the memory
    objective (``milp.first_fitting``, which needs no feasible start). None when nothing fits."""
    space = {k: solver_kw[k] for k in ("max_segment_length", "max_resident_tail", "residual_offload")
             if k in solver_kw}
    least = least_peak.least_peak_plan(costs, hardware, space.get("max_segment_length", 8))
    if least is not None and not least.fits():
        return None  # the least peak, exactly (one boundary size): it does not fit, so nothing does
    found = search.heuristic_plan(costs, hardware, max_evaluations=0, memory_first=True, **space)
    if found is not None and found.fits():
        return found
    if least is not None:
        return least
    found = search.spaced_checkpoints(costs, hardware, space.get("max_segment_length", 8))
    return found if found is not None else milp.first_fitting(costs, hardware, **solver_kw)


def micro_batch_candidates(batch_size: int) -> list[int]:
    return [m for m in range(1, min(batch_size, MAX_MICRO_BATCHES) + 1) if batch_size % m == 0]


def _costs_for(config, hardware, batch_size, seq_len, num_micro_batches, grad_dtype):
    return analytic_costs(config, batch_size=batch_size, seq_len=seq_len, device_flops=hardware.device_flops,
                          num_micro_batches=num_micro_batches,
                          efficiency_half_tokens=hardware.efficiency_half_tokens, grad_dtype=grad_dtype)


def plan_fixed_batch(config, hardware, batch_size, seq_len, *, num_micro_batches=None, grad_dtype="bfloat16",
                     **solver_kw) -> Plan | None:
    """Best plan over micro-batch counts for one batch size (None if nothing fits)."""
    ms = [num_micro_batches] if num_micro_batches is not None else micro_batch_candidates(batch_size)
    return best_over_micro_batches(
        [(m, _costs_for(config, hardware, batch_size, seq_len, m, grad_dtype), hardware) for m in ms], **solver_kw)


def best_over_micro_batches(candidates, **solver_kw) -> Plan | None:
    """The plan with the least step time per token among ``candidates``, each ``(micro-batch
    count, Costs, Hardware)``: one batch's micro-batch counts, or every candidate batch's at once
    (``batch_size="best"``; for one batch the least step time). None if nothing fits.

    Best first: a candidate's bound is its ideal step time per token (``ideal_plan``), raised by
    its LP bound (``milp.lp_bound``) when it comes first; once its LP bound still comes first it is
    solved (``plan_for_costs``, cut off at the best plan's time per token so far). The search stops
    once no candidate's bound is more than ``rel_gap`` below the best plan: only the candidates that
    come first get an LP, and batches that cannot beat the best by more than ``rel_gap`` are never
    solved. The plan's gap and status cover every candidate (against the least bound of those not
    solved and the solved ones' own bounds). A candidate whose least-peak plan does not fit (where
    that plan is exact: ``least_peak``) is dropped before its LP; the next candidate's LP is begun
    while the one before runs (``milp.lp_bound_started``: the same values, so the same decisions)."""
    t0 = time.perf_counter()
    rel_gap = solver_kw.get("rel_gap", milp.DEFAULT_REL_GAP)
    space = {k: solver_kw[k] for k in ("max_segment_length", "max_resident_tail") if k in solver_kw}
    open_ = []  # [bound per token, micro-batches, index, refined, Costs, Hardware, tokens]
    for i, (m, costs, hardware) in enumerate(candidates):
        if not _constants_fit(costs, hardware):
            continue
        tokens = costs.batch_size * costs.seq_len
        ideal = timing.step_time(costs, hardware, ideal_plan(costs, hardware)) / tokens
        open_.append([ideal, m, i, False, costs, hardware, tokens])
    # prune with an upper bound (the best fitting heuristic's time per token); the heuristics are
    # kept for the solves' warm starts (plan_for_costs would compute each again)
    heuristics_of = {c[2]: best_heuristic(c[4], c[5]) for c in open_}
    upper = min((h.predicted_step_time_s / c[6] for c in open_ if (h := heuristics_of[c[2]])),
                default=float("inf"))
    open_ = [c for c in open_ if c[0] < upper * (1 + 1e-9)]
    refine = len(open_) > 1  # a lone candidate needs no LP to be ordered
    heapq.heapify(open_)
    best, best_tpt, closed = None, float("inf"), []  # closed: the solved candidates' bounds per token
    fits, started = {}, {}  # candidate index -> its least-peak plan fits; its LP bound begun

    def may_fit(c):  # False where its least-peak plan does not fit (exact): no plan for it
        if c[2] not in fits:
            fits[c[2]] = not least_peak.uniform_boundaries(c[4]) or _fits(c[4], c[5], solver_kw)
        return fits[c[2]]

    def start(c):
        if c[2] not in started:
            started[c[2]] = milp.lp_bound_started(c[4], c[5], **space)

    with milp.stopping_threads():  # LP bounds begun ahead and not needed are stopped at the end
        while open_:
            if best is not None and open_[0][0] >= best_tpt * (1 - rel_gap) - 1e-15:
                break  # no candidate left can improve by more than the tolerance
            c = heapq.heappop(open_)
            bound, _, _, refined, costs, hardware, tokens = c
            if refine and not refined:
                if not may_fit(c):
                    continue
                start(c)
                # the next candidate to need its LP bound is built while this one's LP runs
                ahead = next((d for d in heapq.nsmallest(4, open_) if not d[3] and may_fit(d)), None)
                if ahead is not None:
                    start(ahead)
                c[0], c[3] = max(bound, started.pop(c[2])() / tokens), True
                heapq.heappush(open_, c)
                continue
            stats = {}
            solved = plan_for_costs(costs, hardware, cutoff=best_tpt * tokens if best is not None else None,
                                    stats=stats, heuristic=heuristics_of[c[2]], **solver_kw)
            if solved is None:  # nothing beats the cutoff: the solve's bound (at least the cutoff's, less rel_gap)
                closed.append(max(bound, stats.get("bound", -math.inf) / tokens))
                continue
            tpt = solved.predicted_step_time_s / tokens
            # a solved plan's own bound (a heuristic plan that beat the solve carries none)
            closed.append(bound if solved.gap is None else max(bound, tpt * (1 - solved.gap)))
            if tpt < best_tpt:
                best, best_tpt = solved, tpt
    if best is None:
        return None
    lowest = min(closed + [c[0] for c in open_])
    gap = max(0.0, (best_tpt - lowest) / best_tpt)
    # "optimal" only where every candidate is ruled out within rel_gap, not the solve's pair alone
    status = "feasible" if best.solver_status == "optimal" and gap > rel_gap * (1 + 1e-9) + 1e-12 \
        else best.solver_status
    return dataclasses.replace(best, gap=gap, solver_status=status, solve_time_s=time.perf_counter() - t0)


def _batch_costs(config, hardware, batch_size, seq_len, grad_dtype, num_micro_batches, costs_for):
    """The Costs of ``batch_size`` sequences in ``num_micro_batches`` (default: the most micro-batches),
    None where that count does not divide the batch. ``costs_for(batch, micro_batches)``: the Costs
    (default: analytic)."""
    m = num_micro_batches or max(micro_batch_candidates(batch_size))
    if batch_size % m:
        return None
    return (costs_for or _analytic(config, hardware, seq_len, grad_dtype))(batch_size, m)


def _constants_fit(costs, hardware) -> bool:
    """Whether the step's fixed device bytes (``memory.constant_bytes``) fit the device budget."""
    return sum(memory.constant_bytes(costs, hardware).values()) <= hardware.device_memory


def _fits_by_search(costs, hardware, max_segment_length=8, max_resident_tail=8) -> bool:
    if not _constants_fit(costs, hardware):
        return False
    found = search.heuristic_plan(costs, hardware, max_segment_length=max_segment_length,
                                  max_resident_tail=max_resident_tail, max_evaluations=0, memory_first=True)
    return found is not None or search.spaced_checkpoints(costs, hardware, max_segment_length) is not None


def _fits_by_milp(costs, hardware, **solver_kw) -> bool:
    return _constants_fit(costs, hardware) and milp.first_fitting(costs, hardware, **solver_kw) is not None


def fits_by_search(config, hardware, batch_size, seq_len, *, grad_dtype="bfloat16", num_micro_batches=None,
                   max_segment_length=8, max_resident_tail=8, costs_for=None) -> bool:
    """Cheap feasibility: does the search heuristic (or ``search.spaced_checkpoints``) find a fitting
    plan (True proves feasibility; False proves nothing). ``costs_for(batch, micro_batches)``: the
    Costs (default: analytic)."""
    costs = _batch_costs(config, hardware, batch_size, seq_len, grad_dtype, num_micro_batches, costs_for)
    return costs is not None and _fits_by_search(costs, hardware, max_segment_length, max_resident_tail)


def _analytic(config, hardware, seq_len, grad_dtype):
    return lambda batch_size, m: _costs_for(config, hardware, batch_size, seq_len, m, grad_dtype)


def min_device_bytes(config, hardware, batch_size, seq_len, *, grad_dtype="bfloat16", num_micro_batches=None,
                     costs_for=None, **solver_kw) -> float:
    """The smallest peak device memory of any plan for this batch (default: the most micro-batches).
    ``costs_for(batch, micro_batches)``: the Costs (default: analytic)."""
    costs = _batch_costs(config, hardware, batch_size, seq_len, grad_dtype, num_micro_batches, costs_for)
    return float("inf") if costs is None else least_device_bytes(costs, hardware, **solver_kw)


def least_device_bytes(costs, hardware, **solver_kw) -> float:
    """The smallest peak device memory of any plan for ``costs`` within ``hardware``'s host and NVMe
    room: ``least_peak.least_peak_plan`` where the interior boundaries are all one size, else the
    MILP with the memory objective (inf where it finds none)."""
    if least_peak.uniform_boundaries(costs):
        return least_peak.least_peak_plan(costs, hardware, solver_kw.get("max_segment_length", 8)
                                          ).predicted_peak_device_bytes
    solved = milp.solve(costs, hardware.replace(device_memory=1e30), objective="memory", **solver_kw)
    return float("inf") if solved is None else solved.predicted_peak_device_bytes


def fits_by_milp(config, hardware, batch_size, seq_len, *, grad_dtype="bfloat16", num_micro_batches=None,
                 costs_for=None, **solver_kw) -> bool:
    """Whether the MILP finds a plan that fits this batch (default: the most micro-batches):
    ``milp.first_fitting``, which stops at the first fitting plan. False where none exists or none
    is found within ``time_limit_s``. ``costs_for(batch, micro_batches)``: the Costs (default: analytic)."""
    costs = _batch_costs(config, hardware, batch_size, seq_len, grad_dtype, num_micro_batches, costs_for)
    return costs is not None and _fits_by_milp(costs, hardware, **solver_kw)


def _fits(costs, hardware, solver_kw) -> bool:
    """Some plan fits ``costs``: the least-peak plan fits (exact, where the interior boundaries are
    all one size), else the searches' (cheap), else the MILP's first fitting plan."""
    space = {k: solver_kw[k] for k in ("max_segment_length", "max_resident_tail") if k in solver_kw}
    if least_peak.uniform_boundaries(costs):
        return least_peak.least_peak_plan(costs, hardware, space.get("max_segment_length", 8)).fits()
    return _fits_by_search(costs, hardware, **space) or _fits_by_milp(costs, hardware, **solver_kw)


def max_batch_size(config, hardware, seq_len, *, grad_dtype="bfloat16", num_micro_batches=None,
                   limit: int = 1 << 16, costs_for=None, **solver_kw) -> int:
    """The largest batch for which some plan fits (0 if even batch 1 does not). ``costs_for(batch,
    micro_batches)``: the Costs (default: analytic; only their bytes matter here)."""
    def feasible(b):
        costs = _batch_costs(config, hardware, b, seq_len, grad_dtype, num_micro_batches, costs_for)
        return costs is not None and _fits(costs, hardware, solver_kw)
    if not feasible(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and feasible(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if feasible(mid) else (lo, mid)
    return lo


def candidate_batches(largest: int, num_micro_batches: int | None = None) -> list[int]:
    """The batch sizes ``batch_size="best"`` compares: the largest that fits, the powers of two
    below it and 50 / 75 / 90 % of it (those a fixed ``num_micro_batches`` divides)."""
    batches = sorted({largest, *(b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < largest),
                      *(int(largest * f) for f in (0.5, 0.75, 0.9) if int(largest * f) >= 1)})
    return [b for b in batches if num_micro_batches is None or b % num_micro_batches == 0]


def plan(model, hardware: Hardware | str = "rtx3090", *, batch_size: int | str = 1, seq_len: int = 1024,
         num_micro_batches: int | None = None, grad_dtype: str = "bfloat16", max_segment_length: int = 8,
         max_resident_tail: int = 8, time_limit_s: float = 30.0, rel_gap: float = milp.DEFAULT_REL_GAP,
         device_memory: float | None = None, stream_dtype: str = "bfloat16", residual_offload: bool = True,
         offload_dir: str | None = None) -> Plan:
    """The step-time-optimal Plan (a python-mip model; CBC or HiGHS branches) for a model on a hardware.

    ``hardware="measure"`` profiles the machine this runs on at the step's shapes
    (``lt.profile``: imports jax, compiles and times the units) and plans for its measured Costs
    and rates under ``device_memory`` (required on the CPU backend): the link, NVMe and optimizer
    rates once, the layers at the fewest micro-batches at which some plan fits (the units' real
    bytes) and at the next ``MEASURED_EXTRA_COUNTS`` divisors of the batch (each profile compiles
    the layer kinds at its shapes; each count its own MILP, as with a Hardware); ``batch_size=
    "max" | "best"`` finds the batches that fit from the units' real bytes and profiles only the
    batches it plans for.

    Args:
      model: a Model (anything with ``.config``), a ModelConfig, a preset name, or a Costs (then
        batch, sequence and micro-batches come from it and ``batch_size``/``seq_len`` are ignored).
      hardware: a Hardware or a preset name (``Hardware.preset`` for overrides).
      batch_size: sequences per step, ``"max"`` (largest feasible) or ``"best"`` (highest predicted
        tokens/s among feasible batches).
      seq_len: tokens per sequence.
      num_micro_batches: fix the layer-major micro-batch count (default: optimised over divisors).
      grad_dtype: ``bfloat16`` | ``float32`` gradients sent to the host.
      max_segment_length, max_resident_tail: size limits of the MILP's decision space.
      time_limit_s, rel_gap: limits of each MILP's solve (one per micro-batch count): its seconds
        in all (the search and the LPs always run; branch and bound only within them) and the
        gap at which it stops (the best plan and its gap are reported either way). On real
        model shapes the default gap of 1% is usually proven by the LP bound in about a second
        for 64 layers; where boundaries take many times a layer's forward to move, the solve can
        end at the limit unproved (benchmarks/RESULTS.md, "Instances of varied magnitudes"). Pass
        a smaller gap for a tighter proof (the solver then branches, up to the limit: CBC on
        small models, HiGHS from ``milp.HIGHS_MIP_MIN_NONZEROS``).
        The returned gap covers the micro-batch loop too (against the smallest bound of any count).
      residual_offload: whether layers' kept residuals may live on the host (``Plan.offload_residuals``).
      device_memory, stream_dtype, offload_dir: ``hardware="measure"`` only (``lt.profile``'s; given with a
        Hardware or preset, an error: it carries its own budgets).
    Returns:
      The Plan, with predicted step time, peak bytes, solver status, gap and solve time.
    Raises:
      ValueError: on bad input, or when nothing fits (naming the smallest device memory that would
        fit this batch and the largest batch that fits this device).
    Example:
      >>> p = plan("qwen2.5-7b", "rtx3090", batch_size="max", seq_len=1024)
      >>> print(p.explain())
    """
    if isinstance(hardware, str) and hardware == "measure":
        return plan_measured(model, batch_size=batch_size, seq_len=seq_len, num_micro_batches=num_micro_batches,
                             device_memory=device_memory, stream_dtype=stream_dtype, offload_dir=offload_dir,
                             max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                             time_limit_s=time_limit_s, rel_gap=rel_gap, residual_offload=residual_offload)
    for name, value, unset in (("device_memory", device_memory, None), ("stream_dtype", stream_dtype, "bfloat16"),
                               ("offload_dir", offload_dir, None)):
        if value != unset:
            raise ValueError(f"{name}={value!r} applies only with hardware='measure' (a Hardware carries its own "
                             f"budgets, e.g. Hardware.preset('rtx3090', device_memory=20e9); analytic Costs stream "
                             f"in bfloat16)")
    hw = as_hardware(hardware)
    solver_kw = _solver_kw(max_segment_length, max_resident_tail, time_limit_s, rel_gap, residual_offload)
    if not math.isfinite(hw.device_memory):
        raise ValueError(f"hardware.device_memory={hw.device_memory!r} must be a finite number of bytes")
    if isinstance(model, Costs):
        result = plan_for_costs(model, hw, **solver_kw)
        if result is None:
            constant = sum(memory.constant_bytes(model, hw).values())
            need = constant if constant > hw.device_memory else least_device_bytes(model, hw, **solver_kw)
            raise NoPlanFits(f"no plan for these Costs ({model.model_name}, batch_size={model.batch_size}, "
                             f"seq_len={model.seq_len}, num_micro_batches={model.num_micro_batches}) fits {hw.name}: "
                             f"it needs at least {_size(need)} of device memory "
                             f"(device_memory={_size(hw.device_memory)})")
        return result
    config = resolve_config(model)
    _check_batch_args(batch_size, seq_len, num_micro_batches)
    if batch_size in ("max", "best"):
        largest = _largest_or_raise(config, hw, batch_size, seq_len, num_micro_batches, solver_kw,
                                    grad_dtype=grad_dtype)
        if batch_size == "max":
            return _plan_or_raise(config, hw, largest, seq_len, num_micro_batches, grad_dtype, solver_kw)
        # every candidate batch's micro-batch counts in one best-first search on time per token
        best = best_over_micro_batches(
            [(m, _costs_for(config, hw, b, seq_len, m, grad_dtype), hw)
             for b in candidate_batches(largest, num_micro_batches)
             for m in ([num_micro_batches] if num_micro_batches is not None else micro_batch_candidates(b))],
            **solver_kw)
        if best is None:  # the bytes said the largest fits: a plan must exist there
            raise RuntimeError(f"no plan found for batch_size={largest} although its bytes fit")
        return best
    return _plan_or_raise(config, hw, batch_size, seq_len, num_micro_batches, grad_dtype, solver_kw)


def _size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.2f} MB"


def plan_measured(model, *, batch_size: int | str, seq_len: int, num_micro_batches: int | None = None,
                  device_memory: float | None = None, stream_dtype: str = "bfloat16", offload_dir: str | None = None,
                  device_margin: float = 0.0, max_segment_length: int = 8, max_resident_tail: int = 8,
                  time_limit_s: float = 30.0, rel_gap: float = milp.DEFAULT_REL_GAP,
                  residual_offload: bool = True) -> Plan:
    """``plan(model, hardware="measure", ...)`` (see :func:`plan`), with the profiled Hardware's
    ``device_margin`` set (bytes of ``device_memory`` the plan leaves free; the profiler's is 0)."""
    from lazytrain_jax.executor import profiler  # jax, only when measuring
    solver_kw = _solver_kw(max_segment_length, max_resident_tail, time_limit_s, rel_gap, residual_offload)
    config = resolve_config(model)
    _check_batch_args(batch_size, seq_len, num_micro_batches)
    # which batches and micro-batch counts fit depends on bytes alone (the units' real ones) and the
    # memory room: found before anything is timed, under stand-in rates
    room = profiler.memory_room(config, device_memory=device_memory, offload_dir=offload_dir)
    hw = Hardware(name="this machine (measured)", h2d_bw=1.0, d2h_bw=1.0, device_flops=1.0,
                  device_margin=float(device_margin), **room)

    def byte_costs(b, m):  # the units' real bytes; times analytic (unused where only bytes count)
        return profiler.unit_costs(config, batch_size=b, seq_len=seq_len, num_micro_batches=m,
                                   stream_dtype=stream_dtype)

    def timed(b, m):  # (Costs, Hardware) measured at b sequences in m micro-batches (rates: once)
        costs, measured = profiler.profile(config, b, seq_len, num_micro_batches=m, stream_dtype=stream_dtype,
                                           offload_dir=offload_dir, device_memory=room["device_memory"],
                                           host_memory=room["host_memory"], nvme_memory=room["nvme_memory"])
        return costs, measured.replace(device_margin=float(device_margin))

    def fits(b, m):  # some plan fits at b sequences in m micro-batches (the units' real bytes)
        return _fits(byte_costs(b, m), hw, solver_kw)

    def best_for(b):
        ms = [num_micro_batches] if num_micro_batches is not None else micro_batch_candidates(b)
        fitting = [m for m in ms if b % m == 0
                   and _constants_fit(byte_costs(b, m), hw)]
        if num_micro_batches is None:
            # each count is profiled at its own shapes (a compilation per layer kind): the fewest
            # micro-batches at which some plan fits and the next MEASURED_EXTRA_COUNTS counts
            first = next((i for i, m in enumerate(fitting) if fits(b, m)), len(fitting))
            fitting = fitting[first:first + 1 + MEASURED_EXTRA_COUNTS]
        return best_over_micro_batches([(m, *timed(b, m)) for m in fitting], **solver_kw)

    if isinstance(batch_size, int):
        result = best_for(batch_size)
        if result is not None:
            return result
        _raise_no_plan_fits(config, hw, batch_size, seq_len, num_micro_batches, solver_kw, costs_for=byte_costs)
    largest = _largest_or_raise(config, hw, batch_size, seq_len, num_micro_batches, solver_kw, costs_for=byte_costs)
    batches = [largest] if batch_size == "max" else candidate_batches(largest, num_micro_batches)
    plans = [p for p in (best_for(b) for b in batches) if p is not None]
    if not plans:  # the bytes said the largest fits: a plan must exist there
        raise RuntimeError(f"no plan found for batch_size={largest} although its bytes fit (measured)")
    return max(plans, key=lambda p: p.tokens_per_s)


def _plan_or_raise(config, hw, batch_size, seq_len, num_micro_batches, grad_dtype, solver_kw) -> Plan:
    result = plan_fixed_batch(config, hw, batch_size, seq_len, num_micro_batches=num_micro_batches,
                              grad_dtype=grad_dtype, **solver_kw)
    if result is not None:
        return result
    _raise_no_plan_fits(config, hw, batch_size, seq_len, num_micro_batches, solver_kw, grad_dtype=grad_dtype)


def _raise_no_plan_fits(config, hw, batch_size, seq_len, num_micro_batches, solver_kw, *, grad_dtype="bfloat16",
                        costs_for=None):
    """NoPlanFits for this batch, naming the least device memory it needs and the largest batch that
    fits (``costs_for``: the Costs of a (batch, micro-batches), default analytic)."""
    kw = dict(grad_dtype=grad_dtype, num_micro_batches=num_micro_batches, costs_for=costs_for, **solver_kw)
    need = min_device_bytes(config, hw, batch_size, seq_len, **kw)
    largest = max_batch_size(config, hw, seq_len, **kw)
    fixed = "" if num_micro_batches is None else f", num_micro_batches={num_micro_batches}"
    raise NoPlanFits(f"no plan fits batch_size={batch_size}, seq_len={seq_len}{fixed} on {hw.name}: it needs at "
                     f"least {_size(need)} of device memory (device_memory={_size(hw.device_memory)}, "
                     f"host_memory={_size(hw.host_memory)}, nvme_memory={_size(hw.nvme_memory)}); "
                     f"the largest batch that fits is {largest}")


def _largest_or_raise(config, hw, batch_size, seq_len, num_micro_batches, solver_kw, *, grad_dtype="bfloat16",
                      costs_for=None) -> int:
    """The largest batch that fits (``batch_size`` "max" or "best"), or NoPlanFits naming what batch 1 needs."""
    largest = max_batch_size(config, hw, seq_len, grad_dtype=grad_dtype, num_micro_batches=num_micro_batches,
                             costs_for=costs_for, **solver_kw)
    if largest == 0:
        need = min_device_bytes(config, hw, 1, seq_len, grad_dtype=grad_dtype, costs_for=costs_for, **solver_kw)
        raise NoPlanFits(f"batch_size={batch_size!r}: not even batch 1 fits {hw.name}: it needs at least "
                         f"{_size(need)} of device memory (device_memory={_size(hw.device_memory)})")
    return largest
