"""Host memory of a training step: what the executor's host store holds, and what is left for
offloaded activations on this machine.

The host store (``lt.StreamingEngine``) keeps fp32 master weights, the hybrid 8-bit Adam state
(8-bit m and v with one fp32 scale each per 256-element block for weight matrices, fp32 m and v
for embeddings, the LM head, norms and biases: ``lt.optim``'s defaults), the copy streamed to the
device and the gradients until the update (fp32 when accumulated over micro-batches).
"""

from __future__ import annotations

import os

ADAM_8BIT_BYTES = 2 + 2 * 4 / 256
ADAM_FP32_BYTES = 8
HOST_SHARE = 0.8   # of the RAM available now, the part the planner may fill (the rest: Python, XLA, the OS)


def store_bytes(config, *, grad_bytes: float | None = None, stream_bytes_per_param: float = 2.0) -> dict[str, float]:
    """Host bytes of the host store for ``config``: parts by name and their ``"total"``.

    ``grad_bytes``: the gradients held until the update (default: fp32 gradients of every
    parameter, the most it can be).
    """
    h, i = config.hidden_size, config.intermediate_size
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    matrices = sum(h * (q + 2 * kv) + q * h + 3 * h * i for _ in config.layer_kinds)
    total = config.num_params()
    vectors = total - matrices  # embeddings, LM head, norms, biases
    parts = {"fp32 master weights": 4.0 * total,
             "Adam state (8-bit hybrid)": ADAM_8BIT_BYTES * matrices + ADAM_FP32_BYTES * vectors,
             "bf16 streaming copy": stream_bytes_per_param * total,
             "gradients": 4.0 * total if grad_bytes is None else float(grad_bytes)}
    parts["total"] = sum(parts.values())
    return parts


def footprint(plan, config) -> dict[str, float]:
    """Host bytes of a training step under ``plan``: the host store plus offloaded activations.

    Example:
      >>> footprint(plan, get_preset("qwen2.5-7b"))["total"]
    """
    grads = None if plan.num_micro_batches > 1 else float(sum(plan.costs.grad_bytes))
    parts = store_bytes(config, grad_bytes=grads)
    parts.pop("total")
    parts["offloaded activations"] = float(plan.predicted_peak_host_bytes)
    parts["total"] = sum(parts.values())
    return parts


def available_bytes() -> float:
    """RAM the OS can give this process now (Linux ``MemAvailable``; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def activation_budget(config, *, store_built: bool = False) -> float:
    """Host bytes the planner may use for offloaded activations on this machine: ``HOST_SHARE`` of
    the RAM available now, less the host store unless it is already built (then the OS figure
    already excludes it)."""
    room = HOST_SHARE * available_bytes() - (0.0 if store_built else store_bytes(config)["total"])
    return max(0.0, room)
