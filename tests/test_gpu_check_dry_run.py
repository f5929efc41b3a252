"""benchmarks/gpu_check.sh's streaming check runs end to end on the CPU backend with a tiny model.

The script is written for a GPU; without one it runs the same code on qwen3-debug. This test runs
that dry run so that a change to the engine, the profiler or the planner's API that breaks the
script fails here, not on the first GPU it meets. It checks what the table says, never a timing.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_gpu_check_streaming_part_runs_on_cpu_with_a_tiny_model():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_check.py"), "--preset", "qwen3-debug", "--batch", "2",
         "--seq", "64", "--budget-gb", "0.0022", "--repeats", "1", "--opt-params", "100000"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    # the table: run, s/step, fwd+bwd, pred s, TFLOPS, held GB, plan GB, held/plan, live GB, dev0 GB,
    # devpk GB, stall s (resident: no plan, so nan there)
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^(streamed all-device|resident loss_and_grad \(no update\)|MILP under \S+ GB|"
                     r"megatrain\(K=4\) under \S+ GB)((?:\s+\S+){11})$", line)
        if m:
            rows[m.group(1).split(" under")[0]] = [float(v) for v in m.group(2).split()]
    assert set(rows) == {"streamed all-device", "resident loss_and_grad (no update)", "MILP", "megatrain(K=4)"}, text
    for name in ("streamed all-device", "MILP", "megatrain(K=4)"):
        step, fwd_bwd, pred, _, held, plan, ratio, live, _, _, stall = rows[name]
        assert step > 0 and fwd_bwd > 0 and pred > 0 and stall >= 0
        assert 0 < ratio <= 1.0, (name, ratio)  # the engine's held bytes never pass the plan's peak
        assert 0 <= live <= plan * (1 + 1e-9), (name, live, plan)  # nor do the live device arrays (GB, 3 decimals)
    assert rows["resident loss_and_grad (no update)"][0] > 0
    # the budget forces a trade-off: the MILP's plan is not the all-device one with every residual kept
    tiers, kept, layers = re.search(r"^MILP plan \([\d.]+ s\): (\S+), residuals kept (\d+)/(\d+) ", text, re.M).groups()
    assert set(tiers) - {"D"} or int(kept) < int(layers), (tiers, kept)
    # per-phase measured against predicted windows, for every streamed plan
    assert len(re.findall(r"^  phase\s+measured s\s+predicted s\s+ratio$", text, re.M)) == 3, text
    assert "optimizer update on cpu" in text and "lt.optim.adamw_8bit" in text
