"""Hybrid policy: which parameters keep fp32 Adam state, and what the state costs.

Small tensors (fewer than ``min_8bit_size`` elements) and the tensors matched by a filter keep fp32
moments; every other tensor stores 8-bit codes plus per-block fp32 scales. The default filter
(:func:`default_fp32_state_filter`) matches embeddings, the LM head, norms and biases by the names
in the parameter's path, as bitsandbytes and torchao users do by hand.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from lazytrain_jax.optim import blockwise as q

Fp32StateFilter = Callable[[tuple, Any], bool]

FP32_NAME_PARTS = ("embed", "lm_head", "norm")


def path_names(path: Sequence[Any]) -> tuple[str, ...]:
    """Lower-cased names of a ``jax.tree_util`` key path (dict keys, attributes, indices).

    Example:
        >>> path_names((jax.tree_util.DictKey("layers"), jax.tree_util.SequenceKey(0)))
        ('layers', '0')
    """
    names = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)).lower())
                break
        else:
            names.append(str(entry).lower())
    return tuple(names)


def default_fp32_state_filter(path: tuple, leaf: Any) -> bool:
    """True for embeddings, the LM head, norms and biases (matched on the params path names).

    A leaf matches when any name in its path contains ``"embed"``, ``"lm_head"`` or ``"norm"``,
    or when the leaf itself is named ``"bias"``.

    Args:
      path: the leaf's key path (as given by ``jax.tree_util.tree_map_with_path``).
      leaf: the parameter (unused by the default filter; custom filters may look at its shape).

    Returns:
      Whether the leaf keeps fp32 Adam state.

    Example:
        >>> k = jax.tree_util.DictKey
        >>> default_fp32_state_filter((k("model"), k("embed_tokens"), k("weight")), None)
        True
    """
    del leaf
    names = path_names(path)
    if names and names[-1] == "bias":
        return True
    return any(part in name for name in names for part in FP32_NAME_PARTS)


def no_fp32_state_filter(path: tuple, leaf: Any) -> bool:
    """A filter matching nothing: every tensor of at least ``min_8bit_size`` elements is 8-bit."""
    del path, leaf
    return False


def leaf_state_format(
    path: tuple,
    leaf: Any,
    *,
    state_format: str,
    min_8bit_size: int,
    fp32_state_filter: Fp32StateFilter | None,
) -> str:
    """The state format a parameter gets under the hybrid policy (``"fp32"`` or ``state_format``).

    Example:
        >>> leaf_state_format((), jnp.zeros((8, 8)), state_format="dynamic8", min_8bit_size=4096,
        ...                   fp32_state_filter=None)
        'fp32'
    """
    if state_format == "fp32":
        return "fp32"
    size = math.prod(jnp.shape(leaf))
    if size < min_8bit_size or not jnp.issubdtype(jnp.result_type(leaf), jnp.floating):
        return "fp32"
    if fp32_state_filter is not None and fp32_state_filter(path, leaf):
        return "fp32"
    return state_format


def moment_state_bytes(shape: tuple[int, ...], fmt: str, block_size: int) -> int:
    """Bytes of Adam state (both moments, codes and scales) for one tensor stored as ``fmt``."""
    size = math.prod(shape)
    if fmt == "fp32":
        return 2 * 4 * size
    return 2 * (size + 4 * q.num_blocks(size, block_size))


def state_bytes_per_param(
    params: Any,
    *,
    block_size: int = 256,
    state_format: str = "dynamic8",
    min_8bit_size: int = 4096,
    fp32_state_filter: Fp32StateFilter | None = default_fp32_state_filter,
) -> dict[str, float]:
    """Adam-state bytes per parameter for a params tree under the hybrid policy.

    Counts codes (1 byte/element), per-block fp32 scales (4/block_size bytes/element) for each of
    m and v, and 8 bytes/element for fp32-state tensors; the scalar step counters are ignored.
    Works on arrays or ``jax.ShapeDtypeStruct`` leaves (no memory is allocated).

    Args:
      params: the parameter tree.
      block_size, state_format, min_8bit_size, fp32_state_filter: as in ``scale_by_adam_8bit``.

    Returns:
      dict with ``bytes_per_param`` (total state bytes / total parameters), ``num_params``,
      ``num_8bit_params`` (parameters with 8-bit state) and ``state_bytes``.

    Example:
        >>> params = {"w": jax.ShapeDtypeStruct((1024, 1024), jnp.float32)}
        >>> round(state_bytes_per_param(params)["bytes_per_param"], 4)
        2.0312
    """
    q.check_state_format(state_format)
    total_bytes = 0
    num_params = 0
    num_8bit = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        fmt = leaf_state_format(
            path, leaf, state_format=state_format, min_8bit_size=min_8bit_size,
            fp32_state_filter=fp32_state_filter,
        )
        size = math.prod(jnp.shape(leaf))
        num_params += size
        if fmt != "fp32":
            num_8bit += size
        total_bytes += moment_state_bytes(tuple(jnp.shape(leaf)), fmt, block_size)
    return {
        "bytes_per_param": total_bytes / max(num_params, 1),
        "num_params": num_params,
        "num_8bit_params": num_8bit,
        "state_bytes": total_bytes,
    }
