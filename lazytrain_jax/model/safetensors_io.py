"""A minimal safetensors reader/writer on plain numpy (bf16 via ml_dtypes).

Reading goes tensor by tensor with ``readinto`` straight into the destination array, so loading a
checkpoint holds no second copy of it (no mmap pages left resident, no whole-file buffer).
Files are validated against their header: a truncated or corrupt file raises ``CheckpointError``
naming the file and the tensor.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Iterable, Iterator

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100 << 20


class CheckpointError(ValueError):
    """A checkpoint file or tensor that cannot be used; the message names the file and tensor."""


class TensorInfo:
    __slots__ = ("name", "dtype", "shape", "start", "end")

    def __init__(self, name, dtype, shape, start, end):
        self.name, self.dtype, self.shape, self.start, self.end = name, dtype, shape, start, end


def read_header(path: str) -> tuple[int, dict[str, TensorInfo], dict]:
    """Parses and validates a safetensors header. Returns (data offset, tensors by name, metadata)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise CheckpointError(f"{path}: truncated or corrupt safetensors header "
                                      f"(header length {n}, file size {size})")
            header = json.loads(f.read(n))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors header ({e})") from None
    metadata = header.pop("__metadata__", {}) or {}
    data_start = 8 + n
    tensors = {}
    for name, meta in header.items():
        dtype = DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {meta.get('dtype')!r}; "
                                  f"valid: {sorted(DTYPES)}")
        shape = tuple(int(d) for d in meta["shape"])
        start, end = (int(x) for x in meta["data_offsets"])
        if end - start != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise CheckpointError(f"{path}: tensor {name!r} has {end - start} bytes for shape {shape} {meta['dtype']}")
        if data_start + end > size:
            raise CheckpointError(f"{path}: truncated safetensors file: tensor {name!r} needs bytes up to "
                                  f"{data_start + end}, file has {size}")
        tensors[name] = TensorInfo(name, dtype, shape, start, end)
    return data_start, tensors, metadata


def read_tensors(path: str, wanted: dict[str, np.dtype], header=None) -> Iterator[tuple[str, np.ndarray]]:
    """Yields ``(name, array)`` for each name in ``wanted`` (name -> target dtype), one at a time.

    A tensor already in the target dtype is read straight into its final array; otherwise one
    tensor-sized temporary is converted and freed.
    """
    data_start, tensors, _ = header if header is not None else read_header(path)
    with open(path, "rb") as f:
        for name, target in wanted.items():
            info = tensors[name]
            buf = np.empty(info.shape, info.dtype)
            f.seek(data_start + info.start)
            got = f.readinto(memoryview(buf.reshape(-1).view(np.uint8)))
            if got != info.end - info.start:
                raise CheckpointError(f"{path}: truncated safetensors file while reading tensor {name!r}")
            yield name, buf if buf.dtype == target else buf.astype(target)


def write_file(path: str, tensors: Iterable[tuple[str, np.ndarray]], metadata: dict | None = None) -> None:
    """Writes ``tensors`` (name, array) as one safetensors file (caller handles atomicity)."""
    tensors = list(tensors)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, arr in tensors:
        if arr.dtype not in DTYPE_NAMES:
            raise CheckpointError(f"tensor {name!r}: dtype {arr.dtype} cannot be saved; valid: "
                                  f"{sorted(str(d) for d in DTYPE_NAMES)}")
        header[name] = {"dtype": DTYPE_NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-(8 + len(blob)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, arr in tensors:
            f.write(memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8)))
        f.flush()
        os.fsync(f.fileno())
