"""The objective study's per-run analysis (issue 14): for every run of results/archive/objective_9733642/runs/<row>/seed<k>
(made by ``sinklab sweep experiments/objective.toml``), on the run's own held-out windows:

* where the sink sits on clean text: the top sink position, its sink rate, the token there (BOS / EOS / text),
  Sink_1, the hidden-state and key norms of position 0 (BOS) and of the top sink against the other positions,
  the largest activation over the median (median over samples, at the layer where it is largest) with the
  channel and position that hold it most often and how often;
* when it emerged: the first tracked step whose Sink_1 reached 10% (summary.json), and the Sink_1 curve;
* what removing it costs: ``sinklab.analyze.intervene`` with attention to position 0 (BOS) removed in every
  layer (``--only noop,remove-sink --position 0``, allowed where BOS is no sink) -- the next-token loss for a
  causal run, the masked diffusion loss (probe masked as in training) for a diffusion run;
* for diffusion runs, ``sinklab.analyze.denoise`` (16 steps, prompt 16, 48 generated tokens).

Writes results/archive/objective_9733642/analysis/{runs.csv, summary.csv, comparison.png, <row>/seed<k>/{intervene,denoise}/}.
Run from the repository root after the sweep:  python experiments/archive/objective_analysis.py [--num-samples 64]
"""
from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

import pandas as pd
import torch

from sinklab.analyze import denoise, intervene, resolve_subject
from sinklab.analyze.common import position_norm_ratio, run_model
from sinklab.metrics import sink_rate
from sinklab.provenance import code_version

ROOT = Path(__file__).resolve().parents[2] / "results" / "archive" / "objective_9733642"


def token_kind(tok, ids: torch.Tensor) -> list[str]:
    out = []
    for i in ids.tolist():
        out.append("BOS" if i == tok.bos_token_id else "EOS" if i == tok.eos_token_id else
                   "mask" if i == getattr(tok, "mask_token_id", None) else "text")
    return out


def analyse(run: Path, n: int, out: Path) -> dict:
    cfg = tomllib.loads((run / "config.toml").read_text())
    s = json.loads((run / "summary.json").read_text())
    objective = cfg["train"].get("objective", "causal")
    subj = resolve_subject(str(run), num_samples=n, seq_len=cfg["track"]["probe_len"], seed=0)
    st = run_model(subj.model, subj.input_ids).stats
    rate = sink_rate(st.mass, 0.3)
    top = int(rate.argmax())
    kinds = token_kind(subj.tokenizer, subj.input_ids[:, top])
    top_kind = max(set(kinds), key=kinds.count)
    row = {
        "row": run.parent.name, "seed": int(run.name[4:]), "objective": objective, "steps": s["steps"],
        "val_loss": s["final"]["val_loss"], "unigram_loss": s["unigram_loss"],
        "sink1_final": s["final"]["sink_rate"][0], "emergence_step": s["emergence_step"],
        "top_sink_position": top, "top_sink_rate": float(rate[top]), "top_sink_token": top_kind,
        "top_sink_token_share": kinds.count(top_kind) / len(kinds),
        "sink1_probe": float(rate[0]), "mass1": float(st.mass[..., 0].mean()),
        "hidden_norm_ratio_pos0": position_norm_ratio(st.hidden_norms, 0),
        "key_norm_ratio_pos0": position_norm_ratio(st.key_norms, 0),
        "hidden_norm_ratio_top": position_norm_ratio(st.hidden_norms, top),
        "key_norm_ratio_top": position_norm_ratio(st.key_norms, top),
    }
    ratio = st.max_abs / st.median_abs  # (N, L): largest |h| over the median |h| of each layer's output
    layer = int(ratio.median(dim=0).values.argmax())  # the layer with the largest median ratio
    pos, chan = st.max_position[:, layer], st.max_channel[:, layer]
    row.update({"massive_ratio_max": float(ratio[:, layer].median()), "massive_layer": layer,
                "massive_channel": int(torch.mode(chan).values), "massive_channel_share": float((chan == torch.mode(chan).values).double().mean()),
                "massive_position": int(torch.mode(pos).values), "massive_position_share": float((pos == torch.mode(pos).values).double().mean())})
    iv = intervene(subj, only=["noop", "remove-sink"], position=0, allow_non_sink=True)
    iv.save(out / "intervene")
    t = iv.tables["interventions"].set_index("intervention")
    assert t.loc["noop", "loss_change"] == 0.0
    row.update({"loss": t.loc["baseline", "loss"], "remove_bos_loss_change": t.loc["remove-sink", "loss_change"],
                "remove_bos_top_after": int(t.loc["remove-sink", "top_sink_position_after"]),
                "readout": iv.summary["readout"]})
    if objective == "masked_diffusion":
        d = denoise(subj, steps=16, prompt_len=16)
        d.save(out / "denoise")
        steps = d.tables["steps"]
        row.update({"denoise_steps_with_sink": d.summary["steps_with_sink"],
                    "denoise_top_positions": ";".join(str(x) for x in d.summary["top_sink_positions"]),
                    "denoise_top_rate_max": float(steps["top_sink_rate"].max()),
                    "denoise_mass_mask_step0": float(steps["mass_mask"].iloc[0]),
                    "denoise_mask_key_share_step0": float(steps["mask_key_share"].iloc[0]),
                    "denoise_mass_bos_step0": float(steps["mass_bos"].iloc[0]),
                    "denoise_mass_bos_last": float(steps["mass_bos"].iloc[-1])})
    return row


def curves(run: Path) -> pd.DataFrame:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return pd.DataFrame([{"step": r["step"], "sink1": r["sink_rate"][0], "val_loss": r["val_loss"],
                          "max_norm_ratio": r["max_norm_ratio"]} for r in recs if "sink_rate" in r])


def plot(df: pd.DataFrame, runs: list[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(dict.fromkeys(df["row"]))
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    for i, r in enumerate(rows):
        for run in [p for p in runs if p.parent.name == r]:
            c = curves(run)
            ax[0, 0].plot(c["step"], c["sink1"], color=f"C{i}", alpha=0.7, label=r if run.name == "seed0" else None)
    ax[0, 0].set_xlabel("training step")
    ax[0, 0].set_ylabel("Sink_1 (%) on clean held-out text")
    ax[0, 0].set_title("sink on token 1 during training (each line a seed)")
    ax[0, 0].legend(fontsize=8)
    x = range(len(rows))
    for j, (col, lab) in enumerate((("hidden_norm_ratio_pos0", "hidden norm"), ("key_norm_ratio_pos0", "key norm"))):
        g = df.groupby("row", sort=False)[col]
        ax[0, 1].bar([k + 0.4 * j - 0.2 for k in x], g.mean(), 0.4, yerr=g.std(), label=lab)
        for k, r in enumerate(rows):
            v = df.loc[df["row"] == r, col]
            ax[0, 1].plot([k + 0.4 * j - 0.2] * len(v), v, "k.", ms=4)
    ax[0, 1].axhline(1, color="gray", lw=0.8)
    ax[0, 1].set_xticks(list(x), rows, fontsize=8)
    ax[0, 1].set_ylabel("position 0 / other positions")
    ax[0, 1].set_title("norms of the first token (BOS)")
    ax[0, 1].legend(fontsize=8)
    g = df.groupby("row", sort=False)["remove_bos_loss_change"]
    ax[1, 0].bar(list(x), g.mean(), yerr=g.std(), color=[f"C{k}" for k in x])
    for k, r in enumerate(rows):
        v = df.loc[df["row"] == r, "remove_bos_loss_change"]
        ax[1, 0].plot([k] * len(v), v, "k.", ms=4)
    ax[1, 0].set_xticks(list(x), rows, fontsize=8)
    ax[1, 0].set_ylabel("loss change (nats/token)")
    ax[1, 0].set_title("removing attention to position 0 in every layer")
    for i, r in enumerate(rows):
        for p in sorted((out / r).glob("seed*/denoise/steps.csv")):
            st = pd.read_csv(p)
            ax[1, 1].plot(st["step"], st["mass_bos"], color=f"C{i}", alpha=0.7, label=f"{r}: mass on BOS" if p.parent.parent.name == "seed0" else None)
            ax[1, 1].plot(st["step"], st["mass_mask"], color=f"C{i}", ls=":", alpha=0.7, label=f"{r}: mass on all mask keys" if p.parent.parent.name == "seed0" else None)
            ax[1, 1].plot(st["step"], st["mask_key_share"], color="gray", lw=0.6, alpha=0.5)
    ax[1, 1].set_xlabel("denoising step (0 = 48 of 64 tokens masked)")
    ax[1, 1].set_ylabel("attention mass (gray: share of keys that are masks)")
    ax[1, 1].set_title("diffusion runs: where attention goes while denoising")
    ax[1, 1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "comparison.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-samples", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = ROOT / "analysis"
    runs = sorted(p for p in ROOT.glob("runs/*/seed*") if (p / "summary.json").exists())
    rows = []
    for run in runs:
        print(f"{run.parent.name}/{run.name}", file=sys.stderr)
        rows.append(analyse(run, a.num_samples, out / run.parent.name / run.name))
    df = pd.DataFrame(rows)
    df.to_csv(out / "runs.csv", index=False)
    cols = ["val_loss", "sink1_final", "sink1_probe", "mass1", "top_sink_rate", "hidden_norm_ratio_pos0",
            "key_norm_ratio_pos0", "massive_ratio_max", "loss", "remove_bos_loss_change"]
    agg = df.groupby("row", sort=False)[cols].agg(["mean", "std"])
    agg.columns = [f"{c}_{s}" for c, s in agg.columns]
    agg["n_seeds"] = df.groupby("row", sort=False).size()
    agg["emergence_steps"] = df.groupby("row", sort=False)["emergence_step"].apply(lambda v: ";".join(str(x) for x in v))
    agg["top_sink_positions"] = df.groupby("row", sort=False)["top_sink_position"].apply(lambda v: ";".join(map(str, v)))
    agg["top_sink_tokens"] = df.groupby("row", sort=False)["top_sink_token"].apply(lambda v: ";".join(v))
    agg.reset_index().to_csv(out / "summary.csv", index=False, float_format="%.6g")
    plot(df, runs, out)
    (out / "provenance.json").write_text(json.dumps({
        "command": "python experiments/archive/objective_analysis.py " + " ".join(sys.argv[1:]), "code": code_version(),
        "num_samples": a.num_samples, "probe": "each run's own held-out windows (the tracker's probe, seed 0)",
    }, indent=1))
    print(agg.reset_index().to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
