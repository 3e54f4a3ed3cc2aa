"""bfloat16 against float32 for the analyses on SmolLM2-135M (issue 34): reads
results/analyze_dtype/<kind>-<dtype>/analysis.json (made by the commands recorded in each file) and writes
results/analyze_dtype/compare.csv (every scalar of each analysis's summary in both dtypes, the absolute and
relative difference) and results/analyze_dtype/analyses.json (every analysis.json, keyed "<kind>-<dtype>": the
one file committed of each run, with its command; the runs' CSV tables and plots are not kept).

    python experiments/analyze_dtype.py
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "results" / "analyze_dtype"


def main() -> None:
    rows = []
    for f32 in sorted(ROOT.glob("*-float32/analysis.json")):
        kind = f32.parent.name.removesuffix("-float32")
        b16 = ROOT / f"{kind}-bfloat16" / "analysis.json"
        if not b16.exists():
            continue
        a, b = (json.loads(p.read_text())["summary"] for p in (f32, b16))
        for k, v in a.items():
            w = b.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not isinstance(w, (int, float)):
                if not isinstance(v, (list, dict)):
                    rows.append({"analysis": kind, "quantity": k, "float32": v, "bfloat16": w, "abs_diff": "",
                                 "rel_diff": "", "same": v == w})
                continue
            d = abs(v - w)
            rows.append({"analysis": kind, "quantity": k, "float32": v, "bfloat16": w, "abs_diff": round(d, 6),
                         "rel_diff": round(d / abs(v), 6) if v else "", "same": v == w})
    # the tables that carry an analysis's result beyond its summary: intervene's loss and sink rate per
    # intervention, attention's entropy per shown head
    for kind, table, key, cols in (("intervene", "interventions.csv", ("intervention",),
                                    ("sink_rate_pos0", "top_sink_position_after", "loss", "loss_change")),
                                   ("attention", "entropy.csv", ("layer", "head"), ("attention_entropy",))):
        fa, fb = ROOT / f"{kind}-float32" / table, ROOT / f"{kind}-bfloat16" / table
        if not (fa.exists() and fb.exists()):
            continue
        ta, tb = (list(csv.DictReader(open(f))) for f in (fa, fb))
        for ra, rb in zip(ta, tb):
            assert all(ra[k] == rb[k] for k in key), (ra, rb)
            for c in cols:
                v, w = float(ra[c]), float(rb[c])
                d = abs(v - w)
                rows.append({"analysis": kind, "quantity": f"{'/'.join(ra[k] for k in key)}: {c}", "float32": v,
                             "bfloat16": w, "abs_diff": round(d, 6), "rel_diff": round(d / abs(v), 6) if v else "",
                             "same": v == w})
    bundle = {p.parent.name: json.loads(p.read_text()) for p in sorted(ROOT.glob("*-*/analysis.json"))}
    (ROOT / "analyses.json").write_text(json.dumps(bundle, indent=1))
    with open(ROOT / "compare.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
