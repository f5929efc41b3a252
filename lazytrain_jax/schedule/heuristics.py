"""Heuristic baselines as Plans: MegaTrain's fixed choices and three simple extremes.

Each takes Costs (which fix batch, sequence and micro-batches) and Hardware and returns a Plan with
predictions filled in; ``plan.fits()`` says whether it fits the budgets.
"""

from __future__ import annotations

from lazytrain_jax.schedule.plan import Plan


def megatrain(costs, hardware, K: int = 4) -> Plan:
    """MegaTrain: a checkpoint every K layers on device, always recompute, depth 1, serial tail.

    Args:
      costs: Costs; hardware: Hardware; K: checkpoint interval (>= 1).
    Returns:
      The Plan (name ``megatrain(K=..)``).
    Example:
      >>> megatrain(costs, Hardware.preset("h800"), K=4).predicted_step_time_s
    """
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise ValueError(f"K={K!r} must be an integer >= 1")
    num_layers = costs.num_layers
    tiers = ["device" if (i % K == 0 or i == num_layers) else "drop" for i in range(num_layers + 1)]
    return Plan.create(costs, hardware, name=f"megatrain(K={K})", boundary_tiers=tiers,
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
