"""Discrete-event simulator of consecutive steps of any Plan on any Hardware.

Channels: compute, H2D, D2H, NVMe read, NVMe write (FIFO each) and the host optimizer. It plays the
transfers of the step model (``steps.transfers``) as events in continuous time instead of the
window formula:

- a transfer is issued when the item of its release window starts, and runs when its channel is
  free (FIFO in issue order) and its inputs exist: an NVMe write after the boundary's D2H, an upload
  of an NVMe boundary after its read, a forward weight upload after that unit's update;
- an item computes after the previous item and after every transfer due in the previous window
  (its deadline) finished: the executor's bounded in-flight traffic;
- the host optimizer updates unit by unit as one chain from the step's start, each update due
  before its unit's upload may begin (pipelined), or all in P0 (serial);
- where the device computes on the host's cores (``Hardware.host_shares_device``) everything runs
  on those cores one piece at a time: each item computes, then the transfers and updates due in its
  window run in deadline order, nothing ahead (``steps``: a window lasts the sum of its loads).

Device memory over time is accounted per allocation (weights from upload start to the end of
their last use, boundaries from production to their last use or the end of their offload,
residuals, workspaces, gradient buffers, head working set, margin); its peak is below the memory
model's (a sum of maxima).
"""

from __future__ import annotations

import dataclasses

from lazytrain_jax.schedule import memory, steps
from lazytrain_jax.schedule.hardware import check_positive_int

TRANSFER_CHANNELS = steps.TRANSFER_CHANNELS


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


class _Channel:
    """One channel serving released transfers earliest deadline first, preemptively (transfers are
    issued as chunks), in continuous time."""

    def __init__(self, name, rate, intervals):
        self.name, self.rate, self.intervals = name, rate, intervals
        self.now = 0.0
        self.jobs = []   # [deadline, order, release time, seconds left, label, step, key]
        self.first_start = {}

    def add(self, mv, at, label, step, key):
        self.jobs.append([mv.deadline, len(self.jobs) + mv.item * 1e-6, at, mv.amount / self.rate, label, step, key])

    def finish_due(self, deadline, done):
        """Runs the channel until every job due by ``deadline`` is done; records their end in ``done``."""
        while any(j[0] <= deadline and j[3] > 0 for j in self.jobs):
            ready = [j for j in self.jobs if j[3] > 0 and j[2] <= self.now + 1e-15]
            if not ready:
                self.now = min(j[2] for j in self.jobs if j[3] > 0)
                continue
            job = min(ready, key=lambda j: (j[0], j[1]))
            later = [j[2] for j in self.jobs if j[3] > 0 and j[2] > self.now + 1e-15 and (j[0], j[1]) < (job[0], job[1])]
            run = min([job[3]] + [r - self.now for r in later])
            start, self.now = self.now, self.now + run
            job[3] -= run
            self.first_start.setdefault(job[6], start)
            if run > 0:
                self.intervals.append(Interval(channel=self.name, name=job[4], start=start, end=self.now, step=job[5]))
            if job[3] <= 1e-15:
                job[3] = 0.0
                done[job[6]] = self.now
        self.jobs = [j for j in self.jobs if j[3] > 0]


def simulate(plan, hardware=None, *, num_steps: int = 2) -> SimResult:
    """Simulates ``num_steps`` consecutive steps of ``plan`` (on its own hardware by default).

    Args:
      plan: a Plan; hardware: another Hardware to play it on (what-if); num_steps: steps (>= 1).
    Returns:
      A SimResult.
    Example:
      >>> r = simulate(plan, num_steps=3); r.step_time_s, r.peak_device_bytes
    """
    check_positive_int("num_steps", num_steps)
    hw = hardware or plan.hardware
    costs = plan.costs
    seq = steps.items(costs, plan)
    moves = steps.transfers(costs, plan, seq)
    rate = steps.rates(hw)
    if hw.host_shares_device:
        return _simulate_shared(plan, hw, seq, moves, rate, num_steps)
    intervals: list[Interval] = []
    chans = {ch: _Channel(ch, rate[ch], intervals) for ch in TRANSFER_CHANNELS}
    step_starts, stalls = [], 0.0
    t = 0.0
    compute_free = 0.0
    released: dict[int, list] = {}
    due_keys: dict[int, list] = {}
    for mv in moves:
        released.setdefault(mv.release, []).append(mv)
        due_keys.setdefault(mv.deadline, []).append((mv.kind, mv.item, mv.ref))
    marks = {}
    for step in range(num_steps):
        step_starts.append(t)
        marks = {}
        done: dict[tuple, float] = {}
        stall = 0.0
        ready = t
        for k, item in enumerate(seq):
            start = max(compute_free, ready)
            if k > 0:
                stall += start - compute_free
            end = start + item.compute
            if item.compute > 0:
                intervals.append(Interval(channel="compute", name=item.name, start=start, end=end, step=step))
            compute_free = end
            marks[("item", item.name)] = (start, end)
            for mv in released.get(k, ()):
                chans[mv.channel].add(mv, start, _label(mv, seq), step, (mv.kind, mv.item, mv.ref))
            for ch in chans.values():
                ch.finish_due(k, done)
            ready = max([end] + [done[key] for key in due_keys.get(k, ())])
        for (kind, j, ref), s0 in [(key, s) for ch in chans.values() for key, s in ch.first_start.items()]:
            _mark_start(marks, kind, seq[j].name, ref, s0)
        for (kind, j, ref), s1 in done.items():
            _mark_end(marks, kind, seq[j].name, ref, s1)
        for ch in chans.values():
            ch.first_start = {}
        stalls = stall
        t = ready
    return _result(plan, hw, intervals, step_starts, t, marks, num_steps, stalls)


def _label(mv, seq) -> str:
    """A transfer's name in traces: its kind and the item (unit transfers) or the boundary/layer it moves."""
    return f"{mv.kind} {seq[mv.item].name}" if mv.kind in ("weights", "grads", "update") else f"{mv.kind} {mv.ref}"


def _mark_start(marks, kind, name, ref, t) -> None:
    """Records where an upload began (the device buffer it fills exists from then on)."""
    key = {"weights": ("weights", name), "boundary": ("upload", ref), "res_fetch": ("res_upload", ref)}.get(kind)
    if key is not None:
        marks.setdefault(key, t)


def _mark_end(marks, kind, name, ref, t) -> None:
    """Records where a download ended (the device buffer it empties is freed then)."""
    key = {"grads": ("grads", name), "offload": ("offload", ref), "res_offload": ("res_offload", ref)}.get(kind)
    if key is not None:
        marks[key] = t


def _result(plan, hw, intervals, step_starts, end, marks, num_steps, stalls=None) -> SimResult:
    """The SimResult of a run ending at ``end``; ``stalls`` None: every non-compute second of the
    last step (shared cores, where the compute waits for each of them)."""
    step_times = tuple(b - a_ for a_, b in zip(step_starts, step_starts[1:] + [end]))
    last = [iv for iv in intervals if iv.step == num_steps - 1]
    busy = {ch: sum(iv.end - iv.start for iv in last if iv.channel == ch)
            for ch in ("compute",) + TRANSFER_CHANNELS}
    if stalls is None:
        stalls = sum(v for ch, v in busy.items() if ch != "compute")
    curve, peak = device_memory_curve(plan, hw, marks)
    return SimResult(step_time_s=step_times[-1], step_times_s=step_times, busy_s=busy, exposed_stall_s=stalls,
                     peak_device_bytes=peak, memory_curve=curve, intervals=tuple(intervals))


def _simulate_shared(plan, hw, seq, moves, rate, num_steps: int) -> SimResult:
    """``simulate`` where every channel runs on the compute's cores: one piece of work at a time."""
    by_deadline: dict[int, list] = {}
    for mv in moves:
        by_deadline.setdefault(mv.deadline, []).append(mv)
    intervals: list[Interval] = []
    step_starts, t, marks = [], 0.0, {}
    for step in range(num_steps):
        step_starts.append(t)
        marks = {}
        for k, item in enumerate(seq):
            end = t + item.compute
            if item.compute > 0:
                intervals.append(Interval(channel="compute", name=item.name, start=t, end=end, step=step))
            marks[("item", item.name)] = (t, end)
            t = end
            for mv in sorted(by_deadline.get(k, ()), key=lambda m: (m.release, m.item)):
                t1 = t + mv.amount / rate[mv.channel]
                if t1 > t:
                    intervals.append(Interval(channel=mv.channel, name=_label(mv, seq), start=t, end=t1, step=step))
                _mark_start(marks, mv.kind, seq[mv.item].name, mv.ref, t)
                _mark_end(marks, mv.kind, seq[mv.item].name, mv.ref, t1)
                t = t1
    return _result(plan, hw, intervals, step_starts, t, marks, num_steps)


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
    offloaded = memory.offloaded_residuals(plan)
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
        if plan.keep_residuals[l] and offloaded[l]:  # on device until copied down, and from its fetch
            f1 = item[f"F{l}"][1]
            add(f1, max(f1, marks.get(("res_offload", l), f1)), costs.residual_bytes[l])
            add(marks.get(("res_upload", l), b0), b1, costs.residual_bytes[l])
        elif plan.keep_residuals[l]:
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
    return steps.items(plan.costs, plan)
