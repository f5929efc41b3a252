"""Run configs: YAML/JSON, unknown keys with the closest valid key, types, --set overrides, help."""

import json

import pytest

from lazytrain_jax.train.config import TrainConfig, all_keys, apply_overrides, keys_help


def test_yaml_json_and_overrides(tmp_path):
    (tmp_path / "c.yaml").write_text("train:\n  steps: 10\noptim:\n  learning_rate: 1e-4\nmodel:\n  preset: qwen3-debug\n")
    cfg = TrainConfig.load(tmp_path / "c.yaml", ["train.steps=20", "model.overrides={num_layers: 2}",
                                                 "optim.max_grad_norm=null"])
    assert cfg.train.steps == 20 and cfg.optim.learning_rate == 1e-4 and cfg.optim.max_grad_norm is None
    assert cfg.model.overrides == {"num_layers": 2} and cfg.data.seq_len == 512
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    assert TrainConfig.load(tmp_path / "c.json") == cfg
    # a UTF-8 byte order mark (as editors on Windows write it) is read; bytes that are not UTF-8
    # are one clear error naming the file
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbftrain:\n  steps: 10\n")
    assert TrainConfig.load(tmp_path / "bom.yaml").train.steps == 10
    (tmp_path / "bin.yaml").write_bytes(b"train: \xff\n")
    with pytest.raises(ValueError, match=r"bin\.yaml: not UTF-8 text \(byte 0xff at offset 7\)"):
        TrainConfig.load(tmp_path / "bin.yaml")


@pytest.mark.parametrize("d, message", [
    ({"trian": {}}, "unknown config key 'trian'; did you mean 'train'?"),
    ({"train": {"step": 3}}, "unknown config key 'train.step'; did you mean 'train.steps'?"),
    ({"optim": {"learnig_rate": 1}}, "did you mean 'optim.learning_rate'?"),
    ({"seq_len": 3}, "did you mean 'data.seq_len'?"),
    ({"train": {"steps": "ten"}}, "config key 'train.steps': 'ten' is not a valid int or null"),
    ({"train": {"resume": 1}}, "config key 'train.resume': 1 is not a valid bool"),
    ({"train": 3}, "config section 'train' must be a mapping"),
])
def test_bad_keys_and_types(d, message):
    with pytest.raises(ValueError) as e:
        TrainConfig.from_dict(d)
    assert message in str(e.value)


def test_set_errors_and_help():
    with pytest.raises(ValueError, match="did you mean 'train.keep_last'"):
        apply_overrides({}, ["train.keeplast=2"])
    with pytest.raises(ValueError, match="expected section.key=value"):
        apply_overrides({}, ["train.steps"])
    text = keys_help()
    assert all(key.split(".")[1] in text for key in all_keys())
