"""Discrete-event simulator of consecutive steps of any Plan on any Hardware.

Channels: compute, H2D, D2H, NVMe read, NVMe write (FIFO each) and the host optimizer. Transfers are
issued where ``timing.py`` places them, and then obey their real dependencies instead of the
window formula:

- an item computes after the previous item, after its inputs arrived, and after every transfer
  issued in the previous window finished (bounded in-flight traffic: the executor's discipline);
- an NVMe write starts after the boundary's D2H; an upload of an NVMe boundary after its read;
- the host optimizer runs as one chain from the end of a step's backward (global norm known), unit
  by unit in forward order; the next step's upload of a unit waits for that unit's update
  (pipelined), or the next step waits for the whole update (serial).

Device memory over time is accounted per allocation (weights from upload start to the end of
their last use, boundaries from production to their last use or the end of their offload,
residuals, workspaces, gradient buffers, head working set, margin); its peak is below the memory
model's (a sum of maxima).
"""

from __future__ import annotations

import dataclasses

from lazytrain_jax.schedule import memory, timing

TRANSFER_CHANNELS = ("h2d", "d2h", "nvme_read", "nvme_write")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    channel: str
    name: str
    start: float
    end: float
    step: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimResult:
    """Outputs of ``simulate``.

    step_time_s: steady-state seconds per step (the last step's start to the end of the run);
    step_times_s: every step's duration; busy_s: per-channel busy seconds per step (last step);
    exposed_stall_s: seconds per step the compute channel waited (last step);
    peak_device_bytes: peak of the accounted device memory; memory_curve: (time, bytes) points;
    intervals: every interval, for traces.
    """

    step_time_s: float
    step_times_s: tuple[float, ...]
    busy_s: dict
    exposed_stall_s: float
    peak_device_bytes: float
    memory_curve: tuple[tuple[float, float], ...]
    intervals: tuple[Interval, ...]


def simulate(plan, hardware=None, *, num_steps: int = 2) -> SimResult:
    """Simulates ``num_steps`` consecutive steps of ``plan`` (on its own hardware by default).

    Args:
      plan: a Plan; hardware: another Hardware to play it on (what-if); num_steps: steps (>= 1).
    Returns:
      A SimResult.
    Example:
      >>> r = simulate(plan, num_steps=3); r.step_time_s, r.peak_device_bytes
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps={num_steps!r} must be an integer >= 1")
    hw = hardware or plan.hardware
    costs = plan.costs
    wins = timing.windows(costs, hw, plan)
    seq = [w.item for w in wins]
    a = costs.boundary_bytes
    tiers = plan.boundary_tiers
    rates = {"h2d": hw.h2d_bw, "d2h": hw.d2h_bw, "nvme_read": hw.nvme_read_bw, "nvme_write": hw.nvme_write_bw}
    free = dict.fromkeys(TRANSFER_CHANNELS + ("compute", "optimizer"), 0.0)
    intervals: list[Interval] = []
    opt_done: dict[int, float] = {}
    step_starts, stalls = [], 0.0
    prev_backward_end = 0.0
    t = 0.0
    num_units = len(costs.num_params)
    n = len(seq)

    def run(channel, name, ready, duration, step):
        start = max(free[channel], ready)
        end = start + duration
        free[channel] = end
        if duration > 0:
            intervals.append(Interval(channel=channel, name=name, start=start, end=end, step=step))
        return end

    for step in range(num_steps):
        # host optimizer chain for this step's weights (the update of the previous step's gradients)
        ready = prev_backward_end
        for u in range(num_units):
            ready = run("optimizer", f"update {costs.unit_names[u]}", ready,
                        costs.num_params[u] / hw.host_opt_rate, step)
            opt_done[u] = ready
        all_updated = ready
        step_starts.append(t)
        barrier = t if plan.optimizer_mode == "pipelined" else max(t, all_updated)
        marks = {}
        nvme_read_done: dict[int, float] = {}
        d2h_done: dict[int, float] = {}
        stall = 0.0
        for k, item in enumerate(seq):
            start = max(free["compute"], barrier)
            stall += start - free["compute"] if k > 0 else 0.0
            end = run("compute", item.name, start, item.compute, step)
            marks[("item", item.name)] = (start, end)
            issued = [end]
            # H2D for item k + 1 (weights wait for their update in the forward)
            if k + 1 < n:
                nxt = seq[k + 1]
                if nxt.weight_bytes:
                    ready = start
                    if nxt.phase in ("forward", "head") and nxt.weight_unit is not None:
                        ready = max(ready, opt_done[nxt.weight_unit])
                    up_end = run("h2d", f"weights {nxt.name}", ready, nxt.weight_bytes / rates["h2d"], step)
                    issued.append(up_end)
                    marks[("weights", nxt.name)] = max(free["h2d"] - nxt.weight_bytes / rates["h2d"], start)
                if nxt.boundary_in is not None:
                    ready = max(start, nvme_read_done.get(nxt.boundary_in, start))
                    up_end = run("h2d", f"boundary {nxt.boundary_in}", ready, a[nxt.boundary_in] / rates["h2d"], step)
                    issued.append(up_end)
                    marks[("upload", nxt.boundary_in)] = up_end - a[nxt.boundary_in] / rates["h2d"]
            if k + 2 < n and seq[k + 2].boundary_in is not None and tiers[seq[k + 2].boundary_in] == "nvme":
                b = seq[k + 2].boundary_in
                nvme_read_done[b] = run("nvme_read", f"read {b}", start, a[b] / rates["nvme_read"], step)
                issued.append(nvme_read_done[b])
            if k >= 1:
                prev = seq[k - 1]
                if prev.grad_bytes:
                    issued.append(run("d2h", f"grads {prev.name}", start, prev.grad_bytes / rates["d2h"], step))
                    marks[("grads", prev.name)] = issued[-1]
                if prev.produces is not None and tiers[prev.produces] in memory.OFFLOAD_TIERS:
                    d2h_done[prev.produces] = run("d2h", f"offload {prev.produces}", start,
                                                  a[prev.produces] / rates["d2h"], step)
                    issued.append(d2h_done[prev.produces])
            if k >= 2 and seq[k - 2].produces is not None and tiers[seq[k - 2].produces] == "nvme":
                b = seq[k - 2].produces
                issued.append(run("nvme_write", f"write {b}", max(start, d2h_done[b]), a[b] / rates["nvme_write"], step))
            barrier = max(issued)
            if item.name == "P0" and plan.optimizer_mode == "serial":
                barrier = max(barrier, all_updated)
        stalls = stall
        marks.update({("offload", b): v for b, v in d2h_done.items()})
        prev_backward_end = barrier
        t = barrier
    step_times = tuple(b - a_ for a_, b in zip(step_starts, step_starts[1:] + [t]))
    last = [iv for iv in intervals if iv.step == num_steps - 1]
    busy = {ch: sum(iv.end - iv.start for iv in last if iv.channel == ch)
            for ch in ("compute",) + TRANSFER_CHANNELS + ("optimizer",)}
    curve, peak = device_memory_curve(plan, hw, marks)
    return SimResult(step_time_s=step_times[-1], step_times_s=step_times, busy_s=busy, exposed_stall_s=stalls,
                     peak_device_bytes=peak, memory_curve=curve, intervals=tuple(intervals))


def device_memory_curve(plan, hardware, marks) -> tuple[tuple[tuple[float, float], ...], float]:
    """(time, bytes) points of the accounted device memory of one simulated step, and its peak."""
    costs = plan.costs
    L = costs.num_layers
    a = costs.boundary_bytes
    tiers = plan.boundary_tiers
    item = {name: se for (kind, name), se in marks.items() if kind == "item"}
    allocs = []

    def add(t0, t1, nbytes):
        if nbytes > 0 and t1 >= t0:
            allocs.append((t0, t1, nbytes))

    t_begin, t_end = item["P0"][0], item["BE"][1]
    add(t_begin, t_end, hardware.device_margin)
    resident_from = L - plan.resident_tail
    for (kind, name), t0 in marks.items():
        if kind == "weights" and name != "FH":  # the head's weights are in its working set
            nbytes = next(it.weight_bytes for it in _items(plan) if it.name == name)
            last = name
            if name.startswith("F") and name not in ("FE", "FH") and int(name[1:]) >= resident_from:
                last = f"B{name[1:]}"
            add(t0, item[last][1], nbytes)
    producer = {0: "FE", **{i: f"F{i - 1}" for i in range(1, L + 1)}}
    for i in range(L + 1):
        born = item[producer[i]][1]
        last_use = "FH" if i == L else f"B{i}"
        if tiers[i] == "device":
            add(born, item[last_use][1], a[i])
        else:
            freed = item[f"F{i}"][1] if i < L else item["FH"][1]
            add(born, max(freed, marks.get(("offload", i), freed)), a[i])
            if tiers[i] == "drop":
                add(item[f"RC{i - 1}"][1], item[last_use][1], a[i])
            else:
                add(marks.get(("upload", i), item[last_use][0]), item[last_use][1], a[i])
    for l in range(L):
        b0, b1 = item[f"B{l}"]
        if plan.keep_residuals[l]:
            add(item[f"F{l}"][1], b1, costs.residual_bytes[l])
        add(b0, b1, costs.workspace_bytes[l] + 2 * a[l + 1])
        add(b1, marks.get(("grads", f"B{l}"), b1), costs.grad_bytes[l + 1])
    add(*item["FH"], costs.head_workspace_bytes)
    events = sorted([(t0, nbytes) for t0, _, nbytes in allocs] + [(t1, -nbytes) for _, t1, nbytes in allocs],
                    key=lambda e: (e[0], e[1] > 0))
    curve, level, peak = [], 0.0, 0.0
    for t, delta in events:
        level += delta
        peak = max(peak, level)
        curve.append((t, level))
    return tuple(curve), peak


def _items(plan):
    return timing.items(plan.costs, plan)
