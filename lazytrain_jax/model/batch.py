"""Host-side batch validation (numpy only): bad token ids, labels or masks never reach a device.

On a device an out-of-range id is not an error: a negative id wraps around the embedding table, an
id >= vocab gives NaN logits, a label of -5 is counted as token 0 and a batch without a counted
token gives loss 0 with zero gradients. So every batch is checked here first, in numpy, where the
check is cheap; the error names the key, the offending value and its ``[row, col]`` position.

A batch is a dict of ``[B, S]`` integer arrays ``input_ids``, ``attention_mask`` (1 = token,
0 = padding) and ``labels`` (aligned with ``input_ids``; the loss shifts them by one, so the label
at position 0 is never counted, as in transformers; -100 = not counted).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

BATCH_KEYS = ("input_ids", "attention_mask", "labels")
IGNORE_INDEX = -100


class BatchError(ValueError):
    """A batch that cannot be trained on; the message names the key, the value and its position."""


def _as_int_array(key: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except Exception as e:  # noqa: BLE001 - anything numpy cannot turn into an array
        raise BatchError(f"batch[{key!r}] is not an array ({type(value).__name__}: {e})") from None
    if arr.dtype.kind not in "iu":
        raise BatchError(f"batch[{key!r}] has dtype {arr.dtype}; it must be an integer array (int32)")
    if arr.ndim != 2:
        raise BatchError(f"batch[{key!r}] has shape {arr.shape}; it must be [batch, seq] (2-D)")
    return arr


def _first_bad(key: str, arr: np.ndarray, bad: np.ndarray, valid: str) -> None:
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise BatchError(f"batch[{key!r}][{row}, {col}] = {int(arr[row, col])} is invalid "
                         f"({int(bad.sum())} invalid value(s) in all); valid: {valid}")


def check_token_ids(key: str, value: Any, vocab_size: int) -> np.ndarray:
    """``value`` as an int32 [B, S] array, after checking every id is in ``[0, vocab_size)``.

    Example:
      >>> check_token_ids("input_ids", [[1, 2]], vocab_size=256)
    """
    arr = _as_int_array(key, value)
    _first_bad(key, arr, (arr < 0) | (arr >= vocab_size), f"token ids in [0, {vocab_size}) (vocab_size)")
    return arr.astype(np.int32)


def check_attention_mask(value: Any, shape: tuple[int, ...], key: str = "attention_mask") -> np.ndarray:
    """``value`` as an int32 [B, S] array of 0/1 with the given shape.

    Example:
      >>> check_attention_mask([[1, 1, 0]], (1, 3))
    """
    arr = _as_int_array(key, value)
    if arr.shape != shape:
        raise BatchError(f"batch[{key!r}] has shape {arr.shape}; it must equal input_ids' shape {shape}")
    _first_bad(key, arr, (arr != 0) & (arr != 1), "0 (padding) or 1 (token)")
    return arr.astype(np.int32)


def validate_batch(batch: Mapping[str, Any], vocab_size: int, *, require_counted: bool = True
                   ) -> dict[str, np.ndarray]:
    """Checks a training batch on the host and returns it as int32 numpy arrays.

    Checks: a dict with exactly ``input_ids``, ``attention_mask``, ``labels``; integer dtypes; all
    2-D with equal shapes; ids in ``[0, vocab_size)``; labels -100 or in ``[0, vocab_size)``; mask
    0/1; with ``require_counted``, at least one counted token after the causal shift (a label
    other than -100 at a position >= 1: transformers' loss returns NaN without one, and a
    zero-gradient step must never pass silently).

    Args:
      batch: mapping of ``input_ids``, ``attention_mask``, ``labels`` ([B, S] integer arrays or lists).
      vocab_size: the model's vocabulary size.
      require_counted: raise when no token would be counted by the loss.

    Returns:
      dict of int32 numpy arrays with the same keys.

    Raises:
      BatchError (a ValueError): naming the key, the offending value and its [row, col] position.

    Example:
      >>> ids = np.array([[1, 2, 3]], np.int32)
      >>> validate_batch({"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids}, 256)
    """
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size <= 0:
        raise ValueError(f"vocab_size={vocab_size!r} must be a positive integer")
    if not isinstance(batch, Mapping):
        raise BatchError(f"a batch must be a dict with keys {list(BATCH_KEYS)}; got {type(batch).__name__}")
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise BatchError(f"batch is missing {missing}; a batch has keys {list(BATCH_KEYS)}")
    unknown = sorted(str(k) for k in batch if k not in BATCH_KEYS)
    if unknown:
        raise BatchError(f"batch has unknown key {unknown[0]!r}; a batch has keys {list(BATCH_KEYS)}")
    input_ids = check_token_ids("input_ids", batch["input_ids"], vocab_size)
    shape = input_ids.shape
    if 0 in shape:
        raise BatchError(f"batch['input_ids'] has shape {shape}; batch and sequence length must be >= 1")
    mask = check_attention_mask(batch["attention_mask"], shape)
    labels = _as_int_array("labels", batch["labels"])
    if labels.shape != shape:
        raise BatchError(f"batch['labels'] has shape {labels.shape}; it must equal input_ids' shape {shape}")
    _first_bad("labels", labels, (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= vocab_size)),
               f"{IGNORE_INDEX} (not counted) or token ids in [0, {vocab_size}) (vocab_size)")
    if require_counted and not (labels[:, 1:] != IGNORE_INDEX).any():
        raise BatchError(f"batch['labels'] counts no token: every label at positions 1..{shape[1] - 1} is "
                         f"{IGNORE_INDEX} (the label at position 0 is never counted: the loss predicts position "
                         f"t + 1 from position t); the loss would be undefined (NaN in transformers)")
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels.astype(np.int32)}
