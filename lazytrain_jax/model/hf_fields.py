"""Strict readers of Hugging Face ``config.json`` fields (pure Python, no jax).

transformers is lenient where a silent misreading changes the model: ``"tie_word_embeddings":
"false"`` is a truthy string, ``"vocab_size": 256.9`` truncates, and RoPE has two homes
(``rope_scaling`` and ``rope_parameters``) of which transformers uses one. These helpers check
each field's JSON type and read RoPE exactly as transformers does, or refuse with a ValueError
naming the field, the value and what would be valid.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

_MISSING = object()
_HF_KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def hf_value(d: Mapping[str, Any], key: str, kind: str, default: Any = _MISSING, *, none_ok: bool = False,
              where: str = "config.json"):
    """``d[key]`` checked strictly against a JSON type (no bool as int, no string as bool, no 2.5 as int).

    Args:
      d: the config dict; key: the field; kind: ``int`` | ``float`` (finite) | ``bool`` | ``str``.
      default: returned when the key is absent (absent and no default: ValueError).
      none_ok: treat ``null`` like an absent key; where: the prefix of error messages.

    Returns:
      The value (a float for ``kind="float"``).

    Example:
      >>> hf_value({"vocab_size": 256}, "vocab_size", "int")
      256
    """
    if key not in d:
        if default is _MISSING:
            raise ValueError(f"{where}: required field {key!r} is missing")
        return default
    value = d[key]
    if value is None and none_ok:
        return default
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
          "bool": isinstance(value, bool),
          "str": isinstance(value, str)}[kind]
    if not ok:
        raise ValueError(f"{where}: {key}={value!r} ({type(value).__name__}) must be {_HF_KINDS[kind]}")
    return float(value) if kind == "float" else value


# Keys transformers reads for each supported rope_type (besides rope_type/type and rope_theta).
_ROPE_KEYS = {"default": {}, "linear": {"factor": "float"},
              "llama3": {"factor": "float", "low_freq_factor": "float", "high_freq_factor": "float",
                         "original_max_position_embeddings": "int"}}


def read_hf_rope(d: Mapping[str, Any], max_position_embeddings: int) -> tuple[float, dict | None, float]:
    """RoPE of a Hugging Face config dict, read as transformers (4.x and 5.x) reads it.

    transformers takes ``rope_scaling`` when it is a non-empty dict and ``rope_parameters`` only
    otherwise; ``rope_theta`` comes from that dict, else from the top level, else 10000; ``rope_type``
    wins over the legacy ``type``; llama3 defaults ``original_max_position_embeddings`` to
    ``max_position_embeddings``. Unsupported types and unknown keys are refused.

    Returns:
      (rope_theta, rope_scaling or None for plain RoPE, partial_rotary_factor).

    Example:
      >>> read_hf_rope({"rope_theta": 1e6, "rope_scaling": None}, 4096)
      (1000000.0, None, 1.0)
    """
    scaling, params = d.get("rope_scaling"), d.get("rope_parameters")
    for key, value in (("rope_scaling", scaling), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"config.json: {key}={value!r} must be an object or null")
    source = "rope_scaling" if scaling else "rope_parameters"
    rope = dict(scaling or params or {})
    where = f"config.json {source}"
    theta = hf_value(rope, "rope_theta", "float", None, where=where)
    if theta is None:
        theta = hf_value(d, "rope_theta", "float", 10000.0)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in _ROPE_KEYS:
        raise ValueError(f"{where}: rope_type={rope_type!r} is not supported; valid: {list(_ROPE_KEYS)}")
    partial = hf_value(rope, "partial_rotary_factor", "float", None, where=where)
    if partial is None:
        partial = hf_value(d, "partial_rotary_factor", "float", 1.0)
    wanted = _ROPE_KEYS[rope_type]
    unknown = sorted(set(rope) - set(wanted) - {"rope_type", "type", "rope_theta", "partial_rotary_factor"})
    if unknown:
        raise ValueError(f"{where}: key {unknown[0]!r} is not used by rope_type={rope_type!r}; "
                         f"valid: {sorted(wanted) + ['rope_theta', 'rope_type']}")
    if rope_type == "llama3":
        rope.setdefault("original_max_position_embeddings", max_position_embeddings)
    out = {"rope_type": rope_type}
    for key, kind in wanted.items():
        value = hf_value(rope, key, kind, where=where)
        if not value > 0:
            raise ValueError(f"{where}: {key}={value!r} must be > 0")
        out[key] = value
    return theta, (None if rope_type == "default" else out), partial
