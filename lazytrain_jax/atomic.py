"""Atomic file writes (pure Python): a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import tempfile


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    Example:
      >>> with atomic_path("plan.json") as tmp:
      ...     open(tmp, "w").write(text)
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"cannot write {path}: {directory} is not a directory")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
