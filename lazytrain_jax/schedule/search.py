"""A fast primal heuristic for the MILP: greedy construction plus local search on the exact models.

The MILP's LP relaxation is tight on the step-time objective (within ~0.5% on the 27B shapes) but
highly fractional and symmetric over identical layers (it drops every boundary by a few percent),
so CBC's own rounding heuristics find good incumbents slowly. This module finds one directly, in
the MILP's decision space (segments of at most ``max_segment_length``, resident tail of at most
``max_resident_tail``, the same tier restrictions), evaluated with a lean re-implementation of
``timing.step_time`` and ``memory``'s peaks (checked equal to them in the tests), at the plan's
prefetch depths. At depth 1 every window is timed on its own; at depth 2 a window's idle upload
time takes part of the next window's uploads, so the windows form one chain (``FastModel._chain``)
and a move replays it from the windows it changes until the carry (bytes uploaded ahead, the host
optimizer's progress) is back on the old track (``FastModel._replay``):

1. start from every boundary on device, no residuals, no resident tail;
2. while the device peak exceeds the budget, apply the moves (device → host / NVMe / drop) with the
   smallest step-time increase per freed device byte (several far-apart moves per round);
3. spend the remaining device memory on residuals and the resident tail (largest saving per byte);
   beside these constructions, ``_counted_paths`` (a dynamic program over the kept-boundary path per
   cap on the recompute working set) proposes plans the greedy cannot reach when memory is tight;
4. local search: single-boundary tier changes, residual toggles, tail changes and host ↔ NVMe ↔
   drop ↔ device swaps between two boundaries, first improvement, until no move helps or the
   evaluation budget is spent (a count of move evaluations, not wall-clock time: the same input
   gives the same plan whatever the machine load).

The result is handed to CBC as ``model.start``; CBC then only has to close the (small) gap.
``round_relaxation`` starts instead from the MILP's LP solution, rounded (the most likely path,
each decision by its share), and runs steps 2-4 from there: the solve's plan where the LP proves it
(``milp._Solve.round_union``).
"""

from __future__ import annotations

import itertools
import math

from lazytrain_jax.schedule import memory, steps
from lazytrain_jax.schedule.plan import Plan

_OFF = ("host", "nvme")


# FastModel.try_tier's local parts kept at most (about 0.9 kB each; a search at 128 layers keeps
# 12,471 on varied seed 27); past it they are dropped and computed again
TIER_CACHE_ENTRIES = 50_000


class FastModel:
    """Step time and peaks of a plan given as (tiers, keep, k), without building Items/Windows, at
    the prefetch depths it is made for (``weight_prefetch_depth``, ``act_prefetch_depth``).

    ``keep[l]`` is False (recompute in backward), True (residuals kept on device) or ``"host"``
    (kept on the host: ``Plan.offload_residuals``).
    """

    def __init__(self, costs, hardware, *, max_segment_length: int, max_resident_tail: int,
                 residual_offload: bool = True, weight_prefetch_depth: int = 1, act_prefetch_depth: int = 1):
        self.costs, self.hw = costs, hardware
        self.dw, self.da = weight_prefetch_depth, act_prefetch_depth
        L = self.L = costs.num_layers
        self.S = max(1, min(max_segment_length, L))
        self.K = max(0, min(max_resident_tail, L))
        self.A = list(costs.boundary_bytes)
        self.w = list(costs.link_weight_bytes)  # as the links spend them (the head's measured factor)
        self.g = list(costs.link_grad_bytes)
        self.fwd = list(costs.fwd_time)
        self.bwd = list(costs.bwd_time)
        self.bwd_rc = list(costs.bwd_recompute_time)
        self.R = list(costs.residual_bytes)
        self.opt = steps.unit_opt_times(costs, hardware)
        self.h2d, self.d2h = hardware.h2d_bw, hardware.d2h_bw
        self.nr, self.nw = hardware.nvme_read_bw, hardware.nvme_write_bw
        a_max = max(self.A)
        self.a_max = a_max
        opts = [steps.tier_options(costs, hardware, i) if 1 <= i <= L - 1 else () for i in range(L + 1)]
        self.host_ok = ["host" in o for o in opts]
        self.nvme_ok = ["nvme" in o for o in opts]
        const = memory.constant_bytes(costs, hardware, weight_prefetch_depth=self.dw, act_prefetch_depth=self.da)
        self.base_mem = sum(const.values())
        wl = costs.layer("weight_bytes")
        self.tail_mem = [float(sum(wl[L - k:])) if k else 0.0 for k in range(L + 1)]
        # residuals / tail are only worth it where the MILP allows them (same filters)
        slack = hardware.device_memory - self.base_mem
        self.res_ok = [self.R[l] <= slack and self.bwd_rc[l + 1] > self.bwd[l + 1] for l in range(L)]
        self.off_ok = [residual_offload and self.res_ok[l] and steps.residual_offload_allowed(l, L)
                       and self.R[l] <= hardware.host_memory for l in range(L)]
        # forward windows (P0 .. FH) and the host optimizer's cumulative seconds due by each of them
        self.F = L + 4
        due = [0.0] * self.F
        for j, unit in [(2, 0)] + [(3 + l, l + 1) for l in range(L)] + [(L + 3, L + 1)]:
            due[max(0, j - self.dw - 1)] += self.opt[unit]
        self.opt_due = [sum(due[:k + 1]) for k in range(self.F)]
        # where the device computes on the host's cores every load of a window runs in turn (steps.py)
        self.shared = hardware.host_shares_device
        # a deeper prefetch lets a window's idle upload time take part of the next window's
        # uploads: the windows are then one chain (``_chain``), not independent
        self.deep = (self.dw, self.da) != (1, 1) and not self.shared
        self._tier_cache = {}

    # ---- the item sequence and its windows (same as timing.items / timing.windows) --------------

    def forward_items(self, keep=None):
        L, w, g, fwd = self.L, self.w, self.g, self.fwd
        keep = [False] * L if keep is None else keep
        # items: (compute, up_bytes, boundary_in, produces, grad_bytes, opt_unit, residual_down, residual_in,
        # boundary_in's tier, the forward position of the layer whose residuals it fetches)
        seq = [(0.0, 0.0, None, None, 0.0, None, 0.0, 0.0, None, None),
               (0.0, 0.0, None, None, 0.0, None, 0.0, 0.0, None, None),
               (fwd[0], w[0], None, 0, 0.0, 0, 0.0, 0.0, None, None)]
        for l in range(L):
            seq.append((fwd[l + 1], w[l + 1], None, l + 1, 0.0, l + 1, self.R[l] if keep[l] == "host" else 0.0, 0.0,
                        None, None))
        seq.append((fwd[-1], w[-1], None, None, g[-1], L + 1, 0.0, 0.0, None, None))
        return seq

    def segment_items(self, s, e, tiers, keep, k):
        """Backward items of segment (s, e): recompute s..e-2, then backward e-1..s."""
        w, g, fwd = self.w, self.g, self.fwd
        resident_from = self.L - k
        base, tier = (s, tiers[s]) if tiers[s] in _OFF else (None, None)
        out = []
        for j in range(s, e - 1):
            out.append((fwd[j + 1], 0.0 if j >= resident_from else w[j + 1], base if j == s else None, None, 0.0, None,
                        0.0, 0.0, tier if j == s else None, None))
        for l in range(e - 1, s - 1, -1):
            c = self.bwd[l + 1] if keep[l] else self.bwd_rc[l + 1]
            grads = g[l + 1] + (g[0] if l == 0 else 0.0)
            last = l == s and e - s == 1
            fetched = keep[l] == "host"
            out.append((c, 0.0 if l >= resident_from else w[l + 1], base if last else None,
                        None, grads, None, 0.0, self.R[l] if fetched else 0.0, tier if last else None,
                        3 + l if fetched else None))
        return out

    def _parts(self, seq, k_, tiers):
        """Window k_'s loads in bytes (seconds for compute): (compute, upload due (the next item's
        weights, base and residuals), download (the previous item's gradients, residuals and the
        boundary it produced, if offloaded), NVMe read (the base of the item after next), NVMe
        write (the boundary the item before the previous one produced), and the uploads of the
        item after next released in this window at a deeper prefetch: its weights at weight depth
        2, its host base and residual fetch at activation depth 2)."""
        A = self.A
        n = len(seq)
        c = seq[k_][0]
        up = down = read = write = early = 0.0
        if k_ + 1 < n:
            nxt = seq[k_ + 1]
            up = nxt[1] + (A[nxt[2]] if nxt[2] is not None else 0.0) + nxt[7]
        if k_ + 2 < n:
            item = seq[k_ + 2]
            if item[8] == "nvme":
                read = A[item[2]]
            if self.dw > 1:
                early = item[1]
            if self.da > 1:
                if item[8] == "host":
                    early += A[item[2]]
                if item[7] and item[9] + 2 <= k_:   # a residual fetch, never before its copy down
                    early += item[7]
        if k_ >= 1:
            prev = seq[k_ - 1]
            down = prev[4] + prev[6]
            p = prev[3]
            if p is not None and tiers[p] in _OFF:
                down += A[p]
        if k_ >= 2:
            p = seq[k_ - 2][3]
            if p is not None and tiers[p] == "nvme":
                write = A[p]
        return c, up, down, read, write, early

    def window(self, seq, k_, tiers) -> float:
        """Window k_'s length at depth 1 (``steps.windows``: its busiest channel, or on shared cores
        the sum of its loads)."""
        c, up, down, read, write, _ = self._parts(seq, k_, tiers)
        if self.shared:
            return c + up / self.h2d + down / self.d2h + read / self.nr + write / self.nw
        return max(c, up / self.h2d, down / self.d2h, read / self.nr, write / self.nw)

    def loads(self, seq, k_, tiers):
        """Window k_'s loads for the chain of a deeper prefetch (``_chain``): (its length from
        every channel but the upload link, the bytes due on that link, the bytes of the item after
        next released in it)."""
        c, up, down, read, write, early = self._parts(seq, k_, tiers)
        return max(c, down / self.d2h, read / self.nr, write / self.nw), up, early

    def _chain(self, loads, old=None, first=0, last=-1, shift=0):
        """(total, forward total, lengths, uploads done ahead, optimizer seconds done, running sums)
        of the windows with loads ``loads`` (``loads``), as ``steps.windows`` plays them at a deeper
        prefetch: each window's upload link first does what is due (less what the window before did
        ahead), the window lasts as long as its busiest channel (the host optimizer's chain in the
        forward windows), and the link's idle time then takes the released part of the item after
        next. The last four are per window (after it), what :meth:`_replay` restarts from.

        ``old``: a state whose windows before ``first`` have these loads, and whose windows after
        ``last`` have those of the windows ``shift`` places later here (:meth:`changed`): the chain
        starts at ``first`` from ``old``'s carry, and past ``last`` takes ``old``'s windows as they
        are once its carry (uploads done ahead, the optimizer's progress) is back on their track.
        The same numbers as played whole: the running sums add the same lengths in the same order."""
        F, step = self.F, self._step
        if old is not None and first > 0:
            lengths, pres, dones = old["wc"][:first], old["pres"][:first], old["dones"][:first]
            prefix = old["prefix"][:first + 1]
            total, pre, done = prefix[-1], pres[-1], dones[-1]
        else:
            first, total, pre, done = 0, 0.0, 0.0, 0.0
            lengths, pres, dones, prefix = [], [], [], [0.0]
        for k in range(first, len(loads)):
            if old is not None and k > last and k:
                o = k - 1 - shift  # window k - 1 is old's window o: back on its track?
                if pre == old["pres"][o] and (k >= F or done == old["dones"][o]):
                    rest = old["wc"][o + 1:]
                    lengths += rest
                    pres += old["pres"][o + 1:]
                    dones += old["dones"][o + 1:]
                    prefix += itertools.islice(itertools.accumulate(rest, initial=total), 1, None)
                    total = prefix[-1]
                    break
            t, pre, done = step(k, loads[k], pre, done)
            total += t
            lengths.append(t)
            pres.append(pre)
            dones.append(done)
            prefix.append(total)
        return total, prefix[min(F, len(loads))], lengths, pres, dones, prefix

    def _step(self, k, loads, pre, done):
        """One window of the chain (``_chain``, ``_replay``): window k with loads ``loads``
        (``loads``), ``pre`` bytes of its upload done by the window before and ``done`` seconds of
        the host optimizer done before it: (its length, the bytes of the next window's upload it
        does ahead, the optimizer's seconds done after it)."""
        other, up, early = loads
        due = up - pre
        t = due / self.h2d
        if other > t:
            t = other
        if k < self.F:
            opt_due = self.opt_due
            if opt_due[k] - done > t:
                t = opt_due[k] - done
            done = min(opt_due[-1], done + t)
        room = t * self.h2d - due
        pre = 0.0 if room <= 0.0 or early <= 0.0 else (early if early < room else room)
        return t, pre, done

    def _replay(self, st, loads, changed, a=None, n_block=0, shift=0):
        """The step time of ``st``'s plan with the windows' loads ``loads`` (a deeper prefetch),
        where only the windows ``changed`` (sorted indices into ``loads``) differ from ``st``'s:
        the chain restarts at the first changed window and, past each run of changed windows,
        jumps to the next once its carry (uploads done ahead, the optimizer's progress) is back on
        ``st``'s track. ``loads[a:a + n_block]`` replace ``st``'s windows ``a .. a + n_block -
        shift - 1``; the windows after them are ``st``'s, ``shift`` places later."""
        F, step = self.F, self._step
        pres, dones, prefix = st["pres"], st["dones"], st["prefix"]
        old_total = prefix[-1]
        if a is None:
            a = len(loads)

        def old(j):   # st's index of window j (outside the replaced block)
            return j if j < a else j - shift

        n = len(loads)
        k = changed[0]
        total = prefix[k]
        pre = pres[k - 1] if k else 0.0
        done = dones[k - 1] if k else 0.0
        ci, nc = 0, len(changed)   # changed[ci]: the next changed window
        while k < n:
            while ci < nc and changed[ci] < k:
                ci += 1
            if k and (ci == nc or changed[ci] > k) and not a <= k - 1 < a + n_block:
                o = old(k - 1)   # window k - 1 is st's window o: back on its track?
                if pre == pres[o] and (k >= F or done == dones[o]):
                    if ci == nc:
                        return total + old_total - prefix[o + 1]
                    k = changed[ci]
                    o2 = old(k - 1)
                    total += prefix[o2 + 1] - prefix[o + 1]
                    pre, done = pres[o2], dones[o2]
                    continue
            t, pre, done = step(k, loads[k], pre, done)
            total += t
            k += 1
        return total

    def forward_total(self, base) -> float:
        """Σ of the forward windows 0..F-1 given their lengths without the optimizer: the host
        optimizer is one chain from the step's start, each update due (weight depth + 1) windows
        before its unit's item (the step model's fluid schedule; at depth 1 only: a deeper
        prefetch times the forward windows in ``_chain``). Where the host's cores compute
        (``Hardware.host_shares_device``) the optimizer adds its seconds due to the window's other
        loads and never works ahead."""
        return self._forward(base)[0]

    def _forward(self, base):
        """(total, done, prefix): the optimizer's seconds done after each forward window and the
        windows' running sums (what :meth:`_forward_changed` restarts from)."""
        done = total = 0.0
        dones, prefix = [], [0.0]
        for k in range(self.F):
            t, done = self._opt_window(k, base[k], done)
            total += t
            dones.append(done)
            prefix.append(total)
        return total, dones, prefix

    def _opt_window(self, k, b, done):
        """Forward window k, of length b without the optimizer: (its length with the optimizer,
        the optimizer's seconds done after it)."""
        busy = b if self.shared else 0.0
        t = max(b, busy + self.opt_due[k] - done)
        return t, min(self.opt_due[-1], done + t - busy)

    def _forward_changed(self, st, new) -> float:
        """``forward_total`` of ``st`` with the windows of ``new`` ({index: length}, backward ones
        ignored) replaced: restarts from the first changed window and stops once the optimizer's
        progress is back on the old track (from there every window is as before)."""
        wc, dones, prefix = st["wc"], st["fdone"], st["fprefix"]
        changed = {j: v for j, v in new.items() if j < self.F and v != wc[j]}
        if not changed:
            return st["fwd"]
        k0, k1 = min(changed), max(changed)
        done = dones[k0 - 1] if k0 else 0.0
        total = prefix[k0]
        for k in range(k0, self.F):
            t, done = self._opt_window(k, changed.get(k, wc[k]), done)
            total += t
            if k >= k1 and done == dones[k]:
                return total + (prefix[-1] - prefix[k + 1])
        return total

    def state(self, tiers, keep, k):
        """Everything the incremental evaluations need about the plan (tiers, keep, k)."""
        tiers, keep = list(tiers), list(keep)
        seq = self.forward_items(keep)
        kept = [i for i, t in enumerate(tiers) if t != "drop"]
        block = {}
        for idx in range(len(kept) - 1, 0, -1):
            s, e = kept[idx - 1], kept[idx]
            start = len(seq)
            seq.extend(self.segment_items(s, e, tiers, keep, k))
            block[s] = (start, len(seq), e)
        seq.append((self.bwd[0], 0.0, None, None, 0.0, None, 0.0, 0.0, None, None))
        # (a deeper prefetch's lengths come from the chain, in _summed)
        wc = [] if self.deep else [self.window(seq, j, tiers) for j in range(len(seq))]
        return self._summed(tiers, keep, k, seq, wc, block)

    def changed(self, st, tiers, keep):
        """``state(tiers, keep, st["k"])``, the same numbers, built from ``st``: each changed
        boundary's segments are rebuilt in turn and only the windows that read a changed item
        (or a changed boundary's tier) are re-timed. Residual moves to or from the host change
        forward items too and are built whole."""
        old_keep = st["keep"]
        if any((a == "host") != (b == "host") for a, b in zip(old_keep, keep)):
            return self.state(tiers, keep, st["k"])
        tiers, keep, k = list(tiers), list(keep), st["k"]
        seq, block = st["seq"][:], dict(st["block"])
        # what is re-timed: each window's length at depth 1, its loads for the chain at a deeper
        # prefetch (the chain itself is played in _summed, from st's where it can: _chain)
        wc, timed = (st["loads"][:], self.loads) if self.deep else (st["wc"][:], self.window)
        touched = set()  # the windows re-timed (where they are now)
        cur = st["tiers"][:]
        assert (tiers[0], tiers[-1]) == (cur[0], cur[-1]), "the first and last boundaries never move"
        for l, pos in st["pos_b"].items():  # device residuals: only the backward item's compute
            if bool(keep[l]) != bool(old_keep[l]):
                seq[pos] = (self.bwd[l + 1] if keep[l] else self.bwd_rc[l + 1],) + seq[pos][1:]
                wc[pos] = timed(seq, pos, cur)
                touched.add(pos)
        for i in range(1, self.L):
            t = tiers[i]
            if t == cur[i]:
                continue
            s, e, a, b = self._span(cur, block, i)
            cur[i] = t
            new_block, n_first = self._rebuilt(s, i, e, cur, keep, k)
            n_new = len(new_block)
            shift = n_new - (b - a)
            seq[a:b] = new_block
            wc[a:b] = [None] * n_new
            if shift:
                for key, (x, y, z) in block.items():
                    if x >= b:
                        block[key] = (x + shift, y + shift, z)
                touched = {j + shift if j >= b else j for j in touched}
            if t != "drop":
                block[i] = (a, a + n_first, e)
                block[s] = (a + n_first, a + n_new, i)
            else:
                block.pop(i, None)
                block[s] = (a, a + n_new, e)
            for j in list(range(max(0, a - 2), min(len(seq), a + n_new + 2))) + [3 + i, 4 + i]:
                wc[j] = timed(seq, j, cur)
                touched.add(j)
        if self.deep:
            # the chain from the first window re-timed, and past the last one on the old track
            resume = (st, min(touched, default=0), max(touched, default=-1), len(seq) - len(st["seq"]))
            return self._summed(tiers, keep, k, seq, None, block, loads=wc, resume=resume)
        return self._summed(tiers, keep, k, seq, wc, block)

    def _span(self, tiers, block, i):
        """(s, e, a, b) for a move of interior boundary i: the kept boundaries s before it and e
        after it, and the positions [a, b) of the backward items the move rebuilds (the block of
        (i, e), then that of (s, i), where i is kept; that of (s, e) where it is dropped)."""
        s = i - 1
        while tiers[s] == "drop":
            s -= 1
        if tiers[i] != "drop":
            e = block[i][2]
            return s, e, block[i][0], block[s][1]
        a, b, e = block[s]
        return s, e, a, b

    def _rebuilt(self, s, i, e, tiers, keep, k):
        """The backward items between kept boundaries s and e with boundary i at ``tiers[i]``:
        those of (i, e) then of (s, i), or of (s, e) where i is dropped; and how many are (i, e)'s
        (0 where dropped)."""
        if tiers[i] == "drop":
            return self.segment_items(s, e, tiers, keep, k), 0
        first = self.segment_items(i, e, tiers, keep, k)
        return first + self.segment_items(s, i, tiers, keep, k), len(first)

    def _summed(self, tiers, keep, k, seq, wc, block, loads=None, resume=None):
        """The state of (tiers, keep, k) from its items, their windows' lengths and its segments'
        blocks (what :meth:`state` and :meth:`changed` share). At a deeper prefetch the lengths
        come from the chain over the windows' ``loads`` (each window's, where not given), resumed
        from a state where ``resume`` gives one (``_chain``'s old, first, last and shift)."""
        pos_b = {}
        for s, (start, end, e) in block.items():
            for off, l in enumerate(range(e - 1, s - 1, -1)):
                pos_b[l] = end - (e - s) + off
        ws = {s: self._seg_ws(s, e, tiers) for s, (_, _, e) in block.items()}
        top = sorted(((v, key) for key, v in ws.items()), reverse=True)[:3]  # a move replaces at most 2
        deep = {}
        if self.deep:
            if loads is None:
                loads = [self.loads(seq, j, tiers) for j in range(len(seq))]
            total, fwd, wc, pres, dones, prefix = self._chain(loads, *(resume or ()))
            deep = dict(loads=loads, pres=pres, dones=dones, prefix=prefix)
            fdone = fprefix = None
            bwd = total - fwd
        else:
            (fwd, fdone, fprefix), bwd = self._forward(wc), sum(wc[self.F:])
            total = fwd + bwd
        return dict(tiers=tiers, keep=keep, k=k, seq=seq, wc=wc, fwd=fwd, fdone=fdone, fprefix=fprefix, bwd=bwd,
                    total=total, block=block,
                    pos_b=pos_b, ws=ws,
                    ws_top=top,
                    dev=sum(self.A[i] for i in range(1, self.L) if tiers[i] == "device"),
                    res=self.residual_bytes(keep),
                    host=sum(a for a, t in zip(self.A, tiers) if t == "host") + self.host_residual_bytes(keep),
                    nvme=sum(a for a, t in zip(self.A, tiers) if t == "nvme"),
                    num_nvme=tiers.count("nvme"), **deep)

    def _seg_ws(self, s, e, tiers):
        if e - s < 2:
            return 0.0
        return sum(self.A[s + 1:e]) + (self.A[s] if tiers[s] in _OFF else 0.0)

    def peak_of(self, st) -> float:
        return self.base_mem + self.tail_mem[st["k"]] + st["dev"] + st["res"] + max(st["ws"].values(), default=0.0)

    def try_tier(self, st, i, t):
        """(step time, device peak) after setting boundary i (1..L-1) to tier t, without rebuilding.

        The move's local part (the windows it changes: the rebuilt segments' and their neighbours',
        and the two forward windows that send boundary i down) depends only on the items those
        windows read; it is kept per the items and tiers it read (:meth:`_tier_local`), so a
        greedy round re-times only the moves whose neighbourhood an earlier round changed. The
        host optimizer's chain through the forward windows is global and replayed every time."""
        tiers = st["tiers"]
        if self.deep:
            return self._try_tier_deep(st, i, t)
        s, e, a, b = self._span(tiers, st["block"], i)
        key = self._tier_key(st, i, t, s, e, a, b)
        local = self._tier_cache.get(key)
        if local is None:
            local = self._kept(key, self._tier_local(st, i, t, s, e, a, b))
        new_fwd, old_bwd, new_bwd, new_ws = local
        bwd = st["bwd"] - old_bwd + new_bwd
        fwd = self._forward_changed(st, new_fwd)
        return fwd + bwd, self._tier_peak(st, i, t, s, new_ws)

    def _tier_key(self, st, i, t, s, e, a, b) -> tuple:
        """What the local part of a move of boundary i to tier t reads (kept boundaries s and e
        around it, its rebuilt items at [a, b)): the items around the rebuilt segments (each
        carries its boundary's tier), the forward items the two forward windows read, the tiers of
        the boundaries forward items send down (i's neighbours; the last ones where the segments
        border the forward pass), and the rebuilt segments' own inputs."""
        tiers, seq, F = st["tiers"], st["seq"], self.F
        return (i, t, tiers[i], s, e, tiers[s], st["k"], tuple(st["keep"][s:e]), min(a - F, 4),
                min(len(seq) - b, 4), tuple(seq[a - 4:a] + seq[b:b + 4] + seq[1 + i:7 + i]), tiers[i - 1],
                tiers[i + 1], tuple(tiers[-3:]) if a - F < 4 else None)

    def _kept(self, key, local):
        """``local`` kept for ``key`` (at most ``TIER_CACHE_ENTRIES``, then all dropped)."""
        if len(self._tier_cache) >= TIER_CACHE_ENTRIES:
            self._tier_cache.clear()
        self._tier_cache[key] = local
        return local

    def _tier_ws(self, s, i, e, new_tiers):
        """The working sets of the segments a move of boundary i (to ``new_tiers[i]``) rebuilds
        between kept boundaries s and e."""
        if new_tiers[i] != "drop":
            return [self._seg_ws(i, e, new_tiers), self._seg_ws(s, i, new_tiers)]
        return [self._seg_ws(s, e, new_tiers)]

    def _tier_peak(self, st, i, t, s, new_ws):
        """The device peak after moving boundary i (kept boundary s before it) to tier t, the
        rebuilt segments' working sets ``new_ws`` (``_tier_ws``)."""
        ws = max([v for v, key in st["ws_top"] if key not in (s, i)][:1] + new_ws)
        old = st["tiers"][i]
        dev = st["dev"] + (self.A[i] if t == "device" else 0.0) - (self.A[i] if old == "device" else 0.0)
        return self.base_mem + self.tail_mem[st["k"]] + dev + st["res"] + ws

    def _try_tier_deep(self, st, i, t):
        """:meth:`try_tier` at a deeper prefetch: the windows that read a rebuilt item or boundary
        i's tier get their loads again (kept per what they read, ``_tier_key``, as the local part
        at depth 1 is), and the chain is replayed from them (:meth:`_replay`)."""
        tiers = st["tiers"]
        s, e, a, b = self._span(tiers, st["block"], i)
        # the loads of the windows the move changes read what the local part at depth 1 reads:
        # kept per the same key (how many items are rebuilt, the loads of the windows around them
        # from their first, those of the two forward windows, the rebuilt segments' working sets)
        key = self._tier_key(st, i, t, s, e, a, b)
        local = self._tier_cache.get(key)
        if local is None:
            new_tiers = tiers[:]
            new_tiers[i] = t
            new_block, _ = self._rebuilt(s, i, e, new_tiers, st["keep"], st["k"])
            seq = st["seq"][:a] + new_block + st["seq"][b:]
            lo, hi = max(0, a - 2), min(len(seq), a + len(new_block) + 2)
            near = [self.loads(seq, j, new_tiers) for j in range(lo, hi)]
            far = [(j, self.loads(seq, j, new_tiers)) for j in (3 + i, 4 + i) if not lo <= j < hi]
            local = self._kept(key, (len(new_block), lo - a, near, far, self._tier_ws(s, i, e, new_tiers)))
        n_new, off, near, far, new_ws = local
        loads = st["loads"][:a] + [None] * n_new + st["loads"][b:]
        lo = a + off
        loads[lo:lo + len(near)] = near
        for j, value in far:
            loads[j] = value
        changed = sorted(set(range(lo, lo + len(near))) | {j for j, _ in far})
        total = self._replay(st, loads, changed, a, n_new, n_new - (b - a))
        return total, self._tier_peak(st, i, t, s, new_ws)

    def _tier_local(self, st, i, t, s, e, a, b):
        """The local part of :meth:`try_tier`: ({forward window: new length}, the old and new
        backward windows' sums (in window order), the rebuilt segments' working sets)."""
        new_tiers = st["tiers"][:]
        new_tiers[i] = t
        new_block, _ = self._rebuilt(s, i, e, new_tiers, st["keep"], st["k"])
        new_ws = self._tier_ws(s, i, e, new_tiers)
        seq, wc, F = st["seq"], st["wc"], self.F
        seq2 = seq[a - 4:a] + new_block + seq[b:b + 4]  # what the changed windows read
        off = a - 4
        lo = max(0, a - 2)
        f_pos = (3 + i, 4 + i)  # forward windows that offload / write boundary i
        # (where one of them reads a rebuilt item, i.e. 6 + i >= a, it is at or past lo and timed
        # again from seq2 below)
        new_fwd = {j: self.window(seq, j, new_tiers) for j in f_pos}
        old_bwd = sum(wc[j] for j in range(lo, min(len(seq), b + 2)) if j >= F)
        new_bwd = 0.0
        for j in range(lo, min(len(seq), b + 2) + len(new_block) - (b - a)):
            v = self.window(seq2, j - off, new_tiers)
            if j >= F:
                new_bwd += v
            else:
                new_fwd[j] = v
        return new_fwd, old_bwd, new_bwd, new_ws

    def residual_bytes(self, keep) -> float:
        """Device bytes of kept residuals: on device, and (1 + activation depth) times the largest on
        the host (``memory.offload_working_bytes``)."""
        on_host = [r for r, kp in zip(self.R, keep) if kp == "host"]
        return sum(r for r, kp in zip(self.R, keep) if kp is True) + (1.0 + self.da) * max(on_host, default=0.0)

    def host_residual_bytes(self, keep) -> float:
        return sum(r for r, kp in zip(self.R, keep) if kp == "host")

    def try_res(self, st, l):
        """(step time, device peak) after toggling layer l's residuals (kept on device <-> not kept)."""
        keep = st["keep"]
        assert keep[l] != "host", "try_res toggles device residuals; use state() for host ones"
        pos = st["pos_b"][l]
        if self.deep:
            seq = st["seq"][:]
            seq[pos] = (self.bwd_rc[l + 1] if keep[l] else self.bwd[l + 1],) + seq[pos][1:]
            loads = st["loads"][:]
            loads[pos] = self.loads(seq, pos, st["tiers"])
            return self._replay(st, loads, [pos]), self.peak_of(st) + (-self.R[l] if keep[l] else self.R[l])
        c = self.bwd_rc[l + 1] if keep[l] else self.bwd[l + 1]
        seq = st["seq"]
        item = seq[pos]
        seq2 = seq[:pos] + [(c,) + item[1:]] + seq[pos + 1:]
        total = st["total"] - st["wc"][pos] + self.window(seq2, pos, st["tiers"])  # a backward window
        peak = self.peak_of(st) + (-self.R[l] if keep[l] else self.R[l])
        return total, peak

    def try_keep(self, st, l, value):
        """(step time, device peak, host bytes) after setting ``keep[l]`` to ``value`` (False, True
        or ``"host"``), without rebuilding: the forward item that sends layer l's residuals down,
        its backward item (compute, residuals up) and the windows that read them."""
        keep = st["keep"][:]
        keep[l] = value
        seq = st["seq"][:]
        f, b = 3 + l, st["pos_b"][l]
        on_host = self.R[l] if value == "host" else 0.0
        seq[f] = seq[f][:6] + (on_host,) + seq[f][7:]
        c = self.bwd[l + 1] if value else self.bwd_rc[l + 1]
        seq[b] = (c,) + seq[b][1:7] + (on_host,) + seq[b][8:9] + (3 + l if value == "host" else None,)
        if self.deep:
            loads = st["loads"][:]
            changed = sorted({j for j in (f + 1, b - 2, b - 1, b) if 0 <= j < len(seq)})
            for j in changed:
                loads[j] = self.loads(seq, j, st["tiers"])
            peak = self.peak_of(st) - st["res"] + self.residual_bytes(keep)
            return self._replay(st, loads, changed), peak, self.host_bytes(st["tiers"], keep)
        wc, F = st["wc"], self.F
        new = {j: self.window(seq, j, st["tiers"]) for j in (f + 1, b - 1, b) if 0 <= j < len(seq)}
        bwd = st["bwd"] + sum(v - wc[j] for j, v in new.items() if j >= F)
        fwd = self._forward_changed(st, new)
        res = self.residual_bytes(keep)
        peak = self.peak_of(st) - st["res"] + res
        host = self.host_bytes(st["tiers"], keep)
        return fwd + bwd, peak, host

    def step_time(self, tiers, keep, k) -> float:
        """Equals ``timing.step_time`` (pipelined optimizer) for the plan (tiers, keep, k)."""
        return self.state(tiers, keep, k)["total"]

    def device_peak(self, tiers, keep, k) -> float:
        A = self.A
        peak = self.base_mem + self.tail_mem[k]
        peak += sum(A[i] for i in range(1, self.L) if tiers[i] == "device")
        peak += self.residual_bytes(keep)
        ws = 0.0
        prev = 0
        for i in range(1, self.L + 1):
            if tiers[i] != "drop":
                if i - prev >= 2:
                    ws = max(ws, sum(A[prev + 1:i]) + (A[prev] if tiers[prev] in _OFF else 0.0))
                prev = i
        return peak + ws

    def host_bytes(self, tiers, keep=()) -> float:
        h = sum(a for a, t in zip(self.A, tiers) if t == "host") + self.host_residual_bytes(keep)
        return h + (2.0 * self.a_max if "nvme" in tiers else 0.0)

    def nvme_bytes(self, tiers) -> float:
        return sum(a for a, t in zip(self.A, tiers) if t == "nvme")

    def allowed(self, tiers, keep, k) -> bool:
        """Inside the MILP's decision space (segment length, tier filters, residual/tail filters)."""
        prev = 0
        for i in range(1, self.L + 1):
            t = tiers[i]
            if t == "host" and not self.host_ok[i]:
                return False
            if t == "nvme" and not self.nvme_ok[i]:
                return False
            if t != "drop":
                if i - prev > self.S:
                    return False
                prev = i
        if k > self.K or any(kp and not ok for kp, ok in zip(keep, self.res_ok)):
            return False
        if any(kp == "host" and not ok for kp, ok in zip(keep, self.off_ok)):
            return False
        return True

    def fits(self, tiers, keep, k) -> bool:
        hw = self.hw
        return (self.device_peak(tiers, keep, k) <= hw.device_memory and self.host_bytes(tiers, keep) <= hw.host_memory
                and self.nvme_bytes(tiers) <= hw.nvme_memory)


class Budget:
    """A count of move evaluations the local search may spend (deterministic, unlike a clock)."""

    def __init__(self, evaluations: int):
        self.left = evaluations

    def spend(self, n: int = 1) -> bool:
        self.left -= n
        return self.left >= 0

    @property
    def spent(self) -> bool:
        return self.left <= 0


DEFAULT_EVALUATIONS = 3000


def heuristic_plan(costs, hardware, *, max_segment_length: int = 8, max_resident_tail: int = 8,
                   max_evaluations: int = DEFAULT_EVALUATIONS, starts=(), memory_first: bool = False,
                   residual_offload: bool = True, weight_prefetch_depth: int = 1,
                   act_prefetch_depth: int = 1) -> Plan | None:
    """The best plan found by greedy construction and local search (None if none fits).

    Args:
      costs, hardware: the problem; max_segment_length, max_resident_tail: the MILP's space.
      max_evaluations: move evaluations the local search may spend (the constructions always run);
        a count, so the result does not depend on the machine's speed or load.
      starts: extra Plans to improve (e.g. fitting heuristics); those outside the space are skipped.
      residual_offload: whether residuals may be kept on the host (``Plan.offload_residuals``).
      weight_prefetch_depth, act_prefetch_depth: the depths the plan is made for (``FastModel``
        plays them: the deeper buffers in memory, the uploads a window ahead in time).
    Returns:
      A Plan named ``search`` (pipelined optimizer, at those depths) inside the MILP's decision space.
    Example:
      >>> heuristic_plan(costs, Hardware.preset("h800")).predicted_step_time_s
    """
    fm = FastModel(costs, hardware, max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                   residual_offload=residual_offload, weight_prefetch_depth=weight_prefetch_depth,
                   act_prefetch_depth=act_prefetch_depth)
    candidates = []
    for use_nvme in ((False, True) if hardware.nvme_memory > 0 else (False,)):
        for full_start in (False, True):
            sol = _construct(fm, use_nvme, full_start)
            if sol is not None:
                candidates.append(sol)
            if residual_offload and any(fm.off_ok):
                sol = _construct(fm, use_nvme, full_start, offload=True)
                if sol is not None:
                    candidates.append(sol)
            elif memory_first and not full_start:
                sol = _construct(fm, use_nvme, False, memory_first=True)
                if sol is not None:
                    candidates.append(sol)
    candidates.extend(_counted_paths(fm))
    for p in starts:
        if p is None or p.optimizer_mode != "pipelined" or p.weight_prefetch_depth != weight_prefetch_depth \
                or p.act_prefetch_depth != act_prefetch_depth:
            continue
        sol = _solution(p)
        if fm.allowed(*sol) and fm.fits(*sol):
            candidates.append(sol)
    if not candidates:
        return None
    scored = sorted(((fm.step_time(*sol), idx, sol) for idx, sol in enumerate(candidates)))
    evals = Budget(max_evaluations)
    best, best_t = scored[0][2], scored[0][0]
    seen = set()
    for _, _, sol in scored:
        key = (tuple(sol[0]), tuple(sol[1]), sol[2])
        if key in seen:
            continue
        seen.add(key)
        sol, t = _local_search(fm, sol, evals)
        if t < best_t - 1e-12:
            best, best_t = sol, t
        if evals.spent:
            break
    return Plan.create(costs, hardware, name="search", **_decisions(*best),
                       weight_prefetch_depth=weight_prefetch_depth, act_prefetch_depth=act_prefetch_depth)


def _solution(plan: Plan) -> tuple:
    """``plan``'s decisions as the search holds them: (tiers, keep, resident tail), ``keep[l]``
    False, True or ``"host"`` (``FastModel``)."""
    off = memory.offloaded_residuals(plan)
    return (list(plan.boundary_tiers), ["host" if o else kp for kp, o in zip(plan.keep_residuals, off)],
            plan.resident_tail)


def _decisions(tiers, keep, k) -> dict:
    """The search's (tiers, keep, resident tail) as ``Plan`` fields (the inverse of ``_solution``)."""
    return dict(boundary_tiers=tiers, keep_residuals=[bool(kp) for kp in keep],
                offload_residuals=[kp == "host" for kp in keep], resident_tail=k)


# an edge value below this counts as this in the rounding's path (log of 0)
ROUNDING_FLOOR = 1e-9


def round_relaxation(costs, hardware, *, edges: dict, host: dict, nvme: dict, keep: dict, offload: dict,
                     tail: dict, weight_prefetch_depth: int, act_prefetch_depth: int, max_segment_length: int = 8,
                     max_resident_tail: int = 8, residual_offload: bool = True,
                     max_evaluations: int = DEFAULT_EVALUATIONS) -> Plan | None:
    """A plan rounded from a relaxation's fractional decisions, at the given prefetch depths: the
    MILP's LP (``milp.build``) read as shares of each decision.

    Args:
      edges: (s, e) -> the share of the kept-boundary path that takes segment (s, e).
      host, nvme: boundary -> the share of it kept on the host / on NVMe (of the whole, not of its kept share).
      keep, offload: layer -> the share keeping its residuals / keeping them on the host.
      tail: layer -> the share of it in the resident tail.
      the rest: as ``heuristic_plan``.
    Returns:
      A Plan named ``rounding``, or None where the rounding cannot be made to fit.

    The path is the most likely one (the largest product of its edges' shares, by a dynamic
    program over the boundaries); each boundary on it goes to the tier with the largest share of
    it, the off-device ones taken in order of their shares while the host and NVMe hold them;
    residuals are kept (and on the host) and tail layers resident where their share is above 1/2.
    That plan is then fitted and its slack spent as the construction does (``_fit_and_fill``:
    device bytes freed at the least time per byte), and improved by the local search
    (``_local_search``, ``max_evaluations`` evaluations). Where the LP is integral in most
    decisions, its fractional ones local, this lands near the LP's value: varied seed 9 at 128
    layers (``benchmarks/planner_probes.py``), 6.0860 s in 0.2-0.3 s, 0.64 % above the union LP,
    where the search from scratch gave 6.2061 s and HiGHS' sub-MIP on the LP's fractional part
    (``milp._rens``) 6.0774 s in 4.5 s."""
    fm = FastModel(costs, hardware, max_segment_length=max_segment_length, max_resident_tail=max_resident_tail,
                   residual_offload=residual_offload, weight_prefetch_depth=weight_prefetch_depth,
                   act_prefetch_depth=act_prefetch_depth)
    L = fm.L
    best, prev = [0.0] + [-math.inf] * L, [None] * (L + 1)
    for e in range(1, L + 1):
        for s in range(max(0, e - fm.S), e):
            if (s, e) in edges and best[s] > -math.inf:
                v = best[s] + math.log(max(float(edges[s, e]), ROUNDING_FLOOR))
                if v > best[e]:
                    best[e], prev[e] = v, s
    if prev[L] is None:
        return None
    tiers = ["drop"] * (L + 1)
    e = L
    while e is not None:
        tiers[e] = "device"
        e = prev[e]
    kept_share = [0.0] * (L + 1)  # the share of each boundary the relaxation keeps: its edges out
    for (s, _), v in edges.items():
        kept_share[s] += float(v)
    moves = []  # (share, boundary, tier): the boundaries the relaxation keeps mostly off the device
    for i in range(1, L):
        if tiers[i] == "drop":
            continue
        h = float(host.get(i, 0.0)) if fm.host_ok[i] else 0.0
        n = float(nvme.get(i, 0.0)) if fm.nvme_ok[i] else 0.0
        d = kept_share[i] - h - n
        if n > max(h, d):
            moves.append((n, i, "nvme"))
        elif h > d:
            moves.append((h, i, "host"))
    moves.sort(key=lambda z: (-z[0], z[1]))
    kept0 = [bool(fm.res_ok[l] and float(keep.get(l, 0.0)) > 0.5) for l in range(L)]
    hosted = sorted((-float(offload.get(l, 0.0)), l) for l in range(L)
                    if kept0[l] and fm.off_ok[l] and float(offload.get(l, 0.0)) > 0.5)
    k = min(fm.K, sum(1 for l in range(L - fm.K, L) if float(tail.get(l, 0.0)) > 0.5))

    def fitted(use_nvme):
        """The rounding with NVMe in use or not (its staging buffers then held in host memory),
        fitted; (tiers, keep, k) or None."""
        host_cap = fm.hw.host_memory - (2.0 * fm.a_max if use_nvme else 0.0)
        ts = tiers[:]
        host_bytes = nvme_bytes = 0.0
        for _, i, t in moves:
            a = fm.A[i]
            if t == "host" and host_bytes + a <= host_cap:
                ts[i], host_bytes = t, host_bytes + a
            elif t == "nvme" and use_nvme and nvme_bytes + a <= fm.hw.nvme_memory:
                ts[i], nvme_bytes = t, nvme_bytes + a
        kept = kept0[:]
        for _, l in hosted:
            if host_bytes + fm.R[l] <= host_cap:
                kept[l], host_bytes = "host", host_bytes + fm.R[l]
        found = _fit_and_fill(fm, fm.state(ts, kept, k), host_cap, use_nvme)
        return found if found is not None and fm.allowed(*found) and fm.fits(*found) else None

    # NVMe as the relaxation uses it; where that does not fit, the other way (a boundary the LP
    # keeps on the host in part may need NVMe's room to fit, or the host room NVMe's staging takes)
    lp_nvme = any(t == "nvme" for _, _, t in moves)
    sol = fitted(lp_nvme)
    if sol is None and (lp_nvme or (fm.hw.nvme_memory > 0 and any(fm.nvme_ok))):
        sol = fitted(not lp_nvme)
    if sol is None:
        return None
    sol, _ = _local_search(fm, sol, Budget(max_evaluations))
    return Plan.create(costs, hardware, name="rounding", **_decisions(*sol),
                       weight_prefetch_depth=weight_prefetch_depth, act_prefetch_depth=act_prefetch_depth)


POLISH_WORK = 48_000   # the whole-window polish's default budget: evaluations x layers (750 at 64 layers)


def polish(plan: Plan, *, max_segment_length: int = 8, max_evaluations: int | None = None,
           residual_offload: bool = True) -> Plan:
    """``plan`` improved by local search at its own prefetch depths: for plans the search did not
    make at those depths (a neighbourhood's, or a plan carried from other depths).

    A plan with the pipelined optimizer inside the search's space gets the search's own local
    search (``_local_search`` on ``FastModel`` at the plan's depths: tier moves, residual moves,
    the resident tail one layer shorter, compound and pair moves; by default
    ``DEFAULT_EVALUATIONS`` evaluations). Any other plan gets single moves (a layer's residuals:
    none / on the device / on the host; a boundary's tier: device / host / NVMe / dropped), each
    timed on the step model's windows built whole (by default ``POLISH_WORK`` / layers
    evaluations). Either way first improvement, until none helps or the evaluations are spent (a
    count: the same plan whatever the machine's load); the depths stay, the resident tail never
    grows, and every move stays in the MILP's space (segments of at most ``max_segment_length``)
    and within the device, host and NVMe budgets. The plan itself where nothing faster is found.

    Example:
      >>> polish(milp._at_depths(plan, 1, 2)).predicted_step_time_s <= plan.predicted_step_time_s
    """
    import types
    costs, hw = plan.costs, plan.hardware
    L = costs.num_layers
    if plan.optimizer_mode == "pipelined":
        fm = FastModel(costs, hw, max_segment_length=max_segment_length, max_resident_tail=plan.resident_tail,
                       residual_offload=residual_offload, weight_prefetch_depth=plan.weight_prefetch_depth,
                       act_prefetch_depth=plan.act_prefetch_depth)
        sol = _solution(plan)
        if fm.allowed(*sol) and fm.fits(*sol):
            budget = DEFAULT_EVALUATIONS if max_evaluations is None else max_evaluations
            best, t = _local_search(fm, sol, Budget(budget))
            if t >= plan.predicted_step_time_s - 1e-12 * max(1.0, t):
                return plan
            return plan.repredict(**_decisions(*best))
    if max_evaluations is None:
        max_evaluations = max(1, POLISH_WORK // L)
    tiers = list(plan.boundary_tiers)
    res = [(2 if o else 1) if r else 0 for r, o in zip(plan.keep_residuals, memory.offloaded_residuals(plan))]

    def value():
        probe = types.SimpleNamespace(
            boundary_tiers=tuple(tiers), keep_residuals=tuple(r > 0 for r in res),
            offload_residuals=tuple(r == 2 for r in res), resident_tail=plan.resident_tail,
            weight_prefetch_depth=plan.weight_prefetch_depth, act_prefetch_depth=plan.act_prefetch_depth,
            optimizer_mode=plan.optimizer_mode)
        if any(e - s > max_segment_length for s, e in memory.segments(probe.boundary_tiers)) or \
                memory.device_peak_bytes(costs, hw, probe) > hw.device_memory or \
                memory.host_peak_bytes(costs, probe) > hw.host_memory or \
                memory.nvme_peak_bytes(costs, probe) > hw.nvme_memory:
            return float("inf")
        return steps.step_time(costs, hw, probe)

    moves = [(res, l, state) for l in range(L) for state in (0, 1, 2)
             if state < 2 or (residual_offload and steps.residual_offload_allowed(l, L))]
    moves += [(tiers, i, t) for i in range(1, L) for t in tuple(steps.tier_options(costs, hw, i)) + ("drop",)]
    best = value()
    evals = Budget(max_evaluations)
    improved = True
    while improved and not evals.spent:
        improved = False
        for target, idx, choice in moves:
            if target[idx] == choice:
                continue
            if not evals.spend():
                break
            old, target[idx] = target[idx], choice
            v = value()
            if v < best - 1e-12 * max(1.0, best):
                best, improved = v, True
            else:
                target[idx] = old
    if best >= plan.predicted_step_time_s - 1e-12 * max(1.0, best):
        return plan
    return plan.repredict(boundary_tiers=tiers, keep_residuals=[r > 0 for r in res],
                          offload_residuals=[r == 2 for r in res])


def _counted_paths(fm):
    """Candidates from a dynamic program over the kept-boundary path, one per cap on the recompute
    working set: each boundary's tier costs its time on its own (from the all-device plan, as
    ``try_tier`` gives it), and the program counts device and host boundaries (in units of the
    least boundary, so the counts bound the bytes from below), keeping the cheapest path for every
    count pair within the budgets. The cap is what the greedy construction cannot see: it grows long
    segments one drop at a time, paying a working set that shorter segments everywhere would not.
    Counting instead of pricing memory matters on identical layers, where a price picks all or none
    of them. Every path is then checked and timed exactly. NVMe and residuals are left to the local
    search."""
    import numpy as np

    L, S, A = fm.L, fm.S, fm.A
    if L < 2:
        return []  # no interior boundary to place
    keep = [False] * L
    st0 = fm.state(["device"] * (L + 1), keep, 0)
    if fm.peak_of(st0) <= fm.hw.device_memory:
        return []  # nothing to count: every boundary fits on the device
    t0 = st0["total"]
    drop, host = [0.0] * (L + 1), [None] * (L + 1)
    for i in range(1, L):
        drop[i] = max(0.0, fm.try_tier(st0, i, "drop")[0] - t0)
        if fm.host_ok[i]:
            host[i] = max(0.0, fm.try_tier(st0, i, "host")[0] - t0)
    prefix = [0.0]
    for i in range(1, L + 1):
        prefix.append(prefix[-1] + (drop[i] if i < L else 0.0))
    unit = min(A[1:L])
    if not unit > 0:
        return []
    host_room = fm.hw.host_memory
    num_h = int(min(L - 1, host_room // unit)) if any(h is not None for h in host) else 0
    caps = sorted({0.0} | {max(sum(A[s + 1:s + n]) for s in range(L - n + 1)) for n in range(2, S + 1)})
    # ws_of[s][ts][n]: the working set of the segment (s, s + n), its base offloaded iff ts
    ws_of = [[[sum(A[s + 1:s + n]) + (A[s] if ts == 1 else 0.0) if n >= 2 else 0.0 for n in range(S + 1)]
              for ts in (0, 1)] for s in range(L)]
    timed = []
    for cap in caps:
        room = fm.hw.device_memory - fm.base_mem - cap
        if room < 0:
            continue
        num_d = int(min(L - 1, room // unit))
        shape = (num_h + 1, num_d + 1)
        best = [[None, None] for _ in range(L + 1)]
        low = [[None, None] for _ in range(L + 1)]  # a host boundary's least path before its own cost

        def preds_of(j):  # every predecessor (s, ts) of boundary j, in order
            return [(s, ts) for s in range(max(0, j - S), j) for ts in (0, 1)
                    if best[s][ts] is not None and ws_of[s][ts][j - s] <= cap * (1 + 1e-12)]

        def shifts(j, t):  # a host boundary counts one more host slot, an interior device one a device slot
            return (1, 0) if t == 1 else ((0, 1) if j < L else (0, 0))

        best[0][0] = np.full(shape, np.inf)
        best[0][0][0, 0] = 0.0
        for j in range(1, L + 1):
            for t in (0, 1):
                if t == 1 and (j == L or host[j] is None or num_h == 0):
                    continue
                cur = np.full(shape, np.inf)
                # only counts up to j can be reached at boundary j (each boundary adds at most one):
                # the cells beyond stay at inf, as every predecessor's are there
                hj, dj = min(j + 1, shape[0]), min(j + 1, shape[1])
                dh, dd = shifts(j, t)
                src = (slice(0, hj - dh), slice(0, dj - dd))
                c_into = cur[dh:hj, dd:dj]   # a view
                cand = np.empty_like(c_into)
                for s, ts in preds_of(j):
                    np.add(best[s][ts][src], prefix[j - 1] - prefix[s], out=cand)
                    np.minimum(c_into, cand, out=c_into)
                if t == 1:
                    low[j][t] = cur
                    best[j][t] = cur + host[j]
                else:
                    best[j][t] = cur
        end = best[L][0]
        for flat in np.argsort(end, axis=None, kind="stable")[:3]:
            h, d = np.unravel_index(flat, shape)
            if not np.isfinite(end[h, d]):
                break
            tiers = ["drop"] * (L + 1)
            j, t = L, 0
            while j > 0:
                tiers[j] = "device" if t == 0 else "host"
                # the path's predecessor: the first, in the program's order, whose path gives the
                # least (the one a strict < keeps), found again from the same sums
                target = (low if t == 1 else best)[j][t][h, d]
                dh, dd = shifts(j, t)
                h, d = h - dh, d - dd
                j, t = next((s, ts) for s, ts in preds_of(j)
                            if best[s][ts][h, d] + (prefix[j - 1] - prefix[s]) == target)
            tiers[0] = "device"
            if fm.fits(tiers, keep, 0):
                timed.append((fm.step_time(tiers, keep, 0), len(timed), tiers))
    return [(t, keep[:], 0) for _, _, t in sorted(timed)[:2]]


def _tier_options(fm, i):
    opts = ["device", "drop"]
    if fm.host_ok[i]:
        opts.append("host")
    if fm.nvme_ok[i]:
        opts.append("nvme")
    return opts


def _tier_move_ok(fm, st, i, t, host_cap=None):
    """Is setting boundary i to tier t inside the space and the host/NVMe capacities?"""
    tiers = st["tiers"]
    old = tiers[i]
    if t == old:
        return False
    if t == "host" and not fm.host_ok[i] or t == "nvme" and not fm.nvme_ok[i]:
        return False
    if t == "drop":
        s = next(j for j in range(i - 1, -1, -1) if tiers[j] != "drop")
        e = next(j for j in range(i + 1, fm.L + 1) if tiers[j] != "drop")
        if e - s > fm.S:
            return False
    a = fm.A[i]
    host = st["host"] + (a if t == "host" else 0.0) - (a if old == "host" else 0.0)
    nvme = st["nvme"] + (a if t == "nvme" else 0.0) - (a if old == "nvme" else 0.0)
    num_nvme = st["num_nvme"] + (t == "nvme") - (old == "nvme")
    hw = fm.hw
    if host_cap is not None and host > host_cap:
        return False
    return host + (2.0 * fm.a_max if num_nvme else 0.0) <= hw.host_memory and nvme <= hw.nvme_memory


def _toggle_residuals(fm, st, l):
    """``st`` with layer ``l``'s keep-residuals decision flipped."""
    keep = st["keep"][:]
    keep[l] = not keep[l]
    return fm.changed(st, st["tiers"], keep)


def _host_residual_values(fm, st, l):
    """The values ``keep[l]`` may move to that involve the host (to it, or back from it)."""
    cur = st["keep"][l]
    if cur == "host":
        return (True, False)
    return ("host",) if fm.off_ok[l] else ()


def _apply_tier(fm, st, i, t):
    tiers = st["tiers"][:]
    tiers[i] = t
    return fm.changed(st, tiers, st["keep"])


def _construct(fm, use_nvme: bool, full_start: bool, memory_first: bool = False, offload: bool = False):
    """Greedy: free device memory at the least time per byte until the plan fits, then spend slack.

    ``full_start`` starts from every residual kept and the largest resident tail (residuals then
    compete with offloading for the memory); ``use_nvme`` reserves the NVMe staging buffers in host
    memory from the start (else the NVMe tier is not used); ``memory_first`` takes the move that
    frees the most bytes (a fitting plan when time does not matter, e.g. for the largest batch);
    ``offload`` starts with every residual that may go to the host kept there (where they do not
    all fit, the ones saving the most backward time per byte, as many as fit).
    """
    L = fm.L
    host_cap = fm.hw.host_memory - (2.0 * fm.a_max if use_nvme else 0.0)
    keep0 = ["host" if offload and fm.off_ok[l] else fm.res_ok[l] and full_start for l in range(L)]
    if fm.host_residual_bytes(keep0) > host_cap:
        if use_nvme:  # two partial starts are enough (each costs a construction)
            return None
        # not every residual fits on the host: those with the most backward time saved per byte
        # go there, as many as fit in all of it, or (the start with every other residual kept) in
        # half of it, leaving room for boundaries; the local search then trades them
        room = host_cap * (0.5 if full_start else 1.0)
        order = sorted((l for l in range(L) if keep0[l] == "host"),
                       key=lambda l: (-(fm.bwd_rc[l + 1] - fm.bwd[l + 1]) / max(fm.R[l], 1.0), l))
        for l in order:
            if fm.R[l] <= room:
                room -= fm.R[l]
            else:
                keep0[l] = fm.res_ok[l] and full_start
        if not any(kp == "host" for kp in keep0):
            return None
    return _fit_and_fill(fm, fm.state(["device"] * (L + 1), keep0, fm.K if full_start else 0), host_cap, use_nvme,
                         memory_first)


def _fit_and_fill(fm, st, host_cap: float, use_nvme: bool, memory_first: bool = False):
    """``_construct``'s steps 2 and 3 from the state ``st``: device bytes freed at the least time per
    byte until the plan fits (``memory_first``: the most bytes first), then the slack spent on
    residuals and the resident tail. (tiers, keep, k), or None where nothing frees enough.
    ``host_cap``: the host bytes the boundary moves may fill; ``use_nvme``: whether they may go to
    NVMe."""
    L = fm.L
    budget = fm.hw.device_memory
    for _ in range(4 * L + 16):
        peak = fm.peak_of(st)
        if peak <= budget:
            break
        t_cur = st["total"]
        scored = []
        for i in range(1, L):
            if st["tiers"][i] != "device":
                continue
            for t in _tier_options(fm, i):
                if t == "device" or (t == "nvme" and not use_nvme) or not _tier_move_ok(fm, st, i, t, host_cap):
                    continue
                total, new_peak = fm.try_tier(st, i, t)
                freed = peak - new_peak
                if freed <= 0:
                    if t != "drop":
                        continue
                    freed = fm.A[i]  # the first recompute segment pays its working set once
                scored.append((-freed if memory_first else max(total - t_cur, 0.0) / freed, "tier", i, t))
        for l in range(L):
            if st["keep"][l] is True:
                total, new_peak = fm.try_res(st, l)
                scored.append((max(total - t_cur, 0.0) / max(peak - new_peak, 1.0), "res", l, None))
        if st["k"] > 0:
            down = fm.state(st["tiers"], st["keep"], st["k"] - 1)
            scored.append((max(down["total"] - t_cur, 0.0) / max(peak - fm.peak_of(down), 1.0), "tail", None, None))
        if not scored:
            return None
        scored.sort(key=lambda z: z[0])
        # the best move, and further independent ones (tier moves far apart; residuals are local)
        need = peak - budget
        tiers, keep, k = st["tiers"][:], st["keep"][:], st["k"]
        touched = []
        cap = max(1, L // (2 * fm.S + 4))
        probe = None
        num_tier = 0
        for _, kind, i, t in scored:
            if kind == "tail":
                if touched:
                    continue
                k -= 1
                break
            if any(abs(i - j) <= fm.S + 2 for j in touched):
                continue
            if kind == "res":
                keep[i] = False
                need -= fm.R[i]
            else:
                if num_tier >= cap:
                    continue
                if probe is None:  # the capacities as the moves taken so far leave them
                    probe = dict(st, tiers=tiers, host=sum(a for a, x in zip(fm.A, tiers) if x == "host")
                                 + fm.host_residual_bytes(keep),  # (residual moves leave the host's alone)
                                 nvme=sum(a for a, x in zip(fm.A, tiers) if x == "nvme"),
                                 num_nvme=tiers.count("nvme"))
                if not _tier_move_ok(fm, probe, i, t, host_cap):
                    continue
                tiers[i] = t
                probe = None
                num_tier += 1
                need -= fm.A[i] if t != "drop" else 0.0
            touched.append(i)
            if need <= 0:
                break
        st = fm.changed(st, tiers, keep) if k == st["k"] else fm.state(tiers, keep, k)
    if fm.peak_of(st) > budget:
        return None
    # spend the slack: residuals (independent windows: add in order of saving per byte) and tail
    while True:
        peak = fm.peak_of(st)
        gains = []
        for l in range(L):
            if not st["keep"][l] and fm.res_ok[l]:
                total, _ = fm.try_res(st, l)
                if st["total"] - total > 1e-12:
                    gains.append(((st["total"] - total) / max(fm.R[l], 1.0), l))
        gains.sort(reverse=True)
        keep = st["keep"][:]
        room = budget - peak
        changed = False
        for _, l in gains:
            if fm.R[l] <= room:
                keep[l] = True
                room -= fm.R[l]
                changed = True
        if changed:
            st = fm.changed(st, st["tiers"], keep)
        if st["k"] < fm.K:
            up = fm.state(st["tiers"], st["keep"], st["k"] + 1)
            if fm.peak_of(up) <= budget and up["total"] < st["total"] - 1e-12:
                st = up
                continue
        if not changed:
            break
    return st["tiers"], st["keep"], st["k"]


def _room_moves(fm, st, evals, better):
    """A kept residual paid for with several boundaries moved off the device: the first such
    compound move that improves ``st`` (a state), or None.

    A residual worth keeping may need the room of many boundaries (a 27B layer's residuals weigh
    about 14 of its boundaries), which no single or pair move frees. The boundaries' moves to host
    or NVMe (each frees its bytes, whatever the others do) are ranked once, by added seconds per
    device byte freed in ``st``; each candidate residual then takes them in that order until the
    plan fits, and the whole plan is evaluated once.
    """
    budget = fm.hw.device_memory
    peak0 = fm.peak_of(st)
    gains = []
    for l in range(fm.L):
        if st["keep"][l] is False and fm.res_ok[l] and evals.spend():
            total, peak = fm.try_res(st, l)
            if peak > budget and better(total):
                gains.append((total - st["total"], l, peak - budget))
    if not gains:
        return None
    ranked = []
    for i in range(1, fm.L):
        if st["tiers"][i] != "device":
            continue
        for t in _tier_options(fm, i):
            if t in ("host", "nvme") and _tier_move_ok(fm, st, i, t) and evals.spend():
                total, peak = fm.try_tier(st, i, t)
                if peak < peak0:
                    ranked.append((max(total - st["total"], 0.0) / (peak0 - peak), i, t))
    # equal costs (a boundary's transfer hidden under the window's other work) are common: one
    # order spends host memory first, the other NVMe first (host memory then stays for staging)
    orders = [sorted(ranked), sorted(ranked, key=lambda z: (z[0], z[2] != "nvme", z[1]))]
    for _, l, need in sorted(gains):
        keep = st["keep"][:]
        keep[l] = True
        best = None
        for order in orders:
            tiers = _make_room(fm, st, order, need)
            if tiers is None or not evals.spend(8):
                continue
            other = fm.changed(st, tiers, keep)
            if fm.peak_of(other) <= budget and fm.host_bytes(tiers, keep) <= fm.hw.host_memory \
                    and fm.nvme_bytes(tiers) <= fm.hw.nvme_memory and better(other["total"]) \
                    and (best is None or (other["total"], other["host"]) < (best["total"], best["host"])):
                best = other  # on a tie, the one leaving host memory free (NVMe staging, more room)
        if best is not None:
            return best
        if evals.spent:
            break
    return None


def _make_room(fm, st, ranked, need):
    """``st``'s tiers with the boundary moves of ``ranked`` taken in order (within the space and
    the host/NVMe capacities) until ``need`` device bytes are freed; None if they do not free it."""
    probe = dict(tiers=st["tiers"][:], host=st["host"], nvme=st["nvme"], num_nvme=st["num_nvme"])
    freed, moved = 0.0, set()
    for _, i, t in ranked:
        if freed >= need:
            break
        if i in moved or not _tier_move_ok(fm, probe, i, t):
            continue
        a = fm.A[i]
        probe["host"] += a if t == "host" else 0.0
        probe["nvme"] += a if t == "nvme" else 0.0
        probe["num_nvme"] += t == "nvme"
        probe["tiers"][i] = t
        moved.add(i)
        freed += a
    return probe["tiers"] if freed >= need else None


def _local_search(fm, sol, evals):
    """First-improvement local search: tier changes, residual toggles, tail steps, then compound
    moves (a residual kept with the room it needs, see :func:`_room_moves`), then pair moves
    (two tier changes, or a tier change with a residual toggle) when no single move helps."""
    budget = fm.hw.device_memory
    st = fm.state(*sol)
    L = fm.L

    def better(total):
        return total < st["total"] - 1e-9 * max(1.0, st["total"])

    while not evals.spent:
        moved = False
        for i in range(1, L):
            for t in _tier_options(fm, i):
                if _tier_move_ok(fm, st, i, t) and evals.spend():
                    total, peak = fm.try_tier(st, i, t)
                    if peak <= budget and better(total):
                        st = _apply_tier(fm, st, i, t)
                        moved = True
        for l in range(L):
            if st["keep"][l] != "host" and (st["keep"][l] or fm.res_ok[l]):
                total, peak = fm.try_res(st, l)
                if peak <= budget and better(total):
                    st, moved = _toggle_residuals(fm, st, l), True
            for value in _host_residual_values(fm, st, l):
                if evals.spend():
                    total, peak, host = fm.try_keep(st, l, value)
                    if peak <= budget and host <= fm.hw.host_memory and better(total):
                        keep = st["keep"][:]
                        keep[l] = value
                        st, moved = fm.state(st["tiers"], keep, st["k"]), True
                        break
        for kk in (st["k"] - 1, st["k"] + 1):
            if 0 <= kk <= fm.K:
                other = fm.state(st["tiers"], st["keep"], kk)
                if fm.peak_of(other) <= budget and better(other["total"]):
                    st, moved = other, True
        if moved:
            continue
        better_st = _room_moves(fm, st, evals, better)
        if better_st is not None:
            st = better_st
            continue
        # pair moves: first change (any, even worsening or over budget), then a repairing second one
        for i in range(1, L):
            for t in _tier_options(fm, i):
                if not _tier_move_ok(fm, st, i, t) or not evals.spend(4):
                    continue
                mid = _apply_tier(fm, st, i, t)
                for j in range(1, L):
                    if j == i:
                        continue
                    for u in _tier_options(fm, j):
                        if _tier_move_ok(fm, mid, j, u) and evals.spend():
                            total, peak = fm.try_tier(mid, j, u)
                            if peak <= budget and better(total):
                                st, moved = _apply_tier(fm, mid, j, u), True
                                break
                    if moved:
                        break
                if not moved:
                    for l in range(L):
                        if mid["keep"][l] != "host" and (mid["keep"][l] or fm.res_ok[l]):
                            total, peak = fm.try_res(mid, l)
                            if peak <= budget and better(total):
                                st, moved = _toggle_residuals(fm, mid, l), True
                                break
                if moved or evals.spent:
                    break
            if moved or evals.spent:
                break
        if not moved:
            break
    return (st["tiers"], st["keep"], st["k"]), st["total"]


def spaced_checkpoints(costs, hardware, max_segment_length: int = 8) -> Plan | None:
    """A fitting plan of the shape the least device peak takes where boundaries are large: a
    checkpoint every K layers (K = ``max_segment_length`` down to 1), each on the host or on NVMe
    while they have room (host first, then NVMe; the other order too), on the device otherwise,
    every other boundary dropped, no residuals, no resident tail, depths 1. The least-peak fitting
    one, or None. For the largest batch and the MILP's start where the greedy construction finds
    nothing: Qwen3.6-27B on an H800 at batches 384-392 (4 GB boundaries, 15 GB of host memory,
    32 GB of NVMe), where only boundaries every 7 layers, on NVMe and the host, fit the device."""
    L = costs.num_layers
    A = costs.boundary_bytes
    options = {i: steps.tier_options(costs, hardware, i) for i in range(1, L)}
    staging = 2 * max(A)  # NVMe reads and writes go through host buffers (steps.tier_options)
    S = max(1, min(max_segment_length, L))
    layouts = set()
    for K in range(S, 0, -1):
        # aligned to the bottom, and to the top (the short end segment merged into its neighbour
        # where that stays within S)
        bottom, top = list(range(K, L, K)), list(range(L - K, 0, -K))[::-1]
        if bottom and L - bottom[-1] + K <= S and L - bottom[-1] < K:
            bottom.pop()
        if top and top[0] + K <= S and top[0] < K:
            top.pop(0)
        layouts.update((tuple(bottom), tuple(top)))
    best = None
    for kept in sorted(layouts, key=lambda k: (len(k), k)):
        for order in (("host", "nvme"), ("nvme", "host")):
            tiers = ["device"] + ["drop"] * (L - 1) + ["device"]
            host_room, nvme_room, staged = hardware.host_memory, hardware.nvme_memory, False
            for i in kept:
                tiers[i] = "device"
                for t in order:
                    if t not in options[i]:
                        continue
                    if t == "host" and host_room >= A[i]:
                        host_room -= A[i]
                    elif t == "nvme" and nvme_room >= A[i] and (staged or host_room >= staging):
                        nvme_room -= A[i]
                        host_room -= 0.0 if staged else staging
                        staged = True
                    else:
                        continue
                    tiers[i] = t
                    break
            plan = Plan.create(costs, hardware, name="spaced-checkpoints", boundary_tiers=tiers)
            if plan.fits() and (best is None or plan.predicted_peak_device_bytes < best.predicted_peak_device_bytes):
                best = plan
    return best
