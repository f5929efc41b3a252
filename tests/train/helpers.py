"""Tiny models, data and plans shared by the training tests (and the kill/resume driver)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import lazytrain_jax as lt
from lazytrain_jax.data import PromptFormat, arithmetic_splits, arithmetic_tokenizer, load_dataset, load_tokenizer
from lazytrain_jax.executor.profiler import unit_costs
from lazytrain_jax.schedule.hardware import Hardware

SEQ = 40
FMT = PromptFormat(plain_prompt="{query}\n")
HARDWARE = Hardware(name="test", device_memory=1e12, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e11,
                    device_margin=0.0, nvme_memory=1e10, host_memory=1e12)


@functools.lru_cache(maxsize=None)
def tokenizer_dir() -> str:
    """This process's arithmetic tokenizer, in a temporary directory removed when it exits."""
    path = tempfile.mkdtemp(prefix="lazytrain-test-tokenizer-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    arithmetic_tokenizer(path)
    return path


def tiny_config(vocab_size: int, num_layers: int = 2):
    return lt.get_preset("qwen3-debug", vocab_size=vocab_size, num_layers=num_layers, hidden_size=32,
                         intermediate_size=64, num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True)


def tiny_setup(num_train: int = 64, num_eval: int = 8, num_layers: int = 2, tok_dir: str | None = None):
    tok = load_tokenizer(tok_dir or tokenizer_dir())
    train, held_out = arithmetic_splits(seed=0, num_eval=num_eval, num_train=num_train)
    ds = load_dataset(train, tok, SEQ, fmt=FMT)
    model = lt.init_model(tiny_config(len(tok), num_layers), seed=0)
    return model, ds, held_out


def tiny_plan(model, batch_size: int = 4, *, tiers=None, num_micro_batches: int = 1, stream_dtype="bfloat16"):
    """A plan with the engine's real byte sizes; ``tiers`` forces boundary tiers (offload/recompute)."""
    costs = unit_costs(model, batch_size=batch_size, seq_len=SEQ, num_micro_batches=num_micro_batches,
                       stream_dtype=stream_dtype, device_flops=HARDWARE.device_flops)
    if tiers is None:
        return lt.plan(costs, HARDWARE)
    from lazytrain_jax.schedule.plan import Plan
    return Plan.create(costs, HARDWARE, name="test", boundary_tiers=tiers)
