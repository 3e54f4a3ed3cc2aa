"""``overmix``: how far a small perturbation of one token's input embedding spreads, layer by layer,
with the sink intact and with attention to it removed (Barbero et al. 2025: sinks keep deep models from
over-mixing)."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from sinklab.analyze.common import (MIN_SIGN_TEST_PAIRS, AnalysisResult, Subject, analysis, command_line, resolve_subject, run_model,
                                    sign_test_p, sink_position)
from sinklab.analyze.interventions import remove_key
from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, param
from sinklab.models import input_device
from sinklab.zoo.models import DEFAULT_MODEL


def sensitivity(base: Tensor, perturbed: Tensor, source: int) -> Tensor:
    """Relative change of each later token's representation, per layer.

    Args:
        base, perturbed: (N, L, T, d) block outputs without and with the perturbation.
        source: 0-based position s that was perturbed.

    Returns:
        (L, T - s) float64: entry [l, k] is the mean over samples of
        ``||perturbed[n, l, s + k] - base[n, l, s + k]|| / ||base[n, l, s + k]||`` (k = distance from s).
    """
    b, p = base[:, :, source:].double(), perturbed[:, :, source:].double()
    return ((p - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).mean(dim=0)


def pair_verdict(higher: int, pairs: int, alpha: float = 0.05) -> str:
    """The last layer's verdict from ``higher`` of ``pairs`` (source, direction) pairs in which removing the
    sink raised the sensitivity: the count always, the two-sided sign test's p
    (:func:`~sinklab.analyze.common.sign_test_p`), and, below :data:`~sinklab.analyze.common.MIN_SIGN_TEST_PAIRS`
    pairs, that they are too few for any split to be significant (two unanimous pairs have p = 0.5)."""
    p = sign_test_p(higher, pairs)
    way = "increases" if 2 * higher >= pairs else "decreases"
    count = higher if way == "increases" else pairs - higher
    said = (f"removing the sink {way} sensitivity in {'all ' if count == pairs else ''}{count} of {pairs} "
            f"(source, direction) pairs (two-sided sign test p = {p:.3g})")
    if pairs < MIN_SIGN_TEST_PAIRS:
        return (f"too few pairs to conclude: {said}; fewer than {MIN_SIGN_TEST_PAIRS} pairs cannot reach p < {alpha:g} "
                f"even when all agree (add sources or directions)")
    return said if p < alpha else f"inconclusive: {said}"


@analysis("overmix", help={
    "sources": "perturbed positions, e.g. 8,16,32 (default T/8, T/4, T/2)",
    "directions": "random directions per source",
    "scale": "perturbation size relative to the embedding norm"})
def overmix(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 16,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    sources: list[int] | None = None,
    directions: int = 3,
    scale: float = 0.01,
    batch_size: int = 16,
) -> AnalysisResult:
    """Sensitivity of later tokens to a perturbation of token s, by layer and distance, with and without the sink.

    For each source position s and each of ``directions`` random unit directions u (seeded), the input
    embedding of token s is replaced by ``e_s + scale * ||e_s|| * u``; :func:`sensitivity` gives the
    relative change of every later token's block output. Averaged over sources and directions. Done
    twice, paired (the same sources and directions): with the sink intact, and with attention to the sink
    position removed in every layer (intervention (a), :func:`~sinklab.analyze.intervene.remove_key`), each
    against its own unperturbed pass. The spread over the (source, direction) pairs of the relative change
    removed / intact - 1 is reported per layer, so a difference can be told from noise.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        sources: 0-based positions s (default T/8, T/4, T/2, all > the sink position).
        directions: random directions per source. scale: perturbation size relative to ``||e_s||``.

    Returns:
        :class:`AnalysisResult`: table ``sensitivity`` (condition, layer, distance from s, mean relative
        change, number of (source, direction) pairs), table ``per_layer`` (per layer: intact and removed
        sensitivity averaged over pairs, each pair's value the mean over its distances >= 1; the relative
        change's mean, std, min, max over pairs and the number of pairs where it is > 0), plot ``overmix``; the summary's
        ``last_layer_curve_by_distance`` is indexed by distance (index 0 = the perturbed token itself).

    Raises:
        InputError: a source outside (sink position, T - 1), directions < 1 or scale <= 0; a model in a dtype
            other than float32 (the later tokens' relative changes, about 1e-3 to 1e-2, are below bfloat16's
            resolution: on a random LLaMA bfloat16 gave sensitivities 3x float32's at scale 0.01, 14% off at 0.1).
    """
    import pandas as pd

    if directions < 1:
        raise InputError(f"{param('directions')} must be >= 1, got {directions}")
    if not scale > 0:
        raise InputError(f"{param('scale')} must be > 0, got {scale}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    m, ids = subj.model, subj.input_ids
    if torch.finfo(subj.dtype).eps > torch.finfo(torch.float32).eps:  # bfloat16 / float16: see the Raises section
        raise InputError(f"analyze overmix measures relative changes of about 1e-3 to 1e-2, which {subj.dtype} "
                         f"(resolution {torch.finfo(subj.dtype).eps:.1e}) cannot resolve; run it with {param('dtype', 'float32')} "
                         "(on any device)")
    N, T = ids.shape
    base0 = run_model(m, ids, batch_size=batch_size)
    pos, rate = sink_position(base0.stats, eps)
    if sources is None:
        sources = sorted({max(pos + 1, T // 8), max(pos + 1, T // 4), max(pos + 1, T // 2)})
    bad = [s for s in sources if not pos < s < T - 1]
    if bad:
        raise InputError(f"source position {bad[0]} must lie after the sink position {pos} and before T - 1 = {T - 1}")
    emb = adapt(m).embeddings
    with torch.no_grad():
        e = emb(ids.to(input_device(m))).float().cpu()  # (N, T, d) float32, whatever the model's dtype
    g = torch.Generator().manual_seed(subj.seed)
    # paired design: the same sources, directions (and probe) for both conditions
    pairs = []  # (source, direction index, (N, d) unit vectors)
    for s in sources:
        for j in range(directions):
            u = torch.randn(N, e.shape[-1], generator=g)
            pairs.append((s, j, u / u.norm(dim=-1, keepdim=True)))
    conditions = {"sink intact": None, "sink removed": lambda l, w, **_: remove_key(w, pos)}
    rows, pair_rows, curves = [], [], {}
    for cond, edit in conditions.items():
        curves[cond], cnt = _condition(m, ids, e, pairs, cond, edit, scale, batch_size, rows, pair_rows)
    table = pd.DataFrame(rows)
    last = curves["sink intact"].shape[0] - 1
    far = [k for k in range(1, T) if cnt[k] > 0]
    per_layer = _per_layer(pair_rows)
    lastrow = per_layer.iloc[last]
    higher, npairs = int(lastrow["pairs_removed_higher"]), int(lastrow["pairs"])
    summary = {
        "sink_position": pos, "sink_rate": rate, "sources": sources, "directions": directions, "scale": scale,
        "num_samples": N, "seq_len": T, "design": "paired: the same sources and directions in both conditions",
        "averaging": "mean over distances >= 1, unweighted over distance bins (each distance counts once, "
                     "whatever its number of (source, direction) pairs)",
        "last_layer_mean_sensitivity_distance_ge1": {c: float(v[last, far].mean()) for c, v in curves.items()},
        "all_layers_mean_sensitivity_distance_ge1": {c: float(v[:, far].mean()) for c, v in curves.items()},
        "last_layer_relative_change_over_pairs": {
            "mean": float(lastrow["change_mean"]), "std": float(lastrow["change_std"]),
            "min": float(lastrow["change_min"]), "max": float(lastrow["change_max"]),
            "pairs_removed_higher": higher, "pairs": npairs, "sign_test_p": sign_test_p(higher, npairs)},
        "last_layer_verdict": pair_verdict(higher, npairs),
        "relative_change_by_layer": [float(x) for x in per_layer["change_mean"]],
        "last_layer_curve_by_distance": {c: [float(x) for x in v[last, : len(far) + 1]] for c, v in curves.items()},
    }

    plot = functools.partial(_plot, curves=curves, far=far, last=last)
    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "sources": sources, "directions": directions, "scale": scale}
    return AnalysisResult("overmix", summary, {"sensitivity": table, "per_layer": per_layer}, {"overmix": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("overmix", settings, subj))


def _condition(m, ids: Tensor, e: Tensor, pairs: list, cond: str, edit, scale: float, batch_size: int,
               rows: list, pair_rows: list) -> tuple[Tensor, Tensor]:
    """One condition (``edit`` on every pass, None: intact): each (source, direction, (N, d) unit vectors) of
    ``pairs`` perturbs the (N, T, d) input embeddings ``e`` at its source by ``scale * ||e_s|| * u``, against
    the unperturbed pass under the same edit. Appends the rows of the ``sensitivity`` table to ``rows`` and
    one row per (pair, layer) to ``pair_rows``. Returns the (L, T) mean sensitivity by distance and the (T,)
    number of pairs at each distance."""
    T = ids.shape[1]
    ref = run_model(m, ids, edit=edit, hidden=True, batch_size=batch_size).hidden
    acc = torch.zeros(ref.shape[1], T, dtype=torch.float64)
    cnt = torch.zeros(T, dtype=torch.float64)
    for s, j, u in pairs:
        delta = torch.zeros_like(e)
        delta[:, s] = scale * e[:, s].norm(dim=-1, keepdim=True) * u
        pert = run_model(m, ids, edit=edit, hidden=True, batch_size=batch_size, embed_delta=delta).hidden
        sens = sensitivity(ref, pert, s)  # (L, T - s)
        acc[:, : T - s] += sens
        cnt[: T - s] += 1
        for l in range(sens.shape[0]):
            pair_rows.append({"condition": cond, "source": s, "direction": j, "layer": l,
                              "sensitivity_distance_ge1": float(sens[l, 1:].mean())})
    curve = acc / cnt.clamp_min(1)  # (L, T): by distance
    for l in range(curve.shape[0]):
        for k in range(T):
            if cnt[k] > 0:
                rows.append({"condition": cond, "layer": l, "distance": k, "sensitivity": float(curve[l, k]),
                             "count": int(cnt[k])})
    return curve, cnt


def _per_layer(pair_rows: list[dict]):
    """Per layer: intact and removed sensitivity over the (source, direction) pairs, and the spread of each
    pair's relative change removed / intact - 1 (mean, std, min, max, pairs where it is > 0, pairs)."""
    import pandas as pd

    pt = pd.DataFrame(pair_rows).pivot_table(index=["source", "direction", "layer"], columns="condition",
                                             values="sensitivity_distance_ge1").reset_index()
    pt["relative_change"] = pt["sink removed"] / pt["sink intact"] - 1  # per (source, direction) pair
    return pt.groupby("layer").agg(
        intact=("sink intact", "mean"), removed=("sink removed", "mean"),
        change_mean=("relative_change", "mean"), change_std=("relative_change", "std"),
        change_min=("relative_change", "min"), change_max=("relative_change", "max"),
        pairs_removed_higher=("relative_change", lambda x: int((x > 0).sum())),
        pairs=("relative_change", "size")).reset_index()


def _plot(path, *, curves: dict, far: list[int], last: int) -> None:
    """The last layer's sensitivity by distance and every layer's mean over distances >= 1, per condition."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c, v in curves.items():
        axes[0].plot(far, v[last, far], marker="o", ms=2, label=c)
        axes[1].plot(range(v.shape[0]), v[:, far].mean(dim=1), marker="o", ms=3, label=c)
    axes[0].set_xlabel("distance from the perturbed token")
    axes[0].set_ylabel("relative change ||dh|| / ||h||")
    axes[0].set_title(f"last layer ({last})")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("layer")
    axes[1].set_ylabel("mean relative change, distance >= 1\n(each distance bin once, as the summary; "
                       "per_layer.csv: mean over pairs)", fontsize=8)
    axes[1].set_yscale("log")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

