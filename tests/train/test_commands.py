"""``lazytrain`` training subcommands: bad input gives one clear message and exit status 1, nothing lost."""

import json
import os

import pytest
import yaml

from lazytrain_jax.cli import main
from lazytrain_jax.data import write_jsonl
from tests.train.helpers import tiny_setup, tokenizer_dir

MODEL = {"preset": "qwen3-debug", "overrides": {"num_layers": 1, "hidden_size": 32, "intermediate_size": 64,
                                                "num_heads": 2, "num_kv_heads": 1, "head_dim": 16, "vocab_size": 0}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cmd")
    _, ds, held = tiny_setup(num_train=16, num_eval=4)
    write_jsonl(d / "train.jsonl", ds.examples)
    write_jsonl(d / "eval.jsonl", held)
    return d, len(ds.tokenizer)


def _config(d, vocab, **sections):
    model = json.loads(json.dumps(MODEL))
    model["overrides"]["vocab_size"] = vocab
    cfg = {"model": model,
           "data": {"train_file": str(d / "train.jsonl"), "tokenizer": tokenizer_dir(), "seq_len": 40,
                    "template": "plain", "plain_prompt": "{query}\n", "max_new_tokens": 4},
           "plan": {"plan": "auto", "hardware": "rtx3090", "device_memory": 1e9, "batch_size": 4},
           "train": {"steps": 2, "progress": False}}
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    path = d / f"cfg-{len(os.listdir(d))}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    _run.out = captured.out
    return code, captured.err


def test_bad_inputs_exit_1_with_a_clear_message(workdir, capsys, tmp_path):
    d, vocab = workdir
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "response": "The answer is: 1"}\n{"query": \n')
    (tmp_path / "empty.jsonl").write_text("\n")
    cases = [
        (_config(d, vocab, data={"train_file": str(bad)}), [], f"{bad}:2: not valid JSON"),
        (_config(d, vocab, data={"train_file": str(tmp_path / "empty.jsonl")}), [], "the dataset is empty"),
        (_config(d, vocab), ["--set", "data.seq_len=6"], "seq_len=6 is too short for any example"),
        (_config(d, vocab, data={"tokenizer": str(tmp_path / "no-tok")}), [], "tokenizer directory"),
        (_config(d, vocab), ["--set", "train.setps=3"], "unknown config key 'train.setps'; did you mean 'train.steps'?"),
        (_config(d, vocab, plan={"device_memory": 1e5}), [], "plan infeasible"),
        (_config(d, vocab, train={"checkpoint_dir": str(d / "train.jsonl")}), [], "is not writable"),
        (_config(d, vocab, train={"log_dir": str(d / "train.jsonl")}), [], "log_dir="),
        (_config(d, vocab, train={"eval_every": 1}), [], "train.eval_every=1 needs data.eval_file"),
        (_config(d, vocab, train={"checkpoint_every": 1}), [], "train.checkpoint_every=1 needs train.checkpoint_dir"),
    ]
    not_yaml = tmp_path / "not.yaml"
    not_yaml.write_text("model: qwen3-debug\ndata: {train_file: x\n")
    cases.append((str(not_yaml), [], f"{not_yaml}:3:1: not valid YAML (expected ',' or '}}'"))
    for path, extra, message in cases:
        code, err = _run(capsys, "train", path, *extra)
        assert code == 1 and message in err and err.startswith("lazytrain: error:"), (message, err)
        assert err.count("\n") == 1, err   # one line
    code, err = _run(capsys, "train", _config(d, vocab), "--set", "data.skip_bad_lines=true", "--set",
                     f"data.train_file={bad}", "--set", "train.steps=1")
    assert code == 0, err
    assert "1 examples (1 bad lines skipped" in _run.out, _run.out


def test_train_resume_refuses_another_models_checkpoint_and_export(workdir, capsys, tmp_path):
    d, vocab = workdir
    ck = str(tmp_path / "ck")
    code, err = _run(capsys, "train", _config(d, vocab, train={"checkpoint_dir": ck}))
    assert code == 0, err
    before = sorted(os.listdir(ck))
    code, err = _run(capsys, "train", _config(d, vocab, train={"checkpoint_dir": ck}), "--set",
                     "model.overrides={num_layers: 2, hidden_size: 32, intermediate_size: 64, num_heads: 2, "
                     f"num_kv_heads: 1, head_dim: 16, vocab_size: {vocab}}}")
    assert code == 1 and "does not belong to this run" in err and "model.num_layers: checkpoint 1, this run 2" in err
    assert sorted(os.listdir(ck)) == before
    code, err = _run(capsys, "export", ck, str(tmp_path / "hf"), "--tokenizer", tokenizer_dir())
    assert code == 0, err
    assert os.path.exists(tmp_path / "hf" / "config.json") and os.path.exists(tmp_path / "hf" / "tokenizer.json")
    code, err = _run(capsys, "eval", str(tmp_path / "hf"), str(d / "eval.jsonl"), "--max-new-tokens", "4",
                     "--template", "plain", "--plain-prompt", "{query}\n")
    assert code == 0, err
    assert "exact match" in _run.out and "generation: resident" in _run.out
    code, err = _run(capsys, "eval", str(tmp_path / "hf"), str(d / "eval.jsonl"), "--max-new-tokens", "4",
                     "--template", "plain", "--plain-prompt", "{query}\n", "--device-memory", "1000")
    assert code == 1 and "generation does not fit device_memory=1000 bytes even for one prompt" in err
    code, err = _run(capsys, "export", str(tmp_path / "nothing"), str(tmp_path / "x"))
    assert code == 1 and "is not a directory" in err


def test_train_help_documents_every_key(capsys):
    from lazytrain_jax.train.config import all_keys
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for key in all_keys():
        assert f"  {key.split('.')[1]} " in out, key


@pytest.mark.slow
def test_train_config_with_the_largest_batch_that_fits(workdir, tmp_path):
    """``plan.batch_size: max`` with ``plan: auto`` on the measured hardware trains at the largest
    batch that fits (the one ``lt.plan(hardware="measure", batch_size="max")`` gives), and an epoch
    is counted in that batch; a preset hardware asks for a number instead."""
    import lazytrain_jax as lt
    from lazytrain_jax.train.commands import run_config
    from lazytrain_jax.train.config import TrainConfig
    d, vocab = workdir
    raw = yaml.safe_load(open(_config(d, vocab)))
    cfg = lt.get_preset(raw["model"]["preset"], **raw["model"]["overrides"])
    kw = dict(seq_len=40, stream_dtype="float32")
    budget = lt.plan(cfg, "measure", batch_size=3, device_memory=1e12, **kw).predicted_peak_device_bytes
    expected = lt.plan(cfg, "measure", batch_size="max", device_memory=budget, **kw)
    assert expected.batch_size >= 3 and expected.fits()
    raw["plan"].update(hardware="measured", device_memory=budget, batch_size="max", stream_dtype="float32")
    raw["train"].update(steps=None, epochs=1.0, log_dir=str(tmp_path / "log"))
    result = run_config(TrainConfig.from_dict(raw), print_fn=lambda *a, **k: None)
    assert result.plan.batch_size == expected.batch_size
    assert result.plan.num_micro_batches == expected.num_micro_batches
    assert result.steps == -(-16 // expected.batch_size)  # 16 training examples, one epoch
    raw["plan"].update(hardware="rtx3090")
    with pytest.raises(ValueError, match="batch_size='max' needs hardware='measured'"):
        run_config(TrainConfig.from_dict(raw), print_fn=lambda *a, **k: None)
