"""Every example runs with tiny settings; the fine-tuning example makes a real Hugging Face round."""

import os
import runpy
import sys

import numpy as np
import pytest

import lazytrain_jax as lt

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def _run_example(name, argv, capsys):
    old = sys.argv
    sys.argv = [name, *argv]
    try:
        with pytest.raises(SystemExit) as e:
            runpy.run_path(os.path.join(EXAMPLES, name), run_name="__main__")
    finally:
        sys.argv = old
    assert e.value.code == 0
    return capsys.readouterr().out


def test_finetune_metamathqa_hugging_face_round(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    import transformers

    from lazytrain_jax.data import CHATML_TEMPLATE, arithmetic_splits, arithmetic_tokenizer, write_jsonl

    hf_in = tmp_path / "hf_in"
    tok_dir = arithmetic_tokenizer(str(tmp_path / "tok"), chat_template=CHATML_TEMPLATE)
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    config = transformers.Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                      tie_word_embeddings=False, max_position_embeddings=128)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(hf_in)
    tok.save_pretrained(hf_in)
    train, held = arithmetic_splits(seed=0, num_eval=2, num_train=16)
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "eval.jsonl", held)
    out = _run_example("finetune_metamathqa.py", [
        "--model", str(hf_in), "--data", str(tmp_path / "train.jsonl"), "--eval-data", str(tmp_path / "eval.jsonl"),
        "--out", str(tmp_path / "run"), "--steps", "3", "--batch-size", "1", "--seq-len", "64",
        "--device-memory", "1e9", "--max-new-tokens", "4", "--checkpoint-every", "2"], capsys)
    assert "exact match after" in out and "exported" in out
    exported = str(tmp_path / "run" / "hf")
    ours = lt.load_model(exported)
    start = lt.load_model(str(hf_in))
    assert not np.array_equal(ours.params["layers"][0]["mlp"]["up_proj"]["weight"],
                              start.params["layers"][0]["mlp"]["up_proj"]["weight"])  # it trained
    theirs = transformers.AutoModelForCausalLM.from_pretrained(exported, attn_implementation="eager").float().eval()
    ids = np.random.default_rng(0).integers(0, len(tok), (2, 12)).astype(np.int32)
    with torch.no_grad():
        ref = theirs(torch.tensor(ids, dtype=torch.long)).logits.numpy()
    got = np.asarray(lt.forward(ours, ids))
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    assert transformers.AutoTokenizer.from_pretrained(exported).chat_template == CHATML_TEMPLATE


def test_plan_27b(capsys):
    out = _run_example("plan_27b.py", ["--seq-len", "128", "--h800-batch", "8", "--rtx3090-batch", "2",
                                       "--time-limit", "10"], capsys)
    assert "=== h800: batch 8 x 128 ===" in out and "=== rtx3090: batch 2 x 128 ===" in out
    assert out.count("predicted step") == 2 and "26." in out


def test_optax_standalone(capsys):
    out = _run_example("optax_standalone.py", ["--steps", "60", "--width", "64"], capsys)
    rows = {line[:18].strip(): [float(x) for x in line[18:].split()] for line in out.splitlines()[1:]}
    for name in ("adamw_8bit", "optax fp32 adamw"):
        first, last = rows[name]
        assert last < 0.5 * first, (name, first, last)


@pytest.mark.slow  # the command path itself runs in tests/train/test_commands.py by default
def test_config_metamathqa_yaml_runs_through_the_command(tmp_path, capsys):
    from lazytrain_jax.cli import main
    from lazytrain_jax.data import arithmetic_splits, write_jsonl
    from lazytrain_jax.train.config import TrainConfig
    from tests.train.helpers import tiny_config, tokenizer_dir

    cfg = TrainConfig.load(os.path.join(EXAMPLES, "config_metamathqa.yaml"))
    assert cfg.optim.learning_rate == 1e-5 and cfg.plan.plan == "auto"
    from lazytrain_jax.data import load_tokenizer
    model = lt.init_model(tiny_config(len(load_tokenizer(tokenizer_dir())), num_layers=1))
    lt.save_hf(model, str(tmp_path / "model"))
    load_tokenizer(tokenizer_dir()).save_pretrained(str(tmp_path / "model"))
    train, held = arithmetic_splits(seed=0, num_eval=2, num_train=8)
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "eval.jsonl", held)
    run = tmp_path / "run"
    sets = [f"model.path={tmp_path / 'model'}", f"data.train_file={tmp_path / 'train.jsonl'}",
            f"data.eval_file={tmp_path / 'eval.jsonl'}", "data.seq_len=48", "data.max_new_tokens=4",
            "plan.device_memory=1e9", "plan.batch_size=2", "train.epochs=null", "train.steps=2",
            f"train.checkpoint_dir={run / 'ck'}", f"train.log_dir={run / 'log'}", f"train.export_dir={run / 'hf'}",
            "train.progress=false"]
    code = main(["train", os.path.join(EXAMPLES, "config_metamathqa.yaml"), *[a for s in sets for a in ("--set", s)]])
    assert code == 0, capsys.readouterr().err
    assert os.path.exists(run / "hf" / "config.json") and os.path.exists(run / "log" / "loss.png")
