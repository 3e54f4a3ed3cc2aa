"""``frames``: the geometry of sinks, after Ruscio, Nanni & Silvestri 2025, "What are you sinking? A geometric
approach on attention sink" (arXiv 2508.02546; summarised in the project's seed 003).

Their reading: a sink is the model's *reference frame*, the point its attention anchors to. They find
three kinds: **centralized** (one dominant reference point, the first token; decoders with RoPE),
**distributed** (several weaker reference points; decoders with modified positional encodings) and
**bidirectional** (the first *and* the last token; encoders with absolute positions), and measure how
much the sinks organise attention by the **KL reduction**: ``KL(original) - KL(without sinks)``, the
attention distributions' KL divergence to the uniform distribution over their visible keys, minus the
same after the sinks' columns are removed and every row renormalised.

This module makes those readings measurable, per layer, with rules written out here (ours; the paper
gives the three kinds and the KL reduction, not thresholds):

* ``a[j]``: the layer's attention mass on key j (Gu et al. 2025, Eq. 2: the mean over the queries that
  see j), averaged over samples and heads; ``u[j]``: the mass uniform attention would give it (causal:
  ``mean_{i >= j} 1 / (i + 1)``; bidirectional: ``1 / T``).
* **reference points**: keys j (among the rankable ones, :func:`~sinklab.metrics.summary.rankable_positions`)
  whose mass closes at least ``excess`` (default 0.1) of the gap between uniform attention and all
  attention: ``(a[j] - u[j]) / (1 - u[j]) >= excess``. (A ratio to ``u`` would not do: under causal
  uniform attention the first key already gets ``u[0] = H_T / T``, 0.34 at T = 8.)
* a layer is **bidirectional** when the model is bidirectional and its first and last positions are
  both reference points; **centralized** when the first position is a reference point holding at least
  ``dominance`` (default 0.5) of the reference points' mass; **distributed** when it has reference
  points otherwise; **none** without reference points. The model's kind is the most common kind among
  its layers that have one (ties: centralized, bidirectional, distributed).
* **top-k share**: the mean over rows (sample, head, query) of the attention on the layer's k keys of
  highest ``a`` (visible ones), k = 1 and 3.
* **KL reduction** (nats): over the rows that keep at least one visible key outside the sinks and some
  attention on them, ``mean KL(A_i || U(V_i)) - mean KL(A'_i || U(V_i \\ S))``, ``A'_i`` the row without
  the sinks S renormalised; S = the layer's reference points (the first position where it has none), and
  ``kl_reduction_first`` with S = {first position}. Also ``kl_relative_reduction`` = reduction / KL.

Positions are 0-based (position 0 is the paper's token 1). Statistics in float64.
"""

from __future__ import annotations

import functools
import json
from collections import Counter

import torch
from torch import Tensor

from sinklab.analyze.common import AnalysisResult, Subject, analysis, command_line, num_heads, resolve_subject, run_model
from sinklab.errors import InputError, param
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL

#: the kinds of reference frame, in the order that breaks ties
KINDS = ("centralized", "bidirectional", "distributed", "none")
#: most bytes of attention weights kept at once (float32)
MAX_WEIGHT_BYTES = 2 * 1024**3


def uniform_mass(T: int, causal: bool, dtype=torch.float64) -> Tensor:
    """(T,) the attention mass on each key (mean over the queries that see it) under uniform attention.

    Causal: query i spreads 1 / (i + 1) over keys 0..i, so key j gets ``mean_{i >= j} 1 / (i + 1)``;
    bidirectional: ``1 / T`` everywhere. Positions 0-based."""
    if not causal:
        return torch.full((T,), 1.0 / T, dtype=dtype)
    inv = 1.0 / torch.arange(1, T + 1, dtype=dtype)  # 1 / (i + 1), i = 0..T-1
    tail = inv.flip(0).cumsum(0).flip(0)  # sum_{i >= j}
    return tail / torch.arange(T, 0, -1, dtype=dtype)


def reference_strength(mass: Tensor, causal: bool) -> Tensor:
    """(T,) float64 ``(a[j] - u[j]) / (1 - u[j])``: how far key j's attention mass ``a[j]`` goes from the
    uniform mass ``u[j]`` (0) towards all attention (1); negative below uniform. mass: (T,), positions 0-based."""
    u = uniform_mass(mass.shape[-1], causal)
    return (mass.double().cpu() - u) / (1.0 - u).clamp_min(1e-12)


def reference_points(mass: Tensor, causal: bool, *, excess: float = 0.1) -> list[int]:
    """0-based keys that act as reference points of a layer.

    Args:
        mass: (T,) the layer's attention mass per key, mean over samples and heads.
        causal: the model's mask. excess: the share of the gap between uniform and all attention a key's
            mass must close (:func:`reference_strength`).

    Returns:
        sorted positions j < :func:`rankable_positions` with ``reference_strength[j] >= excess``.
    """
    r = reference_strength(mass, causal)
    return [j for j in range(rankable_positions(mass.shape[-1], causal)) if r[j] >= excess]


def classify_layer(refs: list[int], mass: Tensor, causal: bool, *, dominance: float = 0.5) -> str:
    """The kind of reference frame of one layer (module docstring): ``centralized``, ``bidirectional``,
    ``distributed`` or ``none``. refs: its reference points (0-based); mass: (T,) its attention mass per key."""
    if not refs:
        return "none"
    T = mass.shape[-1]
    if not causal and 0 in refs and (T - 1) in refs:
        return "bidirectional"
    total = float(mass.double()[refs].sum())
    if 0 in refs and float(mass[0]) >= dominance * total:
        return "centralized"
    return "distributed"


def model_kind(layer_kinds: list[str]) -> str:
    """The most common kind among the layers that have one (ties broken in the order of :data:`KINDS`);
    ``none`` when no layer has reference points."""
    counts = Counter(k for k in layer_kinds if k != "none")
    if not counts:
        return "none"
    best = max(counts.values())
    return next(k for k in KINDS if counts.get(k) == best)


def kl_to_uniform(weights: Tensor, visible: Tensor, drop: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """Per row, ``KL(A_i || U(V_i))`` in nats, after dropping the keys ``drop`` and renormalising the row.

    Args:
        weights: (..., T, T) attention weights, rows = queries (any float dtype; computed in float64).
        visible: (T, T) bool, the keys each query sees.
        drop: 0-based key positions removed (the sinks), or None.

    Returns:
        ``(kl, ok)``: kl (..., T) float64 (0 where not ok); ok (..., T) bool: the row keeps at least one
        visible key and some attention on its kept keys.
    """
    w = weights.double()
    vis = visible.to(w.device)
    if drop:
        vis = vis.clone()
        vis[:, drop] = False
    w = w * vis
    z = w.sum(-1, keepdim=True)  # (..., T, 1)
    n = vis.sum(-1).to(torch.float64)  # (T,)
    ok = (z.squeeze(-1) > 0) & (n > 0)
    p = w / torch.where(z > 0, z, torch.ones_like(z))
    terms = torch.where(p > 0, p * torch.log(p * n[:, None].clamp_min(1.0)), torch.zeros_like(p))
    return torch.where(ok, terms.sum(-1), torch.zeros_like(z.squeeze(-1))), ok


def kl_reduction(weights: Tensor, visible: Tensor, sinks: list[int],
                 original: tuple[Tensor, Tensor] | None = None) -> dict[str, float]:
    """``KL(original) - KL(without sinks)`` over the rows defined in both (module docstring).

    Args:
        weights: (N, H, T, T) one layer's attention weights. visible: (T, T) bool. sinks: 0-based keys.
        original: ``kl_to_uniform(weights, visible)`` when already computed (it does not depend on the sinks).

    Returns:
        {"kl": mean KL to uniform, "kl_without_sinks": mean after removing the sinks, "kl_reduction": their
        difference, "kl_relative_reduction": difference / kl (0 when kl is 0), "rows": rows used}.
    """
    kl, ok = original if original is not None else kl_to_uniform(weights, visible)
    kl2, ok2 = kl_to_uniform(weights, visible, sinks)
    use = ok & ok2
    n = int(use.sum())
    if not n:
        return {"kl": float("nan"), "kl_without_sinks": float("nan"), "kl_reduction": float("nan"),
                "kl_relative_reduction": float("nan"), "rows": 0}
    a, b = float(kl[use].mean()), float(kl2[use].mean())
    return {"kl": a, "kl_without_sinks": b, "kl_reduction": a - b,
            "kl_relative_reduction": (a - b) / a if a > 0 else 0.0, "rows": n}


def top_share(weights: Tensor, visible: Tensor, order: list[int], k: int) -> float:
    """Mean over rows of the attention on the ``k`` keys first in ``order`` (visible ones). weights: (N, H, T, T)."""
    keys = order[:k]
    w = weights.double() * visible.to(weights.device)
    return float(w[..., keys].sum(-1).mean())


@analysis("frames", help={
    "excess": "a reference point's attention mass closes at least this share of the gap from uniform to 1",
    "dominance": "a centralized layer's first position holds at least this share of its reference points' mass"})
def frames(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 16,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    excess: float = 0.1,
    dominance: float = 0.5,
    batch_size: int = 8,
) -> AnalysisResult:
    """Reference frames per layer (centralized / distributed / bidirectional) and the KL reduction of the sinks.

    The probe is ``sinklab measure``'s (``num_samples`` natural windows of ``seq_len`` tokens, ``seed``;
    a ``sinklab train`` run: its own held-out data). Rules and definitions: the module docstring
    (Ruscio et al. 2025's kinds and KL reduction; thresholds ours).

    Tables: ``layers`` -- per layer (0-based, numbered as in the full stack): kind, reference points
    (0-based positions), mass on the first and last positions, the uniform mass there, top-1 / top-3
    share, KL to uniform with and without the sinks (nats), KL reduction (reference points; first
    position only); ``mass`` -- every layer's attention mass per key (mean over samples and heads).
    Plot ``frames``: mass on the first / last position and top-3 share per layer, coloured by kind, and
    the KL reduction per layer.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        excess: what makes a key a reference point (:func:`reference_points`). dominance: the first
            position's share of the reference mass that makes a layer centralized.

    Raises:
        InputError: ``excess`` or ``dominance`` outside (0, 1], or weights that would take more than
            2 GiB (fewer samples or a shorter window).
    """
    for name, v in (("excess", excess), ("dominance", dominance)):
        if not 0.0 < v <= 1.0:
            raise InputError(f"{name} must lie in (0, 1], got {v}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    ids = subj.input_ids
    N, T = ids.shape
    H = num_heads(subj.model)
    if N * subj.num_layers * H * T * T * 4 > MAX_WEIGHT_BYTES:
        raise InputError(f"frames keeps every layer's attention weights: {N} x {subj.num_layers} x {H} x {T}^2 "
                         "floats exceed 2 GiB; lower num_samples or seq_len")
    kept: dict[int, list[Tensor]] = {}
    hidden: dict[int, int] = {}  # layer -> query-key pairs its own mask hides that the plain mask shows

    def inspect(layer, w, *, mask=None, **_):
        kept.setdefault(layer, []).append(w.detach().float())
        if mask is not None:
            plain = torch.ones(w.shape[-2:], dtype=torch.bool, device=mask.device)
            plain = plain.tril() if not subj.is_encoder else plain
            hidden[layer] = hidden.get(layer, 0) + int((plain & ~mask).sum())
        return None

    res = run_model(subj.model, ids, edit=inspect, batch_size=batch_size)
    stats = res.stats
    causal = bool(stats.causal)
    layer_ids = stats.block_ids
    if not layer_ids:
        raise InputError("this model has no attention layers to analyse")
    narrowed = sorted(layer for layer, n in hidden.items() if n)
    if narrowed:  # the uniform reference and the visible keys below are those of plain causal / full attention
        raise InputError(f"frames: the mask of layer {narrowed[0]} hides keys that {'causal' if causal else 'full'} "
                         f"attention shows at T = {T} (a sliding window or chunks shorter than T): its uniform "
                         f"reference is defined for plain causal or bidirectional attention; lower "
                         f"{param('seq_len')} below the window")
    visible = torch.ones(T, T, dtype=torch.bool)
    if causal:
        visible = visible.tril()
    u = uniform_mass(T, causal)
    rows, kinds, mass_rows = [], [], []
    tokens = (subj.tokenizer.convert_ids_to_tokens(ids[0].tolist()) if subj.tokenizer is not None
              else [str(int(t)) for t in ids[0]])
    k_rank = rankable_positions(T, causal)
    for i, layer in enumerate(layer_ids):
        w = torch.cat(kept[layer])  # (N, H, T, T)
        mass = stats.mass[:, i].double().mean(dim=(0, 1))  # (T,)
        refs = reference_points(mass, causal, excess=excess)
        kind = classify_layer(refs, mass, causal, dominance=dominance)
        kinds.append(kind)
        order = sorted(range(k_rank), key=lambda j: -float(mass[j]))
        original = kl_to_uniform(w, visible)  # the same for both sink sets
        kl = kl_reduction(w, visible, refs or [0], original)
        kl_first = kl if (refs or [0]) == [0] else kl_reduction(w, visible, [0], original)
        rows.append({"layer": layer, "kind": kind, "reference_points": json.dumps(refs),
                     "n_reference_points": len(refs), "strength_first": float(reference_strength(mass, causal)[0]),
                     "mass_first": float(mass[0]), "mass_last": float(mass[-1]),
                     "uniform_mass_first": float(u[0]), "uniform_mass_last": float(u[-1]),
                     "top1_position": order[0], "top1_share": top_share(w, visible, order, 1),
                     "top3_share": top_share(w, visible, order, 3),
                     "kl_to_uniform": kl["kl"], "kl_without_sinks": kl["kl_without_sinks"],
                     "kl_reduction": kl["kl_reduction"], "kl_relative_reduction": kl["kl_relative_reduction"],
                     "kl_reduction_first": kl_first["kl_reduction"], "rows": kl["rows"]})
        mass_rows.extend({"layer": layer, "position": j, "token": tokens[j], "attention_mass": float(mass[j]),
                          "uniform_mass": float(u[j])} for j in range(T))
    import pandas as pd

    layers_df = pd.DataFrame(rows)
    counts = Counter(kinds)
    summary = {
        "kind": model_kind(kinds), "causal": causal, "seq_len": T, "num_samples": N,
        "layers_by_kind": {k: counts.get(k, 0) for k in KINDS},
        "kl_reduction_mean": float(layers_df["kl_reduction"].mean()),
        "kl_reduction_first_mean": float(layers_df["kl_reduction_first"].mean()),
        "kl_relative_reduction_mean": float(layers_df["kl_relative_reduction"].mean()),
        "top1_share_mean": float(layers_df["top1_share"].mean()),
        "rules": {"excess": excess, "dominance": dominance},
    }
    name = subj.model_info.get("name")
    settings = {"model": name, "corpus": corpus, "num_samples": N, "seq_len": T, "seed": seed, "excess": excess,
                "dominance": dominance, "batch_size": batch_size}
    plot = functools.partial(_plot, df=layers_df, title=f"{name} · {summary['kind']} · T={T}, N={N}")
    return AnalysisResult("frames", summary, {"layers": layers_df, "mass": pd.DataFrame(mass_rows)},
                          {"frames": plot}, settings, subj.model_info, subj.corpus_info,
                          command_line("frames", settings, subj))


_COLOURS = {"centralized": "tab:red", "bidirectional": "tab:purple", "distributed": "tab:blue", "none": "tab:gray"}


def _plot(path, *, df, title: str) -> None:
    """Two panels per layer: mass on the first / last position and top-3 share (markers coloured by kind);
    the KL reduction (reference points and first position only)."""
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    x = df["layer"].to_numpy()
    a.plot(x, df["mass_first"], "-", color="black", lw=0.8, label="mass on the first position")
    a.plot(x, df["mass_last"], "--", color="gray", lw=0.8, label="mass on the last position")
    a.plot(x, df["top3_share"], ":", color="tab:green", lw=1.0, label="top-3 share")
    for kind, colour in _COLOURS.items():
        sel = df["kind"] == kind
        if sel.any():
            a.scatter(x[sel.to_numpy()], df.loc[sel, "mass_first"], color=colour, s=18, zorder=3, label=kind)
    a.set_ylabel("attention")
    a.legend(fontsize=6, ncol=2)
    b.plot(x, df["kl_reduction"], "-o", ms=3, label="KL reduction (reference points)")
    b.plot(x, df["kl_reduction_first"], "--", label="KL reduction (first position)")
    b.axhline(0, color="gray", lw=0.5)
    b.set_xlabel("layer (0-based)")
    b.set_ylabel("nats")
    b.legend(fontsize=6)
    fig.suptitle(title + "\nkinds: Ruscio et al. 2025; rules: sinklab (docs/analyze.md)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
