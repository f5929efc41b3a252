"""Heuristic baselines as Plans: MegaTrain's fixed choices and three simple extremes.

Each takes Costs (which fix batch, sequence and micro-batches) and Hardware and returns a Plan with
predictions filled in; ``plan.fits()`` says whether it fits the budgets. ``megatrain`` embeds
MegaTrain's own costs (``megatrain_costs``: embedding and head resident), so its plan is a baseline
to compare against, not a start for the MILP (whose Costs it does not share).
"""

from __future__ import annotations

from lazytrain_jax.schedule.hardware import check_positive_int
from lazytrain_jax.schedule.plan import Plan


def megatrain_costs(costs):
    """``costs`` as MegaTrain's executor incurs them: embedding and head resident on the device.

    MegaTrain keeps the embedding table and the LM head (weights and their gradients) on the GPU for
    the whole step (MegaTrain's published design). With the same Plan machinery that is, per step:
    - device memory: the embedding table and its gradient are added to the head/loss working set
      (which already holds the head weights and gradient; a tied head shares the table);
    - the host gathers no rows (``FE`` uploads nothing) and the head's weights are not streamed in
      front of ``FH``; instead the serial tail re-syncs the updated embedding and head weights to the
      device (uploaded in window ``P1``, after the whole-model update in ``P0``);
    - the embedding and head gradients go to the host at the end of backward (window ``BE``) for the
      CPU update, not the boundary-0 gradient / the head gradient after ``FH``.
    Gradients stay in ``costs.grad_dtype`` (bf16 by default: MegaTrain accumulates bf16 on the host).
    """
    import dataclasses
    from lazytrain_jax.schedule.costs import GRAD_DTYPE_BYTES, STREAM_DTYPE_BYTES
    weight_bytes_per_param = STREAM_DTYPE_BYTES[costs.stream_dtype]
    table = costs.num_params[0]
    head_w, head_g = costs.weight_bytes[-1], costs.grad_bytes[-1]
    tied = costs.num_params[-1] * weight_bytes_per_param < 0.5 * head_w  # head matrix not in its own params
    embed_w = 0.0 if tied else float(table * weight_bytes_per_param)
    embed_g = 0.0 if tied else float(table * GRAD_DTYPE_BYTES[costs.grad_dtype])
    w, g = list(costs.weight_bytes), list(costs.grad_bytes)
    w[0], w[-1] = embed_w + head_w, 0.0
    g[0], g[-1] = embed_g + head_g, 0.0
    return dataclasses.replace(costs, weight_bytes=tuple(w), grad_bytes=tuple(g),
                               head_workspace_bytes=costs.head_workspace_bytes + embed_w + embed_g)


def megatrain(costs, hardware, K: int = 4) -> Plan:
    """MegaTrain's fixed choices: a checkpoint every K layers on device, recompute in between, each
    layer's forward re-run inside its backward (no residuals kept), depth-1 prefetch, no NVMe, serial
    optimizer tail, embedding and head resident on the device (``megatrain_costs``).

    Args:
      costs: Costs (of the model, batch and sequence; the plan embeds ``megatrain_costs(costs)``);
      hardware: Hardware; K: checkpoint interval (>= 1).
    Returns:
      The Plan (name ``megatrain(K=..)``).
    Example:
      >>> megatrain(costs, Hardware.preset("h800"), K=4).predicted_step_time_s
    """
    check_positive_int("K", K)
    num_layers = costs.num_layers
    tiers = ["device" if (i % K == 0 or i == num_layers) else "drop" for i in range(num_layers + 1)]
    return Plan.create(megatrain_costs(costs), hardware, name=f"megatrain(K={K})", boundary_tiers=tiers,
                       optimizer_mode="serial", weight_prefetch_depth=1, act_prefetch_depth=1)


def every_layer(costs, hardware) -> Plan:
    """Every boundary kept on device, no recompute, pipelined optimizer."""
    return Plan.create(costs, hardware, name="every_layer", boundary_tiers=["device"] * (costs.num_layers + 1))


def full_recompute(costs, hardware) -> Plan:
    """Only boundaries 0 and L kept: the whole stack recomputed once from the embedding output."""
    num_layers = costs.num_layers
    tiers = ["device"] + ["drop"] * (num_layers - 1) + ["device"]
    return Plan.create(costs, hardware, name="full_recompute", boundary_tiers=tiers)


def offload_all_host(costs, hardware) -> Plan:
    """Every interior boundary offloaded to host memory, no recompute."""
    num_layers = costs.num_layers
    tiers = ["device"] + ["host"] * (num_layers - 1) + ["device"]
    return Plan.create(costs, hardware, name="offload_all_host", boundary_tiers=tiers)


HEURISTICS = {
    "megatrain": megatrain,
    "every_layer": every_layer,
    "full_recompute": full_recompute,
    "offload_all_host": offload_all_host,
}


def all_heuristics(costs, hardware) -> list[Plan]:
    """Every baseline (MegaTrain with K = 2, 4, 8) evaluated on ``costs``."""
    plans = [megatrain(costs, hardware, K) for K in (2, 4, 8)]
    plans += [every_layer(costs, hardware), full_recompute(costs, hardware), offload_all_host(costs, hardware)]
    return plans
