"""Tiny models, batches and random valid plans shared by the executor tests."""

from __future__ import annotations

import functools

import numpy as np

import lazytrain_jax as lt
from lazytrain_jax.executor.profiler import unit_costs
from lazytrain_jax.schedule.hardware import Hardware
from lazytrain_jax.schedule.plan import Plan

BATCH, SEQ = 4, 16
NUM_LAYERS = 6
HARDWARE = Hardware(name="test", device_memory=1e12, h2d_bw=1e10, d2h_bw=1e10, device_flops=1e12,
                    device_margin=0.0, nvme_memory=1e10, host_memory=1e12)


@functools.lru_cache(maxsize=None)
def tiny_model(family: str, seed: int = 0):
    cfg = lt.get_preset(f"{family}-debug")
    cfg = cfg.replace(num_layers=NUM_LAYERS, layer_kinds=(cfg.layer_kinds[0],) * NUM_LAYERS)
    return lt.init_model(cfg, seed=seed)


def tiny_batch(model, seed: int = 0, batch: int = BATCH, seq: int = SEQ) -> dict:
    """Random ids with left padding in one row and masked labels in another."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.config.vocab_size, (batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, :3] = 0
    labels = np.where(mask == 1, ids, -100).astype(np.int32)
    labels[1, : seq // 3] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def costs_for(model, num_micro_batches: int, stream_dtype: str = "float32", batch: int = BATCH):
    return _costs_for(model.config, num_micro_batches, stream_dtype, batch)


@functools.lru_cache(maxsize=None)
def _costs_for(config, num_micro_batches: int, stream_dtype: str, batch: int):
    return unit_costs(config, batch_size=batch, seq_len=SEQ, num_micro_batches=num_micro_batches,
                      stream_dtype=stream_dtype)


def random_plan(rng: np.random.Generator, model, *, optimizer_mode: str | None = None,
                stream_dtype: str = "float32", micro_batch: int | None = None,
                offload_rng: np.random.Generator | None = None) -> Plan:
    """A uniformly random valid plan: tiers (NVMe where allowed), segments, residuals (recomputed,
    kept on device or on the host), resident tail, prefetch depths 1-3, 1/2/4 micro-batches,
    optimizer mode. ``offload_rng`` (default ``rng``) draws which kept residuals go to the host: a
    stream of its own leaves the other decisions what they were before residual offload existed."""
    L = model.config.num_layers
    tiers = ["device"]
    for i in range(1, L):
        options = ["device", "host", "drop", "drop"] + (["nvme"] if 1 <= i <= L - 3 else [])
        tiers.append(str(rng.choice(options)))
    tiers.append("device")
    M = int(rng.choice([1, 2, 4]))
    mode = optimizer_mode or str(rng.choice(["pipelined", "serial"]))
    batch = BATCH if micro_batch is None else micro_batch * M
    keep = [bool(x) for x in rng.integers(0, 2, L)]
    tail, dw, da = int(rng.integers(0, L + 1)), int(rng.integers(1, 4)), int(rng.integers(1, 4))
    # residuals kept on the host: about half the kept ones where allowed (layers 0..L-2)
    draws = (rng if offload_rng is None else offload_rng).integers(0, 2, L)
    offload = [k and l <= L - 2 and bool(x) for l, (k, x) in enumerate(zip(keep, draws))]
    return Plan.create(costs_for(model, M, stream_dtype, batch), HARDWARE, name="random", boundary_tiers=tiers,
                       keep_residuals=keep, offload_residuals=offload, resident_tail=tail,
                       weight_prefetch_depth=dw, act_prefetch_depth=da, optimizer_mode=mode)


def leaf_errs(ref_tree, got_tree):
    """Per leaf, max|ref - got| / max|ref| (a tree of floats)."""
    import jax
    return jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))
                                           / max(float(np.max(np.abs(np.asarray(a, np.float64)))), 1e-30)),
                        ref_tree, got_tree)


def rel_err(ref_tree, got_tree) -> float:
    """Worst leaf of max|ref - got| / max|ref|."""
    import jax
    return max(jax.tree.leaves(leaf_errs(ref_tree, got_tree)))


def assert_streamed_equals_resident(eng, plan, batch, ref_loss, ref_grads, tol=1e-5, grad_tols=None) -> float:
    """Streamed loss and every gradient within ``tol`` of the resident ones (each leaf within its
    own tolerance where ``grad_tols``, a tree like the gradients, gives one), and the engine's ledger
    and live-array peaks (audit_memory) within the plan's predicted peak; returns the budget."""
    import jax
    loss, grads = eng.loss_and_grad(batch)
    assert abs(loss - ref_loss) <= tol * abs(ref_loss), (loss, ref_loss)
    if grad_tols is None:
        err = rel_err(ref_grads, grads)
        assert err <= tol, f"gradient rel err {err:.2e} under {plan.boundary_tiers}"
    else:
        errs = jax.tree_util.tree_flatten_with_path(leaf_errs(ref_grads, grads))[0]
        for (path, err), leaf_tol in zip(errs, jax.tree.leaves(grad_tols)):
            assert err <= leaf_tol, (f"gradient {jax.tree_util.keystr(path)}: rel err {err:.2e} > {leaf_tol:.2e} "
                                     f"under {plan.boundary_tiers}")
    budget = plan.predicted_peak_device_bytes - plan.hardware.device_margin
    assert 0 < eng.ledger.peak <= budget
    assert 0 < eng.live_peak <= budget
    return budget
