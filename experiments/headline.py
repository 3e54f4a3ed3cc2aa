"""The headline table of issue 37: every study row that has a paper value, ours against the paper, with the verdict.

Run from the repository root after the studies' summaries are current (``sinklab report results --check``):

    python experiments/headline.py          # writes results/headline.csv and results/headline.md

Every figure is read from the committed ``results/<study>/summary.csv`` (Sink_1 in percent, the tracker's mean over
the last 20% of training, or the row's own metric; the effect is the difference from the study's reference row in
percentage points with its Welch 95% interval; ``p_holm`` is the row's permutation p-value (exact, or Monte Carlo
where the summary's ``p_method`` says so), Holm-adjusted over the study; a row measured at another position than the
first (``sink_token``, the 1-based token k) is labelled with its Sink_k; the verdict rules are in docs/studies.md). The paper values and their sources are
``experiments/paper_values.toml`` (the summary's ``paper`` and ``table`` columns). A *headline* row is one the
power calculation names (``experiments/power.py``); ``seeds_asked`` is its seed count for 80% power against the
paper's effect in points at the Holm level (``results/power.csv``), read from that file.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from sinklab.sweep.summary import current_names

ROOT = Path(__file__).resolve().parent.parent / "results"


def _num(v: str) -> float | None:
    if v in (None, "", "nan", "NaN"):
        return None
    x = float(v)
    return None if math.isnan(x) else x


def _fmt(x: float | None, nd: int = 1, sign: bool = False) -> str:
    if x is None:
        return "–"
    return f"{x:+.{nd}f}" if sign else f"{x:.{nd}f}"


def rows() -> list[dict]:
    power = {}
    if (ROOT / "power.csv").exists():
        with open(ROOT / "power.csv") as f:
            for r in csv.DictReader(f):
                power[(r["study"], r["label"])] = r["seeds_points_holm"]
    out = []
    for summary in sorted(ROOT.glob("*/summary.csv")):
        study = summary.parent.name
        if study in ("archive",):
            continue
        with open(summary) as f:
            for r in map(current_names, csv.DictReader(f)):  # an older file's 1-based columns under today's names
                paper = _num(r.get("paper", ""))
                if paper is None or r.get("expect") in ("", None):
                    continue
                key = r.get("metric") or "sink1"
                mean, sd = _num(r.get(f"{key}_mean", "")), _num(r.get(f"{key}_std", ""))
                out.append({
                    "study": study, "label": r["label"], "expect": r["expect"], "expect_by": r.get("expect_by", ""),
                    "metric": key, "sink_token": r.get("sink_token", ""), "n_seeds": r["n_seeds"], "cpu_model": r.get("cpu_model", ""),
                    "ours_mean": mean, "ours_std": sd, "ci_lo": _num(r.get("ci_lo", "")), "ci_hi": _num(r.get("ci_hi", "")),
                    "effect": _num(r.get("effect", "")), "effect_lo": _num(r.get("effect_lo", "")),
                    "effect_hi": _num(r.get("effect_hi", "")), "paper": paper, "source": r.get("table", ""),
                    "paper_effect": _num(r.get("paper_effect", "")),
                    "paper_effect_scaled": _num(r.get("paper_effect_scaled", "")),
                    "p_holm": _num(r.get("p_holm", "")), "p_holm_min": _num(r.get("p_holm_min", "")),
                    "verdict": r.get("verdict", ""), "mass1_verdict": r.get("mass1_verdict", ""),
                    "headline": (study, r["label"]) in power, "seeds_asked": power.get((study, r["label"]), ""),
                })
    return out


def markdown(table: list[dict]) -> str:
    lines = [
        "# Ours against the paper: every row with a paper value",
        "",
        "Made by `python experiments/headline.py` from the committed `results/<study>/summary.csv` files (columns in "
        "`headline.csv`); paper values and sources: `experiments/paper_values.toml`; verdict rules: `docs/studies.md`. "
        "Sink_1 in % (Sink_k for a row marked so: the sink rate at its own position k), mean ± std over seeds [95% t interval]; effect: difference from the study's reference row in "
        "points [Welch 95% interval]; paper effect: in points / scaled to our reference level. **Bold** rows are the "
        "headline rows of the power calculation (`power.md`); *asked*: the seeds it asks (Holm level, points).",
        "",
        "| study | row | n | ours | effect | paper | paper effect | p (Holm) | verdict | mass verdict | asked | source |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        pos = r.get("sink_token") or "1"
        label = r["label"] if pos in ("1", "") else f"{r['label']} (Sink_{pos})"  # the row's own position
        label = f"**{label}**" if r["headline"] else label
        ours = f"{_fmt(r['ours_mean'])} ± {_fmt(r['ours_std'])} [{_fmt(r['ci_lo'])}, {_fmt(r['ci_hi'])}]"
        eff = "–" if r["effect"] is None else (
            f"{_fmt(r['effect'], sign=True)} [{_fmt(r['effect_lo'], sign=True)}, {_fmt(r['effect_hi'], sign=True)}]")
        peff = "–" if r["paper_effect"] is None else (
            f"{_fmt(r['paper_effect'], sign=True)} / {_fmt(r['paper_effect_scaled'], sign=True)}")
        p = "–" if r["p_holm"] is None else f"{r['p_holm']:.3g}"
        lines.append(f"| {r['study']} | {label} | {r['n_seeds']} | {ours} | {eff} | {_fmt(r['paper'], 2)} | {peff} | "
                     f"{p} | {r['verdict'] or '–'} | {r['mass1_verdict'] or '–'} | {r['seeds_asked'] or ''} | "
                     f"{r['source']} |")
    return "\n".join(lines) + "\n"


def coarseness() -> dict:
    """How coarse Sink_1 is at 4 x 4 heads: over every seed of the studies whose rows have L x H = 16 heads (the
    ``sink_heads_seeds`` column: final Sink_1 x L·H / 100 per seed), the share holding between 1 and 4.5 sink heads
    and the share within 0.05 of a whole number of heads."""
    heads = []
    for summary in sorted(ROOT.glob("*/summary.csv")):
        with open(summary) as f:
            for r in csv.DictReader(f):
                if _num(r.get("heads_total", "")) == 16 and r.get("sink_heads_seeds"):
                    heads += [float(x) for x in r["sink_heads_seeds"].split(";") if x not in ("", "nan")]
    n = len(heads)
    return {"seeds": n, "between_1_and_4.5": sum(1 <= h <= 4.5 for h in heads) / n,
            "whole_number": sum(abs(h - round(h)) <= 0.05 for h in heads) / n}


def main() -> None:
    table = rows()
    with open(ROOT / "headline.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    c = coarseness()
    (ROOT / "headline.md").write_text(markdown(table) + (
        f"\nCoarseness of Sink_1 at 4 x 4 heads (every seed of the rows with L·H = 16, `sink_heads_seeds`): "
        f"{c['seeds']} seeds, {100 * c['between_1_and_4.5']:.0f}% hold between 1 and 4.5 sink heads at the end, "
        f"{100 * c['whole_number']:.0f}% a whole number of heads (within 0.05).\n"))
    print(f"{len(table)} rows -> {ROOT / 'headline.csv'}, {ROOT / 'headline.md'}")


if __name__ == "__main__":
    main()
