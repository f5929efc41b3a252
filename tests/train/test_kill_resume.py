"""SIGKILL at random points (mid-step, mid-checkpoint-write) and resume: params and optimizer state end
bit-identical to an uninterrupted run; a kill during a checkpoint write leaves the previous one loadable.

Slow (each trial starts a process: about a minute in all on an idle 2-core machine): run with -m slow.
"""

import os
import random

import pytest

from tests.train import kill_resume as kr
from tests.train.helpers import tokenizer_dir


@pytest.fixture(scope="module")
def env_and_reference(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill")
    env = kr.driver_env(tokenizer_dir(), str(base / "jax-cache"))
    ref = str(base / "reference.npz")
    kr.run_to_end(env, str(base / "ref-ckpt"), ref)
    return env, ref


@pytest.mark.slow
def test_five_sigkills_at_random_points_then_resume_bit_identical(env_and_reference, tmp_path):
    env, ref = env_and_reference
    rows = kr.chain(env, str(tmp_path), num_kills=5, rng=random.Random(1234))
    kills = rows[:-1]
    assert len(kills) >= 4 and rows[-1]["final_resumed_from"] >= 1, rows  # 5 unless one overshot its mark
    assert any(r["resumed_from"] >= 1 for r in kills[1:]), rows  # later runs really resumed
    assert kr.same_npz(str(tmp_path / "out.npz"), ref), rows


@pytest.mark.slow
def test_kill_during_checkpoint_write_keeps_previous_checkpoint(env_and_reference, tmp_path):
    from lazytrain_jax.train import checkpoint as ckpt

    env, ref = env_and_reference
    ckpt_dir, out = str(tmp_path / "ckpt"), str(tmp_path / "out.npz")
    proc = kr.start(env, ckpt_dir, out, "--slow-write-step", "3")
    kr.kill_when(proc, "writing 3", 0.0)
    names = sorted(os.listdir(ckpt_dir))
    assert [n for n in names if n.startswith("step_")] == ["step_00000001", "step_00000002"]
    assert any(n.startswith(".tmp-step_00000003") for n in names)  # the write was cut short
    assert ckpt.read_meta(os.path.join(ckpt_dir, "step_00000002"))["step"] == 2
    text = kr.run_to_end(env, ckpt_dir, out)
    assert kr.resumed_from(text) == 2
    assert not any(n.startswith(".tmp-") for n in os.listdir(ckpt_dir))
    assert kr.same_npz(out, ref)
