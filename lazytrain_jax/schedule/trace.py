"""Exports a simulated timeline: Chrome/Perfetto trace JSON and a PNG Gantt chart (matplotlib)."""

from __future__ import annotations

import json

CHANNEL_TIDS = {"compute": 1, "h2d": 2, "d2h": 3, "nvme_read": 4, "nvme_write": 5, "optimizer": 6}
CHANNEL_COLORS = {"compute": "tab:blue", "h2d": "tab:green", "d2h": "tab:orange", "nvme_read": "tab:purple",
                  "nvme_write": "tab:brown", "optimizer": "tab:red"}


def save_figure_png(fig, path: str) -> None:
    """Writes a matplotlib figure as a PNG atomically and closes it (also on failure)."""
    import matplotlib.pyplot as plt
    from lazytrain_jax.atomic import atomic_path
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
    finally:
        plt.close(fig)


def chrome_trace(result) -> dict:
    """A trace dict (``traceEvents`` with ph "X", one tid per channel, microseconds).

    Args:
      result: a SimResult from ``simulate``.
    Returns:
      The dict; ``json.dump`` it and open in Perfetto or chrome://tracing.
    Example:
      >>> json.dump(chrome_trace(simulate(plan)), open("trace.json", "w"))
    """
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": ch}}
              for ch, tid in CHANNEL_TIDS.items()]
    for iv in result.intervals:
        events.append({"name": iv.name, "cat": iv.channel, "ph": "X", "pid": 1, "tid": CHANNEL_TIDS[iv.channel],
                       "ts": iv.start * 1e6, "dur": (iv.end - iv.start) * 1e6, "args": {"step": iv.step}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def save_chrome_trace(result, path: str) -> None:
    """Writes the Chrome/Perfetto trace JSON atomically."""
    from lazytrain_jax.atomic import atomic_write_text
    atomic_write_text(path, json.dumps(chrome_trace(result)))


def save_gantt_png(result, path: str, *, title: str = "") -> None:
    """A PNG Gantt chart of the channels and the device memory curve (needs matplotlib, extra ``plot``).

    Example:
      >>> save_gantt_png(simulate(plan), "gantt.png")
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("save_gantt_png needs matplotlib: pip install 'lazytrain_jax[plot]'") from None
    fig, (ax, axm) = plt.subplots(2, 1, figsize=(14, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    colors = CHANNEL_COLORS
    for iv in result.intervals:
        ax.barh(CHANNEL_TIDS[iv.channel], iv.end - iv.start, left=iv.start, color=colors[iv.channel], height=0.8)
    ax.set_yticks(list(CHANNEL_TIDS.values()), list(CHANNEL_TIDS))
    ax.invert_yaxis()
    ax.set_title(title or f"step {result.step_time_s:.3f} s")
    if result.memory_curve:
        ts, bs = zip(*result.memory_curve)
        axm.step(ts, [b / 1e9 for b in bs], where="post")
    axm.set_ylabel("device GB")
    axm.set_xlabel("seconds")
    fig.tight_layout()
    save_figure_png(fig, path)
