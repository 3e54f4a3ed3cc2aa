"""Sink_1, attention mass on token 1 and validation loss vs step for the tiny-cpu SOTU runs.

Usage: python results/tiny-cpu-real-text/make_plot.py RUN_DIR [RUN_DIR ...]
Copies each run's metrics.jsonl and config.toml here as <attention>.metrics.jsonl / <attention>.config.toml,
writes tiny-cpu-real-text.png and prints the tracked steps as a table (Sink_1 in percent, eps 0.3).
"""

import json
import shutil
import sys
import tomllib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = Path(__file__).resolve().parent


def main(runs: list[str]) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for run in map(Path, runs):
        name = tomllib.loads((run / "config.toml").read_text())["model"]["attention"]
        shutil.copy(run / "metrics.jsonl", HERE / f"{name}.metrics.jsonl")
        shutil.copy(run / "config.toml", HERE / f"{name}.config.toml")
        recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        tracked = [r for r in recs if "val_loss" in r]
        steps = [r["step"] for r in tracked]
        axes[0].plot(steps, [r["sink_rate"][0] for r in tracked], "o-", label=name)
        axes[1].plot(steps, [r["attention_mass_first"] for r in tracked], "o-", label=name)
        axes[2].plot(steps, [r["val_loss"] for r in tracked], "o-", label=name)
        print(f"\n{name} ({run})")
        print(f"{'step':>5} {'Sink_1 %':>9} {'mass tok1':>10} {'val loss':>9} {'train loss':>11} renorm")
        for r in tracked:
            print(f"{r['step']:>5} {r['sink_rate'][0]:>9.2f} {r['attention_mass_first']:>10.4f} {r['val_loss']:>9.4f} "
                  f"{r.get('loss', float('nan')):>11.4f} {r['renormalised']}")
    for ax, title in zip(axes, ["Sink_1 (%, eps 0.3)", "attention mass on token 1", "validation loss (nats/token)"]):
        ax.set_title(title)
        ax.set_xlabel("step (4096 tokens each)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylim(-1, max(20.0, axes[0].get_ylim()[1]))  # 0% stays readable
    fig.suptitle("tiny-cpu (4.9M params, 4 layers) on SOTU: softmax vs sigmoid without normalisation")
    fig.tight_layout()
    fig.savefig(HERE / "tiny-cpu-real-text.png", dpi=120)
    print(f"\nwrote {HERE / 'tiny-cpu-real-text.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
