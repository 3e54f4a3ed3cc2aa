"""Seeds each headline row needs for 80% power against the paper's effect (issue 37 part 3).

Run from the repository root:

    python experiments/power.py            # writes results/power.csv and results/power.md

For every headline row, from the committed ``results/<study>/summary.csv``: our per-seed spread of
Sink_1 (sample std over the current seeds, the reference row's too) and the paper's effect
(``experiments/paper_values.toml``, the study file's values), in points and scaled to our reference
level (paper effect x our reference mean / the paper's reference value). A one-sample row (sink /
no sink against the 10% level) takes the paper's value (scaled) as the true mean; a relative row
(higher / lower) the paper's effect as the true difference; a "similar" row TOST within 10 points.
Power is :func:`sinklab.sweep.verdict.power` (noncentral t, the exact permutation tests' normal-theory
counterpart; 0 where the exact test's smallest attainable p is not below the level), at the level
0.05 / m, m = the study's tested rows (the first step of Holm's adjustment: the bound that holds
whatever the other rows give), and at 0.05 (a row tested alone). The seed count applies to the row
and its reference alike.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from sinklab.provenance import commit_label
from sinklab.sweep.summary import seed_values
from sinklab.sweep.verdict import ALPHA, seeds_for_power

ROOT = Path(__file__).resolve().parent.parent / "results"
ROWS = [("attention_operation", "sigmoid (no norm)"), ("kv_bias", "k bias, v 0"), ("kv_bias", "sink token"),
        ("kv_bias", "k and v bias"), ("weight_decay", "0.5"), ("weight_decay", "1"),
        ("attention_operation", "scaled softmax alpha 2"), ("attention_operation", "scaled softmax alpha 0.2"),
        ("attention_operation", "scaled softmax alpha 0.1"), ("attention_operation", "scaled softmax alpha 0.05"),
        ("positional_encoding", "nope"), ("norm_position", "post"), ("no_bos_confirm", "random first token, T 64")]
LEVEL = 10.0
KIND = {"sink": "one_sample", "no_sink": "one_sample", "higher": "two_sample", "lower": "two_sample",
        "similar": "equivalence"}


def _f(v: str) -> float | None:
    return None if v in (None, "") else float(v)


def plan(study: str, label: str) -> dict:
    with open(ROOT / study / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    row = next(r for r in rows if r["label"] == label)
    ref = next((r for r in rows if r["expect"] == "reference"), None)
    key = row.get("metric") or "sink1"
    vals = seed_values(row, key)
    m = sum(1 for r in rows if r["expect"] and int(r["n_seeds"] or 0) and r.get("degenerate") != "True")
    sd = _f(row[f"{key}_std"])
    paper = float(row["paper"])
    ref_mean = ref_sd = ref_paper = None
    if ref is not None and ref is not row:
        rv = seed_values(ref, key)
        ref_mean, ref_sd, ref_paper = sum(rv) / len(rv), _f(ref[f"{key}_std"]), _f(ref["paper"])
    kind = KIND[row["expect"]]
    if kind == "one_sample":  # the true mean is the paper's value (scaled to our reference level)
        eff_points = paper - LEVEL
        eff_scaled = paper * ref_mean / ref_paper - LEVEL if ref_paper else None
    else:  # the true difference is the paper's effect
        eff_points = paper - ref_paper
        eff_scaled = eff_points * ref_mean / ref_paper
    out = {"study": study, "label": label, "expect": row["expect"], "test": kind, "n_seeds": row["n_seeds"],
           "tested_rows": m, "ours_mean": round(sum(vals) / len(vals), 2), "sd": round(sd, 2),
           "ref_mean": None if ref_mean is None else round(ref_mean, 2),
           "ref_sd": None if ref_sd is None else round(ref_sd, 2), "paper": paper,
           "paper_ref": ref_paper, "true_effect_points": round(eff_points, 2),
           "true_effect_scaled": None if eff_scaled is None else round(eff_scaled, 2)}
    for name, eff in (("points", eff_points), ("scaled", eff_scaled)):
        for tag, alpha in (("holm", ALPHA / m), ("alone", ALPHA)):
            n = None if eff is None else seeds_for_power(kind, eff, sd, sd_ref=ref_sd, alpha=alpha)
            out[f"seeds_{name}_{tag}"] = "" if eff is None else (n if n is not None else ">500")
    return out


def main() -> None:
    plans = [plan(s, lab) for s, lab in ROWS]
    cols = list(plans[0])
    with open(ROOT / "power.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(plans)
    lines = ["# Seeds for 80% power against the paper's effect\n",
             "Made by `python experiments/power.py` (from the repository root; method in its docstring) at commit "
             f"{commit_label(7)} from the `results/<study>/summary.csv` spreads committed then; `power.csv` has every column. *seeds* is the number "
             "per row, the reference row included; *holm*: at the level 0.05 / m (m = the study's tested rows), "
             "*alone*: at 0.05. A relative row's true effect is the paper's effect, a one-sample row's true mean "
             "the paper's value (minus the 10% level below), in points and scaled to our reference level.\n",
             "| study | row | test | seeds now | ours mean (sd) | ref. mean (sd) | paper (ref.) | true effect: points / scaled "
             "| seeds, points (holm / alone) | seeds, scaled (holm / alone) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in plans:
        lines.append(f"| {p['study']} | {p['label']} | {p['test']} | {p['n_seeds']} | {p['ours_mean']} ({p['sd']}) | "
                     f"{p['ref_mean'] if p['ref_mean'] is not None else '–'} ({p['ref_sd'] if p['ref_sd'] is not None else '–'}) | "
                     f"{p['paper']} ({p['paper_ref'] if p['paper_ref'] is not None else '–'}) | {p['true_effect_points']} / "
                     f"{p['true_effect_scaled'] if p['true_effect_scaled'] is not None else '–'} | "
                     f"{p['seeds_points_holm']} / {p['seeds_points_alone']} | {p['seeds_scaled_holm'] or '–'} / "
                     f"{p['seeds_scaled_alone'] or '–'} |")
    (ROOT / "power.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {ROOT / 'power.csv'} and {ROOT / 'power.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
