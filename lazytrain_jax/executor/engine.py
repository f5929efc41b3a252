"""StreamingEngine: runs any Plan exactly, one streamed unit at a time.

The engine plays the item sequence of ``schedule.timing.items`` (P0, P1, FE, F_0.., FH, RC/B per
segment from the top, BE): each item's compute runs on the main thread while its weights (and
offloaded inputs) were uploaded ahead by the H2D worker, its outputs go down on the D2H worker
and to NVMe files on the NVMe workers; the host optimizer runs on its own worker (on the CPU
backend each unit's update starts once the compute of the window it is due in has ended). Every worker
records its intervals (``engine.timeline``), so each measured window maps onto a predicted one.

Host store (CPU backend): fp32 master parameters and optimizer state per unit, and the
low-precision streaming copy that the update itself writes. Device: only what the plan says,
accounted per item by a :class:`DeviceLedger` against ``plan.predicted_peak_device_bytes`` minus
the hardware margin (the margin is XLA's workspace and fragmentation, not held arrays).

Shape legend: B batch, S sequence, D hidden, M micro-batches, b = B / M.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import threading
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from lazytrain_jax.executor import host_optim, links
from lazytrain_jax.executor.ledger import DeviceLedger, DeviceMemoryError, live_device_buffers
from lazytrain_jax.executor.nvme import NvmeStore
from lazytrain_jax.executor.timeline import Timeline
from lazytrain_jax.model.batch import validate_batch
from lazytrain_jax.model.units import IGNORE_INDEX, default_positions, get_units, jitted_layer, shift_labels
from lazytrain_jax.schedule import timing
from lazytrain_jax.schedule.costs import config_fingerprint

STREAM_DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "float16": jnp.float16}
GRAD_DTYPES = {"bfloat16": jnp.bfloat16, "float32": jnp.float32}
CHANNEL_WORKERS = ("h2d", "d2h", "nvme_read", "nvme_write", "optimizer")


# ---- jitted device functions, one per (config, kind): one compilation per kind and shape ----------

@functools.lru_cache(maxsize=64)
def device_fns(cfg, kind: str):
    units = get_units(cfg)
    return dict(forward=jitted_layer(cfg, kind),
                forward_res=jax.jit(units.layer_forward_with_residuals(kind)),
                backward_res=jax.jit(units.layer_backward_from_residuals(kind)),
                backward=jax.jit(units.layer_backward(kind)))


@functools.lru_cache(maxsize=16)
def head_fn(cfg):
    units = get_units(cfg)

    def loss(head_p, tied_w, h_bxSxD, labels_bxS, inv_count):
        loss_sum, _ = units.head_loss(head_p, tied_w, h_bxSxD, labels_bxS)
        return loss_sum * inv_count

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


@jax.jit
def _accumulate(acc, g):
    return jax.tree.map(lambda a, b: a + b.astype(jnp.float32), acc, g)


@jax.jit
def _to_f32(g):
    return jax.tree.map(lambda b: b.astype(jnp.float32), g)


@jax.jit
def _sumsq(tree):
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


@functools.partial(jax.jit, static_argnums=(1,))
def _cast(tree, dtype):
    return jax.tree.map(lambda x: x.astype(dtype), tree)


@functools.lru_cache(maxsize=8)
def _copy_fn(dtype, host_sharding):
    return host_optim.host_jit(lambda t: jax.tree.map(lambda x: x.astype(dtype), t), host_sharding)


class StreamingEngine:
    """Executes a Plan: layer-streamed forward and backward and the host optimizer.

    Args:
      model: a ``Model`` (host parameters; the engine keeps its own fp32 master copy).
      plan: a ``Plan`` solved for this model, batch size and sequence length.
      optimizer: an optax transform; None gives ``lt.optim.adamw_8bit`` (lr 1e-5, weight decay 0.01,
        clip 1.0). ``adamw_8bit`` transforms run per unit (``pipelined`` or ``serial``); any other
        optax transform runs on the whole host tree after backward and needs ``serial``.
      stream_dtype: dtype of the streamed weights and activations (``bfloat16``; ``float32`` for
        exactness checks).
      mesh: optional ``jax.sharding.Mesh`` with a ``data`` axis: weights replicated, batch and
        boundaries sharded along ``data``, gradients reduced by XLA; one master copy on the host.
      offload_dir: directory of the NVMe tier (default: a temporary directory).
      audit_memory: also sample ``jax.live_arrays()`` at every item boundary (independent check
        of the device bytes; costs time, meant for tests).

    Example:
      >>> engine = StreamingEngine(model, plan)
      >>> metrics = engine.step(batch)
    """

    def __init__(self, model, plan, optimizer=None, *, stream_dtype: str = "bfloat16", mesh=None,
                 offload_dir: str | None = None, audit_memory: bool = False):
        from lazytrain_jax.host_alloc import hint_huge_pages, keep_host_blocks_once
        from lazytrain_jax.schedule.plan import Plan
        keep_host_blocks_once()  # as lt.profile measured: freed host buffers reused, not faulted in again
        hint_huge_pages(max((4 * math.prod(x.shape) for x in jax.tree.leaves(model.params)), default=0))
        if not isinstance(plan, Plan):
            raise ValueError(f"plan must be a lazytrain_jax.Plan; got {type(plan).__name__}")
        cfg = model.config
        fingerprint = config_fingerprint(cfg)
        if plan.costs.model_fingerprint != fingerprint:
            raise ValueError(f"plan.costs.model_fingerprint={plan.costs.model_fingerprint!r} "
                             f"({plan.costs.model_name}) was solved for another model; this model's is "
                             f"{fingerprint!r}: plan again for it (lt.plan(model, ...))")
        if stream_dtype not in STREAM_DTYPES:
            raise ValueError(f"stream_dtype={stream_dtype!r}; valid: {sorted(STREAM_DTYPES)}")
        self.model, self.config, self.plan = model, cfg, plan
        self.num_layers = L = cfg.num_layers
        self.stream_dtype = STREAM_DTYPES[stream_dtype]
        self.grad_dtype = GRAD_DTYPES[plan.costs.grad_dtype]
        self.items = timing.items(plan.costs, plan)
        # window k ends once the host updates due in it are done (the step model's deadlines), so
        # the measured windows are the predicted ones; the uploads wait for their unit's update anyway
        self.updates_due: dict[int, list[int]] = {}
        for t in timing.transfers(plan.costs, plan, self.items):
            if t.kind == "update":
                self.updates_due.setdefault(t.deadline, []).append(t.ref)
        self.resident = [l >= L - plan.resident_tail for l in range(L)]
        self.mesh = mesh
        if mesh is not None:
            if "data" not in mesh.axis_names:
                raise ValueError(f"mesh.axis_names={tuple(mesh.axis_names)} has no 'data' axis; build the mesh "
                                 "with jax.make_mesh((n,), ('data',))")
            n = mesh.shape["data"]
            if plan.costs.micro_batch_size % n:
                raise ValueError(f"micro-batch size {plan.costs.micro_batch_size} (batch {plan.batch_size} / "
                                 f"{plan.num_micro_batches} micro-batches) is not divisible by the mesh's data axis "
                                 f"({n} devices)")
            self.devices = list(mesh.devices.flat)
            self.weight_sharding = NamedSharding(mesh, PartitionSpec())
            self.batch_sharding = NamedSharding(mesh, PartitionSpec("data"))
        else:
            self.devices = [jax.devices()[0]]
            self.weight_sharding = self.batch_sharding = SingleDeviceSharding(self.devices[0])
        on_cpu = self.devices[0].platform == "cpu"
        self.host_sharding = links.host_store(self.devices[0])  # copies: executor/links.py
        self.staging = links.staging(self.devices[0])
        if self.staging is not None:  # measure the gradients' way to the host now, not inside a step
            links.to_host_paths(self.staging, self.host_sharding,
                                (self.grad_dtype, jnp.float32))  # summed micro-batches: fp32
        self.budget = plan.predicted_peak_device_bytes - plan.hardware.device_margin
        self.ledger = DeviceLedger(self.budget, self.devices[0])
        self.audit_memory = audit_memory
        self.live_peak = 0
        self.timeline = Timeline()
        self._workers = {ch: cf.ThreadPoolExecutor(1, thread_name_prefix=f"lazytrain-{ch}") for ch in CHANNEL_WORKERS}
        self.nvme = NvmeStore(offload_dir, capacity_bytes=plan.predicted_peak_nvme_bytes) \
            if any(t == "nvme" for t in plan.boundary_tiers) else None
        self.units = get_units(cfg)
        self.opt = host_optim.make_host_optimizer(optimizer, self.host_sharding, L, self.stream_dtype)
        if plan.optimizer_mode == "pipelined" and not self.opt.splittable:
            raise ValueError("plan.optimizer_mode='pipelined' needs an optimizer that updates one unit at a time "
                             "(lt.optim.adamw_8bit); this optax transform runs whole-tree: use a plan with "
                             "optimizer_mode='serial' (plan.replace(optimizer_mode='serial') or lt.plan(...))")
        # host store
        put = functools.partial(jax.device_put, device=self.host_sharding)
        master = jax.tree.map(lambda x: put(np.asarray(x, np.float32)), model.params)
        self._master = host_optim.split_units(master, L)
        self._opt_state = self.opt.init(master)
        self._stream = [self._make_copy(m) for m in self._master]
        self._pending_units: list[cf.Future | None] = [None] * (L + 2)
        # where the device computes on the host's own cores (the CPU backend) a pipelined update
        # waits for its window's compute, as the step model plays them (``schedule.steps``: one load
        # after another): run beside it, the update and the compute slowed each other down
        self._gate_updates = on_cpu
        self._gates: list[threading.Event] = []  # per unit: its pipelined update may start
        self._pending_finish: cf.Future | None = None
        self._serial_pending = None
        self.step_count = 0
        self.last_metrics: dict = {}

    # ---- host store -------------------------------------------------------------------------

    def _make_copy(self, master_u):
        return _copy_fn(self.stream_dtype, self.host_sharding)(master_u)

    def flush(self) -> None:
        """Waits for (or runs) any pending optimizer update."""
        self._open_gates()
        if self._serial_pending is not None:
            self._run_serial_update()
        for fut in self._pending_units:
            if fut is not None:
                fut.result()
        if self._pending_finish is not None:
            self._opt_state = self._pending_finish.result()
            self._pending_finish = None
        self._pending_units = [None] * (self.num_layers + 2)

    @property
    def params(self) -> dict:
        """fp32 master parameters (numpy) in ``model.params``' layout, after any pending update."""
        self.flush()
        return host_optim.to_numpy_tree(host_optim.join_units(self._master, self.num_layers))

    @property
    def opt_state(self):
        """The optimizer state (numpy leaves), after any pending update."""
        self.flush()
        return host_optim.to_numpy_tree(self._opt_state)

    def state_dict(self) -> dict:
        """``{"params", "opt_state", "step"}`` with numpy leaves (for checkpoints)."""
        return {"params": self.params, "opt_state": self.opt_state, "step": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        """Restores :meth:`state_dict` output (same model, same optimizer structure)."""
        self.flush()
        put = functools.partial(jax.device_put, device=self.host_sharding)
        ref = host_optim.join_units(self._master, self.num_layers)
        if jax.tree.structure(ref) != jax.tree.structure(state["params"]):
            raise ValueError("state['params'] does not have this model's parameter structure")
        master = jax.tree.map(lambda r, x: put(np.asarray(x, np.float32).reshape(r.shape)), ref, state["params"])
        self._master = host_optim.split_units(master, self.num_layers)
        if jax.tree.structure(self._opt_state) != jax.tree.structure(state["opt_state"]):
            raise ValueError("state['opt_state'] does not match this optimizer's state structure")
        self._opt_state = jax.tree.map(lambda r, x: put(np.asarray(x, r.dtype)), self._opt_state, state["opt_state"])
        self._stream = [self._make_copy(m) for m in self._master]
        self.step_count = int(state.get("step", 0))

    # ---- workers ------------------------------------------------------------------------------

    def _submit(self, channel: str, name: str, fn, *args, item: int | None = None,
                after: threading.Event | None = None) -> cf.Future:
        """``fn(*args)`` on ``channel``'s worker (once ``after`` is set, if given), its interval timed."""
        tl = self.timeline

        def run():
            if after is not None:
                after.wait()
            t0 = time.perf_counter()  # absolute: the step's clock may restart while this runs
            out = fn(*args)
            jax.block_until_ready(out)
            tl.add_since(channel, name, t0, time.perf_counter(), item)
            return out

        return self._workers[channel].submit(run)

    def _wait(self, fut: cf.Future, channel: str):
        if fut.done():
            return fut.result()
        t0 = time.perf_counter()
        out = fut.result()
        self.timeline.add_stall(channel, time.perf_counter() - t0)
        return out

    def close(self) -> None:
        """Finishes pending work and releases worker threads and NVMe files."""
        try:
            self.flush()
        finally:
            for w in self._workers.values():
                w.shutdown(wait=True)
            if self.nvme is not None:
                self.nvme.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- batch --------------------------------------------------------------------------------

    def _prepare(self, batch):
        b = validate_batch(batch, self.config.vocab_size)
        B, S = b["input_ids"].shape
        if (B, S) != (self.plan.batch_size, self.plan.seq_len):
            raise ValueError(f"batch shape [B, S] = [{B}, {S}] differs from the plan's [{self.plan.batch_size}, "
                             f"{self.plan.seq_len}] (batch_size, seq_len): plan for this shape")
        count = int(np.sum(np.asarray(shift_labels(jnp.asarray(b["labels"]))) != IGNORE_INDEX))
        M = self.plan.num_micro_batches
        mb = B // M
        put = functools.partial(jax.device_put, device=self.batch_sharding)
        micro = []
        for m in range(M):
            rows = slice(m * mb, (m + 1) * mb)
            ids = b["input_ids"][rows]
            mask = b["attention_mask"][rows]
            micro.append(dict(ids=jax.device_put(ids, self.host_sharding), mask=put(mask), labels=put(b["labels"][rows]),
                              pos=put(np.asarray(default_positions(jnp.asarray(ids))))))
        return micro, count

    # ---- one step -------------------------------------------------------------------------------

    def loss_and_grad(self, batch):
        """Streamed mean loss and gradients (fp32 numpy, ``model.params``' layout); no update.

        Example:
          >>> loss, grads = engine.loss_and_grad(batch)
        """
        self.flush()
        loss, grads, _ = self._forward_backward(batch)
        return loss, host_optim.to_numpy_tree(host_optim.join_units(grads, self.num_layers), np.float32)

    def step(self, batch) -> dict:
        """One training step: streamed forward/backward, then the optimizer (pipelined into the next
        step's uploads, or serial at the next step's start).

        Returns:
          dict: loss, grad_norm, skipped, step_time_s, stall_s, stalls, peak_device_bytes, num_tokens,
          predicted_step_time_s, busy (seconds per channel).
        """
        loss, grads, sumsq = self._forward_backward(batch, step=True)
        norm = float(np.sqrt(sumsq))
        if self.opt.splittable and self.plan.optimizer_mode == "pipelined":
            self._launch_pipelined(grads, norm)
        else:
            self._serial_pending = (grads, norm)
        self.step_count += 1
        stall = float(sum(self.timeline.stalls.values()))
        self.last_metrics = dict(loss=loss, grad_norm=norm, skipped=not np.isfinite(norm),
                                 step_time_s=self._step_time, stall_s=stall, stalls=dict(self.timeline.stalls),
                                 peak_device_bytes=self.ledger.peak, live_peak_device_bytes=self.live_peak,
                                 num_tokens=self._count, predicted_step_time_s=self.plan.predicted_step_time_s,
                                 busy=self.timeline.busy())
        return dict(self.last_metrics)

    def save_trace(self, path: str, *, with_prediction: bool = True) -> None:
        """Writes the last step's measured timeline (and the simulator's prediction) as Chrome JSON."""
        predicted = None
        if with_prediction:
            from lazytrain_jax.schedule.simulator import simulate
            predicted = simulate(self.plan)
        self.timeline.save_chrome_trace(path, predicted)

    # ---- optimizer ------------------------------------------------------------------------------

    def _launch_pipelined(self, grads, norm):
        if self._pending_finish is not None:
            self._opt_state = self._pending_finish.result()
            self._pending_finish = None
        opt, state = self.opt, self._opt_state
        info, hp, count, skipped = opt.begin(state, norm)
        moments = [None] * (self.num_layers + 2)

        gates = self._gates = [threading.Event() for _ in range(self.num_layers + 2)] if self._gate_updates else []

        def update(u):
            # the unit's old streaming copy (its uploads of this step are done: the backward that
            # produced grads[u] used them) is donated and holds the new one
            master, copy, mom = opt.update_unit(state, u, self._master[u], grads[u], info, hp, self._stream[u])
            self._master[u], self._stream[u], moments[u] = master, copy, mom
            return copy

        self._pending_units = [self._submit("optimizer", f"opt{u}", update, u, after=gates[u] if gates else None)
                               for u in range(self.num_layers + 2)]
        self._pending_finish = self._workers["optimizer"].submit(lambda: opt.finish(state, moments, count, skipped))

    def _open_gates(self, units=None):
        """Lets the pipelined updates of ``units`` (all if None) start (where they are gated)."""
        if not self._gates:
            return
        for u in (range(len(self._gates)) if units is None else units):
            self._gates[u].set()

    def _run_serial_update(self):
        grads, norm = self._serial_pending
        self._serial_pending = None
        t0 = self.timeline.now()
        if self.opt.splittable:
            opt, state = self.opt, self._opt_state
            info, hp, count, skipped = opt.begin(state, norm)
            moments = []
            for u in range(self.num_layers + 2):
                master, copy, mom = opt.update_unit(state, u, self._master[u], grads[u], info, hp,
                                                    self._stream[u])
                self._master[u], self._stream[u] = master, copy
                moments.append(mom)
            self._opt_state = opt.finish(state, moments, count, skipped)
        else:
            L = self.num_layers
            params, self._opt_state = self.opt.update(host_optim.join_units(grads, L), self._opt_state,
                                                      host_optim.join_units(self._master, L))
            self._master = host_optim.split_units(params, L)
            self._stream = [self._make_copy(m) for m in self._master]
        jax.block_until_ready(self._stream)
        self.timeline.add("optimizer", "serial update", t0, self.timeline.now(), 0)

    # ---- the item sequence ------------------------------------------------------------------------

    def _forward_backward(self, batch, step: bool = False):
        from lazytrain_jax.executor.run import StepRun
        if self.audit_memory:  # buffers that exist before the step are not the step's
            gc.collect()
            self._baseline_arrays = jax.live_arrays()   # held, so their buffers are not reused meanwhile
            self._baseline_buffers = frozenset(live_device_buffers(self.devices))
        micro, count = self._prepare(batch)
        self._count = count
        self.timeline.start()
        self.ledger.reset()
        self.live_peak = 0
        t_start = time.perf_counter()
        run = StepRun(self, micro, count, need_norm=step)
        try:
            loss, grads, sumsq = run.execute(serial_update=step and self._serial_pending is not None)
        except BaseException:
            run.abort()
            raise
        finally:
            run.release()
            self._baseline_arrays = None
        self._step_time = time.perf_counter() - t_start
        return loss, grads, sumsq


__all__ = ["StreamingEngine", "DeviceMemoryError"]
