"""Checkpoint files: atomic directories, background writes, failures that keep the previous ones, keep_last."""

import errno
import json
import os

import numpy as np
import pytest

from lazytrain_jax.train import checkpoint as ckpt
from lazytrain_jax.train.checkpoint import CheckpointError, CheckpointManager


def _state(seed):
    rng = np.random.default_rng(seed)
    return {"params": {"w": rng.standard_normal((3, 4)).astype(np.float32)},
            "opt_state": {"codes": rng.integers(-127, 127, (5,)).astype(np.int8), "count": np.int32(seed)},
            "step": seed}


def _equal(a, b):
    import jax
    return all(np.array_equal(x, y) and np.asarray(x).shape == np.asarray(y).shape
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_round_trip_keep_last_and_scalars(tmp_path):
    mgr = CheckpointManager(str(tmp_path), keep_last=2)
    for step in (1, 2, 3):
        mgr.save(step, _state(step), {"x": step})
    mgr.close()
    assert [s for s, _ in ckpt.list_checkpoints(str(tmp_path))] == [2, 3]
    back = ckpt.read_state(mgr.latest(), _state(0))
    assert _equal(back, _state(3)) and back["opt_state"]["count"].shape == () and back["step"] == 3
    assert ckpt.read_meta(mgr.latest())["x"] == 3


def test_snapshot_is_taken_before_save_returns(tmp_path):
    state = _state(1)
    mgr = CheckpointManager(str(tmp_path))
    mgr.save(1, state, {})
    state["params"]["w"][:] = 0.0  # the engine may update its arrays in place right after
    mgr.close()
    assert _equal(ckpt.read_state(mgr.latest(), _state(0)), _state(1))


def test_failed_write_keeps_previous_and_reports(tmp_path, monkeypatch):
    mgr = CheckpointManager(str(tmp_path))
    mgr.save(1, _state(1), {}, blocking=True)
    real = ckpt._fsync_dir

    def full_disk(path):
        if ".tmp-step_" in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path)

    monkeypatch.setattr(ckpt, "_fsync_dir", full_disk)
    mgr.save(2, _state(2), {})  # returns; the failure surfaces at the next save or close
    with pytest.raises(CheckpointError, match=r"No space left on device.*previous checkpoints are intact"):
        mgr.close()
    assert os.listdir(tmp_path) == ["step_00000001"]
    assert _equal(ckpt.read_state(str(tmp_path / "step_00000001"), _state(0)), _state(1))


def test_unwritable_directory_and_stale_temporaries(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is not writable"):
        CheckpointManager(str(tmp_path / "file"))
    (tmp_path / "ck" / ".tmp-step_00000005-abc").mkdir(parents=True)
    CheckpointManager(str(tmp_path / "ck"))
    assert os.listdir(tmp_path / "ck") == []


def test_damage_and_structure_mismatch_are_named(tmp_path):
    mgr = CheckpointManager(str(tmp_path))
    mgr.save(1, _state(1), {}, blocking=True)
    path = mgr.latest()
    other = _state(0)
    other["params"]["w"] = np.zeros((4, 3), np.float32)
    with pytest.raises(CheckpointError, match=r"\['params'\]\['w'\] is float32\[3, 4\] in the checkpoint but "
                                              r"float32\[4, 3\] in this run"):
        ckpt.read_state(path, other)
    with pytest.raises(CheckpointError, match="other entries"):
        ckpt.read_state(path, {"params": {"v": np.zeros(1)}})
    data = bytearray(open(os.path.join(path, "arrays.bin"), "rb").read())
    data[3] ^= 0xFF
    open(os.path.join(path, "arrays.bin"), "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        ckpt.read_state(path, _state(0))


def test_compare_lists_differences():
    diffs = ckpt.compare({"model": {"a": 1, "b": 2}, "n": 3}, {"model": {"a": 1, "b": 5}, "n": 3, "m": 1})
    assert diffs == ["m: checkpoint 1, this run '<absent>'", "model.b: checkpoint 5, this run 2"]
    assert json.dumps(diffs)
