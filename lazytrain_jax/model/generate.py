"""Greedy generation with a KV cache, built from the model's own layer modules.

A layer step runs the same submodules as ``DecoderLayer.__call__`` (norms, projections, q/k norm,
RoPE, MLP) and attends over a cache instead of the full sequence, so generated tokens equal the
argmax of ``lt.forward`` on the growing sequence. Prompts are left-padded to one length; positions
count real tokens only, so a prompt's positions do not depend on its padding.

Shape legend: B batch, P prompt length, Q query positions of a call (P in prefill, 1 in decode),
T cache length (P + max_new_tokens), D hidden, H query heads, K kv heads, G = H // K, E head_dim.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from lazytrain_jax.model.config import ModelConfig
from lazytrain_jax.model.layers import MASK_VALUE
from lazytrain_jax.model.rope import apply_rope, rope_cos_sin
from lazytrain_jax.model.units import get_units


def attend_cached(q_BxQxHxE, k_BxTxKxE, v_BxTxKxE, key_mask_BxQxT):
    """Grouped-query attention of Q queries over a T-slot cache (``attend``'s numerics: fp32 scores,
    the fp32 minimum added to masked scores)."""
    B, Q, H, E = q_BxQxHxE.shape
    K = k_BxTxKxE.shape[2]
    q_BxQxKxGxE = q_BxQxHxE.reshape(B, Q, K, H // K, E)
    scores_BxKxGxQxT = jnp.einsum("bqkge,bske->bkgqs", q_BxQxKxGxE, k_BxTxKxE,
                                  preferred_element_type=jnp.float32) * (E ** -0.5)
    scores_BxKxGxQxT = scores_BxKxGxQxT + jnp.where(key_mask_BxQxT, 0.0, MASK_VALUE)[:, None, None]
    probs_BxKxGxQxT = jax.nn.softmax(scores_BxKxGxQxT, axis=-1).astype(v_BxTxKxE.dtype)
    out_BxQxKxGxE = jnp.einsum("bkgqs,bske->bqkge", probs_BxKxGxQxT, v_BxTxKxE)
    return out_BxQxKxGxE.reshape(B, Q, H, E)


def layer_step(layer, h_BxQxD, positions_BxQ, k_BxTxKxE, v_BxTxKxE, key_mask_BxQxT, start):
    """One decoder layer over Q new positions written into the cache at ``start``."""
    cfg, attn = layer.cfg, layer.self_attn
    B, Q, _ = h_BxQxD.shape
    H, K, E = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x_BxQxD = layer.input_layernorm(h_BxQxD)
    q_BxQxHxE = attn.q_proj(x_BxQxD).reshape(B, Q, H, E)
    k_BxQxKxE = attn.k_proj(x_BxQxD).reshape(B, Q, K, E)
    v_BxQxKxE = attn.v_proj(x_BxQxD).reshape(B, Q, K, E)
    if attn.q_norm is not None:
        q_BxQxHxE = attn.q_norm(q_BxQxHxE)
        k_BxQxKxE = attn.k_norm(k_BxQxKxE)
    cos_BxQxE, sin_BxQxE = rope_cos_sin(cfg, positions_BxQ, h_BxQxD.dtype)
    q_BxQxHxE = apply_rope(q_BxQxHxE, cos_BxQxE, sin_BxQxE)
    k_BxQxKxE = apply_rope(k_BxQxKxE, cos_BxQxE, sin_BxQxE)
    k_BxTxKxE = jax.lax.dynamic_update_slice(k_BxTxKxE, k_BxQxKxE.astype(k_BxTxKxE.dtype), (0, start, 0, 0))
    v_BxTxKxE = jax.lax.dynamic_update_slice(v_BxTxKxE, v_BxQxKxE.astype(v_BxTxKxE.dtype), (0, start, 0, 0))
    out_BxQxHxE = attend_cached(q_BxQxHxE, k_BxTxKxE, v_BxTxKxE, key_mask_BxQxT)
    h_BxQxD = h_BxQxD + attn.o_proj(out_BxQxHxE.reshape(B, Q, H * E))
    h_BxQxD = h_BxQxD + layer.mlp(layer.post_attention_layernorm(h_BxQxD))
    return h_BxQxD, k_BxTxKxE, v_BxTxKxE


def layer_kv_step(cfg: ModelConfig, kind: str):
    """``fn(layer_params, h_BxQxD, positions_BxQ, k_BxTxKxE, v_BxTxKxE, key_mask_BxQxT, start) -> (h, k, v)``:
    :func:`layer_step` as a pure function of one layer's parameters (the streamed decoder jits it once
    per kind; the resident step calls it for every layer)."""
    layer_def = get_units(cfg).layer_defs[kind]

    def fn(layer_params, h_BxQxD, positions_BxQ, k_BxTxKxE, v_BxTxKxE, key_mask_BxQxT, start):
        return layer_step(nnx.merge(layer_def, layer_params), h_BxQxD, positions_BxQ, k_BxTxKxE, v_BxTxKxE,
                          key_mask_BxQxT, start)

    return fn


def last_logits(cfg: ModelConfig, head_params, tied_weight_VxD, h_BxQxD):
    """fp32 logits ``[B, V]`` of the last position (the next token's)."""
    return get_units(cfg).head_logits(head_params, tied_weight_VxD, h_BxQxD[:, -1:])[:, 0]


def tied_weight(cfg: ModelConfig, params):
    """The embedding table the head reuses, or None when the head has its own weight."""
    return params["embed"]["embed_tokens"]["weight"] if cfg.tie_word_embeddings else None


@functools.lru_cache(maxsize=16)
def _step_fn(cfg: ModelConfig):
    units = get_units(cfg)
    layer_fns = {kind: layer_kv_step(cfg, kind) for kind in set(cfg.layer_kinds)}

    def step(params, ids_BxQ, positions_BxQ, caches, key_mask_BxQxT, start):
        h_BxQxD = units.embed(params["embed"], ids_BxQ)
        new_caches = []
        for kind, layer_params, (k_cache, v_cache) in zip(cfg.layer_kinds, params["layers"], caches):
            h_BxQxD, k_cache, v_cache = layer_fns[kind](layer_params, h_BxQxD, positions_BxQ, k_cache, v_cache,
                                                        key_mask_BxQxT, start)
            new_caches.append((k_cache, v_cache))
        return last_logits(cfg, params["head"], tied_weight(cfg, params), h_BxQxD), new_caches

    return jax.jit(step, donate_argnums=(3,))


class ResidentDecoder:
    """Every weight on the device at once; one jitted step runs all layers (prefill or one decode step).

    A decoder is called as ``decoder(ids_BxQ, positions_BxQ, caches, key_mask_BxQxT, start) ->
    (logits_BxV, caches)``; ``decoder.init_cache(num_rows, T)`` gives the empty per-layer (k, v) caches.
    The layer-streamed one is ``lazytrain_jax.executor.generate.StreamedDecoder``.
    """

    def __init__(self, model, params=None):
        self.config = model.config
        self.params = jax.device_put(model.params) if params is None else params
        self.dtype = jax.tree.leaves(self.params)[0].dtype

    def init_cache(self, num_rows: int, T: int):
        shape = (num_rows, T, self.config.num_kv_heads, self.config.head_dim)
        return [(jnp.zeros(shape, self.dtype), jnp.zeros(shape, self.dtype)) for _ in range(self.config.num_layers)]

    def __call__(self, ids_BxQ, positions_BxQ, caches, key_mask_BxQxT, start):
        return _step_fn(self.config)(self.params, ids_BxQ, positions_BxQ, caches, key_mask_BxQxT, start)


def _left_pad(prompts: Sequence[Sequence[int]], length: int, pad_id: int):
    ids = np.full((len(prompts), length), pad_id, np.int32)
    mask = np.zeros((len(prompts), length), np.int32)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, length - len(p):] = p
            mask[i, length - len(p):] = 1
    return ids, mask


def generate_batch(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_token_ids: Sequence[int],
                   pad_token_id: int = 0, decoder=None, prompt_length: int | None = None,
                   return_logits: bool = False):
    """Greedy continuation of one batch of prompts (left-padded to the longest).

    ``decoder`` runs the model (default: a ``ResidentDecoder`` of ``model``); this function owns the
    masks, positions, the greedy choice and stopping, whichever decoder runs the layers.

    Returns:
      A list of generated token lists (up to and excluding the first EOS); with ``return_logits`` also
      the ``[B, num_steps, V]`` logits of every step (for checks against ``lt.forward``).
    """
    num_rows = len(prompts)
    P = max(1, max(len(p) for p in prompts), prompt_length or 0)
    T = P + max_new_tokens
    ids_BxP, mask_BxP = _left_pad(prompts, P, pad_token_id)
    positions_BxP = np.maximum(np.cumsum(mask_BxP, axis=1) - 1, 0).astype(np.int32)
    step = ResidentDecoder(model) if decoder is None else decoder
    caches = step.init_cache(num_rows, T)
    valid_BxT = np.concatenate([mask_BxP, np.ones((num_rows, max_new_tokens), np.int32)], axis=1) != 0
    causal_PxT = np.arange(T)[None, :] <= np.arange(P)[:, None]
    logits_BxV, caches = step(ids_BxP, positions_BxP, caches, valid_BxT[:, None, :] & causal_PxT[None],
                              np.int32(0))
    eos = np.asarray(list(eos_token_ids), np.int64)
    next_positions_B = mask_BxP.sum(axis=1).astype(np.int32)
    out = [[] for _ in range(num_rows)]
    done = np.zeros(num_rows, bool)
    all_logits = []
    for t in range(max_new_tokens):
        logits = np.asarray(logits_BxV)
        if return_logits:
            all_logits.append(logits)
        token_B = logits.argmax(axis=-1)
        for i in np.flatnonzero(~done):
            if np.isin(token_B[i], eos):
                done[i] = True
            else:
                out[i].append(int(token_B[i]))
        if done.all() or t == max_new_tokens - 1:
            break
        key_mask_Bx1xT = (valid_BxT & (np.arange(T) <= P + t)[None])[:, None, :]
        logits_BxV, caches = step(token_B.astype(np.int32)[:, None], (next_positions_B + t)[:, None],
                                  caches, key_mask_Bx1xT, np.int32(P + t))
    if return_logits:
        return out, np.stack(all_logits, axis=1)
    return out


def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, eos_token_ids: Sequence[int],
             pad_token_id: int = 0, batch_size: int = 64, decoder=None) -> list[list[int]]:
    """Greedy generation with a KV cache for any number of prompts.

    Prompts are processed ``batch_size`` at a time, all left-padded to the longest prompt overall
    (the last batch is filled with copies of its first prompt), so every batch has one shape and
    the two jitted steps (prefill, decode) compile once.

    Args:
      model: a Model (host params are put on the device once).
      prompts: token id lists.
      max_new_tokens: the most tokens generated per prompt.
      eos_token_ids: generation of a row stops at any of these (not included in the output).
      pad_token_id: id used for left padding (masked out).
      batch_size: prompts per batch.
      decoder: what runs the layers: default a ``ResidentDecoder`` (every weight put on the device
        once); ``lazytrain_jax.executor.generate.StreamedDecoder`` streams them per step instead.

    Returns:
      One list of generated ids per prompt.

    Example:
      >>> out = generate(model, [[5, 6, 7]], max_new_tokens=8, eos_token_ids=[0])
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be a positive integer")
    if not prompts:
        return []
    length = max(1, max(len(p) for p in prompts))
    decoder = ResidentDecoder(model) if decoder is None else decoder
    results = []
    for i in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[i:i + batch_size]]
        num_real = len(chunk)
        chunk += [chunk[0]] * (min(batch_size, len(prompts)) - num_real)
        out = generate_batch(model, chunk, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids,
                             pad_token_id=pad_token_id, decoder=decoder, prompt_length=length)
        results.extend(out[:num_real])
    return results
