import pytest

from lazytrain_jax import cli


@pytest.mark.slow  # profiles, plans, trains and evaluates the demo model (2 steps)
def test_demo_runs_end_to_end_briefly(tmp_path, capsys):
    assert cli.main(["demo", "--steps", "2", "--num-eval", "4", "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "1,020,800-parameter Qwen3" in out and "predicted step" in out
    assert "exact match on 4 held-out problems" in out
    for path in ("log/loss.png", "log/timeline.png", "log/trace.json", "hf/config.json", "train.jsonl"):
        assert (tmp_path / path).exists(), path


def test_info_on_checkpoint_dir(tmp_path, capsys):
    import lazytrain_jax as lt

    lt.save_hf(lt.init_model("qwen2-debug"), tmp_path / "ck")
    assert cli.main(["info", str(tmp_path / "ck")]) == 0
    assert "model_type qwen2" in capsys.readouterr().out


def test_bad_input_exits_nonzero(capsys):
    assert cli.main(["info", "no-such-model"]) == 1
    assert "unknown model preset 'no-such-model'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", "--batch-size", "0"])
    assert e.value.code == 2
    assert cli.main([]) == 2


def test_plan_prints_and_saves_json(tmp_path, capsys):
    from lazytrain_jax.schedule.plan import Plan

    out = tmp_path / "plan.json"
    assert cli.main(["plan", "qwen3-debug", "--hardware", "rtx3090", "--batch-size", "4", "--seq-len", "64",
                     "--set", "h2d_bw=12e9", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "predicted step" in text and "plan saved to" in text
    loaded = Plan.load(str(out))
    assert loaded.costs.batch_size == 4 and loaded.hardware.h2d_bw == 12e9


def test_plan_bad_input_exits_nonzero(capsys):
    assert cli.main(["plan", "qwen3-debug", "--hardware", "h8000"]) == 1
    assert "unknown hardware preset 'h8000'" in capsys.readouterr().err
    assert cli.main(["plan", "qwen3-debug", "--set", "h2d_bw=-1"]) == 1
    assert "h2d_bw" in capsys.readouterr().err
    assert cli.main(["plan", "qwen3-debug", "--set", "h2d_bw"]) == 1
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "qwen3-debug", "--batch-size", "zero"])
    assert e.value.code == 2


@pytest.mark.parametrize("where", ["missing_dir", "is_a_directory", "parent_is_a_file"])
def test_plan_unwritable_out_is_one_line_error(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    out = {"missing_dir": tmp_path / "missing" / "p.json", "is_a_directory": tmp_path,
           "parent_is_a_file": tmp_path / "file" / "p.json"}[where]
    code = cli.main(["plan", "qwen3-debug", "--batch-size", "2", "--seq-len", "32", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("lazytrain: error: ") and err.count("\n") == 1, err
    assert (tmp_path / "file").read_text() == "x"


def test_plan_writes_predicted_trace_and_png(tmp_path, capsys):
    from tests.trace_check import assert_valid_trace

    trace, png = tmp_path / "step.json", tmp_path / "step.png"
    assert cli.main(["plan", "qwen3-debug", "--batch-size", "2", "--seq-len", "32", "--trace", str(trace),
                     "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert f"predicted trace saved to {trace}" in out and f"predicted Gantt chart saved to {png}" in out
    events = assert_valid_trace(trace)
    assert {"compute", "h2d", "d2h"} <= {e["cat"] for e in events}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
