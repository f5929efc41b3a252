"""Synthetic arithmetic is correct and disjointly split; answers extract and normalise."""

import re

import pytest

from lazytrain_jax.data import arithmetic_problems, arithmetic_splits, extract_answer, is_correct, normalize_answer


def test_every_problem_and_its_working_is_right():
    problems = arithmetic_problems(num_digits=2)
    assert len(problems) == 2 * 90 * 90
    for ex in problems:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", ex.query).groups()
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert extract_answer(ex.response) == str(value)
        for step in re.findall(r"(\d+(?:[+-]\d+)+)=(-?\d+)", ex.response):  # every written step holds
            assert eval(step[0]) == int(step[1]), ex.response


def test_splits_are_disjoint_and_seeded():
    train, held = arithmetic_splits(seed=1, num_eval=200)
    assert len(held) == 200 and not {e.query for e in train} & {e.query for e in held}
    assert arithmetic_splits(seed=1, num_eval=200)[1] == held
    assert arithmetic_splits(seed=2, num_eval=200)[1] != held
    with pytest.raises(ValueError, match="num_eval"):
        arithmetic_splits(num_eval=0)


@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7. The answer is: 7", "7"), ("The answer is: -0.", "0"), ("The answer is: $1,200.50", "2401/2"),
    ("The answer is: \\frac{3}{6}", "1/2"), ("The answer is: 0.5", "1/2"), ("The answer is: 12%", "12"),
    ("The answer is: x+1", "x+1"), ("The answer is: 1\nThe answer is: 2", "2"), ("no answer here", None),
])
def test_extract_and_normalize(text, expected):
    assert normalize_answer(extract_answer(text)) == expected


def test_is_correct():
    assert is_correct("blah. The answer is: 42.0", "The answer is: 42")
    assert not is_correct("The answer is: 41", "The answer is: 42")
    assert not is_correct("I don't know", "The answer is: 42")
    with pytest.raises(ValueError, match="no 'The answer is: X'"):
        is_correct("The answer is: 1", "no answer")
