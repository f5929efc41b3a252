"""A minimal safetensors reader/writer on plain numpy (bf16 via ml_dtypes).

Reading goes tensor by tensor with ``readinto`` straight into the destination array, so loading a
checkpoint holds no second copy of it (no mmap pages left resident, no whole-file buffer).
Files are validated against their header: a truncated or corrupt file raises ``CheckpointError``
naming the file and the tensor.
"""

from __future__ import annotations

import json
import math
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


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"duplicate key {dup[0]!r}")
    return dict(pairs)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_entry(path: str, name, meta) -> TensorInfo:
    """One header entry, validated as the safetensors format specifies."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(meta, dict):
        raise CheckpointError(f"{where}: header entry must be an object with dtype, shape, data_offsets; "
                              f"got {type(meta).__name__}")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in meta]
    unknown = sorted(set(meta) - {"dtype", "shape", "data_offsets"})
    if missing or unknown:
        raise CheckpointError(f"{where}: header entry has keys {sorted(meta)}; required exactly "
                              f"['data_offsets', 'dtype', 'shape']")
    dtype = DTYPES.get(meta["dtype"]) if isinstance(meta["dtype"], str) else None
    if dtype is None:
        raise CheckpointError(f"{where} has unsupported dtype {meta['dtype']!r}; valid: {sorted(DTYPES)}")
    shape = meta["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: shape={shape!r} must be a list of non-negative integers")
    offsets = meta["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(x) and x >= 0 for x in offsets)
            and offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where}: data_offsets={offsets!r} must be [begin, end] with 0 <= begin <= end")
    start, end = offsets
    shape = tuple(shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if end - start != nbytes:
        raise CheckpointError(f"{where} has {end - start} bytes for shape {shape} {meta['dtype']} "
                              f"(needs {nbytes})")
    return TensorInfo(name, dtype, shape, start, end)


def read_header(path: str) -> tuple[int, dict[str, TensorInfo], dict]:
    """Parses and validates a safetensors header. Returns (data offset, tensors by name, metadata).

    Checks what the format specifies: a JSON object starting with ``{``; optional string-to-string
    ``__metadata__``; per tensor exactly ``dtype``, ``shape`` (non-negative integers) and
    ``data_offsets`` ([begin, end], end - begin = the tensor's bytes); the tensors' byte ranges
    tile the data buffer exactly (no overlap, no hole, nothing after the last). Any violation
    raises ``CheckpointError`` naming the file and the tensor.
    """
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
            text = f.read(n)
        if not text.startswith(b"{"):
            raise CheckpointError(f"{path}: safetensors header must be a JSON object starting with '{{'")
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except (OSError, ValueError, UnicodeDecodeError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot read safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header must be a JSON object; got {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{path}: __metadata__ must be an object of strings; got {metadata!r:.200}")
    data_start = 8 + n
    tensors = {name: _parse_entry(path, name, meta) for name, meta in header.items()}
    offset = 0
    for info in sorted(tensors.values(), key=lambda t: (t.start, t.end)):
        if info.start != offset:
            what = "overlaps the previous tensor" if info.start < offset else "leaves a hole before it"
            raise CheckpointError(f"{path}: tensor {info.name!r}: data_offsets [{info.start}, {info.end}] {what} "
                                  f"(expected begin {offset}); the data buffer must be tiled exactly")
        offset = info.end
    if data_start + offset > size:
        last = max(tensors.values(), key=lambda t: t.end).name
        raise CheckpointError(f"{path}: truncated safetensors file: tensor {last!r} needs bytes up to "
                              f"{data_start + offset}, file has {size}")
    if data_start + offset < size:
        raise CheckpointError(f"{path}: {size - data_start - offset} bytes after the last tensor's data; "
                              f"the data buffer must be tiled exactly by the tensors")
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
