"""``Plan.explain()``: a per-layer table of decisions and transfers, with totals."""

from __future__ import annotations

from lazytrain_jax.schedule.memory import OFFLOAD_TIERS, device_breakdown, offloaded_residuals

GB = 1e9
GIB = 2**30


def explain(plan) -> str:
    """The per-layer table (tier of the input boundary, recompute, residuals, resident, transfers).

    Example:
      >>> print(plan.explain())
    """
    c, hw = plan.costs, plan.hardware
    L = c.num_layers
    tiers = plan.boundary_tiers
    lines = [f"Plan {plan.name!r} for {c.model_name} ({c.model_fingerprint}) on {hw.name}: batch {c.batch_size} x "
             f"seq {c.seq_len}, {c.num_micro_batches} micro-batch(es), optimizer {plan.optimizer_mode}, prefetch depth "
             f"{plan.weight_prefetch_depth} (weights) / {plan.act_prefetch_depth} (activations), "
             f"solver {plan.solver_status} gap {plan.gap if plan.gap is not None else '-'} "
             f"in {plan.solve_time_s:.2f} s",
             f"{'layer':>6} {'in-tier':>8} {'recomp':>6} {'resid':>5} {'resdnt':>6} {'H2D GB':>8} {'D2H GB':>8} {'NVMe GB':>8}"]
    tot = [0, 0, 0, 0.0, 0.0, 0.0]
    offloaded = offloaded_residuals(plan)
    for l in range(L):
        recompute = tiers[l + 1] == "drop"
        resident = l >= L - plan.resident_tail
        h2d = c.weight_bytes[l + 1] * (1 + (not resident) + (recompute and not resident))
        h2d += c.boundary_bytes[l] if tiers[l] in OFFLOAD_TIERS else 0.0
        d2h = c.grad_bytes[l + 1] + (c.boundary_bytes[l] if tiers[l] in OFFLOAD_TIERS else 0.0)
        nvme = 2 * c.boundary_bytes[l] if tiers[l] == "nvme" else 0.0
        res_host = c.residual_bytes[l] if offloaded[l] else 0.0
        h2d, d2h = h2d + res_host, d2h + res_host
        resid = "host" if offloaded[l] else "yes" if plan.keep_residuals[l] else ""
        tot[0] += recompute; tot[1] += plan.keep_residuals[l]; tot[2] += resident
        tot[3] += h2d; tot[4] += d2h; tot[5] += nvme
        lines.append(f"{l:>6} {tiers[l]:>8} {'yes' if recompute else '':>6} {resid:>5} "
                     f"{'yes' if resident else '':>6} {h2d / GB:>8.3f} {d2h / GB:>8.3f} {nvme / GB:>8.3f}")
    lines.append(f"{'total':>6} {'':>8} {tot[0]:>6} {tot[1]:>5} {tot[2]:>6} {tot[3] / GB:>8.2f} {tot[4] / GB:>8.2f} "
                 f"{tot[5] / GB:>8.2f}")
    counts = {t: tiers.count(t) for t in ("device", "host", "nvme", "drop")}
    lines.append(f"boundaries: {counts}; segments: {len(plan.segments)}")
    lines.append(f"predicted step {plan.predicted_step_time_s:.3f} s, {plan.tokens_per_s:.1f} tokens/s, "
                 f"{plan.tflops:.1f} TFLOPS (6·N·tokens/s); peak device {plan.predicted_peak_device_bytes / GIB:.2f} GiB "
                 f"of {hw.device_memory / GIB:.2f} GiB, host activations {plan.predicted_peak_host_bytes / GIB:.2f} GiB "
                 f"of {hw.host_memory / GIB:.2f} GiB, NVMe {plan.predicted_peak_nvme_bytes / GIB:.2f} GiB")
    lines.append("device peak terms (GiB): " + ", ".join(
        f"{k} {v / GIB:.2f}" for k, v in device_breakdown(c, hw, plan).items() if v))
    return "\n".join(lines)
