"""Random tiny Qwen3.5/3.6 hybrid models in transformers (PyTorch, CPU): the numerical reference."""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# name -> Qwen3_5TextConfig kwargs. Together: value/key head ratios 1, 2 and 3, query/kv ratios 2
# and 4, rotary fractions 0.25 and 0.5, tied and untied embeddings, full-attention
# intervals 2 and 4 and an explicit irregular layer_types.
CASES = {
    "gqa2-ratio2-untied": dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25)),
    "gqa4-ratio3-tied": dict(
        vocab_size=89, hidden_size=48, intermediate_size=80, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=3,
        linear_key_head_dim=24, linear_value_head_dim=16, linear_conv_kernel_dim=3, tie_word_embeddings=True,
        full_attention_interval=2,
        rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)),
    "gqa2-ratio1-layertypes": dict(
        vocab_size=101, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, linear_num_key_heads=4, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4, tie_word_embeddings=False,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.25)),
}


def make_torch_model(case: str, seed: int):
    """A ``Qwen3_5ForCausalLM`` with every parameter random (norms, A_log and dt_bias included)."""
    import torch
    import transformers

    config = transformers.Qwen3_5TextConfig(**CASES[case])
    torch.manual_seed(seed)
    # eager attention: the project's masking convention (README, numerics) is transformers' eager one
    model = transformers.Qwen3_5ForCausalLM._from_config(config, attn_implementation="eager").float().eval()
    # Zero-initialised "1 + w" norms would hide a "w" vs "1 + w" mistake: perturb every vector.
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.3 * torch.randn_like(p))
    return model


def make_batch(vocab_size: int, seed: int, padding: str, seq: int, batch: int = 3) -> dict:
    """input_ids / attention_mask / labels, rows padded on ``padding``'s side, -100 on pads."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, (batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    lengths = [seq, seq - 5, max(seq // 3, 1)][:batch]
    for b, n in enumerate(lengths):
        if padding == "left":
            mask[b, : seq - n] = 0
        elif padding == "right":
            mask[b, n:] = 0
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
