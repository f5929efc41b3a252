"""Synthetic arithmetic in MetaMathQA format: "What is 47 + 38?" -> "... The answer is: 85".

Every problem of the given digit count is enumerated once, then split by a seeded permutation, so the
held-out problems are never seen in training.
"""

from __future__ import annotations

import numpy as np

from lazytrain_jax.data.jsonl import Example

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}


STYLES = ("steps", "direct")


def _steps(a: int, op: str, b: int) -> str:
    """Digit-by-digit working (right to left, carries and borrows written out) for 2-digit operands.

    ``47+38``: ``7+8=15,4+3+1=8``; ``52-38``: ``52>38,12-8=4,5-3-1=1``; ``23-38``: ``23<38,8-3=5,3-2-0=1``
    (the smaller operand is taken from the larger one, and the sign comes from the comparison).
    """
    if op == "+":
        units = a % 10 + b % 10
        return f"{a % 10}+{b % 10}={units},{a // 10}+{b // 10}+{units // 10}={a // 10 + b // 10 + units // 10}"
    big, small = (a, b) if a >= b else (b, a)
    head = f"{a}{'>' if a > b else '<' if a < b else '='}{b}"
    borrow = int(big % 10 < small % 10)
    units = f"{10 * borrow + big % 10}-{small % 10}={10 * borrow + big % 10 - small % 10}"
    tens = f"{big // 10}-{small // 10}-{borrow}={big // 10 - small // 10 - borrow}"
    return f"{head},{units},{tens}"


def arithmetic_example(a: int, op: str, b: int, *, style: str = "steps") -> Example:
    """One problem in MetaMathQA form (type ``synthetic_arithmetic``): the response shows its working
    (``style="steps"``, for numbers below 100) or only ``The answer is: X`` (``"direct"``)."""
    if op not in OPS:
        raise ValueError(f"op={op!r} is not supported; valid: {sorted(OPS)}")
    if style not in STYLES:
        raise ValueError(f"style={style!r} is not valid; valid: {list(STYLES)}")
    answer = f"The answer is: {OPS[op](a, b)}"
    if style == "steps" and max(a, b) < 100:
        answer = f"{_steps(a, op, b)}. {answer}"
    return Example(query=f"What is {a} {op} {b}?", response=answer, type="synthetic_arithmetic")


def arithmetic_problems(*, num_digits: int = 2, ops: tuple[str, ...] = ("+", "-"), style: str = "steps") -> list[Example]:
    """Every ``num_digits``-digit problem ``a op b`` (10..99 for two digits), in a fixed order."""
    if not isinstance(num_digits, int) or not 1 <= num_digits <= 4:
        raise ValueError(f"num_digits={num_digits!r} must be an integer in 1..4")
    lo, hi = (0 if num_digits == 1 else 10 ** (num_digits - 1)), 10 ** num_digits
    return [arithmetic_example(a, op, b, style=style) for op in ops for a in range(lo, hi) for b in range(lo, hi)]


def arithmetic_splits(*, seed: int = 0, num_eval: int = 256, num_train: int | None = None, num_digits: int = 2,
                      ops: tuple[str, ...] = ("+", "-"), style: str = "steps") -> tuple[list[Example], list[Example]]:
    """(train, eval): disjoint random splits of all problems.

    Args:
      seed: the permutation's seed; style: ``steps`` or ``direct`` (see ``arithmetic_example``).
      num_eval: held-out problems; num_train: training problems (default: all the rest).

    Example:
      >>> train, held_out = arithmetic_splits(seed=0, num_eval=256)
    """
    problems = arithmetic_problems(num_digits=num_digits, ops=ops, style=style)
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
