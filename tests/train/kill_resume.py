"""Shared by the kill/resume test and benchmarks/kill_resume.py: run the driver, SIGKILL it, resume."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 8


def driver_env(tokenizer_dir: str, cache_dir: str) -> dict:
    env = dict(os.environ, LAZYTRAIN_TEST_TOKENIZER=tokenizer_dir, JAX_PLATFORMS="cpu",
               JAX_COMPILATION_CACHE_DIR=cache_dir, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def start(env, ckpt_dir, out, *extra):
    return subprocess.Popen([sys.executable, "-m", "tests.train.kill_driver", ckpt_dir, out, str(STEPS), *extra],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_to_end(env, ckpt_dir, out, *extra) -> str:
    proc = start(env, ckpt_dir, out, *extra)
    text, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"driver failed ({proc.returncode}):\n{text[-3000:]}")
    return text


def kill_when(proc, marker: str, delay_s: float) -> list[str]:
    """Reads lines until one starts with ``marker``, sleeps, then SIGKILLs the process."""
    seen = []
    for line in proc.stdout:
        seen.append(line.rstrip())
        if line.startswith(marker):
            break
    else:
        raise RuntimeError(f"the driver ended before {marker!r}:\n" + "\n".join(seen[-30:]))
    if delay_s:
        import time
        time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return seen


def same_npz(a: str, b: str) -> bool:
    x, y = np.load(a), np.load(b)
    return len(x.files) == len(y.files) and all(np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype
                                                for k in x.files)


def resumed_from(text: str) -> int:
    for line in text.splitlines():
        if line.startswith("resumed from"):
            return int(line.rsplit("step ", 1)[1].rstrip(")"))
    return 0


def latest_checkpoint(ckpt_dir: str) -> int:
    """The step of the newest complete checkpoint in ``ckpt_dir`` (0: none)."""
    names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
    return max((int(n.split("_")[1]) for n in names if n.startswith("step_")), default=0)


def chain(env, workdir: str, num_kills: int, rng: random.Random) -> list[dict]:
    """One run killed up to ``num_kills`` times at random steps (random delay: mid-step or
    mid-write), each time resumed, then finished. Returns one row per kill, then the final run's.

    Each kill follows a step the resumed run will print: one after its newest checkpoint (a kill
    that lands after a checkpoint's write resumes from that step, which is then never printed
    again), leaving a step for each kill still to come. Fewer kills happen only where one landed
    more than a step past its mark."""
    ckpt_dir, out = os.path.join(workdir, "ckpt"), os.path.join(workdir, "out.npz")
    rows = []
    for i in range(num_kills):
        latest = latest_checkpoint(ckpt_dir)
        hi = min(STEPS - 1, latest + 2, STEPS - 1 - (num_kills - 1 - i))
        if latest + 1 > STEPS - 1:
            break
        proc = start(env, ckpt_dir, out)
        target = rng.randint(latest + 1, max(latest + 1, hi))
        delay = rng.uniform(0.0, 0.05)
        seen = kill_when(proc, f"step {target}", delay)
        rows.append({"killed_after_step": target, "delay_s": delay, "resumed_from": resumed_from("\n".join(seen))})
    text = run_to_end(env, ckpt_dir, out)
    rows.append({"final_resumed_from": resumed_from(text)})
    return rows


def fresh_dir(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix)
