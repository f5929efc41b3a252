"""Bad input to the model side (save_hf targets, batches, config.json, safetensors): a clear error
naming the field, never data loss or a silently wrong result."""

import hashlib
import json
import os
import stat
import struct

import ml_dtypes
import numpy as np
import pytest

import lazytrain_jax as lt
from lazytrain_jax.model.batch import BatchError, validate_batch
from lazytrain_jax.model.config import ModelConfig, get_preset
from lazytrain_jax.model.hf_io import SaveTargetError
from lazytrain_jax.model.safetensors_io import CheckpointError, read_header, read_tensors, write_file

VOCAB = 256


@pytest.fixture(scope="module")
def model():
    return lt.init_model("llama-debug", seed=0)


# ---- save_hf: never destroy a directory -------------------------------------------------------

def snapshot(root):
    """Every entry under root (links not followed): relative path -> (kind, mode, content hash / link target)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                info = ("link", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                info = ("dir", stat.S_IMODE(st.st_mode))
            else:
                info = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(open(full, "rb").read()).hexdigest())
            out[os.path.relpath(full, root)] = info
    return out


def project_dir(path):
    (path / "src").mkdir(parents=True)
    (path / "src" / "main.py").write_text("print('hello')\n")
    (path / "README.md").write_text("notes\n")
    (path / "config.json").write_text("{}")  # a config.json alone does not make it a checkpoint
    return path


def assert_refused(model, target, root, match):
    before = snapshot(root)
    with pytest.raises(SaveTargetError, match=match) as e:
        lt.save_hf(model, target)
    assert isinstance(e.value, ValueError)
    assert snapshot(root) == before  # nothing touched: no temporary sibling, no change inside


def test_save_refuses_unrelated_directory(tmp_path, model):
    project_dir(tmp_path / "project")
    assert_refused(model, tmp_path / "project", tmp_path, r"project: it holds 2 entries that are not checkpoint "
                                                          r"files: \['README.md', 'src'\]")


def test_save_refuses_checkpoint_with_foreign_files(tmp_path, model):
    lt.save_hf(model, tmp_path / "ck")
    (tmp_path / "ck" / "tokenizer.json").write_text("{}")
    assert_refused(model, tmp_path / "ck", tmp_path, r"'tokenizer.json'")


def test_save_refuses_symlink_to_directory(tmp_path, model):
    outside = tmp_path / "outside"
    project_dir(outside / "etc")
    lt.save_hf(model, outside / "real_ck")
    (tmp_path / "work").mkdir()
    os.symlink(outside / "etc", tmp_path / "work" / "link")
    os.symlink(outside / "real_ck", tmp_path / "work" / "ck_link")  # even a link to a real checkpoint
    os.symlink(tmp_path / "nowhere", tmp_path / "work" / "dangling")
    for name in ("link", "ck_link", "dangling"):
        assert_refused(model, tmp_path / "work" / name, tmp_path, "symbolic link")


def test_save_refuses_symlinked_or_odd_entries(tmp_path, model):
    lt.save_hf(model, tmp_path / "ck")
    os.symlink(tmp_path / "ck" / "model.safetensors", tmp_path / "ck" / "model-00002-of-00002.safetensors")
    assert_refused(model, tmp_path / "ck", tmp_path, "model-00002-of-00002.safetensors")
    os.remove(tmp_path / "ck" / "model-00002-of-00002.safetensors")
    (tmp_path / "ck" / "sub.safetensors").mkdir()  # a directory named like a weights file
    assert_refused(model, tmp_path / "ck", tmp_path, "sub.safetensors")


def test_save_refuses_weights_without_config(tmp_path, model):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "model.safetensors").write_bytes(b"not ours")
    assert_refused(model, tmp_path / "w", tmp_path, "no config.json")


def test_save_refuses_working_directory(tmp_path, model, monkeypatch):
    (tmp_path / "empty" / "inner").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "empty" / "inner")
    assert_refused(model, ".", tmp_path, "current working directory")
    assert_refused(model, tmp_path / "empty", tmp_path, "current working directory")  # an ancestor of it
    assert os.getcwd() == str(tmp_path / "empty" / "inner")


def test_save_refuses_root_without_writing():
    before = sorted(os.listdir("/"))
    with pytest.raises(SaveTargetError, match="refusing to replace /: "):
        lt.save_hf(lt.init_model("llama-debug"), "/")
    assert sorted(os.listdir("/")) == before


def test_save_refuses_a_file(tmp_path, model):
    (tmp_path / "f").write_text("keep me")
    assert_refused(model, tmp_path / "f", tmp_path, "not a directory")


def test_save_into_new_empty_and_own_checkpoint_dirs(tmp_path, model):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    other = snapshot(tmp_path / "other")
    lt.save_hf(model, tmp_path / "new")
    (tmp_path / "empty").mkdir()
    lt.save_hf(model, tmp_path / "empty")
    lt.save_hf(model, tmp_path / "sharded", max_shard_bytes=30_000)
    (tmp_path / "sharded" / "generation_config.json").write_text("{}")
    lt.save_hf(lt.init_model("llama-debug", seed=5), tmp_path / "sharded")  # replaces ours (+ generation config)
    assert sorted(os.listdir(tmp_path)) == ["empty", "new", "other", "sharded"]  # no temporary left
    assert snapshot(tmp_path / "other") == other
    for name in ("new", "empty", "sharded"):
        assert sorted(os.listdir(tmp_path / name)) == ["config.json", "model.safetensors"]
    np.testing.assert_array_equal(lt.load_model(tmp_path / "sharded").params["head"]["lm_head"]["weight"],
                                  lt.init_model("llama-debug", seed=5).params["head"]["lm_head"]["weight"])


def test_save_refuses_if_target_changes_while_writing(tmp_path, model, monkeypatch):
    from lazytrain_jax.model import hf_io

    lt.save_hf(model, tmp_path / "ck")
    real_write = hf_io.write_file

    def write_and_intrude(path, tensors, metadata=None):
        real_write(path, tensors, metadata)
        (tmp_path / "ck" / "notes.txt").write_text("written meanwhile")

    monkeypatch.setattr(hf_io, "write_file", write_and_intrude)
    with pytest.raises(SaveTargetError, match="notes.txt"):
        lt.save_hf(model, tmp_path / "ck")
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert sorted(os.listdir(tmp_path / "ck")) == ["config.json", "model.safetensors", "notes.txt"]


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_save_and_plan_files_follow_umask(tmp_path, model, umask):
    old = os.umask(umask)
    try:
        lt.save_hf(model, tmp_path / "ck")
        plan = lt.plan("qwen3-debug", "rtx3090", batch_size=1, seq_len=16)
        plan.save(str(tmp_path / "plan.json"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "ck").st_mode) == 0o777 & ~umask
    for f in ("ck/config.json", "ck/model.safetensors", "plan.json"):
        assert stat.S_IMODE(os.stat(tmp_path / f).st_mode) == 0o666 & ~umask, f


def test_save_writes_the_params_dtype(tmp_path):
    model = lt.init_model("llama-debug", seed=0)
    bf16 = lt.Model(config=model.config, params={k: v for k, v in model.params.items()})
    import jax
    bf16.params = jax.tree.map(lambda a: a.astype(ml_dtypes.bfloat16), model.params)
    assert bf16.config.dtype == "float32"  # the config says fp32, the params are bf16
    lt.save_hf(bf16, tmp_path / "a")
    _, tensors, _ = read_header(str(tmp_path / "a" / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {np.dtype(ml_dtypes.bfloat16)}
    assert os.path.getsize(tmp_path / "a" / "model.safetensors") < 0.6 * model.num_bytes()
    assert json.loads((tmp_path / "a" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    lt.save_hf(bf16, tmp_path / "b", dtype="float32")
    _, tensors, _ = read_header(str(tmp_path / "b" / "model.safetensors"))
    assert {t.dtype for t in tensors.values()} == {np.dtype(np.float32)}
    with pytest.raises(ValueError, match="dtype='int8'"):
        lt.save_hf(bf16, tmp_path / "c", dtype="int8")
    with pytest.raises(ValueError, match="max_shard_bytes=0"):
        lt.save_hf(bf16, tmp_path / "c", max_shard_bytes=0)
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


# ---- batches ---------------------------------------------------------------------------------

def good_batch():
    ids = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids.copy()}


def with_value(key, row, col, value, dtype=np.int64):
    b = {k: v.astype(dtype) for k, v in good_batch().items()}
    b[key][row, col] = value
    return b


BAD_BATCHES = [
    (with_value("input_ids", 0, 1, -1), r"\['input_ids'\]\[0, 1\] = -1 .*\[0, 256\)"),
    (with_value("input_ids", 1, 3, 256), r"\['input_ids'\]\[1, 3\] = 256 "),
    (with_value("input_ids", 1, 0, 2**33), r"\['input_ids'\]\[1, 0\] = 8589934592 "),  # would wrap in int32
    (with_value("labels", 0, 2, -5), r"\['labels'\]\[0, 2\] = -5 .*-100"),
    (with_value("labels", 1, 1, 300), r"\['labels'\]\[1, 1\] = 300 "),
    (with_value("attention_mask", 1, 2, 2), r"\['attention_mask'\]\[1, 2\] = 2 .*0 \(padding\) or 1"),
    (with_value("attention_mask", 0, 0, -1), r"\['attention_mask'\]\[0, 0\] = -1 "),
    ({**good_batch(), "labels": np.full((2, 4), -100)}, r"\['labels'\] counts no token"),
    # only position 0 is labelled: the shifted loss never counts it
    ({**good_batch(), "labels": np.array([[7, -100, -100, -100]] * 2)}, r"\['labels'\] counts no token"),
    ({**good_batch(), "input_ids": good_batch()["input_ids"].astype(np.float32)}, r"\['input_ids'\] has dtype float32"),
    ({**good_batch(), "labels": good_batch()["labels"] > 2}, r"\['labels'\] has dtype bool"),
    ({**good_batch(), "attention_mask": np.ones((2, 4), np.float64)}, r"\['attention_mask'\] has dtype float64"),
    ({**good_batch(), "labels": np.ones((2, 3), np.int32)}, r"\['labels'\] has shape \(2, 3\)"),
    ({**good_batch(), "attention_mask": np.ones((2, 4, 1), np.int32)}, r"\['attention_mask'\] has shape \(2, 4, 1\)"),
    ({**good_batch(), "input_ids": np.array([1, 2, 3])}, r"\['input_ids'\] has shape \(3,\)"),
    ({**good_batch(), "input_ids": np.zeros((0, 4), np.int32)}, r"\['input_ids'\] has shape \(0, 4\)"),
    ({k: v for k, v in good_batch().items() if k != "labels"}, r"missing \['labels'\]"),
    ({**good_batch(), "position_ids": np.zeros((2, 4), np.int32)}, r"unknown key 'position_ids'"),
    ([np.zeros((2, 4))], r"must be a dict"),
    ({**good_batch(), "input_ids": [[1, 2], [3]]}, r"\['input_ids'\]"),
]


@pytest.mark.parametrize("batch, match", BAD_BATCHES)
def test_bad_batch_is_named(batch, match):
    with pytest.raises(BatchError, match=match):
        validate_batch(batch, VOCAB)


def test_validate_batch_returns_int32_and_keeps_values():
    b = {k: v.astype(np.int64) for k, v in good_batch().items()}
    b["labels"][0, :2] = -100
    out = validate_batch(b, VOCAB)
    for k in b:
        assert out[k].dtype == np.int32
        np.testing.assert_array_equal(out[k], b[k])
    validate_batch({**b, "labels": np.full((2, 4), -100)}, VOCAB, require_counted=False)  # allowed when asked
    with pytest.raises(ValueError, match="vocab_size=0"):
        validate_batch(b, 0)


@pytest.mark.parametrize("batch, match", BAD_BATCHES[:8])
def test_loss_and_grad_and_forward_check_concrete_inputs(model, batch, match):
    with pytest.raises(BatchError, match=match):
        lt.loss_and_grad(model, batch)
    if "input_ids" in match or "attention_mask" in match:
        with pytest.raises(BatchError, match=match):
            lt.forward(model, batch["input_ids"], attention_mask=batch["attention_mask"])


def test_traced_calls_skip_value_checks(model):
    import jax

    b = good_batch()
    loss, grads = jax.eval_shape(lambda batch: lt.loss_and_grad(model, batch), b)  # traced: no value checks
    assert loss.shape == () and grads["head"]["lm_head"]["weight"].shape == (VOCAB, 64)
    logits = jax.eval_shape(lambda ids: lt.forward(model, ids), b["input_ids"])
    assert logits.shape == (2, 4, VOCAB)
    with pytest.raises(ValueError, match="position_ids shape"):
        lt.forward(model, b["input_ids"], position_ids=np.zeros((2, 3), np.int32))


# ---- config.json ---------------------------------------------------------------------------------

def hf_dict(**changes):
    d = get_preset("llama-debug").to_hf_dict()
    d.update(changes)
    return d


@pytest.mark.parametrize("changes, match", [
    ({"tie_word_embeddings": "false"}, r"tie_word_embeddings='false' \(str\) must be true or false"),
    ({"tie_word_embeddings": 0}, r"tie_word_embeddings=0 \(int\) must be true or false"),
    ({"attention_bias": "true"}, r"attention_bias='true'"),
    ({"mlp_bias": None}, r"mlp_bias=None"),
    ({"vocab_size": 256.9}, r"vocab_size=256.9 \(float\) must be an integer"),
    ({"vocab_size": 256.0}, r"vocab_size=256.0 \(float\) must be an integer"),
    ({"hidden_size": "64"}, r"hidden_size='64' \(str\) must be an integer"),
    ({"num_hidden_layers": True}, r"num_hidden_layers=True \(bool\) must be an integer"),
    ({"num_key_value_heads": 2.5}, r"num_key_value_heads=2.5"),
    ({"head_dim": "16"}, r"head_dim='16'"),
    ({"max_position_embeddings": 1e4}, r"max_position_embeddings=10000.0"),
    ({"rms_norm_eps": "1e-6"}, r"rms_norm_eps='1e-6' \(str\) must be a number"),
    ({"rms_norm_eps": float("nan")}, r"rms_norm_eps=nan"),
    ({"initializer_range": [0.02]}, r"initializer_range=\[0.02\]"),
    ({"rope_theta": "1e4", "rope_parameters": None}, r"rope_theta='1e4'"),
    ({"hidden_act": 1}, r"hidden_act=1"),
    ({"use_sliding_window": "no"}, r"use_sliding_window='no'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}},
     r"rope_scaling: rope_type='yarn' is not supported"),
    ({"rope_scaling": None, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0}},
     r"rope_parameters: rope_type='dynamic' is not supported"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0, "mscale": 1.0}}, r"key 'mscale' is not used"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, r"factor='2' \(str\) must be a number"),
    ({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}, r"factor=-2.0 must be > 0"),
    ({"rope_scaling": ["linear", 2.0]}, r"rope_scaling=\['linear', 2.0\] must be an object"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor=0.5 is not supported"),
    ({"partial_rotary_factor": 0.25}, r"partial_rotary_factor=0.25 is not supported"),
])
def test_bad_config_json_names_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(hf_dict(**changes))


def test_config_json_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json must be a JSON object; got list"):
        ModelConfig.from_json_file(tmp_path / "config.json")


ROPE_CASES = {
    # transformers takes rope_scaling over rope_parameters, with the top-level theta
    "scaling_beside_parameters": dict(rope_scaling={"rope_type": "linear", "factor": 2.0},
                                      rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    "scaling_beside_parameters_theta": dict(rope_scaling={"rope_type": "linear", "factor": 2.0},
                                            rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                            rope_theta=1234.0),
    "legacy_type_key": dict(rope_scaling={"type": "linear", "factor": 3.0}, rope_parameters=None, rope_theta=77.0),
    "parameters_theta_wins": dict(rope_scaling=None, rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                  rope_theta=1234.0),
    "parameters_without_theta": dict(rope_scaling=None, rope_parameters={"rope_type": "linear", "factor": 2.0},
                                     rope_theta=777.0),
    "empty_scaling": dict(rope_scaling={}, rope_parameters={"rope_type": "linear", "factor": 3.0, "rope_theta": 10.0}),
    "llama3_default_original": dict(rope_scaling=None, max_position_embeddings=2048,
                                    rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "rope_theta": 5e5}),
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_read_as_transformers_reads_it(case):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from lazytrain_jax.model.rope import inv_frequencies

    d = hf_dict(**ROPE_CASES[case])
    for key in ("rope_theta", "rope_scaling", "rope_parameters"):
        if key in ROPE_CASES[case] and ROPE_CASES[case][key] is None:
            d[key] = None
    if "rope_theta" not in ROPE_CASES[case]:
        d.pop("rope_theta")
    ours = inv_frequencies(ModelConfig.from_hf_dict(d))
    hf_config = transformers.LlamaConfig.from_dict(json.loads(json.dumps(d)))
    theirs = LlamaRotaryEmbedding(hf_config).inv_freq.to(torch.float32).numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=0)


# ---- safetensors headers and indexes -------------------------------------------------------------

def raw_file(path, header, data=b"", raw_header=None):
    blob = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return str(path)


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
BAD_HEADERS = [
    ([F32x2], None, r"must be a JSON object"),
    ({"a": {"dtype": "F32", "data_offsets": [0, 8]}}, None, r"tensor 'a': header entry has keys"),
    ({"a": {**F32x2, "extra": 1}}, None, r"tensor 'a': header entry has keys"),
    ({"a": "F32"}, None, r"tensor 'a': header entry must be an object"),
    ({"a": {**F32x2, "dtype": "F8"}}, None, r"tensor 'a' has unsupported dtype 'F8'"),
    ({"a": {**F32x2, "shape": [-2]}}, None, r"tensor 'a': shape=\[-2\]"),
    ({"a": {**F32x2, "shape": [2.0]}}, None, r"tensor 'a': shape=\[2.0\]"),
    ({"a": {**F32x2, "shape": "2"}}, None, r"tensor 'a': shape='2'"),
    ({"a": {**F32x2, "data_offsets": [-8, 0]}}, None, r"tensor 'a': data_offsets=\[-8, 0\]"),
    ({"a": {**F32x2, "data_offsets": [8, 0]}}, None, r"tensor 'a': data_offsets=\[8, 0\]"),
    ({"a": {**F32x2, "data_offsets": [0, 8, 16]}}, None, r"tensor 'a': data_offsets=\[0, 8, 16\]"),
    ({"a": {**F32x2, "data_offsets": [0, 12]}}, None, r"tensor 'a' has 12 bytes for shape \(2,\)"),
    ({"a": F32x2, "b": {**F32x2, "data_offsets": [4, 12]}}, None, r"tensor 'b': data_offsets \[4, 12\] overlaps"),
    ({"a": F32x2, "b": F32x2}, None, r"tensor '[ab]': data_offsets \[0, 8\] overlaps"),
    ({"a": {**F32x2, "data_offsets": [4, 12]}}, None, r"tensor 'a': data_offsets \[4, 12\] leaves a hole"),
    ({"a": F32x2, "__metadata__": {"format": 1}}, None, r"__metadata__ must be an object of strings"),
    ({"a": F32x2, "__metadata__": ["pt"]}, None, r"__metadata__ must be an object of strings"),
    (None, b'[{"a": 1}]', r"header must be a JSON object starting with"),
    (None, b'{"a": ' + json.dumps(F32x2).encode() + b', "a": ' + json.dumps(F32x2).encode() + b"}",
     r"duplicate key 'a'"),
    (None, b"{not json", r"cannot read safetensors header"),
]


@pytest.mark.parametrize("header, raw, match", BAD_HEADERS)
def test_bad_safetensors_header_names_file_and_tensor(tmp_path, header, raw, match):
    path = raw_file(tmp_path / "x.safetensors", header, data=b"\0" * 16, raw_header=raw)
    with pytest.raises(CheckpointError, match="x.safetensors.*" + match):
        read_header(path)


def test_header_checks_data_length(tmp_path):
    ok = raw_file(tmp_path / "ok.safetensors", {"a": F32x2}, data=b"\0" * 8)
    assert read_header(ok)[1]["a"].shape == (2,)
    with pytest.raises(CheckpointError, match="4 bytes after the last tensor"):
        read_header(raw_file(tmp_path / "long.safetensors", {"a": F32x2}, data=b"\0" * 12))
    with pytest.raises(CheckpointError, match="truncated"):
        read_header(raw_file(tmp_path / "short.safetensors", {"a": F32x2}, data=b"\0" * 4))


@pytest.fixture
def checkpoint(tmp_path):
    lt.save_hf(lt.init_model("llama-debug", seed=0), tmp_path / "ck", max_shard_bytes=60_000)
    return tmp_path / "ck"


@pytest.mark.parametrize("index, match", [
    ({"weight_map": [["model.norm.weight", "model-00001-of-00002.safetensors"]]}, r"'weight_map' object"),
    ([1, 2], r"'weight_map' object"),
    ({"metadata": {}}, r"weight_map=None"),
    ({"weight_map": {"model.norm.weight": "../../etc/passwd"}}, r"weight_map\['model.norm.weight'\]='../../etc/passwd'"),
    ({"weight_map": {"model.norm.weight": 3}}, r"weight_map\['model.norm.weight'\]=3"),
])
def test_bad_index_names_the_entry(checkpoint, index, match):
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"index.json: .*" + match):
        lt.load_model(checkpoint)


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.uint8])
def test_non_float_weight_is_refused(tmp_path, dtype):
    lt.save_hf(lt.init_model("llama-debug", seed=0), tmp_path / "ck")
    file = str(tmp_path / "ck" / "model.safetensors")
    _, tensors, _ = read_header(file)
    arrays = dict(read_tensors(file, {n: t.dtype for n, t in tensors.items()}))
    name = "model.layers.1.mlp.up_proj.weight"
    arrays[name] = np.ones(arrays[name].shape, dtype)
    write_file(file, list(arrays.items()))
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' has dtype (I32|BOOL|U8); a weight must be a float"):
        lt.load_model(tmp_path / "ck")
