"""The host-side model container: a ModelConfig and per-unit parameters in host memory (numpy).

``model.params`` is ``{"embed": {...}, "layers": [{...}, ...], "head": {...}}``; each entry is the
parameter dict of one streaming unit, with Hugging Face names and layouts. With tied embeddings the
head holds only its norm and uses ``params["embed"]["embed_tokens"]["weight"]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_dtypes
import numpy as np

from lazytrain_jax.model.config import ModelConfig, resolve_config
from lazytrain_jax.model.hybrid_layers import init_leaf as hybrid_init_leaf
from lazytrain_jax.model.qwen35_config import is_hybrid
from lazytrain_jax.model.units import ModelUnits, get_units

NUMPY_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
                "float16": np.dtype(np.float16)}


@dataclasses.dataclass
class Model:
    """A model's config and its host parameters.

    Example:
      >>> model = init_model("qwen3-debug")
      >>> model.params["layers"][0]["self_attn"]["q_proj"]["weight"].shape
    """

    config: ModelConfig
    params: dict[str, Any]

    @property
    def units(self) -> ModelUnits:
        return get_units(self.config)

    def num_params(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(self.params))

    def num_bytes(self) -> int:
        return sum(x.nbytes for x in jax.tree.leaves(self.params))

    def tied_weight(self, params: dict | None = None):
        """The embedding matrix when the LM head is tied to it, else None."""
        params = self.params if params is None else params
        return params["embed"]["embed_tokens"]["weight"] if self.config.tie_word_embeddings else None


def numpy_dtype(dtype) -> np.dtype:
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    if name not in NUMPY_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not supported; valid: {sorted(NUMPY_DTYPES)}")
    return NUMPY_DTYPES[name]


def unit_names(cfg: ModelConfig) -> list[str]:
    return ["embed"] + [f"layer_{i}" for i in range(cfg.num_layers)] + ["head"]


def _init_unit(abstract: dict, rng: np.random.Generator, std: float, dtype: np.dtype, special=None) -> dict:
    def init_leaf(path, leaf):
        name = path[-1].key
        if special is not None:
            value = special(".".join(str(p.key) for p in path), leaf.shape, rng, dtype)
            if value is not None:
                return value
        if name == "bias":
            return np.zeros(leaf.shape, dtype)
        if leaf.ndim == 1:  # RMSNorm scales
            return np.ones(leaf.shape, dtype)
        return (std * rng.standard_normal(leaf.shape, dtype=np.float32)).astype(dtype, copy=False)

    return jax.tree_util.tree_map_with_path(init_leaf, abstract)


def init_model(preset_or_config: str | ModelConfig, seed: int = 0, dtype: str | None = None) -> Model:
    """A randomly initialised model in host memory (Hugging Face init: normal(0, initializer_range)
    weights and embeddings, zero biases, unit norms), built unit by unit without touching a device.

    Args:
      preset_or_config: a preset name (``lazytrain_jax.PRESETS``) or a ModelConfig.
      seed: every unit draws from its own stream ``(seed, unit index)``.
      dtype: master dtype (default: the config's, ``float32``).

    Returns:
      Model.

    Example:
      >>> model = init_model("llama-debug", seed=1)
    """
    cfg = resolve_config(preset_or_config)
    if dtype is not None:
        cfg = cfg.replace(dtype=numpy_dtype(dtype).name)
    np_dtype = numpy_dtype(cfg.dtype)
    units = get_units(cfg)
    std = cfg.initializer_range
    special = hybrid_init_leaf if is_hybrid(cfg) else None

    def make(unit_index: int, unit_kind: str):
        rng = np.random.default_rng([seed, unit_index])
        return _init_unit(units.abstract_params(unit_kind), rng, std, np_dtype, special)

    params = {
        "embed": make(0, "embed"),
        "layers": [make(1 + i, kind) for i, kind in enumerate(cfg.layer_kinds)],
        "head": make(1 + cfg.num_layers, "head"),
    }
    return Model(config=cfg, params=params)
