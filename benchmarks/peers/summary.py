"""The peers' table (markdown) from the JSON files in benchmarks/results/peers/ (stdlib only):
perplexity overall and by 256-position chunk from ppl_*.json, cache bytes, decode latency from
latency_interleaved.json (ratios to sinklab, one interleaved run), and the kvpress order check.

    python benchmarks/peers/summary.py   -> prints the table, writes benchmarks/results/peers/summary.md
"""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "peers"


def main() -> None:
    lines = []
    rows = []
    for f in sorted(RESULTS.glob("ppl_*.json")):
        d = json.loads(f.read_text())
        if "configs" in d:  # sinklab_parallel_ppl.py: several configurations in one file
            for c in d["configs"]:
                rows.append((f"sinklab {c['name']} (parallel mode)", f.name, c["ppl"], c["ppl_by_chunk"], c["cache_bytes"]))
        else:
            rows.append((f"{d['peer']} {d['config']}", f.name, d["ppl"], d["ppl_by_chunk"], d.get("cache_bytes")))
    if rows:
        n = max(len(r[3]) for r in rows)
        lines.append("| configuration | file | ppl | " + " | ".join(f"chunk {i}" for i in range(n)) + " | cache bytes |")
        lines.append("|---|---|---|" + "---|" * n + "---|")
        for name, fn, ppl, chunks, nbytes in rows:
            cells = [f"{x:.2f}" if x is not None else "-" for x in chunks] + [""] * (n - len(chunks))
            lines.append(f"| {name} | {fn} | {ppl:.3f} | " + " | ".join(cells) + f" | {nbytes} |")
    lat = RESULTS / "latency_interleaved.json"
    if lat.exists():
        d = json.loads(lat.read_text())
        p = d["protocol"]
        lines += ["", f"Decode latency, one interleaved run ({p['rounds']} rounds x {p['block']} steps per peer, "
                      f"after a {p['prefill']}-token prefill; load average 1 min {min(d['load_average_1min_by_round']):.1f}"
                      f"-{max(d['load_average_1min_by_round']):.1f}), latency_interleaved.json:", "",
                  "| peer | time | median ms/token | mean ms/token | steps | median / sinklab's median | median of round ratios |",
                  "|---|---|---|---|---|---|---|"]
        for name, e in d["peers"].items():
            for k in ("cpu", "wall"):
                t = e[k]
                lines.append(f"| {name} | {k} | {t['ms_per_token_median']:.1f} | {t['ms_per_token_mean']:.1f} | {e['steps']} | "
                             f"{t.get('ratio_to_sinklab', float('nan')):.3f} | {t.get('round_ratio_median', float('nan')):.3f} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
