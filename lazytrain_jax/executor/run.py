"""One step's forward and backward as the item sequence of ``schedule.timing.items``.

``StepRun`` holds the step's device state (boundaries per micro-batch, kept residuals, the current
boundary gradient, weight buffers in flight) and plays the items in order. Transfers are issued
ahead on the channel workers: weights ``plan.weight_prefetch_depth`` items ahead, offloaded
boundaries ``plan.act_prefetch_depth`` items ahead (their NVMe read one item earlier still).
Residuals kept on the host (``plan.offload_residuals``) go down on the D2H worker after their
layer's forward (the device copy is freed once the copy is done, by the end of the next item: the
step model's deadline) and come back on the H2D worker from their fetch's release window, like an
offloaded boundary.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

from lazytrain_jax.executor import engine as eng_mod, links
from lazytrain_jax.executor.host_optim import host_jit
from lazytrain_jax.executor.ledger import DeviceMemoryError, device_bytes, live_device_bytes
from lazytrain_jax.schedule import steps
from lazytrain_jax.schedule.memory import OFFLOAD_TIERS


@functools.lru_cache(maxsize=16)
def _embed_fns(cfg, host_sharding):
    from lazytrain_jax.model.units import get_units
    return (host_jit(get_units(cfg).embed, host_sharding),)


@functools.lru_cache(maxsize=16)
def _embed_grad_fn(cfg, host_sharding):
    """fp32 gradient of the embedding unit from the boundary-0 gradients (plus a tied head's)."""
    from lazytrain_jax.model.units import get_units
    units = get_units(cfg)

    def grad(master, ids_BxS, g0_list, tied_VxD):
        g_BxSxD = jnp.concatenate([g.astype(jnp.float32) for g in g0_list])
        _, vjp = jax.vjp(lambda p: units.embed(p, ids_BxS), master)
        out = vjp(g_BxSxD)[0]
        if tied_VxD is not None:
            out = {"embed_tokens": {"weight": out["embed_tokens"]["weight"] + tied_VxD}}
        return out

    return host_jit(grad, host_sharding)


@functools.lru_cache(maxsize=16)
def _host_concat(host_sharding):
    return host_jit(lambda xs: jnp.concatenate(xs), host_sharding)


@functools.lru_cache(maxsize=16)
def _host_fns(host_sharding):
    to_f32 = host_jit(lambda t: jax.tree.map(lambda x: x.astype(jnp.float32), t), host_sharding)
    sumsq = host_jit(lambda t: sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(t)),
                     host_sharding)
    return to_f32, sumsq


def _nbytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


class StepRun:
    """The device state and item loop of one step (see the module docstring)."""

    def __init__(self, engine, micro: list, count: int, *, need_norm: bool = True):
        self.e = engine
        self.need_norm = need_norm              # the gradient's sum of squares (a step's, not loss_and_grad's)
        self.cfg = engine.config
        self.plan = engine.plan
        self.items = engine.items
        self.tiers = engine.plan.boundary_tiers
        self.micro = micro
        self.M = len(micro)
        self.L = engine.num_layers
        self.inv_count = np.float32(1.0 / max(count, 1))
        self.data_shards = 1 if engine.mesh is None else engine.mesh.shape["data"]
        self.h: dict[int, list] = {}            # boundary -> device arrays per micro-batch
        self.h_tag: dict[int, str] = {}        # ledger tag of a boundary's device copy when not h{i}
        self.h_host: dict[int, object] = {}     # boundary -> future of host arrays (host tier / NVMe staging)
        self.h_nvme: dict[int, object] = {}     # boundary -> future of the NVMe writes
        self.res: dict[int, list] = {}
        self.offload_res = engine.plan.offload_residuals
        self.res_host: dict[int, object] = {}   # layer -> future of the host copy of its residuals
        self.res_meta: dict[int, tuple] = {}   # layer -> (device bytes, shardings) of its residuals
        self.res_due: dict[int, int] = {}       # item -> layer whose residuals' copy down is due by its end
        self.resfut: dict[int, object] = {}     # item -> future of its residuals fetched back
        self.res_release = {t.item: t.release for t in steps.transfers(engine.plan.costs, engine.plan, self.items)
                            if t.kind == "res_fetch"}
        self.g: list | None = None
        self.wfut: dict[int, object] = {}
        self.afut: dict[int, object] = {}
        self.rfut: dict[int, object] = {}
        self.resident_w: dict[int, object] = {}
        self.grad_futs: dict[int, object] = {}
        self.grads_due: dict[int, list] = {}    # item -> gradient downloads due by its end
        self.k_now = 0                          # the item being run
        self.sumsq: list = []
        self.losses: list = []
        self.deferred: list = []                 # (future, callback) run once the future is done
        self.g0_futs: list = []
        self.tied_fut = None

    # ---- bookkeeping ------------------------------------------------------------------------

    def _sweep(self, wait: bool = False):
        keep = []
        for fut, cb in self.deferred:
            if wait or fut.done():
                fut.result()
                cb()
            else:
                keep.append((fut, cb))
        self.deferred = keep

    def _audit(self, name: str):
        if not self.e.audit_memory:
            return
        live = live_device_bytes(self.e.devices, exclude_buffers=self.e._baseline_buffers)
        self.e.live_peak = max(self.e.live_peak, live)
        if live > self.e.budget * (1 + 1e-9):
            shapes = sorted(((x.nbytes, x.shape, str(x.dtype)) for x in jax.live_arrays()
                             if getattr(x.sharding, "memory_kind", None) in (None, "device")), reverse=True)[:8]
            raise DeviceMemoryError(f"live device arrays hold {live:,} bytes after item {name} (above the step's "
                                    f"start), above the plan's predicted peak {self.e.budget:,.0f} (ledger: "
                                    f"{self.e.ledger.largest()}; largest live: {shapes})")

    def _act_bytes(self) -> int:
        mb = self.plan.costs.micro_batch_size
        D = self.cfg.hidden_size
        return mb * self.plan.seq_len * D * jnp.dtype(self.e.stream_dtype).itemsize // self.data_shards

    # ---- transfers ---------------------------------------------------------------------------

    def _down(self, tree, *, to_host: bool = False):
        """Device -> host (``links.download``): offloaded activations and residuals stay where the
        copy lands; gradients (``to_host``) go on to the host store, where the optimizer reads them.
        Sharded arrays are first gathered on one device (JAX cannot move a multi-device array into a
        single-device host memory kind directly)."""
        e = self.e
        if e.mesh is not None:
            tree = jax.device_put(tree, SingleDeviceSharding(e.devices[0]))
        return links.download(tree, e.host_sharding, e.staging, to_host=to_host)

    def _uses_resident(self, item) -> bool:
        return item.phase in ("recompute", "backward") and item.layer is not None and self.e.resident[item.layer]

    def _issue_weights(self, k: int):
        if k >= len(self.items) or k in self.wfut:
            return
        item = self.items[k]
        if item.weight_unit is None or self._uses_resident(item):
            return
        e, u, L = self.e, item.weight_unit, self.L
        pending = [e._pending_units[u]] + ([e._pending_units[0]] if u == L + 1 and self.cfg.tie_word_embeddings else [])

        def wait_updates():
            for fut in pending:
                if fut is not None:
                    fut.result()

        if u == 0:
            gather = _embed_fns(self.cfg, e.host_sharding)[0]

            def upload():
                wait_updates()
                return [links.upload(gather(e._stream[0], mb["ids"]), e.batch_sharding) for mb in self.micro]

            nbytes = self.M * self._act_bytes()
        elif u == L + 1:
            def upload():
                wait_updates()
                tied = e._stream[0]["embed_tokens"]["weight"] if self.cfg.tie_word_embeddings else None
                return links.upload((e._stream[u], tied), e.weight_sharding)

            nbytes = _nbytes(e._stream[u]) + (_nbytes(e._stream[0]) if self.cfg.tie_word_embeddings else 0)
        else:
            def upload():
                wait_updates()
                return links.upload(e._stream[u], e.weight_sharding)

            nbytes = _nbytes(e._stream[u])
        e.ledger.add_bytes(f"w{k}", nbytes, item=item.name)
        self.wfut[k] = e._submit("h2d", f"w {item.name}", upload, item=k)

    def _issue_fetch(self, k: int, *, read_only: bool = False):
        if k >= len(self.items):
            return
        item = self.items[k]
        b = item.boundary_in
        if b is None or self.tiers[b] not in OFFLOAD_TIERS:
            return
        e = self.e
        if (b not in self.h_nvme) if self.tiers[b] == "nvme" else (b not in self.h_host):
            return  # not produced yet (the forward pass is still below it): issued at a later item
        if self.tiers[b] == "nvme" and k not in self.rfut:
            write_fut = self.h_nvme[b]

            def read():
                write_fut.result()
                return [e.nvme.read(f"b{b}_m{m}") for m in range(self.M)]

            self.rfut[k] = e._submit("nvme_read", f"read b{b}", read, item=k)
        if read_only or k in self.afut:
            return
        src = self.rfut[k] if self.tiers[b] == "nvme" else self.h_host[b]

        def upload():
            return [links.upload(x, e.batch_sharding) for x in src.result()]

        e.ledger.add_bytes(f"fetch{k}", self.M * self._act_bytes(), item=item.name)
        self.afut[k] = e._submit("h2d", f"b{b} {item.name}", upload, item=k)

    def _offload_residuals(self, k: int, l: int, res: list):
        """Layer ``l``'s residuals (just computed by item ``k``) down to the host; the device copy stays
        accounted as ``res{l}`` until the copy is done (waited for by the end of item k + 1)."""
        e = self.e
        self.res_meta[l] = (device_bytes(res, e.devices[0]), jax.tree.map(lambda x: x.sharding, res))
        fut = e._submit("d2h", f"res{l} down", lambda: [self._down(r) for r in res])
        self.res_host[l] = fut
        self.res_due[k + 1] = l

        def free():
            self.res.pop(l, None)
            e.ledger.free(f"res{l}")

        self.deferred.append((fut, free))

    def _issue_res_fetch(self, k: int, j: int):
        """Fetch of item ``j``'s residuals from the host, once its release window ``k`` has come."""
        if j in self.resfut or j not in self.res_release or self.res_release[j] > k:
            return
        e, l = self.e, self.items[j].layer
        src = self.res_host[l]
        nbytes, shardings = self.res_meta[l]

        def upload():
            return [links.upload(r, shardings[m]) for m, r in enumerate(src.result())]

        e.ledger.add_bytes(f"resfetch{j}", nbytes, item=self.items[j].name)
        self.resfut[j] = e._submit("h2d", f"res{l} {self.items[j].name}", upload, item=j)

    def _weights(self, k: int):
        item = self.items[k]
        if self._uses_resident(item):
            return self.resident_w[item.layer]
        return self.e._wait(self.wfut[k], "h2d")

    def _release_weights(self, k: int):
        if k in self.wfut:
            del self.wfut[k]
            self.e.ledger.free(f"w{k}")

    def _offload(self, i: int, arrays: list):
        """Boundary ``i`` (just produced) goes down to the host, and on to NVMe for that tier."""
        e = self.e
        fut = e._submit("d2h", f"b{i} down", lambda: [self._down(x) for x in arrays])
        self.h_host[i] = fut
        if self.tiers[i] == "nvme":
            def write():
                host = fut.result()
                for m, x in enumerate(host):
                    e.nvme.write(f"b{i}_m{m}", np.asarray(x))
                self.h_host.pop(i, None)  # the host staging copy is released once written
                return None

            self.h_nvme[i] = e._submit("nvme_write", f"write b{i}", write)

    def _free_boundary(self, i: int):
        """Drops the device copy of boundary ``i`` (after its download, if it has one)."""
        if i not in self.h:
            return
        arrays = self.h.pop(i)
        tag = self.h_tag.pop(i, f"h{i}")

        def free():
            del arrays[:]
            self.e.ledger.free(tag)

        fut = self.h_host.get(i) if self.tiers[i] in OFFLOAD_TIERS else None
        if fut is not None and not fut.done():
            self.deferred.append((fut, free))
        else:
            free()

    def _download(self, tag: str, device_tree, down, name: str):
        """``down`` (computed from ``device_tree``) to the host store on the D2H worker, as it is for
        the per-unit host step (which reads bf16 gradients itself), as fp32 for a whole-tree optax
        transform; the device arrays stay accounted under ``tag`` until the copy is done."""
        e = self.e
        e.ledger.add(tag, device_tree, item=name)
        landed = (lambda tree: tree) if e.opt.splittable else self._host_f32
        fut = e._submit("d2h", f"grad {name}", lambda: landed(self._down(down, to_host=True)))
        self.deferred.append((fut, lambda: e.ledger.free(tag)))
        # the step model's deadline: the copy down is done by the end of the next item (its device
        # buffers are then freed, so at most two gradients are on the device, as memory.py counts)
        self.grads_due.setdefault(self.k_now + 1, []).append(fut)
        return fut

    def _host_f32(self, tree):
        """The host copy of a gradient in fp32 (a cast only where it arrived in another dtype)."""
        if all(x.dtype == jnp.float32 for x in jax.tree.leaves(tree)):
            return tree
        return _host_fns(self.e.host_sharding)[0](tree)

    def _to_grad_dtype(self, tree):
        """``tree`` in the plan's gradient dtype (no copy where it already is)."""
        dtype = self.e.grad_dtype
        if all(x.dtype == dtype for x in jax.tree.leaves(tree)):
            return tree
        return eng_mod._cast(tree, dtype)

    def _send_grads(self, u: int, acc, name: str):
        """Gradient sum of squares on device (in fp32), then the gradient to the host in the plan's dtype."""
        if self.need_norm:
            self.sumsq.append(eng_mod._sumsq(acc))
        down = self._to_grad_dtype(acc)
        self.grad_futs[u] = self._download(f"acc{u}", (acc, down) if down is not acc else acc, down, name)

    def _accumulate(self, grads_per_mb: list):
        """The sum over micro-batches, in fp32; one micro-batch's gradient is used as it is (its
        sum of squares is taken in fp32 and it goes down in the plan's dtype either way)."""
        if len(grads_per_mb) == 1:
            return grads_per_mb[0]
        acc = eng_mod._to_f32(grads_per_mb[0])
        for g in grads_per_mb[1:]:
            acc = eng_mod._accumulate(acc, g)
        return acc

    # ---- the loop -------------------------------------------------------------------------------

    def execute(self, serial_update: bool):
        e, items = self.e, self.items
        wdepth, adepth = self.plan.weight_prefetch_depth, self.plan.act_prefetch_depth
        e.ledger.add("batch", [(mb["mask"], mb["labels"], mb["pos"]) for mb in self.micro], item="P0")
        for k, item in enumerate(items):
            t0 = e.timeline.now()
            if item.name == "P0" and serial_update:
                e._run_serial_update()
            for j in range(k, k + wdepth + 1):
                self._issue_weights(j)
            self._issue_fetch(k + adepth + 1, read_only=True)
            for j in range(k, k + adepth + 1):
                self._issue_fetch(j)
                self._issue_res_fetch(k, j)
            self.k_now = k
            self._run_item(k, item)
            e._open_gates(e.updates_due.get(k, ()))  # they start after this window's compute (CPU backend)
            for fut in self.grads_due.pop(k, ()):  # gradients' copies down due by the end of this item
                e._wait(fut, "d2h")
            if k in self.res_due:  # the copy down of the residuals is due by the end of this item
                self.e._wait(self.res_host[self.res_due.pop(k)], "d2h")
            for u in e.updates_due.get(k, ()):
                if e._pending_units[u] is not None:
                    e._wait(e._pending_units[u], "optimizer")
            self._sweep()
            self._audit(item.name)
            e.timeline.add_window(item.name, t0, e.timeline.now())
        e._open_gates()
        self._sweep(wait=True)
        e.ledger.free("batch")
        loss = float(sum(np.asarray(x) for x in self.losses))
        grads = [self.grad_futs[u].result() for u in range(self.L + 2)]
        sumsq = float(sum(np.asarray(x, np.float64) for x in self.sumsq)) if self.need_norm else float("nan")
        return loss, grads, sumsq

    def release(self):
        """Drops every reference the step holds (closures in deferred callbacks form cycles)."""
        for name in ("h", "h_host", "h_nvme", "res", "wfut", "afut", "rfut", "resident_w", "grad_futs", "res_host",
                     "res_meta", "res_due", "resfut", "grads_due"):
            getattr(self, name).clear()
        self.deferred, self.g, self.g0_futs, self.tied_fut, self.micro = [], None, [], None, []

    def abort(self):
        """After an error: wait for in-flight transfers so nothing writes behind the caller's back."""
        self.e._open_gates()  # an upload may wait for its unit's gated update
        for futs in (self.wfut, self.afut, self.rfut, self.grad_futs, self.h_host, self.h_nvme, self.res_host,
                     self.resfut):
            for fut in list(futs.values()):
                try:
                    fut.result()
                except BaseException:
                    pass
        if self.e.nvme is not None:
            self.e.nvme.clear()

    def _compute(self, name: str, k: int, fn):
        tl = self.e.timeline
        t0 = tl.now()
        out = fn()
        jax.block_until_ready(out)
        tl.add("compute", name, t0, tl.now(), k)
        return out

    def _run_item(self, k: int, item):
        phase = item.phase
        if phase == "tail":
            return
        if item.name == "FE":
            rows = self._weights(k)
            del self.wfut[k]
            self.e.ledger.free(f"w{k}")
            self.e.ledger.add("h0", rows, item="FE")
            self.h[0] = rows
            return
        if item.name == "BE":
            return self._embed_backward(k)
        if phase == "forward":
            return self._forward(k, item)
        if phase == "head":
            return self._head(k, item)
        if phase == "recompute":
            return self._recompute(k, item)
        return self._backward(k, item)

    def _forward(self, k: int, item):
        e, l = self.e, item.layer
        kind = self.cfg.layer_kinds[l]
        fns = eng_mod.device_fns(self.cfg, kind)
        w = self._weights(k)
        h_in = self.h[l]
        keep = self.plan.keep_residuals[l]

        def run():
            outs, res = [], []
            for mb, x in zip(self.micro, h_in):
                if keep:
                    y, r = fns["forward_res"](w, x, mb["pos"], mb["mask"])
                    res.append(r)
                else:
                    y = fns["forward"](w, x, mb["pos"], mb["mask"])
                outs.append(y)
            return outs, res

        outs, res = self._compute(item.name, k, run)
        e.ledger.add(f"h{l + 1}", outs, item=item.name)
        if keep:
            e.ledger.add(f"res{l}", res, item=item.name)
            self.res[l] = res
            if self.offload_res[l]:
                self._offload_residuals(k, l, res)
        if e.resident[l]:
            self.resident_w[l] = w
            e.ledger.free(f"w{k}")
            e.ledger.add(f"resident{l}", w, item=item.name)
            del self.wfut[k]
        else:
            self._release_weights(k)
        self.h[l + 1] = outs
        if self.tiers[l] != "device":
            self._free_boundary(l)
        if self.tiers[l + 1] in OFFLOAD_TIERS:
            self._offload(l + 1, outs)

    def _head(self, k: int, item):
        e, L = self.e, self.L
        w_head, tied = self._weights(k)
        h_in = self.h[L]
        fn = eng_mod.head_fn(self.cfg)

        def run():
            out = []
            for mb, x in zip(self.micro, h_in):
                loss, (g_head, g_tied, g_h) = fn(w_head, tied, x, mb["labels"], self.inv_count)
                out.append((loss, g_head, g_tied, g_h))
            return out

        out = self._compute(item.name, k, run)
        self.losses = [o[0] for o in out]
        self.g = [o[3] for o in out]
        e.ledger.add("g", self.g, item=item.name)
        self._free_boundary(L)
        self._release_weights(k)
        self._send_grads(L + 1, self._accumulate([o[1] for o in out]), item.name)
        if self.cfg.tie_word_embeddings:
            acc = self._accumulate([o[2] for o in out])
            self.tied_fut = self._download("acc_tied", acc, acc, "FH tied")  # joins the embedding's gradient

    def _base_input(self, k: int, item, s: int):
        """Boundary ``s`` on the device: kept there, or fetched from its tier for this item."""
        if s in self.h:
            return self.h[s]
        fetched = self.e._wait(self.afut.pop(k), "h2d")
        self.e.ledger.free(f"fetch{k}")
        self.e.ledger.add(f"h{s} fetched", fetched, item=item.name)
        self.h_tag[s] = f"h{s} fetched"
        self.h[s] = fetched
        self.h_host.pop(s, None)
        return fetched

    def _recompute(self, k: int, item):
        e, j = self.e, item.layer
        if item.boundary_in is not None:
            self._base_input(k, item, item.boundary_in)
        fns = eng_mod.device_fns(self.cfg, self.cfg.layer_kinds[j])
        w = self._weights(k)
        h_in = self.h[j]
        outs = self._compute(item.name, k, lambda: [fns["forward"](w, x, mb["pos"], mb["mask"])
                                                  for mb, x in zip(self.micro, h_in)])
        e.ledger.add(f"h{j + 1}", outs, item=item.name)
        self.h[j + 1] = outs
        self._release_weights(k)

    def _backward(self, k: int, item):
        e, l = self.e, item.layer
        if item.boundary_in is not None:
            self._base_input(k, item, item.boundary_in)
        fns = eng_mod.device_fns(self.cfg, self.cfg.layer_kinds[l])
        w = self._weights(k)
        keep = self.plan.keep_residuals[l]
        g_out = self.g
        h_in = None if keep else self.h[l]
        if self.offload_res[l]:
            fetched = e._wait(self.resfut.pop(k), "h2d")
            e.ledger.free(f"resfetch{k}")
            e.ledger.add(f"res{l}", fetched, item=item.name)
            self.res[l] = fetched
            self.res_host.pop(l, None)
        res = self.res.get(l)

        def run():
            gps, ghs = [], []
            for m, mb in enumerate(self.micro):
                if keep:
                    gp, gh = fns["backward_res"](w, res[m], g_out[m])
                else:
                    gp, gh = fns["backward"](w, h_in[m], mb["pos"], mb["mask"], g_out[m])
                gps.append(gp)
                ghs.append(gh)
            return gps, ghs

        gps, ghs = self._compute(item.name, k, run)
        e.ledger.free("g")
        self.g = ghs
        e.ledger.add("g", ghs, item=item.name)
        if keep:
            del self.res[l]
            e.ledger.free(f"res{l}")
        if e.resident[l]:
            del self.resident_w[l]
            e.ledger.free(f"resident{l}")
        else:
            self._release_weights(k)
        self._free_boundary(l)
        self._send_grads(l + 1, self._accumulate(gps), item.name)
        if l == 0:
            g0 = list(ghs)  # cast to fp32 on the host by the embedding's backward
            self.g0_futs.append(e._submit("d2h", "grad b0", lambda: [self._down(self._to_grad_dtype(x), to_host=True) for x in g0]))

    def _embed_backward(self, k: int):
        """BE: the boundary-0 gradient scatter-added into the embedding table on the host (fp32)."""
        e = self.e
        g0 = self.g0_futs[0].result()
        e.ledger.free("g")
        self.g = None
        grad = _embed_grad_fn(self.cfg, e.host_sharding)
        tl = e.timeline
        t0 = tl.now()
        ids = _host_concat(e.host_sharding)([mb["ids"] for mb in self.micro])
        tied = self.tied_fut.result() if self.tied_fut is not None else None
        acc = grad(e._master[0], ids, g0, tied)
        jax.block_until_ready(acc)
        tl.add("compute", "BE embed scatter-add (host)", t0, tl.now(), k)
        if self.need_norm:
            self.sumsq.append(_host_fns(e.host_sharding)[1](acc))
        self.grad_futs[0] = e._workers["d2h"].submit(lambda: acc)
