"""The plan of least device peak, exactly, by dynamic programming over the kept-boundary path.

Whether any plan fits a batch (``lt.plan(batch_size="max" | "best")``'s bisection, the MILP's
warm start, the memory a batch needs) is a question about memory alone, and the least peak has a
simple shape (``memory.device_breakdown``): no residuals kept (each kept residual, on the device or
the host, adds device bytes), no resident tail and prefetch depths 1 (each adds buffers), so the
plan-dependent part of the peak is

    Σ interior boundaries kept on the device + max over segments of the recompute working set

(a segment (s, e) of two or more layers holds boundaries s + 1 .. e − 1, and its base s too where
that is on the host or NVMe), under the host's room (host boundaries, plus two staging buffers of
the largest boundary once any boundary is on NVMe) and the NVMe's. Where every interior boundary
has the same size (every real model: they are the hidden states), room is a count, and for each
cap w on the working set (in boundaries) a dynamic program over (kept boundary, its tier class,
host boundaries so far, NVMe boundaries so far) gives the fewest device boundaries; the least of
w + that count over w (and over using NVMe or not) is the least peak. The MILP with the memory
objective proved the same least peaks (``tests/schedule/test_least_peak.py``); on the 48-layer
Qwen2.5-14B shape on an H800 it took 23-30 s to say that batches 477 and 480 fit nowhere
(``milp.first_fitting``, at its 30 s limit on 477), where this takes a fraction of a second.

Where interior boundaries differ in size (synthetic Costs) room is a knapsack and this returns
None: the callers then use the search and ``milp.first_fitting`` as before.
"""

from __future__ import annotations

import math

import numpy as np

from lazytrain_jax.schedule import steps
from lazytrain_jax.schedule.plan import Plan

_NONE = np.iinfo(np.int64).max // 4  # no way to reach a state


def uniform_boundaries(costs) -> bool:
    """Whether every interior boundary (1..L-1) has the same size (where :func:`least_peak_plan` applies)."""
    inner = costs.boundary_bytes[1:costs.num_layers]
    return not inner or max(inner) - min(inner) <= 1e-12 * max(inner)


def least_peak_plan(costs, hardware, max_segment_length: int = 8) -> Plan | None:
    """The plan of least device peak within the host's and NVMe's room (``Plan.fits`` may still be
    False: the device budget is not a constraint here), its segments at most
    ``max_segment_length`` layers; None where the interior boundaries differ in size (see the
    module docstring), or where no plan keeps the host and NVMe within their room.

    Example:
      >>> p = least_peak_plan(costs, Hardware.preset("h800")); p.fits(), p.predicted_peak_device_bytes
    """
    if not uniform_boundaries(costs):
        return None
    L = costs.num_layers
    A = costs.boundary_bytes
    S = max(1, min(max_segment_length, L))
    a = A[1] if L > 1 else 0.0
    if a <= 0:  # nothing to keep room for: every boundary on the device, nothing recomputed
        return Plan.create(costs, hardware, name="least-peak", boundary_tiers=["device"] * (L + 1))
    opts = {i: steps.tier_options(costs, hardware, i) for i in range(1, L)}
    best = None  # (device boundaries + cap, tiers)
    for use_nvme in (False, True):
        if use_nvme and not any("nvme" in o for o in opts.values()):
            continue
        host_room = hardware.host_memory - (2 * max(A) if use_nvme else 0.0)
        if host_room < 0:
            continue
        ch = min(L, math.floor(host_room / a * (1 + 1e-12)))
        cn = min(L, math.floor(hardware.nvme_memory / a * (1 + 1e-12))) if use_nvme else 0
        for w in range(S, -1, -1):
            # at least ⌈L / (w + 1)⌉ segments (at most S), so that many boundaries less one kept, at
            # most ch + cn of them off the device: a cap that cannot beat the best so far is skipped
            fewest = -(-L // min(S, w + 1)) - 1 - ch - cn
            if best is not None and w + max(0, fewest) >= best[0]:
                continue
            found = _fewest_on_device(L, S, w, ch, cn, opts, use_nvme)
            if found is not None and (best is None or found[0] + w < best[0]):
                best = (found[0] + w, found[1])
    if best is None:
        return None
    return Plan.create(costs, hardware, name="least-peak", boundary_tiers=best[1])


def _fewest_on_device(L, S, w, ch, cn, opts, use_nvme):
    """The fewest interior boundaries on the device over paths whose segments hold at most ``w``
    boundaries each, with at most ``ch`` on the host and ``cn`` on NVMe: ``(count, tiers)``, or
    None where no path keeps within that.

    ``f[i][t]``: for boundary i kept with tier class t (0: device, 1: host or NVMe), the fewest
    device boundaries up to i per (host count, NVMe count) so far; a segment (i, j) of two or more
    layers holds j − i − 1 boundaries, and its base too where t is 1."""
    shape = (ch + 1, cn + 1)
    f = {(0, 0): np.full(shape, _NONE, dtype=np.int64)}
    f[0, 0][0, 0] = 0
    end = np.full(shape, _NONE, dtype=np.int64)

    def lengths(i, t):
        for n in range(1, min(S, L - i) + 1):
            if not _holds(n, t, w):
                return
            yield i + n

    for i in range(L):
        for t in (0, 1):
            g = f.get((i, t))
            if g is None or g.min() >= _NONE:
                continue
            for j in lengths(i, t):
                if j == L:
                    np.minimum(end, g, out=end)
                    continue
                _relax(f, (j, 0), g + 1, shape)
                if "host" in opts[j] and ch > 0:
                    _relax(f, (j, 1), _one_more(g, 0), shape)
                if use_nvme and "nvme" in opts[j] and cn > 0:
                    _relax(f, (j, 1), _one_more(g, 1), shape)
    if end.min() >= _NONE:
        return None
    count = int(end.min())
    return count, _tiers(f, end, count, L, w, opts, use_nvme, S)


def _holds(n, t, w) -> bool:
    """Whether a segment of ``n`` layers from a base of tier class ``t`` (1: host or NVMe, fetched
    back for it) keeps within ``w`` boundaries of working set: it holds n − 1 of them, and its
    base where t is 1; a one-layer segment holds none."""
    return n < 2 or n - 1 + t <= w


def _one_more(g, axis):
    """``g`` moved one step along ``axis`` (one more boundary on the host: 0, or on NVMe: 1)."""
    moved = np.full(g.shape, _NONE, dtype=np.int64)
    if axis == 0:
        moved[1:, :] = g[:-1, :]
    else:
        moved[:, 1:] = g[:, :-1]
    return moved


def _relax(f, key, values, shape):
    current = f.get(key)
    if current is None:
        f[key] = np.minimum(values, _NONE)
    else:
        np.minimum(current, values, out=current)


def _tiers(f, end, count, L, w, opts, use_nvme, S):
    """The tiers of one path reaching ``end``'s least count (back from boundary L)."""
    def reaches(i, t, h, n, value):
        g = f.get((i, t))
        return g is not None and 0 <= h < g.shape[0] and 0 <= n < g.shape[1] and g[h, n] == value

    def preds(j):  # (i, t) with a segment (i, j) allowed
        for i in range(max(0, j - S), j):
            for t in (0, 1):
                if _holds(j - i, t, w):
                    yield i, t

    tiers = ["drop"] * (L + 1)
    tiers[0] = tiers[L] = "device"
    h, n = map(int, np.unravel_index(int(np.argmin(end)), end.shape))
    j, value = L, count
    state = next((i, t) for i, t in preds(L) if reaches(i, t, h, n, value))
    while state[0] > 0:
        i, t = state
        if t == 0:
            tiers[i], value = "device", value - 1
        elif "host" in opts[i] and h > 0 and any(reaches(k, s, h - 1, n, value) for k, s in preds(i)):
            tiers[i], h = "host", h - 1
        else:
            tiers[i], n = "nvme", n - 1
        state = next((k, s) for k, s in preds(i) if reaches(k, s, h, n, value))
    return tiers
