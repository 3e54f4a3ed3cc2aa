"""Files, plots and the console report of a measurement.

Every function takes a :class:`sinklab.measure.run.MeasureResult` (``result``); this module
imports nothing from :mod:`sinklab.measure.run`, which imports it (layers import downwards only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sinklab.fileio import atomic_write_text

#: a :class:`sinklab.measure.run.MeasureResult` (not imported here: run.py imports this module)
_Result = Any

#: below this many samples the console and ``sinklab compare`` say that the bootstrap interval undercovers
#: (``benchmarks/results/ci_coverage.json``: 84-94.5% coverage at N = 20, 37-91% at N = 2-8)
SMALL_N = 20


def write_outputs(result: _Result, out: Path) -> Path:
    """Write ``results.json``, ``attention.csv``, ``sink_rate.csv`` and the PNG plots into ``out``.

    Returns ``out``.
    """
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.json", json.dumps(result.to_dict(), indent=1))
    result.table().to_csv(out / "attention.csv", index=False)
    s = result.summary
    ci = s["sink_rate_ci"]
    gated = {"sink_rate_gated": s["sink_rate_gated"]} if s.get("sink_rate_gated") is not None else {}
    pd.DataFrame({
        "position": range(len(s["sink_rate"])),
        "token_position": range(1, len(s["sink_rate"]) + 1),
        "sink_rate": s["sink_rate"],
        "ci_low": [c[0] for c in ci],
        "ci_high": [c[1] for c in ci],
        "norm_ratio": s["norm_ratio"],
        "norm_ratio_median": s["norm_ratio_median"],
        **gated,
    }).to_csv(out / "sink_rate.csv", index=False)
    plot_all(result, out)
    return out


def top_sink_mass(result: _Result) -> list[list[float]] | None:
    """(L, H) attention mass on the top sink position (``summary["top_sink_position"]``), the mean over the
    samples rounded to 6 decimals as ``attention_mass``: the numbers of ``attention_mass_heatmap.png``, kept in
    ``results.json`` as ``attention_mass_top_sink``. From ``result.stats``; without them (a result read back
    from ``results.json``), the file's ``attention_mass_top_sink`` (``result.saved``), or for a file written
    before that key, ``attention_mass`` at that position when it is one of the first K; else None."""
    s = result.summary
    top = s["top_sink_position"]
    if result.stats is not None:
        return [[round(float(v), 6) for v in row] for row in result.stats.mass[..., top].mean(dim=0)]
    kept = (getattr(result, "saved", None) or {}).get("attention_mass_top_sink")
    if kept is not None:
        return kept
    mass = s.get("attention_mass")  # (L, H, K)
    if mass and mass[0] and top < len(mass[0][0]):
        return [[head[top] for head in layer] for layer in mass]
    return None


def plot_all(result: _Result, out: Path) -> list[Path]:
    """Three plots: attention mass heat map (layers x heads) on the top sink position (:func:`top_sink_mass`;
    not drawn when there are no numbers for it: a result read from an old ``results.json`` whose top sink lies
    past the first K positions), sink rate over positions, hidden-state norm by layer (sink token vs others)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    s = result.summary
    name = result.model.get("name", "model")
    title = f"{name} · {result.config.input} · N={s['num_samples']} T={s['seq_len']} eps={s['eps']}"
    top = s["top_sink_position"]
    paths = []

    # 1. Heat map of attention mass on the top sink position.
    top_mass = top_sink_mass(result)
    if top_mass is not None:
        mass = np.array(top_mass, dtype=float)  # (L, H)
        fig, ax = plt.subplots(figsize=(max(4, 0.5 * mass.shape[1] + 2), max(3, 0.22 * mass.shape[0] + 1.5)))
        im = ax.imshow(mass, aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
        ax.set_xlabel("head (numbered from 0)")
        ids = s.get("layer_ids") or list(range(mass.shape[0]))
        if s.get("other_layers"):  # a hybrid model: only its attention blocks have rows
            ax.set_yticks(range(len(ids)), [str(i) for i in ids])
            ax.set_ylabel("attention block (numbered from 0; SSM blocks left out)")
        else:
            ax.set_ylabel("layer (numbered from 0)")
        ax.set_title(f"attention mass on token {top + 1} (1-based; index {top} in the files)\n{title}", fontsize=9)
        fig.colorbar(im, ax=ax, label="mean attention mass")
        fig.tight_layout()
        p = out / "attention_mass_heatmap.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)

    # 2. Sink rate over positions (first K with CI, plus the full curve; the virtual sink and the gate-weighted
    # rate beside them where the model has them).
    fig = sink_rate_figure(s, title)
    p = out / "sink_rate_positions.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)

    # 3. Hidden-state norm by layer: sink token vs the rest.
    fig, ax = plt.subplots(figsize=(6, 3.5))
    layers = np.array(s.get("layer_ids") or range(len(s["hidden_norm_sink"])))
    sink_label = "top sink" if s.get("has_sink", True) else "no sink: the first token"
    ax.plot(layers, s["hidden_norm_sink"], "o-", label=f"token {top + 1} ({sink_label}, 1-based)")
    ax.plot(layers, s["hidden_norm_others"], "s-", label="other tokens (mean)")
    ax.set_yscale("log")
    ax.set_xlabel("layer (numbered from 0: 0 = output of the first block)")
    ax.set_ylabel("hidden-state l2 norm")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    p = out / "hidden_norms.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def sink_rate_figure(s: dict, title: str = ""):
    """The figure of ``sink_rate_positions.png`` from a measurement's summary ``s`` (a matplotlib Figure).

    Left: bars of Sink_k at the first K token positions (1-based; labelled ``Sink_k``) with their 95%
    intervals; for a model with a virtual sink (learned sink logits, sink token, key bias: DESIGN "virtual
    sink") one more bar ``Sink* (virtual sink)`` at x = 0, left of token 1, with ``sink_rate_virtual``; for a
    model whose heads are gated after attention, bars ``gate-weighted Sink_k`` beside each Sink_k with
    ``sink_rate_gated`` (DESIGN "gate-weighted attention"); for a model whose own mask hides keys (sliding
    window, prefix LM: :func:`mask_aware`) bars ``mask-aware Sink_k`` (``sink_rate_visible``) beside the plain ones,
    which a window caps at w / T. Right: the sink rate at every position (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rate = np.array(s["sink_rate"])
    ci = np.array(s["sink_rate_ci"], dtype=float)  # None (N = 1) -> nan
    curve = np.array(s["sink_rate_curve"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    xs = np.arange(1, len(rate) + 1)
    gated = s.get("sink_rate_gated")
    # a model whose own mask hides keys (window, prefix LM): its mask-aware Sink_k beside the plain one, which a
    # window caps at w / T (the console table leads with the mask-aware rate)
    visible = np.array(s["sink_rate_visible"]) if mask_aware(s) and s.get("sink_rate_visible") is not None else None
    n_bars = 1 + (visible is not None) + (gated is not None)
    width = 0.8 / n_bars
    axes[0].bar(xs, rate, width=width, color="tab:blue",
                label="Sink_k (paper's formula)" if visible is not None else "Sink_k")
    if _no_interval(s):  # one sample: no interval to draw
        axes[0].set_title("N = 1: no confidence interval", fontsize=8)
    else:
        axes[0].errorbar(xs, rate, yerr=[rate - ci[:, 0], ci[:, 1] - rate], fmt="none", ecolor="k", capsize=3)
    ticks, labels = list(xs), [str(x) for x in xs]
    shift = width
    if visible is not None:
        axes[0].bar(xs + shift, visible, width=width, color="tab:purple", label="mask-aware Sink_k")
        shift += width
    if gated is not None:
        axes[0].bar(xs + shift, gated, width=width, color="tab:green", hatch="..", label="gate-weighted Sink_k")
    if s.get("sink_rate_virtual") is not None:
        axes[0].bar([0], [s["sink_rate_virtual"]], width=width, color="tab:orange", hatch="//",
                    label="Sink* (virtual sink)")
        ticks, labels = [0] + ticks, ["*"] + labels
    if n_bars > 1 or s.get("sink_rate_virtual") is not None:
        axes[0].legend(fontsize=7)
    axes[0].set_xlabel("token position k (1-based)" + ("; *: the virtual sink" if labels[0] == "*" else ""))
    axes[0].set_ylabel(f"sink rate Sink_k^{s['eps']} (%)")
    axes[0].set_ylim(0, 100)
    axes[0].set_xticks(ticks, labels)
    axes[1].plot(np.arange(1, len(curve) + 1), curve, lw=1)
    axes[1].set_xscale("log")
    axes[1].set_xlabel("token position k (1-based, log)")
    axes[1].set_ylabel("sink rate (%)")
    axes[1].set_ylim(0, 100)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def _no_interval(s: dict) -> bool:
    """True when the summary has no confidence interval (N = 1: one sample has none)."""
    return s["num_samples"] < 2 or any(b is None for row in s["sink_rate_ci"] for b in row)


def _ci_text(ci) -> str:
    return "none (N = 1)" if ci[0] is None or ci[1] is None else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def mask_aware(s: dict) -> bool:
    """True when the model's own mask (sliding-window layers shorter than T, a prefix LM) makes the
    mask-aware sink rate differ from the plain one (``summary["mask_aware_differs"]``; for a summary
    written before that key, read off its ``mask``)."""
    if "mask_aware_differs" in s:
        return bool(s["mask_aware_differs"])
    m = s.get("mask") or {}
    return bool(m.get("prefix_len")) or (m.get("window") is not None and m["window"] < s["seq_len"])


def summary_lines(result: _Result) -> list[str]:
    """The plain-text lines printed under the table (no wrapping: each is one line, however long).

    Token positions are 1-based (token 1 is the first token, the paper's Sink_1); layer numbers are
    0-based (layer 0 is the first transformer block), as in ``results.json`` and ``attention.csv``;
    the lines say so. A model without a sink (no (sample, layer, head) puts mass > eps on any
    position) gets a line that says so instead of a "strongest layer" and a "top sink" at 0%;
    layers at 0% are never listed as strongest. N = 1 gets a note that one sample has no interval;
    a model whose own mask hides keys (sliding window shorter than T, prefix LM) a line naming both
    sink rates, mask-aware first.
    """
    s = result.summary
    per_layer = s["sink_rate_per_layer"]
    n_layers = len(per_layer)
    ids = s.get("layer_ids") or list(range(n_layers))
    other = s.get("other_layers") or {}
    eps = s["eps"]
    if other:  # a hybrid model: name the blocks that have no attention
        kinds = sorted(set(other.values()))
        where = (f"attention layers {', '.join(map(str, ids))} of blocks 0 to {n_layers + len(other) - 1}; "
                 f"blocks {', '.join(sorted(other, key=int))} have no attention ({', '.join(kinds)})")
    else:
        where = f"layers numbered 0 to {n_layers - 1}"
    # a model whose own mask hides keys: the strongest layers and the top sink as the mask-aware rate sees them
    # (the plain mass of a key under a window of w cannot pass w / T, whatever the model learned)
    vis = "_visible" if mask_aware(s) and "top_sink_position_visible" in s else ""
    per_layer_k = s["sink_rate_visible_per_layer"] if vis else per_layer
    kind = "mask-aware " if vis else ""
    sinking = [l for l in s["strongest_layers" + vis] if per_layer_k[l][0] > 0]
    if sinking:
        strongest = ", ".join(f"layer {ids[l]} ({per_layer_k[l][0]:.0f}%)" for l in sinking)
        layers_line = f"strongest {kind}sink layers for token 1 ({where}): {strongest}"
    else:
        layers_line = (f"strongest {kind}sink layers for token 1 ({where}): none, no layer has a sink at token 1 "
                       f"(no (sample, head) puts {kind}mass > eps = {eps} on it)")
    rate = s["top_sink_rate" + vis]
    if s.get("has_sink" + vis, rate > 0):
        top_line = (f"top {kind}sink position: token {s['top_sink_position' + vis] + 1} (sink rate {rate:.1f}%: "
                    f"{kind}mass > eps in that share of (sample, layer, head) triples; "
                    f"{100 * s['top_sink_mean_mass_head_share' + vis]:.0f}% of (layer, head) pairs have a mean mass over "
                    f"the samples > eps)")
    else:
        top_line = (f"top {kind}sink position: none, no sink on this input at eps = {eps} (no (sample, layer, head) "
                    f"puts {kind}mass > eps on any position)")
    lines = [layers_line, top_line]
    if mask_aware(s):
        m = s.get("mask") or {}
        how = (f"sliding window of {m['window']} tokens" if m.get("window") is not None else "") + \
              (" and " if m.get("window") is not None and m.get("prefix_len") else "") + \
              (f"bidirectional prefix of {m['prefix_len']} tokens" if m.get("prefix_len") else "")
        if m.get("from_mask_tensor") and not how:
            how = "the layers' own mask, e.g. chunked attention"
        later = "every later query" if s.get("causal", True) else "every query"
        lines.append(f"mask-aware Sink_1 {s['sink_rate_visible'][0]:.1f}%, plain Sink_1 {s['sink_rate'][0]:.1f}%: this "
                     f"model's own mask ({how}, T = {s['seq_len']}) hides keys from some queries; the mask-aware rate "
                     f"averages each key's mass over the queries that may see it, the plain one (Gu et al. 2025, Eq. 2) "
                     f"over {later}, counting the hidden ones as 0"
                     + ((f"; plain top sink: token {s['top_sink_position'] + 1} ({s['top_sink_rate']:.1f}%)"
                         if s.get("has_sink", True) else "; plain: no sink at any position") if vis else ""))
    if s.get("extra_mass") is not None:  # learned sink logits / sink token / key bias: DESIGN "virtual sink"
        mass = [v for row in s["extra_mass"] for v in row]
        lines.append(f"virtual sink (a key outside the sequence: sink logits, sink token or key bias): mean attention "
                     f"mass {sum(mass) / len(mass):.3f}, Sink* {s['sink_rate_virtual']:.1f}% of (sample, layer, head) "
                     f"triples above eps = {eps}, beside Sink_1 {s['sink_rate'][0]:.1f}% on token 1")
    if s.get("sink_rate_gated") is not None:  # heads gated after attention: DESIGN "gate-weighted attention"
        gm = [v for row in s["gate_mean"] for v in row]
        lines.append(f"gate-weighted (each head's weights times its output gate's magnitude per query; mean gate "
                     f"{sum(gm) / len(gm):.3f}): Sink_1 {s['sink_rate_gated'][0]:.1f}% and mean mass on token 1 "
                     f"{s['attention_mass_first_gated']:.3f}, beside the raw Sink_1 {s['sink_rate'][0]:.1f}% and "
                     f"{s['attention_mass_first']:.3f}")
    lines.append(f"largest norm ratio: {s['max_norm_ratio']:.2f} at token {s['max_norm_ratio_position'] + 1} "
                 f"(Sink'_k: the token's hidden-state norm over the mean norm of its sequence, averaged over layers; "
                 f"far above 1 marks a sink)")
    mar = s["massive_activation_ratio"]  # per attention layer, in the order of layer_ids
    top = max(range(len(mar)), key=mar.__getitem__)
    block = (s.get("layer_ids") or list(range(len(mar))))[top]  # a hybrid's block number, as the other lines
    lines.append(f"largest massive-activation ratio: {mar[top]:.0f}x in layer {block} (the layer's largest |h| entry over "
                 f"its median |h|; Sun et al. 2024 report about 1000x, `sinklab analyze massive` calls 100x massive)")
    if _no_interval(s):
        lines.append("note: N = 1: one sample has no confidence interval (the bootstrap resamples samples); "
                     "measure more with -n")
    elif s["num_samples"] < SMALL_N:
        lines.append(f"note: N = {s['num_samples']} < {SMALL_N}: the percentile bootstrap interval covers less than its 95% "
                     "at few samples (37-91% of true rates at N = 2-8 in simulation, docs/concepts.md) and is [x, x] "
                     "when every sample has the same rate; measure more with -n")
    stats = result.stats  # None for a result read back from results.json: the summary and its notes tell the same
    if stats.renormalised if stats is not None else s.get("renormalised"):
        lines.append("note: attention rows were renormalised before the metric")
    notes = stats.notes if stats is not None else (getattr(result, "notes", None) or [])
    lines += [f"note: {n}" for n in notes]
    return lines


def print_summary(result: _Result, console=None) -> None:
    """A short console report: a title line, the sink rate at the first positions with CI and norm
    ratio (a table; for a model whose own mask hides keys, the mask-aware rate and its CI first, then
    the plain one; for a gated model, the gate-weighted rate and its CI after the raw one), then
    :func:`summary_lines`.

    Clean in a log file too: the title and the summary lines are printed as they are, never wrapped
    at the terminal width (80 columns when stdout is not a terminal), and without markup.
    """
    from rich.console import Console
    from rich.table import Table

    console = console or Console(soft_wrap=True, highlight=False)
    s = result.summary
    console.print(f"sink rate · {result.model.get('name')} · {result.config.input} · "
                  f"N={s['num_samples']} T={s['seq_len']} eps={s['eps']}", markup=False, soft_wrap=True)
    both = mask_aware(s)
    t = Table()
    t.add_column("token k", justify="right")
    if both:
        t.add_column("mask-aware Sink_k (%)", justify="right")
        t.add_column("95% CI", justify="right")
    t.add_column("plain Sink_k (%)" if both else "Sink_k (%)", justify="right")
    t.add_column("95% CI", justify="right")
    gated = s.get("sink_rate_gated") is not None
    if gated:
        t.add_column("gate-weighted Sink_k (%)", justify="right")
        t.add_column("95% CI", justify="right")
    t.add_column("norm ratio Sink'_k", justify="right")
    for k, (r, ci, nr) in enumerate(zip(s["sink_rate"], s["sink_rate_ci"], s["norm_ratio"])):
        cells = [str(k + 1)]
        if both:
            cells += [f"{s['sink_rate_visible'][k]:.1f}", _ci_text(s["sink_rate_visible_ci"][k])]
        cells += [f"{r:.1f}", _ci_text(ci)]
        if gated:
            cells += [f"{s['sink_rate_gated'][k]:.1f}", _ci_text(s["sink_rate_gated_ci"][k])]
        t.add_row(*cells, f"{nr:.2f}")
    console.print(t)
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def downstream_line(d: dict) -> str:
    """One line for ``measure --cloze``: cloze accuracy with its 95% interval, chance, item count and
    the held-out loss."""
    c = d["cloze"]
    lo, hi = c["accuracy_ci"]
    line = (f"cloze: {c['accuracy']:.1f}% [{lo:.1f}, {hi:.1f}] (length-normalised; summed: {c['accuracy_sum']:.1f}%) "
            f"on {c['n_items']} items, chance {c['chance']:.0f}% ({c['source']})")
    if d.get("heldout_loss") is not None:
        line += f"; held-out loss {d['heldout_loss']:.3f} nats/token on {d['heldout_loss_on']}"
    return line
