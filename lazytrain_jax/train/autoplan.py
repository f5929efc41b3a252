"""``plan="auto"``: profile this machine at the run's shapes and solve a Plan under a device budget."""

from __future__ import annotations

GB = 1e9


def device_memory_default() -> float:
    """Free memory of the first accelerator (bytes); the CPU backend has none to report."""
    import jax

    dev = jax.devices()[0]
    if dev.platform == "cpu":
        raise ValueError("device_memory is required on the CPU backend (device and host share one memory): "
                         "give the bytes the plan may use, e.g. device_memory=2e9")
    stats = dev.memory_stats() or {}
    if "bytes_limit" not in stats:
        raise ValueError(f"cannot read the free memory of {dev.device_kind}; pass device_memory=<bytes>")
    return float(stats["bytes_limit"] - stats.get("bytes_in_use", 0))


def auto_plan(model, *, batch_size: int | str, seq_len: int, device_memory: float | None = None,
              hardware: str = "measured", stream_dtype: str = "bfloat16", offload_dir: str | None = None,
              num_micro_batches: int | None = None, device_margin: float | None = None, **plan_kw):
    """The MILP plan for ``model`` at (batch_size, seq_len) under ``device_memory``.

    Args:
      hardware: ``"measured"``: ``lt.plan(hardware="measure")`` measures unit times (at each
        micro-batch count whose constant bytes fit), link and NVMe bandwidths and the host optimizer
        rate here; or a hardware preset name (analytic unit times at its rates, the engine's real
        byte sizes).
      device_memory: bytes the plan may use (default: the accelerator's free memory; required on the
        CPU backend). The hardware margin is capped at 5 % of it; ``device_margin`` sets it exactly.
      num_micro_batches: fix the micro-batch count (default: the planner's choice).
      batch_size: sequences per step; with ``hardware="measured"`` also ``"max"`` (the largest
        batch that fits) or ``"best"`` (the most tokens/s), as ``lt.plan(hardware="measure")``.

    Returns:
      Plan. Raises ValueError (the planner's message) when nothing fits.

    Example:
      >>> plan = auto_plan(model, batch_size=8, seq_len=512, device_memory=20e9)
    """
    from lazytrain_jax.executor.profiler import unit_costs
    from lazytrain_jax.schedule.api import plan as solve
    from lazytrain_jax.schedule.api import NoPlanFits, plan_measured
    from lazytrain_jax.schedule.hardware import Hardware

    if device_memory is None:
        device_memory = device_memory_default()
    if not isinstance(device_memory, (int, float)) or isinstance(device_memory, bool) or not device_memory > 0:
        raise ValueError(f"device_memory={device_memory!r} must be a number of bytes > 0")
    if hardware == "measured":  # the profiler's margin is 0
        def planned():
            return plan_measured(model, batch_size=batch_size, seq_len=seq_len, num_micro_batches=num_micro_batches,
                                 device_memory=float(device_memory), stream_dtype=stream_dtype, offload_dir=offload_dir,
                                 device_margin=0.0 if device_margin is None else float(device_margin), **plan_kw)
    else:
        if isinstance(batch_size, str):
            raise ValueError(f"batch_size={batch_size!r} needs hardware='measured' (the batch that fits is found "
                             f"from this machine's profile); give a number of sequences with hardware={hardware!r}")
        hw = Hardware.preset(hardware)
        costs = unit_costs(model, batch_size=batch_size, seq_len=seq_len, num_micro_batches=num_micro_batches or 1,
                           stream_dtype=stream_dtype, device_flops=hw.device_flops)
        margin = min(hw.device_margin, 0.05 * device_memory) if device_margin is None else float(device_margin)
        hw = hw.replace(device_memory=float(device_memory), device_margin=margin)

        def planned():
            return solve(costs, hw, **plan_kw)
    try:
        return planned()
    except NoPlanFits as e:
        raise ValueError(f"plan infeasible: {e} (device_memory={device_memory / GB:.4g} GB for batch_size="
                         f"{batch_size}, seq_len={seq_len}; raise device_memory or lower batch_size/seq_len)") from None
