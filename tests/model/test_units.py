"""Per-layer units: one compilation per layer kind, streamed unit-by-unit equals the resident forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.units import default_positions, get_units, loss_chunk_tokens


def stream_forward(model, ids, mask, traces):
    """Runs embed, each layer and the head as separate jitted calls, like the streaming executor."""
    units = model.units

    def counted(params, h, pos, m):
        traces.append(1)  # runs once per trace
        return units.layer("decoder")(params, h, pos, m)

    layer_jit = jax.jit(counted)
    h = jax.jit(units.embed)(model.params["embed"], ids)
    pos = default_positions(ids)
    for layer_params in model.params["layers"]:
        h = layer_jit(layer_params, h, pos, mask)
    logits = jax.jit(units.head_logits)(model.params["head"], model.tied_weight(), h)
    return logits, layer_jit


@pytest.mark.parametrize("num_layers", [pytest.param(2, marks=pytest.mark.slow), 7])
def test_one_compilation_per_kind_whatever_the_depth(num_layers):
    cfg = lt.get_preset("qwen3-debug", num_layers=num_layers)
    model = lt.init_model(cfg, seed=0)
    assert len(model.units.layer_defs) == 1
    ids = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 8)), jnp.int32)
    mask = jnp.ones_like(ids)
    traces = []
    logits, layer_jit = stream_forward(model, ids, mask, traces)
    assert len(traces) == 1
    assert layer_jit._cache_size() == 1
    np.testing.assert_allclose(np.asarray(logits), np.asarray(lt.forward(model, ids, mask)), rtol=1e-5, atol=1e-5)


def test_chunked_loss_equals_unchunked_and_full_logits():
    model = lt.init_model("qwen2-debug", seed=1)  # tied embeddings
    units = model.units
    rng = np.random.default_rng(0)
    h = jnp.asarray(rng.standard_normal((3, 10, model.config.hidden_size)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, model.config.vocab_size, (3, 10)), jnp.int32)
    labels = labels.at[0, :4].set(-100)

    def loss(chunk):
        s, n = units.head_loss(model.params["head"], model.tied_weight(), h, labels, chunk_tokens=chunk)
        return s / n

    full = units.head_logits(model.params["head"], model.tied_weight(), h)
    targets = np.concatenate([np.asarray(labels)[:, 1:], np.full((3, 1), -100)], axis=1)
    lse = jax.nn.logsumexp(full, axis=-1)
    picked = jnp.take_along_axis(full, jnp.maximum(jnp.asarray(targets), 0)[..., None], -1)[..., 0]
    ref = float(jnp.sum(jnp.where(targets != -100, lse - picked, 0)) / np.sum(targets != -100))
    for chunk in (1, 7, 30, None):
        assert abs(float(loss(chunk)) - ref) < 1e-5
    g7 = jax.grad(lambda hh: units.head_loss(model.params["head"], model.tied_weight(), hh, labels, 7)[0])(h)
    g30 = jax.grad(lambda hh: units.head_loss(model.params["head"], model.tied_weight(), hh, labels, 30)[0])(h)
    np.testing.assert_allclose(np.asarray(g7), np.asarray(g30), rtol=1e-5, atol=1e-6)


def test_loss_chunk_size_bounds_logit_memory():
    assert loss_chunk_tokens(151936, 1 << 20) * 4 * 151936 <= 1 << 28
    assert loss_chunk_tokens(256, 10) == 10
    assert loss_chunk_tokens(10 ** 9, 10) == 1


def test_init_model_is_deterministic_and_hf_like():
    a = lt.init_model("llama-debug", seed=5)
    b = lt.init_model("llama-debug", seed=5)
    c = lt.init_model("llama-debug", seed=6)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.params["layers"][0]["mlp"]["up_proj"]["weight"],
                              c.params["layers"][0]["mlp"]["up_proj"]["weight"])
    # layers draw from different streams
    assert not np.array_equal(a.params["layers"][0]["mlp"]["up_proj"]["weight"],
                              a.params["layers"][1]["mlp"]["up_proj"]["weight"])
    w = a.params["layers"][0]["mlp"]["up_proj"]["weight"]
    assert abs(w.std() - a.config.initializer_range) < 0.002
    np.testing.assert_array_equal(a.params["layers"][0]["input_layernorm"]["weight"], 1.0)
    assert a.num_params() == a.config.num_params()


def test_init_model_bf16_and_bad_dtype():
    m = lt.init_model("qwen3-debug", dtype="bfloat16")
    assert {x.dtype.name for x in jax.tree.leaves(m.params)} == {"bfloat16"}
    assert m.config.dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"dtype='int8'.*valid"):
        lt.init_model("qwen3-debug", dtype="int8")
    with pytest.raises(ValueError, match="unknown model preset 'qwen3-debgu'.*Did you mean.*qwen3-debug"):
        lt.init_model("qwen3-debgu")


def test_batch_validation_names_the_key():
    model = lt.init_model("llama-debug")
    ids = np.zeros((2, 4), np.int32)
    with pytest.raises(ValueError, match=r"missing \['labels'\]"):
        lt.loss_and_grad(model, {"input_ids": ids, "attention_mask": ids})
    with pytest.raises(ValueError, match=r"batch\['labels'\] has shape \(2, 3\)"):
        lt.loss_and_grad(model, {"input_ids": ids, "attention_mask": ids, "labels": ids[:, :3]})


def test_bf16_params_run_close_to_fp32():
    ids = np.random.default_rng(0).integers(0, 256, (2, 8)).astype(np.int32)
    f32 = np.asarray(lt.forward(lt.init_model("qwen3-debug"), ids))
    bf16 = np.asarray(lt.forward(lt.init_model("qwen3-debug", dtype="bfloat16"), ids))
    assert np.isfinite(bf16).all()
    assert np.max(np.abs(bf16 - f32)) / np.max(np.abs(f32)) < 5e-2


def test_unknown_unit_kind_is_a_clear_error():
    units = get_units(lt.get_preset("llama-debug"))
    for call in (units.layer, units.layer_forward_with_residuals, units.layer_backward_from_residuals,
                 units.layer_backward):
        with pytest.raises(ValueError, match=r"kind='mamba' is not a layer kind of this model; valid: \['decoder'\]"):
            call("mamba")
    with pytest.raises(ValueError, match=r"unit='mamba' is not a unit kind; valid: \['embed', 'head'"):
        units.abstract_params("mamba")
