"""SIGKILL a training process at random points and resume it: does it end bit-identical?

Each trial starts a fresh checkpoint directory, runs the tiny training driver (a checkpoint every
step), kills it with SIGKILL after a random step plus a random delay (so kills land mid-step and
mid-checkpoint-write), resumes it to the end, and compares every parameter and optimizer-state
array with an uninterrupted run, byte for byte. Prints one row per trial and the count.

    python benchmarks/kill_resume.py --trials 20
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.train import kill_resume as kr  # noqa: E402
from tests.train.helpers import tokenizer_dir  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    base = tempfile.mkdtemp(prefix="lazytrain-kill-")
    env = kr.driver_env(tokenizer_dir(), os.path.join(base, "jax-cache"))
    ref = os.path.join(base, "reference.npz")
    kr.run_to_end(env, os.path.join(base, "ref-ckpt"), ref)
    print(f"{'trial':>5} {'killed after step':>17} {'delay ms':>8} {'resumed from':>12} {'bit-identical':>13} {'s':>6}")
    identical = 0
    for trial in range(args.trials):
        t0 = time.perf_counter()
        work = os.path.join(base, f"trial-{trial}")
        os.makedirs(work)
        rows = kr.chain(env, work, num_kills=1, rng=rng)
        same = kr.same_npz(os.path.join(work, "out.npz"), ref)
        identical += same
        print(f"{trial:>5} {rows[0]['killed_after_step']:>17} {1e3 * rows[0]['delay_s']:>8.1f} "
              f"{rows[1]['final_resumed_from']:>12} {str(same):>13} {time.perf_counter() - t0:>6.1f}", flush=True)
    print(f"{identical}/{args.trials} resumed runs bit-identical to the uninterrupted run ({kr.STEPS} steps)")
    return 0 if identical == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
