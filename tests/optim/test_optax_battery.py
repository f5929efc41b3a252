"""optax citizenship, after optax/contrib/_common_test.py: every format through the same checks."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lazytrain_jax import optim

FORMATS = ["dynamic8", "fp8", "fp32"]


def _params(dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return {"w": jnp.asarray(rng.standard_normal((64, 96)), dtype),
            "b": jnp.asarray(rng.standard_normal(96), dtype)}


def _grads(params, seed):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape), x.dtype), params)


@pytest.mark.parametrize("fmt", ["dynamic8"] + [pytest.param(f, marks=pytest.mark.slow) for f in FORMATS[1:]])
def test_inject_hyperparams_identical(fmt):
    params = _params()
    kw = dict(b1=0.9, b2=0.95, eps=1e-6, weight_decay=0.1, max_grad_norm=1.0, state_format=fmt)
    tx = optim.adamw_8bit(3e-3, **kw)
    itx = optax.inject_hyperparams(optim.adamw_8bit, static_args=optim.STATIC_ARGS,
                                   hyperparam_dtype=jnp.float32)(learning_rate=3e-3, **kw)
    s, si = tx.init(params), itx.init(params)
    p, pi = params, params
    for step in range(3):
        g = _grads(params, step)
        u, s = jax.jit(tx.update)(g, s, p)
        ui, si = jax.jit(itx.update)(g, si, pi)
        p, pi = optax.apply_updates(p, u), optax.apply_updates(pi, ui)
    for a, b in zip(jax.tree.leaves((p, s)), jax.tree.leaves((pi, si.inner_state)), strict=True):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    # the injected learning rate is live: setting it to 0 freezes the params
    si.hyperparams["learning_rate"] = jnp.zeros([], jnp.float32)
    u0, _ = itx.update(_grads(params, 9), si, pi)
    assert all(float(jnp.max(jnp.abs(x))) == 0.0 for x in jax.tree.leaves(u0))


@pytest.mark.parametrize("fmt", FORMATS)
def test_multisteps_first_updates_zero(fmt):
    k = 3
    params = _params()
    tx = optax.MultiSteps(optim.adamw_8bit(1e-2, state_format=fmt, min_8bit_size=1024), k)
    single = optim.adamw_8bit(1e-2, state_format=fmt, min_8bit_size=1024)
    s = tx.init(params)
    upd = jax.jit(tx.update)
    grads = [_grads(params, i) for i in range(k)]
    for i, g in enumerate(grads):
        u, s = upd(g, s, params)
        norm = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(u))
        assert (norm == 0.0) == (i < k - 1)
    mean_g = jax.tree.map(lambda *g: sum(g) / k, *grads)
    u1, _ = single.update(mean_g, single.init(params), params)
    for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(u1)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_recompilation_on_second_call(fmt):
    params = _params(seed=1)
    tx = optim.adamw_8bit(optax.linear_schedule(1e-3, 0.0, 10), max_grad_norm=1.0,
                          state_format=fmt, min_8bit_size=1024)
    num_traces = []

    @jax.jit
    def step(p, s, g):
        num_traces.append(1)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    s = tx.init(params)
    p = params
    for i in range(3):
        p, s = step(p, s, _grads(params, i))
    assert len(num_traces) == 1
    assert step._cache_size() == 1


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_abstract_init_matches_update_and_dtypes_kept(fmt, dtype):
    params = _params(dtype)
    tx = optim.adamw_8bit(1e-3, state_format=fmt, min_8bit_size=1024)
    abstract = jax.eval_shape(tx.init, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params))
    updates, state = jax.jit(tx.update)(_grads(params, 0), tx.init(params), params)
    a_leaves, a_def = jax.tree.flatten(abstract)
    s_leaves, s_def = jax.tree.flatten(state)
    assert a_def == s_def
    for a, s in zip(a_leaves, s_leaves):
        assert (a.shape, a.dtype) == (s.shape, s.dtype)
    assert state.mu["w"].dtype == {"dynamic8": jnp.int8, "fp8": jnp.float8_e4m3fn,
                                   "fp32": jnp.float32}[fmt]
    assert state.mu["b"].dtype == jnp.float32  # small tensor keeps fp32 state
    for u, p in zip(jax.tree.leaves(updates), jax.tree.leaves(params)):
        assert u.dtype == p.dtype


def test_schedule_matches_optax_with_fp32_state():
    sched = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 3, 10)
    params = _params(seed=2)
    tx = optim.adamw_8bit(sched, weight_decay=1e-4, state_format="fp32")
    ref = optax.adamw(sched, weight_decay=1e-4)
    s, rs = tx.init(params), ref.init(params)
    p, rp = params, params
    for i in range(6):
        g = _grads(params, i)
        u, s = tx.update(g, s, p)
        ru, rs = ref.update(g, rs, rp)
        p, rp = optax.apply_updates(p, u), optax.apply_updates(rp, ru)
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(rp)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)


def test_map_params_reaches_param_shaped_codes():
    params = _params()
    tx = optim.adamw_8bit(1e-3, min_8bit_size=1024)
    state = tx.init(params)
    shapes = optax.tree.map_params(tx, lambda x: x.shape, state,
                                   transform_non_params=lambda x: "other")
    assert shapes.mu["w"] == (64, 96) and shapes.nu["w"] == (64, 96)
    assert shapes.mu_scales["w"] == (24, 1)  # same rank as the param: leading-axis shardings fit
    assert shapes.count == "other" and shapes.num_skipped == "other"
    # a per-param placement mapped over the state (single-device sharding stands in for a mesh)
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    placed = optax.tree.map_params(tx, lambda x: jax.device_put(x, dev), state)
    assert placed.mu["w"].dtype == jnp.int8
