"""The streaming units of a model as pure, jit-able functions of one unit's parameters.

``get_units(config)`` builds (once per config) the GraphDef of each unit kind with ``nnx.eval_shape``
and exposes pure functions ``embed``, ``layer(kind)``, ``head_loss`` and ``head_logits``. All layers of
a kind share one GraphDef, so ``jax.jit`` of ``layer(kind)`` compiles once per kind and shape, never
once per layer. The functions take parameters as nested dicts of arrays (Hugging Face names).

Shape legend: B batch, S sequence, D hidden, V vocab, T tokens, N chunks, C tokens per chunk.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from lazytrain_jax.model.config import LOSS_CHUNK_BYTES, ModelConfig, loss_chunk_tokens  # noqa: F401
from lazytrain_jax.model import hybrid_layers
from lazytrain_jax.model.layers import DecoderLayer, Embed, Head
from lazytrain_jax.model.qwen35_config import is_hybrid

IGNORE_INDEX = -100
LAYER_MODULES = {"decoder": DecoderLayer, **hybrid_layers.LAYER_MODULES}


def shift_labels(labels_BxS):
    """transformers' causal-LM convention: position s predicts labels[s + 1]; the last predicts nothing."""
    pad_Bx1 = jnp.full((labels_BxS.shape[0], 1), IGNORE_INDEX, labels_BxS.dtype)
    return jnp.concatenate([labels_BxS[:, 1:], pad_Bx1], axis=1)


def default_positions(input_ids_BxS):
    B, S = input_ids_BxS.shape
    return jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))


@dataclasses.dataclass(frozen=True)
class ModelUnits:
    """GraphDefs and pure functions of every unit of one ModelConfig."""

    config: ModelConfig
    embed_def: Any
    head_def: Any
    layer_defs: dict[str, Any]

    def abstract_params(self, unit: str) -> dict:
        """Shapes/dtypes (ShapeDtypeStruct tree) of ``"embed"``, ``"head"`` or a layer kind's params."""
        return jax.tree.map(lambda x: x, _abstract(self.config, unit)[1])  # a fresh dict per call

    def embed(self, params, input_ids_BxS):
        return nnx.merge(self.embed_def, params)(input_ids_BxS)

    def layer(self, kind: str) -> Callable:
        """``fn(params, h_BxSxD, positions_BxS, attention_mask_BxS) -> h_BxSxD`` for layers of ``kind``.

        The same function object is returned for every call with the same config and kind, so a
        ``jax.jit`` of it (or a jit cache keyed on it) compiles once per kind and shape.
        """
        if kind not in self.layer_defs:
            raise ValueError(f"kind={kind!r} is not a layer kind of this model; valid: {sorted(self.layer_defs)}")
        return _layer_fn(self.config, kind)

    def layer_forward_with_residuals(self, kind: str) -> Callable:
        """``fn(params, h_BxSxD, positions_BxS, attention_mask_BxS) -> (h_out_BxSxD, residuals)``.

        ``residuals`` is the list of arrays ``jax.vjp`` keeps for the layer's backward, *without*
        the layer's own parameter arrays (the backward receives them again, so a kept layer's
        weights need not stay on the device between its forward and its backward). Pair with
        :meth:`layer_backward_from_residuals`. One function per (config, kind).
        """
        self.layer(kind)
        return _residual_fns(self.config, kind)[0]

    def layer_backward_from_residuals(self, kind: str) -> Callable:
        """``fn(params, residuals, g_out_BxSxD) -> (g_params, g_h_BxSxD)`` (see above)."""
        self.layer(kind)
        return _residual_fns(self.config, kind)[1]

    def layer_backward(self, kind: str) -> Callable:
        """``fn(params, h_BxSxD, positions_BxS, attention_mask_BxS, g_out_BxSxD) -> (g_params, g_h_BxSxD)``:
        the layer's backward with its in-layer forward recomputed from its input."""
        self.layer(kind)
        return _residual_fns(self.config, kind)[2]

    def head_logits(self, params, tied_weight_VxD, h_BxSxD):
        """Full fp32 logits [B, S, V] (reference path only; training uses ``head_loss``)."""
        head = nnx.merge(self.head_def, params)
        x_BxSxD = head.norm(h_BxSxD)
        w_VxD = head.logits_weight(tied_weight_VxD)
        return jnp.einsum("bsd,vd->bsv", x_BxSxD, w_VxD.astype(x_BxSxD.dtype),
                          preferred_element_type=jnp.float32)

    def head_loss(self, params, tied_weight_VxD, h_BxSxD, labels_BxS, chunk_tokens: int | None = None):
        """Summed token cross-entropy and the number of counted tokens, chunked over tokens.

        Labels are aligned with the inputs and shifted here (transformers' convention); -100 is
        ignored. Each chunk's logits are recomputed in the backward pass (``jax.checkpoint``), so at
        most one chunk of ``[C, V]`` fp32 logits exists at a time.

        Returns:
          (loss_sum, num_tokens): fp32 scalars; the mean loss is their ratio.
        """
        head = nnx.merge(self.head_def, params)
        B, S, D = h_BxSxD.shape
        T = B * S
        x_TxD = head.norm(h_BxSxD).reshape(T, D)
        w_VxD = head.logits_weight(tied_weight_VxD).astype(x_TxD.dtype)
        t_T = shift_labels(labels_BxS).reshape(T)
        C = chunk_tokens or loss_chunk_tokens(w_VxD.shape[0], T)
        N = -(-T // C)
        x_NxCxD = jnp.pad(x_TxD, ((0, N * C - T), (0, 0))).reshape(N, C, D)
        t_NxC = jnp.pad(t_T, (0, N * C - T), constant_values=IGNORE_INDEX).reshape(N, C)

        @jax.checkpoint
        def chunk_loss(x_CxD, t_C):
            logits_CxV = jnp.einsum("cd,vd->cv", x_CxD, w_VxD, preferred_element_type=jnp.float32)
            lse_C = jax.nn.logsumexp(logits_CxV, axis=-1)
            picked_C = jnp.take_along_axis(logits_CxV, jnp.maximum(t_C, 0)[:, None], axis=-1)[:, 0]
            return jnp.sum(jnp.where(t_C != IGNORE_INDEX, lse_C - picked_C, 0.0))

        def body(total, xs):
            return total + chunk_loss(*xs), None

        loss_sum, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (x_NxCxD, t_NxC))
        return loss_sum, jnp.sum(t_T != IGNORE_INDEX).astype(jnp.float32)


@functools.lru_cache(maxsize=256)
def _layer_fn(cfg: ModelConfig, kind: str) -> Callable:
    graphdef = _abstract(cfg, kind)[0]

    def layer_fn(params, h_BxSxD, positions_BxS, attention_mask_BxS):
        return nnx.merge(graphdef, params)(h_BxSxD, positions_BxS, attention_mask_BxS)

    layer_fn.__name__ = f"layer_{kind}"
    return layer_fn


def _signature(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)


@functools.lru_cache(maxsize=64)
def _residual_fns(cfg: ModelConfig, kind: str):
    """Forward-with-residuals, backward-from-residuals and recompute-backward of one layer kind.

    The vjp's pytree structure (its treedef, and which of its leaves are the layer's own parameter
    arrays) is recorded when the forward is traced, keyed by the input signature; the backward
    rebuilds the vjp from it with the parameters it is given.
    """
    layer_fn = _layer_fn(cfg, kind)
    structures: dict = {}

    def forward(params, h_BxSxD, positions_BxS, attention_mask_BxS):
        out_BxSxD, vjp_fn = jax.vjp(lambda p, h: layer_fn(p, h, positions_BxS, attention_mask_BxS), params, h_BxSxD)
        leaves, treedef = jax.tree.flatten(vjp_fn)
        param_index = {id(x): i for i, x in enumerate(jax.tree.leaves(params))}
        slots = tuple(param_index.get(id(leaf)) for leaf in leaves)
        structures[_signature((params, h_BxSxD))] = (treedef, slots)
        return out_BxSxD, [leaf for leaf, slot in zip(leaves, slots) if slot is None]

    def backward_from_residuals(params, residuals, g_out_BxSxD):
        key = _signature((params, g_out_BxSxD))
        if key not in structures:
            raise ValueError(f"no forward of layer kind {kind!r} was traced for these shapes; run "
                             "layer_forward_with_residuals first")
        treedef, slots = structures[key]
        param_leaves = jax.tree.leaves(params)
        it = iter(residuals)
        leaves = [next(it) if slot is None else param_leaves[slot] for slot in slots]
        return treedef.unflatten(leaves)(g_out_BxSxD)

    def backward(params, h_BxSxD, positions_BxS, attention_mask_BxS, g_out_BxSxD):
        _, vjp_fn = jax.vjp(lambda p, h: layer_fn(p, h, positions_BxS, attention_mask_BxS), params, h_BxSxD)
        return vjp_fn(g_out_BxSxD)

    return forward, backward_from_residuals, backward


@functools.lru_cache(maxsize=256)
def _abstract(cfg: ModelConfig, unit: str):
    head = hybrid_layers.HybridHead if is_hybrid(cfg) else Head
    ctor = {"embed": Embed, "head": head}.get(unit) or LAYER_MODULES.get(unit)
    if ctor is None:
        raise ValueError(f"unit={unit!r} is not a unit kind; valid: ['embed', 'head', {', '.join(map(repr, LAYER_MODULES))}]")
    module = nnx.eval_shape(lambda: ctor(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(module)
    return graphdef, nnx.to_pure_dict(state)


@functools.lru_cache(maxsize=64)
def jitted_layer(cfg: ModelConfig, kind: str) -> Callable:
    """``jax.jit`` of ``get_units(cfg).layer(kind)``, one object per (config, kind): the resident
    reference and the streaming engine share it (one trace per kind and shape)."""
    return jax.jit(get_units(cfg).layer(kind))


@functools.lru_cache(maxsize=64)
def get_units(cfg: ModelConfig) -> ModelUnits:
    """The (cached) units of ``cfg``."""
    kinds = sorted(set(cfg.layer_kinds))
    return ModelUnits(config=cfg, embed_def=_abstract(cfg, "embed")[0], head_def=_abstract(cfg, "head")[0],
                      layer_defs={k: _abstract(cfg, k)[0] for k in kinds})
