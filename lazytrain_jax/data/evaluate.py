"""Exact-match accuracy: greedy generation (KV cache), answer extraction, numeric normalisation."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

from lazytrain_jax.data.answers import extract_answer, normalize_answer
from lazytrain_jax.data.encode import PromptFormat, encode_prompts
from lazytrain_jax.data.jsonl import Example


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """accuracy = num_correct / num_total; samples: the first few (query, generated, reference answer);
    decoder: how generation ran ("resident", or "streamed, KV cache on device|host"); batch_size: the
    prompts per batch it ran with (the one asked for, or less where that did not fit the device)."""

    accuracy: float
    num_correct: int
    num_total: int
    seconds: float
    samples: tuple[tuple[str, str, str], ...] = ()
    decoder: str = "resident"
    batch_size: int = 0

    def to_dict(self) -> dict:
        return {"accuracy": self.accuracy, "num_correct": self.num_correct, "num_total": self.num_total,
                "eval_seconds": self.seconds, "eval_decoder": self.decoder, "eval_batch_size": self.batch_size}


def exact_match(model, examples: Sequence[Example], tokenizer, *, fmt: PromptFormat | None = None,
                max_new_tokens: int = 256, batch_size: int = 64, num_samples: int = 3,
                device_memory: float | None = None) -> EvalResult:
    """Greedy-decodes every query and compares the extracted, normalised answers.

    Args:
      model: a Model.
      examples: records whose responses end with "The answer is: X".
      tokenizer: its tokenizer; fmt: the prompt format used in training.
      max_new_tokens: generation budget; batch_size: prompts per batch.
      device_memory: device bytes generation may use (None: no limit). When the weights, KV cache and
        working set do not fit, the layers are streamed over the whole batch, and the batch is halved
        until it fits (``lazytrain_jax.executor.generate.choose_decoder``).

    Returns:
      EvalResult.

    Example:
      >>> exact_match(model, held_out, tok, max_new_tokens=16).accuracy
    """
    from lazytrain_jax.executor.generate import choose_decoder
    from lazytrain_jax.model.generate import generate

    if not examples:
        raise ValueError("exact_match needs at least one example")
    t0 = time.perf_counter()
    prompts = encode_prompts(tokenizer, [ex.query for ex in examples], fmt)
    eos = {tokenizer.eos_token_id}
    for special in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(special) if special in tokenizer.get_vocab() else None
        if tid is not None:
            eos.add(tid)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    num_rows = min(batch_size, len(prompts))
    decoder, how, num_rows = choose_decoder(model, device_memory=device_memory, num_rows=num_rows,
                                            prompt_len=max(1, max(map(len, prompts))), max_new_tokens=max_new_tokens)
    outputs = generate(model, prompts, max_new_tokens=max_new_tokens, eos_token_ids=sorted(eos), pad_token_id=pad,
                       batch_size=num_rows, decoder=decoder)
    correct, samples = 0, []
    for ex, ids in zip(examples, outputs):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        ref = normalize_answer(extract_answer(ex.response))
        if ref is None:
            raise ValueError(f"eval example {ex.query[:60]!r}: its response has no 'The answer is: X'")
        ok = normalize_answer(extract_answer(text)) == ref
        correct += ok
        if len(samples) < num_samples:
            samples.append((ex.query, text, ref))
    return EvalResult(accuracy=correct / len(examples), num_correct=correct, num_total=len(examples),
                      seconds=time.perf_counter() - t0, samples=tuple(samples), decoder=how,
                      batch_size=num_rows)
