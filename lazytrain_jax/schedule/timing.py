"""The timing model of a step: windows of the step model (``steps.py``), each as long as its busiest
channel, and the step time as their sum.

The item sequence, the transfers with their release and deadline windows and the window
evaluation live in ``steps.py`` (one description read by the timing model, the search, the MILP and
the simulator); this module keeps the names the executor and the tools use:

    window time = max(compute, H2D / h2d_bw, D2H / d2h_bw, read / nvme_read_bw,
                      write / nvme_write_bw, updates / host_opt_rate);   step time = Σ windows
"""

from __future__ import annotations

from typing import Sequence

from lazytrain_jax.schedule.steps import (CHANNELS, Item, Transfer, Window, items, step_time, transfers,
                                          unit_opt_times, windows)

__all__ = ["CHANNELS", "Item", "Transfer", "Window", "channel_busy", "items", "step_time", "transfers",
           "unit_opt_time", "unit_opt_times", "windows"]


def unit_opt_time(costs, hardware, unit: int) -> float:
    """Seconds of the host optimizer's update of unit ``unit`` (index into ``Costs.unit_names``)."""
    return unit_opt_times(costs, hardware)[unit]


def channel_busy(wins: Sequence[Window]) -> dict[str, float]:
    """Seconds each channel is busy over a step."""
    return {ch: float(sum(w.seconds[ch] for w in wins)) for ch in CHANNELS}
