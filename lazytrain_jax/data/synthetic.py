"""Synthetic arithmetic in MetaMathQA format: "What is 47 + 38?" -> "... The answer is: 85".

Every problem of the given digit count is enumerated once, then split by a seeded permutation, so the
held-out problems are never seen in training.
"""

from __future__ import annotations

import numpy as np

from lazytrain_jax.data.jsonl import Example

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


def arithmetic_example(a: int, op: str, b: int) -> Example:
    """One problem in MetaMathQA form (type ``synthetic_arithmetic``)."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not supported; valid: {sorted(OPS)}")
    return Example(query=f"What is {a} {op} {b}?", response=f"The answer is: {OPS[op](a, b)}",
                   type="synthetic_arithmetic")


def arithmetic_problems(*, num_digits: int = 2, ops: tuple[str, ...] = ("+", "-")) -> list[Example]:
    """Every ``num_digits``-digit problem ``a op b`` (10..99 for two digits), in a fixed order."""
    if not isinstance(num_digits, int) or not 1 <= num_digits <= 4:
        raise ValueError(f"num_digits={num_digits!r} must be an integer in 1..4")
    lo, hi = (0 if num_digits == 1 else 10 ** (num_digits - 1)), 10 ** num_digits
    return [arithmetic_example(a, op, b) for op in ops for a in range(lo, hi) for b in range(lo, hi)]


def arithmetic_splits(*, seed: int = 0, num_eval: int = 256, num_train: int | None = None, num_digits: int = 2,
                      ops: tuple[str, ...] = ("+", "-")) -> tuple[list[Example], list[Example]]:
    """(train, eval): disjoint random splits of all problems.

    Args:
      seed: the permutation's seed.
      num_eval: held-out problems; num_train: training problems (default: all the rest).

    Example:
      >>> train, held_out = arithmetic_splits(seed=0, num_eval=256)
    """
    problems = arithmetic_problems(num_digits=num_digits, ops=ops)
    if not 0 < num_eval < len(problems):
        raise ValueError(f"num_eval={num_eval} must be in 1..{len(problems) - 1}")
    order = np.random.default_rng(seed).permutation(len(problems))
    held_out = [problems[i] for i in order[:num_eval]]
    rest = [problems[i] for i in order[num_eval:]]
    if num_train is not None:
        if not 0 < num_train <= len(rest):
            raise ValueError(f"num_train={num_train} must be in 1..{len(rest)}")
        rest = rest[:num_train]
    return rest, held_out
