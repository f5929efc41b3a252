"""Tokenizer, prompt formats, response-only labels, truncation, static shapes, seeded resumable batches."""

import numpy as np
import pytest

from lazytrain_jax.data import (CHATML_TEMPLATE, BatchLoader, DataError, Example, PromptFormat, encode_dataset,
                                load_tokenizer, train_tokenizer)
from lazytrain_jax.data.encode import IGNORE_INDEX

ROWS = [Example("What is 47 + 38?", "7+8=15,4+3+1=8. The answer is: 85"),
        Example("What is 10 - 99?", "10<99,9-0=9,9-1-0=8. The answer is: -89")]


def test_digits_are_single_tokens_and_decode_round_trips(tok):
    ids = tok("What is 1234 + 56?", add_special_tokens=False)["input_ids"]
    pieces = tok.convert_ids_to_tokens(ids)
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("123456")
    assert tok.decode(ids) == "What is 1234 + 56?"


def test_plain_format_labels_are_the_response_and_eos(tok):
    enc = encode_dataset(tok, ROWS, 48, PromptFormat(template="plain"))
    assert enc.input_ids.shape == (2, 48) and enc.input_ids.dtype == np.int32
    for i, ex in enumerate(ROWS):
        labelled = enc.labels[i][enc.labels[i] != IGNORE_INDEX]
        assert labelled[-1] == tok.eos_token_id
        assert tok.decode(labelled[:-1]) == ex.response
        n = enc.attention_mask[i].sum()
        assert tok.decode(enc.input_ids[i, :n]).startswith(f"Question: {ex.query}\nAnswer: ")
        assert (enc.labels[i, n:] == IGNORE_INDEX).all() and (enc.attention_mask[i, n:] == 0).all()


def test_chat_template_labels_only_the_assistant_turn(tmp_path):
    texts = [f"{r.query} {r.response}" for r in ROWS] * 5
    tok = load_tokenizer(train_tokenizer(texts, tmp_path / "tok", vocab_size=300, chat_template=CHATML_TEMPLATE))
    enc = encode_dataset(tok, ROWS, 64)  # auto -> chat
    ids, labels = enc.input_ids[0], enc.labels[0]
    text = tok.decode(ids[:enc.attention_mask[0].sum()])
    assert text.startswith("<|im_start|>user\nWhat is 47 + 38?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(labels[labels != IGNORE_INDEX]) == ROWS[0].response + "<|im_end|>"
    with pytest.raises(DataError, match="no chat template"):
        encode_dataset(load_tokenizer(train_tokenizer(texts, tmp_path / "t2", vocab_size=300)), ROWS, 64,
                       PromptFormat(template="chat"))


def test_truncation_drop_and_too_short(tok):
    full = encode_dataset(tok, ROWS, 64, PromptFormat(template="plain"))
    lengths = full.attention_mask.sum(1)
    prompt_len = (full.labels[0] == IGNORE_INDEX).sum() - (64 - lengths[0])
    enc = encode_dataset(tok, ROWS, int(lengths.min()) - 1, PromptFormat(template="plain"))
    assert enc.num_truncated == 2 and enc.num_dropped == 0 and enc.attention_mask.all()
    with pytest.raises(DataError, match=r"seq_len=\d+ is too short for any example"):
        encode_dataset(tok, ROWS, int(prompt_len), PromptFormat(template="plain"))


def test_missing_tokenizer_dir(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no tokenizer files"):
        load_tokenizer(tmp_path / "empty")


def test_loader_shuffles_by_seed_covers_epochs_and_resumes(tok):
    rows = [Example(f"What is {i} + 1?", f"The answer is: {i + 1}") for i in range(10)]
    enc = encode_dataset(tok, rows, 24)
    first = [r[0] for r in enc.input_ids]

    def draw(loader, n):
        return [tuple(map(int, loader.next_indices())) for _ in range(n)]

    a = draw(BatchLoader(enc, 4, seed=0), 5)  # 20 rows: two epochs exactly
    flat = [i for b in a for i in b]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != list(range(10)) and flat[:10] != flat[10:]  # shuffled, per-epoch order
    assert draw(BatchLoader(enc, 4, seed=1), 5) != a
    loader = BatchLoader(enc, 4, seed=0)
    draw(loader, 2)
    resumed = BatchLoader(enc, 4, seed=0)
    resumed.load_state_dict(loader.state_dict())
    assert draw(resumed, 3) == a[2:]
    batch = BatchLoader(enc, 4, seed=0).next_batch()
    assert set(batch) == {"input_ids", "attention_mask", "labels"} and batch["labels"].shape == (4, 24)
    assert len(first) == 10
