"""Costs measured on the live backend: the real units' bytes and times at the run's shapes.

``unit_costs`` builds a ``Costs`` whose every byte figure comes from the arrays the streaming
engine really holds (``jax.eval_shape`` of each unit at the stream dtype: the streamed weights, the
boundary activations, the ``jax.vjp`` residuals the engine keeps) and whose times are measured
(``profile``) or analytic. ``profile`` also measures the host link, the NVMe directory and the host
optimizer rate, so ``lt.plan(model, hardware="measure", ...)`` plans for the machine it runs on.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from lazytrain_jax.executor import links
from lazytrain_jax.model.units import get_units
from lazytrain_jax.schedule.costs import Costs, config_fingerprint

STREAM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@functools.lru_cache(maxsize=64)
def residual_bytes(cfg, kind: str, micro_batch: int, seq_len: int, stream_dtype: str) -> int:
    """Bytes of the residuals ``layer_forward_with_residuals`` keeps for one micro-batch."""
    from lazytrain_jax.model.unit_bytes import layer_bytes
    return layer_bytes(cfg, kind, micro_batch_size=micro_batch, seq_len=seq_len, stream_dtype=stream_dtype,
                       workspace="none").residual


def default_grad_dtype(stream_dtype: str) -> str:
    """The dtype gradients go down to the host in for a run streaming ``stream_dtype`` (fp32 for
    fp32 streaming, else bfloat16): the Costs' ``grad_dtype`` and what the profiler's probes use."""
    return "float32" if stream_dtype == "float32" else "bfloat16"


def unit_costs(model_or_config, *, batch_size: int, seq_len: int, num_micro_batches: int = 1,
               stream_dtype: str = "bfloat16", grad_dtype: str | None = None, device_flops: float = 1e12) -> Costs:
    """``analytic_costs`` at the stream dtype with every layer's residual bytes read off the real unit.

    The analytic byte rules follow the units (``tests/model/test_unit_bytes.py`` holds them
    together); the residuals the engine keeps are taken from ``jax.eval_shape`` here so that the
    engine's ledger and the plan agree to the byte.

    Args:
      model_or_config: a Model or ModelConfig.
      batch_size, seq_len, num_micro_batches: the step.
      stream_dtype: dtype of streamed weights and activations.
      grad_dtype: dtype of gradients sent to the host (default: ``float32`` for fp32 streaming,
        else ``bfloat16``).
      device_flops: for the analytic times.
    Returns:
      Costs.
    Example:
      >>> costs = unit_costs(model, batch_size=4, seq_len=64, stream_dtype="float32")
    """
    from lazytrain_jax.schedule.costs import analytic_costs
    cfg = getattr(model_or_config, "config", model_or_config)
    if stream_dtype not in STREAM_BYTES:
        raise ValueError(f"stream_dtype={stream_dtype!r}; valid: {sorted(STREAM_BYTES)}")
    grad_dtype = grad_dtype or default_grad_dtype(stream_dtype)
    costs = analytic_costs(cfg, batch_size=batch_size, seq_len=seq_len, device_flops=device_flops,
                           num_micro_batches=num_micro_batches, grad_dtype=grad_dtype, stream_dtype=stream_dtype)
    micro = batch_size // num_micro_batches
    residual = tuple(float(residual_bytes(cfg, k, micro, seq_len, stream_dtype) * num_micro_batches)
                     for k in cfg.layer_kinds)
    return dataclasses.replace(costs, residual_bytes=residual)


# ---- measurement ------------------------------------------------------------------------------

_RATES_CACHE: dict = {}
_COSTS_CACHE: dict = {}


# Untimed rounds before the profiler's timed ones. On the CPU backend a process's first calls run
# slow for several rounds while the host allocator grows into its working set, not only the first:
# streaming_cpu.py's layer (hidden 1024, batch 2 x 256, fp32), 15 rounds after one warm-up, backward
# 180 156 165 176 174 138 137 136 132 135 ... ms. With one warm-up and a median of 3, a process's
# first profile put that backward at 162 ms against 131-135 ms in the profiles after it, and
# predicted 2.96 s for a plan whose profiles after it predicted 2.03-2.06 s (and which measured
# 2.15 s): the plans made from a first profile were made for a slower machine (the excess varies:
# 3-12 % in three other fresh processes; benchmarks/profile_repeat.py).
PROFILE_WARMUP = 6


def interleaved_seconds(fns: dict, repeats: int, warmup: int = 1) -> dict:
    """Wall seconds of each ``fns`` entry (its result blocked on) per round: ``warmup`` untimed
    rounds (the first compiles), then ``repeats`` rounds running every entry once in turn, so a
    change of load hits all of them alike (quantities compared with each other, e.g. a backward
    from kept residuals against one that recomputes, are not measured minutes apart)."""
    for _ in range(max(1, warmup)):
        for fn in fns.values():
            jax.block_until_ready(fn())  # compile / warm up
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - t0)
    return times


def median_seconds_interleaved(fns: dict, repeats: int, warmup: int | None = None) -> dict:
    """The median of each entry's :func:`interleaved_seconds` (``warmup`` untimed rounds first;
    None: ``PROFILE_WARMUP``, read at the call)."""
    warmup = PROFILE_WARMUP if warmup is None else warmup
    return {name: float(np.median(t)) for name, t in interleaved_seconds(fns, repeats, warmup).items()}


def median_seconds(fn, repeats: int, warmup: int | None = None) -> float:
    """Median wall seconds of ``fn()`` (its result blocked on) over ``repeats`` runs after ``warmup``
    untimed ones (None: ``PROFILE_WARMUP``)."""
    return median_seconds_interleaved({"fn": fn}, repeats, warmup)["fn"]


def _measure_layer(cfg, kind, micro: int, seq_len: int, dtype, device, repeats: int):
    from lazytrain_jax.executor.engine import device_fns
    units = get_units(cfg)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda a: jax.device_put((0.02 * rng.standard_normal(a.shape)).astype(dtype), device),
                          units.abstract_params(kind))
    h = jax.device_put(rng.standard_normal((micro, seq_len, cfg.hidden_size)).astype(dtype), device)
    ids = np.zeros((micro, seq_len), np.int32)
    pos = jax.device_put(np.broadcast_to(np.arange(seq_len, dtype=np.int32), (micro, seq_len)).copy(), device)
    mask = jax.device_put(np.ones_like(ids), device)
    fns = device_fns(cfg, kind)
    _, res = fns["forward_res"](params, h, pos, mask)
    t = median_seconds_interleaved({"fwd": lambda: fns["forward"](params, h, pos, mask),
                                    "bwd": lambda: fns["backward_res"](params, res, h),
                                    "bwd_rc": lambda: fns["backward"](params, h, pos, mask, h)}, repeats)
    return t["fwd"], t["bwd"], t["bwd_rc"]


def _measure_head(cfg, micro: int, seq_len: int, dtype, device, repeats: int) -> float:
    from lazytrain_jax.executor.engine import head_fn
    units = get_units(cfg)
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda a: jax.device_put((0.02 * rng.standard_normal(a.shape)).astype(dtype), device),
                          units.abstract_params("head"))
    tied = (jax.device_put((0.02 * rng.standard_normal((cfg.vocab_size, cfg.hidden_size))).astype(dtype), device)
            if cfg.tie_word_embeddings else None)
    h = jax.device_put(rng.standard_normal((micro, seq_len, cfg.hidden_size)).astype(dtype), device)
    labels = jax.device_put(rng.integers(0, cfg.vocab_size, (micro, seq_len)).astype(np.int32), device)
    fn = head_fn(cfg)
    return median_seconds(lambda: fn(params, tied, h, labels, np.float32(1.0)), repeats)


def _measure_link(device, host, probe, repeats: int) -> tuple[float, float]:
    """H2D and D2H bytes/s of ``probe``: a byte count (one flat array) or a tree of arrays, copied
    whole between ``host`` and ``device`` as the engine moves a unit's weights or gradients."""
    from jax.sharding import SingleDeviceSharding
    device = SingleDeviceSharding(device)
    if isinstance(probe, int):
        probe = np.ones(probe // 4, np.float32)
    x = jax.device_put(probe, host)
    d = links.upload(x, device)
    nbytes = sum(a.nbytes for a in jax.tree.leaves(x))
    staging = links.staging(next(iter(device.device_set)))
    h2d = median_seconds(lambda: links.upload(x, device), repeats)  # the engine's paths (links.py)
    d2h = median_seconds(lambda: links.download(d, host, staging, to_host=True), repeats)
    return nbytes / h2d, nbytes / d2h


def _head_arrays(cfg, dtype) -> dict:
    """The head unit's arrays as the engine moves them in ``dtype``: its own parameters and, where
    the head is tied, the embedding table (one large array); its gradient has the same shapes."""
    tree = {"head": jax.tree.map(lambda a: np.full(a.shape, 0.01, dtype), get_units(cfg).abstract_params("head"))}
    if cfg.tie_word_embeddings:
        tree["tied"] = np.full((cfg.vocab_size, cfg.hidden_size), 0.01, dtype)
    return tree


def _measure_disk(directory: str | None, nbytes: int) -> tuple[float, float]:
    from lazytrain_jax.executor.nvme import NvmeStore
    store = NvmeStore(directory, capacity_bytes=2 * nbytes)
    try:
        data = np.ones(nbytes, np.uint8)
        t0 = time.perf_counter()
        store.write("profile", data)
        write = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.read("profile")
        read = time.perf_counter() - t0
    finally:
        store.close()
    return nbytes / read, nbytes / write


def _last_level_cache_bytes(default: int = 64 << 20) -> int:
    """The CPU's largest cache in bytes (Linux sysfs), else ``default``."""
    import glob
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (OSError, ValueError):
            continue
    return max(sizes, default=default)


EVICT_MAX_BYTES = 1 << 30  # the most the optimizer's measurement writes to push its buffers out of the caches


def _cache_evictor(step_bytes: int):
    """A callable that pushes the next update's buffers out of the caches, as a step of
    ``step_bytes`` host optimizer traffic does to each unit's (it writes twice the last-level
    cache, at most ``EVICT_MAX_BYTES``); where that traffic fits the cache, a no-op."""
    cache = _last_level_cache_bytes()
    if step_bytes <= cache:
        return lambda: None
    junk = np.zeros(min(EVICT_MAX_BYTES, 2 * cache) // 8)

    def evict():
        np.add(junk, 1.0, out=junk)
    return evict


def _measure_host_optimizer(cfg, host_sharding, stream_dtype, repeats: int, cold: bool | None = None) -> float:
    """Parameters per second of the per-unit fused 8-bit update on one layer of this model.

    Each timed update starts with its buffers out of the caches where the model's optimizer traffic
    per step exceeds the last-level cache (``_cache_evictor``): in a step the engine updates every
    unit in turn, so a unit's master, moments and gradients were last touched a whole model's
    traffic earlier. Timed with them warm, the update of a 98.6M-parameter
    model's layer (11.3M parameters, 2 cores, a 480 MB last-level cache) took 2.34-2.38 ms per
    million parameters (median of 6), cold 2.71-2.79, and inside the engine's steps 2.77-3.01
    (``benchmarks/host_optimizer_cache.py``). ``cold``: force either way (None: by the traffic)."""
    kind = cfg.layer_kinds[0]
    master = jax.tree.map(lambda a: jax.device_put(np.full(a.shape, 0.01, np.float32), host_sharding),
                          get_units(cfg).abstract_params(kind))
    # per parameter in a step: fp32 master, the gradient (in the dtype it comes down in: the host
    # step reads bf16 as it is), two 8-bit moments, the stream copy
    grad_dtype = jnp.dtype(default_grad_dtype(stream_dtype))
    per_param = 4 + grad_dtype.itemsize + 2 + jnp.dtype(stream_dtype).itemsize
    step_bytes = sum(cfg.layer_num_params(k) for k in cfg.layer_kinds) * per_param
    evict = _cache_evictor(step_bytes if cold is None else (math.inf if cold else 0))
    return _unit_update_rate(master, 1, 1, host_sharding, stream_dtype, repeats, evict, grad_dtype)


def _unit_update_rate(master, u: int, num_layers: int, host_sharding, stream_dtype, repeats: int, evict,
                      grad_dtype=np.float32) -> float:
    """Parameters per second of ``adamw_8bit``'s per-unit update of ``master`` as unit ``u`` of a
    ``num_layers``-layer model, run as the engine runs it (``UnitAdamW8bit.update_unit`` on
    gradients in ``grad_dtype``, the previous copy donated and its buffers reused), ``evict()``
    before each call; the median of ``repeats`` timed calls after two untimed ones."""
    from lazytrain_jax import optim
    from lazytrain_jax.executor import host_optim

    def tree_of(m):
        units = [{}] * (num_layers + 2)
        units[u] = m
        return host_optim.join_units(units, num_layers)

    opt = host_optim.UnitAdamW8bit(optim.hyperparams_of(optim.adamw_8bit(1e-5, max_grad_norm=1.0)),
                                   host_sharding, num_layers, jnp.dtype(stream_dtype))
    grads = jax.tree.map(lambda a: jax.device_put(np.full(a.shape, 1e-3, grad_dtype), host_sharding), master)
    num_params = sum(x.size for x in jax.tree.leaves(master))  # before the first call donates it
    info, hp, _, _ = opt.begin(opt.init(tree_of(master)), 1.0)
    holder = {"m": master, "copy": None}
    # moments are donated by each call; re-reading them from a fresh state keeps shapes, not values.
    # Two untimed calls first: the first has no previous copy to donate, so the second compiles the
    # in-place variant (timed, it made one repeat count a compilation: 6e5 params/s for 3e8)
    seconds = []
    for _ in range(repeats + 2):
        state = opt.init(tree_of(holder["m"]))
        evict()
        t0 = time.perf_counter()
        new, copy, _ = opt.update_unit(state, u, holder["m"], grads, info, hp, holder["copy"])
        jax.block_until_ready(copy)
        seconds.append(time.perf_counter() - t0)
        holder["m"], holder["copy"] = new, copy
    return num_params / float(np.median(seconds[2:]))


FP32_STATE_PROBE_PARAMS = 64 << 20  # elements of the fp32-state update's probe (whole embedding rows)


def _measure_fp32_state_rate(cfg, host_sharding, stream_dtype, repeats: int) -> float:
    """Parameters per second of the per-unit update of a tensor whose Adam state stays fp32 under
    ``adamw_8bit``'s default policy (the embedding's and an LM head's: the native kernel's fp32
    loop where it is built, else the XLA path), timed as the engine runs unit 0 on an embedding of at most
    ``FP32_STATE_PROBE_PARAMS`` elements (whole rows), after two untimed calls, each timed call
    with its buffers out of the caches where the model's optimizer traffic exceeds them."""
    rows = max(1, min(cfg.vocab_size, FP32_STATE_PROBE_PARAMS // cfg.hidden_size))
    master = {"embed_tokens": {"weight": jax.device_put(np.full((rows, cfg.hidden_size), 0.01, np.float32),
                                                        host_sharding)}}
    # out of the caches as in a step, like the layer's timing (_measure_host_optimizer)
    per_param = 4 + 4 + 8 + jnp.dtype(stream_dtype).itemsize  # master, gradient, two fp32 moments, copy
    evict = _cache_evictor(cfg.num_params() * per_param)
    return _unit_update_rate(master, 0, 0, host_sharding, stream_dtype, repeats, evict)


def fp32_state_params(cfg, unit_kind: str) -> int:
    """Parameters of one ``unit_kind`` unit whose Adam state stays fp32 under ``adamw_8bit``'s
    default policy (``optim.policy.leaf_state_format``; the embedding, an LM head, norms, biases and
    tensors under ``min_8bit_size`` elements)."""
    from lazytrain_jax.optim import config as opt_config, policy
    key = "embed" if unit_kind == "embed" else "head" if unit_kind == "head" else "layers"
    tree = {key: get_units(cfg).abstract_params(unit_kind)}
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return sum(int(np.prod(a.shape)) for path, a in leaves
               if policy.leaf_state_format(path, a, state_format="dynamic8",
                                           min_8bit_size=opt_config.DEFAULT_MIN_8BIT_SIZE,
                                           fp32_state_filter=policy.default_fp32_state_filter) == "fp32")


def optimizer_params(costs: Costs, cfg, host_opt_rate: float, fp32_state_rate: float) -> tuple:
    """``Costs.opt_params`` for measured rates: the embedding's and head's fp32-state parameters
    weighed by ``host_opt_rate / fp32_state_rate``; a layer as it is (``host_opt_rate`` is timed
    on a whole layer, its small fp32-state tensors included)."""
    ratio = host_opt_rate / fp32_state_rate
    out = list(map(float, costs.num_params))
    for u, kind in ((0, "embed"), (len(out) - 1, "head")):
        n32 = fp32_state_params(cfg, kind)
        out[u] = costs.num_params[u] - n32 + n32 * ratio
    return tuple(out)


def _measure_embed_backward(cfg, batch_size: int, seq_len: int, num_micro_batches: int, stream_dtype: str,
                            repeats: int) -> float:
    """Seconds of the engine's BE item: the boundary-0 gradients of every micro-batch scatter-added
    into the fp32 embedding table on the host (``run._embed_grad_fn``), a tied head's gradient
    added, at the run's shapes (the engine waits for it at the end of the backward)."""
    from lazytrain_jax.executor.run import _embed_grad_fn
    host = links.host_store(jax.devices()[0])
    grad_dtype = jnp.dtype(default_grad_dtype(stream_dtype))  # as measured_costs' Costs
    micro = batch_size // num_micro_batches
    rng = np.random.default_rng(2)
    put = functools.partial(jax.device_put, device=host)
    master = jax.tree.map(lambda a: put(np.full(a.shape, 0.01, np.float32)), get_units(cfg).abstract_params("embed"))
    ids = put(rng.integers(0, cfg.vocab_size, (batch_size, seq_len)).astype(np.int32))
    g0 = [put(np.full((micro, seq_len, cfg.hidden_size), 1e-3, grad_dtype)) for _ in range(num_micro_batches)]
    # a tied head's gradient comes down as the head computed it (the stream dtype) from one
    # micro-batch, summed in fp32 from several
    tied_dtype = jnp.dtype(stream_dtype) if num_micro_batches == 1 else np.float32
    tied = put(np.full((cfg.vocab_size, cfg.hidden_size), 1e-3, tied_dtype)) if cfg.tie_word_embeddings else None
    fn = _embed_grad_fn(cfg, host)
    return median_seconds(lambda: fn(master, ids, g0, tied), repeats)


def measured_costs(model_or_config, batch_size: int, seq_len: int, *, num_micro_batches: int = 1,
                   stream_dtype: str = "bfloat16", repeats: int = 3, cached: bool = True) -> Costs:
    """The Costs of ``profile`` alone (no link, disk or optimizer measurement): per layer kind the
    forward, the backward from kept residuals and the backward with in-layer recompute, timed on
    one micro-batch on the default device and multiplied by the micro-batch count, the head's
    forward+backward, and the embedding's backward on the host (``bwd_time[0]``: the engine's BE
    item); every byte figure from the real units (``unit_costs``). Cached per (model
    shape, shapes, dtype, backend, repeats); ``cached=False`` measures again."""
    cfg = getattr(model_or_config, "config", model_or_config)
    device = jax.devices()[0]
    key = (config_fingerprint(cfg), batch_size, seq_len, num_micro_batches, stream_dtype, device.platform, repeats)
    if key not in _COSTS_CACHE or not cached:
        dtype = jnp.dtype(stream_dtype)
        micro, M = batch_size // num_micro_batches, num_micro_batches
        per_kind = {k: _measure_layer(cfg, k, micro, seq_len, dtype, device, repeats) for k in sorted(set(cfg.layer_kinds))}
        head = _measure_head(cfg, micro, seq_len, dtype, device, repeats) * M
        kinds = cfg.layer_kinds
        times = unit_costs(cfg, batch_size=batch_size, seq_len=seq_len, num_micro_batches=M, stream_dtype=stream_dtype)
        fwd = [0.0] + [per_kind[k][0] * M for k in kinds] + [head]
        embed_bwd = _measure_embed_backward(cfg, batch_size, seq_len, M, stream_dtype, repeats)
        bwd = [embed_bwd] + [per_kind[k][1] * M for k in kinds] + [0.0]
        bwd_rc = [0.0] + [per_kind[k][2] * M for k in kinds] + [0.0]
        _COSTS_CACHE[key] = dataclasses.replace(times, fwd_time=tuple(fwd), bwd_time=tuple(bwd),
                                                bwd_recompute_time=tuple(bwd_rc), source="measured")
    return _COSTS_CACHE[key]


def profile(model_or_config, batch_size: int, seq_len: int, *, num_micro_batches: int = 1,
            stream_dtype: str = "bfloat16", offload_dir: str | None = None, device_memory: float | None = None,
            repeats: int = 3, link_bytes: int | None = None, disk_bytes: int = 64 << 20, cached: bool = True,
            host_memory: float | None = None, nvme_memory: float | None = None):
    """Measures this machine at the run's shapes: ``(Costs, Hardware)`` for the planner.

    Per layer kind: forward, backward from kept residuals and backward with in-layer recompute (one
    micro-batch, times all micro-batches); the head's forward+backward; H2D/D2H bandwidth between
    the host store's memory kind and the device, and the head unit's own upload and gradient
    download against that rate (``Costs.head_link_factor``: a tied table is one large array);
    NVMe read/write bandwidth in ``offload_dir``; the host optimizer's parameters per second. The
    layer times are cached per (model shape, shapes, dtype, backend, repeats), the rates, which do
    not depend on the batch, per (model shape, dtype, backend, offload_dir, repeats, probe sizes):
    every shape profiled in a process plans with the same rates. On the CPU backend the Hardware
    says ``host_shares_device``: the host optimizer, the copies and the "device" compute run on the
    same cores, so the step model adds their times instead of overlapping them.
    The layer, head, embedding-backward and H2D/D2H timings follow ``PROFILE_WARMUP`` untimed
    rounds (the host optimizer's follow two untimed calls; the NVMe write and read are timed once),
    and the host allocator is set as the engine sets it (``host_alloc.keep_host_blocks_once``), so a
    process's first profile measures the state its steps run in.

    Args:
      model_or_config: a Model or ModelConfig.
      batch_size, seq_len, num_micro_batches: the step.
      stream_dtype: streamed dtype; offload_dir: the NVMe directory to measure.
      device_memory: the device budget for the Hardware (default: the accelerator's reported
        limit; required on the CPU backend, where device and host share one memory).
      cached: reuse an earlier measurement of the same key; False measures again (and caches that).
      link_bytes: the H2D/D2H probe: None (default) copies the largest layer's weights, array by
        array in ``stream_dtype``, as the engine streams them (one large flat array can move at a
        different rate: on the CPU backend a fresh 64 MB buffer paid its page faults, 1.3 GB/s
        against 8-10 GB/s for a layer's arrays); an int copies one flat array of that many bytes.
      host_memory: host bytes for offloaded activations (default: ``schedule.host.activation_budget``,
        80 % of the RAM available now less this model's host store).
      nvme_memory: bytes for the NVMe tier (default: 90 % of the free space in ``offload_dir``, or
        the temporary directory when it is None).
    Returns:
      (Costs with ``source="measured"``, Hardware named ``"measured"``).
    Example:
      >>> costs, hw = lt.profile(model, batch_size=8, seq_len=512, device_memory=20e9)
      >>> plan = lt.plan(costs, hw)
    """
    from lazytrain_jax.host_alloc import keep_host_blocks_once
    from lazytrain_jax.schedule.hardware import Hardware
    keep_host_blocks_once()  # the host allocator the engine's steps run with (lt.StreamingEngine sets it too)
    cfg = getattr(model_or_config, "config", model_or_config)
    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("num_micro_batches", num_micro_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if batch_size % num_micro_batches:
        raise ValueError(f"num_micro_batches={num_micro_batches} must divide batch_size={batch_size}")
    room = memory_room(cfg, device_memory=device_memory, host_memory=host_memory, nvme_memory=nvme_memory,
                       offload_dir=offload_dir)
    costs = measured_costs(cfg, batch_size, seq_len, num_micro_batches=num_micro_batches, stream_dtype=stream_dtype,
                           repeats=repeats, cached=cached)
    rates = dict(_measured_rates(cfg, stream_dtype, offload_dir, repeats, link_bytes, disk_bytes, cached))
    fp32_rate = rates.pop("fp32_state_rate")
    costs = dataclasses.replace(costs, opt_params=optimizer_params(costs, cfg, rates["host_opt_rate"], fp32_rate),
                                head_link_factor=rates.pop("head_link_factor"))
    flops = sum(2.0 * cfg.layer_num_params(k) * batch_size * seq_len for k in cfg.layer_kinds)
    achieved = flops / max(sum(costs.fwd_time[1:-1]), 1e-12)
    return costs, Hardware(name="measured", device_margin=0.0, device_flops=achieved, **room, **rates)


def _measured_rates(cfg, stream_dtype, offload_dir, repeats, link_bytes, disk_bytes, cached) -> dict:
    """H2D/D2H, NVMe read/write and host optimizer rates: they depend on the model's layers and the
    stream dtype, not on the batch, so one measurement serves every shape (cached per key)."""
    device = jax.devices()[0]
    key = (config_fingerprint(cfg), stream_dtype, device.platform, offload_dir, repeats,
           None if link_bytes is None else int(link_bytes), disk_bytes)
    if key not in _RATES_CACHE or not cached:
        dtype = jnp.dtype(stream_dtype)
        host = links.host_store(device)
        if link_bytes is None:  # the largest layer's weights, leaf by leaf as the engine streams them
            kind = max(sorted(set(cfg.layer_kinds)), key=cfg.layer_num_params)
            link_bytes = jax.tree.map(lambda a: np.full(a.shape, 0.01, dtype), get_units(cfg).abstract_params(kind))
        h2d, d2h = _measure_link(device, host, link_bytes, repeats)
        head_h2d, head_d2h = _measure_link(device, host, _head_arrays(cfg, dtype), repeats)
        nvme_read, nvme_write = _measure_disk(offload_dir, disk_bytes)
        opt_rate = _measure_host_optimizer(cfg, host, stream_dtype, repeats)
        fp32_rate = _measure_fp32_state_rate(cfg, host, stream_dtype, repeats)
        _RATES_CACHE[key] = dict(h2d_bw=h2d, d2h_bw=d2h, nvme_read_bw=nvme_read, nvme_write_bw=nvme_write,
                                 host_opt_rate=opt_rate, fp32_state_rate=fp32_rate,
                                 head_link_factor=(h2d / head_h2d, d2h / head_d2h))
    return _RATES_CACHE[key]


def memory_room(model_or_config, *, device_memory: float | None = None, host_memory: float | None = None,
                nvme_memory: float | None = None, offload_dir: str | None = None) -> dict:
    """The memory fields of ``profile``'s Hardware (nothing measured): ``device_memory`` (default:
    the accelerator's limit; required on the CPU backend), ``host_memory`` (default:
    ``schedule.host.activation_budget``), ``nvme_memory`` (default: 90 % of the free space in
    ``offload_dir``, or its nearest existing parent, or the temporary directory) and ``host_shares_device`` (the CPU backend)."""
    cfg = getattr(model_or_config, "config", model_or_config)
    device = jax.devices()[0]
    if device_memory is None:
        stats = device.memory_stats() or {}
        device_memory = stats.get("bytes_limit")
        if device_memory is None or device.platform == "cpu":
            raise ValueError("device_memory is required on the CPU backend (device and host share one memory): "
                             "pass the device budget in bytes, e.g. device_memory=2e9")
    if not device_memory > 0:
        raise ValueError(f"device_memory={device_memory!r} must be > 0 bytes")
    if host_memory is None:
        from lazytrain_jax.schedule.host import activation_budget
        host_memory = activation_budget(cfg)
    if nvme_memory is None:
        import os
        import shutil
        import tempfile
        path = os.path.abspath(offload_dir or tempfile.gettempdir())
        while not os.path.exists(path):  # the directory is made when first written: its disk's room
            path = os.path.dirname(path)
        nvme_memory = 0.9 * shutil.disk_usage(path).free
    return dict(device_memory=float(device_memory), host_memory=float(host_memory), nvme_memory=float(nvme_memory),
                host_shares_device=device.platform == "cpu")
