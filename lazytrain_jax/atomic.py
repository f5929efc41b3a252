"""Atomic file writes (pure Python): a reader sees the old file or the new one, never half of one.

Files and directories made here get the permissions a plain ``open``/``mkdir`` would give under
the user's umask (``tempfile`` alone would make them private: 0600 files, 0700 directories).
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def current_umask() -> int:
    """The process umask (read from /proc where available, so no other thread sees it change)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def make_temp_dir(parent: str, name: str) -> str:
    """A new empty directory ``parent/.name.tmp-XXXX`` with the umask's permissions (not 0700)."""
    tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
    os.chmod(tmp, 0o777 & ~current_umask())
    return tmp


def check_writable_file_path(path: str | os.PathLike, *, probe: bool = True) -> str:
    """Raises (naming the path) unless ``path`` can be written as a file: its directory exists, a
    file can be made there (tried: an empty probe file, removed at once; permission bits alone do
    not tell, e.g. for root, on a read-only mount or in /proc) and it is not itself a directory.
    Returns the path as a string. ``probe=False``: the probe file left to the caller (``atomic_path``
    makes its temporary file there next, which fails the same way).

    Example:
      >>> check_writable_file_path("out/plan.json")   # before an expensive computation
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"cannot write {path}: {directory} is not a directory")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {path}: it is a directory; give a file name")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(f"cannot write {path}: no write permission in {directory}")
    if probe:
        os.remove(_temp_file(path, directory, ".probe-"))
    return path


def _new_file(directory: str, prefix: str) -> str:
    """A new empty file ``directory/<prefix>XXXX`` (OSError where none can be made)."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=directory)
    os.close(fd)
    return tmp


def _temp_file(path: str, directory: str, kind: str) -> str:
    """``_new_file`` for writing ``path``: ``directory/.<name><kind>XXXX``; where none can be made,
    an OSError naming ``path`` and the reason (not the temporary name)."""
    try:
        return _new_file(directory, f".{os.path.basename(path)}{kind}")
    except OSError as e:
        raise PermissionError(f"cannot write {path}: {e.strerror or e} in {directory}") from None


def unwritable_directory(directory: str | os.PathLike) -> str | None:
    """Why ``directory`` cannot hold new files (made first, with its parents, where missing), or
    None where it can: a probe file is made there and removed (permission bits alone do not tell,
    e.g. for root, on a read-only mount or in /proc). Callers name their own field in the error.

    Example:
      >>> if (why := unwritable_directory(log_dir)) is not None:
      ...     raise ValueError(f"log_dir={log_dir!r} is not writable: {why}")
    """
    directory = os.fspath(directory)
    try:
        os.makedirs(directory, exist_ok=True)
        os.remove(_new_file(directory, ".probe-"))
    except OSError as e:
        return str(e.strerror or e)
    return None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yields a temporary path beside ``path``; on success it replaces ``path``, on error it is removed.

    The file gets the permissions of a plain ``open(path, "w")`` under the current umask.

    Example:
      >>> with atomic_path("plan.json") as tmp:
      ...     open(tmp, "w").write(text)
    """
    path = check_writable_file_path(path, probe=False)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = _temp_file(path, directory, ".tmp-")
    try:
        os.chmod(tmp, 0o666 & ~current_umask())
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
