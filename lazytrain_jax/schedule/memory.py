"""The device memory model: the single source of truth for planner, simulator and executor.

Peak device bytes of a step under a plan (every term in bytes; A_i = boundary bytes, W_l = streamed
weight bytes of layer l, G_l = gradient bytes of layer l, R_l = kept residual bytes, all from Costs):

    peak = margin                                   Hardware.device_margin
         + (1 + weight_prefetch_depth) · max_l W_l  layer weight buffers in flight
         + Σ_{l ≥ L − k} W_l                        resident tail (k = resident_tail)
         + 2 · max_l G_l                            gradient buffers (one computing, one downloading)
         + Σ_{i: tier_i = device} A_i               boundaries kept on device (0 and L always)
         + (3 + act_prefetch_depth) · max_i A_i     activation working set: the current input and
                                                    output (forward), or the uploaded input, incoming
                                                    and outgoing gradients (backward), and prefetched
                                                    boundaries
         + Σ_{l: kept on device} R_l                interior residuals kept on device, forward to backward
         + (1 + act_prefetch_depth) · max_{l: on host} R_l
                                                    residuals kept on the host: the one being copied
                                                    down and the next layer's (forward), or the one in
                                                    use and those prefetched (backward), as for
                                                    boundaries on the host
         + max_{(s,e), e−s ≥ 2} (Σ_{j=s+1}^{e−1} A_j + [tier_s ∈ {host, nvme}] · A_s)
                                                    recompute working set of the largest segment
                                                    (its recomputed boundaries and uploaded base)
         + max_l workspace_l                        backward workspace of one micro-batch
         + head_workspace                           head/loss window (weights, grads, logits chunk)

It is a sum of per-term maxima (no time resolution), so it bounds the memory at every instant of
the step; the simulator's time-resolved curve stays below it, and the executor asserts its
accounted peak never exceeds it. The MILP uses the same terms, linearised (``constant_bytes`` is
the part that does not depend on the boundary/residual/segment decisions).

Host activation bytes = Σ_{tier host} A_i + (2 · max A if any boundary is on NVMe: staging)
                      + Σ_{l: residuals on host} R_l.
NVMe bytes = Σ_{tier nvme} A_i.
"""

from __future__ import annotations

from typing import Sequence

TIERS = ("device", "host", "nvme", "drop")
OFFLOAD_TIERS = ("host", "nvme")


def segments(tiers: Sequence[str]) -> list[tuple[int, int]]:
    """Kept-boundary path 0 → L as edges (s, e): boundaries s and e kept, those between dropped."""
    kept = [i for i, t in enumerate(tiers) if t != "drop"]
    return list(zip(kept[:-1], kept[1:]))


def segment_working_bytes(boundary_bytes: Sequence[float], tiers: Sequence[str], s: int, e: int) -> float:
    if e - s < 2:
        return 0.0
    base = boundary_bytes[s] if tiers[s] in OFFLOAD_TIERS else 0.0
    return float(sum(boundary_bytes[s + 1:e])) + base


def constant_bytes(costs, hardware, *, resident_tail: int = 0, weight_prefetch_depth: int = 1,
                   act_prefetch_depth: int = 1) -> dict[str, float]:
    """The decision-independent terms of the peak (plus the resident tail), as a breakdown."""
    w = costs.layer("weight_bytes")
    g = costs.layer("grad_bytes")
    a = costs.boundary_bytes
    num_layers = costs.num_layers
    return {
        "margin": hardware.device_margin,
        "weight_buffers": (1 + weight_prefetch_depth) * max(w),
        "resident_tail": float(sum(w[num_layers - resident_tail:])) if resident_tail else 0.0,
        "grad_buffers": 2.0 * max(g),
        "boundary_0_and_L": a[0] + a[-1],
        "activation_working": (3 + act_prefetch_depth) * max(a),
        "backward_workspace": max(costs.workspace_bytes),
        "head_workspace": costs.head_workspace_bytes,
    }


def device_breakdown(costs, hardware, plan) -> dict[str, float]:
    """Every term of the peak device bytes of ``plan`` (fields: boundary_tiers, keep_residuals,
    resident_tail, weight_prefetch_depth, act_prefetch_depth).

    Returns:
      A dict term -> bytes; ``sum(d.values())`` is the peak (see ``device_peak_bytes``).
    Example:
      >>> device_breakdown(costs, hw, plan)["residuals"]
    """
    tiers = plan.boundary_tiers
    out = constant_bytes(costs, hardware, resident_tail=plan.resident_tail,
                         weight_prefetch_depth=plan.weight_prefetch_depth,
                         act_prefetch_depth=plan.act_prefetch_depth)
    a = costs.boundary_bytes
    out["boundaries_device"] = float(sum(a[i] for i in range(1, len(a) - 1) if tiers[i] == "device"))
    off = offloaded_residuals(plan)
    out["residuals"] = float(sum(r for r, keep, o in zip(costs.residual_bytes, plan.keep_residuals, off)
                                 if keep and not o))
    out["residuals_offload_working"] = offload_working_bytes(costs.residual_bytes, off, plan.act_prefetch_depth)
    out["recompute_working_set"] = max([segment_working_bytes(a, tiers, s, e) for s, e in segments(tiers)],
                                       default=0.0)
    return out


def offload_working_bytes(residual_bytes: Sequence[float], offloaded: Sequence[bool], act_prefetch_depth: int) -> float:
    """Device bytes of residuals kept on the host while they are in transit: (1 + a) · the largest."""
    return (1 + act_prefetch_depth) * max([r for r, o in zip(residual_bytes, offloaded) if o], default=0.0)


def offloaded_residuals(plan) -> tuple[bool, ...]:
    """Per layer: are its kept residuals on the host (``Plan.offload_residuals``; none if empty)."""
    off = tuple(getattr(plan, "offload_residuals", ()) or ())
    return off or (False,) * len(plan.keep_residuals)


def device_peak_bytes(costs, hardware, plan) -> float:
    """Peak device bytes of ``plan`` under the memory model of this module.

    Args:
      costs: Costs; hardware: Hardware (for the margin); plan: a Plan (or any object with its
        decision fields).
    Returns:
      Bytes.
    Example:
      >>> device_peak_bytes(plan.costs, plan.hardware, plan) <= plan.hardware.device_memory
    """
    return float(sum(device_breakdown(costs, hardware, plan).values()))


def host_peak_bytes(costs, plan) -> float:
    """Host bytes for activations: host-tier boundaries plus NVMe staging buffers."""
    a = costs.boundary_bytes
    tiers = plan.boundary_tiers
    host = float(sum(a[i] for i, t in enumerate(tiers) if t == "host"))
    if any(t == "nvme" for t in tiers):
        host += 2.0 * max(a)
    return host + float(sum(r for r, o in zip(costs.residual_bytes, offloaded_residuals(plan)) if o))


def nvme_peak_bytes(costs, plan) -> float:
    """NVMe bytes for activations."""
    return float(sum(a for a, t in zip(costs.boundary_bytes, plan.boundary_tiers) if t == "nvme"))
