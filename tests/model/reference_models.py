"""Random tiny transformers models (PyTorch, CPU) used as the numerical reference."""

from __future__ import annotations

import numpy as np

# name -> (transformers config class name, kwargs); together they cover GQA ratios 1, 2 and 4,
# head_dim != hidden/heads, tied and untied embeddings, qkv bias, and llama3 and linear rope scaling.
CASES = {
    "llama-gqa1-llama3rope": ("LlamaConfig", dict(
        vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, tie_word_embeddings=False, rms_norm_eps=1e-5,
        max_position_embeddings=64, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=8))),
    "llama-gqa4-linearrope": ("LlamaConfig", dict(
        vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0))),
    "llama-gqa2-bias-tied": ("LlamaConfig", dict(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "qwen2-gqa2-tied": ("Qwen2Config", dict(
        vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-gqa4-untied": ("Qwen2Config", dict(
        vocab_size=101, hidden_size=64, intermediate_size=112, num_hidden_layers=3, num_attention_heads=8,
        num_key_value_heads=2, tie_word_embeddings=False)),
    "qwen3-gqa4-headdim": ("Qwen3Config", dict(
        vocab_size=113, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=24, tie_word_embeddings=False)),
    "qwen3-gqa1-tied": ("Qwen3Config", dict(
        vocab_size=113, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=40, tie_word_embeddings=True)),
}


def make_torch_model(case: str, seed: int):
    import torch
    import transformers

    cls_name, kwargs = CASES[case]
    kwargs = dict(kwargs)
    if "rope_parameters" not in kwargs:
        kwargs["rope_parameters"] = {"rope_type": "default", "rope_theta": kwargs.pop("rope_theta", 10000.0)}
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model = model.float().eval()
    # Norm weights start at one; randomise them so the parity checks see them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.add_(0.1 * torch.randn_like(p))
    return model


def make_batch(vocab_size: int, seed: int, padding: str, batch: int = 3, seq: int = 12) -> dict:
    """input_ids / attention_mask / labels with some padding on the given side and -100 on pads."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, (batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    lengths = [seq, seq - 4, seq - 7][:batch]
    for b, n in enumerate(lengths):
        if padding == "left":
            mask[b, : seq - n] = 0
        elif padding == "right":
            mask[b, n:] = 0
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
