"""``lazytrain`` with bad input: a one-line error naming the option (exit 1, or 2 from argparse),
checked before any solving; and what the plan table prints."""

import argparse
import os
import re

import pytest

from lazytrain_jax import cli


@pytest.fixture
def no_solving(monkeypatch):
    """Fails the test if the planner is called (errors must come before solving)."""
    from lazytrain_jax.schedule import api

    def refuse(*a, **k):
        raise AssertionError("the planner ran before the input was checked")

    monkeypatch.setattr(api, "plan", refuse)


@pytest.mark.parametrize("argv, match", [
    (["plan", "qwen3-debug", "--out", "{tmp}/missing/dir/p.json"], r"cannot write .*missing/dir/p.json: .* is not a directory"),
    (["plan", "qwen3-debug", "--out", "{tmp}"], r"cannot write .*: it is a directory; give a file name"),
    (["plan", "qwen3-debug", "--trace", "{tmp}/missing/t.json"], r"cannot write .*missing/t.json: .* is not a directory"),
    (["plan", "qwen3-debug", "--trace", "{tmp}/a_file/t.json"], r"cannot write .*a_file/t.json: .* is not a directory"),
    (["plan", "qwen3-debug", "--png", "{tmp}"], r"cannot write .*: it is a directory; give a file name"),
    (["plan", "qwen3-debug", "--png", "{tmp}/missing/g.png"], r"cannot write .*missing/g.png: .* is not a directory"),
    (["plan", "qwen3-debug", "--set", "device_memory=inf"], r"--set 'device_memory=inf': device_memory must be a finite"),
    (["plan", "qwen3-debug", "--set", "h2d_bw=nan"], r"--set 'h2d_bw=nan': h2d_bw must be a finite"),
    (["plan", "qwen3-debug", "--set", "device_memry=1e9"], r"unknown Hardware field 'device_memry'; did you mean 'device_memory'"),
    (["plan", "{tmp}/no/such/checkpoint"], r"checkpoint directory not found: '.*no/such/checkpoint'"),
    (["plan", "./qwen3-debug"], r"checkpoint directory not found: './qwen3-debug'"),
    (["plan", "{tmp}/a_file"], r"model '.*a_file' is a file"),
    (["info", "{tmp}/no/such/checkpoint"], r"checkpoint directory not found"),
    (["info", "{tmp}/empty_dir"], r"config.json not found: .*empty_dir/config.json"),
])
def test_errors_exit_1_and_name_the_problem(tmp_path, capsys, no_solving, argv, match):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "empty_dir").mkdir()
    before = sorted(os.listdir(tmp_path))
    assert cli.main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    captured = capsys.readouterr()
    assert re.search(match, captured.err), captured.err
    assert captured.out == ""
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("argv, match", [
    (["demo", "--out", "/proc/demo"], r"--out /proc/demo: not a writable directory \(.+\)"),
    (["profile", "qwen3-debug", "--out", "/proc/p.json"], r"cannot write /proc/p\.json: .+ in /proc"),
])
def test_unwritable_outputs_of_demo_and_profile_are_refused_first(capsys, monkeypatch, argv, match):
    """Refused before any work: the demo's output directory, the profile's --out file."""
    import lazytrain_jax as lt
    from lazytrain_jax.train import demo

    def refuse(*a, **k):
        raise AssertionError("the work ran before the output path was checked")

    monkeypatch.setattr(demo, "auto_plan", refuse, raising=False)
    monkeypatch.setattr(lt, "profile", refuse)
    monkeypatch.setattr(lt, "init_model", refuse)
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"lazytrain: error: " + match + r"\n", err), err


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
@pytest.mark.parametrize("option", ["--out", "--trace", "--png"])
def test_a_directory_where_no_file_can_be_made_is_refused_before_solving(capsys, no_solving, option):
    """/proc exists and its permission bits let root write, but no file can be made there: the
    check tries one (and removes it), so the command stops before solving and names the path."""
    assert cli.main(["plan", "qwen3-debug", option, "/proc/p.json"]) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"lazytrain: error: cannot write /proc/p\.json: .+ in /proc\n", err), err


@pytest.mark.parametrize("argv, match", [
    (["plan", "qwen3-debug", "--rel-gap", "-1"], r"--rel-gap=-1 must be a number in \[0, 1\)"),
    (["plan", "qwen3-debug", "--rel-gap", "5"], r"--rel-gap=5 must be a number in \[0, 1\)"),
    (["plan", "qwen3-debug", "--rel-gap", "nan"], r"--rel-gap=nan must be"),
    (["plan", "qwen3-debug", "--rel-gap", "tight"], r"--rel-gap='tight' is not a number"),
    (["plan", "qwen3-debug", "--time-limit", "-5"], r"--time-limit=-5 must be a number in \(0, inf\)"),
    (["plan", "qwen3-debug", "--time-limit", "0"], r"--time-limit=0 must be"),
    (["plan", "qwen3-debug", "--seq-len", "0"], r"--seq-len=0 must be an integer >= 1"),
    (["plan", "qwen3-debug", "--batch-size", "-2"], r"--batch-size=-2 must be a positive integer"),
    (["demo", "--seed", "-1"], r"--seed=-1 must be an integer >= 0"),
    (["demo", "--seed", "x"], r"--seed='x' is not an integer"),
    (["demo", "--steps", "0"], r"--steps=0 must be an integer >= 1"),
    (["demo", "--num-eval", "-3"], r"--num-eval=-3 must be an integer >= 1"),
])
def test_bad_options_exit_2_and_name_the_option(capsys, no_solving, argv, match):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_every_option_has_help_and_shows_its_default():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)
        text = sub.format_help()
        for action in sub._actions:
            if action.option_strings and action.default not in (None, argparse.SUPPRESS) and action.dest != "help":
                default = " ".join(str(action.default).split())
                assert f"(default: {default}" in " ".join(text.split()), (name, action.dest)


def test_plan_table_gib_preset_name_and_host_footprint(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "qwen2.5-0.5b", "--batch-size", "2", "--seq-len", "256", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Plan 'milp' for qwen2.5-0.5b (")
    assert "of 24.00 GiB" in text  # the RTX 3090's 24 GiB, not "of 25.77"
    host = re.search(r"host \(estimate\) ([\d.]+) GiB = fp32 master weights ([\d.]+) \+ Adam state \(8-bit hybrid\) "
                     r"([\d.]+) \+ bf16 streaming copy ([\d.]+) \+ gradients ([\d.]+) \+ offloaded activations ([\d.]+)",
                     text)
    assert host, text
    total, master, adam, bf16, grads, acts = (float(x) for x in host.groups())
    import lazytrain_jax as lt
    num_params = lt.get_preset("qwen2.5-0.5b").num_params()
    assert master == pytest.approx(4 * num_params / 2**30, abs=0.006)
    assert bf16 == pytest.approx(2 * num_params / 2**30, abs=0.006)
    # 8-bit state for the layers' matrices, fp32 (8 B) for the tied embedding, norms and biases
    assert 2.03 * num_params / 2**30 < adam < 8 * num_params / 2**30
    assert total == pytest.approx(master + adam + bf16 + grads + acts, abs=0.03)
    from lazytrain_jax.schedule.plan import Plan
    assert Plan.load(str(out), model="qwen2.5-0.5b").costs.model_name == "qwen2.5-0.5b"
