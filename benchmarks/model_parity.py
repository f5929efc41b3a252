"""Prints the worst relative errors of lazytrain_jax against transformers (PyTorch, fp32, CPU).

Usage: python benchmarks/model_parity.py
Columns: max over 3 seeds x {left, right} padding of max|ours - ref| / max|ref| for logits (valid
positions), loss, and the worst gradient tensor (named).
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import lazytrain_jax as lt  # noqa: E402
from tests.model.reference_models import CASES, make_batch, make_torch_model  # noqa: E402


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main():
    print(f"{'case':<24} {'logits':>9} {'loss':>9} {'worst grad':>11}  tensor")
    for case in sorted(CASES):
        worst = {"logits": 0.0, "loss": 0.0, "grad": (0.0, "")}
        for seed in range(3):
            tm = make_torch_model(case, seed)
            with tempfile.TemporaryDirectory() as d:
                tm.save_pretrained(d)
                model = lt.load_model(d)
            for padding in ("left", "right"):
                b = make_batch(model.config.vocab_size, seed, padding)
                ids, mask, labels = (torch.tensor(b[k]).long() for k in ("input_ids", "attention_mask", "labels"))
                tm.zero_grad()
                out = tm(ids, attention_mask=mask, labels=labels)
                out.loss.backward()
                valid = b["attention_mask"].astype(bool)
                logits = np.asarray(lt.forward(model, b["input_ids"], b["attention_mask"]))
                worst["logits"] = max(worst["logits"], rel(logits[valid], out.logits.detach().numpy()[valid]))
                loss, grads = lt.loss_and_grad(model, b)
                worst["loss"] = max(worst["loss"], rel(loss, out.loss.item()))
                ref = {n: p.grad.numpy() for n, p in tm.named_parameters()}
                for n, g in lt.to_hf_state_dict(model.config, grads).items():
                    worst["grad"] = max(worst["grad"], (rel(g, ref[n]), n))
        print(f"{case:<24} {worst['logits']:9.2e} {worst['loss']:9.2e} {worst['grad'][0]:11.2e}  {worst['grad'][1]}")
    print("limits: logits 1e-5, loss 1e-4, grads 1e-4")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # no options: --help, or an error
    main()
