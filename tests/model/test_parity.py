"""Parity with transformers' PyTorch models: logits, loss and every parameter's gradient.

Tolerance policy: fp32 logits within 1e-5 relative (max abs error / max abs reference); loss and
each gradient tensor within 1e-4 relative, compared by Hugging Face name.
"""

import numpy as np
import pytest

import lazytrain_jax as lt
from tests.model.reference_models import CASES, make_batch, make_torch_model

torch = pytest.importorskip("torch")


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def load_into_lt(tmp_path, torch_model):
    torch_model.save_pretrained(tmp_path)
    return lt.load_model(tmp_path)


# the default run: each family once with GQA, and bias, tying, llama3 rope scaling and head_dim each
# once; -m slow adds the other cases (linear rope scaling among them) and seeds
SLOW_CASES = {"qwen2-gqa2-tied", "qwen3-gqa1-tied", "llama-gqa4-linearrope"}


@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c
                                  for c in sorted(CASES)])
def test_logits_loss_and_grads_match_transformers(tmp_path, case, seed):
    tm = make_torch_model(case, seed)
    model = load_into_lt(tmp_path, tm)
    for padding in ("left", "right"):
        batch = make_batch(model.config.vocab_size, seed, padding)
        ids_t = torch.tensor(batch["input_ids"], dtype=torch.long)
        mask_t = torch.tensor(batch["attention_mask"], dtype=torch.long)
        labels_t = torch.tensor(batch["labels"], dtype=torch.long)

        with torch.no_grad():
            ref_logits = tm(ids_t, attention_mask=mask_t).logits.numpy()
        logits = np.asarray(lt.forward(model, batch["input_ids"], batch["attention_mask"]))
        valid = batch["attention_mask"].astype(bool)  # padded positions are not part of the contract
        assert np.isfinite(logits).all()
        assert rel_err(logits[valid], ref_logits[valid]) < 1e-5, (case, padding)

        tm.zero_grad()
        ref_loss = tm(ids_t, attention_mask=mask_t, labels=labels_t).loss
        ref_loss.backward()
        ref_grads = {n: p.grad.numpy() for n, p in tm.named_parameters()}

        loss, grads = lt.loss_and_grad(model, batch)
        assert rel_err(loss, ref_loss.item()) < 1e-4, (case, padding)
        named = lt.to_hf_state_dict(model.config, grads)
        assert set(named) == set(ref_grads), (case, set(named) ^ set(ref_grads))
        for name, g in named.items():
            assert g.shape == ref_grads[name].shape, name
            assert rel_err(g, ref_grads[name]) < 1e-4, (case, padding, name, rel_err(g, ref_grads[name]))
