"""lazytrain_jax: fine-tune LLMs larger than your accelerator, one streamed layer at a time.

The public API is re-exported here lazily, so that ``import lazytrain_jax.schedule`` (pure Python,
no jax) stays light and a 27B model can be planned on a machine without an accelerator.

Example:
    >>> import lazytrain_jax as lt
    >>> model = lt.init_model("qwen3-debug", seed=0)
    >>> logits = lt.forward(model, input_ids)
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "ModelConfig": "lazytrain_jax.model.config",
    "PRESETS": "lazytrain_jax.model.config",
    "get_preset": "lazytrain_jax.model.config",
    "Model": "lazytrain_jax.model.container",
    "init_model": "lazytrain_jax.model.container",
    "load_model": "lazytrain_jax.model.hf_io",
    "save_hf": "lazytrain_jax.model.hf_io",
    "to_hf_state_dict": "lazytrain_jax.model.hf_io",
    "forward": "lazytrain_jax.model.reference",
    "loss_and_grad": "lazytrain_jax.model.reference",
    "plan": "lazytrain_jax.schedule.api",
    "Plan": "lazytrain_jax.schedule.plan",
    "Hardware": "lazytrain_jax.schedule.hardware",
    "train": "lazytrain_jax.train.loop",
    "TrainResult": "lazytrain_jax.train.loop",
    "StreamingEngine": "lazytrain_jax.executor.engine",
    "profile": "lazytrain_jax.executor.profiler",
}
_SUBMODULES = {"optim", "schedule", "model", "executor", "train", "data"}

__all__ = sorted(_EXPORTS) + sorted(_SUBMODULES) + ["__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"lazytrain_jax.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'lazytrain_jax' has no attribute {name!r}")


def __dir__():
    return __all__
