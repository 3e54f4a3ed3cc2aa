"""``intervene``: interventions on the sink with a language-modelling readout.

(a) remove attention to the sink position and renormalise (:func:`remove_key`, through the capture
seam's attention edit); (b) set the massive-activation dimensions of the sink token to zero, to their
mean over the other tokens, or to the sink token's own mean value over the samples (Sun et al. 2024 use
zero and that mean; the seam's block-output edit); (c) drop the first token or
replace it; (d) for learned absolute positions, give position 0 the embedding of position t, or swap the
two (:func:`swapped_positions`; the paper's GPT2-XL experiment). Each is a class of
:mod:`sinklab.analyze.interventions`, registered by name in its ``INTERVENTIONS``.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from sinklab.analyze.common import (AnalysisResult, Subject, analysis, check_layers, command_line, resolve_subject,
                                    run_model, sink_position)
from sinklab.analyze.interventions import (INTERVENTIONS, Target, position_table, remove_key,  # noqa: F401
                                           swapped_positions)
from sinklab.analyze.massive import top_activations
from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, SinklabError, param
from sinklab.metrics import sink_rate
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL


def _readout(res, targets_from: int, weights: Tensor | None = None) -> dict:
    """Mean loss (nats) and perplexity over ``res.nll[:, targets_from:]``: the targets from 0-based position
    ``targets_from + 1`` of the sequence that was fed (1 = from position 2 of the full window; 0 for the
    window without its first token, whose position 1 is the window's position 2).

    ``weights`` (N, T) (masked diffusion: 1/t on the masked positions, 0 elsewhere): ``res.nll`` holds the
    same-position NLL, its columns from ``targets_from`` are the window's positions 1..T-1, and the loss is
    the masked diffusion loss ``sum w * nll / (N T)`` over those positions (LLaDA Eq. 3)."""
    nll = res.nll[:, targets_from:]
    if weights is None:
        loss = float(nll.mean())
    else:
        loss = float((nll * weights[:, 1:].to(nll.dtype)).sum() / weights.numel())
    return {"loss": loss, "perplexity": math.exp(loss)}


def diffusion_probe(subj: Subject, seed: int) -> tuple[Tensor, Tensor] | None:
    """For a masked diffusion model: (input ids (N, T) with the masked positions replaced by the mask token,
    weights (N, T) = 1/t on the masked positions) of the subject's clean probe, masked as in training
    (:func:`sinklab.diffusion.masking.mask_ratio_and_mask`, seeded with ``seed``; BOS never masked; for a
    ``sinklab train`` run also its ``train.mask_eps`` and the position its packing inserts a token at,
    else eps 1e-3); None for any other model.

    Raises:
        InputError: a masked diffusion model whose tokenizer has no mask token.
    """
    from sinklab.data.packing import PACKING
    from sinklab.diffusion.masking import corrupt, mask_ratio_and_mask
    from sinklab.train.objective import MaskedDiffusionObjective

    m = subj.model
    if not adapt(m).masked_diffusion:
        return None
    tok = subj.tokenizer
    mask_id = getattr(tok, "mask_token_id", None) if tok is not None else None
    if mask_id is None:
        raise InputError("this bidirectional model's tokenizer has no mask token (<|mask|>): not a masked diffusion run")
    ids = subj.input_ids
    run = _run_of(subj)  # mask as the run was trained: its eps, never BOS or the tokens its packing inserts
    d = run.config.data if run is not None else None
    bos = getattr(tok, "bos_token_id", None)
    objective = MaskedDiffusionObjective(
        mask_id=int(mask_id), eps=run.config.train.mask_eps if run is not None else 1e-3, seed=seed, eval_seed=seed,
        keep_ids=() if bos is None else (bos,),
        keep_positions=PACKING.get(d.packing).inserted_at(d.packing_position) if d is not None else ())
    t, masked = mask_ratio_and_mask(seed, 0, objective.maskable(ids), objective.eps)
    return corrupt(ids, masked, objective.mask_id), masked.to(torch.float32) / t[:, None]


def _run_of(subj: Subject):
    """The ``sinklab train`` run behind the subject (:class:`sinklab.runs.Run`), or None."""
    from sinklab.runs import Run

    folder = subj.model_info.get("run") or subj.source
    try:
        return Run.find(str(folder)) if folder else None
    except SinklabError:  # a run folder without final/ or with a bad config: no run to read settings from
        return None


@analysis("intervene", help={
    "position": "0-based sink position (default: the top one)",
    "layers": "layers for remove-sink, e.g. 0,1,2 (default all)",
    "dims": "massive dimensions to ablate, e.g. 1,5 (default: found)",
    "massive_layer": "block whose output is ablated (default: where the massive activation appears)",
    "token": "replacement first token of replace-first (default: random per sample, seeded)",
    "swap_to": "0-based t of the position swap",
    "only": "comma-separated subset of the interventions: " + ", ".join(INTERVENTIONS),
    "allow_non_sink": "allow a --position that is never a sink (e.g. BOS in a model without a sink, to "
                      "compare models at one position)"})
def intervene(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 32,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    position: int | None = None,
    layers: list[int] | None = None,
    dims: list[int] | None = None,
    massive_layer: int | None = None,
    token: int | None = None,
    swap_to: int = 4,
    only: list[str] | None = None,
    allow_non_sink: bool = False,
    batch_size: int = 16,
) -> AnalysisResult:
    """Interventions on the sink with loss / perplexity and the sink rate after the change.

    The interventions are the classes of :data:`~sinklab.analyze.interventions.INTERVENTIONS` (each with
    its formula). The readout is the mean next-token loss (nats) over the targets at 0-based positions 2
    to T-1, the same tokens for every intervention (dropping the first token shifts the rest); the sink
    rate is Sink^eps at position 0 and at the sink position after the change. Encoders (no LM head) get
    the sink rates only. A masked diffusion model (a sinklab run with ``train.objective =
    "masked_diffusion"``) is fed its probe with tokens masked as in training (:func:`diffusion_probe`,
    the same masks for every intervention) and read out with the masked diffusion loss over positions
    1..T-1.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        model: zoo name / folder / run, or a :class:`Subject`. corpus, num_samples, seq_len, seed: the probe
            (seq_len None: the run's probe length for a ``sinklab train`` run, else 64).
        position: the sink position p (default the top one; :func:`~sinklab.analyze.common.sink_position`).
        layers: 0-based layers for ``remove-sink`` (default all).
        dims, massive_layer: massive dimensions and the block whose output ``massive-*`` edit (defaults:
            where the sink's massive activation appears, :func:`_massive_target`).
        token: ``replace-first``'s first token (default: random per sample, seeded). swap_to: t of the
            position swap (0-based; default 4 = the paper's p5).
        only: names in :data:`~sinklab.analyze.interventions.INTERVENTIONS` (default: all that apply).
        allow_non_sink: allow a ``position`` whose sink rate is 0 (refused by default): removing attention to
            BOS in a model without a sink there, to compare two models at one position (below 10%: a warning).

    Returns:
        :class:`AnalysisResult` with table ``interventions``: one row per variant with ``sink_rate_pos0``
        (Sink^eps at 0-based position 0 of the sequence fed), ``sink_rate_sink`` (at the window's sink position p:
        for ``drop-first`` the shortened sequence's p - 1, NaN for p = 0, the token dropped),
        ``top_sink_position_after`` / ``top_sink_rate_after`` (the position with the highest sink rate
        after the change, among those seen by >= 10% of the queries, and its rate: where the sink went;
        for ``drop-first`` positions are those of the shortened sequence), loss, perplexity, loss_change;
        table ``mass``: one row per (variant, key position) with the mean attention mass (over samples,
        layers and heads) and the sink rate there (``drop-first``'s positions shifted by one, to the
        full window's); plot ``intervene`` draws both (where the sink and the mass went).
        ``summary["warnings"]`` lists edits that cannot mean what they seem (massive dims that are not
        massive, an edit the readout cannot see).

    Raises:
        InputError: unknown intervention; a layer or dimension index out of range; a position swap on a
            model without learned absolute positions (says why) or with ``swap_to`` outside [1, T); a
            replacement token outside the model's vocabulary; a sink position never used.
    """
    for x in only or ():  # unknown names refused before any work
        INTERVENTIONS.get(x)
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    m, ids = subj.model, subj.input_ids
    N, T = ids.shape
    L, lm = subj.num_layers, not subj.is_encoder
    layers = check_layers(layers, L, m)  # a block without attention given by name is refused
    want, learned = _chosen(m, only, lm, token, swap_to, T)
    diff = diffusion_probe(subj, seed)
    clean, (ids, weights) = ids, (diff if diff is not None else (ids, None))  # every variant is fed the masked probe

    def run(x, *, first_dropped: bool = False, **kw):  # run_model with the readout (diffusion: the clean targets)
        tg = None if diff is None else (clean[:, 1:] if first_dropped else clean)
        return run_model(m, x, targets=tg, nll=lm, batch_size=batch_size, **kw)

    base = run(ids, hidden=True)
    pos, rate = sink_position(base.stats, eps, position, require_sink=not allow_non_sink)
    warnings = [] if rate >= NO_SINK_LEVEL else [_no_sink_warning(pos, rate, position is not None)]
    vocab = subj.tokenizer.vocab_size if subj.tokenizer is not None else int(ids.max()) + 1
    target = Target(pos, layers, L, token=token, vocab=vocab, seed=subj.seed, swap_to=swap_to)
    edited_ratio = None
    if any(INTERVENTIONS.get(x).needs_massive for x in want):
        edited_ratio = _massive_setup(target, base.hidden, massive_layer, dims, lm, warnings)
        massive_layer, dims = target.massive_layer, target.dims
    out = _run_variants(m, ids, base, want, target, run, _Rows(eps, pos, lm, weights))
    table, mass_table = out.tables(sink_rate(base.stats.visible_mass, eps)[swap_to] if learned else None)
    summary = {"sink_position": pos, "sink_rate": rate, "num_samples": N, "seq_len": T,
               "readout": _readout_name(lm, diff is not None), "massive_dims": dims, "massive_layer": massive_layer,
               "results": table.to_dict(orient="records"), "warnings": warnings,
               **({} if edited_ratio is None else {"massive_dims_ratio_to_median": edited_ratio}),
               **({} if learned else {"position_swap": "not applicable: " + _why_no_table(m)})}
    plot = functools.partial(_plot, table=table, mass_table=mass_table, lm=lm, pos=pos, swap_to=swap_to,
                             learned=learned, T=T)
    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "position": position, "layers": layers, "dims": dims,
                "massive_layer": massive_layer, "token": token, "swap_to": swap_to, "only": only,
                "allow_non_sink": True if allow_non_sink else None}
    return AnalysisResult("intervene", summary, {"interventions": table, "mass": mass_table}, {"intervene": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("intervene", settings, subj))


def _no_sink_warning(pos: int, rate: float, requested: bool) -> str:
    """The warning for a sink position below :data:`NO_SINK_LEVEL` (``requested``: given by the caller)."""
    return (f"position {pos} has a sink rate of {rate:.2f}% (below {NO_SINK_LEVEL:g}%): this model has no sink "
            + ("there" if requested else "anywhere; the top position is only the least flat key")
            + ", so remove-sink removes ordinary attention")


def _run_variants(m: nn.Module, ids: Tensor, base, want: list[str], target: Target, run, out: "_Rows") -> "_Rows":
    """The baseline pass ``base`` and every intervention of ``want`` (in the registry's order, whatever the
    order of ``want``) applied to ``ids`` with ``run``, recorded in ``out``."""
    out.add("baseline", base, {"note": ""})
    for name in (x for x in INTERVENTIONS if x in want):
        iv = INTERVENTIONS.get(name)(target)
        res = iv.apply(m, ids, run)
        out.add(name, res, iv.describe(res, out.eps), first_dropped=iv.drops_first)
    return out


def _chosen(m: nn.Module, only: list[str] | None, lm: bool, token: int | None, swap_to: int,
            T: int) -> tuple[list[str], bool]:
    """The interventions to run (``only``, else every one that applies: ``needs_lm`` ones only with an LM
    head, ``needs_learned_positions`` ones only with a learned position table) and whether the model has
    that table.

    Raises:
        InputError: a chosen intervention that does not apply (says why), ``swap_to`` outside [1, T) for a
            position swap, ``token`` outside the model's embedding rows for ``replace-first``.
    """
    needs = {name: INTERVENTIONS.get(name) for name in INTERVENTIONS}
    want = list(only) if only is not None else [x for x in needs if lm or not needs[x].needs_lm]
    learned = True
    try:
        position_table(m)
    except InputError:
        learned = False
        if only is not None and any(needs[x].needs_learned_positions for x in only):
            raise
        want = [x for x in want if not needs[x].needs_learned_positions]
    if only is not None and not lm and any(needs[x].needs_lm for x in only):
        raise InputError("drop-first / replace-first need a language-modelling head; this model is an encoder")
    if any(needs[x].needs_learned_positions for x in want) and not 1 <= swap_to < T:
        raise InputError(f"{param('swap_to', swap_to)} is outside the sequence: give a 0-based position in [1, {T - 1}] (T={T})")
    emb = adapt(m).embeddings
    vocab_rows = int(emb.num_embeddings)
    if token is not None and "replace-first" in want and not 0 <= token < vocab_rows:
        raise InputError(f"{param('token', token)} is outside the vocabulary: token ids 0 to {vocab_rows - 1}")
    return want, learned


def _massive_setup(target: Target, hidden: Tensor, layer: int | None, dims: list[int] | None, lm: bool,
                   warnings: list[str]) -> float:
    """Fix the ``massive-*`` target (layer, dims, the sink token's sample mean) from the unedited (N, L, T, d)
    block outputs ``hidden``; append a warning when the dims are not massive or the edit cannot reach the
    readout. Returns the edited cells' ratio to the median ``|h|`` (:func:`_cell_ratio`).

    Raises:
        InputError: a layer or dimension out of range.
    """
    pos, L, d_model = target.position, target.num_layers, hidden.shape[-1]
    layer, dims = _massive_target(hidden, pos, layer, dims, L)
    bad = [d for d in dims if not 0 <= d < d_model]
    if bad:
        raise InputError(f"dimension {bad[0]} is out of range: hidden size {d_model} (0 to {d_model - 1})")
    ratio = _cell_ratio(hidden, layer, pos, dims)
    if ratio < MASSIVE_RATIO:
        warnings.append(f"no massive activation: dims {dims} of position {pos} at layer {layer} are at most "
                        f"{ratio:.1f}x the median |h| (median over samples), below {MASSIVE_RATIO:g}x; the "
                        f"massive-* rows ablate ordinary entries")
    if lm and layer == L - 1 and pos + 1 < 2:
        warnings.append(f"the massive-* edit (output of the last layer {layer}, position {pos}) only changes "
                        f"the prediction of token {pos + 1}, outside the readout (targets 2..T-1): its loss change is 0 "
                        f"by construction")
    target.massive_layer, target.dims = layer, dims
    target.sample_mean = hidden[:, layer, pos][:, torch.tensor(dims)].mean(dim=0)  # (len(dims),)
    return ratio


class _Rows:
    """The rows of the ``interventions`` and ``mass`` tables, one variant at a time."""

    def __init__(self, eps: float, pos: int, lm: bool, weights: Tensor | None) -> None:
        self.eps, self.pos, self.lm, self.weights = eps, pos, lm, weights
        self.rows: list[dict] = []
        self.mass: list[dict] = []

    def add(self, name: str, res, extra: dict, *, first_dropped: bool = False) -> None:
        """One variant's row: sink rates at 0, at the sink and at the top position after the change, the note,
        the readout (LM) and ``extra``'s other columns; its mass rows (positions of the full window)."""
        r = sink_rate(res.stats.visible_mass, self.eps)
        shift = 1 if first_dropped else 0  # the shortened sequence's position j is the window's j + 1
        at = self.pos - shift  # the sink position p of the window in the sequence fed (-1: the token dropped)
        top = int(r[: rankable_positions(len(r), res.stats.causal)].argmax())
        row = {"intervention": name, "sink_rate_pos0": float(r[0]),
               "sink_rate_sink": float(r[at]) if 0 <= at < len(r) else float("nan"),
               "top_sink_position_after": top, "top_sink_rate_after": float(r[top]),
               "note": extra.get("note", "") + ("; sink_rate_sink NaN: the sink token is the one dropped" if at < 0 else "")}
        if self.lm and res.nll is not None:
            row.update(_readout(res, 0 if first_dropped else 1, self.weights))
        row.update({k: v for k, v in extra.items() if k != "note"})
        self.rows.append(row)
        mean_mass = res.stats.visible_mass.mean(dim=(0, 1, 2))  # (T,) mean over samples, layers, heads
        for j in range(len(r)):
            self.mass.append({"intervention": name, "position": j + shift, "attention_mass": float(mean_mass[j]),
                              "sink_rate": float(r[j])})

    def tables(self, baseline_swap_rate: Tensor | None):
        """The ``interventions`` table (the baseline's ``sink_rate_swap_to`` set from ``baseline_swap_rate``
        when given; ``loss_change`` against the baseline for an LM) and the ``mass`` table."""
        import pandas as pd

        table = pd.DataFrame(self.rows)
        if baseline_swap_rate is not None:
            table.loc[table["intervention"] == "baseline", "sink_rate_swap_to"] = float(baseline_swap_rate)
        if self.lm:
            table["loss_change"] = table["loss"] - table.loc[table["intervention"] == "baseline", "loss"].iloc[0]
        return table, pd.DataFrame(self.mass)


def _readout_name(lm: bool, diffusion: bool) -> str:
    """What the loss column is."""
    if not lm:
        return "sink rate only (encoder)"
    if diffusion:
        return ("masked diffusion loss (nats/token, 1/t-weighted, LLaDA Eq. 3) on the probe masked as in "
                "training, over 0-based positions 1..T-1")
    return "mean next-token loss (nats) over targets at 0-based positions 2..T-1"


def _plot(path, *, table, mass_table, lm: bool, pos: int, swap_to: int, learned: bool, T: int) -> None:
    """Loss per variant (LM only); the sink rate at position 0, at the sink / swap position and at the
    top position after the change (labelled with that position: where the sink went); the mean
    attention mass on each of the first key positions, one line per variant (where the mass went)."""
    import matplotlib.pyplot as plt

    n = 3 if lm else 2
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4.2), squeeze=False)
    x = list(range(len(table)))
    if lm:
        axes[0, 0].bar(x, table["loss"], color="C0")
        axes[0, 0].set_xticks(x, table["intervention"], rotation=40, ha="right")
        axes[0, 0].set_ylabel("loss (nats)")
        axes[0, 0].set_ylim(min(table["loss"]) * 0.9, max(table["loss"]) * 1.05)
    ax = axes[0, n - 2]
    other = ("sink_rate_sink", pos) if pos != 0 else ("sink_rate_swap_to", swap_to) if learned else None
    bars = [("sink_rate_pos0", "Sink at position 0")] + ([(other[0], f"Sink at position {other[1]}")] if other else [])
    bars.append(("top_sink_rate_after", "Sink at the top position after the change (labelled)"))
    width = 0.8 / len(bars)
    for b, (col, label) in enumerate(bars):
        xs = [i + (b - (len(bars) - 1) / 2) * width for i in x]
        vals = table[col]
        if col == "sink_rate_pos0":  # drop-first's position 0 is the window's position 1: the window's own is gone
            vals = vals.where(table["intervention"] != "drop-first")
        have = vals.notna().tolist()  # a variant without this value (NaN) gets no bar, and "n/a" where it would be
        drawn = ax.bar([u for u, h in zip(xs, have) if h], vals[have], width, label=label)
        for u, h in zip(xs, have):
            if not h:
                ax.text(u, 1, "n/a", rotation=90, ha="center", va="bottom", fontsize=6, color="gray")
        if col == "top_sink_rate_after":
            ax.bar_label(drawn, labels=[f"p{int(t) + (v == 'drop-first')}" for t, v, h in
                                        zip(table["top_sink_position_after"], table["intervention"], have) if h],
                         fontsize=7)
    ax.set_xticks(x, table["intervention"], rotation=40, ha="right")
    ax.set_ylabel("sink rate (%)")
    ax.set_ylim(0, 110)
    ax.set_title("pK = 0-based top sink position after the change (in the full window)", fontsize=8)
    ax.legend(fontsize=7)
    ax = axes[0, n - 1]
    # the first 16 positions, and as far as the sink and every top position after a change, so that the plot shows
    # where the mass was and where it went (positions of the full window)
    shown = min(T, max(16, pos + 2, int(table["top_sink_position_after"].max()) + 3))
    for name, g in mass_table.groupby("intervention", sort=False):
        g = g[g["position"] < shown]
        ax.plot(g["position"], g["attention_mass"], marker="o", ms=3,
                label=name + (" (positions of the full window)" if name == "drop-first" else ""))
    ax.set_xlabel("key position (0-based)")
    ax.set_ylabel("mean attention mass (samples, layers, heads)")
    ax.set_title(f"where the attention mass goes (first {shown} positions)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

MASSIVE_RATIO = 100.0  # an entry is massive above this multiple of the median |h| (as ``massive``'s default)
NO_SINK_LEVEL = 10.0  # a chosen sink position below this sink rate (percent) gets a warning (training's emergence level)


def _cell_ratio(hidden: Tensor, layer: int, pos: int, dims: list[int]) -> float:
    """Median over samples of ``max_d |h[n, layer, pos, d]| / median |h[n, layer]|`` for d in ``dims``.

    Args:
        hidden: (N, L, T, d) block outputs. layer, pos: 0-based. dims: hidden dimensions.
    """
    a = hidden[:, layer].abs().double()  # (N, T, d)
    med = a.reshape(a.shape[0], -1).median(dim=-1).values  # (N,)
    cells = a[:, pos][:, torch.tensor(dims)].amax(dim=-1)  # (N,)
    return float((cells / med.clamp_min(1e-30)).median())


def _massive_target(hidden: Tensor, pos: int, layer: int | None, dims: list[int] | None, L: int,
                    k: int = 3, ratio: float = MASSIVE_RATIO) -> tuple[int, list[int]]:
    """Where the massive activations of the sink token appear and in which dimensions.

    Layer (default): the first layer whose mean top-1 ``|h|`` on position ``pos`` (over the samples whose
    top-1 entry sits there) reaches half its largest value over layers -- where the massive activation
    appears (Sun et al. 2024); if the top-1 entry is never on ``pos``, the layer of the largest
    top-1/median ratio. Dims (default): the dimensions of the top-``k`` entries at that layer that sit on
    ``pos`` and exceed ``ratio`` x the median ``|h|``, kept when found in at least 10% of the samples;
    else the most common top-1 dimension at that layer.

    Raises:
        InputError: ``layer`` out of range.
    """
    top = top_activations(hidden, k)  # values/position/dim (N, L, k), median (N, L)
    if layer is None:
        on = top["position"][..., 0] == pos  # (N, L)
        v = torch.where(on, top["values"][..., 0], torch.zeros_like(top["values"][..., 0]))
        mean_on = v.sum(dim=0) / on.sum(dim=0).clamp_min(1)  # (L,)
        if on.any():
            layer = int(torch.nonzero(mean_on >= 0.5 * mean_on.max()).flatten()[0])
        else:
            layer = int((top["values"][..., 0] / top["median"]).median(dim=0).values.argmax())
    elif not 0 <= layer < L:
        raise InputError(f"{param('massive_layer', layer)} is out of range: the model has {L} layers (0 to {L - 1})")
    if dims is None:
        sel = (top["position"][:, layer] == pos) & (top["values"][:, layer] > ratio * top["median"][:, layer, None])
        cells = top["dim"][:, layer][sel]
        N = hidden.shape[0]
        counts = torch.bincount(cells, minlength=hidden.shape[-1]) if cells.numel() else torch.zeros(1)
        dims = [int(d) for d in torch.nonzero(counts >= max(1, 0.1 * N)).flatten()]
        if not dims:
            dims = [int(top["dim"][:, layer, 0].mode().values)]
    return layer, dims


def _why_no_table(model) -> str:
    try:
        position_table(model)
        return ""
    except InputError as e:
        return str(e)
