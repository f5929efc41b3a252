"""Training metrics: per-step figures, a JSONL log, a progress bar, a summary table and PNGs.

Throughput conventions: ``tflops_6n`` is MegaTrain/LazyTrain's 6 · parameters · tokens/s;
``tflops_hw`` counts what the device really runs under the plan: every layer's forward (matmuls and
causal attention) once, its backward twice, once more where its segment is recomputed and once more
where its interior residuals are not kept, plus the LM head's forward and backward.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import numpy as np

from lazytrain_jax.schedule.trace import save_figure_png
from lazytrain_jax.atomic import atomic_path, atomic_write_text, unwritable_directory

# Dense bf16 peak FLOP/s by jax ``device_kind`` substring (datasheets); MFU is reported only for these.
PEAK_FLOPS = {"H100": 989e12, "H800": 989e12, "H200": 989e12, "A100": 312e12, "RTX 3090": 71e12,
              "RTX 4090": 165e12, "L40S": 362e12}


def device_peak_flops() -> float | None:
    import jax

    kind = jax.devices()[0].device_kind
    return next((v for k, v in PEAK_FLOPS.items() if k.lower() in kind.lower()), None)


def step_flops(config, plan) -> tuple[float, float]:
    """(6·N·tokens, FLOPs the plan executes) of one step."""
    from lazytrain_jax.schedule.costs import layer_fwd_flops

    B, S = plan.batch_size, plan.seq_len
    tokens = B * S
    six_n = 6.0 * config.num_params() * tokens
    recompute = plan.recompute
    total = 6.0 * config.vocab_size * config.hidden_size * tokens  # LM head forward + backward
    for layer, kind in enumerate(config.layer_kinds):
        f = layer_fwd_flops(config, kind, B, S)
        total += f * (3 + int(recompute[layer]) + int(not plan.keep_residuals[layer]))
    return six_n, total


def host_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_record(step: int, m: dict, *, lr: float, flops: tuple[float, float], peak: float | None,
                tokens_per_step: int) -> dict:
    """One JSONL record from an engine step's metrics."""
    t = float(m["step_time_s"])
    six_n, hw = flops
    rec = {"event": "step", "step": step, "loss": float(m["loss"]), "grad_norm": float(m["grad_norm"]),
           "skipped": bool(m["skipped"]), "lr": lr, "step_time_s": t,
           "predicted_step_time_s": float(m["predicted_step_time_s"]), "stall_s": float(m["stall_s"]),
           "tokens": tokens_per_step, "loss_tokens": int(m["num_tokens"]), "tokens_per_s": tokens_per_step / t,
           "tflops_6n": six_n / t / 1e12, "tflops_hw": hw / t / 1e12,
           "mfu": (hw / t / peak) if peak else None, "peak_device_bytes": float(m["peak_device_bytes"]),
           "peak_host_bytes": host_peak_bytes()}
    return rec


class MetricsLog:
    """Appends JSON records to ``<log_dir>/log.jsonl`` (flushed per record) and keeps them in memory."""

    def __init__(self, log_dir: str | None, *, start_step: int = 0):
        self.records: list[dict] = []
        self.path = None
        if log_dir:
            if (why := unwritable_directory(log_dir)) is not None:
                raise ValueError(f"log_dir={log_dir!r} is not writable: {why}")
            self.path = os.path.join(log_dir, "log.jsonl")
            if os.path.exists(self.path):  # resumed: keep the records up to the checkpoint's step
                with open(self.path) as f:
                    old = [json.loads(line) for line in f if line.strip()]
                self.records = [r for r in old if r.get("step", 0) <= start_step and r.get("event") != "summary"]
                with atomic_path(self.path) as tmp, open(tmp, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in self.records)
        self._file = open(self.path, "a") if self.path else None

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file:
            self._file.close()
            self._file = None

    def steps(self) -> list[dict]:
        return [r for r in self.records if r.get("event") == "step"]


def summarize(records: list[dict], *, warmup_steps: int = 1) -> dict:
    """Medians of the step figures (first ``warmup_steps`` excluded: compilation), peaks, last loss."""
    steps = [r for r in records if r.get("event") == "step"]
    if not steps:
        return {}
    steady = steps[warmup_steps:] or steps
    med = lambda k: float(np.median([r[k] for r in steady]))
    out = {"steps": steps[-1]["step"], "final_loss": steps[-1]["loss"], "tokens_per_s": med("tokens_per_s"),
           "tflops_6n": med("tflops_6n"), "tflops_hw": med("tflops_hw"), "step_time_s": med("step_time_s"),
           "predicted_step_time_s": med("predicted_step_time_s"), "stall_s": med("stall_s"),
           "peak_device_bytes": max(r["peak_device_bytes"] for r in steps),
           "peak_host_bytes": max(r["peak_host_bytes"] for r in steps),
           "skipped_steps": sum(r["skipped"] for r in steps)}
    mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
    out["mfu"] = float(np.median(mfus)) if mfus else None
    evals = [r for r in records if r.get("event") == "eval"]
    if evals:
        out["exact_match"] = evals[-1]["accuracy"]
        out["eval_examples"] = evals[-1]["num_total"]
    return out


def summary_table(summary: dict) -> str:
    """A two-column text table of ``summarize`` output."""
    fmt = {"peak_device_bytes": lambda v: f"{v / 2**20:.1f} MiB", "peak_host_bytes": lambda v: f"{v / 2**20:.1f} MiB",
           "tokens_per_s": lambda v: f"{v:,.0f}", "step_time_s": lambda v: f"{v * 1e3:.1f} ms",
           "predicted_step_time_s": lambda v: f"{v * 1e3:.1f} ms", "stall_s": lambda v: f"{v * 1e3:.1f} ms",
           "exact_match": lambda v: f"{100 * v:.1f} %", "mfu": lambda v: "n/a (device peak unknown)" if v is None
           else f"{100 * v:.2f} %", "tflops_6n": lambda v: f"{v:.4f}", "tflops_hw": lambda v: f"{v:.4f}",
           "final_loss": lambda v: f"{v:.4f}"}
    labels = {"tflops_6n": "TFLOPS (6·N·tok/s)", "tflops_hw": "TFLOPS (executed, incl. recompute+attn)",
              "stall_s": "stall per step (median)", "step_time_s": "step time (median)",
              "predicted_step_time_s": "predicted step time"}
    rows = [(labels.get(k, k.replace("_", " ")), fmt.get(k, str)(v)) for k, v in summary.items()]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 24)
    return "\n".join([line] + [f"{k:<{width}}  {v}" for k, v in rows] + [line])


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_loss_png(records: list[dict], path: str) -> None:
    """Training loss per step (and exact match at eval points) as a PNG, written atomically."""
    plt = _pyplot()
    steps = [r for r in records if r.get("event") == "step"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=1, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    evals = [r for r in records if r.get("event") == "eval"]
    if evals:
        ax2 = ax.twinx()
        ax2.plot([r["step"] for r in evals], [100 * r["accuracy"] for r in evals], "o-", color="tab:green",
                 label="exact match")
        ax2.set_ylabel("exact match %")
        ax2.set_ylim(0, 100)
    ax.set_title("training loss")
    fig.tight_layout()
    save_figure_png(fig, path)


def save_timeline_png(measured: list[dict], predicted, path: str) -> None:
    """Gantt chart of one step: measured intervals (engine timeline) above the simulator's prediction."""
    from lazytrain_jax.schedule.trace import CHANNEL_COLORS as colors, CHANNEL_TIDS

    plt = _pyplot()
    fig, axes = plt.subplots(2, 1, figsize=(14, 6), sharex=False)
    last = [iv for iv in predicted.intervals if iv.step == predicted.intervals[-1].step] if predicted else []
    t0 = min((iv.start for iv in last), default=0.0)
    rows = [("measured", [(iv["channel"], iv["start_s"], iv["end_s"]) for iv in measured]),
            ("predicted", [(iv.channel, iv.start - t0, iv.end - t0) for iv in last])]
    for ax, (title, ivs) in zip(axes, rows):
        for channel, start, end in ivs:
            ax.barh(CHANNEL_TIDS[channel], end - start, left=start, color=colors[channel], height=0.8)
        ax.set_yticks(list(CHANNEL_TIDS.values()), list(CHANNEL_TIDS))
        ax.invert_yaxis()
        span = max((e for _, _, e in ivs), default=0.0)
        ax.set_title(f"{title} step: {span * 1e3:.1f} ms")
        ax.set_xlabel("seconds")
    fig.tight_layout()
    save_figure_png(fig, path)


def write_summary(log_dir: str, summary: dict) -> None:
    atomic_write_text(os.path.join(log_dir, "summary.json"), json.dumps(summary, indent=1))
    atomic_write_text(os.path.join(log_dir, "summary.txt"), summary_table(summary) + "\n")


def progress_bar(total: int, initial: int, enabled: bool):
    """A tqdm bar (ETA included) on stderr, or None when disabled."""
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr, leave=True)
