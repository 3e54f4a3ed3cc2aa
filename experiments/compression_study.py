"""Tables of issue 35's study (``bash experiments/compression_study.sh``), read from its files only.

    python experiments/compression_study.py     # writes results/compression/study/tables.md and prints it

For each perplexity step folder under ``results/compression/study/`` (``policies/``, ``storage/``): one row per
cache configuration from ``stream.csv`` (perplexity, mean KL(full || configuration) in nats per prediction and
top-1 agreement with the full cache, each with its 95% t-interval over the streams), then the paired comparisons
of ``stream_comparisons.csv`` between configurations at the same budget (the difference of the per-stream means
with its 95% t-interval; *better* names a configuration only where the interval excludes zero, otherwise
"inconclusive"); the same for ``long/`` (2048-token streams) and ``gemma/`` (Gemma-3-270M, 1024-token streams). For the task steps (``needle/``, ``needle_storage/``,
``needle_long/``, ``ruler/``, ``passkey/``; ``accuracy.csv`` and ``items.csv``): accuracy per task and configuration with its
Wilson 95% interval, overall and per depth, and exact McNemar tests on the same items (see :func:`task_table`).
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


def task_table(folder: Path) -> list[str]:
    """Per task (needle, or each RULER-style sub-task): correct answers per configuration, overall and per depth
    (lengths pooled), with Wilson 95% intervals (:func:`sinklab.metrics.proportion.wilson_interval`) from the
    per-cell counts of ``accuracy.csv``; then the paired comparisons on the same items (``items.csv``): each
    configuration against the full cache, and configurations at the same budget against each other, by the
    exact McNemar test (the two-sided sign test on the items where exactly one of the two is correct,
    :func:`sinklab.analyze.common.sign_test_p`; unadjusted p; "decided" only where p < 0.05). Where a task gives
    partial credit (the multi-answer sub-tasks: the share of the expected answers found, RULER's metric), each
    configuration's mean score over its items with a 95% t-interval too, and each pair's mean score difference on
    the same items with its paired 95% t-interval ("decided" where it excludes zero)."""
    from sinklab.analyze.common import sign_test_p
    from sinklab.metrics.intervals import t_interval
    from sinklab.metrics.proportion import wilson_interval

    df = pd.read_csv(folder / "accuracy.csv")
    items = pd.read_csv(folder / "items.csv")
    lengths = ", ".join(str(int(x)) for x in sorted(df["length"].unique()))
    out = [f"### `{folder.name}/` (correct / items, Wilson 95% interval; lengths {lengths})", ""]

    def cell(g: pd.DataFrame) -> str:
        k, n = int(g["correct"].sum()), int(g["n"].sum())
        if n == 0:
            return "–"
        lo, hi = wilson_interval(k, n)
        return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"

    for task, t in df.groupby("task", sort=False):
        depths = sorted(t["depth"].dropna().unique())
        it = items[items["task"] == task]
        partial = bool(((it["score"] > 0) & (it["score"] < 1)).any())  # partial credit (RULER's recall of answers)
        cols = ["configuration", "all", *(f"depth {d:g}" for d in depths)]
        cols += ["mean score [95% t-interval over items]"] if partial else []
        out += [f"**{task}**", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for name, g in t.groupby("config", sort=False):
            row = [name, cell(g), *(cell(g[g["depth"] == d]) for d in depths)]
            if partial:
                ci = t_interval(it[it["config"] == name]["score"].tolist())
                row.append(_ci(ci.mean, ci.low, ci.high, 3))
            out.append("| " + " | ".join(row) + " |")
        wide = it.pivot_table(index=["length", "depth", "index"], columns="config", values="correct",
                              aggfunc="first", dropna=False)
        budget = it.groupby("config")["budget"].first()
        names = list(dict.fromkeys(it["config"]))
        pairs = [(a, "full") for a in names if a != "full" and "full" in names]
        pairs += [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                  if "full" not in (a, b) and budget.get(a) == budget.get(b)]
        if pairs:
            extra = " mean score a - b [95% t-interval over the same items] | decided on score |" if partial else ""
            out += ["", "| a | b | a right, b wrong | a wrong, b right | exact McNemar p | decided |" + extra,
                    "|---|---|---|---|---|---|" + ("---|---|" if partial else "")]
            scores = it.pivot_table(index=["length", "depth", "index"], columns="config", values="score",
                                    aggfunc="first", dropna=False)
            for a, b in pairs:
                x, y = wide[a].astype(bool), wide[b].astype(bool)
                n10, n01 = int((x & ~y).sum()), int((~x & y).sum())
                pv = sign_test_p(n10, n10 + n01)
                verdict = ("inconclusive" if pv >= 0.05 else (f"{a} better" if n10 > n01 else f"{b} better"))
                row = f"| {a} | {b} | {n10} | {n01} | {pv:.3g} | {verdict} |"
                if partial:
                    ci = t_interval((scores[a] - scores[b]).tolist())
                    decided = ("inconclusive" if ci.low is None or ci.low <= 0 <= ci.high
                               else (f"{a} better" if ci.mean > 0 else f"{b} better"))
                    row += f" {_ci(ci.mean, ci.low, ci.high, 3)} | {decided} |"
                out.append(row)
        out.append("")
    return out + ["Per length x depth cell: `accuracy.csv`; per item: `items.csv`; heat-map: `heatmap.png`.", ""]


def main() -> None:
    lines = ["# Issue 35's study: tables", "", "Made by `python experiments/compression_study.py` from the files of "
             "`bash experiments/compression_study.sh` (each folder's `stream.json` / `tasks.json` records its command, "
             "code commit, load and wall time).", ""]
    for name in ("policies", "storage"):
        if (ROOT / name / "stream.csv").exists():
            lines += perplexity_table(ROOT / name)
    for name in ("needle", "needle_storage", "needle_long", "ruler", "passkey", "passkey_essays"):
        if (ROOT / name / "accuracy.csv").exists():
            lines += task_table(ROOT / name)
    for name in ("long", "gemma"):
        if (ROOT / name / "stream.csv").exists():
            lines += perplexity_table(ROOT / name)
    text = "\n".join(lines)
    (ROOT / "tables.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
