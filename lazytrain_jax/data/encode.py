"""From MetaMathQA records to fixed-shape token arrays: prompt formatting, response-only labels,
truncation and right padding to ``seq_len`` (static shapes: one compilation for every batch).

Formatting: the tokenizer's chat template (user = query, assistant = response) when it has one,
otherwise the plain template ``PLAIN_PROMPT`` followed by the response and the EOS token. The loss
counts response tokens only (prompt and padding labels are -100).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from lazytrain_jax.data.jsonl import DataError, Example

IGNORE_INDEX = -100
PLAIN_PROMPT = "Question: {query}\nAnswer: "
TEMPLATES = ("auto", "chat", "plain")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptFormat:
    """How a record becomes text.

    Args:
      template: ``auto`` (the chat template if the tokenizer has one, else plain), ``chat`` or ``plain``.
      plain_prompt: the plain template; ``{query}`` is replaced by the question.
    """

    template: str = "auto"
    plain_prompt: str = PLAIN_PROMPT

    def __post_init__(self):
        if self.template not in TEMPLATES:
            raise ValueError(f"template={self.template!r} is not valid; valid: {list(TEMPLATES)}")
        if "{query}" not in self.plain_prompt:
            raise ValueError(f"plain_prompt={self.plain_prompt!r} must contain '{{query}}'")

    def uses_chat(self, tokenizer) -> bool:
        has = bool(getattr(tokenizer, "chat_template", None))
        if self.template == "chat" and not has:
            raise DataError(f"template='chat' but the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no "
                            f"chat template; use template='plain' or 'auto'")
        return has if self.template == "auto" else self.template == "chat"

    def prompt_text(self, tokenizer, query: str) -> str:
        if self.uses_chat(tokenizer):
            return tokenizer.apply_chat_template([{"role": "user", "content": query}], tokenize=False,
                                                 add_generation_prompt=True)
        return self.plain_prompt.format(query=query)


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_example(tokenizer, example: Example, fmt: PromptFormat) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of one record; the response ends with the end-of-turn/EOS token."""
    prompt = fmt.prompt_text(tokenizer, example.query)
    if fmt.uses_chat(tokenizer):
        full = tokenizer.apply_chat_template([{"role": "user", "content": example.query},
                                              {"role": "assistant", "content": example.response}], tokenize=False)
        if not full.startswith(prompt):
            raise DataError("the chat template renders the conversation without the generation prompt as a "
                            "prefix; use template='plain'")
        completion = full[len(prompt):].rstrip("\n")
        return _ids(tokenizer, prompt), _ids(tokenizer, completion)
    return _ids(tokenizer, prompt), _ids(tokenizer, example.response) + [tokenizer.eos_token_id]


@dataclasses.dataclass(frozen=True)
class EncodedData:
    """Right-padded int32 arrays ``[N, seq_len]`` and what encoding dropped or cut."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray
    num_truncated: int
    num_dropped: int

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    def num_loss_tokens(self) -> int:
        return int(np.sum(self.labels != IGNORE_INDEX))


def encode_dataset(tokenizer, examples: Sequence[Example], seq_len: int, fmt: PromptFormat | None = None) -> EncodedData:
    """Tokenizes records into ``[N, seq_len]`` arrays with response-only labels.

    A record longer than ``seq_len`` is truncated (its response tail is cut); a record whose prompt
    leaves no room for a response token is dropped. Both are counted.

    Raises:
      DataError: ``seq_len`` is too short for every record, or there is no record.

    Example:
      >>> enc = encode_dataset(tok, read_jsonl("train.jsonl").examples, seq_len=512)
    """
    fmt = fmt or PromptFormat()
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise ValueError(f"seq_len={seq_len!r} must be an integer >= 2")
    if not examples:
        raise DataError("the dataset is empty: no example to encode")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows, truncated, dropped, shortest = [], 0, 0, None
    for ex in examples:
        prompt, response = encode_example(tokenizer, ex, fmt)
        total = len(prompt) + len(response)
        shortest = total if shortest is None else min(shortest, total)
        if len(prompt) >= seq_len:
            dropped += 1
            continue
        if total > seq_len:
            truncated += 1
        ids = (prompt + response)[:seq_len]
        labels = ([IGNORE_INDEX] * len(prompt) + response)[:seq_len]
        rows.append((ids, labels))
    if not rows:
        raise DataError(f"seq_len={seq_len} is too short for any example: every prompt has >= {seq_len} tokens "
                        f"(the shortest prompt + response has {shortest} tokens)")
    n = len(rows)
    input_ids = np.full((n, seq_len), pad, np.int32)
    mask = np.zeros((n, seq_len), np.int32)
    labels = np.full((n, seq_len), IGNORE_INDEX, np.int32)
    for i, (ids, lab) in enumerate(rows):
        input_ids[i, :len(ids)] = ids
        mask[i, :len(ids)] = 1
        labels[i, :len(lab)] = lab
    return EncodedData(input_ids, mask, labels, truncated, dropped)


def encode_prompts(tokenizer, queries: Sequence[str], fmt: PromptFormat | None = None) -> list[list[int]]:
    """Prompt token ids (no response) of each query, for generation."""
    fmt = fmt or PromptFormat()
    return [_ids(tokenizer, fmt.prompt_text(tokenizer, q)) for q in queries]
