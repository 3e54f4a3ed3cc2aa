"""Files of a long-context task run: per-item rows, accuracy with intervals, a heat-map."""

from __future__ import annotations

import json
import math
from pathlib import Path

from sinklab.fileio import atomic_write_text
from sinklab.streaming.tasks.scoring import accuracy_table


def plot_heatmap(table, path: Path, *, title: str = "") -> None:
    """Accuracy heat-maps, one panel per (task, configuration): rows the lengths (tokens), columns the
    depths (a task without depth: one column ``-``), each cell coloured by accuracy (0 red .. 1 green)
    and labelled ``correct/n``.

    Args:
        table: :func:`sinklab.streaming.tasks.scoring.accuracy_table` grouped by config, task, length, depth.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    tasks = list(dict.fromkeys(table["task"]))
    configs = list(dict.fromkeys(table["config"]))
    fig, axes = plt.subplots(len(tasks), len(configs), squeeze=False,
                             figsize=(0.9 + 2.6 * len(configs), 0.9 + 2.2 * len(tasks)), layout="constrained")
    image = None
    for r, task in enumerate(tasks):
        for c, config in enumerate(configs):
            ax = axes[r][c]
            g = table[(table["task"] == task) & (table["config"] == config)]
            lengths = sorted(set(int(x) for x in table.loc[table["task"] == task, "length"]))
            depths = sorted({float(d) for d in table.loc[table["task"] == task, "depth"] if not _missing(d)})
            cols = depths or [None]
            grid = np.full((len(lengths), len(cols)), np.nan)
            for _, row in g.iterrows():
                i = lengths.index(int(row["length"]))
                j = 0 if _missing(row["depth"]) else cols.index(float(row["depth"]))
                grid[i, j] = row["accuracy"]
                ax.text(j, i, f"{int(row['correct'])}/{int(row['n'])}", ha="center", va="center", fontsize=8)
            image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
            ax.set_xticks(range(len(cols)), ["-" if d is None else f"{d:g}" for d in cols], fontsize=7)
            ax.set_yticks(range(len(lengths)), [str(t) for t in lengths], fontsize=7)
            ax.set_title(f"{task} / {config}", fontsize=8)
            if r == len(tasks) - 1:
                ax.set_xlabel("depth", fontsize=8)
            if c == 0:
                ax.set_ylabel("length (tokens)", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="accuracy")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def write_task_outputs(out, results, meta: dict | None = None) -> None:
    """``items.csv`` (one row per configuration and item), ``accuracy.csv`` (per configuration, task,
    length and depth: n, correct, accuracy, Wilson 95% ``ci_low`` / ``ci_high``, mean_score),
    ``heatmap.png`` (:func:`plot_heatmap`) and ``tasks.json`` (``meta`` and the file names) in folder ``out``.

    Args:
        results: the concatenated DataFrames of :func:`sinklab.streaming.tasks.evaluate_items`.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results.to_csv(out / "items.csv", index=False)
    table = accuracy_table(results)
    table.to_csv(out / "accuracy.csv", index=False)
    plot_heatmap(table, out / "heatmap.png", title=(meta or {}).get("title", ""))
    atomic_write_text(out / "tasks.json", json.dumps({**(meta or {}), "files": ["items.csv", "accuracy.csv",
                                                                               "heatmap.png"]}, indent=2) + "\n")


__all__ = ["plot_heatmap", "write_task_outputs"]
