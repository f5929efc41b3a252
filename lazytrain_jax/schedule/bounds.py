"""Lower bounds for judging a step (per channel: compute, H2D, D2H, NVMe, host optimizer), phase form.

    T_step >= T_fwd + T_bwd + T_tail, each phase a max over its channels:
    T_fwd  >= max(Σ forward compute (head included), Σ forward uploads / h2d, Σ offloads / d2h)
    T_bwd  >= max(Σ backward compute (+ recompute), backward uploads / h2d, Σ grads / d2h,
                  NVMe reads / read bw)
    T_tail >= pipelined: update(embed) + embed rows upload; serial: N / R_opt + upload
    pipelined: T_tail + T_fwd >= N / R_opt as well: every update of a step runs before the head's
    weights are uploaded (it needs the global norm of the previous backward, and the forward of a
    unit waits for its update), so the host optimizer overlaps only the tail and the forward.

Without a plan the bound holds for every plan on these Costs: residuals kept everywhere, nothing
recomputed or offloaded, and every layer resident in backward (optimistic).
"""

from __future__ import annotations

from lazytrain_jax.schedule.memory import OFFLOAD_TIERS, offloaded_residuals
from lazytrain_jax.schedule.steps import unit_opt_times


def lower_bound(costs, hardware, plan=None) -> dict[str, float]:
    """Phase lower bound of a step's seconds, for one plan's decisions or for any plan.

    Args:
      costs: Costs; hardware: Hardware; plan: a Plan (its recompute/offload volumes count) or None.
    Returns:
      dict with ``forward``, ``backward``, ``tail``, ``optimizer`` and ``total`` seconds.
    Example:
      >>> lb = lower_bound(plan.costs, plan.hardware); plan.predicted_step_time_s / lb["total"]
    """
    L = costs.num_layers
    a = costs.boundary_bytes
    w, g = costs.link_weight_bytes, costs.link_grad_bytes  # as the links spend them
    fwd_compute = sum(costs.fwd_time[:-1]) + costs.fwd_time[-1]
    fwd_up = sum(w[1:])  # layers and head; the embed rows are in the tail
    if plan is None:
        tiers, keep, resident, mode = ["device"] * (L + 1), [True] * L, L, "pipelined"
    else:
        tiers, keep, resident, mode = plan.boundary_tiers, plan.keep_residuals, plan.resident_tail, plan.optimizer_mode
    offloaded = [i for i, t in enumerate(tiers) if t in OFFLOAD_TIERS]
    dropped = [i for i, t in enumerate(tiers) if t == "drop"]
    fwd_down = sum(a[i] for i in offloaded)
    recompute = sum(costs.fwd_time[i] for i in dropped)  # layer i-1 re-runs: unit index i
    bwd_compute = recompute + sum(costs.bwd_time[l + 1] if keep[l] else costs.bwd_recompute_time[l + 1] for l in range(L))
    streamed = [l for l in range(L) if l < L - resident]
    bwd_up = sum(w[l + 1] for l in streamed) + sum(w[i] for i in dropped if i - 1 < L - resident)
    bwd_up += sum(a[i] for i in offloaded)
    if plan is not None:  # residuals kept on the host: down after the forward, up before the backward
        res_host = sum(r for r, o in zip(costs.residual_bytes, offloaded_residuals(plan)) if o)
        fwd_down += res_host
        bwd_up += res_host
    bwd_down = sum(g[:-1])
    nvme_read = sum(a[i] for i, t in enumerate(tiers) if t == "nvme")
    opt = unit_opt_times(costs, hardware)
    total_opt = sum(opt)
    forward = max(fwd_compute, fwd_up / hardware.h2d_bw, fwd_down / hardware.d2h_bw,
                  nvme_read / hardware.nvme_write_bw)
    backward = max(bwd_compute, bwd_up / hardware.h2d_bw, (bwd_down + g[-1]) / hardware.d2h_bw,
                   nvme_read / hardware.nvme_read_bw)
    upload0 = w[0] / hardware.h2d_bw
    tail = (opt[0] + upload0 if mode == "pipelined" else total_opt + upload0)
    total = backward + max(forward + tail, total_opt)
    return dict(forward=forward, backward=backward, tail=tail, optimizer=total_opt, total=total)
