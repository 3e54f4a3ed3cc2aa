"""Training dynamics plot: Sink_1, attention mass on token 1 and validation loss against step.

Reads the tracker lines of one or more runs' ``metrics.jsonl`` (keys ``step``, ``sink_rate``,
``attention_mass_first``, ``val_loss``; a row's Sink_k names its 1-based token k, as the paper does).
"""

from __future__ import annotations

from pathlib import Path

from sinklab.errors import InputError
from sinklab.fileio import output_file, read_jsonl
from sinklab.sweep.spec import point_token
from sinklab.sweep.store import runs_dir

#: line styles of the rows past tab20's 20 colours (row i: colour i mod 20, style i // 20)
_STYLES = ("-", "--", ":", "-.")


def row_style(i: int, plt) -> dict:
    """Colour and line style of a study's 0-based row ``i`` in its figures: tab20's colour ``i mod 20``, and from the
    21st row on another line style, so that no two rows of a study (up to 80) are drawn alike."""
    return {"color": plt.cm.tab20(i % 20), "ls": _STYLES[(i // 20) % len(_STYLES)]}


def seed_runs(point_folder: Path) -> list[Path]:
    """The seed run folders (``seed<k>``) of one point, by seed; a legacy single run folder
    (``summary.json`` directly in the point folder) counts as one seed."""
    runs = sorted((d for d in point_folder.glob("seed*") if d.is_dir() and d.name[4:].isdigit()),
                  key=lambda d: int(d.name[4:]))
    if not runs and (point_folder / "summary.json").exists():
        runs = [point_folder]
    return runs


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


#: a loss spike: a logged training loss more than LOSS_SPIKE (relative) above the median of the
#: SPIKE_WINDOW logged losses before it; a gradient-norm spike: more than GRAD_SPIKE times that median
SPIKE_WINDOW = 10
LOSS_SPIKE = 0.2
GRAD_SPIKE = 3.0


def count_spikes(values: list[float], *, ratio: float, window: int = SPIKE_WINDOW) -> int:
    """Number of entries ``v[i]`` (i >= ``window``) with ``v[i] > ratio * median(v[i-window:i])``.

    Args:
        values: a training curve in step order (one value per logged step).
        ratio: the factor above the running median that counts as a spike (e.g. 1.2 for +20%).
        window: how many preceding values the median is taken over.

    Returns:
        the count (0 for a curve shorter than ``window + 1``). A spike that lasts several logged
        steps counts once per step above the threshold.
    """
    import statistics

    return sum(1 for i in range(window, len(values)) if values[i] > ratio * statistics.median(values[i - window:i]))


def training_stability(run: str | Path) -> dict[str, float | int | None]:
    """Loss and gradient-norm stability of one run, from every line of ``run/metrics.jsonl`` that
    has ``loss`` / ``grad_norm`` (logged every ``train.log_every`` steps).

    Returns:
        ``loss_spikes`` (:func:`count_spikes` at ratio ``1 + LOSS_SPIKE``), ``grad_spikes`` (ratio
        ``GRAD_SPIKE``), ``max_grad_norm`` (largest logged pre-clipping gradient norm); None values
        when the log has no such lines.

    Raises:
        InputError: no metrics.jsonl.
    """
    p = Path(run) / "metrics.jsonl"
    if not p.exists():
        raise InputError(f"{p} does not exist")
    recs = sorted((r for r in read_jsonl(p, "training log") if isinstance(r, dict) and "loss" in r),
                  key=lambda r: r["step"])
    losses = [float(r["loss"]) for r in recs]
    grads = [float(r["grad_norm"]) for r in recs if r.get("grad_norm") is not None]
    return {"loss_spikes": count_spikes(losses, ratio=1 + LOSS_SPIKE) if losses else None,
            "grad_spikes": count_spikes(grads, ratio=GRAD_SPIKE) if grads else None,
            "max_grad_norm": max(grads) if grads else None}


#: the file name :func:`plot_path` gives a plot asked for in a folder
DEFAULT_NAME = "dynamics.png"


def plot_path(out: str | Path) -> Path:
    """The file a dynamics plot asked for at ``out`` is written to: ``out/dynamics.png`` when ``out``
    is an existing folder or ends with a path separator, ``out.png`` when it has no suffix (as
    matplotlib would write it), else ``out`` itself (:func:`sinklab.fileio.output_file`)."""
    return output_file(out, DEFAULT_NAME)


def plot_dynamics(runs: dict[str, str | Path], path: str | Path, *, level: float = 10.0, title: str = "") -> Path:
    """Three panels (Sink_1 %, mass on token 1, validation loss) against step, one line per run; a run whose mask
    hides keys (its tracker's mask-aware rates or mass differ from the plain ones: sliding window, prefix LM) is drawn with
    its mask-aware Sink_1 and mass and marked "(mask-aware)" in the legend.

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
    any_visible = False
    for label, run in runs.items():
        recs = tracker_records(run)
        steps = [r["step"] for r in recs]
        # a run whose mask hides keys (sliding window, prefix LM) is drawn with its mask-aware rate and mass, as
        # the studies judge it (its plain Sink_1 cannot exceed w/T under a window)
        visible = any(r.get("sink_rate_visible") not in (None, r["sink_rate"])
                      or r.get("attention_mass_first_visible") not in (None, r.get("attention_mass_first")) for r in recs)
        any_visible |= visible
        rate, mass = (("sink_rate_visible", "attention_mass_first_visible") if visible
                      else ("sink_rate", "attention_mass_first"))
        name = label + (" (mask-aware)" if visible else "")
        axes[0].plot(steps, [r[rate][0] for r in recs], "o-", ms=3, label=name)
        axes[1].plot(steps, [r.get(mass, r["attention_mass_first"]) for r in recs], "o-", ms=3, label=name)
        axes[2].plot(steps, [r["val_loss"] for r in recs], "o-", ms=3, label=name)
    axes[0].axhline(level, ls="--", color="gray", lw=0.8)
    marked = " (mask-aware where marked)" if any_visible else ""
    for ax, yl in zip(axes, [f"Sink_1 (%){marked}", f"attention mass on token 1{marked}", "validation loss (nats)"]):
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


def study_dynamics(out: str | Path, study: dict, level: float = 10.0) -> Path | None:
    """Every row's training dynamics in one figure and one table, for the sweep folder ``out``.

    Writes ``out/dynamics.csv`` (one line per row, seed and tracker step: ``label``, ``seed``,
    ``step``, ``sink`` = the sink rate at the row's position in percent, ``mass1`` = attention mass
    on token 1, ``val_loss``; both the mask-aware ones for a study whose verdicts use them,
    ``study["metric"] == "visible"``) and ``out/dynamics.png`` (three panels against step: the seed mean of
    the sink rate with its min-max band over seeds, the mean mass on token 1, the mean validation
    loss; one line per row). A row's sink rate is at its ``token`` k (1-based), position k - 1. Returns the PNG's path, or None when no row has
    a tracker line yet.
    """
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    # the study's verdict metric: a mask-aware study (``metric = "visible"``, the sliding window) plots the
    # mask-aware rate and mass, as its tables do (the plain ones of a window run are capped at w / T)
    visible = study.get("metric") == "visible"
    rate_key, mass_key = (("sink_rate_visible", "attention_mass_first_visible") if visible
                          else ("sink_rate", "attention_mass_first"))
    rows: list[dict] = []
    for p in study["points"]:
        k = point_token(p) - 1  # the row's sink position (0-based)
        for run in seed_runs(runs_dir(out) / p["slug"]):
            try:
                recs = tracker_records(run)
            except InputError:
                continue
            seed = run.name[4:] if run.name.startswith("seed") else ""
            rows += [{"label": p["label"], "seed": seed, "step": r["step"], "sink": r[rate_key][k],
                      "mass1": r[mass_key], "val_loss": r["val_loss"]} for r in recs]
    if not rows:
        return None
    with open(out / "dynamics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["label", "seed", "step", "sink", "mass1", "val_loss"])
        w.writeheader()
        w.writerows(rows)
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, p in enumerate(study["points"]):
        mine = [r for r in rows if r["label"] == p["label"]]
        if not mine:
            continue
        steps = sorted({r["step"] for r in mine})
        by = {s: [r for r in mine if r["step"] == s] for s in steps}
        n_seeds = len({r["seed"] for r in mine})
        style = row_style(i, plt)
        color = style["color"]
        sink = [[r["sink"] for r in by[s]] for s in steps]
        pos = point_token(p)
        name = p["label"] + (f" (Sink_{pos})" if pos != 1 else "") + f", {n_seeds} seeds"
        axes[0].plot(steps, [sum(v) / len(v) for v in sink], **style, lw=1.3, label=name)
        axes[0].fill_between(steps, [min(v) for v in sink], [max(v) for v in sink], color=color, alpha=0.12, lw=0)
        axes[1].plot(steps, [sum(r["mass1"] for r in by[s]) / len(by[s]) for s in steps], **style, lw=1.3)
        axes[2].plot(steps, [sum(r["val_loss"] for r in by[s]) / len(by[s]) for s in steps], **style, lw=1.3)
    axes[0].axhline(level, ls="--", color="gray", lw=0.8)
    kind = "mask-aware " if visible else ""
    for ax, yl in zip(axes, [f"{kind}sink rate at the row's position (%)\nseed mean, band = min-max",
                             f"{kind}attention mass on token 1 (seed mean)", "validation loss (nats, seed mean)"]):
        ax.set_xlabel("training step")
        ax.set_ylabel(yl, fontsize=8)
    axes[0].set_ylim(-3, 103)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=7, frameon=False)
    fig.suptitle(study.get("title") or study.get("name", ""))
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    path = out / "dynamics.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def study_stability(out: str | Path, study: dict) -> Path | None:
    """Training loss and gradient norm of every row against step, for the sweep folder ``out``
    (the fine-tuning stability view of Gu et al. 2025, Fig. 30).

    Writes ``out/stability.png`` (two panels: the seed mean of the logged training loss, nats/token,
    and of the pre-clipping gradient norm, log scale; one line per row, a thin line per seed).
    Returns the PNG's path, or None when no row has a training log yet.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    drawn = False
    for i, p in enumerate(study["points"]):
        style = row_style(i, plt)
        curves = []
        for run in seed_runs(runs_dir(out) / p["slug"]):
            path = run / "metrics.jsonl"
            if not path.exists():
                continue
            recs = sorted((r for r in read_jsonl(path, "training log") if isinstance(r, dict) and "loss" in r),
                          key=lambda r: r["step"])
            if recs:
                curves.append(recs)
        if not curves:
            continue
        drawn = True
        name = f"{p['label']}, {len(curves)} seeds"
        for j, key in enumerate(("loss", "grad_norm")):
            series = [{r["step"]: float(r[key]) for r in c if r.get(key) is not None} for c in curves]
            series = [c for c in series if c]
            for c in series:
                axes[j].plot(list(c), list(c.values()), **style, lw=0.4, alpha=0.35)
            if series:
                steps = sorted(set.intersection(*(set(c) for c in series)))
                axes[j].plot(steps, [sum(c[s] for c in series) / len(series) for s in steps], **style, lw=1.4,
                             label=name)
    if not drawn:
        plt.close(fig)
        return None
    axes[0].set_ylabel("training loss (nats/token)")
    axes[1].set_ylabel("gradient norm (before clipping)")
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("training step")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize=7, frameon=False)
    fig.suptitle((study.get("title") or study.get("name", "")) + ": stability (seed mean; thin: each seed)")
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    path = out / "stability.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
