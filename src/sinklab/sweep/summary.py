"""Summary table and plot of one sweep folder (written by ``sinklab sweep``, read by ``sinklab report``).

One row per point, aggregated over its training seeds (:data:`COLUMNS`). Per seed run:

* **Sink_1** is the mean of the tracker's Sink_1 over its evaluations in the last 20% of training
  (steps ``> 0.8 * steps``), which smooths the checkpoint-to-checkpoint flicker of small models;
  the last evaluation's value is kept too (``sink1_final_seeds``), and ``sink1_move`` is the largest
  within-run range (max - min) over those last-20% evaluations, across the seeds.
* the same last-20% mean for the mask-aware Sink_1 (``sink1_visible``: mean over the queries the
  training mask lets see token 1; equal to Sink_1 for plain causal attention), the attention mass
  on token 1 (``mass1``, ``mass1_visible``) and, for operations with a virtual key, the paper's
  ``Sink*`` (``sink_virtual``: share of heads whose attention to the virtual key exceeds eps).
* ``sink1_start``: for a fine-tuning run (``train.init_from``), Sink_1 of the starting model on the
  run's own probe (the tracker's step-0 evaluation); ``loss_spikes`` / ``grad_spikes`` count logged
  steps whose training loss is > 20% above (gradient norm > 3x) the median of the 10 logged steps
  before it, ``max_grad_norm`` the largest logged gradient norm
  (:func:`sinklab.sweep.dynamics.training_stability`).
* ``val_loss`` is the validation loss (nats/token) at the last step, and ``unigram_loss`` the loss of
  predicting the training unigram distribution; ``degenerate`` is True when the mean validation loss
  is above it (the model learned less than token frequencies: no verdict).

For each quantity X the row has ``X_mean``, ``X_std`` (sample std over seeds, ddof = 1; empty with
one seed) and ``X_seeds`` (the per-seed values, ``;``-separated, seed 0 first). Further columns:
``n_seeds``, ``renormalised`` and ``sink1_raw_mean`` (Sink_1 of the final models on raw,
not renormalised weights, for operations whose rows do not sum to 1), ``sink_token`` (the 1-based token k whose
Sink_k the row reports: 1 unless the point says ``token``), ``top_sink_token`` (the top sink as a 1-based token,
most common over seeds), ``max_norm_ratio_mean``, ``emergence_steps`` (per seed),
``wall_s`` (all seeds; ``load_1min``: the range over seeds of the 1-minute load average at the end of
each seed's last start, from ``sweep.json``: what the wall time was measured under), ``commits`` (the code versions that produced the seeds; ``code_mixed`` is
True when seeds of the row trained in one environment (CPU model, torch, threads) carry different training-code fingerprints (:func:`fingerprints_mixed`), or, for rows trained before
fingerprints existed, when its commits differ from the study's most common commit), ``code_fingerprint`` (the training-code
fingerprints of the seeds, :mod:`sinklab.train.fingerprint`; several, ``;``-separated, when the
seeds were trained by code with different numerics), ``torch_version``, ``threads``, and
``paper``, ``table`` (where in the paper), ``expect``, ``expect_by`` ("paper", or "ours" for our
hypothesis), ``cpu_model`` (the CPUs the seeds were trained on: runs are bit-identical only on one
CPU model, torch and thread count; across CPUs they agree statistically), ``fingerprint_check`` (how
``report --check`` decided that the row is current), ``metric`` (which Sink_1 the verdict uses: ``sink1`` or ``sink1_visible``).

Statistics (:mod:`sinklab.sweep.verdict`) on the verdict's metric: ``ci_lo``/``ci_hi`` the 95%
Student-t interval of the seed mean, ``effect`` the difference from the reference row (percentage
points) with its Welch 95% interval ``effect_lo``/``effect_hi``, ``p_value`` of the row's test and
``p_holm`` adjusted over the study's tested rows, and ``verdict``. ``seeds`` lists the training
seeds; ``diverged_steps`` the step at which each diverged seed stopped (``diverged.json``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from sinklab.fileio import atomic_write_text, read_json
from sinklab.sweep.dynamics import seed_runs
from sinklab.sweep.spec import point_token
from sinklab.sweep.verdict import (SIMILAR_MARGIN, decide, excludes_paper, holm, hypothesis_test, min_p, p_method,
                                   paper_effects, seed_stats, t_interval, welch)
from sinklab.sweep.verdict import EXCLUDES
from sinklab.sweep.store import runs_dir

#: quantities aggregated over seeds (each gives _mean, _std, _seeds columns)
SEEDED = ["sink1", "sink1_visible", "mass1", "mass1_visible", "sink_virtual", "val_loss", "sink1_start",
          "loss_spikes", "grad_spikes", "max_grad_norm"]
COLUMNS = (["label", "status", "n_seeds", "seeds", "sink_token"]
           + [f"{q}_{k}" for q in SEEDED for k in ("mean", "std", "seeds")]
           + ["ci_lo", "ci_hi", "effect", "effect_lo", "effect_hi",
              "heads_total", "sink_heads_seeds", "sink1_final_seeds", "sink1_move", "unigram_loss", "degenerate", "renormalised", "sink1_raw_mean",
              "top_sink_token", "max_norm_ratio_mean", "emergence_steps", "diverged_steps", "steps", "tokens",
              "wall_s", "load_1min", "commits", "code_mixed", "code_fingerprint", "fingerprint_current", "fingerprint_check", "torch_version", "threads", "cpu_model", "paper", "table",
              "expect", "expect_by", "metric", "p_method", "p_value", "p_holm", "p_min", "p_holm_min",
              "paper_effect", "paper_effect_scaled", "excludes_paper", "verdict"]
           + ["mass1_" + c for c in ("ci_lo", "ci_hi", "effect", "effect_lo", "effect_hi", "p_value", "p_holm",
                                    "p_min", "p_holm_min", "verdict")])
#: share of training (at the end) whose tracker evaluations are averaged into a run's Sink_1
LAST_FRACTION = 0.2


def final_ci(run: Path) -> dict[str, Any]:
    """Sink metrics of ``run/final`` on the run's probe set, with bootstrap CIs (cached in ``run/final_ci.json``).

    The probe runs under the run's training mask (prefix LM, sliding window).
    Returns {"sink_rate": [K], "sink_rate_ci": [[lo, hi] x K], "top_sink_token": the top sink as a 1-based token
    (None without a sink), ...}. A cache written before that key was renamed (``top_sink_position``, the same
    1-based number) is read under the new name.
    """
    cache = run / "final_ci.json"
    steps = read_json(run / "summary.json", "run summary").get("steps") if (run / "summary.json").exists() else None
    if cache.exists():
        cached = read_json(cache, "cached final metrics")
        # a run extended by more steps since has another final model (a cache written before run_steps: kept)
        if cached.get("run_steps", steps) == steps:
            if "top_sink_position" in cached:  # the same 1-based number under its name before the rename
                cached["top_sink_token"] = cached.pop("top_sink_position")
            return cached
    import torch

    from sinklab.capture import collect
    from sinklab.metrics import summarize
    from sinklab.runs import Run, load_config

    the_run = Run(load_config(run / "config.toml"), run)
    cfg, probe, model = the_run.config, the_run.tracker_probe(), the_run.model

    with torch.no_grad():
        stats = collect(model, probe, batch_size=cfg.track.batch_size, prefix_len=cfg.train.prefix_len)
        raw_stats = collect(model, probe, batch_size=cfg.track.batch_size, prefix_len=cfg.train.prefix_len,
                            renormalise=False)
    s = summarize(stats, eps=cfg.track.eps, positions=cfg.track.positions, n_boot=1000)
    raw = summarize(raw_stats, eps=cfg.track.eps, positions=cfg.track.positions, n_boot=1000)
    has_sink = s["top_sink_rate"] > 0  # with no sink anywhere the arg-max position means nothing
    res = {"sink_rate": s["sink_rate"], "sink_rate_ci": s["sink_rate_ci"],
           "top_sink_token": int(s["top_sink_position"]) + 1 if has_sink else None,  # position (0-based) + 1
           "top_sink_rate": s["top_sink_rate"] if has_sink else None,
           "max_norm_ratio": s["max_norm_ratio"], "renormalised": bool(s.get("renormalised")),
           "sink_rate_raw": raw["sink_rate"], "sink_rate_raw_ci": raw["sink_rate_ci"], "run_steps": steps}
    atomic_write_text(cache, json.dumps(res, indent=1))
    return res


def run_metrics(run: Path, token: int = 1) -> dict[str, Any] | None:
    """Per-run values of a finished run (None when ``summary.json`` is missing).

    Keys: ``sink1``, ``sink1_visible``, ``mass1``, ``mass1_visible``, ``sink_virtual`` (last-20% means
    of the tracker, see the module docstring; ``sink_virtual`` None without a virtual key),
    ``sink1_final``, ``sink1_move``, ``val_loss``, ``unigram_loss``, ``emergence_step``, ``steps``,
    ``tokens``, ``commit``, ``seed``, ``code_fingerprint`` (None for runs trained before fingerprints
    existed; "mixed:A+B" when its starts were trained by code with different numerics),
    ``torch_version``, ``threads``, ``sink1_start`` (the tracker's step-0 value: a fine-tuning run's
    starting model on this run's probe; None otherwise), ``loss_spikes``, ``grad_spikes``,
    ``max_grad_norm`` (:func:`sinklab.sweep.dynamics.training_stability`). ``token`` (1-based): the token k whose sink rate the
    ``sink1*`` values are (a point's ``token``; the attention mass stays on token 1).
    """
    s_path = run / "summary.json"
    if not s_path.exists():
        return None
    from sinklab.sweep.dynamics import tracker_records, training_stability

    s = read_json(s_path, "run summary")
    steps = int(s.get("steps") or 0)
    recs = tracker_records(run)
    last = [r for r in recs if r["step"] > (1.0 - LAST_FRACTION) * steps] or recs[-1:]

    def mean(key: str, first: bool = False) -> float | None:
        vals = [(r[key][k] if first else r[key]) for r in last if r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None

    k = token - 1  # the row's sink position (0-based index into the tracker's sink_rate list)
    sink = [r["sink_rate"][k] for r in last]
    vis = mean("sink_rate_visible", True)
    mvis = mean("attention_mass_first_visible")
    fin = s.get("final") or recs[-1]
    code = s.get("code") or {}
    start = recs[0]["sink_rate"][k] if recs[0]["step"] == 0 else None  # fine-tuning runs measure step 0
    return {
        "sink1_start": start,
        **training_stability(run),
        "sink1": mean("sink_rate", True),
        "sink1_visible": vis if vis is not None else mean("sink_rate", True),
        "mass1": mean("attention_mass_first"),
        "mass1_visible": mvis if mvis is not None else mean("attention_mass_first"),
        "sink_virtual": mean("sink_rate_virtual"),
        "sink1_final": fin["sink_rate"][k],
        # the final mask-aware rates (tracked positions 1..K): a mask-aware study's sink heads and top position
        "sink1_visible_final": (fin.get("sink_rate_visible") or fin["sink_rate"])[k],
        "top_visible": _top(fin.get("sink_rate_visible") or fin["sink_rate"]),
        "sink1_move": max(sink) - min(sink),
        "val_loss": fin.get("val_loss"),
        "unigram_loss": s.get("unigram_loss"),
        "emergence_step": s.get("emergence_step"),
        "steps": steps,
        "tokens": s.get("tokens"),
        "commit": (code.get("commit") or "unknown")[:12] + ("+dirty" if code.get("dirty") else ""),
        "seed": s.get("seed"),
        # every start's fingerprint must agree for the run to have one
        "code_fingerprint": (s.get("code_fingerprint") if len(set(s.get("code_fingerprints") or [None])) <= 1
                             else "mixed:" + "+".join(dict.fromkeys(s["code_fingerprints"]))),
        "torch_version": s.get("torch_version"),
        "threads": s.get("threads"),
        "cpu_model": s.get("cpu_model"),
        "heads_total": _heads_total(run),
    }


def _heads_total(run: Path) -> int | None:
    """L * H (layers x query heads) of the run's model, from its ``config.toml`` (None without one)."""
    cfg = run / "config.toml"
    if not cfg.exists():
        return None
    from sinklab.fileio import read_toml

    model = read_toml(cfg, "run config").get("model", {})
    if "n_layers" not in model or "n_heads" not in model:
        return None
    return int(model["n_layers"]) * int(model["n_heads"])


def fingerprints_mixed(per: list[dict[str, Any]]) -> bool:
    """Whether seeds trained in one environment (CPU model, torch version, threads) carry different
    training-code fingerprints, i.e. were trained by code with different numerics.

    Seeds trained on different CPUs carry different fingerprints for the same code (their rounding
    differs; :mod:`sinklab.train.fingerprint`), so fingerprints are compared only within an
    environment; whether the code of each environment's seeds is the current code is what
    ``report --check`` decides (:func:`seed_is_current`).

    Args:
        per: one dict per finished seed, with ``code_fingerprint``, ``cpu_model``, ``torch_version``
            and ``threads`` (as :func:`run_metrics` returns).
    """
    groups: dict[tuple, set] = {}
    for m in per:
        env = (m.get("cpu_model"), m.get("torch_version"), m.get("threads"))
        groups.setdefault(env, set()).add(m.get("code_fingerprint") or "none")
    return any(len(fps) > 1 for fps in groups.values())


def _exact(v: float) -> str:
    """``v`` as the shortest string that reads back as the same float ("25" for 25.0): the per-seed columns
    are what the statistics read (:func:`seed_values`), so they are never rounded."""
    r = repr(float(v))
    return r[:-2] if r.endswith(".0") else r


def _join(vals: list[Any]) -> str:
    return ";".join("" if v is None else (_exact(v) if isinstance(v, float) else str(v)) for v in vals)


def _top(rates: list[float]) -> dict[str, Any]:
    """The top sink as a 1-based token (``top_sink_token``) of one rate list over the tracked positions, and its rate;
    None without a sink."""
    best = max(range(len(rates)), key=lambda j: (rates[j], -j))
    has = rates[best] > 0
    return {"top_sink_token": best + 1 if has else None, "top_sink_rate": rates[best] if has else None}


#: summary.csv columns renamed since (old name -> new name; the same 1-based numbers): a table written before
#: reads under the new names (:func:`current_names`)
RENAMED_COLUMNS = {"sink_position": "sink_token", "top_sink_position": "top_sink_token"}


def current_names(row: dict[str, Any]) -> dict[str, Any]:
    """A ``summary.csv`` row (a dict read from the file) under today's column names: an older file's
    ``sink_position`` / ``top_sink_position`` (1-based) become ``sink_token`` / ``top_sink_token``."""
    return {RENAMED_COLUMNS.get(k, k): v for k, v in row.items() if k not in RENAMED_COLUMNS or RENAMED_COLUMNS[k] not in row}


def point_row(point_folder: Path, point: dict[str, Any], metric: str = "paper") -> dict[str, Any]:
    """One summary row for a study point (``point``: a dict from study.json), over its seed runs."""
    row: dict[str, Any] = {c: None for c in COLUMNS}
    row.update(label=point["label"], paper=point.get("paper"), expect=point.get("expect", ""),
               metric="sink1_visible" if metric == "visible" else "sink1")
    runs = seed_runs(point_folder)
    diverged = [(r, read_json(r / "diverged.json", "divergence record")) for r in runs if (r / "diverged.json").exists()]
    if diverged:
        row["diverged_steps"] = _join([d["step"] for _, d in diverged])
    row["table"] = point.get("table") or None
    row["expect_by"] = (("paper" if point.get("paper") is not None or point.get("by") == "paper" else "ours")
                        if point.get("expect") else "")
    wall, loads = 0.0, []
    for r in runs:
        rec = r / "sweep.json"
        if rec.exists():
            sw = read_json(rec, "sweep record")
            wall += float(sw.get("wall_s") or 0.0)
            if sw.get("load_at_end"):
                loads.append(float(sw["load_at_end"][0]))
    row["wall_s"] = round(wall, 1) if runs else None
    row["load_1min"] = f"{min(loads):.2f}-{max(loads):.2f}" if loads else None
    token = point_token(point)
    row["sink_token"] = token
    per = [m for m in (run_metrics(r, token) for r in runs) if m is not None]
    done_runs = [r for r in runs if (r / "summary.json").exists()]
    div_note = (f"; {len(diverged)} of {len(runs)} seeds diverged (steps {row['diverged_steps'].replace(';', ', ')})"
                if diverged else "")
    if not per:
        if diverged and len(diverged) == len(runs):
            row["status"] = f"diverged: every seed ({len(runs)}), at steps {row['diverged_steps'].replace(';', ', ')}"
        else:
            row["status"] = ("unfinished" if runs or point_folder.exists() else "not started") + div_note
        row["n_seeds"] = 0
        return row
    row["status"] = ("done" if len(per) == len(runs) else f"done ({len(per)} of {len(runs)} seeds)") + div_note
    row["n_seeds"] = len(per)
    row["seeds"] = _join([m["seed"] for m in per])
    fps = [m["code_fingerprint"] or "none" for m in per]
    row["code_fingerprint"] = ";".join(dict.fromkeys(fps))
    row["torch_version"] = ";".join(dict.fromkeys(str(m["torch_version"]) for m in per))
    row["threads"] = ";".join(dict.fromkeys(str(m["threads"]) for m in per))
    row["cpu_model"] = ";".join(dict.fromkeys(str(m["cpu_model"]) for m in per))
    row["code_mixed"] = fingerprints_mixed(per)
    for q in SEEDED:
        vals = [m[q] for m in per if m[q] is not None]
        if not vals:
            continue
        mu, sd, _ = seed_stats(vals)
        row[f"{q}_mean"] = round(mu, 6)
        row[f"{q}_std"] = None if math.isnan(sd) else round(sd, 6)
        row[f"{q}_seeds"] = _join([m[q] for m in per])
    row["sink1_final_seeds"] = _join([m["sink1_final"] for m in per])
    heads = {m["heads_total"] for m in per}
    if len(heads) == 1 and None not in heads:
        # Sink_1 is a share of (sample, layer, head) triples: times L * H it is the number of sink
        # heads (an average over the probe's samples: whole numbers when a head is a sink on all or none)
        row["heads_total"] = heads.pop()
        final_key = "sink1_visible_final" if row["metric"] == "sink1_visible" else "sink1_final"
        row["sink_heads_seeds"] = _join([round(m[final_key] * row["heads_total"] / 100.0, 2) for m in per])
    row["sink1_move"] = round(max(m["sink1_move"] for m in per), 4)
    uni = [m["unigram_loss"] for m in per if m["unigram_loss"] is not None]
    row["unigram_loss"] = round(sum(uni) / len(uni), 6) if uni else None
    row["degenerate"] = bool(uni and row["val_loss_mean"] is not None and row["val_loss_mean"] > row["unigram_loss"])
    ems = [m["emergence_step"] for m in per]
    row["emergence_steps"] = _join(ems)
    row["steps"], row["tokens"] = per[0]["steps"], per[0]["tokens"]
    row["commits"] = ";".join(sorted({m["commit"] for m in per}))
    cis, failed = [], []
    for r in done_runs:
        try:
            cis.append(final_ci(r))
        except Exception as e:  # noqa: BLE001 - the tracker columns stand without it; say so, once, with why
            # (paths relative to the sweep folder: an unpacked archive's location is this machine's cache)
            msg = (str(e).splitlines()[0] if str(e) else "").replace(str(Path(r).parent.parent) + os.sep, "")
            failed.append(f"{type(e).__name__}: {msg}".rstrip(": "))
    if failed:
        row["status"] += f" (no final re-measure for {len(failed)} of {len(done_runs)} runs: {failed[0]})"
    if cis:
        row["renormalised"] = any(c["renormalised"] for c in cis)
        row["sink1_raw_mean"] = round(sum(c["sink_rate_raw"][token - 1] for c in cis) / len(cis), 4)
        row["top_sink_token"] = modal_top_token(cis)
        row["max_norm_ratio_mean"] = round(sum(c["max_norm_ratio"] for c in cis) / len(cis), 4)
    if row["metric"] == "sink1_visible":  # under a window the plain arg-max lands anywhere (its rates are capped at w/T)
        row["top_sink_token"] = modal_top_token([m["top_visible"] for m in per])
    return row


def modal_top_token(cis: list[dict[str, Any]]) -> int | None:
    """The row's top sink as a 1-based token (None: no sink): the token most seeds have as their top one
    (:func:`final_ci`'s ``top_sink_token``); a tie goes to the tied token whose seeds' top sink rates sum
    highest (then the lower token), not to whichever seed comes first."""
    counts = Counter(c["top_sink_token"] for c in cis)
    most = max(counts.values())
    tied = [p for p, n in counts.items() if n == most]

    def weight(p):
        return sum(c.get("top_sink_rate") or 0.0 for c in cis if c["top_sink_token"] == p)
    return max(tied, key=lambda p: (weight(p), -(p or 0)))


def seed_values(row: dict[str, Any], key: str) -> list[float]:
    """The per-seed values of ``key`` (e.g. ``sink1``) of a summary row, as floats."""
    raw = row.get(f"{key}_seeds")
    if raw in (None, ""):
        return []
    return [float(v) for v in str(raw).split(";") if v != ""]


def _r(v: float, nd: int = 4) -> float | None:
    return None if v is None or math.isnan(v) else round(v, nd)


#: the statistics columns of one endpoint (prefix "" for the verdict's Sink_1, "mass1_" for the mass on token 1)
STAT_COLUMNS = ("ci_lo", "ci_hi", "effect", "effect_lo", "effect_hi", "p_value", "p_holm", "p_min", "p_holm_min",
                "verdict")


def _endpoint(rows: list[dict[str, Any]], ref: dict[str, Any] | None, key: str, prefix: str, level: float,
              margin: float, paper: bool, untested: Callable[[dict[str, Any]], str | None] | None = None) -> None:
    """Fill the statistics columns ``prefix + STAT_COLUMNS`` of every row for the per-seed values of
    ``key`` (:mod:`sinklab.sweep.verdict`: t-interval, Welch effect against ``ref``, the row's exact
    test, Holm over the study's tested rows, the smallest attainable p and adjusted p, the verdict);
    with ``paper``, also ``paper_effect``, ``paper_effect_scaled`` and ``excludes_paper``. A row for which
    ``untested`` gives a reason keeps its interval and gets no effect, no p and that reason as its verdict (it is
    not in the Holm family); a ``ref`` with a reason is no reference."""
    tests, mins, excl = [], [], []
    if ref is not None and untested is not None and untested(ref):
        ref = None
    ref_vals = [] if ref is None else seed_values(ref, key)
    ref_mean = sum(ref_vals) / len(ref_vals) if ref_vals else None
    for r in rows:
        for c in STAT_COLUMNS:
            r[prefix + c] = None
        vals = seed_values(r, key)
        lo = hi = None
        if vals:
            _, lo, hi = t_interval(vals)
            r[prefix + "ci_lo"], r[prefix + "ci_hi"] = _r(lo), _r(hi)
        reason = untested(r) if untested is not None else None
        if reason:
            tests.append((math.nan, None, reason))
            mins.append(math.nan)
            excl.append(False)
            continue
        if vals and ref_vals and r is not ref:
            d = welch(vals, ref_vals)
            r[prefix + "effect"], r[prefix + "effect_lo"], r[prefix + "effect_hi"] = _r(d.d), _r(d.lo), _r(d.hi)
            lo, hi = d.lo, d.hi
        expect = r.get("expect", "")
        test = hypothesis_test(expect, vals, ref_values=ref_vals or None, level=level, margin=margin,
                               degenerate=bool(r.get("degenerate")), ref_degenerate=bool(ref and ref.get("degenerate")))
        tests.append(test)
        mins.append(min_p(expect, len(vals), len(ref_vals)) if test[2] is None else math.nan)
        exc = False
        if paper:
            has_paper = r.get("paper") not in (None, "") and r is not ref and r.get("expect_by") == "paper"
            ref_paper = None if ref is None or ref.get("paper") in (None, "") else float(ref["paper"])
            relative = ref_paper is not None and r.get(prefix + "effect") is not None
            effects = (paper_effects(float(r["paper"]), ref_paper if relative else None, ref_mean)
                       if has_paper else ())
            if effects and not relative:  # no paper reference: the row's own interval against the paper value
                lo, hi = r.get(prefix + "ci_lo"), r.get(prefix + "ci_hi")
            r["paper_effect"] = _r(effects[0]) if effects and relative else None
            r["paper_effect_scaled"] = _r(effects[1]) if len(effects) > 1 else None
            exc = excludes_paper(lo, hi, effects)
            r["excludes_paper"] = exc if effects and vals else None
        excl.append(exc)
    adjusted = holm([p if status is None else math.nan for p, _, status in tests])
    best = holm(mins)
    for r, (p, supports, status), pa, pm, pb, exc in zip(rows, tests, adjusted, mins, best, excl):
        r[prefix + "p_value"], r[prefix + "p_holm"] = _r(p, 6), _r(pa, 6)
        r[prefix + "p_min"], r[prefix + "p_holm_min"] = _r(pm, 6), _r(pb, 6)
        r[prefix + "verdict"] = decide(pa, supports, status, exc)
    if paper:
        for r in rows:
            r["p_method"] = (p_method(int(r["n_seeds"]), None if r.get("expect") in ("reference", "sink", "no_sink")
                                      else len(ref_vals)) if r.get("n_seeds") and r.get("p_value") is not None else None)


#: the mass co-endpoint's verdict of a row that reports Sink_k for k > 1 (the tracker's mass is on token 1)
MASS_NOT_TESTED = "not tested (mass on token 1, row on token {k})"


def _mass_untested(row: dict[str, Any]) -> str | None:
    """Why ``row`` is not tested on the mass on token 1 (None: it is): it reports Sink_k for k > 1."""
    k = int(row.get("sink_token") or 1)
    return MASS_NOT_TESTED.format(k=k) if k != 1 else None


def add_verdicts(rows: list[dict[str, Any]], level: float) -> list[dict[str, Any]]:
    """Fill the statistics columns of both endpoints and ``code_mixed`` (see the module docstring).

    Sink_1 (the study's metric): ``ci_lo``, ``ci_hi``, ``effect*`` against the row whose expect is
    ``reference``, ``p_value`` (the row's exact test, ``p_method``), ``p_holm`` over the study's tested
    rows, ``p_min`` / ``p_holm_min`` (the smallest p and adjusted p the row's seed counts allow),
    ``paper_effect`` / ``paper_effect_scaled`` / ``excludes_paper`` and ``verdict``; the co-endpoint
    attention mass on token 1 (``mass1``, or ``mass1_visible`` for a mask-aware study) the same columns
    prefixed ``mass1_``, tested against ``level / 100`` of the mass (the mass is a fraction) with the
    similarity margin ``SIMILAR_MARGIN / 100``, and without paper values (the paper reports none). A row that
    reports Sink_k for k > 1 (``sink_token``) keeps its mass interval but is not tested on the mass (its
    ``mass1_verdict`` says so, :data:`MASS_NOT_TESTED`): the tracker records the mass on token 1, not on the row's
    token.
    """
    ref = next((r for r in rows if r.get("expect") == "reference"), None)
    metric = next((r.get("metric") for r in rows if r.get("metric")), "sink1")
    _endpoint(rows, ref, metric, "", level, SIMILAR_MARGIN, paper=True)
    # the mass co-endpoint is the mass on token 1 (the tracker's): it speaks to a row's claim only where the row
    # rates token 1; a row that reports Sink_k (k > 1: a fixed token at k) is not tested on it
    _endpoint(rows, ref, "mass1_visible" if metric == "sink1_visible" else "mass1", "mass1_", level / 100.0,
              SIMILAR_MARGIN / 100.0, paper=False, untested=_mass_untested)
    counts = Counter(c for r in rows for c in (r.get("commits") or "").split(";") if c)
    main = counts.most_common(1)[0][0] if counts else None
    for r in rows:
        fps = [f for f in (r.get("code_fingerprint") or "").split(";") if f]
        if fps and "none" not in fps:
            # the training code is identified by its numerics: a row is mixed when its seeds were
            # trained by code with different fingerprints (rows differ from each other by design:
            # the fingerprint depends on the config; `report --check` compares each with the current code)
            # (point_row compared them within each training environment; rows built another way
            # compare them all)
            mixed = r.get("code_mixed")
            r["code_mixed"] = ((len(fps) > 1 if mixed is None else bool(mixed))
                               or any(f.startswith("mixed:") for f in fps))
            continue
        cs = [c for c in (r.get("commits") or "").split(";") if c]
        r["code_mixed"] = bool(cs) and any(c != main for c in cs)
    return rows


def seed_is_current(run: Path, current: str, repo: Path | None = None) -> tuple[bool, str]:
    """Whether one finished seed run was trained by code with the current numerics, and how that was
    decided.

    * its fingerprints (every start's, recorded by the study tool, :mod:`sinklab.sweep.fingerprints`)
      differ from each other: no ("trained by code with different numerics");
    * they were computed on this machine's CPU and torch and equal ``current`` (the current code's
      fingerprint of its config here): yes ("same machine");
    * no fingerprint recorded (a run trained outside a sweep) and every start ran the current source
      itself (``code_starts``' source digests): yes ("same source");
    * otherwise (another CPU or torch, whose rounding differs; a CPU that reports the same model name
      but rounds differently, e.g. two "AMD EPYC" generations; or a run without a recorded fingerprint,
      trained outside a sweep): the code of each commit that trained it is run here
      (:func:`sinklab.train.fingerprint.fingerprint_at_commit`) and must give ``current``, i.e. that
      code and the current code compute the same numbers.

    ``repo``: a folder inside the git checkout that holds the training commits (default ``run``; the sweep
    folder for a packed study, whose run folders are unpacked outside any checkout).

    Returns:
        (current?, how): ``how`` is "same machine", "same source", "commit <c> re-run here" (per commit),
        or why it could not be decided ("trained ... from a dirty tree", "commit <c> cannot compute a
        fingerprint here").
    """
    from sinklab.provenance import source_digest
    from sinklab.runs.config import load_config
    from sinklab.sweep.fingerprints import fingerprint_env, with_threads
    from sinklab.train.fingerprint import environment, fingerprint_at_commit

    s = read_json(run / "summary.json", "run summary")
    fps = s.get("code_fingerprints") or ([s["code_fingerprint"]] if s.get("code_fingerprint") else [])
    recorded = bool(fps) and "none" not in fps
    if recorded and len(set(fps)) > 1:
        return False, "trained by code with different numerics"
    env, fenv = environment(), fingerprint_env(s)
    same_name = fenv.get("cpu_model") == env["cpu_model"] and fenv.get("torch_version") == env["torch_version"]
    if recorded and same_name and fps[0] == current:
        return True, "same machine"
    starts = [c for c in (s.get("code_starts") or ([s["code"]] if s.get("code") else [])) if isinstance(c, dict)]
    # without a recorded fingerprint (a run trained outside a sweep) the source digest identifies the code;
    # a recorded one is the stronger evidence (numbers) and is not overruled by it
    if not recorded and starts and all(c.get("source") == source_digest() for c in starts):
        return True, "same source"
    where = "on another machine" if recorded else "without a recorded fingerprint"
    if not starts or any(c.get("dirty") or not c.get("commit") or c.get("commit") == "unknown" for c in starts):
        return False, f"trained {where} from a dirty tree (its code cannot be re-run)"
    cfg_file = run / "config.toml"
    cfg = with_threads(load_config(cfg_file), s.get("threads"))
    hows, ok = [], True
    for commit in dict.fromkeys(c["commit"] for c in starts):
        fp = fingerprint_at_commit(cfg, commit, run if repo is None else repo, cfg_file.read_text(encoding="utf-8"))
        if fp is None:
            return False, f"commit {commit[:12]} cannot compute a fingerprint here"
        ok = ok and fp == current
        hows.append(f"commit {commit[:12]} re-run here")
    return ok, ", ".join(hows) + (" (same CPU name, other rounding)" if recorded and same_name else "")


#: how :func:`seed_is_current` says that it compared the numerics (anything else: it could not decide)
_DECIDED = ("same machine", "same source", "re-run here", "trained by code with different numerics")


def stale_mark(row: dict[str, Any]) -> str:
    """The mark a summary or report row gets when ``fingerprint_current`` is False: "stale" when a
    seed was compared and differs, "unchecked" with the reason when no seed could be compared (e.g. a
    commit that is not in this checkout); "" when the row is current or has no seeds."""
    if str(row.get("fingerprint_current")) != "False":
        return ""
    how = str(row.get("fingerprint_check") or "")
    if how and not any(d in how for d in _DECIDED):
        return f"unchecked: {how}"
    return "stale: trained by code with other numerics"


def check_fingerprints(rows: list[dict[str, Any]], out: Path, study: dict) -> None:
    """Fill ``fingerprint_current``: True when every seed of the row was trained by code with the
    current code's numerics for the row's config (:func:`seed_is_current`: on this machine by the
    recorded fingerprint, from another machine by re-running the training commit's code here), False
    when any was not or cannot be checked, None for a row without finished seeds; and
    ``fingerprint_check``: how it was decided."""
    from sinklab.sweep.fingerprints import run_fingerprint

    for r, p in zip(rows, study["points"]):
        if not r.get("n_seeds"):
            continue
        runs = [d for d in seed_runs(runs_dir(out) / p["slug"])
                if (d / "summary.json").exists() and (d / "config.toml").exists()]
        if not runs:
            r["fingerprint_current"] = False
            continue
        # the current code's fingerprint of each seed's config and threads (one canonical training per
        # config shape, threads and code version: the seeds of a row share it; cached)
        # the commits are looked up in the checkout holding the sweep folder (a packed study's runs are read
        # from its table unpacked into $SINKLAB_HOME, outside any checkout)
        checks = [seed_is_current(d, run_fingerprint(d), repo=out) for d in runs]
        r["fingerprint_current"] = all(ok for ok, _ in checks)
        r["fingerprint_check"] = "; ".join(dict.fromkeys(how for _, how in checks))


def summarize_sweep(out: str | Path, *, plot: bool = True, check: bool = False) -> list[dict[str, Any]]:
    """Build ``summary.csv``, ``summary.md``, ``sink_rate.png`` and (with ``plot``) the dynamics of every
    row (``dynamics.csv``, ``dynamics.png``: :func:`sinklab.sweep.dynamics.study_dynamics`;
    ``stability.png``: :func:`sinklab.sweep.dynamics.study_stability`) in the sweep
    folder ``out``; return the rows.

    ``check``: also fill ``fingerprint_current`` (:func:`check_fingerprints`: one canonical training
    per row and code version, a few seconds each; cached).

    Raises:
        InputError: ``out`` has no ``study.json`` (not a sweep folder).
    """
    from sinklab.errors import InputError

    out = Path(out)
    sj = out / "study.json"
    if not sj.exists():
        raise InputError(f"{out} is not a sweep folder (no study.json); run `sinklab sweep` first")
    study = read_json(sj, "study record")
    level = _emerge_level(out, study)
    metric = study.get("metric", "paper")
    rows = [point_row(runs_dir(out) / p["slug"], p, metric) for p in study["points"]]
    add_verdicts(rows, level)
    if check:
        check_fingerprints(rows, out, study)
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    (out / "summary.md").write_text(markdown_table(rows, level) + "\n")
    if plot:
        from sinklab.sweep.dynamics import study_dynamics, study_stability

        plot_sweep(study, rows, out / "sink_rate.png", level)
        study_dynamics(out, study, level)
        study_stability(out, study)
    return rows


def _emerge_level(out: Path, study: dict) -> float:
    for p in study["points"]:
        for r in seed_runs(runs_dir(out) / p["slug"]):
            s = r / "summary.json"
            if s.exists():
                return float(read_json(s, "run summary").get("emerge_level", 10.0))
    return 10.0


def _f(v: Any, nd: int = 1) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def mean_std(row: dict[str, Any], key: str, nd: int = 1) -> str:
    """``mean ± std`` of a seeded quantity (``mean`` alone with one seed, ``–`` without runs)."""
    m, s = row.get(f"{key}_mean"), row.get(f"{key}_std")
    if m is None or m == "":
        return "–"
    return f"{float(m):.{nd}f}" if s in (None, "") else f"{float(m):.{nd}f} ± {float(s):.{nd}f}"


def verdict_text(row: dict[str, Any], prefix: str = "") -> str:
    """The verdict of a summary row as the tables print it: the verdict, "(n too small)" when the row's
    seed counts cannot reach an adjusted p below 0.05 whatever the data (``p_holm_min``), "(mixed
    code)" and the stale mark (:func:`stale_mark`)."""
    from sinklab.sweep.verdict import ALPHA, INCONCLUSIVE

    v = row.get(prefix + "verdict") or "–"
    pm = row.get(prefix + "p_holm_min")
    if v in (INCONCLUSIVE, EXCLUDES) and pm not in (None, "") and float(pm) >= ALPHA:
        v += " (n too small)"
    if prefix:
        return v
    v += " (mixed code)" if row.get("code_mixed") in (True, "True") else ""
    if mark := stale_mark(row):
        v += f" **({mark})**"
    return v


def _interval(row: dict[str, Any], mean: str, lo: str, hi: str, nd: int = 1, sign: bool = False) -> str:
    if row.get(mean) in (None, ""):
        return "–"
    f = f"{{:{'+' if sign else ''}.{nd}f}}"
    out = f.format(float(row[mean]))
    if row.get(lo) not in (None, ""):
        out += f" [{f.format(float(row[lo]))}, {f.format(float(row[hi]))}]"
    return out


def _p_text(row: dict[str, Any], prefix: str = "") -> str:
    pv = row.get(prefix + "p_holm")
    if pv in (None, ""):
        return "–"
    pm = row.get(prefix + "p_holm_min")
    return f"{float(pv):.3g}" + ("" if pm in (None, "") else f" (≥ {float(pm):.2g})")


def paper_text(row: dict[str, Any]) -> str:
    """The paper's value with its table and the paper's effect (points; scaled to our reference)."""
    if row.get("paper") in (None, ""):
        return "–"
    out = f"{float(row['paper']):g}" + (f" ({row['table']})" if row.get("table") else "")
    if row.get("paper_effect") not in (None, ""):
        out += f"; effect {float(row['paper_effect']):+.1f}"
        if row.get("paper_effect_scaled") not in (None, ""):
            out += f", scaled {float(row['paper_effect_scaled']):+.1f}"
    return out


def table_status(status: Any) -> str:
    """A row's status as the tables show it, in the row's parentheses: every status but a plain "done" (unfinished
    seeds, divergence, a final re-measure that failed; "done (...)" shows what is in its parentheses), the
    failure's message left to summary.csv's ``status``."""
    s = str(status)
    m = re.match(r"(.*?no final re-measure for \d+ of \d+ runs)", s)
    s = f"{m.group(1)}; see summary.csv)" if m else s
    inner = re.fullmatch(r"done \(([^()]*)\)", s)  # "done (3 of 5 seeds)": "3 of 5 seeds"
    return inner.group(1) if inner else s


def markdown_table(rows: list[dict[str, Any]], level: float = 10.0) -> str:
    """The summary rows as a Markdown table: mean ± std over seeds of Sink_1 (last 20% of training)
    with its 95% interval, the per-seed values and sink heads (final Sink_1 x L*H / 100 per seed, of
    ``heads_total``), the mask-aware Sink_1, Sink* on a virtual key, the validation loss with the
    unigram baseline, the effect against the reference, the paper's value and effect, the Holm-adjusted
    p with the smallest attainable one, the verdict; then the same statistics for the co-endpoint
    attention mass on token 1."""
    head = ("| setting | seeds | Sink_1 (%) mean ± std [95% CI] | per seed | sink heads per seed (of L·H) "
            "| raw Sink_1 (%) | Sink_1 visible (%) | Sink* virtual (%) | val loss (unigram) | top sink token "
            "| effect vs ref. (points) [95% CI] | paper Sink_1 (%) (table; effect, scaled) | expected (by) "
            "| p (Holm) (≥ min attainable) | verdict | mass on token 1 [95% CI] | mass effect [95% CI] "
            "| mass p (Holm) | mass verdict |")
    n_col = head.count("|") - 1
    lines = [head, "|" + "---|" * n_col]
    for r in rows:
        if not r.get("n_seeds"):
            lines.append(f"| {r['label']} | 0 | {r['status']} |" + " – |" * (n_col - 3))
            continue
        loss = f"{mean_std(r, 'val_loss', 3)} ({_f(r['unigram_loss'], 2)})"
        if r.get("degenerate") in (True, "True"):
            loss += " **degenerate**"
        pos = r.get("top_sink_token")
        pos_s = "–" if pos in (None, "") else (str(pos) if int(pos) == 1 else f"**{pos}**")
        # the Sink_1 column, its interval and per-seed values are the verdicts' metric: the mask-aware Sink_1 in a
        # study whose verdicts use it (the interval ci_lo / ci_hi is that metric's), else the paper's formula
        key = "sink1_visible" if r.get("metric") == "sink1_visible" else "sink1"
        seeds = ", ".join(f"{v:.0f}" for v in seed_values(r, key))
        heads = ("–" if r.get("sink_heads_seeds") in (None, "") else
                 ", ".join(f"{v:g}" for v in seed_values(r, "sink_heads")) + f" (of {r['heads_total']})")
        metric_mark = " ¹" if r.get("metric") == "sink1_visible" else ""
        ci = "" if r.get("ci_lo") in (None, "") else f" [{float(r['ci_lo']):.1f}, {float(r['ci_hi']):.1f}]"
        eff = _interval(r, "effect", "effect_lo", "effect_hi", sign=True)
        exp = f"{r['expect']} ({r['expect_by']})" if r.get("expect") else "–"
        status = "" if str(r.get("status", "")) == "done" else f" ({table_status(r.get('status'))})"
        sp = r.get("sink_token")
        status += f" (Sink_{sp})" if sp not in (None, "", 1, "1") else ""
        mkey = "mass1_visible_mean" if r.get("metric") == "sink1_visible" else "mass1_mean"
        mass = _interval(r, mkey, "mass1_ci_lo", "mass1_ci_hi", nd=3)
        meff = _interval(r, "mass1_effect", "mass1_effect_lo", "mass1_effect_hi", nd=3, sign=True)
        lines.append(f"| {r['label']}{status} | {r['n_seeds']} | {mean_std(r, key)}{ci}{metric_mark} | {seeds} | {heads} | "
                     f"{_f(r.get('sink1_raw_mean'))} | {mean_std(r, 'sink1_visible')} | "
                     f"{mean_std(r, 'sink_virtual')} | {loss} | {pos_s} | {eff} | "
                     f"{paper_text(r)} | {exp} | {_p_text(r)} | {verdict_text(r)} | {mass} | {meff} | "
                     f"{_p_text(r, 'mass1_')} | {verdict_text(r, 'mass1_')} |")
    if any(r.get("metric") == "sink1_visible" for r in rows):
        lines.append("\n¹ the Sink_1 column (mean, interval, per-seed values) and the verdicts of this study use the "
                     "mask-aware Sink_1 (the paper's formula divides by queries that cannot see token 1 under this mask; "
                     "its values are summary.csv's sink1_mean / sink1_seeds), and the mass verdicts the mask-aware mass.")
    return "\n".join(lines)


def plot_sweep(study: dict, rows: list[dict[str, Any]], path: Path, level: float) -> None:
    """Sink_1 (Sink_k for a row rating position k, marked in its tick label) of every seed (small dots) and the
    seed mean ± std (marker with error bar) against the swept value (numeric axis for a one-key grid, else
    categories); the mask-aware Sink_1 mean when it differs; the paper's values as hollow squares; the emergence
    level as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = study["points"]
    numeric = len(study.get("sweep_keys") or []) == 1 and all(
        isinstance(p.get("x"), (int, float)) and not isinstance(p.get("x"), bool) for p in pts)
    xs = [p["x"] for p in pts] if numeric else list(range(len(pts)))
    positions = [int(r.get("sink_token") or point_token(p)) for p, r in zip(pts, rows)]  # 1-based tokens k
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(pts) + 2), 3.8))
    have = [i for i, r in enumerate(rows) if r.get("sink1_mean") is not None]
    for i in have:
        sv = seed_values(rows[i], "sink1")
        ax.plot([xs[i]] * len(sv), sv, ".", color="C0", alpha=0.45, ms=5,
                label="each seed (last 20% mean)" if i == have[0] else None)
    if have:
        ys = [rows[i]["sink1_mean"] for i in have]
        err = [rows[i]["sink1_std"] or 0.0 for i in have]
        ax.errorbar([xs[i] for i in have], ys, yerr=err, fmt="o-" if numeric else "o", capsize=3, color="C0",
                    label="sinklab: mean ± std over seeds")
        vis = [i for i in have if rows[i].get("sink1_visible_mean") is not None
               and abs(rows[i]["sink1_visible_mean"] - rows[i]["sink1_mean"]) > 1e-9]
        if vis:
            ax.plot([xs[i] for i in vis], [rows[i]["sink1_visible_mean"] for i in vis], "D", color="C2",
                    mfc="none", label="mask-aware Sink_1 (mean)")
    pp = [i for i, r in enumerate(rows) if r["paper"] is not None]
    if pp:
        ax.plot([xs[i] for i in pp], [rows[i]["paper"] for i in pp], "s", mfc="none", color="C3",
                label="paper (60M, 5B tokens)")
    ax.axhline(level, ls="--", color="gray", lw=0.8, label=f"emergence level {level:g}%")
    if numeric:
        ax.set_xlabel(study["sweep_keys"][0])
        if study.get("x_log") and all(x >= 0 for x in xs):
            if any(x == 0 for x in xs):
                ax.set_xscale("symlog", linthresh=min(x for x in xs if x > 0))
            else:
                ax.set_xscale("log")
    else:  # a row that rates another position than token 1 says which (Sink_k, 1-based), as summary.md does
        ax.set_xticks(xs, [p["label"] + (f" (Sink_{k})" if k != 1 else "") for p, k in zip(pts, positions)],
                      rotation=30, ha="right", fontsize=8)
    if set(positions) == {1}:
        ax.set_ylabel("Sink_1 (%)")
    else:
        ax.set_ylabel("sink rate at the row's position (%)" + ("" if numeric else "\n(Sink_1 unless marked Sink_k)"))
    ax.set_ylim(-3, 103)
    ax.set_title(study.get("title") or study["name"])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
