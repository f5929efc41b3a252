"""The NVMe activation tier: raw files under ``offload_dir``, one per (boundary, micro-batch).

Each file holds the array's bytes only; its dtype, shape, byte count and CRC-32 stay in memory and
are checked on read, so a truncated, corrupted or missing file raises :class:`OffloadError` instead
of returning wrong data. Files are deleted once read back (or when the store is cleared), and the
bytes on disk never exceed ``capacity_bytes`` (the plan's NVMe peak).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import zlib

import numpy as np

from lazytrain_jax.atomic import unwritable_directory


class OffloadError(RuntimeError):
    """An NVMe offload file could not be written or read back intact."""


class NvmeStore:
    """Writes and reads host arrays as raw files; thread-safe; bounded usage.

    Args:
      directory: where files go (created if missing); None: a new temporary directory, removed by
        :meth:`close`.
      capacity_bytes: the most bytes on disk at once (the plan's ``predicted_peak_nvme_bytes``).

    Example:
      >>> store = NvmeStore(None, capacity_bytes=1e9)
      >>> store.write("b3_m0", np.ones(4, np.float32)); store.read("b3_m0")
    """

    def __init__(self, directory: str | None, *, capacity_bytes: float):
        self._owned = directory is None
        if directory is None:
            directory = tempfile.mkdtemp(prefix="lazytrain-nvme-")
        directory = os.fspath(directory)
        if (why := unwritable_directory(directory)) is not None:
            raise OffloadError(f"offload_dir={directory!r} is not writable ({why}); give a "
                               "writable directory on a local disk")
        self.directory = directory
        self.capacity_bytes = float(capacity_bytes)
        self._meta: dict[str, tuple] = {}
        self._lock = threading.Lock()
        self.bytes_on_disk = 0
        self.peak_bytes_on_disk = 0
        self.bytes_written = 0
        self.bytes_read = 0

    def path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.bin")

    def write(self, key: str, array: np.ndarray) -> None:
        """Writes ``array`` to the file of ``key`` (fsync'd); raises OffloadError on any failure."""
        array = np.ascontiguousarray(array)
        nbytes = array.nbytes
        with self._lock:
            if self.bytes_on_disk + nbytes > self.capacity_bytes * (1 + 1e-9):
                raise OffloadError(f"NVMe tier: writing {key} ({nbytes} bytes) would hold "
                                   f"{self.bytes_on_disk + nbytes} bytes on disk, above the plan's NVMe peak "
                                   f"{self.capacity_bytes:.0f}")
            self.bytes_on_disk += nbytes
        path = self.path(key)
        buf = array.view(np.uint8).reshape(-1)
        try:
            with open(path, "wb") as f:
                f.write(memoryview(buf))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            with self._lock:
                self.bytes_on_disk -= nbytes
            try:
                os.remove(path)
            except OSError:
                pass
            raise OffloadError(f"NVMe tier: writing {path} ({nbytes} bytes) failed: {e.strerror or e}") from None
        with self._lock:
            self._meta[key] = (array.dtype, array.shape, nbytes, zlib.crc32(buf))
            self.peak_bytes_on_disk = max(self.peak_bytes_on_disk, self.bytes_on_disk)
            self.bytes_written += nbytes

    def read(self, key: str, *, delete: bool = True) -> np.ndarray:
        """Reads the array of ``key`` back, checking size and CRC-32; deletes the file by default."""
        with self._lock:
            if key not in self._meta:
                raise OffloadError(f"NVMe tier: no file was written for {key}")
            dtype, shape, nbytes, crc = self._meta[key]
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise OffloadError(f"NVMe tier: reading {path} failed: {e.strerror or e}") from None
        if len(data) != nbytes:
            raise OffloadError(f"NVMe tier: {path} has {len(data)} bytes; {nbytes} were written")
        if zlib.crc32(data) != crc:
            raise OffloadError(f"NVMe tier: {path} is corrupted (CRC-32 mismatch)")
        with self._lock:
            self.bytes_read += nbytes
        if delete:
            self.delete(key)
        return np.frombuffer(data, dtype=dtype).reshape(shape)

    def delete(self, key: str) -> None:
        with self._lock:
            meta = self._meta.pop(key, None)
            if meta is not None:
                self.bytes_on_disk -= meta[2]
        try:
            os.remove(self.path(key))
        except FileNotFoundError:
            pass

    def clear(self) -> None:
        for key in list(self._meta):
            self.delete(key)

    def close(self) -> None:
        self.clear()
        if self._owned:
            shutil.rmtree(self.directory, ignore_errors=True)
