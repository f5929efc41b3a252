"""``lt.plan``'s batch choice: ``batch_size="best"`` and ``"max"``, timed against the way they ran before.

For each (model preset, hardware preset), in one process, side by side:

  largest   the largest batch that fits (``api.max_batch_size``): its feasibility test the
            least-peak plan by dynamic programming (``least_peak.least_peak_plan``, every preset
            here having boundaries of one size), as ``lt.plan`` runs it, against the two ways it ran
            before: the greedy search, ``search.spaced_checkpoints`` and the memory MILP's first
            fitting plan (``milp.first_fitting``); and, before that, the greedy search and the
            least-peak memory MILP (``milp.solve(objective="memory")`` at or under the budget)
  best      ``batch_size="best"`` at that largest batch: one best-first search over every (batch,
            micro-batch count) on step time per token (``api.best_over_micro_batches``, as
            ``lt.plan`` runs it) against each candidate batch planned on its own
            (``api.plan_fixed_batch``, today's, one batch at a time) and the most tokens/s taken,
            the loop ``lt.plan`` ran before

Printed: seconds, the batch and micro-batches chosen, tokens/s, gap and status (the per-batch loop
reports its chosen batch's own gap, which does not cover the other batches).

Run: python benchmarks/plan_batch.py [--large]   (--large adds Qwen3.6-27B on an H800: minutes)
"""

import argparse
import contextlib
import time

from lazytrain_jax.model.config import get_preset
from lazytrain_jax.schedule import api, least_peak, milp, search
from lazytrain_jax.schedule.hardware import as_hardware

CASES = [("qwen2.5-7b", "rtx3090"), ("qwen3-8b", "a100-80g"), ("qwen2.5-3b", "rtx3090")]
LARGE = [("qwen3.6-27b", "h800")]
SEQ = 1024


@contextlib.contextmanager
def _patched(module, **values):
    saved = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def _without_least_peak():
    """``lt.plan`` as if the boundaries differed in size: no least-peak plan by dynamic programming."""
    return _patched(least_peak, uniform_boundaries=lambda costs: False, least_peak_plan=lambda *a, **k: None)


def largest_first_fitting(cfg, hw, kw):
    """``api.max_batch_size``'s search the way before the least-peak plan: the greedy search,
    ``search.spaced_checkpoints``, then the memory MILP's first fitting plan."""
    with _without_least_peak():
        return api.max_batch_size(cfg, hw, SEQ, **kw)


def largest_memory_milp(cfg, hw, kw):
    """``api.max_batch_size``'s search the way before that: the greedy search, then the least-peak
    memory MILP as its feasibility test (no ``search.spaced_checkpoints``, no first fitting plan)."""
    def least_memory(costs, hardware, **k):  # the least peak at or under the budget
        solved = milp.solve(costs, hardware.replace(device_memory=1e30), objective="memory", **k)
        return solved is not None and solved.predicted_peak_device_bytes <= hardware.device_memory

    with _without_least_peak(), _patched(api, _fits_by_milp=least_memory), \
            _patched(search, spaced_checkpoints=lambda *a, **k: None):
        return api.max_batch_size(cfg, hw, SEQ, **kw)


def best_per_batch(cfg, hw, largest, kw):
    plans = [api.plan_fixed_batch(cfg, hw, b, SEQ, **kw) for b in api.candidate_batches(largest)]
    return max((p for p in plans if p is not None), key=lambda p: p.tokens_per_s)


def best_one_search(cfg, hw, largest, kw):
    return api.best_over_micro_batches(
        [(m, api._costs_for(cfg, hw, b, SEQ, m, "bfloat16"), hw)
         for b in api.candidate_batches(largest) for m in api.micro_batch_candidates(b)], **kw)


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="add Qwen3.6-27B on an H800 (minutes)")
    args = ap.parse_args()
    import scipy.optimize  # noqa: F401  (its import, 0.5 s, not in the first row)
    cases = CASES + (LARGE if args.large else [])
    kw = api._solver_kw(8, 8, 30.0, 1e-2, True)
    print(f"lt.plan's batch choice, seq {SEQ}, rel_gap 1e-2, 30 s per MILP; seconds (this shared machine: noisy)")
    print(f"{'model':14s} {'hardware':9s} | {'largest: least-peak plan':>24s} {'first fitting':>15s} "
          f"{'memory MILP':>15s} | {'best: one search':>30s} | {'per batch (before)':>30s}")
    for name, hw_name in cases:
        cfg, hw = get_preset(name), as_hardware(hw_name)
        largest, t_new = timed(lambda: api.max_batch_size(cfg, hw, SEQ, **kw))
        first_largest, t_first = timed(largest_first_fitting, cfg, hw, kw)
        old_largest, t_old = timed(largest_memory_milp, cfg, hw, kw)
        best, b_new = timed(best_one_search, cfg, hw, largest, kw)
        old, b_old = timed(best_per_batch, cfg, hw, largest, kw)

        def row(p, s):
            return (f"{s:6.1f} s b{p.batch_size:<4d} m{p.num_micro_batches:<3d} {p.tokens_per_s:7.0f} tok/s "
                    f"gap {p.gap:.2%} {p.solver_status}")
        print(f"{name:14s} {hw_name:9s} | {t_new:15.1f} s ({largest:4d}) {t_first:6.1f} s ({first_largest:4d}) "
              f"{t_old:6.1f} s ({old_largest:4d}) | "
              f"{row(best, b_new)} | {row(old, b_old)}", flush=True)


if __name__ == "__main__":
    main()
