"""Issue 23's study: summarise results/compression/{policies,quant_4bit,quant_3bit,quant_2bit,passkey}/ into CSVs, two plots and the
markdown tables of results/compression/NOTES.md. The runs themselves: experiments/compression.sh.

    python experiments/compression.py                       # summaries, plots, tables (printed)
    python experiments/compression.py --best 3 --budget 128 # the 3 policies with the lowest perplexity there, comma-separated

Written, from the files only:
    policies_summary.csv  policy x budget: ppl, ppl on recompute's positions, ppl of the last chunk, cache bytes, ms/token
    quant_summary.csv     kv_bits x key_quant x sinks_full_precision (quant_4bit/, quant_3bit/, quant_2bit/): ppl, its ratio to the 16-bit cache, cache bytes
    passkey_summary.csv   configuration x depth: accuracy
    ppl_vs_budget.png     perplexity against budget, one line per policy (full cache and recompute as references)
    ppl_vs_bits.png       perplexity against kv bits, keys per token / per channel, with 0 / 1 / 4 lossless sinks
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent / "results" / "compression"
POLICY_ORDER = ["window", "sinks", "h2o", "tova", "sinks+h2o", "sinks+tova", "detected-sinks"]


def md(df: pd.DataFrame, digits: int = 2) -> str:
    """A markdown table of ``df`` with its index as the first columns (no tabulate needed)."""
    df = df.reset_index()
    cols = [str(c) for c in df.columns]

    def cell(v):
        return f"{v:.{digits}f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def load(name: str) -> dict | None:
    f = ROOT / name / ("passkey.json" if name == "passkey" else "stream.json")
    return json.loads(f.read_text()) if f.exists() else None


def load_quant() -> dict | None:
    """quant_4bit/, quant_3bit/ and quant_2bit/ (one call per width) as one file: their configurations, each
    tagged with the folder and command that made it; the 16-bit cache, evaluated by each, kept once
    (ValueError if two disagree)."""
    parts = [(n, d) for n in ("quant_4bit", "quant_3bit", "quant_2bit") if (d := load(n)) is not None]
    if not parts:
        return None
    merged, seen = dict(parts[0][1], configs=[]), {}
    for name, d in parts:
        for c in d["configs"]:
            if c["name"] in seen:
                if abs(seen[c["name"]]["ppl"] - c["ppl"]) > 1e-9 * c["ppl"]:
                    raise ValueError(f"{c['name']}: ppl {seen[c['name']]['ppl']} in one folder, {c['ppl']} in {name}")
                continue
            seen[c["name"]] = c = dict(c, folder=name, command=d["command"])
            merged["configs"].append(c)
    merged["command"] = " ; ".join(d["command"] for _, d in parts)
    return merged


def policies_table(d: dict) -> pd.DataFrame:
    rows = []
    for c in d["configs"]:
        last = next((p for p in reversed(c["ppl_by_chunk"]) if p is not None), None)
        rows.append({"config": c["name"], "policy": c.get("policy") or c["name"], "budget": c.get("budget"),
                     "n_sink": c["n_sink"], "ppl": c["ppl"], "ppl_matched": c["ppl_matched"], "ppl_last_chunk": last,
                     "cache_bytes": c["cache_bytes"], "state_bytes": c.get("state_bytes"),
                     "latency_ms_per_token": c["latency_ms_per_token"], "mode": c.get("mode"),
                     "attn_implementation": c.get("attn_implementation")})
    return pd.DataFrame(rows).astype({"budget": "Int64"})


def quant_table(d: dict) -> pd.DataFrame:
    df = policies_table(d)
    extra = pd.DataFrame([{"config": c["name"], "kv_bits": c.get("kv_bits", 16), "key_quant": c.get("key_quant"),
                           "sinks_full_precision": c.get("sinks_full_precision", 0),
                           "folder": c.get("folder")} for c in d["configs"]])
    df = df.merge(extra, on="config")
    base = df[(df["kv_bits"] == 16) & (df["policy"] == "sinks")]["ppl"]
    df["ppl_ratio_to_16bit"] = df["ppl"] / (float(base.iloc[0]) if len(base) else float("nan"))
    return df


def best(d: dict, n: int, budget: int) -> list[str]:
    df = policies_table(d)
    df = df[(df["budget"] == budget) & df["policy"].isin(POLICY_ORDER)]
    return list(df.sort_values("ppl")["policy"].head(n))


def plot_budget(df: pd.DataFrame, meta: dict, path: Path) -> None:
    """Left: every policy (log scale); right: the same without window, linear, to separate the rest."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    budgets = sorted(df["budget"].dropna().astype(int).unique())
    for ax, policies, log in ((axes[0], POLICY_ORDER, True), (axes[1], POLICY_ORDER[1:], False)):
        for i, p in enumerate(POLICY_ORDER):
            g = df[df["policy"] == p].sort_values("budget")
            if len(g) and p in policies:
                ax.plot(g["budget"].astype(int), g["ppl"], marker="o", ms=4, color=f"C{i}", label=p)
        for ref, style in (("full", "--"), ("recompute", ":")):
            r = df[df["policy"] == ref]
            if len(r):
                label = f"{ref} ({r['ppl'].iloc[0]:.1f})" if ref == "full" else \
                    f"recompute, window {meta.get('window')} ({r['ppl'].iloc[0]:.1f}, sampled positions)"
                ax.axhline(r["ppl"].iloc[0], color="0.4", ls=style, lw=1, label=label)
        ax.set_xscale("log", base=2)
        if log:
            ax.set_yscale("log")
        ax.set_xticks(budgets)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("budget: tokens kept per layer")
        ax.set_ylabel(f"perplexity over {meta['tokens']} tokens")
        ax.grid(alpha=0.3, which="both")
    axes[0].set_title("every policy (log scale)", fontsize=9)
    h, lab = axes[0].get_legend_handles_labels()  # the other policies are named in the right panel
    keep = [i for i, t in enumerate(lab) if t == "window" or t.startswith(("full", "recompute"))]
    axes[0].legend([h[i] for i in keep], [lab[i] for i in keep], fontsize=8, loc="upper right")
    axes[1].set_title("without window (linear scale)", fontsize=9)
    axes[1].legend(fontsize=8)
    fig.suptitle(f"{meta['model']} · {meta['corpus']} · {meta['tokens']} tokens · cache policies at equal budget",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bits(df: pd.DataFrame, meta: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = df[df["kv_bits"] < 16]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"token": "-", "channel": "--"}
    for kq in ("token", "channel"):
        for fp, color in zip((0, 1, 4), ("C3", "C1", "C2")):
            g = q[(q["key_quant"] == kq) & (q["sinks_full_precision"] == fp)].sort_values("kv_bits")
            if len(g):
                ax.plot(g["kv_bits"], g["ppl"], styles[kq], marker="o", ms=4, color=color,
                        label=f"keys per {kq}, {fp} lossless sink{'s' if fp != 1 else ''}")
    base = df[(df["kv_bits"] == 16) & (df["policy"] == "sinks")]
    if len(base):
        ax.axhline(base["ppl"].iloc[0], color="0.3", lw=1, label=f"unquantised sinks cache ({base['ppl'].iloc[0]:.2f})")
    ax.set_yscale("log")
    ax.set_xticks(sorted(q["kv_bits"].unique()))
    ax.set_xlabel("kv bits (values per token; groups of %s)" % meta.get("kv_group", 32))
    ax.set_ylabel(f"perplexity over {meta['tokens']} tokens")
    budget = base["budget"].iloc[0] if len(base) else "?"
    ax.set_title(f"{meta['model']} · {meta['corpus']} · {meta['tokens']} tokens · sinks cache, budget {budget}", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--best", type=int, help="print the N policies with the lowest perplexity at --budget")
    ap.add_argument("--budget", type=int, default=128)
    args = ap.parse_args()
    pol = load("policies")
    if args.best:
        if pol is None:
            sys.exit("results/compression/policies/stream.json is missing: run the first step of compression.sh "
                     "(or unpack the committed runs: tar xzf single_stream_runs.tar.gz in results/compression/)")
        print(",".join(best(pol, args.best, args.budget)))  # a comma list, as sinklab stream --policy takes it
        return
    fmt = {"float_format": "%.4g", "index": False}
    if pol is not None:
        df = policies_table(pol)
        df.to_csv(ROOT / "policies_summary.csv", **fmt)
        plot_budget(df, pol, ROOT / "ppl_vs_budget.png")
        wide = df[df["policy"].isin(POLICY_ORDER)].pivot_table(index="policy", columns="budget", values="ppl")
        print(f"## perplexity, {pol['tokens']} tokens ({pol['command']})\n")
        print(wide.reindex([p for p in POLICY_ORDER if p in wide.index]).pipe(md))
        print()
        for ref in ("full", "recompute"):
            r = df[df["policy"] == ref]
            if len(r):
                print(f"{ref}: ppl {r['ppl'].iloc[0]:.2f}, on recompute's positions {r['ppl_matched'].iloc[0]:.2f}")
        print()
    qd = load_quant()
    if qd is not None:
        df = quant_table(qd)
        df.to_csv(ROOT / "quant_summary.csv", **fmt)
        plot_bits(df, qd, ROOT / "ppl_vs_bits.png")
        q = df[df["kv_bits"] < 16]
        wide = q.pivot_table(index=["key_quant", "kv_bits"], columns="sinks_full_precision", values="ppl")
        wide.columns = [f"ppl, {c} lossless" for c in wide.columns]
        mem = q.groupby(["key_quant", "kv_bits"])["cache_bytes"].max() / 2**20
        wide["cache MiB (4 lossless)"] = mem
        print(f"## quantised sinks cache, {qd['tokens']} tokens ({qd['command']})\n")
        print(wide.sort_index(level=[0, 1], ascending=[False, False]).pipe(md, 3))
        b = df[(df["kv_bits"] == 16) & (df["policy"] == "sinks")]
        if len(b):
            print(f"\n16-bit sinks cache: ppl {b['ppl'].iloc[0]:.3f}, {b['cache_bytes'].iloc[0] / 2**20:.3f} MiB")
        print()
    pk = load("passkey")
    if pk is not None:
        rows = [{"config": c["name"], "depth": float(dep), "accuracy": a, "accuracy_all": c["accuracy"]}
                for c in pk["configs"] for dep, a in c["accuracy_by_depth"].items()]
        df = pd.DataFrame(rows)
        df.to_csv(ROOT / "passkey_summary.csv", **fmt)
        wide = df.pivot_table(index="config", columns="depth", values="accuracy")
        wide["all"] = df.groupby("config")["accuracy_all"].first()
        wide = wide.reindex([c["name"] for c in pk["configs"]])
        print(f"## pass key accuracy ({pk['command']})\n")
        print(wide.pipe(md))


if __name__ == "__main__":
    main()
