"""Fused global norm, layer-by-layer host updates, non-finite step skipping."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lazytrain_jax as lt
from lazytrain_jax import optim

from . import agree

HP = dict(b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.05)
LR = 1e-3
CLIP = 0.5


def _model(seed=0, num_layers=3):
    rng = np.random.default_rng(seed)
    f = lambda *s: jnp.asarray(rng.standard_normal(s).astype(np.float32) * 0.1)  # noqa: E731
    return {
        "embed": f(256, 32),
        "layers": [{"attn": {"kernel": f(32, 160)}, "mlp": {"kernel": f(160, 32), "bias": f(32)},
                    "norm": f(32)} for _ in range(num_layers)],
        "head": {"kernel": f(32, 300)},
    }


def _grads(params, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(np.float32) * scale), params)


def _assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32))


@pytest.mark.parametrize("fmt", ["dynamic8", pytest.param("fp8", marks=pytest.mark.slow)])
def test_precomputed_global_norm_equals_internal(fmt):
    params = _model()
    tx = optim.adamw_8bit(LR, max_grad_norm=CLIP, state_format=fmt, **HP)
    s1 = s2 = tx.init(params)
    upd = jax.jit(tx.update)
    for step in range(3):
        g = _grads(params, step)
        norm = optim.global_norm_fp32(g)  # what the executor sums per layer
        u1, s1 = upd(g, s1, params)
        u2, s2 = upd(g, s2, params, global_norm=norm)
        _assert_trees_equal(u1, u2)
        _assert_trees_equal(s1, s2)
        params = optax.apply_updates(params, u1)
    assert float(norm) > CLIP  # clipping was active


def _real_model():
    """qwen3-debug's params (Hugging Face names): embed, 4 layers, head."""
    return lt.init_model("qwen3-debug").params


def _forward_units(params):
    return [("embed",)] + [("layers", i) for i in range(len(params["layers"]))] + [("head",)]


def _sub(tree, keys):
    for k in keys:
        tree = tree[k]
    return tree


@pytest.mark.xla_optimized
@pytest.mark.parametrize("fmt,impl", [("dynamic8", "xla"), pytest.param("dynamic8", "native", marks=pytest.mark.slow),
                                      pytest.param("fp8", "auto", marks=pytest.mark.slow),
                                      pytest.param("fp32", "auto", marks=pytest.mark.slow)])
def test_layer_by_layer_equals_whole_tree(fmt, impl):
    """Bit for bit, both sides on one implementation (the native kernel runs dynamic8 state only),
    except the native one: there the per-unit step's update is the kernel's own arithmetic and the
    transform's is XLA's (fused into ``apply_updates``), so the two agree to fp32 rounding."""
    from lazytrain_jax.optim import native
    if impl == "native" and not native.available():
        pytest.skip(f"native kernel unavailable: {native.unavailable_reason()}")
    params = _real_model()
    tx = optim.adamw_8bit(LR, max_grad_norm=CLIP, state_format=fmt, min_8bit_size=1024, impl=impl, **HP)
    state = tx.init(params)
    up_proj = state.mu["layers"][0]["mlp"]["up_proj"]["weight"]
    assert (up_proj.dtype == jnp.float32) == (fmt == "fp32")
    whole_p, whole_s = params, state
    master = jax.tree.map(jnp.copy, params)

    @jax.jit
    def whole_step(g, s, p, norm):  # update and apply in one jit, as a train step would
        u, s = tx.update(g, s, p, global_norm=norm)
        return optax.apply_updates(p, u), s

    hp = optim.AdamHyperparams(HP["b1"], HP["b2"], HP["eps"], LR, HP["weight_decay"])
    for step in range(4):
        g = _grads(params, 10 + step, scale=1.0 if step % 2 else 1e-3)  # clipped and not clipped
        # the executor: norm from per-layer sums of squares, then one unit at a time
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(g)))
        whole_p, whole_s = whole_step(g, whole_s, whole_p, norm)  # same norm, same rounding
        info, count, skipped = optim.begin_step(state.count, state.num_skipped, norm, CLIP)
        for keys in _forward_units(params):  # forward order: embed, layers 0..3, head
            moments = optim.layer_moments(state, *keys)
            sub_master, sub_g = _sub(master, keys), _sub(g, keys)
            if keys[0] == "head":  # the pure-function path (jitted here, no donation)
                new_master, moments = _apply_jit(sub_g, moments, sub_master, info, hp, impl)
            else:
                new_master, copy, moments = optim.fused_layer_step(
                    jax.tree.map(jnp.copy, sub_master), sub_g, moments, info, hp, impl=impl)
                _assert_trees_equal(copy, jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                                                       new_master))
            state = optim.set_layer_moments(state, keys, moments)
            master = _replace(master, keys, new_master)
        state = state._replace(count=count, num_skipped=skipped)
        if impl == "native":
            agree.assert_params_agree(master, whole_p, max_abs=0.05 * LR)
            agree.assert_state_agrees(state, whole_s)
        else:
            _assert_trees_equal(master, whole_p)
            _assert_trees_equal(state, whole_s)
    assert int(state.count) == 4


@functools.partial(jax.jit, static_argnames="impl")
def _apply_jit(g, moments, params, info, hp, impl="auto"):
    updates, moments = optim.apply_layer_update(g, moments, params, info, hp, impl=impl)
    return optax.apply_updates(params, updates), moments


def _replace(tree, keys, value):
    if not keys:
        return value
    out = dict(tree) if isinstance(tree, dict) else list(tree)
    out[keys[0]] = _replace(tree[keys[0]], keys[1:], value)
    return out


def test_fused_layer_step_compiles_once_and_donates():
    params = _real_model()
    layer = params["layers"][1]
    # block_size 64: a static argument no other test compiles with, so the count below is ours
    state = optim.adamw_8bit(LR, block_size=64, min_8bit_size=1024).init(params)
    moments = optim.layer_moments(state, "layers", 1)
    assert moments.mu["self_attn"]["q_proj"]["weight"].dtype == jnp.int8
    assert moments.mu["input_layernorm"]["weight"].dtype == jnp.float32  # both kinds donated
    info, _, _ = optim.begin_step(0, 0, jnp.float32(1.0), 1.0)
    before = optim.fused_layer_step._cache_size()
    master = jax.tree.map(jnp.copy, layer)
    for step, lr in enumerate([1e-3, 5e-4, 2e-4]):  # a schedule: traced, no recompilation
        hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, lr, 0.01)
        old_master, old_moments = master, moments
        master, copy, moments = optim.fused_layer_step(master, _grads(layer, step), moments,
                                                       info, hp, block_size=64)
        # every buffer of the master and of all four moment trees was donated
        assert all(x.is_deleted() for x in jax.tree.leaves((old_master, old_moments)))
        assert not any(x.is_deleted() for x in jax.tree.leaves((master, moments)))
    assert optim.fused_layer_step._cache_size() - before == 1
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(copy))


@pytest.mark.parametrize("bad, fmt", [(np.nan, "dynamic8"), pytest.param(np.inf, "fp32", marks=pytest.mark.slow),
                                     pytest.param(np.inf, "fp8", marks=pytest.mark.slow)])
def test_nonfinite_norm_skips_step_and_counts(bad, fmt):
    params = _model(3)
    tx = optim.adamw_8bit(LR, max_grad_norm=CLIP, state_format=fmt, **HP)
    upd = jax.jit(tx.update)
    _, state = upd(_grads(params, 0), tx.init(params), params)
    g = _grads(params, 1)
    g["layers"][1]["mlp"]["kernel"] = g["layers"][1]["mlp"]["kernel"].at[3, 4].set(bad)
    u, new_state = upd(g, state, params)
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u))
    _assert_trees_equal(new_state._replace(num_skipped=state.num_skipped), state)
    assert int(new_state.num_skipped) == 1 and int(new_state.count) == 1
    # precomputed non-finite norm: the same
    u2, s2 = upd(_grads(params, 2), state, params, global_norm=jnp.float32(bad))
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u2))
    assert int(s2.num_skipped) == 1
    # the next finite step proceeds as step 2
    u3, s3 = upd(_grads(params, 3), new_state, params)
    assert int(s3.count) == 2 and int(s3.num_skipped) == 1
    assert float(jnp.max(jnp.abs(u3["head"]["kernel"]))) > 0


def test_nonfinite_skip_without_clipping_and_begin_step():
    info, count, skipped = optim.begin_step(jnp.int32(5), jnp.int32(2), jnp.float32(np.nan), None)
    assert not bool(info.apply) and int(count) == 5 and int(skipped) == 3
    info, count, _ = optim.begin_step(5, 2, jnp.float32(4.0), 2.0)
    assert bool(info.apply) and int(count) == 6 and int(info.count) == 6
    assert float(info.clip_factor) == 0.5
    info, _, _ = optim.begin_step(5, 2, jnp.float32(1.0), 2.0)
    assert float(info.clip_factor) == 1.0
    params = {"w": jnp.ones((64, 128))}
    tx = optim.adamw_8bit(LR)  # no clipping: the norm is still checked (skip_nonfinite=True)
    u, s = tx.update({"w": jnp.full((64, 128), np.inf)}, tx.init(params), params)
    assert int(s.num_skipped) == 1 and float(jnp.max(jnp.abs(u["w"]))) == 0.0
