"""The measured timeline of a step: intervals per channel, stalls, Chrome/Perfetto export.

Channels are the planner's (``schedule.timing.CHANNELS``): ``compute``, ``h2d``, ``d2h``,
``nvme_read``, ``nvme_write``, ``optimizer``. A *stall* is time the compute thread waited for
another channel (a weight upload, an activation fetch, a pending optimizer update).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time

from lazytrain_jax.schedule.timing import CHANNELS

STALL_CHANNELS = ("h2d", "d2h", "nvme_read", "nvme_write", "optimizer")


@dataclasses.dataclass(frozen=True)
class Interval:
    """One measured interval (seconds from the step's start)."""

    channel: str
    name: str
    start_s: float
    end_s: float
    item: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Timeline:
    """Thread-safe recorder of one step's intervals and stalls.

    Example:
      >>> tl = Timeline(); tl.start()
      >>> with tl.interval("compute", "F0", item=3): run()
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._t0 = time.perf_counter()
        self.intervals: list[Interval] = []
        self.stalls: dict[str, float] = collections.defaultdict(float)
        self.item_windows: list[tuple[str, float, float]] = []

    def start(self) -> None:
        with self._lock:
            self._t0 = time.perf_counter()
            self.intervals = []
            self.stalls = collections.defaultdict(float)
            self.item_windows = []

    def now(self) -> float:
        return time.perf_counter() - self._t0

    def add(self, channel: str, name: str, start_s: float, end_s: float, item: int | None = None) -> None:
        if channel not in CHANNELS:
            raise ValueError(f"channel={channel!r}; valid: {list(CHANNELS)}")
        with self._lock:
            self.intervals.append(Interval(channel, name, start_s, end_s, item))

    def add_since(self, channel: str, name: str, start_perf: float, end_perf: float,
                  item: int | None = None) -> None:
        """``add`` from two ``time.perf_counter()`` readings, placed on the step's clock at the time of
        the call: an interval that began before this step's ``start`` (a pipelined update launched by
        the last step) keeps its true length and gets a negative start."""
        with self._lock:
            self.intervals.append(Interval(channel, name, start_perf - self._t0, end_perf - self._t0, item))

    def add_stall(self, channel: str, seconds: float) -> None:
        with self._lock:
            self.stalls[channel] += seconds

    def add_window(self, name: str, start_s: float, end_s: float) -> None:
        with self._lock:
            self.item_windows.append((name, start_s, end_s))

    def busy(self) -> dict[str, float]:
        """Seconds each channel was busy within this step (from its ``start``; intervals of one channel
        never overlap: one worker each)."""
        out = dict.fromkeys(CHANNELS, 0.0)
        for iv in self.intervals:
            out[iv.channel] += max(0.0, iv.end_s) - max(0.0, iv.start_s)
        return out

    def to_dicts(self) -> list[dict]:
        return [iv.to_dict() for iv in self.intervals]

    def chrome_trace(self, predicted=None) -> dict:
        """Chrome/Perfetto trace (``ph: X`` events, µs): the measured step as process 1 and, when
        ``predicted`` (a ``schedule.simulator`` result) is given, the prediction as process 2."""
        from lazytrain_jax.schedule.trace import CHANNEL_TIDS
        events = []
        for pid, label in ((1, "measured"),) + (((2, "predicted"),) if predicted is not None else ()):
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}})
            events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": ch}}
                       for ch, tid in CHANNEL_TIDS.items()]
        for iv in self.intervals:
            events.append({"name": iv.name, "cat": iv.channel, "ph": "X", "pid": 1, "tid": CHANNEL_TIDS[iv.channel],
                           "ts": iv.start_s * 1e6, "dur": max(iv.end_s - iv.start_s, 0.0) * 1e6,
                           "args": {"item": iv.item}})
        if predicted is not None:
            for iv in predicted.intervals:
                if iv.step != predicted.intervals[-1].step:
                    continue  # the last simulated (steady-state) step
                events.append({"name": iv.name, "cat": iv.channel, "ph": "X", "pid": 2,
                               "tid": CHANNEL_TIDS[iv.channel], "ts": iv.start * 1e6,
                               "dur": (iv.end - iv.start) * 1e6, "args": {"step": iv.step}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path: str, predicted=None) -> None:
        from lazytrain_jax.atomic import atomic_write_text
        atomic_write_text(path, json.dumps(self.chrome_trace(predicted)))
