"""lt.train end to end on a tiny model: outputs, resume from a mid-run checkpoint, refusals."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.train import CheckpointError
from tests.trace_check import assert_valid_trace
from tests.train.helpers import tiny_plan, tiny_setup

# one worker runs this module's tests: its training run (``full_run``) is built once, not per worker
pytestmark = pytest.mark.xdist_group("train_full_run")

STEP_KEYS = {"loss", "grad_norm", "skipped", "lr", "step_time_s", "predicted_step_time_s", "stall_s", "tokens",
             "tokens_per_s", "tflops_6n", "tflops_hw", "mfu", "peak_device_bytes", "peak_host_bytes"}


def _leaves(result):
    return jax.tree.leaves({"params": result.model.params, "opt": result.opt_state})


@pytest.fixture(scope="module")
def setup():
    model, ds, held = tiny_setup(num_train=48, num_eval=6)
    plan = tiny_plan(model, tiers=["device", "host", "device"])  # an offloaded boundary
    return model, ds, held, plan


@pytest.fixture(scope="module")
def full_run(setup, tmp_path_factory):
    model, ds, held, plan = setup
    d = tmp_path_factory.mktemp("full")
    result = lt.train(model, plan, ds, steps=6, lr_schedule=3e-3, eval_data=held, max_new_tokens=4,
                      checkpoint_dir=str(d / "ckpt"), checkpoint_every=3, keep_last=5, log_dir=str(d / "log"),
                      export_dir=str(d / "hf"), progress=False, print_fn=None)
    return result, d


def test_outputs_log_summary_pngs_trace_export(full_run, setup):
    result, d = full_run
    model = setup[0]
    steps = [r for r in result.records if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))
    assert all(STEP_KEYS <= set(r) for r in steps)
    lines = [json.loads(x) for x in open(d / "log" / "log.jsonl")]
    assert lines == result.records and lines[-1]["event"] == "eval" and lines[-1]["num_total"] == 6
    assert steps[-1]["loss"] < steps[0]["loss"]
    for key in ("tokens_per_s", "tflops_6n", "tflops_hw", "stall_s", "peak_device_bytes", "peak_host_bytes",
                "predicted_step_time_s", "step_time_s", "mfu", "exact_match"):
        assert key in result.summary, key
    assert result.summary["tflops_hw"] > result.summary["tflops_6n"] > 0  # recompute + attention counted
    for png in ("loss.png", "timeline.png"):
        assert open(d / "log" / png, "rb").read(8) == b"\x89PNG\r\n\x1a\n" and os.path.getsize(d / "log" / png) > 5000
    events = assert_valid_trace(d / "log" / "trace.json")
    assert "compute" in {e.get("cat") for e in events}
    exported = lt.load_model(str(d / "hf"))
    for a, b in zip(jax.tree.leaves(exported.params), jax.tree.leaves(result.model.params)):
        np.testing.assert_array_equal(a, b)
    assert os.path.exists(d / "hf" / "tokenizer.json")
    assert sorted(os.listdir(d / "ckpt")) == ["step_00000003", "step_00000006"]
    assert not np.array_equal(result.model.params["embed"]["embed_tokens"]["weight"],
                              model.params["embed"]["embed_tokens"]["weight"])


def test_resume_from_mid_run_checkpoint_is_bit_identical(full_run, setup, tmp_path):
    result, d = full_run
    model, ds, held, plan = setup
    shutil.copytree(d / "ckpt" / "step_00000003", tmp_path / "ckpt" / "step_00000003")
    shutil.copytree(d / "log", tmp_path / "log")
    resumed = lt.train(model, plan, ds, steps=6, lr_schedule=3e-3, checkpoint_dir=str(tmp_path / "ckpt"),
                       checkpoint_every=3, log_dir=str(tmp_path / "log"), progress=False, print_fn=None)
    assert resumed.start_step == 3
    for a, b in zip(_leaves(resumed), _leaves(result)):
        np.testing.assert_array_equal(a, b)
    steps = [r for r in resumed.records if r["event"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 7))  # the log continues, no duplicate steps
    assert [r["loss"] for r in steps] == [r["loss"] for r in result.records if r["event"] == "step"]


def test_checkpoint_of_another_model_or_run_is_refused(full_run, setup, tmp_path):
    result, d = full_run
    model, ds, held, plan = setup
    other, _, _ = tiny_setup(num_train=48, num_layers=3)
    other_plan = tiny_plan(other)
    with pytest.raises(CheckpointError, match=r"model\.num_layers: checkpoint 2, this run 3"):
        lt.train(other, other_plan, ds, steps=6, checkpoint_dir=str(d / "ckpt"), progress=False, print_fn=None)
    with pytest.raises(CheckpointError, match=r"data\.seed: checkpoint 0, this run 1"):
        lt.train(model, plan, ds, steps=6, lr_schedule=3e-3, seed=1, checkpoint_dir=str(d / "ckpt"), progress=False,
                 print_fn=None)
    with pytest.raises(CheckpointError, match=r"total_steps: checkpoint 6, this run 9"):
        lt.train(model, plan, ds, steps=9, lr_schedule=3e-3, checkpoint_dir=str(d / "ckpt"), progress=False,
                 print_fn=None)
    assert sorted(os.listdir(d / "ckpt")) == ["step_00000003", "step_00000006"]  # nothing touched


def test_bad_arguments(setup):
    model, ds, held, plan = setup
    with pytest.raises(ValueError, match="exactly one of steps"):
        lt.train(model, plan, ds, progress=False, print_fn=None)
    with pytest.raises(ValueError, match="plan.seq_len=40 differs from the data's seq_len=24"):
        from lazytrain_jax.data import load_dataset
        short = load_dataset(ds.examples[:8], ds.tokenizer, 24, fmt=ds.fmt)
        lt.train(model, plan, short, steps=1, progress=False, print_fn=None)
    with pytest.raises(ValueError, match="device_memory is required on the CPU backend"):
        lt.train(model, "auto", ds, steps=1, batch_size=4, hardware="rtx3090", progress=False, print_fn=None)
    with pytest.raises(ValueError, match="plan infeasible"):
        lt.train(model, "auto", ds, steps=1, batch_size=4, hardware="rtx3090", device_memory=2e5, progress=False,
                 print_fn=None)
    # an interval with nothing to run it on is refused, not ignored
    with pytest.raises(ValueError, match=r"^eval_every=2 needs eval_data"):
        lt.train(model, plan, ds, steps=1, eval_every=2, progress=False, print_fn=None)
    with pytest.raises(ValueError, match=r"^checkpoint_every=2 needs checkpoint_dir$"):
        lt.train(model, plan, ds, steps=1, checkpoint_every=2, progress=False, print_fn=None)
