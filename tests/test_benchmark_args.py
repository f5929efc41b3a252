"""The benchmark scripts refuse arguments they do not know (a typo no longer runs a long job with its
defaults), and planner_probes.py checks --seeds against the probe's form before any solve."""

import os
import subprocess
import sys

import pytest

from tests.schedule.test_search import _benchmark_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script", ["planner.py", "plan_batch.py", "unit_bytes.py", "model_parity.py",
                                    "planner_probes.py"])
def test_an_unknown_option_is_an_error(script):
    args = ("varied",) if script == "planner_probes.py" else ()
    out = run(script, *args, "--no-such-option")
    assert out.returncode == 2
    assert "unrecognized arguments: --no-such-option" in out.stderr
    assert out.stdout == ""


@pytest.mark.parametrize("probe, spec, form", [
    ("varied", "7:1", "varied seeds (non-negative integers)"),
    ("kept", "x", "varied seeds (non-negative integers)"),
    ("seeds", "3", "random instances SEED:NVME"),
    ("search", "-1", "'random' or varied seeds"),
    ("polish", "x", "'random' or varied seeds"),
    ("timeline", "7:1", "'random' or varied seeds"),
])
def test_planner_probes_names_a_seed_of_the_wrong_form(probe, spec, form):
    out = run("planner_probes.py", probe, "--seeds", "0" if probe != "seeds" else "1:1", spec)
    assert out.returncode == 2
    assert f"--seeds {spec!r}: {probe} takes {form}" in out.stderr
    assert out.stdout == ""


def test_planner_probes_default_seeds_by_probe(monkeypatch):
    check = _benchmark_module(monkeypatch, "planner_probes").checked_seeds
    assert check(None, "varied", None) == [str(s) for s in range(40)]
    assert check(None, "kept", None) == [str(s) for s in range(40)]
    assert check(None, "seeds", None) == ["7:1", "8:1", "9:1", "8:0", "11:0"]
    assert check(None, "search", None) == ["random"]
    assert check(None, "polish", None) == ["random"]
    assert check(None, "timeline", None) == ["random"]
    assert check(None, "shapes", None) == []
    assert check(None, "varied", ["3", "12"]) == ["3", "12"]
    assert check(None, "shapes", ["h200"]) == ["h200"]
