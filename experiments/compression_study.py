"""Tables of issue 35's study (``bash experiments/compression_study.sh``), read from its files only.

    python experiments/compression_study.py     # writes results/compression/study/tables.md and prints it

For each perplexity step folder under ``results/compression/study/`` (``policies/``, ``storage/``): one row per
cache configuration from ``stream.csv`` (perplexity, mean KL(full || configuration) in nats per prediction and
top-1 agreement with the full cache, each with its 95% t-interval over the streams), then the paired comparisons
of ``stream_comparisons.csv`` between configurations at the same budget (the difference of the per-stream means
with its 95% t-interval; *better* names a configuration only where the interval excludes zero, otherwise
"inconclusive"). For the needle step (``needle/accuracy.csv``): accuracy per configuration with its Wilson 95%
interval, overall and per length x depth.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent / "results" / "compression" / "study"


def _ci(mean: float, lo: float, hi: float, nd: int) -> str:
    return f"{mean:.{nd}f} [{lo:.{nd}f}, {hi:.{nd}f}]"


def perplexity_table(folder: Path) -> list[str]:
    df = pd.read_csv(folder / "stream.csv")
    out = [f"### `{folder.name}/` ({int(df['n_streams'].iloc[0])} streams)", "",
           "| configuration | kv bits | lossless sinks | ppl [95% CI] | KL nats [95% CI] | top-1 [95% CI] |",
           "|---|---|---|---|---|---|"]
    for r in df.itertuples(index=False):
        out.append(f"| {r.name} | {r.kv_bits} | {r.sinks_full_precision} | {_ci(r.ppl, r.ppl_low, r.ppl_high, 2)} | "
                   f"{_ci(r.kl, r.kl_low, r.kl_high, 4)} | {_ci(r.top1, r.top1_low, r.top1_high, 3)} |")
    cmp_path = folder / "stream_comparisons.csv"
    if cmp_path.exists():
        cmp = pd.read_csv(cmp_path)
        cfg = df.set_index("name")
        key = {n: (r.budget, r.kv_bits, r.sinks_full_precision) for n, r in cfg.iterrows()}
        # the comparisons that decide "which policy is best": two configurations at the same budget that differ in
        # policy or storage, and every configuration against the full cache (all pairs are in the CSV)
        same = cmp.apply(lambda r: r.a == "full" or r.b == "full" or key[r.a][0] == key[r.b][0], axis=1)
        cmp = cmp[same]
        out += ["", "Paired comparisons over streams at the same budget and against the full cache (difference a - b of "
                "the per-stream means, 95% t-interval; every pair is in `stream_comparisons.csv`):", "",
                "| figure | a | b | a - b [95% CI] | better |", "|---|---|---|---|---|"]
        for r in cmp.itertuples(index=False):
            out.append(f"| {r.figure} | {r.a} | {r.b} | {_ci(r.diff_mean, r.diff_low, r.diff_high, 4)} | {r.better} |")
    return out + [""]


def needle_table(folder: Path) -> list[str]:
    """Correct answers per configuration, overall and per depth (lengths pooled), with Wilson 95% intervals
    (:func:`sinklab.metrics.proportion.wilson_interval`) from the per-cell counts of ``accuracy.csv``."""
    from sinklab.metrics.proportion import wilson_interval

    df = pd.read_csv(folder / "accuracy.csv")
    depths = sorted(df["depth"].unique())
    out = [f"### `{folder.name}/` (correct / items, Wilson 95% interval; lengths {', '.join(str(int(x)) for x in sorted(df['length'].unique()))})", "",
           "| configuration | all | " + " | ".join(f"depth {d:g}" for d in depths) + " |",
           "|---|---|" + "---|" * len(depths)]

    def cell(g: pd.DataFrame) -> str:
        k, n = int(g["correct"].sum()), int(g["n"].sum())
        lo, hi = wilson_interval(k, n)
        return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"

    for name, g in df.groupby("config", sort=False):
        out.append(f"| {name} | {cell(g)} | " + " | ".join(cell(g[g['depth'] == d]) for d in depths) + " |")
    return out + ["", "Per length x depth cell: `accuracy.csv`; heat-map: `heatmap.png`.", ""]


def main() -> None:
    lines = ["# Issue 35's study: tables", "", "Made by `python experiments/compression_study.py` from the files of "
             "`bash experiments/compression_study.sh` (each folder's `stream.json` / `tasks.json` records its command, "
             "code commit, load and wall time).", ""]
    for name in ("policies", "storage"):
        if (ROOT / name / "stream.csv").exists():
            lines += perplexity_table(ROOT / name)
    if (ROOT / "needle" / "accuracy.csv").exists():
        lines += needle_table(ROOT / "needle")
    text = "\n".join(lines)
    (ROOT / "tables.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
