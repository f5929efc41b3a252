"""Learning-rate schedules: linear warm-up, then cosine, linear or constant."""

from __future__ import annotations

import optax

SCHEDULES = ("cosine", "linear", "constant")


def lr_schedule(peak: float, total_steps: int, *, warmup_steps: int | None = None, kind: str = "cosine",
                min_lr_ratio: float = 0.0) -> optax.Schedule:
    """Linear warm-up from 0 to ``peak`` over ``warmup_steps`` (default 3% of the run, at least 1),
    then ``kind`` decay to ``peak * min_lr_ratio`` at ``total_steps``.

    Example:
      >>> sched = lr_schedule(1e-5, 1000)           # the paper recipe's schedule
    """
    if not peak >= 0:
        raise ValueError(f"learning_rate={peak!r} must be >= 0")
    if kind not in SCHEDULES:
        raise ValueError(f"schedule={kind!r} is not valid; valid: {list(SCHEDULES)}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"min_lr_ratio={min_lr_ratio!r} must be in [0, 1]")
    if warmup_steps is None:
        warmup_steps = max(1, round(0.03 * total_steps))
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be in 0..{total_steps} (the run's steps)")
    end = peak * min_lr_ratio
    decay_steps = max(1, total_steps - warmup_steps)
    if kind == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=min_lr_ratio)
    elif kind == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    if warmup_steps == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), decay], [warmup_steps])
