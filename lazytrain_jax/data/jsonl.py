"""MetaMathQA-format JSONL: one JSON object per line with ``query``, ``response`` and optional ``type``.

Bad lines raise ``DataError`` naming the file and line (or are skipped and counted with
``skip_bad_lines=True``); an empty file is an error, never a silent zero-step run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Iterable


class DataError(ValueError):
    """Bad training or evaluation data (names the file, the line and what was expected)."""


@dataclasses.dataclass(frozen=True)
class Example:
    """One MetaMathQA record: a question, its worked response ending "The answer is: X", a type."""

    query: str
    response: str
    type: str | None = None


@dataclasses.dataclass(frozen=True)
class JsonlData:
    """Records read from one file and the number of bad lines skipped."""

    path: str
    examples: tuple[Example, ...]
    num_skipped: int = 0


def _check_utf8(line: str) -> None:
    """Raises for a line read with ``errors="surrogateescape"`` that held bytes not UTF-8 (each
    such byte is a lone surrogate U+DC80..U+DCFF there), naming the first one and its byte offset."""
    at = next((i for i, ch in enumerate(line) if "\udc80" <= ch <= "\udcff"), None)
    if at is not None:
        offset = len(line[:at].encode("utf-8", "surrogateescape")) + 1
        raise DataError(f"not valid UTF-8 (byte {ord(line[at]) - 0xDC00:#04x} at byte {offset} of the line)")


def _parse_line(line: str) -> Example:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise DataError(f"expected a JSON object with 'query' and 'response'; got {type(obj).__name__}")
    for key in ("query", "response"):
        if key not in obj:
            raise DataError(f"missing key {key!r}; a record has 'query', 'response' and optional 'type' "
                            f"(keys here: {sorted(obj)})")
        if not isinstance(obj[key], str) or not obj[key].strip():
            raise DataError(f"{key!r} must be a non-empty string; got {obj[key]!r:.80}")
    kind = obj.get("type")
    if kind is not None and not isinstance(kind, str):
        raise DataError(f"'type' must be a string; got {kind!r:.80}")
    return Example(query=obj["query"], response=obj["response"], type=kind)


def read_jsonl(path: str | os.PathLike, *, skip_bad_lines: bool = False) -> JsonlData:
    """Reads a MetaMathQA-format JSONL file.

    Args:
      path: the file; blank lines are ignored.
      skip_bad_lines: skip malformed lines (counted in ``num_skipped``) instead of raising.

    Returns:
      JsonlData with the examples in file order.

    Raises:
      DataError: ``path:line: what is wrong`` for the first bad line (unless skipped), or when the
        file holds no example.

    Example:
      >>> data = read_jsonl("MetaMathQA-395K.json.l", skip_bad_lines=True)
      >>> len(data.examples), data.num_skipped
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise DataError(f"data file {path!r} does not exist")
    examples, skipped = [], 0
    # utf-8-sig: a byte order mark (editors on Windows) is dropped; surrogateescape: bytes that are
    # not UTF-8 make their line a bad line like any other (universal newlines as before)
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                _check_utf8(line)
                examples.append(_parse_line(line))
            except DataError as e:
                if not skip_bad_lines:
                    raise DataError(f"{path}:{lineno}: {e} (skip_bad_lines=True skips and counts bad lines)") from None
                skipped += 1
    if not examples:
        what = f" ({skipped} bad lines skipped)" if skipped else ""
        raise DataError(f"{path}: the dataset is empty{what}; expected JSON lines with 'query' and 'response'")
    return JsonlData(path=path, examples=tuple(examples), num_skipped=skipped)


def write_jsonl(path: str | os.PathLike, examples: Iterable[Example]) -> None:
    """Writes examples as MetaMathQA JSONL, atomically.

    Example:
      >>> write_jsonl("train.jsonl", [Example("What is 1 + 2?", "The answer is: 3")])
    """
    from lazytrain_jax.atomic import atomic_write_text

    lines = []
    for ex in examples:
        record = {"query": ex.query, "response": ex.response}
        if ex.type is not None:
            record["type"] = ex.type
        lines.append(json.dumps(record, ensure_ascii=False))
    atomic_write_text(path, "\n".join(lines) + ("\n" if lines else ""))
