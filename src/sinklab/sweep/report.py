"""``sinklab report``: gather finished sweeps into one Markdown report.

For every sweep folder under the results root (a folder holding ``study.json``) with at least one
finished run, in the order of
the paper's sections, the report has: the study title, what was swept and the base config, its
summary table (our Sink_1 with 95% CI beside the paper's value, the paper's direction and the
verdict per row), its plot, and any dynamics plots found in the folder (``*dynamics*.png``).
A headline table at the top lists every finished row that carries a paper expectation; a
hand-written ``NOTES.md`` in the results root, when present, is placed above it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sinklab.errors import InputError
from sinklab.fileio import read_json, reading
from sinklab.sweep.summary import markdown_table, mean_std, seed_values, summarize_sweep

SECTION_ORDER = ["regime", "optimisation", "data", "loss", "architecture", "attention", "positional"]


#: sub-folder of the results root holding superseded studies (older code, one seed): not reported
ARCHIVE = "archive"


def find_sweeps(root: Path) -> list[Path]:
    """Sweep folders (holding ``study.json``) under ``root``, sorted by paper section then name;
    folders under ``root/archive/`` are left out."""
    found = sorted(p.parent for p in root.rglob("study.json") if ARCHIVE not in p.relative_to(root).parts[:-1])

    def key(p: Path):
        sec = read_json(p / "study.json", "study record").get("section", "")
        return (SECTION_ORDER.index(sec) if sec in SECTION_ORDER else len(SECTION_ORDER), p.name)

    return sorted(found, key=key)


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start).replace(os.sep, "/")


def stale_rows(root: str | Path) -> list[str]:
    """``study/label`` of every reported row whose ``summary.csv`` says it was not trained by the
    current code (``fingerprint_current`` False; run :func:`build_report` first)."""
    out = []
    for sw in find_sweeps(Path(root)):
        if not (sw / "summary.csv").exists():
            continue
        for r in _read_rows(sw):
            if int(r.get("n_seeds") or 0) and str(r.get("fingerprint_current")) != "True":
                how = f"; {r['fingerprint_check']}" if r.get("fingerprint_check") else ""
                out.append(f"{sw.name}/{r['label']} (fingerprint {r.get('code_fingerprint')}{how})")
    return out


def build_report(root: str | Path, out: str | Path, *, resummarize: bool = True, check: bool = True) -> str:
    """Write the report to ``out`` (Markdown) and return its text.

    Args:
        root: results folder holding the sweep folders.
        out: the report file (links to plots are relative to its folder).
        resummarize: rebuild every sweep's summary (tables, plot) first.
        check: compare every row's training-code fingerprint with the current code's
            (:func:`sinklab.sweep.summary.check_fingerprints`) and mark the rows that differ as stale.

    Raises:
        InputError: no sweep folder under ``root``.
    """
    root, out = Path(root), Path(out)
    sweeps = find_sweeps(root)
    if not sweeps:
        raise InputError(f"no sweep folders (with study.json) under {root}; run `sinklab sweep experiments/NAME.toml` first")
    base = out.parent
    parts: list[str] = []
    headline: list[tuple[str, dict[str, Any]]] = []
    for sw in sweeps:
        study = refresh_study_json(sw)
        rows = summarize_sweep(sw, check=check) if resummarize else _read_rows(sw)
        n_done = sum(1 for r in rows if str(r["status"]).startswith("done"))
        if n_done == 0:
            continue  # nothing finished yet: not part of the report
        title = study.get("title") or study["name"]
        parts.append(f"## {title}\n")
        commits = sorted({c for r in rows for c in (r.get("commits") or "").split(";") if c})
        sf = study_file(sw, study)
        meta = [f"Study file `{_rel(sf, base) if sf is not None else study['name']}`; "
                f"base config `{Path(study['base']).name if '/' in study['base'] else study['base']}`; "
                f"{n_done}/{len(rows)} points finished, up to {study.get('seeds', 1)} seeds each "
                f"(column *seeds*); "
                f"code {', '.join('`' + c + '`' for c in commits) or 'not recorded'}"
                + (" (**mixed code versions**)" if len(commits) > 1 else "") + "."]
        if study.get("sweep_keys"):
            meta.append(f"Swept: {', '.join('`' + k + '`' for k in study['sweep_keys'])}.")
        if study.get("paper_source"):
            meta.append(f"Paper values: {study['paper_source']}.")
        parts.append(" ".join(meta) + "\n")
        if study.get("note"):
            parts.append(study["note"].strip() + "\n")
        parts.append(markdown_table(rows, _level(sw)) + "\n")
        if (sw / "sink_rate.png").exists():
            parts.append(f"![{title}: Sink_1]({_rel(sw / 'sink_rate.png', base)})\n")
        for png in sorted(sw.glob("*dynamics*.png")):
            parts.append(f"![{title}: dynamics]({_rel(png, base)})\n")
        for r in rows:
            if r.get("expect") and r.get("n_seeds"):
                headline.append((title, r))
    head = ["# sinklab: when the attention sink emerges, at laptop scale\n",
            "Generated by `sinklab report`. Sink_1 is the paper's sink rate (eps = 0.3) on the held-out probe of "
            "each run, averaged over the tracker's evaluations in the last 20% of training (for operations whose "
            "rows do not sum to 1, on the paper's proxy scores |w| / sum |w|; *raw* on the raw weights of the "
            "final model); a row about another position reports that position's rate (Sink_p). Each row gives "
            "the mean ± std over training seeds with the two-sided 95% Student-t interval, the per-seed values, "
            "and the effect size: the difference from the study's reference row in percentage points with its "
            "Welch 95% interval. *Sink_1 visible* is the mask-aware variant (mean over the queries the training "
            "mask lets see token 1); *Sink** is the share of heads whose attention to a virtual key exceeds eps. "
            "Verdicts (`sinklab.sweep.verdict`): one test per row (one-sample t against the 10% level for "
            "sink / no sink, Welch's t for higher / lower, TOST within 10 points for similar), p-values "
            "Holm-adjusted over the study's rows; *agrees* / *disagrees* when the adjusted p is below 0.05 with "
            "the estimate on / against the claim's side, *inconclusive* otherwise; a row whose validation loss "
            "is above the unigram baseline is *degenerate* and gets no test. *expected (by)* says whose "
            "expectation it is: the paper's (with its table, `../shared/paper_tables.md`) or ours (a "
            "hypothesis). Every row's training-code fingerprint is checked against the current code's; a "
            "row trained by other numerics is marked **stale**.\n"]
    notes = root / "NOTES.md"
    if notes.exists():  # hand-written findings kept beside the sweeps
        with reading(notes, "notes file"):
            head.append(notes.read_text(encoding="utf-8").strip() + "\n")
    if headline:
        head.append("## Headline\n")
        head.append("| study | setting | seeds | ours: Sink (%) mean ± std [95% CI] | per seed | paper (%) (table) "
                    "| effect vs ref. (points) [95% CI] | expected (by) | p (Holm) | verdict |")
        head.append("|---|---|---|---|---|---|---|---|---|---|")
        for title, r in headline:
            pv = "–" if r["paper"] in (None, "") else f"{float(r['paper']):g}"
            if r.get("table"):
                pv += f" ({r['table']})"
            key = "sink1_visible" if r.get("metric") == "sink1_visible" else "sink1"
            seeds = ", ".join(f"{v:.1f}" for v in seed_values(r, key))
            ci = "" if r.get("ci_lo") in (None, "") else f" [{float(r['ci_lo']):.1f}, {float(r['ci_hi']):.1f}]"
            ours = mean_std(r, key) + ci + (" ¹" if key == "sink1_visible" else "")
            sp = r.get("sink_position")
            label = r["label"] + (f" (Sink_{sp})" if sp not in (None, "", 1, "1") else "")
            eff = ("–" if r.get("effect") in (None, "") else f"{float(r['effect']):+.1f}"
                   + ("" if r.get("effect_lo") in (None, "") else f" [{float(r['effect_lo']):+.1f}, {float(r['effect_hi']):+.1f}]"))
            pa = "–" if r.get("p_holm") in (None, "") else f"{float(r['p_holm']):.3g}"
            v = (r.get("verdict") or "–") + (" (mixed code)" if r.get("code_mixed") in (True, "True") else "")
            if str(r.get("fingerprint_current")) == "False":
                v += " **(stale)**"
            head.append(f"| {title} | {label} | {r['n_seeds']} | {ours} | {seeds} | {pv} | {eff} "
                        f"| {r['expect']} ({r.get('expect_by') or '–'}) | {pa} | {v} |")
        head.append("\n¹ verdict on the mask-aware Sink_1.\n")
        head.append("")
    if not parts:
        raise InputError(f"no finished runs in the sweeps under {root}")
    text = "\n".join(head) + "\n" + "\n".join(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text


def study_file(sw: Path, study: dict[str, Any]) -> Path | None:
    """The study file of sweep folder ``sw``: ``study["path"]`` relative to ``sw`` (absolute paths of
    older sweeps are used as they are), or None."""
    path = study.get("path")
    if not path:
        return None
    p = Path(path)
    return p if p.is_absolute() else (sw / p).resolve()


def refresh_study_json(sw: Path) -> dict[str, Any]:
    """Re-read the sweep's study file when it still exists, so a note, a paper value or an
    expectation edited after the runs shows up in the report (points are matched by folder name;
    runs are not affected). Returns the (updated) study dict, also written to ``study.json``."""
    from sinklab.errors import SinklabError
    from sinklab.sweep.spec import load_study

    study = read_json(sw / "study.json", "study record")
    path = study_file(sw, study)
    if path is None or not path.exists():
        return study
    try:
        new = load_study(path)
    except SinklabError:
        return study
    study.update(title=new.title, note=new.note, paper_source=new.paper_source, section=new.section, metric=new.metric)
    by_slug = {p.slug: p for p in new.points}
    for p in study["points"]:
        if p["slug"] in by_slug:
            q = by_slug[p["slug"]]
            p["paper"], p["expect"], p["table"], p["by"] = q.paper, q.expect, q.table, q.by
    (sw / "study.json").write_text(json.dumps(study, indent=1, default=str))
    return study


def _level(sw: Path) -> float:
    from sinklab.sweep.summary import _emerge_level

    return _emerge_level(sw, read_json(sw / "study.json", "study record"))


def _read_rows(sw: Path) -> list[dict[str, Any]]:
    import csv

    def conv(v: str) -> Any:
        if v == "":
            return None
        try:
            f = float(v)
            return int(f) if f.is_integer() and "." not in v else f
        except ValueError:
            return v

    with open(sw / "summary.csv") as f:
        return [{k: (v if k in ("label", "status", "expect", "verdict", "metric", "commits") or k.endswith("_seeds")
                     else conv(v)) for k, v in r.items()} for r in csv.DictReader(f)]
