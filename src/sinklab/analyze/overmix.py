"""``overmix``: how far a small perturbation of one token's input embedding spreads, layer by layer,
with the sink intact and with attention to it removed (Barbero et al. 2025: sinks keep deep models from
over-mixing)."""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.analyze.common import AnalysisResult, Subject, command_line, resolve_subject, run_model, sink_position
from sinklab.analyze.intervene import remove_key
from sinklab.capture.native import is_native
from sinklab.errors import InputError


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


def overmix(
    model: "str | Subject" = "smollm2-135m",
    *,
    corpus: str | None = None,
    num_samples: int = 16,
    seq_len: int = 64,
    seed: int = 0,
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
    twice: with the sink intact, and with attention to the sink position removed in every layer
    (intervention (a), :func:`~sinklab.analyze.intervene.remove_key`), each against its own unperturbed pass.

    Args:
        sources: 0-based positions s (default T/8, T/4, T/2, all > the sink position).
        directions: random directions per source. scale: perturbation size relative to ``||e_s||``.

    Returns:
        :class:`AnalysisResult`: table ``sensitivity`` (condition, layer, distance from s, mean relative
        change, number of (source, direction) pairs), plot ``overmix``; the summary's
        ``last_layer_curve_by_distance`` is indexed by distance (index 0 = the perturbed token itself).

    Raises:
        InputError: a source outside (sink position, T - 1), directions < 1 or scale <= 0.
    """
    import pandas as pd

    if directions < 1:
        raise InputError(f"--directions must be >= 1, got {directions}")
    if not scale > 0:
        raise InputError(f"--scale must be > 0, got {scale}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed)
    m, ids = subj.model, subj.input_ids
    N, T = ids.shape
    base0 = run_model(m, ids, batch_size=batch_size)
    pos, rate = sink_position(base0.stats, eps)
    if sources is None:
        sources = sorted({max(pos + 1, T // 8), max(pos + 1, T // 4), max(pos + 1, T // 2)})
    bad = [s for s in sources if not pos < s < T - 1]
    if bad:
        raise InputError(f"source position {bad[0]} must lie after the sink position {pos} and before T - 1 = {T - 1}")
    emb = m.embed if is_native(m) else m.get_input_embeddings()
    with torch.no_grad():
        e = emb(ids).float()  # (N, T, d)
    g = torch.Generator().manual_seed(subj.seed)
    conditions = {"sink intact": None, "sink removed": lambda l, w, **_: remove_key(w, pos)}
    rows = []
    curves = {}
    for cond, edit in conditions.items():
        ref = run_model(m, ids, edit=edit, hidden=True, batch_size=batch_size).hidden
        acc = torch.zeros(ref.shape[1], T, dtype=torch.float64)
        cnt = torch.zeros(T, dtype=torch.float64)
        for s in sources:
            for _ in range(directions):
                u = torch.randn(N, e.shape[-1], generator=g)
                u = u / u.norm(dim=-1, keepdim=True)
                delta = torch.zeros_like(e)
                delta[:, s] = scale * e[:, s].norm(dim=-1, keepdim=True) * u
                pert = run_model(m, ids, edit=edit, hidden=True, batch_size=batch_size, embed_delta=delta).hidden
                sens = sensitivity(ref, pert, s)  # (L, T - s)
                acc[:, : T - s] += sens
                cnt[: T - s] += 1
        curve = acc / cnt.clamp_min(1)  # (L, T): by distance
        curves[cond] = curve
        for l in range(curve.shape[0]):
            for k in range(T):
                if cnt[k] > 0:
                    rows.append({"condition": cond, "layer": l, "distance": k, "sensitivity": float(curve[l, k]),
                                 "count": int(cnt[k])})
    table = pd.DataFrame(rows)
    last = ref.shape[1] - 1
    far = [k for k in range(1, T) if cnt[k] > 0]
    summary = {
        "sink_position": pos, "sink_rate": rate, "sources": sources, "directions": directions, "scale": scale,
        "num_samples": N, "seq_len": T,
        "last_layer_mean_sensitivity_distance_ge1": {c: float(v[last, far].mean()) for c, v in curves.items()},
        "all_layers_mean_sensitivity_distance_ge1": {c: float(v[:, far].mean()) for c, v in curves.items()},
        "last_layer_curve_by_distance": {c: [float(x) for x in v[last, : len(far) + 1]] for c, v in curves.items()},
    }

    def plot(path):
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
        axes[1].set_ylabel("mean relative change, distance >= 1")
        axes[1].set_yscale("log")
        for ax in axes:
            ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "sources": sources, "directions": directions, "scale": scale}
    return AnalysisResult("overmix", summary, {"sensitivity": table}, {"overmix": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("overmix", settings))
