"""A training process for the kill/resume tests: tiny model, a checkpoint every step.

Usage: python -m tests.train.kill_driver CKPT_DIR OUT.npz STEPS [--slow-write-step K]
Prints "step N" after each step. With --slow-write-step K, the write of checkpoint K pauses (after
its files are written into the temporary directory, before the rename) and prints "writing K".
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np

import lazytrain_jax as lt
from lazytrain_jax.train import checkpoint as ckpt
from tests.train.helpers import tiny_plan, tiny_setup


def main(argv):
    ckpt_dir, out, steps = argv[0], argv[1], int(argv[2])
    slow = int(argv[argv.index("--slow-write-step") + 1]) if "--slow-write-step" in argv else None
    tok_dir = os.environ["LAZYTRAIN_TEST_TOKENIZER"]
    model, ds, _ = tiny_setup(num_train=48, tok_dir=tok_dir)
    plan = tiny_plan(model, tiers=["device", "host", "device"])
    if slow is not None:
        real = ckpt._fsync_dir

        def paused(path):
            if f".tmp-step_{slow:08d}" in path:
                print(f"writing {slow}", flush=True)
                time.sleep(60)
            real(path)

        ckpt._fsync_dir = paused

    def report(*a, **k):
        print(*a, flush=True)

    result = lt.train(model, plan, ds, steps=steps, lr_schedule=3e-3, checkpoint_dir=ckpt_dir, checkpoint_every=1,
                      keep_last=2, progress=False, print_fn=report, on_step=lambda r: print(f"step {r['step']}", flush=True))
    leaves = jax.tree.leaves({"params": result.model.params, "opt": result.opt_state})
    np.savez(out, *[np.asarray(x) for x in leaves])


if __name__ == "__main__":
    main(sys.argv[1:])
