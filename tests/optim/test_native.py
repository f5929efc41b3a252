"""The native CPU kernel of the fused host update against the XLA path (``impl="xla"``)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lazytrain_jax as lt
from lazytrain_jax import optim
from lazytrain_jax.optim import native

from . import agree

pytestmark = pytest.mark.skipif(not native.available(),
                                reason=f"native kernel not built: {native.unavailable_reason()}")

LR = 1e-3
HP = optim.AdamHyperparams(0.9, 0.99, 1e-8, LR, 0.05)


def _grads(tree, seed, scale):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(np.float32) * scale), tree)


def _run(impl, layer, moments, steps, hp=HP):
    master = jax.tree.map(jnp.copy, layer)
    moments = jax.tree.map(jnp.copy, moments)
    count = 0
    for step, (g, norm) in enumerate(steps):
        info, new_count, _ = optim.begin_step(count, 0, norm, 0.5)
        master, copy, moments = optim.fused_layer_step(master, g, moments, info, hp, impl=impl)
        count = int(new_count)
    return master, copy, moments


def test_native_matches_xla_on_a_real_layer_to_rounding():
    params = lt.init_model("qwen3-debug").params
    layer = params["layers"][2]
    state = optim.adamw_8bit(LR, min_8bit_size=1024).init(params)
    moments = optim.layer_moments(state, "layers", 2)
    steps = []
    for i in range(5):
        g = _grads(layer, i, 1.0 if i % 2 == 0 else 1e-3)  # clipped, unclipped
        steps.append((g, optim.global_norm_fp32(g)))
    steps.append((steps[0][0], jnp.float32(np.nan)))  # a skipped step
    xm, xc, xmom = _run("xla", layer, moments, steps)
    nm, nc, nmom = _run("native", layer, moments, steps)
    num_8bit = sum(mu.dtype != jnp.float32 for mu in jax.tree.leaves(xmom.mu))
    num_fp32 = sum(mu.dtype == jnp.float32 for mu in jax.tree.leaves(xmom.mu))
    assert (num_8bit, num_fp32) == (7, 4)  # q, k, v, o, gate, up, down; the four norms (fp32 state)
    # every tensor on the kernel's side changed from the start, fp32-state ones included
    for x, n, p0 in zip(jax.tree.leaves(xm), jax.tree.leaves(nm), jax.tree.leaves(layer)):
        assert not np.array_equal(np.asarray(n), np.asarray(p0))
    # fp32 rounding (divisions, FMA contraction) and rare codes one step apart
    agree.assert_params_agree(nm, xm, max_abs=0.05 * LR)
    agree.assert_state_agrees(nmom, xmom)
    # the streaming copy is the new master rounded to bf16, in both
    for m, c in zip(jax.tree.leaves(nm), jax.tree.leaves(nc)):
        np.testing.assert_array_equal(np.asarray(c), np.asarray(m.astype(jnp.bfloat16)))


def test_fp32_moments_natively_match_xla_to_rounding():
    """Tensors whose Adam state ``fp32_state_filter`` keeps in fp32 (an embedding, by default) take
    the one-pass fp32 loop: with and without weight decay, any size, clipped, unclipped and
    skipped steps, the same master and moments as the XLA path to fp32 rounding."""
    layer = {"embed": jnp.asarray(np.random.default_rng(0).standard_normal((1000, 37)).astype(np.float32) * 0.02),
             "norm": jnp.ones((37,), jnp.float32)}
    moments = optim.layer_moments(optim.adamw_8bit(LR, fp32_state_filter=lambda path, leaf: True).init(layer))
    assert all(mu.dtype == jnp.float32 for mu in jax.tree.leaves(moments.mu))
    steps = []
    for i in range(5):
        g = _grads(layer, 10 + i, 1.0 if i % 2 == 0 else 1e-3)
        steps.append((g, optim.global_norm_fp32(g)))
    steps.insert(3, (steps[0][0], jnp.float32(np.nan)))  # a skipped step in the middle
    for decay in (True, False):
        hp = HP if decay else optim.AdamHyperparams(0.9, 0.99, 1e-8, LR, 0.0)
        xm, _, xmom = _run("xla", layer, moments, steps, hp)
        nm, nc, nmom = _run("native", layer, moments, steps, hp)
        agree.assert_params_agree(nm, xm, max_abs=1e-3 * LR)
        agree.assert_state_agrees(nmom, xmom)
        for m, c in zip(jax.tree.leaves(nm), jax.tree.leaves(nc)):
            np.testing.assert_array_equal(np.asarray(c), np.asarray(m.astype(jnp.bfloat16)))
        assert not np.array_equal(np.asarray(nm["embed"]), np.asarray(layer["embed"]))


@pytest.mark.parametrize("fp32_state", [False, True])
def test_fp32_copy_natively_matches_xla(fp32_state):
    """An fp32 streaming copy (``stream_dtype="float32"``) takes the kernel too, 8-bit and fp32
    moments alike: the copy is the new master exactly, the master and moments agree with the XLA
    path to fp32 rounding, and the previous copy's buffers hold the new one."""
    from lazytrain_jax.optim import layerwise
    layer = {"w": jnp.asarray(np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32) * 0.02)}
    keep = (lambda path, leaf: True) if fp32_state else "none"
    moments = optim.layer_moments(optim.adamw_8bit(LR, min_8bit_size=0, fp32_state_filter=keep).init(layer))
    assert (moments.mu["w"].dtype == jnp.float32) == fp32_state
    steps = [(_grads(layer, 20 + i, 1.0 if i % 2 == 0 else 1e-3), None) for i in range(3)]
    steps = [(g, optim.global_norm_fp32(g)) for g, _ in steps] + [(steps[0][0], jnp.float32(np.inf))]
    out = {}
    for impl in ("xla", "native"):
        master, mom = jax.tree.map(jnp.copy, layer), jax.tree.map(jnp.copy, moments)
        copy, count = jax.tree.map(jnp.zeros_like, layer), 0
        for g, norm in steps:
            info, count, _ = optim.begin_step(count, 0, norm, 0.5)
            where = copy["w"].unsafe_buffer_pointer()
            master, copy, mom = optim.fused_layer_step(master, g, mom, info, HP, impl=impl, copy=copy,
                                                       copy_dtype=jnp.float32)
            if impl == "native":
                assert copy["w"].unsafe_buffer_pointer() == where
            np.testing.assert_array_equal(np.asarray(copy["w"]), np.asarray(master["w"]))
        out[impl] = (master, mom)
    agree.assert_params_agree(out["native"][0], out["xla"][0], max_abs=0.05 * LR)
    agree.assert_state_agrees(out["native"][1], out["xla"][1])
    traced = layerwise._fused_layer_step.trace(layer, layer, moments, info, HP, copy, block_size=256,
                                               copy_dtype=jnp.float32, decay=(True,), impl="native")
    target = native.F32_INTO_TARGET if fp32_state else native.INTO_TARGET
    lowered = traced.lower(lowering_platforms=("cpu",))
    assert f"@{target}(" in lowered.as_text()
    # every donated buffer keeps its role: no whole-tensor copy in the compiled step (with the
    # copy, m and v all f32 of one shape, jit once permuted them and moved each by a copy)
    assert not [line for line in lowered.compile().as_text().splitlines()
                if " copy(" in line and "[64,256]" in line]


@pytest.mark.parametrize("fp32_state", [False, True])
def test_bf16_gradients_are_read_natively_as_they_are(fp32_state):
    """The host step reads bf16 gradients in place (no fp32 copy of the gradient first): the same
    master, copy and moments, bit for bit, as the same gradients given in fp32, over clipped,
    unclipped and skipped steps; the program calls the kernel on the bf16 gradient directly."""
    from lazytrain_jax.optim import layerwise
    layer = {"w": jnp.asarray(np.random.default_rng(5).standard_normal((64, 256)).astype(np.float32) * 0.02)}
    keep = (lambda path, leaf: True) if fp32_state else "none"
    moments = optim.layer_moments(optim.adamw_8bit(LR, min_8bit_size=0, fp32_state_filter=keep).init(layer))
    grads = [jax.tree.map(lambda x: x.astype(jnp.bfloat16), _grads(layer, 30 + i, 1.0 if i % 2 == 0 else 1e-3))
             for i in range(3)]
    norms = [optim.global_norm_fp32(g) for g in grads] + [jnp.float32(np.nan)]
    grads.append(grads[0])
    out = {}
    for dtype in (jnp.bfloat16, jnp.float32):
        master, mom, count = jax.tree.map(jnp.copy, layer), jax.tree.map(jnp.copy, moments), 0
        for g, norm in zip(grads, norms):
            info, count, _ = optim.begin_step(count, 0, norm, 0.5)
            g = jax.tree.map(lambda x: x.astype(dtype), g)
            master, copy, mom = optim.fused_layer_step(master, g, mom, info, HP, impl="native")
        out[jnp.dtype(dtype).name] = (master, copy, mom)
    for a, b in zip(jax.tree.leaves(out["bfloat16"]), jax.tree.leaves(out["float32"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert not np.array_equal(np.asarray(out["bfloat16"][0]["w"]), np.asarray(layer["w"]))
    g16 = grads[0]
    assert native.supports(layer["w"], g16["w"], moments.mu["w"], block_size=256, hp=HP, host_step=True)
    assert not native.supports(layer["w"], g16["w"], moments.mu["w"], block_size=256, hp=HP)  # the transform
    lowered = layerwise._fused_layer_step.trace(layer, g16, moments, info, HP, block_size=256,
                                                copy_dtype=jnp.bfloat16, decay=(True,),
                                                impl="native").lower(lowering_platforms=("cpu",))
    target = native.F32_TARGET if fp32_state else native.TARGET
    assert re.search(rf"@{target}\(%\w+, %\w+\b", lowered.as_text())
    assert "bf16" in [line for line in lowered.as_text().splitlines() if f"@{target}(" in line][0]
    assert not [line for line in lowered.compile().as_text().splitlines()
                if " convert(" in line and "bf16[64,256]" in line]


def test_native_skipped_step_leaves_state_and_donates():
    params = lt.init_model("qwen3-debug").params
    layer = params["layers"][0]
    state = optim.adamw_8bit(LR, min_8bit_size=1024).init(params)
    moments = optim.layer_moments(state, "layers", 0)
    g = _grads(layer, 7, 1.0)
    info, _, _ = optim.begin_step(0, 0, optim.global_norm_fp32(g), 0.5)
    master, _, moments = optim.fused_layer_step(jax.tree.map(jnp.copy, layer), g, moments, info,
                                                HP, impl="native")
    before = jax.tree.map(lambda x: np.array(x, copy=True), (master, moments))
    skip, _, skipped = optim.begin_step(1, 0, jnp.float32(np.inf), 0.5)
    assert int(skipped) == 1
    old = (master, moments)
    master, copy, moments = optim.fused_layer_step(master, g, moments, skip, HP, impl="native")
    assert all(x.is_deleted() for x in jax.tree.leaves(old))  # master and moments donated
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves((master, moments))):
        np.testing.assert_array_equal(a, np.asarray(b))
    for m, c in zip(jax.tree.leaves(master), jax.tree.leaves(copy)):
        np.testing.assert_array_equal(np.asarray(c), np.asarray(m.astype(jnp.bfloat16)))


@pytest.mark.parametrize("impl", ["native", "xla"])
def test_previous_copy_is_donated_and_holds_the_new_one(impl):
    """``fused_layer_step(copy=previous)``: the same master, copy and moments as without it, bit for
    bit, over steps (clipped, unclipped, skipped); the previous copy is donated, and on the native
    path its buffers hold the new copy (no freshly mapped memory per step)."""
    params = lt.init_model("qwen3-debug").params
    layer = params["layers"][1]
    state = optim.adamw_8bit(LR, min_8bit_size=1024).init(params)
    moments = optim.layer_moments(state, "layers", 1)
    steps = [(_grads(layer, i, 1.0 if i % 2 == 0 else 1e-3), None) for i in range(3)]
    steps = [(g, optim.global_norm_fp32(g)) for g, _ in steps] + [(steps[0][0], jnp.float32(np.inf))]
    ref = _run(impl, layer, moments, steps)
    master, mom = jax.tree.map(jnp.copy, layer), jax.tree.map(jnp.copy, moments)
    copy = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.bfloat16), layer)
    count = 0
    for g, norm in steps:
        info, new_count, _ = optim.begin_step(count, 0, norm, 0.5)
        old = copy
        where = {k: x.unsafe_buffer_pointer() for k, x in jax.tree_util.tree_leaves_with_path(old)}
        master, copy, mom = optim.fused_layer_step(master, g, mom, info, HP, impl=impl, copy=old)
        count = int(new_count)
        assert all(x.is_deleted() for x in jax.tree.leaves(old))
        if impl == "native":
            for k, x in jax.tree_util.tree_leaves_with_path(copy):
                # 8-bit and fp32-state tensors alike: the kernel's call wrote in place
                assert x.unsafe_buffer_pointer() == where[k], k
    for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves((master, copy, mom))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_previous_copy_is_checked():
    params = {"w": jnp.ones((16, 256))}
    state = optim.adamw_8bit(LR, min_8bit_size=0).init(params)
    info, _, _ = optim.begin_step(0, 0, None, None)
    with pytest.raises(ValueError, match="copy has dtype float32.*copy_dtype=bfloat16"):
        optim.fused_layer_step(params, params, optim.layer_moments(state), info, HP,
                               copy={"w": jnp.ones((16, 256))})
    with pytest.raises(ValueError, match="copy does not match master.*lacks key"):
        optim.fused_layer_step(params, params, optim.layer_moments(state), info, HP,
                               copy={"v": jnp.ones((16, 256), jnp.bfloat16)})


def test_impl_is_validated(monkeypatch):
    params = {"w": jnp.ones((16, 256))}
    state = optim.adamw_8bit(LR, min_8bit_size=0).init(params)
    info, _, _ = optim.begin_step(0, 0, None, None)
    with pytest.raises(ValueError, match="impl='cuda' is invalid"):
        optim.fused_layer_step(params, params, optim.layer_moments(state), info, HP, impl="cuda")
    monkeypatch.setitem(native._state, "ok", False)
    monkeypatch.setitem(native._state, "reason", "RuntimeError: no C++ compiler")
    with pytest.raises(ValueError, match="impl='native' is unavailable.*no C\\+\\+ compiler"):
        optim.fused_layer_step(params, params, optim.layer_moments(state), info, HP,
                               impl="native")
    # "auto" falls back to the XLA path
    out = optim.fused_layer_step(jax.tree.map(jnp.copy, params), params, optim.layer_moments(state),
                                 info, HP, impl="auto")
    assert out[0]["w"].shape == (16, 256)


def _transform_steps(impl, params, num_steps=3):
    tx = optim.adamw_8bit(LR, max_grad_norm=0.5, weight_decay=0.05, min_8bit_size=1024, impl=impl)

    @jax.jit
    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    p, s = params, tx.init(params)
    for i in range(num_steps):
        p, s = step(p, s, _grads(params, 20 + i, 1.0 if i % 2 == 0 else 1e-3))
    return p, s, step


@pytest.mark.slow
def test_transform_native_matches_xla_and_runs_the_kernel():
    params = lt.init_model("qwen3-debug").params
    xp, xs, _ = _transform_steps("xla", params)
    npar, ns, step = _transform_steps("native", params)
    args = (npar, ns, _grads(params, 0, 1.0))
    hlo = step.lower(*args).as_text()
    # the 7 matrices of each of the 4 layers (embed, head and norms keep fp32 state: XLA)
    assert hlo.count(native.STATE_TARGET) == 4 * 7
    agree.assert_params_agree(npar, xp, max_abs=0.05 * LR)
    agree.assert_state_agrees(ns, xs)
    assert int(ns.count) == int(xs.count) == 3


def test_cores_are_shared_between_a_programs_kernel_calls(monkeypatch):
    """XLA runs a program's independent native calls side by side: each gets a share of the cores
    in proportion to its elements (at least one), and the compiled calls carry those shares."""
    monkeypatch.setattr(native.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert native.thread_shares([1 << 20] * 95) == [1] * 95
    assert native.thread_shares([1 << 26]) == [8]
    assert native.thread_shares([6 << 20, 1 << 20, 1 << 20]) == [6, 1, 1]
    assert native.thread_shares([]) == []
    params = lt.init_model("qwen3-debug").params
    npar, ns, step = _transform_steps("native", params)
    hlo = step.lower(npar, ns, _grads(params, 0, 1.0)).as_text()
    calls = [line for line in hlo.splitlines() if native.STATE_TARGET in line]
    shares = [int(t) for line in calls for t in re.findall(r"threads = (\d+)", line)]
    sizes = [m.size for m in jax.tree.leaves(ns.mu) if m.dtype == jnp.int8]  # the 8-bit tensors
    assert len(shares) == len(calls) == len(sizes) == 4 * 7
    assert sorted(shares) == sorted(native.thread_shares(sizes))
    assert 0 not in shares  # 0 would be "every core", for every call


def test_auto_picks_the_kernel_for_the_host_step_and_the_transform():
    assert native.resolve_impl("auto") == "native"  # (this module runs only where it is built)
    assert native.resolve_impl("xla") == "xla"
    params = {"w": jnp.ones((64, 256), jnp.float32)}
    tx = optim.adamw_8bit(LR, max_grad_norm=1.0, min_8bit_size=0)  # impl="auto"
    hlo = jax.jit(lambda p, s, g: tx.update(g, s, p)).lower(params, tx.init(params), params).as_text()
    assert native.STATE_TARGET in hlo
    tx = optim.adamw_8bit(LR, max_grad_norm=1.0, min_8bit_size=0, impl="xla")
    hlo = jax.jit(lambda p, s, g: tx.update(g, s, p)).lower(params, tx.init(params), params).as_text()
    assert native.STATE_TARGET not in hlo and "custom_call" not in hlo


def test_transform_update_is_xlas_bit_for_bit_and_the_state_is_written_in_place():
    """From one state, the native transform's update equals the XLA transform's exactly (XLA
    computes it in both); the kernel writes the codes in place inside a donated train step: no
    whole-tensor copy of a code buffer and no fp32 temporary of the update in the compiled step."""
    params = lt.init_model("qwen3-debug").params
    kw = dict(max_grad_norm=0.5, weight_decay=0.05, min_8bit_size=1024)
    tx_x = optim.adamw_8bit(LR, impl="xla", **kw)
    tx_n = optim.adamw_8bit(LR, impl="native", **kw)
    state = tx_x.init(params)
    for i in range(2):  # a non-trivial state: two XLA steps
        g = _grads(params, 40 + i, 1.0)
        u, state = jax.jit(tx_x.update)(g, state, params)
        params = optax.apply_updates(params, u)
    g = _grads(params, 50, 1e-3)
    ux, sx = jax.jit(tx_x.update)(g, state, params)
    un, sn = jax.jit(tx_n.update)(g, state, params)
    for x, n in zip(jax.tree.leaves(ux), jax.tree.leaves(un), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(n))
    agree.assert_state_agrees(sn, sx)

    def step(p, s, g):
        u, s = tx_n.update(g, s, p)
        return optax.apply_updates(p, u), s

    hlo = jax.jit(step, donate_argnums=(0, 1)).lower(params, state, g).compile().as_text()
    entry = hlo[hlo.index("ENTRY"):]
    # result type of each instruction: "%name = TYPE op(" (tuples included)
    results = re.findall(r"= (\(.*?\)|\S+) (copy|custom-call)\(", entry)
    calls = [t for t, op in results if op == "custom-call"]
    assert len(calls) == 4 * 7  # one per 8-bit matrix
    for t in calls:  # codes and scales only: no fp32 tensor (an update) comes out of the kernel
        assert re.fullmatch(r"\(s8\[\d+,\d+\]\S*, u8\[\d+,\d+\]\S*, f32\[\d+\]\S*, "
                            r"f32\[\d+\]\S*\)", t), t
    code_copies = [t for t, op in results if op == "copy" and re.match(r"[su]8\[\d+,\d+\]", t)]
    assert not code_copies  # the codes are updated in place


def _lowered_for_cpu_and_cuda(traced):
    """The StableHLO text of ``traced`` lowered for the CPU and for CUDA (skips without CUDA rules)."""
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    try:
        gpu = traced.lower(lowering_platforms=("cuda",)).as_text()
    except Exception as e:  # noqa: BLE001 - a jaxlib without CUDA lowering rules
        pytest.skip(f"cannot lower for cuda here: {type(e).__name__}")
    return cpu, gpu


def test_accelerator_lowering_takes_the_xla_path_without_float8():
    params = {"w": jnp.ones((64, 256), jnp.float32)}
    tx = optim.adamw_8bit(LR, max_grad_norm=1.0, min_8bit_size=0, impl="native")

    def step(p, s, g):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    traced = jax.jit(step).trace(params, tx.init(params), params)
    cpu, gpu = _lowered_for_cpu_and_cuda(traced)
    assert native.STATE_TARGET in cpu
    assert native.STATE_TARGET not in gpu and "custom_call" not in gpu
    assert "f8E4M3" not in gpu  # dynamic8 codes (int8/uint8), no float8 conversions


@pytest.mark.parametrize("fp32_state", [False, True])
def test_host_step_with_previous_copy_lowers_natively_on_cpu_only(fp32_state):
    """With a previous copy the CPU lowering calls the kernel's in-place-copy target (the 8-bit
    loop's, or the fp32 moments' for a tensor whose state ``fp32_state_filter`` keeps in fp32);
    an accelerator's lowering takes the XLA path (no custom call)."""
    from lazytrain_jax.optim import layerwise
    # fp32 moments take any size (here not whole blocks); dynamic8 ones whole blocks
    params = {"w": jnp.ones((64, 250 if fp32_state else 256), jnp.float32)}
    keep = (lambda path, leaf: True) if fp32_state else "none"
    moments = optim.layer_moments(optim.adamw_8bit(LR, min_8bit_size=0, fp32_state_filter=keep).init(params))
    assert (moments.mu["w"].dtype == jnp.float32) == fp32_state
    info, _, _ = optim.begin_step(0, 0, jnp.float32(1.0), 1.0)
    copy = jax.tree.map(lambda x: jnp.ones(x.shape, jnp.bfloat16), params)
    traced = layerwise._fused_layer_step.trace(params, params, moments, info, HP, copy,
                                               block_size=256, copy_dtype=jnp.bfloat16, decay=(True,),
                                               impl="native")
    cpu, gpu = _lowered_for_cpu_and_cuda(traced)
    target = native.F32_INTO_TARGET if fp32_state else native.INTO_TARGET
    other = native.INTO_TARGET if fp32_state else native.F32_INTO_TARGET
    assert f"@{target}(" in cpu and f"@{other}(" not in cpu
    assert "custom_call" not in gpu


def _random_tensor_state(rng, block_size):
    """One tensor's gradient, params, codes and scales over many magnitudes (zeros included)."""
    n = block_size * 1000
    mag = 10.0 ** rng.uniform(-9, 0, n)
    g = jnp.asarray(np.where(rng.random(n) < 0.05, 0.0, rng.standard_normal(n) * mag).astype(np.float32))
    p = jnp.asarray(rng.standard_normal(n).astype(np.float32) * 0.02)
    mu = jnp.asarray(rng.integers(-127, 128, n).astype(np.int8))
    nu = jnp.asarray(np.where(rng.random(n) < 0.1, 0, rng.integers(0, 256, n)).astype(np.uint8))
    nb = n // block_size
    ms = jnp.asarray(np.where(rng.random(nb) < 0.05, 0.0, rng.random(nb) * 1e-4).astype(np.float32))
    vs = jnp.asarray(np.where(rng.random(nb) < 0.05, 0.0, rng.random(nb) * 1e-7).astype(np.float32))
    return g, p, mu, nu, ms, vs


def _steps_info():
    return [optim.begin_step(step, 0, jnp.float32(0.7 if step % 2 else 3.0), 1.0)[0] for step in range(3)]


def _state_kernel_codes(g, p, state, block_size):
    """3 steps of the transform's state kernel (``native.leaf_update``): [(mu, nu, ms, vs)]."""
    fn = jax.jit(lambda s, g, p, info: native.leaf_update(
        g, p, s[0], s[1], s[2], s[3], info, HP, block_size=block_size, decay=True)[1:])
    out = []
    for info in _steps_info():
        state = fn(state, g, p, info)
        out.append([np.asarray(x) for x in state])
    return out


def _host_steps(g, state, block_size):
    """3 steps of the host step's kernel (``native.leaf_master_step``) from ``state`` = (master,
    mu, nu, ms, vs): [(master, mu, nu, ms, vs, copy)] after each."""
    fn = jax.jit(lambda s, g, info: native.leaf_master_step(
        s[0], g, s[1], s[2], s[3], s[4], info, HP, block_size=block_size, decay=True))
    out = []
    for info in _steps_info():
        new_p, copy, m1, v1, ms1, vs1 = fn(state, g, info)
        state = (new_p, m1, v1, ms1, vs1)
        out.append([np.asarray(x) for x in (*state, copy)])
    return out


def test_state_kernel_codes_equal_the_host_steps():
    """The transform's state-only kernel entry writes the codes and scales of the host step's
    entry bit for bit, step after step (one loop, two entry points)."""
    rng = np.random.default_rng(1)
    for block_size in (64, 100):
        g, p, mu, nu, ms, vs = _random_tensor_state(rng, block_size)
        state_codes = _state_kernel_codes(g, p, (mu, nu, ms, vs), block_size)
        host = _host_steps(g, (p, mu, nu, ms, vs), block_size)  # codes do not depend on p
        for step, (got, ref) in enumerate(zip(state_codes, host, strict=True)):
            for name, a, b in zip(("mu", "nu", "mu_scales", "nu_scales"), got, ref[1:5]):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8),
                                              err_msg=f"{name} step {step} block {block_size}")
        assert len(np.unique(state_codes[-1][0])) + len(np.unique(state_codes[-1][1])) > 300


def test_avx512_code_estimates_equal_the_portable_loop(monkeypatch):
    """With AVX-512 the kernel estimates the codes' roots with 14-bit reciprocal roots; the exact
    midpoint test must still give the codes of the portable loop (full-precision roots) bit for
    bit, and the same master and copy, over gradients and moments of many magnitudes."""
    with open("/proc/cpuinfo") as f:
        if " avx512f" not in f.read():
            pytest.skip("no AVX-512 on this CPU: only the portable loop is built")
    import ctypes
    lib = ctypes.cdll.LoadLibrary(native._build(extra_flags=("-mno-avx512f",)))
    portable = "lazytrain_adam8bit_cpu_portable_test"
    portable_state = "lazytrain_adam8bit_state_cpu_portable_test"
    jax.ffi.register_ffi_target(portable, jax.ffi.pycapsule(lib.LtAdam8bitCpu), platform="cpu")
    jax.ffi.register_ffi_target(portable_state, jax.ffi.pycapsule(lib.LtAdam8bitStateCpu),
                                platform="cpu")
    rng = np.random.default_rng(0)
    for block_size in (64, 100):  # 100: 6 groups of 16 lanes and 4 elements by the portable loop
        g, p, mu, nu, ms, vs = _random_tensor_state(rng, block_size)
        outs = []
        for target in (native.TARGET, portable):
            monkeypatch.setattr(native, "TARGET", target)
            outs.append(_host_steps(g, (p, mu, nu, ms, vs), block_size)[-1])
        codes_used = len(np.unique(outs[0][1])) + len(np.unique(outs[0][2]))
        assert codes_used > 300, codes_used  # the codes span the range, not a few values
        for name, a, b in zip(("master", "mu", "nu", "mu_scales", "nu_scales", "copy"), *outs):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=f"{name} block {block_size}")
        # the state-only entry too
        state_outs = []
        for target in (native.STATE_TARGET, portable_state):
            monkeypatch.setattr(native, "STATE_TARGET", target)
            state_outs.append(_state_kernel_codes(g, p, (mu, nu, ms, vs), block_size))
        for step, (a_step, b_step) in enumerate(zip(*state_outs, strict=True)):
            for name, a, b in zip(("mu", "nu", "mu_scales", "nu_scales"), a_step, b_step):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8),
                                              err_msg=f"state {name} step {step} block {block_size}")
