"""The timing model: a step as a sequence of compute windows, each as long as its busiest channel.

The executor runs a fixed sequence of *items* per step:

    P0, P1                       step tail (optimizer before the next forward; embed rows upload)
    FE, F_0 .. F_{L-1}           forward of the embedding (host gather) and of every layer
    FH                           head: final norm, LM head, loss, and their backward (chunked)
    per segment (s, e), from the top:  RC_s .. RC_{e-2} (recompute), B_{e-1} .. B_s (backward)
    BE                           backward of the embedding (host scatter-add)

Window k is the time item k computes; the transfers issued at its start must finish before
window k + 1 starts (bounded in-flight traffic, which also bounds memory). Window k carries:

- compute: item k (forward time; backward with or without in-layer recompute; recompute forward);
- H2D: what item k + 1 needs — its layer's weights (none for resident-tail layers in backward) and,
  when item k + 1 is the first item of a segment whose base boundary is on host/NVMe, that boundary;
- NVMe read: the NVMe boundary item k + 2 needs (staged to host one window before its upload);
- D2H: the gradients item k − 1 produced, and the boundary item k − 1 produced if its tier is
  host/NVMe (the boundary of layer l's output is offloaded while layer l + 1 computes);
- NVMe write: the NVMe boundary item k − 2 produced (from its host staging buffer);
- host optimizer (pipelined mode): the update of the unit item k + 2 uses first (forward items);
  in serial mode the whole update runs in P0.

    window time = max(compute, H2D / h2d_bw, D2H / d2h_bw, read / nvme_read_bw,
                      write / nvme_write_bw, optimizer);   step time = Σ windows

The MILP (``milp.py``) builds the same loads as linear expressions of its decision variables; the
simulator (``simulator.py``) plays the same transfers as events with their real dependencies.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from lazytrain_jax.schedule.memory import OFFLOAD_TIERS, segments

CHANNELS = ("compute", "h2d", "d2h", "nvme_read", "nvme_write", "optimizer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
    """One compute item of a step (see the module docstring)."""

    name: str
    phase: str                      # tail | forward | head | recompute | backward
    layer: int | None = None        # layer index for F/RC/B items
    compute: float = 0.0
    weight_bytes: float = 0.0       # bytes that must be uploaded before it starts
    weight_unit: int | None = None  # unit whose weights those are
    boundary_in: int | None = None  # offloaded boundary that must be uploaded before it starts
    produces: int | None = None     # boundary it produces in forward
    grad_bytes: float = 0.0         # gradients it sends to the host
    opt_unit: int | None = None     # unit whose update must precede its weight upload (forward)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Window:
    """Loads of one window: seconds per channel (bytes / rate), and the item computing."""

    item: Item
    seconds: dict
    bytes: dict

    @property
    def time(self) -> float:
        return max(self.seconds.values())


def items(costs, plan) -> list[Item]:
    """The item sequence of one step under ``plan``."""
    num_layers = costs.num_layers
    tiers = plan.boundary_tiers
    w, g, fwd = costs.weight_bytes, costs.grad_bytes, costs.fwd_time
    resident = [l >= num_layers - plan.resident_tail for l in range(num_layers)]
    seq = [Item(name="P0", phase="tail"), Item(name="P1", phase="tail"),
           Item(name="FE", phase="forward", compute=fwd[0], weight_bytes=w[0], weight_unit=0, produces=0, opt_unit=0)]
    for l in range(num_layers):
        seq.append(Item(name=f"F{l}", phase="forward", layer=l, compute=fwd[l + 1], weight_bytes=w[l + 1],
                        weight_unit=l + 1, produces=l + 1, opt_unit=l + 1))
    seq.append(Item(name="FH", phase="head", compute=fwd[-1], weight_bytes=w[-1], weight_unit=num_layers + 1,
                    grad_bytes=g[-1], opt_unit=num_layers + 1))
    for s, e in reversed(segments(tiers)):
        base = s if tiers[s] in OFFLOAD_TIERS else None
        for j in range(s, e - 1):
            seq.append(Item(name=f"RC{j}", phase="recompute", layer=j, compute=fwd[j + 1],
                            weight_bytes=0.0 if resident[j] else w[j + 1], weight_unit=j + 1,
                            boundary_in=base if j == s else None))
        for l in range(e - 1, s - 1, -1):
            bwd = costs.bwd_time[l + 1] if plan.keep_residuals[l] else costs.bwd_recompute_time[l + 1]
            grads = g[l + 1] + (g[0] if l == 0 else 0.0)
            seq.append(Item(name=f"B{l}", phase="backward", layer=l, compute=bwd,
                            weight_bytes=0.0 if resident[l] else w[l + 1], weight_unit=l + 1,
                            boundary_in=base if (l == s and e - s == 1) else None, grad_bytes=grads))
    seq.append(Item(name="BE", phase="backward", compute=costs.bwd_time[0]))
    return seq


def unit_opt_time(costs, hardware, unit: int) -> float:
    return costs.num_params[unit] / hardware.host_opt_rate


def windows(costs, hardware, plan) -> list[Window]:
    """Per-window channel loads of one step (see the module docstring)."""
    seq = items(costs, plan)
    tiers = plan.boundary_tiers
    a = costs.boundary_bytes
    n = len(seq)
    rates = {"h2d": hardware.h2d_bw, "d2h": hardware.d2h_bw, "nvme_read": hardware.nvme_read_bw,
             "nvme_write": hardware.nvme_write_bw}
    out = []
    for k, item in enumerate(seq):
        b = dict.fromkeys(CHANNELS[1:5], 0.0)
        if k + 1 < n:
            nxt = seq[k + 1]
            b["h2d"] += nxt.weight_bytes + (a[nxt.boundary_in] if nxt.boundary_in is not None else 0.0)
        if k + 2 < n and seq[k + 2].boundary_in is not None and tiers[seq[k + 2].boundary_in] == "nvme":
            b["nvme_read"] += a[seq[k + 2].boundary_in]
        if k >= 1:
            prev = seq[k - 1]
            b["d2h"] += prev.grad_bytes
            if prev.produces is not None and tiers[prev.produces] in OFFLOAD_TIERS:
                b["d2h"] += a[prev.produces]
        if k >= 2 and seq[k - 2].produces is not None and tiers[seq[k - 2].produces] == "nvme":
            b["nvme_write"] += a[seq[k - 2].produces]
        seconds = {"compute": item.compute}
        seconds.update({ch: b[ch] / rates[ch] for ch in b})
        opt = 0.0
        if plan.optimizer_mode == "serial":
            if k == 0:
                opt = sum(costs.num_params) / hardware.host_opt_rate
        elif k + 2 < n and seq[k + 2].opt_unit is not None:
            opt = unit_opt_time(costs, hardware, seq[k + 2].opt_unit)
        seconds["optimizer"] = opt
        out.append(Window(item=item, seconds=seconds, bytes=b))
    return out


def step_time(costs, hardware, plan) -> float:
    """Predicted seconds of one steady-state step: the sum over windows of the busiest channel.

    Args:
      costs: Costs; hardware: Hardware; plan: a Plan (or an object with its decision fields).
    Returns:
      Seconds.
    Example:
      >>> step_time(plan.costs, plan.hardware, plan)
    """
    return float(sum(win.time for win in windows(costs, hardware, plan)))


def channel_busy(wins: Sequence[Window]) -> dict[str, float]:
    """Seconds each channel is busy over a step."""
    return {ch: float(sum(w.seconds[ch] for w in wins)) for ch in CHANNELS}
