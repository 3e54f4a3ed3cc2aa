"""Summary table and plot of one sweep folder (written by ``sinklab sweep``, read by ``sinklab report``).

One row per point (:data:`COLUMNS`):

* ``val_loss`` -- validation loss (nats/token) at the last step.
* ``sink1``, ``sink1_lo``, ``sink1_hi`` -- Sink_1 (percent, eps of the run's tracker) at the last
  step with its 95% bootstrap CI over probe samples, recomputed from the saved ``final/`` model on
  the run's own probe set with :func:`sinklab.capture.collect` + :func:`sinklab.metrics.summarize`.
* ``renormalised`` -- the operation's rows do not sum to 1 and were renormalised for ``sink1``
  (as the paper's code does); ``sink1_raw`` (CI ``sink1_raw_lo``/``_hi``) is then the same metric
  on the raw weights (DESIGN.md: report both). Equal to ``sink1`` for normalised operations.
* ``mass1`` -- mean attention mass on token 1 over layers, heads, probe samples and queries (a
  continuous companion of Sink_1, useful when Sink_1 saturates), from the tracker's last record.
* ``top_sink_position`` -- the position (1-based, as in the paper) with the highest sink rate;
  it "moved" when it is not 1.
* ``top_sink_rate`` -- the sink rate at that position.
* ``max_norm_ratio`` -- the largest hidden-state norm ratio ``||h_k|| / mean_t ||h_t||`` over positions.
* ``emergence_step`` -- the first tracked step at which Sink_1 reached the emergence level.
* ``wall_s`` -- wall time of the training (all starts together), seconds.
* ``paper``, ``expect``, ``verdict`` -- the paper's Sink_1 for this setting, its direction and our
  verdict (:mod:`sinklab.sweep.verdict`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from sinklab.sweep.verdict import verdict

COLUMNS = ["label", "status", "val_loss", "sink1", "sink1_lo", "sink1_hi", "renormalised", "sink1_raw", "sink1_raw_lo",
           "sink1_raw_hi", "mass1", "top_sink_position", "top_sink_rate",
           "max_norm_ratio", "emergence_step", "steps", "tokens", "wall_s", "paper", "expect", "verdict"]


def final_ci(run: Path) -> dict[str, Any]:
    """Sink metrics of ``run/final`` on the run's probe set, with bootstrap CIs (cached in ``run/final_ci.json``).

    Returns {"sink_rate": [K], "sink_rate_ci": [[lo, hi] x K], "top_sink_position": 1-based, ...}.
    """
    cache = run / "final_ci.json"
    if cache.exists():
        return json.loads(cache.read_text())
    import torch

    from sinklab.capture import collect
    from sinklab.data.packing import make_packer
    from sinklab.data.probe import probe_set
    from sinklab.metrics import summarize
    from sinklab.nn.model import SinkLM
    from sinklab.train.config import load_config
    from sinklab.train.loop import _packing_context, prepare_data

    cfg = load_config(run / "config.toml")
    tc = prepare_data(cfg, run)
    packer = make_packer(cfg.data.packing, _packing_context(cfg, tc))
    probe = probe_set(tc.val, packer, cfg.track.n_probe, cfg.track.probe_len, seed=cfg.track.seed)
    model = SinkLM.from_pretrained(run / "final")
    model.eval()
    from sinklab.nn.attention import raw_attention_weights

    with torch.no_grad():
        stats = collect(model, probe, batch_size=cfg.track.batch_size)
        with raw_attention_weights():
            raw_stats = collect(model, probe, batch_size=cfg.track.batch_size)
    s = summarize(stats, eps=cfg.track.eps, positions=cfg.track.positions, n_boot=1000)
    raw = summarize(raw_stats, eps=cfg.track.eps, positions=cfg.track.positions, n_boot=1000)
    has_sink = s["top_sink_rate"] > 0  # with no sink anywhere the arg-max position means nothing
    res = {"sink_rate": s["sink_rate"], "sink_rate_ci": s["sink_rate_ci"],
           "top_sink_position": int(s["top_sink_position"]) + 1 if has_sink else None,
           "top_sink_rate": s["top_sink_rate"] if has_sink else None,
           "max_norm_ratio": s["max_norm_ratio"], "renormalised": bool(s.get("renormalised")),
           "sink_rate_raw": raw["sink_rate"], "sink_rate_raw_ci": raw["sink_rate_ci"]}
    cache.write_text(json.dumps(res, indent=1))
    return res


def run_row(run: Path, point: dict[str, Any]) -> dict[str, Any]:
    """One summary row for the run folder ``run`` of study point ``point`` (a dict from study.json)."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(label=point["label"], paper=point.get("paper"), expect=point.get("expect", ""))
    rec = json.loads((run / "sweep.json").read_text()) if (run / "sweep.json").exists() else {}
    row["wall_s"] = rec.get("wall_s")
    s_path = run / "summary.json"
    if not s_path.exists():
        row["status"] = "unfinished" if run.exists() else "not started"
        return row
    s = json.loads(s_path.read_text())
    fin = s.get("final") or {}
    row.update(status="done", val_loss=fin.get("val_loss"), emergence_step=s.get("emergence_step"),
               steps=s.get("steps"), tokens=s.get("tokens"), mass1=fin.get("attention_mass_first"))
    try:
        ci = final_ci(run)
        row["sink1"] = ci["sink_rate"][0]
        row["sink1_lo"], row["sink1_hi"] = ci["sink_rate_ci"][0]
        row["top_sink_position"] = ci["top_sink_position"]
        row["top_sink_rate"] = ci["top_sink_rate"]
        row["max_norm_ratio"] = ci["max_norm_ratio"]
        row["renormalised"] = ci["renormalised"]
        row["sink1_raw"] = ci["sink_rate_raw"][0]
        row["sink1_raw_lo"], row["sink1_raw_hi"] = ci["sink_rate_raw_ci"][0]
    except Exception as e:  # noqa: BLE001 - fall back to the tracker's last record, say so
        row["sink1"] = (fin.get("sink_rate") or [None])[0]
        row["top_sink_position"] = None if fin.get("top_sink_position") is None else fin["top_sink_position"] + 1
        row["max_norm_ratio"] = fin.get("max_norm_ratio")
        row["status"] = f"done (no CI: {type(e).__name__})"
    return row


def add_verdicts(rows: list[dict[str, Any]], level: float) -> list[dict[str, Any]]:
    """Fill the ``verdict`` column, comparing each row with the row whose expect is ``reference``."""
    ref = next((r for r in rows if r.get("expect") == "reference"), None)
    rs = None if ref is None else ref["sink1"]
    rci = None if ref is None or ref["sink1_lo"] is None else (ref["sink1_lo"], ref["sink1_hi"])
    for r in rows:
        ci = None if r["sink1_lo"] is None else (r["sink1_lo"], r["sink1_hi"])
        r["verdict"] = verdict(r.get("expect", ""), r["sink1"], ci, ref_sink=rs, ref_ci=rci, level=level)
    return rows


def summarize_sweep(out: str | Path, *, plot: bool = True) -> list[dict[str, Any]]:
    """Build ``summary.csv``, ``summary.md`` and ``sink_rate.png`` in the sweep folder ``out``; return the rows.

    Raises:
        InputError: ``out`` has no ``study.json`` (not a sweep folder).
    """
    from sinklab.errors import InputError

    out = Path(out)
    sj = out / "study.json"
    if not sj.exists():
        raise InputError(f"{out} is not a sweep folder (no study.json); run `sinklab sweep` first")
    study = json.loads(sj.read_text())
    level = _emerge_level(out, study)
    rows = [run_row(out / "runs" / p["slug"], p) for p in study["points"]]
    add_verdicts(rows, level)
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (out / "summary.md").write_text(markdown_table(rows, level) + "\n")
    if plot:
        plot_sweep(study, rows, out / "sink_rate.png", level)
    return rows


def _emerge_level(out: Path, study: dict) -> float:
    for p in study["points"]:
        s = out / "runs" / p["slug"] / "summary.json"
        if s.exists():
            return float(json.loads(s.read_text()).get("emerge_level", 10.0))
    return 10.0


def _f(v: Any, nd: int = 1) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def markdown_table(rows: list[dict[str, Any]], level: float = 10.0) -> str:
    """The summary rows as a Markdown table (Sink_1 with its CI, paper value and verdict).

    The top sink position (1-based) is in bold when it is not 1 and its sink rate reaches ``level``
    (the sink moved); below ``level`` it is shown plainly with its rate (no real sink anywhere)."""
    head = ("| setting | val loss | Sink_1 (%) [95% CI] | Sink_1 raw weights (%) | mass on token 1 | top sink pos. | max norm ratio | emerged at step "
            "| wall (s) | paper Sink_1 (%) | paper direction | verdict |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        if r["sink1"] is None:
            s1 = r["status"] or "–"
        elif r["sink1_lo"] is None:
            s1 = _f(r["sink1"])
        else:
            s1 = f"{_f(r['sink1'])} [{_f(r['sink1_lo'])}, {_f(r['sink1_hi'])}]"
        if r.get("renormalised") in (True, "True") and r.get("sink1_raw") is not None:
            raw = f"{_f(r['sink1_raw'])} [{_f(r['sink1_raw_lo'])}, {_f(r['sink1_raw_hi'])}]"
        else:
            raw = "same" if r["sink1"] is not None else "–"
        pos = r["top_sink_position"]
        if pos is None:
            pos_s = "–"
        elif pos == 1:
            pos_s = "1"
        elif (r["top_sink_rate"] or 0) >= level:
            pos_s = f"**{pos}** ({_f(r['top_sink_rate'])}%)"
        else:
            pos_s = f"none (max {_f(r['top_sink_rate'])}% at {pos})"
        lines.append(f"| {r['label']} | {_f(r['val_loss'], 3)} | {s1} | {raw} | {_f(r['mass1'], 3)} | {pos_s} | {_f(r['max_norm_ratio'], 2)} | "
                     f"{_f(r['emergence_step'])} | {_f(r['wall_s'], 0)} | {_f(r['paper'], 2)} | "
                     f"{r.get('expect') or '–'} | {r.get('verdict') or '–'} |")
    return "\n".join(lines)


def plot_sweep(study: dict, rows: list[dict[str, Any]], path: Path, level: float) -> None:
    """Sink_1 (with CI) against the swept value (numeric axis for a one-key grid, else categories);
    the paper's values as hollow markers on the same axis; the emergence level as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = study["points"]
    numeric = len(study.get("sweep_keys") or []) == 1 and all(
        isinstance(p.get("x"), (int, float)) and not isinstance(p.get("x"), bool) for p in pts)
    xs = [p["x"] for p in pts] if numeric else list(range(len(pts)))
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(pts) + 2), 3.6))
    ys = [r["sink1"] for r in rows]
    have = [i for i, y in enumerate(ys) if y is not None]
    if have:
        err = [[ys[i] - (rows[i]["sink1_lo"] if rows[i]["sink1_lo"] is not None else ys[i]) for i in have],
               [(rows[i]["sink1_hi"] if rows[i]["sink1_hi"] is not None else ys[i]) - ys[i] for i in have]]
        ax.errorbar([xs[i] for i in have], [ys[i] for i in have], yerr=err, fmt="o-" if numeric else "o",
                    capsize=3, label="sinklab (laptop scale)")
    pp = [i for i, r in enumerate(rows) if r["paper"] is not None]
    if pp:
        ax.plot([xs[i] for i in pp], [rows[i]["paper"] for i in pp], "s", mfc="none", color="C3",
                label="paper (60M, 5B tokens)")
    ax.axhline(level, ls="--", color="gray", lw=0.8, label=f"emergence level {level:g}%")
    if numeric:
        ax.set_xlabel(study["sweep_keys"][0])
        if study.get("x_log") and all(x > 0 for x in xs):
            ax.set_xscale("log")
    else:
        ax.set_xticks(xs, [p["label"] for p in pts], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("Sink_1 (%)")
    ax.set_ylim(-3, 103)
    ax.set_title(study.get("title") or study["name"])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
