"""Layer-streamed greedy generation: for models whose weights do not fit the device at once.

Each call of a :class:`StreamedDecoder` (the prefill, then one per decode step) runs the whole eval
batch through the layers one at a time: a layer's weights are uploaded from the host (the next
layer's upload is issued before the current layer runs, so at most two layers' weights are on the
device), the layer runs ``model.generate.layer_kv_step`` (the resident decoder's own per-layer step,
jitted once per layer kind) and its buffers are released. So every weight crosses once per decode
step for the batch, never once per prompt. The embedding rows are gathered on the host and only the
``[B, Q, D]`` rows go up; the head's weights (and a tied embedding table) are uploaded like a layer.

The KV cache stays on the device when it fits beside two layers' weights (``kv_cache="device"``);
otherwise it stays on the host and each layer's ``(k, v)`` goes up before the layer and comes back
after it (``kv_cache="host"``: twice the layer's cache crosses per step). :func:`choose_decoder`
picks resident / streamed with device cache / streamed with host cache from :func:`generation_bytes`.

Shape legend: B batch rows, P prompt length, Q query positions of a call, T cache length, D hidden,
H query heads, K kv heads, E head_dim, I intermediate size, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.model.generate import ResidentDecoder, last_logits, layer_kv_step, tied_weight
from lazytrain_jax.model.units import get_units

KV_CACHE_PLACES = ("device", "host")


def _nbytes(tree) -> int:
    return int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)))


@functools.lru_cache(maxsize=32)
def _layer_jit(cfg, kind: str):
    return jax.jit(layer_kv_step(cfg, kind), donate_argnums=(3, 4))


@functools.lru_cache(maxsize=16)
def _head_jit(cfg):
    return jax.jit(functools.partial(last_logits, cfg))


@functools.lru_cache(maxsize=16)
def _embed_jit(cfg):
    return jax.jit(get_units(cfg).embed)


class StreamedDecoder:
    """Runs a model's decode steps layer by layer, uploading each layer's weights once per call.

    Args:
      model: a Model (host parameters, e.g. the engine's fp32 master copy).
      kv_cache: ``"device"`` or ``"host"`` (see the module docstring).
      device: where layers run (default: the first device).

    Attributes:
      num_calls, uploaded_weight_bytes: counters (weights crossed so far), for checks and logs.

    Example:
      >>> out = generate(model, prompts, max_new_tokens=32, eos_token_ids=[2], decoder=StreamedDecoder(model))
    """

    def __init__(self, model, *, kv_cache: str = "device", device=None):
        if kv_cache not in KV_CACHE_PLACES:
            raise ValueError(f"kv_cache={kv_cache!r} is not valid; valid: {list(KV_CACHE_PLACES)}")
        self.config, self.kv_cache = model.config, kv_cache
        self.device = device or jax.devices()[0]
        host = jax.devices("cpu")[0]
        params = model.params
        self.dtype = jnp.dtype(jax.tree.leaves(params)[0].dtype)
        self._embed_host = jax.device_put(params["embed"], host)      # gathered on the host, rows go up
        self._layers = params["layers"]
        self._head = (params["head"], tied_weight(self.config, params))
        self.num_calls, self.uploaded_weight_bytes = 0, 0

    def init_cache(self, num_rows: int, T: int):
        shape = (num_rows, T, self.config.num_kv_heads, self.config.head_dim)
        if self.kv_cache == "host":
            return [(np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)) for _ in range(self.config.num_layers)]
        return [jax.device_put((np.zeros(shape, self.dtype), np.zeros(shape, self.dtype)), self.device)
                for _ in range(self.config.num_layers)]

    def _upload(self, tree):
        self.uploaded_weight_bytes += _nbytes(tree)
        return jax.device_put(tree, self.device)

    def __call__(self, ids_BxQ, positions_BxQ, caches, key_mask_BxQxT, start):
        cfg = self.config
        self.num_calls += 1
        h_BxQxD = jax.device_put(_embed_jit(cfg)(self._embed_host, ids_BxQ), self.device)
        positions_BxQ, key_mask_BxQxT = jax.device_put((positions_BxQ, key_mask_BxQxT), self.device)
        start = jnp.asarray(start, jnp.int32)
        nxt = self._upload(self._layers[0])
        new_caches = []
        for i, kind in enumerate(cfg.layer_kinds):
            weights, nxt = nxt, (self._upload(self._layers[i + 1]) if i + 1 < cfg.num_layers else None)
            k_cache, v_cache = caches[i]
            if self.kv_cache == "host":
                k_cache, v_cache = jax.device_put((k_cache, v_cache), self.device)
            h_BxQxD, k_cache, v_cache = _layer_jit(cfg, kind)(weights, h_BxQxD, positions_BxQ, k_cache, v_cache,
                                                              key_mask_BxQxT, start)
            del weights                                                   # at most two layers stay uploaded
            if self.kv_cache == "host":
                k_cache, v_cache = np.asarray(k_cache), np.asarray(v_cache)
            new_caches.append((k_cache, v_cache))
        head_params, tied = self._upload(self._head)
        return _head_jit(cfg)(head_params, tied, h_BxQxD), new_caches


@dataclasses.dataclass(frozen=True)
class GenerationBytes:
    """Device bytes of greedy generation for one batch shape (an estimate; see :func:`generation_bytes`)."""

    weights: int        # every unit's parameters (the resident decoder uploads them all)
    largest_unit: int   # the largest layer, or the head with a tied table (two are in flight when streaming)
    kv_cache: int       # k and v of every layer, [B, T, K, E] each
    kv_layer: int       # one layer's k and v
    working: int        # the prefill's largest transient: activations, fp32 scores and probs, fp32 logits

    def resident(self) -> int:
        return self.weights + self.kv_cache + self.working

    def streamed(self, kv_cache: str) -> int:
        kv = self.kv_cache if kv_cache == "device" else 2 * self.kv_layer
        return 2 * self.largest_unit + kv + self.working


def generation_bytes(model, num_rows: int, prompt_len: int, max_new_tokens: int) -> GenerationBytes:
    """Device bytes of generating ``max_new_tokens`` for ``num_rows`` prompts of length ``prompt_len``.

    Weights and caches are exact (the parameters' own bytes; the caches' shapes); the working set is
    a model of the prefill's transients: the layer's [B, P, .] activations (hidden, q/k/v, two MLP
    intermediates), attention scores and probabilities over the cache in fp32 ([B, H, P, T]) and the
    head's fp32 logits of the last position ([B, V]).

    Example:
      >>> generation_bytes(model, 64, 40, 32).streamed("device")
    """
    cfg, params = model.config, model.params
    itemsize = jnp.dtype(jax.tree.leaves(params)[0].dtype).itemsize
    T = prompt_len + max_new_tokens
    layers = [_nbytes(p) for p in params["layers"]]
    head = _nbytes(params["head"]) + (_nbytes(params["embed"]) if cfg.tie_word_embeddings else 0)
    kv_layer = 2 * num_rows * T * cfg.num_kv_heads * cfg.head_dim * itemsize
    width = 2 * cfg.hidden_size + (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim + 2 * cfg.intermediate_size
    working = (num_rows * prompt_len * width * itemsize + 2 * num_rows * cfg.num_heads * prompt_len * T * 4
               + num_rows * cfg.vocab_size * 4)
    return GenerationBytes(weights=_nbytes(params), largest_unit=max(layers + [head]),
                           kv_cache=cfg.num_layers * kv_layer, kv_layer=kv_layer, working=working)


def choose_decoder(model, *, device_memory: float | None, num_rows: int, prompt_len: int, max_new_tokens: int):
    """The decoder and batch size for generation under ``device_memory`` bytes (None: no limit, resident).

    For ``num_rows`` prompts per batch, then half as many, and so on down to one: resident when
    weights, cache and working set fit; else layer-streamed with the KV cache on the device; else
    streamed with the cache on the host. Raises ValueError when not even one prompt fits.

    Returns:
      (decoder, description, rows) -- e.g. ``(StreamedDecoder(...), "streamed, KV cache on device", 64)``.

    Example:
      >>> decoder, how, rows = choose_decoder(model, device_memory=2e9, num_rows=64, prompt_len=40,
      ...                                     max_new_tokens=32)
    """
    if device_memory is None:
        return ResidentDecoder(model), "resident", num_rows
    if not isinstance(device_memory, (int, float)) or isinstance(device_memory, bool) or not device_memory > 0:
        raise ValueError(f"device_memory={device_memory!r} must be a number of bytes > 0")
    rows = num_rows
    while True:
        need = generation_bytes(model, rows, prompt_len, max_new_tokens)
        if need.resident() <= device_memory:
            return ResidentDecoder(model), "resident", rows
        for place in KV_CACHE_PLACES:
            if need.streamed(place) <= device_memory:
                return StreamedDecoder(model, kv_cache=place), f"streamed, KV cache on {place}", rows
        if rows == 1:
            raise ValueError(f"generation does not fit device_memory={device_memory:.4g} bytes even for one prompt, "
                             f"layer-streamed with the KV cache on the host: it needs {need.streamed('host'):.4g} "
                             f"(two units of {need.largest_unit} bytes, one layer's cache {need.kv_layer}, "
                             f"working set {need.working})")
        rows = max(1, rows // 2)
