"""Training: ``train()``, checkpoints, metrics, run configs and the ``lazytrain`` subcommands.

Example:
    >>> import lazytrain_jax as lt
    >>> result = lt.train(model, plan, dataset, steps=100, checkpoint_dir="ckpt", log_dir="logs")
"""

from lazytrain_jax.train.checkpoint import CheckpointError, CheckpointManager
from lazytrain_jax.train.config import TrainConfig
from lazytrain_jax.train.loop import TrainResult, train
from lazytrain_jax.train.schedule import lr_schedule

__all__ = ["CheckpointError", "CheckpointManager", "TrainConfig", "TrainResult", "lr_schedule", "train"]


class _CallableModule(type(__import__("sys"))):
    """``lazytrain_jax.train`` is both this package and the function: once the package is imported,
    Python binds ``lazytrain_jax.train`` to it, so calling it runs :func:`train`."""

    def __call__(self, *args, **kwargs):
        return train(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
