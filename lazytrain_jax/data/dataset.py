"""A training or evaluation set: records, their tokenizer and prompt format, and the encoded arrays."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Sequence

from lazytrain_jax.data.encode import EncodedData, PromptFormat, encode_dataset
from lazytrain_jax.data.jsonl import DataError, Example, read_jsonl
from lazytrain_jax.data.tokenizer import load_tokenizer


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
    """Records with their tokenizer, prompt format and ``[N, seq_len]`` encoding.

    Attributes:
      examples: the records (in file order).
      encoded: EncodedData (right-padded ids, mask, response-only labels).
      tokenizer: a transformers tokenizer; fmt: the PromptFormat.
      num_skipped: malformed lines skipped while reading.
      source: the file it came from (or "<memory>").
    """

    examples: tuple[Example, ...]
    encoded: EncodedData
    tokenizer: object
    fmt: PromptFormat
    num_skipped: int = 0
    source: str = "<memory>"

    def __len__(self) -> int:
        return len(self.encoded)

    @property
    def seq_len(self) -> int:
        return self.encoded.seq_len

    def fingerprint(self) -> str:
        """A hash of the encoded arrays (what a resumed run must see again)."""
        h = hashlib.sha256()
        for arr in (self.encoded.input_ids, self.encoded.attention_mask, self.encoded.labels):
            h.update(str(arr.shape).encode())
            h.update(arr.tobytes())
        return h.hexdigest()[:16]


def load_dataset(source: str | os.PathLike | Sequence[Example], tokenizer, seq_len: int, *,
                 fmt: PromptFormat | None = None, skip_bad_lines: bool = False) -> Dataset:
    """Reads (a JSONL path) or takes (a list of Examples) records and encodes them.

    Args:
      source: MetaMathQA-format JSONL path, or a sequence of ``Example``.
      tokenizer: a tokenizer object or a local tokenizer directory.
      seq_len: tokens per sequence (truncation and padding).
      fmt: PromptFormat (default: the chat template if the tokenizer has one, else plain).
      skip_bad_lines: skip and count malformed lines instead of raising.

    Returns:
      Dataset.

    Example:
      >>> train = load_dataset("train.jsonl", "tokenizer_dir", seq_len=512)
    """
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_tokenizer(tokenizer)
    fmt = fmt or PromptFormat()
    if isinstance(source, (str, os.PathLike)):
        data = read_jsonl(source, skip_bad_lines=skip_bad_lines)
        examples, skipped, name = data.examples, data.num_skipped, os.fspath(source)
    else:
        examples, skipped, name = tuple(source), 0, "<memory>"
        if not examples:
            raise DataError("the dataset is empty: no example given")
    return Dataset(examples=tuple(examples), encoded=encode_dataset(tokenizer, examples, seq_len, fmt),
                   tokenizer=tokenizer, fmt=fmt, num_skipped=skipped, source=name)
