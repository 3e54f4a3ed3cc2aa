"""Training dynamics plot: Sink_1, attention mass on token 1 and validation loss against step.

Reads the tracker lines of one or more runs' ``metrics.jsonl`` (keys ``step``, ``sink_rate``,
``attention_mass_first``, ``val_loss``; positions 1-based as in the paper).
"""

from __future__ import annotations

from pathlib import Path

from sinklab.errors import InputError
from sinklab.fileio import read_jsonl


def tracker_records(run: str | Path) -> list[dict]:
    """Tracker lines (those with ``sink_rate``) of ``run/metrics.jsonl``, in step order.

    Raises:
        InputError: no metrics.jsonl or no tracker line in it.
        CorruptFileError: metrics.jsonl is unreadable or holds a line that is not JSON.
    """
    p = Path(run) / "metrics.jsonl"
    if not p.exists():
        raise InputError(f"{p} does not exist")
    recs = [r for r in read_jsonl(p, "training log") if isinstance(r, dict) and "sink_rate" in r]
    if not recs:
        raise InputError(f"{p} has no tracker lines (sink_rate)")
    return sorted(recs, key=lambda r: r["step"])


#: the file name :func:`plot_path` gives a plot asked for in a folder
DEFAULT_NAME = "dynamics.png"


def plot_path(out: str | Path) -> Path:
    """The file a dynamics plot asked for at ``out`` is written to: ``out/dynamics.png`` when ``out``
    is an existing folder or ends with a path separator, ``out.png`` when it has no suffix (as
    matplotlib would write it), else ``out`` itself."""
    text = str(out)
    p = Path(out).expanduser()
    if p.is_dir() or text.endswith(("/", "\\")):
        return p / DEFAULT_NAME
    return p if p.suffix else p.with_name(p.name + ".png")


def plot_dynamics(runs: dict[str, str | Path], path: str | Path, *, level: float = 10.0, title: str = "") -> Path:
    """Three panels (Sink_1 %, mass on token 1, validation loss) against step, one line per run.

    Args:
        runs: legend label -> run folder.
        path: where to write the plot (resolved by :func:`plot_path`: a folder gets dynamics.png).
        level: emergence level drawn on the Sink_1 panel (percent).

    Returns:
        the file written.
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
    path = plot_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
