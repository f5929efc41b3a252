"""Qwen3.5/3.6 hybrid family: Hugging Face round trips, multimodal checkpoints, config, units."""

import json
import os

import jax
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.config import ModelConfig, get_preset
from tests.model.qwen35_reference import CASES, make_torch_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def torch_state(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("sharded", [False, True])
def test_round_trip_through_transformers_bit_identical(tmp_path, sharded):
    tm = make_torch_model("gqa2-ratio2-untied", seed=3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tm.save_pretrained(src, max_shard_size="40KB" if sharded else "10GB")
    assert os.path.exists(src / "model.safetensors.index.json") == sharded
    model = lt.load_model(src)
    lt.save_hf(model, dst, max_shard_bytes=40_000 if sharded else None)
    assert os.path.exists(dst / "model.safetensors.index.json") == sharded
    back = transformers.AutoModelForCausalLM.from_pretrained(dst, attn_implementation="eager").float().eval()
    assert type(back).__name__ == "Qwen3_5ForCausalLM"
    a, b = torch_state(tm), torch_state(back)
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ids = torch.tensor(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 70)))
    with torch.no_grad():
        np.testing.assert_array_equal(tm(ids).logits.numpy(), back(ids).logits.numpy())


def test_multimodal_checkpoint_loads_its_language_model(tmp_path):
    text = dict(CASES["gqa2-ratio2-untied"])
    vision = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=4, num_position_embeddings=16)
    torch.manual_seed(0)
    mm = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(text_config=text, vision_config=vision))
    mm.save_pretrained(tmp_path / "mm")
    with pytest.warns(UserWarning, match="skipped .* vision-tower"):
        model = lt.load_model(tmp_path / "mm")
    assert model.config.model_type == "qwen3_5_text"
    state = torch_state(mm)
    named = lt.to_hf_state_dict(model.config, model.params)
    for name, value in named.items():
        source = "model.language_model." + name[len("model."):] if name.startswith("model.") else name
        np.testing.assert_array_equal(value, state[source], err_msg=name)
    lt.save_hf(model, tmp_path / "text")
    assert json.loads((tmp_path / "text" / "config.json").read_text())["architectures"] == ["Qwen3_5ForCausalLM"]


@pytest.mark.parametrize("name", ["qwen3.5-debug", "qwen3.6-27b"])
def test_presets_match_transformers(name):
    cfg = get_preset(name)
    hf_cfg = transformers.Qwen3_5TextConfig(**{k: v for k, v in cfg.to_hf_dict().items() if k != "torch_dtype"})
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert sum(p.numel() for p in hf.parameters()) == cfg.num_params()
    assert ModelConfig.from_hf(hf_cfg) == cfg.replace(extra_hf=ModelConfig.from_hf(hf_cfg).extra_hf)
    assert list(hf_cfg.layer_types) == list(cfg.layer_kinds)


def test_27b_shape():
    cfg = get_preset("qwen3.6-27b")
    assert cfg.layer_kinds.count("full_attention") == 16
    assert [i for i, k in enumerate(cfg.layer_kinds) if k == "full_attention"] == list(range(3, 64, 4))
    assert 26.8e9 < cfg.num_params() < 27.0e9


@pytest.mark.parametrize("change, match", [
    ({"linear_num_value_heads": 5}, r"linear_num_value_heads=5 must be a multiple of linear_num_key_heads=2"),
    ({"partial_rotary_factor": 0.1}, r"partial_rotary_factor=0.1 x head_dim=32 gives rotary dim 3"),
    ({"layer_kinds": ("decoder",) * 8}, r"layer_kinds\[0\]='decoder' is not valid for model_type='qwen3_5_text'"),
    ({"linear_conv_kernel_dim": 0}, r"linear_conv_kernel_dim=0 must be a positive integer"),
])
def test_bad_hybrid_config_names_the_field(change, match):
    with pytest.raises(ValueError, match=match):
        get_preset("qwen3.5-debug", **change)
    with pytest.raises(ValueError, match=r"layer_kinds\[0\]='linear_attention' is not valid for model_type='qwen3'"):
        get_preset("qwen3-debug", layer_kinds=("linear_attention",) * 4)


def test_one_compilation_per_kind_and_init():
    model = lt.init_model("qwen3.5-debug", seed=0)
    units = model.units
    assert sorted(units.layer_defs) == ["full_attention", "linear_attention"]
    traces = []

    def counted(kind):
        def fn(params, h, pos, m):
            traces.append(kind)
            return units.layer(kind)(params, h, pos, m)
        return jax.jit(fn)

    jits = {k: counted(k) for k in units.layer_defs}
    ids = np.random.default_rng(0).integers(0, 256, (2, 9)).astype(np.int32)
    mask = np.ones_like(ids)
    h = units.embed(model.params["embed"], ids)
    pos = np.broadcast_to(np.arange(9, dtype=np.int32), (2, 9))
    for kind, p in zip(model.config.layer_kinds, model.params["layers"]):
        h = jits[kind](p, h, pos, mask)
    assert sorted(traces) == ["full_attention", "linear_attention"]
    logits = units.head_logits(model.params["head"], None, h)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(lt.forward(model, ids, mask)), rtol=1e-5, atol=1e-5)
    layer0 = model.params["layers"][0]
    np.testing.assert_array_equal(layer0["input_layernorm"]["weight"], 0.0)  # "1 + w" norms start at zero
    np.testing.assert_array_equal(layer0["linear_attn"]["norm"]["weight"], 1.0)
    np.testing.assert_array_equal(layer0["linear_attn"]["dt_bias"], 1.0)
    a = np.exp(layer0["linear_attn"]["A_log"])
    assert a.min() >= 0.01 and a.max() <= 16
