"""Models: ModelConfig (pure Python), per-layer Flax NNX units, the host container, HF load/save.

Only the config is imported eagerly, so the planner can cost a model without importing jax.
"""

from lazytrain_jax.model.config import PRESETS, ModelConfig, get_preset

__all__ = ["ModelConfig", "PRESETS", "get_preset"]
