"""Answer extraction ("The answer is: X") and numeric normalisation for exact-match accuracy."""

from __future__ import annotations

import re
from fractions import Fraction

_ANSWER_RE = re.compile(r"The answer is:?\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_NUMBER_RE = re.compile(r"^[-+]?(\d+(\.\d*)?|\.\d+)(/\d+)?$")


def extract_answer(text: str) -> str | None:
    """The text after the last "The answer is:" (to the end of that line), or None.

    Example:
      >>> extract_answer("12 + 30 = 42. The answer is: 42")
      '42'
    """
    found = _ANSWER_RE.findall(text)
    return found[-1] if found else None


def normalize_answer(answer: str | None) -> str | None:
    """A canonical form: numbers as reduced fractions/integers ("1,000.0" -> "1000", "$3.50" -> "7/2",
    "-0" -> "0", "\\frac{1}{2}" -> "1/2"); other text stripped, lower-cased, trailing dot removed.

    Example:
      >>> normalize_answer("1,200.00")
      '1200'
    """
    if answer is None:
        return None
    text = answer.strip().rstrip(".").strip()
    text = text.replace("$", "").replace(",", "").replace(" ", "")
    frac = re.fullmatch(r"\\d?frac\{(-?\d+)\}\{(\d+)\}", text)
    if frac:
        text = f"{frac.group(1)}/{frac.group(2)}"
    if text.endswith("%"):
        text = text[:-1]
    if _NUMBER_RE.match(text):
        try:
            value = Fraction(text)
        except (ValueError, ZeroDivisionError):
            return text.lower()
        return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    return text.lower()


def is_correct(prediction_text: str, reference_response: str) -> bool:
    """Exact match of the normalised answers extracted from a generated text and a reference response."""
    pred = normalize_answer(extract_answer(prediction_text))
    ref = normalize_answer(extract_answer(reference_response))
    if ref is None:
        raise ValueError(f"the reference response has no 'The answer is: X': {reference_response[-80:]!r}")
    return pred is not None and pred == ref
