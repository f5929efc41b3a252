"""The resident reference path: all units in one jit. Every streamed schedule is checked against it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.model import batch as batch_checks
from lazytrain_jax.model.batch import BATCH_KEYS
from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.units import default_positions, get_units, jitted_layer


def _hidden(cfg: ModelConfig, params, input_ids_BxS, attention_mask_BxS, positions_BxS):
    units = get_units(cfg)
    h_BxSxD = units.embed(params["embed"], input_ids_BxS)
    for kind, layer_params in zip(cfg.layer_kinds, params["layers"]):
        h_BxSxD = jitted_layer(cfg, kind)(layer_params, h_BxSxD, positions_BxS, attention_mask_BxS)
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


def _traced(*values) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def forward(model, input_ids, attention_mask=None, position_ids=None):
    """Logits ``[B, S, V]`` (fp32) of the whole model in one jit (resident; reference path).

    Args:
      model: a ``Model``.
      input_ids: int array ``[B, S]``, ids in ``[0, vocab_size)`` (checked on the host).
      attention_mask: ``[B, S]``, 1 for tokens and 0 for padding (default: all ones).
        Concrete inputs are validated (``model/batch.py``); traced ones are not.
      position_ids: ``[B, S]`` (default ``arange(S)`` per row, as transformers' forward does).

    Example:
      >>> logits = forward(model, np.array([[1, 2, 3]]))
    """
    if _traced(input_ids, attention_mask):  # inside a trace: shapes only (values are not known)
        input_ids = jnp.asarray(input_ids, jnp.int32)
        mask = jnp.ones_like(input_ids) if attention_mask is None else jnp.asarray(attention_mask, jnp.int32)
    else:
        input_ids = batch_checks.check_token_ids("input_ids", input_ids, model.config.vocab_size)
        mask = (np.ones_like(input_ids) if attention_mask is None
                else batch_checks.check_attention_mask(attention_mask, input_ids.shape))
    if mask.shape != input_ids.shape or input_ids.ndim != 2:
        raise ValueError(f"input_ids shape {input_ids.shape} must be [batch, seq] and attention_mask shape "
                         f"{mask.shape} must equal it")
    if position_ids is not None and np.shape(position_ids) != input_ids.shape:
        raise ValueError(f"position_ids shape {np.shape(position_ids)} must equal input_ids shape {input_ids.shape}")
    positions = default_positions(input_ids) if position_ids is None else jnp.asarray(position_ids, jnp.int32)
    return _forward_fn(model.config)(model.params, input_ids, mask, positions)


def loss_and_grad(model, batch):
    """Mean token cross-entropy and its gradient w.r.t. every parameter (one jit, resident).

    Args:
      model: a ``Model``.
      batch: dict of ``input_ids``, ``attention_mask``, ``labels`` ([B, S]); labels aligned with the
        inputs (shifted inside), -100 where no loss. Concrete batches are validated on the host
        (``model.batch.validate_batch``: ids, labels, mask, at least one counted token); traced
        batches are not.

    Returns:
      (loss, grads): grads has the structure of ``model.params``.

    Example:
      >>> loss, grads = loss_and_grad(model, {"input_ids": ids, "attention_mask": m, "labels": ids})
    """
    if _traced(batch):  # inside a trace: the values cannot be checked here
        batch = {k: jnp.asarray(batch[k], jnp.int32) for k in BATCH_KEYS}
    else:
        batch = batch_checks.validate_batch(batch, model.config.vocab_size)
    return _loss_and_grad_fn(model.config)(model.params, batch)
