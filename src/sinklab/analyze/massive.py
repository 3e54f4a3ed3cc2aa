"""``massive``: massive activations (Sun et al. 2024) per layer, where they sit, which dimensions recur."""

from __future__ import annotations

from collections import Counter

import torch
from torch import Tensor

from sinklab.analyze.common import (AnalysisResult, Subject, analysis, command_line, resolve_subject, run_model,
                                    sink_position)
from sinklab.errors import InputError
from sinklab.zoo.models import DEFAULT_MODEL


def top_activations(hidden: Tensor, k: int = 3) -> dict[str, Tensor]:
    """The ``k`` largest ``|h|`` entries and the median ``|h|`` of each (sample, layer).

    Args:
        hidden: (N, L, T, d) block outputs (residual stream).
        k: how many entries (distinct (position, dimension) cells).

    Returns:
        ``values`` (N, L, k) float64 magnitudes, largest first; ``position`` (N, L, k) 0-based token
        positions and ``dim`` (N, L, k) hidden dimensions of those entries; ``median`` (N, L) float64
        median ``|h|`` over all T x d entries (lower median for an even count, as torch.median).

    Raises:
        InputError: ``hidden`` not 4-D or ``k`` outside [1, T d].
    """
    if hidden.dim() != 4:
        raise InputError(f"hidden must be (N, L, T, d), got {tuple(hidden.shape)}")
    N, L, T, d = hidden.shape
    if not 1 <= k <= T * d:
        raise InputError(f"k must lie in [1, {T * d}], got {k}")
    a = hidden.abs().double().reshape(N, L, T * d)
    vals, flat = a.topk(k, dim=-1)
    return {"values": vals, "position": flat // d, "dim": flat % d, "median": a.median(dim=-1).values}


@analysis("massive", help={
    "top_k": "largest entries per (sample, layer)",
    "massive_ratio": "multiple of the median |h| that makes an entry massive"})
def massive(
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
    top_k: int = 3,
    massive_ratio: float = 100.0,
    batch_size: int = 16,
) -> AnalysisResult:
    """Massive activations per layer: top-``top_k`` ``|h|`` entries, the median ``|h|`` and their ratio,
    with the dimensions and 0-based positions of the top entries; whether the largest sits on the sink
    position (the top position of Sink^eps, :func:`~sinklab.analyze.common.sink_position`); which
    dimensions recur in the top entries across layers and samples.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        model: zoo name / folder / run, or a :class:`Subject`. corpus, num_samples, seq_len, seed: the probe.
        eps: sink threshold for finding the sink position. top_k: entries per (sample, layer).
        massive_ratio: an entry counts as massive when its magnitude exceeds this multiple of the
            median ``|h|`` of its (sample, layer) (Sun et al. use about 1000; default 100).

    Returns:
        :class:`AnalysisResult` with tables ``layers`` (per layer: mean top-i magnitudes, mean median,
        ratio = median over samples of the per-sample top-1 / median (so not top1 / median of the row, which
        are means over samples), most common dimension and position of the top-1
        entry and their shares, share of samples whose top-1 sits on the sink position) and ``dims``
        (dimension, count of massive cells among the (sample, layer) top-k, share of all N L k top-k cells),
        and plot ``massive``.
    """
    import pandas as pd

    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    res = run_model(subj.model, subj.input_ids, hidden=True, batch_size=batch_size)
    sink, sink_rate_pct = sink_position(res.stats, eps)
    top = top_activations(res.hidden, top_k)
    N, L, _ = top["values"].shape
    ratio = top["values"][..., 0] / top["median"].clamp_min(1e-30)  # (N, L)
    rows = []
    for l in range(L):
        dims = Counter(top["dim"][:, l, 0].tolist())
        poss = Counter(top["position"][:, l, 0].tolist())
        (dim, dn), (pos, pn) = dims.most_common(1)[0], poss.most_common(1)[0]
        row = {"layer": l}
        for i in range(top_k):
            row[f"top{i + 1}"] = float(top["values"][:, l, i].mean())
        row.update({
            "median": float(top["median"][:, l].mean()), "ratio": float(ratio[:, l].median()),
            "top1_dim": dim, "top1_dim_share": dn / N, "top1_position": pos, "top1_position_share": pn / N,
            "top1_on_sink_share": float((top["position"][:, l, 0] == sink).double().mean()),
            "top_dims": " ".join(str(d) for d, _ in Counter(top["dim"][:, l].flatten().tolist()).most_common(3)),
        })
        rows.append(row)
    layers = pd.DataFrame(rows)
    big = top["values"] > massive_ratio * top["median"][..., None]  # (N, L, k) massive cells
    cnt = Counter(top["dim"][big].tolist())
    total = N * L * top_k
    dims_df = pd.DataFrame([{"dim": d, "count": c, "share": c / total} for d, c in cnt.most_common()],
                           columns=["dim", "count", "share"])
    best = int(layers["ratio"].idxmax())
    b = layers.iloc[best]
    summary = {
        "sink_position": sink, "sink_rate": sink_rate_pct,
        "max_ratio": float(b["ratio"]), "max_ratio_layer": best, "max_ratio_top1": float(b["top1"]),
        "max_ratio_median": float(b["median"]), "max_ratio_dim": int(b["top1_dim"]),
        "max_ratio_position": int(b["top1_position"]),
        "layers_ratio_over_100": [int(l) for l in layers.index[layers["ratio"] > 100]],
        "top1_on_sink_share_all_layers": float((top["position"][..., 0] == sink).double().mean()),
        "recurring_dims": [{"dim": int(d), "share": c / total} for d, c in cnt.most_common(5)],
        "num_samples": N, "seq_len": int(subj.input_ids.shape[1]), "num_layers": L,
        "warnings": [] if float(b["ratio"]) > massive_ratio else [
            f"no massive activation: the largest top-1/median ratio is {float(b['ratio']):.1f} (layer {best}), "
            f"below massive_ratio={massive_ratio:g}"],
    }

    def plot(path):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for i in range(top_k):
            ax.plot(layers["layer"], layers[f"top{i + 1}"], marker="o", ms=3, label=f"top-{i + 1} |h|")
        ax.plot(layers["layer"], layers["median"], marker="s", ms=3, color="k", label="median |h|")
        ax.set_yscale("log")
        ax.set_xlabel("layer (0-based)")
        ax.set_ylabel("magnitude (mean over samples)")
        ax.set_title(f"massive activations · {subj.model_info.get('name', 'model')} · N={N} T={summary['seq_len']}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N,
                "seq_len": summary["seq_len"], "seed": seed, "eps": eps, "top_k": top_k, "massive_ratio": massive_ratio}
    return AnalysisResult("massive", summary, {"layers": layers, "dims": dims_df}, {"massive": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("massive", settings, subj))
