"""Hugging Face checkpoint round trips and bad-input handling."""

import json
import os

import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.safetensors_io import CheckpointError
from tests.model.reference_models import make_torch_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def torch_state(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("case", ["qwen2-gqa2-tied", "llama-gqa1-llama3rope", "qwen3-gqa4-headdim"])
@pytest.mark.parametrize("sharded", [False, True])
def test_round_trip_through_transformers(tmp_path, case, sharded):
    tm = make_torch_model(case, seed=3)
    src, dst = tmp_path / "src", tmp_path / "dst"
    tm.save_pretrained(src, max_shard_size="40KB" if sharded else "10GB")
    assert os.path.exists(src / "model.safetensors.index.json") == sharded

    model = lt.load_model(src)
    lt.save_hf(model, dst, max_shard_bytes=40_000 if sharded else None)
    assert os.path.exists(dst / "model.safetensors.index.json") == sharded
    back = transformers.AutoModelForCausalLM.from_pretrained(dst, attn_implementation="eager").float().eval()

    a, b = torch_state(tm), torch_state(back)
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ids = torch.tensor(np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 9)))
    with torch.no_grad():
        np.testing.assert_array_equal(tm(ids).logits.numpy(), back(ids).logits.numpy())
    # and our own forward agrees with both
    ours = np.asarray(lt.forward(model, ids.numpy()))
    np.testing.assert_allclose(ours, tm(ids).logits.detach().numpy(), rtol=0, atol=1e-5 * np.abs(ours).max())


def test_save_bf16_and_reload(tmp_path):
    model = lt.init_model("qwen3-debug", seed=0)
    lt.save_hf(model, tmp_path / "bf16", dtype="bfloat16")
    back = lt.load_model(tmp_path / "bf16")
    w, w2 = model.params["layers"][1]["mlp"]["up_proj"]["weight"], back.params["layers"][1]["mlp"]["up_proj"]["weight"]
    assert w2.dtype == np.float32
    np.testing.assert_allclose(w2, w, rtol=2 ** -8)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert hf.model.layers[1].mlp.up_proj.weight.dtype == torch.bfloat16


def test_save_replaces_existing_checkpoint(tmp_path):
    lt.save_hf(lt.init_model("llama-debug", seed=0), tmp_path / "ck", max_shard_bytes=30_000)
    assert len([f for f in os.listdir(tmp_path / "ck") if f.endswith(".safetensors")]) > 1
    lt.save_hf(lt.init_model("llama-debug", seed=1), tmp_path / "ck")
    assert sorted(os.listdir(tmp_path / "ck")) == ["config.json", "model.safetensors"]  # old shards and index gone
    again = lt.load_model(tmp_path / "ck")
    ref = lt.init_model("llama-debug", seed=1)
    np.testing.assert_array_equal(again.params["embed"]["embed_tokens"]["weight"],
                                  ref.params["embed"]["embed_tokens"]["weight"])
    assert sorted(os.listdir(tmp_path)) == ["ck"]


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / "ck"
    lt.save_hf(lt.init_model("qwen2-debug", seed=0), path)
    return path


def test_missing_config_json(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        lt.load_model(tmp_path / "empty")


def test_unknown_model_type(checkpoint):
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"model_type='gpt2'.*valid: \['llama', 'qwen2', 'qwen3', 'qwen3_5_text'\]"):
        lt.load_model(checkpoint)


def _rewrite_without(path, drop=None, reshape=None):
    from lazytrain_jax.model import safetensors_io as st

    header = st.read_header(str(path))
    tensors = dict(st.read_tensors(str(path), {n: i.dtype for n, i in header[1].items()}, header))
    if drop:
        del tensors[drop]
    if reshape:
        name, shape = reshape
        tensors[name] = np.zeros(shape, tensors[name].dtype)
    st.write_file(str(path), tensors.items())


def test_missing_tensor_is_named(checkpoint):
    _rewrite_without(checkpoint / "model.safetensors", drop="model.layers.1.self_attn.k_proj.bias")
    with pytest.raises(CheckpointError, match=r"missing 1 tensor.*model\.layers\.1\.self_attn\.k_proj\.bias"):
        lt.load_model(checkpoint)


def test_wrong_shape_names_tensor_and_both_shapes(checkpoint):
    _rewrite_without(checkpoint / "model.safetensors", reshape=("model.layers.0.mlp.up_proj.weight", (128, 65)))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.up_proj\.weight.*\(128, 65\).*\(128, 64\)"):
        lt.load_model(checkpoint)


def test_unexpected_tensor_strict_and_relaxed(checkpoint):
    from lazytrain_jax.model import safetensors_io as st

    file = checkpoint / "model.safetensors"
    header = st.read_header(str(file))
    tensors = dict(st.read_tensors(str(file), {n: i.dtype for n, i in header[1].items()}, header))
    tensors["model.layers.9.mlp.up_proj.weight"] = np.zeros((2, 2), np.float32)
    st.write_file(str(file), tensors.items())
    with pytest.raises(CheckpointError, match=r"does not use.*model\.layers\.9"):
        lt.load_model(checkpoint)
    assert lt.load_model(checkpoint, strict=False).config.num_layers == 4


def test_truncated_safetensors(checkpoint):
    file = checkpoint / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated"):
        lt.load_model(checkpoint)
    file.write_bytes(data[:20])
    with pytest.raises(CheckpointError, match="truncated or corrupt safetensors header"):
        lt.load_model(checkpoint)


def test_missing_shard_is_named(tmp_path):
    model = lt.init_model("qwen3-debug", seed=0)
    lt.save_hf(model, tmp_path / "ck", max_shard_bytes=50_000)
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    os.remove(tmp_path / "ck" / shard)
    with pytest.raises(CheckpointError, match=shard):
        lt.load_model(tmp_path / "ck")


def test_unwritable_output_leaves_nothing(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    model = lt.init_model("llama-debug")
    with pytest.raises(NotADirectoryError, match="a_file"):
        lt.save_hf(model, blocker / "out")
    assert blocker.read_text() == "x"
    with pytest.raises(FileExistsError, match="not a directory"):
        lt.save_hf(model, blocker)


def test_failed_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    from lazytrain_jax.model import hf_io

    good = tmp_path / "ck"
    lt.save_hf(lt.init_model("llama-debug", seed=0), good)
    before = {f: (good / f).read_bytes() for f in os.listdir(good)}
    calls = []

    def failing_write(path, tensors, metadata=None):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(path, tensors, metadata)

    real_write = hf_io.write_file
    monkeypatch.setattr(hf_io, "write_file", failing_write)
    with pytest.raises(OSError, match="No space left"):
        lt.save_hf(lt.init_model("llama-debug", seed=1), good, max_shard_bytes=30_000)
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no temporary directory left behind
    assert {f: (good / f).read_bytes() for f in os.listdir(good)} == before  # old checkpoint intact
