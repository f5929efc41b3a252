"""Hyperparameters that would silently train the wrong way are refused, or the step is skipped.

Concrete values (Python numbers, concrete jnp scalars, a schedule evaluated eagerly, values from
``optax.inject_hyperparams`` outside ``jit``) raise ValueError naming the field; traced values
(inside ``jit``) cannot raise, so the step is skipped and counted in ``num_skipped``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lazytrain_jax import optim

PARAMS = {"layer": {"w": jnp.full((32, 256), 0.5)}, "norm": jnp.ones(32)}


def _grads(scale=1.0):
    rng = np.random.default_rng(0)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(np.float32) * scale), PARAMS)


def _injected(**hps):
    return optax.inject_hyperparams(optim.adamw_8bit, static_args=optim.STATIC_ARGS,
                                    hyperparam_dtype=jnp.float32)(**hps)


@pytest.mark.parametrize("field, bad", [("learning_rate", -1e-3), ("b2", 1.0), ("b2", 1.5),
                                        ("weight_decay", -0.1), ("b1", -0.5), ("eps", -1e-8)])
def test_inject_hyperparams_concrete_bad_value_raises_at_update(field, bad):
    tx = _injected(learning_rate=1e-3)
    state = tx.init(PARAMS)
    state.hyperparams[field] = jnp.asarray(bad, jnp.float32)  # e.g. a user's LR callback
    with pytest.raises(ValueError, match=rf"^{field}=.*{field} must"):
        tx.update(_grads(), state, PARAMS)


@pytest.mark.parametrize("field, bad", [("learning_rate", -1e-3), ("b2", 1.0),
                                        ("weight_decay", -0.1)])
def test_inject_hyperparams_traced_bad_value_skips_the_step(field, bad):
    tx = _injected(learning_rate=1e-3)
    state = tx.init(PARAMS)
    upd = jax.jit(tx.update)
    _, state = upd(_grads(), state, PARAMS)  # one good step, so the moments are not zero
    bad_state = state._replace(hyperparams={**state.hyperparams,
                                            field: jnp.asarray(bad, jnp.float32)})
    updates, new = upd(_grads(), bad_state, PARAMS)
    assert all(float(jnp.max(jnp.abs(u))) == 0.0 for u in jax.tree.leaves(updates))
    inner, old_inner = new.inner_state, state.inner_state
    assert int(inner.num_skipped) == 1 and int(inner.count) == int(old_inner.count) == 1
    for a, b in zip(jax.tree.leaves((inner.mu, inner.nu, inner.mu_scales, inner.nu_scales)),
                    jax.tree.leaves((old_inner.mu, old_inner.nu, old_inner.mu_scales,
                                     old_inner.nu_scales))):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    good, _ = upd(_grads(), state, PARAMS)  # the same step with valid values does update
    assert float(jnp.max(jnp.abs(good["layer"]["w"]))) > 0.0


@pytest.mark.parametrize("field, bad", [("learning_rate", jnp.float32(-1e-3)),
                                        ("b2", jnp.float32(1.0)),
                                        ("weight_decay", jnp.asarray(-0.1)),
                                        ("b1", np.float32(1.0))])
def test_jnp_scalar_bad_value_raises_when_built(field, bad):
    kwargs = {"learning_rate": 1e-3, field: bad}
    with pytest.raises(ValueError, match=rf"^{field}=.*{field} must"):
        optim.adamw_8bit(**kwargs)


def test_schedule_negative_value_raises_at_update_and_skips_when_traced():
    sched = optax.linear_schedule(1e-3, -1e-3, 4)  # crosses zero after step 2
    tx = optim.adamw_8bit(sched)
    state = tx.init(PARAMS)
    for _ in range(3):  # count 0, 1, 2: lr 1e-3, 5e-4, 0 -- fine
        _, state = tx.update(_grads(), state, PARAMS)
    with pytest.raises(ValueError, match=r"^learning_rate=.*learning_rate must be >= 0"):
        tx.update(_grads(), state, PARAMS)  # count 3: lr -5e-4
    updates, new = jax.jit(tx.update)(_grads(), state, PARAMS)
    assert int(new.num_skipped) == 1 and int(new.count) == 3
    assert float(jnp.max(jnp.abs(updates["layer"]["w"]))) == 0.0
    cfg = optim.hyperparams_of(tx)
    with pytest.raises(ValueError, match="learning_rate"):
        cfg.adam_hyperparams(state.count)  # the per-unit path checks the same value


def test_negative_global_norm_raises_when_concrete_and_skips_when_traced():
    tx = optim.adamw_8bit(1e-3, max_grad_norm=1.0)
    state = tx.init(PARAMS)
    with pytest.raises(ValueError, match=r"^global_norm=.*global_norm must be >= 0"):
        tx.update(_grads(), state, PARAMS, global_norm=jnp.float32(-2.0))
    with pytest.raises(ValueError, match="global_norm"):
        optim.begin_step(0, 0, -1.0, 1.0)
    upd = jax.jit(lambda g, s, p, n: tx.update(g, s, p, global_norm=n))
    updates, new = upd(_grads(), state, PARAMS, jnp.float32(-2.0))
    assert int(new.num_skipped) == 1 and int(new.count) == 0
    assert float(jnp.max(jnp.abs(updates["layer"]["w"]))) == 0.0
    _, ok = upd(_grads(), state, PARAMS, jnp.float32(2.0))  # same compiled step, valid norm
    assert int(ok.num_skipped) == 0 and int(ok.count) == 1


def test_mismatched_grads_and_state_trees_name_the_tree_and_key():
    tx = optim.adamw_8bit(1e-3)
    state = tx.init(PARAMS)
    g = _grads()
    extra = {**g, "bias": jnp.zeros(32)}
    with pytest.raises(ValueError, match=r"params does not match grads: .*\['bias'\]"):
        tx.update(extra, state, PARAMS)
    with pytest.raises(ValueError, match=r"mu does not match grads: mu lacks key \['bias'\]"):
        tx.update(extra, state, {**PARAMS, "bias": jnp.zeros(32)})
    with pytest.raises(ValueError, match=r"mu has key \['layer'\]\['w'\]"):
        tx.update({"layer": {"v": g["layer"]["w"]}, "norm": g["norm"]}, state,
                  {"layer": {"v": PARAMS["layer"]["w"]}, "norm": PARAMS["norm"]})
    wrong = {"layer": {"w": jnp.ones((256, 32))}, "norm": g["norm"]}
    with pytest.raises(ValueError, match=r"params\['layer'\]\['w'\] has shape \(32, 256\)"):
        tx.update(wrong, state, PARAMS)
    moments = optim.layer_moments(state, "layer")
    info, _, _ = optim.begin_step(0, 0, None, None)
    hp = optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.0)
    with pytest.raises(ValueError, match=r"grads does not match master: grads lacks key \['w'\]"):
        optim.fused_layer_step(jax.tree.map(jnp.copy, PARAMS["layer"]), {"x": g["layer"]["w"]},
                               moments, info, hp)
    with pytest.raises(ValueError, match=r"decay_mask does not match master.*\['u'\]"):
        optim.fused_layer_step(jax.tree.map(jnp.copy, PARAMS["layer"]), g["layer"], moments,
                               info, hp, decay_mask={"u": True})


def test_default_state_has_no_float8_anywhere_in_the_step():
    """The default (dynamic8) step lowers to int8/uint8 codes only: no float8 conversion that a
    backend without native float8 (CPU, older GPUs) would emulate slowly."""
    tx = optim.adamw_8bit(1e-3, max_grad_norm=1.0)
    state = tx.init(PARAMS)

    def step(g, s, p):
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    hlo = jax.jit(step).lower(_grads(), state, PARAMS).as_text()
    assert "f8E4M3" not in hlo and "f8e4m3" not in hlo.lower()
    assert "i8" in hlo or "si8" in hlo  # the codes are there
    fp8 = optim.adamw_8bit(1e-3, state_format="fp8")  # the check can fail: fp8 state has them
    fp8_hlo = jax.jit(fp8.update).lower(_grads(), fp8.init(PARAMS), PARAMS).as_text()
    assert "f8e4m3" in fp8_hlo.lower()
