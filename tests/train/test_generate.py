"""KV-cache greedy generation against the resident reference forward (lt.forward) on the growing sequence."""

import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.generate import generate, generate_batch


def _reference_greedy(model, prompts, num_steps):
    """Greedy tokens and per-step logits by re-running lt.forward on the growing (unpadded-left)
    sequences; rows are right-padded to one length, which causal attention never lets a position see."""
    seqs = [list(p) for p in prompts]
    width = max(map(len, prompts)) + num_steps
    logits = []
    for _ in range(num_steps):
        ids = np.zeros((len(seqs), width), np.int32)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = s
        out = np.asarray(lt.forward(model, ids))
        step = np.stack([out[i, len(s) - 1] for i, s in enumerate(seqs)])
        logits.append(step)
        for i, s in enumerate(seqs):
            s.append(int(step[i].argmax()))
    return [s[len(p):] for s, p in zip(seqs, prompts)], np.stack(logits, axis=1)


@pytest.mark.parametrize("preset", ["qwen3-debug", "qwen2-debug", pytest.param("llama-debug", marks=pytest.mark.slow)])
def test_kv_cache_logits_and_tokens_match_forward(preset):
    model = lt.init_model(lt.get_preset(preset, num_layers=2), seed=3)
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, model.config.vocab_size, n)) for n in (5, 9, 1, 7)]
    steps = 6
    out, logits_BxNxV = generate_batch(model, prompts, max_new_tokens=steps, eos_token_ids=[], pad_token_id=0,
                                       return_logits=True)
    ref_tokens, ref_logits = _reference_greedy(model, prompts, steps)
    assert out == ref_tokens, preset
    err = np.abs(logits_BxNxV - ref_logits).max() / np.abs(ref_logits).max()
    assert err <= 1e-5, (preset, err)


def test_generate_stops_at_eos_and_batches_agree():
    model = lt.init_model(lt.get_preset("qwen3-debug", num_layers=2), seed=1)
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(1, 200, n)) for n in (3, 6, 4, 8, 2)]
    full = generate(model, prompts, max_new_tokens=5, eos_token_ids=[], batch_size=2)
    one = generate(model, prompts, max_new_tokens=5, eos_token_ids=[], batch_size=5)
    assert full == one and all(len(x) == 5 for x in full)
    # make the second generated token of prompt 0 the EOS: its output is cut before it
    eos = full[0][1]
    cut = generate(model, prompts, max_new_tokens=5, eos_token_ids=[eos], batch_size=2)
    for got, ref in zip(cut, full):
        expected = ref[:ref.index(eos)] if eos in ref else ref
        assert got == expected
    assert cut[0] == full[0][:1]
