"""ModelConfig: Hugging Face conversion, presets against transformers' shapes, clear errors."""

import re
import subprocess
import sys

import pytest

from lazytrain_jax.model.config import PRESETS, ModelConfig, get_preset

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF_CLASS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "qwen3_5_text": "Qwen3_5TextConfig"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_matches_transformers_parameter_count(name):
    cfg = get_preset(name)
    hf_cfg = getattr(transformers, HF_CLASS[cfg.model_type])(**cfg.to_hf_dict())
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(hf_cfg)
    assert sum(p.numel() for p in hf.parameters()) == cfg.num_params()
    assert ModelConfig.from_hf(hf_cfg) == cfg.replace(extra_hf=ModelConfig.from_hf(hf_cfg).extra_hf)


def test_hf_dict_round_trip_and_v4_rope_format():
    cfg = get_preset("llama-debug", rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    v4 = {k: v for k, v in cfg.to_hf_dict().items() if k != "rope_parameters"}
    v4["rope_scaling"] = {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                          "original_max_position_embeddings": 64}
    assert ModelConfig.from_hf_dict(v4) == cfg


def test_qwen2_has_qkv_bias_and_qwen3_qk_norm():
    q2 = ModelConfig.from_hf(transformers.Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                                      num_hidden_layers=1))
    q3 = ModelConfig.from_hf(transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=1,
                                                      head_dim=32))
    assert (q2.qkv_bias, q2.o_bias, q2.qk_norm) == (True, False, False)
    assert (q3.qkv_bias, q3.qk_norm, q3.head_dim) == (False, True, 32)


@pytest.mark.parametrize("change, match", [
    ({"model_type": "mistral"}, r"model_type='mistral' is not supported; valid: \['llama', 'qwen2', 'qwen3', 'qwen3_5_text'\]"),
    ({"num_key_value_heads": 3}, r"num_heads=4 must be a multiple of num_kv_heads=3"),
    ({"hidden_act": "gelu"}, r"hidden_act='gelu'"),
    ({"use_sliding_window": True}, r"use_sliding_window=True"),
    ({"hidden_size": 0}, r"hidden_size=0 must be a positive integer"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, r"rope_type='yarn'"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 4.0, "rope_theta": 1e4}},
     r"rope_parameters: required field 'low_freq_factor' is missing"),
])
def test_bad_hf_config_names_the_field(change, match):
    d = get_preset("qwen2-debug").to_hf_dict()
    d.update(change)
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(d)


def test_a_config_file_is_named_once_by_its_path(tmp_path):
    import json
    d = get_preset("qwen2-debug").to_hf_dict()
    d["model_type"] = "mistral"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: model_type='mistral' is not supported"):
        ModelConfig.from_json_file(path)


def test_missing_required_field():
    d = get_preset("qwen2-debug").to_hf_dict()
    del d["intermediate_size"]
    with pytest.raises(ValueError, match="'intermediate_size' is missing"):
        ModelConfig.from_hf_dict(d)


def test_layer_kinds_validated():
    with pytest.raises(ValueError, match=r"layer_kinds\[1\]='mamba'"):
        get_preset("qwen3-debug", num_layers=2, layer_kinds=("decoder", "mamba"))
    with pytest.raises(ValueError, match="layer_kinds has 1 entries; num_layers=2"):
        get_preset("qwen3-debug", num_layers=2, layer_kinds=("decoder",))


def test_config_module_does_not_import_jax():
    code = "import sys, lazytrain_jax.model.config as c; c.get_preset('dense-27b'); assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
