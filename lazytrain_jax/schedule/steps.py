"""The step model: one description of a step's items and transfers, read by every planner part.

The executor runs a fixed sequence of *items* per step (``items``):

    P0, P1                       step tail (optimizer before the next forward; embed rows upload)
    FE, F_0 .. F_{L-1}           forward of the embedding (host gather) and of every layer
    FH                           head: final norm, LM head, loss, and their backward (chunked)
    per segment (s, e), from the top:  RC_s .. RC_{e-2} (recompute), B_{e-1} .. B_s (backward)
    BE                           backward of the embedding (host scatter-add)

Window k is the time item k computes. Every transfer (``transfers``) has a channel, an amount
(bytes; parameters for the host optimizer), a *release* window (the first window it may use) and a
*deadline* window (it must be done before window ``deadline + 1`` starts). With item j's position
j, d = ``weight_prefetch_depth`` and a = ``act_prefetch_depth``:

- ``weights`` of item j (none for resident-tail layers in backward): H2D, windows j − d .. j − 1;
- ``boundary`` item j fetches (the host base of its segment): H2D, windows j − a .. j − 1; an NVMe
  base is ``read`` from NVMe in window j − 2 and uploaded in window j − 1 (no look-ahead);
- ``grads`` item j produced and the ``offload`` of the boundary it produced (host/NVMe tier): D2H,
  window j + 1; an NVMe boundary is ``write``-n from its host staging buffer in window j + 2;
- residuals of a layer l kept on the host (``Plan.offload_residuals``): ``res_offload`` D2H in
  window j + 1 after its forward item j; ``res_fetch`` H2D before its backward item j',
  windows max(j' − a, j + 2) .. j' − 1 (like a host boundary's fetch, never before the copy down);
- ``update`` of the unit a forward item j uses (pipelined optimizer): the host optimizer, from the
  step's start (one chain in unit order, the previous backward's global norm known) until window
  j − d − 1 (done before that unit's upload may begin); in serial mode every update is in P0.

The windows are evaluated as a fluid, earliest-deadline-first schedule (``windows``): in window k
each channel first does what is due in k; the window lasts as long as its busiest channel
(``max(compute, due / rate)``); every channel then uses the rest of the window for released work
due later, earliest deadline first (prefetching). Where the device computes on the host's own
cores (``Hardware.host_shares_device``: the CPU backend) no channel is a resource of its own: the
"transfers" are memory copies and the optimizer is arithmetic, both on the cores the compute runs
on, so a window lasts the sum of its loads (``compute + Σ due / rate``) and nothing is prefetched
(work moved to an earlier window only lengthens that one; measured on 2 cores: a 45 MB upload
beside a 41 ms layer forward lengthened it by the upload's own time, 5.8 ms, not 0). ``step time = Σ windows``. For transfers whose
release and deadline windows are ordered alike (all of them here) this is the least Σ windows over
every split of the transfers among their windows, so the MILP's LP over split variables
(``milp.py``) reaches the same value; the simulator (``simulator.py``) issues the same transfers
at the start of their release windows and lets each item wait for what is due before it;
the search (``search.py``) evaluates the same windows incrementally.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Sequence

from lazytrain_jax.schedule.memory import OFFLOAD_TIERS, offloaded_residuals, segments

CHANNELS = ("compute", "h2d", "d2h", "nvme_read", "nvme_write", "optimizer")
TRANSFER_CHANNELS = CHANNELS[1:]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Item:
    """One compute item of a step (see the module docstring).

    Units are addressed by their index in ``Costs.unit_names``: 0 = ``embed``, l + 1 = ``layer_l``,
    L + 1 = ``head``; boundaries by their index 0..L; ``layer`` is the layer index l.
    """

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
    residual_down: float = 0.0      # residual bytes it sends to the host (forward, offloaded residuals)
    residual_in: float = 0.0        # residual bytes fetched back before it starts (backward)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Transfer:
    """One transfer of a step: ``amount`` on ``channel`` within windows ``release .. deadline``.

    kind: weights | boundary | read | grads | offload | write | update | res_offload | res_fetch;
    item: the position of the item it serves (uploads, reads, updates) or that produced it
    (downloads, writes); ref: the unit (weights, grads, update), boundary (boundary, read, offload,
    write) or layer (res_offload, res_fetch) it moves.
    """

    channel: str
    kind: str
    item: int
    ref: int
    amount: float
    release: int
    deadline: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Window:
    """Loads of one window: seconds per channel (amount done / rate), amounts, and the item."""

    item: Item
    seconds: dict
    bytes: dict
    shared: bool = False   # every channel on the compute's cores (Hardware.host_shares_device)

    @property
    def time(self) -> float:
        if self.shared:
            return sum(self.seconds.values())
        return max(self.seconds.values())


# ---- unit addressing --------------------------------------------------------------------------
# One scheme in the planner: a unit is its integer index into ``Costs.unit_names`` (0 = embed,
# l + 1 = layer l, L + 1 = head). Its name and its path in ``model.params`` are derived from the
# index by the functions below, never stored a second way.

def layer_unit(layer: int) -> int:
    """The unit index of layer ``layer``."""
    return layer + 1


def unit_name(unit: int, num_layers: int) -> str:
    """``embed`` | ``layer_{l}`` | ``head`` for a unit index (the entries of ``Costs.unit_names``)."""
    if isinstance(unit, bool) or not isinstance(unit, int) or not 0 <= unit <= num_layers + 1:
        raise ValueError(f"unit={unit!r}; valid: 0..{num_layers + 1}")
    return "embed" if unit == 0 else "head" if unit == num_layers + 1 else f"layer_{unit - 1}"


def unit_index(name: str, num_layers: int) -> int:
    """The unit index of ``embed`` | ``layer_{l}`` | ``head``."""
    if name == "embed":
        return 0
    if name == "head":
        return num_layers + 1
    if isinstance(name, str) and name.startswith("layer_") and name[6:].isdigit() and int(name[6:]) < num_layers:
        return int(name[6:]) + 1
    raise ValueError(f"unit name {name!r}; valid: 'embed', 'layer_0'..'layer_{num_layers - 1}', 'head'")


def unit_param_path(unit: int, num_layers: int) -> tuple:
    """Where a unit's weights live in ``model.params``: ("embed",), ("layers", l) or ("head",)."""
    name = unit_name(unit, num_layers)
    return ("layers", unit - 1) if name.startswith("layer_") else (name,)


def nvme_allowed(boundary: int, num_layers: int) -> bool:
    """NVMe holds boundaries 1..L-3 only (their write and read windows stay ordered)."""
    return 1 <= boundary <= num_layers - 3


def residual_offload_allowed(layer: int, num_layers: int) -> bool:
    """Residuals of layers 0..L-2 may go to the host (the last layer's backward item follows its
    forward by two items: no window between the copy down and the fetch back)."""
    return 0 <= layer <= num_layers - 2


def tier_options(costs, hardware, boundary: int) -> tuple[str, ...]:
    """The tiers boundary ``boundary`` (1..L-1) may take within the budgets, on their own."""
    num_layers = costs.num_layers
    a = costs.boundary_bytes
    opts = ["device", "drop"]
    if a[boundary] <= hardware.host_memory:
        opts.append("host")
    if (nvme_allowed(boundary, num_layers) and a[boundary] <= hardware.nvme_memory
            and 2 * max(a) <= hardware.host_memory):
        opts.append("nvme")
    return tuple(opts)


def items(costs, plan) -> list[Item]:
    """The item sequence of one step under ``plan``.

    Args:
      costs: Costs; plan: a Plan (or an object with its decision fields).
    Returns:
      The list of Items in execution order.
    Example:
      >>> [it.name for it in items(plan.costs, plan)][:4]
      ['P0', 'P1', 'FE', 'F0']
    """
    num_layers = costs.num_layers
    tiers = plan.boundary_tiers
    w, g, fwd = costs.link_weight_bytes, costs.link_grad_bytes, costs.fwd_time  # the links' bytes
    resident = [l >= num_layers - plan.resident_tail for l in range(num_layers)]
    off = offloaded_residuals(plan)
    r = costs.residual_bytes
    seq = [Item(name="P0", phase="tail"), Item(name="P1", phase="tail"),
           Item(name="FE", phase="forward", compute=fwd[0], weight_bytes=w[0], weight_unit=0, produces=0, opt_unit=0)]
    for l in range(num_layers):
        seq.append(Item(name=f"F{l}", phase="forward", layer=l, compute=fwd[l + 1], weight_bytes=w[l + 1],
                        weight_unit=layer_unit(l), produces=l + 1, opt_unit=layer_unit(l),
                        residual_down=r[l] if off[l] else 0.0))
    seq.append(Item(name="FH", phase="head", compute=fwd[-1], weight_bytes=w[-1], weight_unit=num_layers + 1,
                    grad_bytes=g[-1], opt_unit=num_layers + 1))
    for s, e in reversed(segments(tiers)):
        base = s if tiers[s] in OFFLOAD_TIERS else None
        for j in range(s, e - 1):
            seq.append(Item(name=f"RC{j}", phase="recompute", layer=j, compute=fwd[j + 1],
                            weight_bytes=0.0 if resident[j] else w[j + 1], weight_unit=layer_unit(j),
                            boundary_in=base if j == s else None))
        for l in range(e - 1, s - 1, -1):
            bwd = costs.bwd_time[l + 1] if plan.keep_residuals[l] else costs.bwd_recompute_time[l + 1]
            grads = g[l + 1] + (g[0] if l == 0 else 0.0)
            seq.append(Item(name=f"B{l}", phase="backward", layer=l, compute=bwd,
                            weight_bytes=0.0 if resident[l] else w[l + 1], weight_unit=layer_unit(l),
                            boundary_in=base if (l == s and e - s == 1) else None, grad_bytes=grads,
                            residual_in=r[l] if off[l] else 0.0))
    seq.append(Item(name="BE", phase="backward", compute=costs.bwd_time[0]))
    return seq


def transfers(costs, plan, seq: Sequence[Item] | None = None) -> list[Transfer]:
    """Every transfer of one step under ``plan`` with its release and deadline windows.

    Args:
      costs: Costs; plan: a Plan (or an object with its decision fields); seq: ``items(costs, plan)``
        if already built.
    Returns:
      Transfers in issue order (release window, then deadline).
    Example:
      >>> [t for t in transfers(plan.costs, plan) if t.kind == "weights"][0].deadline
      1
    """
    seq = items(costs, plan) if seq is None else seq
    tiers = plan.boundary_tiers
    a = costs.boundary_bytes
    d, da = plan.weight_prefetch_depth, plan.act_prefetch_depth
    n = len(seq)
    forward_pos = {it.layer: j for j, it in enumerate(seq) if it.phase == "forward" and it.layer is not None}
    out = []
    for j, it in enumerate(seq):
        if it.weight_bytes and j >= 1:
            out.append(Transfer(channel="h2d", kind="weights", item=j, ref=it.weight_unit, amount=it.weight_bytes,
                                release=max(0, j - d), deadline=j - 1))
        b = it.boundary_in
        if b is not None:
            if tiers[b] == "nvme":
                out.append(Transfer(channel="nvme_read", kind="read", item=j, ref=b, amount=a[b], release=j - 2,
                                    deadline=j - 2))
                out.append(Transfer(channel="h2d", kind="boundary", item=j, ref=b, amount=a[b], release=j - 1,
                                    deadline=j - 1))
            else:
                out.append(Transfer(channel="h2d", kind="boundary", item=j, ref=b, amount=a[b],
                                    release=max(0, j - da), deadline=j - 1))
        if it.residual_in:
            out.append(Transfer(channel="h2d", kind="res_fetch", item=j, ref=it.layer, amount=it.residual_in,
                                release=max(0, j - da, forward_pos[it.layer] + 2), deadline=j - 1))
        if it.residual_down:
            out.append(Transfer(channel="d2h", kind="res_offload", item=j, ref=it.layer, amount=it.residual_down,
                                release=j + 1, deadline=j + 1))
        if it.grad_bytes and j + 1 < n:
            out.append(Transfer(channel="d2h", kind="grads", item=j, ref=it.weight_unit, amount=it.grad_bytes,
                                release=j + 1, deadline=j + 1))
        p = it.produces
        if p is not None and tiers[p] in OFFLOAD_TIERS:
            out.append(Transfer(channel="d2h", kind="offload", item=j, ref=p, amount=a[p], release=j + 1,
                                deadline=j + 1))
            if tiers[p] == "nvme":
                out.append(Transfer(channel="nvme_write", kind="write", item=j, ref=p, amount=a[p], release=j + 2,
                                    deadline=j + 2))
        if it.opt_unit is not None:
            w = 0 if plan.optimizer_mode == "serial" else max(0, j - d - 1)
            out.append(Transfer(channel="optimizer", kind="update", item=j, ref=it.opt_unit,
                                amount=float(costs.optimizer_params[it.opt_unit]), release=0, deadline=w))
    out.sort(key=lambda t: (t.release, t.deadline, t.item))
    return out


def unit_opt_times(costs, hardware) -> list[float]:
    """Per unit (``Costs.unit_names`` order), seconds of the host optimizer's update: its
    ``Costs.optimizer_params`` at ``Hardware.host_opt_rate``."""
    return [float(p) / hardware.host_opt_rate for p in costs.optimizer_params]


def rates(hardware) -> dict[str, float]:
    """Rate of every transfer channel: bytes/s, parameters/s for the host optimizer."""
    return {"h2d": hardware.h2d_bw, "d2h": hardware.d2h_bw, "nvme_read": hardware.nvme_read_bw,
            "nvme_write": hardware.nvme_write_bw, "optimizer": hardware.host_opt_rate}


def windows(costs, hardware, plan) -> list[Window]:
    """Per-window loads of one step: the fluid earliest-deadline-first schedule of the module docstring.

    Args:
      costs: Costs; hardware: Hardware; plan: a Plan (or an object with its decision fields).
    Returns:
      One Window per item; ``Window.time`` is the window's length.
    Example:
      >>> sum(w.time for w in windows(plan.costs, plan.hardware, plan))
    """
    seq = items(costs, plan)
    rate = rates(hardware)
    shared = hardware.host_shares_device
    todo = transfers(costs, plan, seq)
    left = [t.amount for t in todo]
    by_deadline: list[list[int]] = [[] for _ in seq]
    for i, t in enumerate(todo):
        if t.deadline < len(seq):  # (every transfer is due within the step; a later one never forced)
            by_deadline[t.deadline].append(i)
    # released transfers not yet done, per channel, earliest deadline first (then item, then release
    # order): a heap of (deadline, item, index); those finished are dropped when they reach the top
    pending: dict[str, list] = {ch: [] for ch in TRANSFER_CHANNELS}
    nxt = 0
    out = []
    for k, it in enumerate(seq):
        while nxt < len(todo) and todo[nxt].release <= k:
            t = todo[nxt]
            heapq.heappush(pending[t.channel], (t.deadline, t.item, nxt))
            nxt += 1
        due = dict.fromkeys(TRANSFER_CHANNELS, 0.0)
        for i in by_deadline[k]:
            due[todo[i].channel] += left[i]
            left[i] = 0.0
        busy = [due[ch] / rate[ch] for ch in TRANSFER_CHANNELS]
        # shared cores: the loads run one after another, and no idle time is left to prefetch in
        time = it.compute + sum(busy) if shared else max([it.compute] + busy)
        done = dict(due)
        if not shared:
            for ch in TRANSFER_CHANNELS:
                room = time * rate[ch] - due[ch]
                heap = pending[ch]
                while heap and room > 0.0:
                    i = heap[0][2]
                    if left[i] <= 0.0:
                        heapq.heappop(heap)
                        continue
                    take = min(room, left[i])
                    left[i] -= take
                    room -= take
                    done[ch] += take
                    if left[i] <= 0.0:
                        heapq.heappop(heap)
        seconds = {"compute": it.compute}
        seconds.update({ch: done[ch] / rate[ch] for ch in TRANSFER_CHANNELS})
        out.append(Window(item=it, seconds=seconds, bytes=done, shared=shared))
    return out


def step_time(costs, hardware, plan) -> float:
    """Predicted seconds of one steady-state step: the sum of the windows' lengths.

    Args:
      costs: Costs; hardware: Hardware; plan: a Plan (or an object with its decision fields).
    Returns:
      Seconds.
    Example:
      >>> step_time(plan.costs, plan.hardware, plan)
    """
    return float(sum(w.time for w in windows(costs, hardware, plan)))
