"""Crash-safe checkpoints: atomic directories written in the background, the last N kept.

A checkpoint is ``<dir>/step_<8 digits>/`` with ``arrays.bin`` (every leaf of the engine's state
dict -- fp32 master params, the optimizer state with its 8-bit codes and scales as they are -- as
raw bytes), ``meta.json`` (step, data cursor, leaf table with dtypes/shapes/offsets/CRC32, the
model config, the run's compatibility fields) and ``plan.json``. It is written into a temporary
directory, every file fsync'ed, then renamed into place and the parent fsync'ed: a reader sees a
whole checkpoint or none, and a crash or a full disk mid-write leaves the previous ones intact.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import zlib
from typing import Any

import jax
import numpy as np

from lazytrain_jax.atomic import unwritable_directory
from lazytrain_jax.model.container import NUMPY_DTYPES

FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step_(\d{8})$")
_DTYPES = {**NUMPY_DTYPES, **{n: np.dtype(n) for n in ("int8", "uint8", "int16", "int32", "int64", "uint32",
                                                         "float64", "bool")}}


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or does not belong to this run (the message says why)."""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _flatten(tree) -> list[tuple[str, Any]]:
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def snapshot(tree):
    """A host copy of every leaf (the engine may update its arrays in place after this returns)."""
    return jax.tree.map(lambda x: np.array(x, copy=True), tree)


def write_checkpoint(directory: str, step: int, state: dict, meta: dict, plan_json: str | None = None) -> str:
    """Writes ``state`` (a pytree of arrays) and ``meta`` as ``<directory>/step_<step>`` atomically.

    Returns:
      The checkpoint's path.
    """
    final = os.path.join(directory, f"step_{step:08d}")
    tmp = tempfile.mkdtemp(prefix=f".tmp-step_{step:08d}-", dir=directory)
    try:
        leaves, offset = [], 0
        with open(os.path.join(tmp, "arrays.bin"), "wb") as f:
            for name, leaf in _flatten(state):
                arr = np.asarray(leaf)
                arr = arr if arr.flags.c_contiguous else arr.copy(order="C")  # (ascontiguousarray makes 0-d 1-d)
                data = arr.reshape(-1).view(np.uint8) if arr.size else b""
                f.write(data)
                leaves.append({"path": name, "dtype": arr.dtype.name, "shape": list(arr.shape), "offset": offset,
                               "nbytes": arr.nbytes, "crc32": zlib.crc32(data)})
                offset += arr.nbytes
            f.flush()
            os.fsync(f.fileno())
        files = {"meta.json": json.dumps({**meta, "format_version": FORMAT_VERSION, "step": step, "leaves": leaves},
                                         indent=1)}
        if plan_json is not None:
            files["plan.json"] = plan_json
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def list_checkpoints(directory: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint in ``directory``, oldest first."""
    if not os.path.isdir(directory):
        return []
    out = []
    for name in os.listdir(directory):
        m = _STEP_RE.match(name)
        if m and os.path.isfile(os.path.join(directory, name, "meta.json")):
            out.append((int(m.group(1)), os.path.join(directory, name)))
    return sorted(out)


def read_meta(path: str) -> dict:
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {meta.get('format_version')!r} is not supported "
                              f"(expected {FORMAT_VERSION})")
    return meta


def read_state(path: str, template) -> Any:
    """The state stored in checkpoint ``path``, in the structure of ``template`` (a pytree).

    Raises:
      CheckpointError: the leaves differ from the template's (names the first difference), or a
        leaf's bytes fail their CRC32.
    """
    meta = read_meta(path)
    expected = _flatten(template)
    stored = meta["leaves"]
    if [n for n, _ in expected] != [leaf["path"] for leaf in stored]:
        names = {leaf["path"] for leaf in stored}
        missing = [n for n, _ in expected if n not in names][:3]
        extra = sorted(names - {n for n, _ in expected})[:3]
        raise CheckpointError(f"{path}: its state has other entries than this run's (missing {missing}, "
                              f"unexpected {extra}): it was written for another model or optimizer")
    buf = np.fromfile(os.path.join(path, "arrays.bin"), dtype=np.uint8)
    leaves = []
    for (name, ref), info in zip(expected, stored):
        ref_shape = list(np.shape(ref))
        if info["shape"] != ref_shape or info["dtype"] != np.asarray(ref).dtype.name:
            raise CheckpointError(f"{path}: {name} is {info['dtype']}{info['shape']} in the checkpoint but "
                                  f"{np.asarray(ref).dtype.name}{ref_shape} in this run")
        raw = buf[info["offset"]:info["offset"] + info["nbytes"]]
        if raw.size != info["nbytes"] or zlib.crc32(raw) != info["crc32"]:
            raise CheckpointError(f"{path}: {name} fails its checksum (the file is damaged)")
        leaves.append(raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"]).copy())
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


def compare(expected: dict, found: dict, prefix: str = "") -> list[str]:
    """Human-readable differences between two nested dicts: ``key: checkpoint X, this run Y``."""
    diffs = []
    for key in sorted(set(expected) | set(found)):
        a, b = found.get(key, "<absent>"), expected.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(compare(b, a, f"{prefix}{key}."))
        elif a != b:
            diffs.append(f"{prefix}{key}: checkpoint {a!r}, this run {b!r}")
    return diffs


class CheckpointManager:
    """Writes checkpoints in a background thread (one in flight) and keeps the last ``keep_last``.

    ``save`` returns once the state is copied; the disk write overlaps the next steps. A failed write
    (full disk, lost permissions) is raised as CheckpointError at the next ``save`` or at ``close``;
    the previous checkpoints stay intact.

    Example:
      >>> mgr = CheckpointManager("ckpt", keep_last=3)
      >>> mgr.save(10, engine.state_dict(), meta)
      >>> mgr.close()
    """

    def __init__(self, directory: str, *, keep_last: int = 3):
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"keep_last={keep_last!r} must be a positive integer")
        self.directory, self.keep_last = os.fspath(directory), keep_last
        if (why := unwritable_directory(self.directory)) is not None:
            raise CheckpointError(f"checkpoint_dir={self.directory!r} is not writable: {why}")
        for name in os.listdir(self.directory):  # leftovers of writes cut short by a crash
            if name.startswith(".tmp-step_"):
                shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.last_path: str | None = None

    def _write(self, step, state, meta, plan_json):
        try:
            self.last_path = write_checkpoint(self.directory, step, state, meta, plan_json)
            for _, path in list_checkpoints(self.directory)[:-self.keep_last]:
                shutil.rmtree(path, ignore_errors=True)
        except BaseException as e:  # re-raised in the training thread
            self._error = e

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            what = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise CheckpointError(f"writing a checkpoint to {self.directory!r} failed ({what}); the previous "
                                  f"checkpoints are intact: {[p for _, p in list_checkpoints(self.directory)]}") from e

    def save(self, step: int, state, meta: dict, plan_json: str | None = None, *, blocking: bool = False) -> None:
        self.wait()
        state = snapshot(state)
        self._thread = threading.Thread(target=self._write, args=(step, state, meta, plan_json),
                                        name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        if blocking:
            self.wait()

    def latest(self) -> str | None:
        found = list_checkpoints(self.directory)
        return found[-1][1] if found else None

    def close(self) -> None:
        self.wait()
