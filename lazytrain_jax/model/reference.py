"""The resident reference path: all units in one jit. Every streamed schedule is checked against it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.units import default_positions, get_units

BATCH_KEYS = ("input_ids", "attention_mask", "labels")


def _hidden(cfg: ModelConfig, params, input_ids_BxS, attention_mask_BxS, positions_BxS):
    units = get_units(cfg)
    h_BxSxD = units.embed(params["embed"], input_ids_BxS)
    for kind, layer_params in zip(cfg.layer_kinds, params["layers"]):
        h_BxSxD = units.layer(kind)(layer_params, h_BxSxD, positions_BxS, attention_mask_BxS)
    return h_BxSxD


def _tied(cfg: ModelConfig, params):
    return params["embed"]["embed_tokens"]["weight"] if cfg.tie_word_embeddings else None


@functools.lru_cache(maxsize=32)
def _forward_fn(cfg: ModelConfig):
    def fwd(params, input_ids_BxS, attention_mask_BxS, positions_BxS):
        h_BxSxD = _hidden(cfg, params, input_ids_BxS, attention_mask_BxS, positions_BxS)
        return get_units(cfg).head_logits(params["head"], _tied(cfg, params), h_BxSxD)

    return jax.jit(fwd)


@functools.lru_cache(maxsize=32)
def _loss_and_grad_fn(cfg: ModelConfig):
    def loss_fn(params, batch):
        positions_BxS = default_positions(batch["input_ids"])
        h_BxSxD = _hidden(cfg, params, batch["input_ids"], batch["attention_mask"], positions_BxS)
        loss_sum, count = get_units(cfg).head_loss(params["head"], _tied(cfg, params), h_BxSxD, batch["labels"])
        return loss_sum / jnp.maximum(count, 1.0)

    return jax.jit(jax.value_and_grad(loss_fn))


def _check_ids(name, value, ndim=2):
    if getattr(value, "ndim", None) != ndim:
        raise ValueError(f"{name} must be a [batch, seq] integer array; got shape {getattr(value, 'shape', None)}")


def forward(model, input_ids, attention_mask=None, position_ids=None):
    """Logits ``[B, S, V]`` (fp32) of the whole model in one jit (resident; reference path).

    Args:
      model: a ``Model``.
      input_ids: int array ``[B, S]``.
      attention_mask: ``[B, S]``, 1 for tokens and 0 for padding (default: all ones).
      position_ids: ``[B, S]`` (default ``arange(S)`` per row, as transformers' forward does).

    Example:
      >>> logits = forward(model, np.array([[1, 2, 3]]))
    """
    _check_ids("input_ids", input_ids)
    input_ids = jnp.asarray(input_ids, jnp.int32)
    mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} must equal input_ids shape {input_ids.shape}")
    positions = default_positions(input_ids) if position_ids is None else jnp.asarray(position_ids, jnp.int32)
    return _forward_fn(model.config)(model.params, input_ids, mask, positions)


def validate_batch(batch) -> dict:
    """Checks a batch dict (``input_ids``, ``attention_mask``, ``labels``, all [B, S]); returns int32 arrays."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch is missing {missing}; a batch has keys {list(BATCH_KEYS)}")
    out = {k: jnp.asarray(batch[k], jnp.int32) for k in BATCH_KEYS}
    shape = out["input_ids"].shape
    for k in BATCH_KEYS:
        if out[k].ndim != 2 or out[k].shape != shape:
            raise ValueError(f"batch[{k!r}] has shape {out[k].shape}; all of {list(BATCH_KEYS)} must be [B, S] "
                             f"like input_ids {shape}")
    return out


def loss_and_grad(model, batch):
    """Mean token cross-entropy and its gradient w.r.t. every parameter (one jit, resident).

    Args:
      model: a ``Model``.
      batch: dict of ``input_ids``, ``attention_mask``, ``labels`` ([B, S]); labels aligned with the
        inputs (shifted inside), -100 where no loss.

    Returns:
      (loss, grads): grads has the structure of ``model.params``.

    Example:
      >>> loss, grads = loss_and_grad(model, {"input_ids": ids, "attention_mask": m, "labels": ids})
    """
    return _loss_and_grad_fn(model.config)(model.params, validate_batch(batch))
