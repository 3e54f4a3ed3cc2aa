"""Training dynamics plot: Sink_1, attention mass on token 1 and validation loss against step.

Reads the tracker lines of one or more runs' ``metrics.jsonl`` (keys ``step``, ``sink_rate``,
``attention_mass_first``, ``val_loss``; positions 1-based as in the paper).
"""

from __future__ import annotations

import json
from pathlib import Path

from sinklab.errors import InputError


def tracker_records(run: str | Path) -> list[dict]:
    """Tracker lines (those with ``sink_rate``) of ``run/metrics.jsonl``, in step order.

    Raises:
        InputError: no metrics.jsonl or no tracker line in it.
    """
    p = Path(run) / "metrics.jsonl"
    if not p.exists():
        raise InputError(f"{p} does not exist")
    recs = [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()]
    recs = [r for r in recs if "sink_rate" in r]
    if not recs:
        raise InputError(f"{p} has no tracker lines (sink_rate)")
    return sorted(recs, key=lambda r: r["step"])


def plot_dynamics(runs: dict[str, str | Path], path: str | Path, *, level: float = 10.0, title: str = "") -> Path:
    """Three panels (Sink_1 %, mass on token 1, validation loss) against step, one line per run.

    Args:
        runs: legend label -> run folder.
        path: the PNG to write.
        level: emergence level drawn on the Sink_1 panel (percent).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for label, run in runs.items():
        recs = tracker_records(run)
        steps = [r["step"] for r in recs]
        axes[0].plot(steps, [r["sink_rate"][0] for r in recs], "o-", ms=3, label=label)
        axes[1].plot(steps, [r["attention_mass_first"] for r in recs], "o-", ms=3, label=label)
        axes[2].plot(steps, [r["val_loss"] for r in recs], "o-", ms=3, label=label)
    axes[0].axhline(level, ls="--", color="gray", lw=0.8)
    for ax, yl in zip(axes, ["Sink_1 (%)", "attention mass on token 1", "validation loss (nats)"]):
        ax.set_xlabel("training step")
        ax.set_ylabel(yl)
    axes[0].set_ylim(-3, 103)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
