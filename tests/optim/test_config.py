"""AdamW8bitConfig: one description for the optax transform and the per-unit host update."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lazytrain_jax as lt
from lazytrain_jax import optim

from . import agree


def _no_norm_decay(params):
    """A callable mask: no weight decay on norms (1-D leaves)."""
    return jax.tree.map(lambda x: x.ndim > 1, params)


def _grads(params, seed, scale):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda x: jnp.asarray(rng.standard_normal(x.shape).astype(np.float32) * scale), params)


def _assert_trees_equal(a, b):
    la, lb = jax.tree_util.tree_flatten_with_path(a)[0], jax.tree_util.tree_flatten_with_path(b)[0]
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                      err_msg=jax.tree_util.keystr(path))


def _units(params):
    """The model's streaming units in forward order: embed, layers 0..L-1, head."""
    return [("embed",)] + [("layers", i) for i in range(len(params["layers"]))] + [("head",)]


def _sub(tree, keys):
    for k in keys:
        tree = tree[k]
    return tree


def _with(tree, keys, value):
    if not keys:
        return value
    out = dict(tree) if isinstance(tree, dict) else list(tree)
    out[keys[0]] = _with(tree[keys[0]], keys[1:], value)
    return out


@pytest.mark.xla_optimized
@pytest.mark.parametrize("impl", [pytest.param("xla", marks=pytest.mark.slow), "native"])
def test_per_unit_loop_equals_whole_tree_transform_on_a_real_model(impl):
    """Bit for bit with ``impl="xla"``. With ``"native"`` the per-unit step's update is the kernel's
    own arithmetic while the transform's is XLA's (fused into ``apply_updates``): they agree to
    fp32 rounding, codes at most a step or two apart and rarely (as native vs XLA,
    tests/optim/test_native.py); the configuration (schedule, mask, clip) is still one."""
    from lazytrain_jax.optim import native
    if impl == "native" and not native.available():
        pytest.skip(f"native kernel unavailable: {native.unavailable_reason()}")
    params = lt.init_model("qwen3-debug").params
    cfg = optim.AdamW8bitConfig(
        # a schedule whose values are exact however XLA evaluates them (eager here, jitted in the
        # transform): halvings; a linear schedule's 1/3 steps may round differently in the two
        learning_rate=optax.piecewise_constant_schedule(2e-3, {1: 0.5, 2: 0.5}), b1=0.9, b2=0.99,
        weight_decay=0.05,
        max_grad_norm=0.5, mask=_no_norm_decay, impl=impl)
    tx = cfg.transform()
    assert optim.hyperparams_of(tx) is cfg
    state = tx.init(params)
    fmts = {jax.tree_util.keystr(p): x.dtype for p, x in
            jax.tree_util.tree_flatten_with_path(state.mu)[0]}
    assert fmts["['layers'][0]['mlp']['up_proj']['weight']"] == jnp.int8  # 8-bit and fp32 both
    assert fmts["['head']['norm']['weight']"] == jnp.float32

    @jax.jit
    def whole_step(g, s, p, norm):
        u, s = tx.update(g, s, p, global_norm=norm)
        return optax.apply_updates(p, u), s

    whole_p, whole_s = params, state
    master = jax.tree.map(jnp.copy, params)
    decay_mask = cfg.decay_mask(params)
    assert decay_mask["head"]["norm"]["weight"] is False
    assert decay_mask["layers"][0]["self_attn"]["q_proj"]["weight"] is True
    for step in range(3):
        g = _grads(params, step, scale=1.0 if step != 1 else 1e-3)  # clipped, unclipped, clipped
        norm = optim.global_norm_fp32(g)
        assert (float(norm) > cfg.max_grad_norm) == (step != 1)
        whole_p, whole_s = whole_step(g, whole_s, whole_p, norm)
        # the executor: begin_step once, then one unit at a time in forward order
        info, count, skipped = optim.begin_step(state.count, state.num_skipped, norm,
                                                cfg.max_grad_norm)
        hp = cfg.adam_hyperparams(state.count)
        for keys in _units(params):
            new_master, copy, moments = optim.fused_layer_step(
                _sub(master, keys), _sub(g, keys), optim.layer_moments(state, *keys), info, hp,
                block_size=cfg.block_size, decay_mask=_sub(decay_mask, keys), impl=cfg.impl)
            _assert_trees_equal(copy, jax.tree.map(lambda x: x.astype(jnp.bfloat16), new_master))
            master = _with(master, keys, new_master)
            state = optim.set_layer_moments(state, keys, moments)
        state = state._replace(count=count, num_skipped=skipped)
        if impl == "xla":
            _assert_trees_equal(master, whole_p)
            for name in ("mu", "nu", "mu_scales", "nu_scales"):
                _assert_trees_equal(getattr(state, name), getattr(whole_s, name))
        else:
            agree.assert_params_agree(master, whole_p, max_abs=1e-4)  # lr <= 2e-3
            agree.assert_state_agrees(state, whole_s)
        assert int(state.count) == int(whole_s.count) == step + 1
    # a per-unit loop that ignored the mask would decay the (all-ones) norm weights: not equal
    assert float(jnp.min(params["head"]["norm"]["weight"])) == 1.0


def test_config_is_frozen_keyword_only_and_builds_adamw_8bit():
    cfg = optim.AdamW8bitConfig(learning_rate=1e-3, weight_decay=None, max_grad_norm=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.b1 = 0.5
    with pytest.raises(TypeError):
        optim.AdamW8bitConfig(1e-3)
    tx = optim.adamw_8bit(1e-3, weight_decay=0.0, block_size=128, state_format="fp8")
    got = optim.hyperparams_of(tx)
    assert got == optim.AdamW8bitConfig(learning_rate=1e-3, weight_decay=0.0, block_size=128,
                                         state_format="fp8")
    assert optim.hyperparams_of(optax.adamw(1e-3)) is None
    assert optim.hyperparams_of(optim.scale_by_adam_8bit()) is None
    assert optim.hyperparams_of(optax.inject_hyperparams(optim.adamw_8bit)(1e-3)) is None
    hp = cfg.adam_hyperparams(jnp.int32(7))
    assert hp == optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.0)  # None decay -> 0
    sched = optim.AdamW8bitConfig(learning_rate=optax.linear_schedule(1.0, 0.0, 10))
    assert float(sched.adam_hyperparams(jnp.int32(4)).learning_rate) == pytest.approx(0.6)
    assert cfg.decay_mask({"w": jnp.ones(3)}) is None
    masked = optim.AdamW8bitConfig(learning_rate=1e-3, mask={"w": np.bool_(False), "b": True})
    assert masked.decay_mask(None) == {"w": False, "b": True}


@pytest.mark.parametrize("field, value", [
    ("learning_rate", -1e-3), ("b1", 1.0), ("b2", 1.0), ("b2", -0.1), ("eps", -1.0),
    ("weight_decay", -0.01), ("max_grad_norm", 0.0), ("block_size", 0), ("min_8bit_size", -1),
    ("state_format", "int4"), ("fp32_state_filter", "all"), ("skip_nonfinite", 1),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        optim.AdamW8bitConfig(**{"learning_rate": 1e-3, field: value})


def test_fused_layer_step_rejects_filter_and_mask_together():
    params = {"w": jnp.ones((16, 16))}
    state = optim.adamw_8bit(1e-3).init(params)
    info, _, _ = optim.begin_step(0, 0, None, None)
    with pytest.raises(ValueError, match="decay_filter and decay_mask"):
        optim.fused_layer_step(params, params, optim.layer_moments(state), info,
                               optim.AdamHyperparams(0.9, 0.999, 1e-8, 1e-3, 0.0),
                               decay_filter=lambda p, x: True, decay_mask={"w": True})
