"""``keybias``: what the sink's key and value look like, attention share against output share, and
finding sinks without attention weights (what a KV-cache compressor needs)."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.analyze.common import (AnalysisResult, Subject, analysis, command_line, resolve_subject, run_model,
                                    sink_position)
from sinklab.errors import InputError, param
from sinklab.metrics import sink_rate_per_sample
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL


def head_statistics(weights: Tensor, query: Tensor, key: Tensor, value: Tensor, position: int, *,
                    causal: bool = True, visible: Tensor | None = None) -> dict[str, Tensor]:
    """Per-head statistics of one layer for the sink at ``position`` (0-based).

    Args:
        weights: (B, H, T, T) attention weights (rows = queries). query: (B, H, T, D);
            key, value: (B, H, T, D) (grouped-query heads repeated to H).
        position: the sink position p. causal: query i sees key j iff j <= i (else all keys).
        visible: the layer's own mask, bool, broadcastable to (B, H, T, T), True where query i sees key j
            (:attr:`sinklab.capture.sites.HookContext.mask`: a sliding window, chunks, a prefix); given, it
            replaces ``causal``.

    Returns:
        (B, H) float64 tensors ("see" under ``visible``, else under ``causal``):
        ``attention_share``: mean over the queries that see p (i >= p; all i for an encoder) of A[i, p];
        ``output_share``: mean over the same queries of ``||A[i, p] v_p|| / ||sum_j A[i, j] v_j||``
        (0 where the head output is 0);
        ``value_norm_share``: mean over the same queries of ``A[i, p] ||v_p|| / sum_j A[i, j] ||v_j||`` (the
        sink's share of the weighted value norms, before the values cancel each other in the sum);
        ``cos_sink``: mean over queries i != p that see p of cos(q_i, k_p);
        ``cos_other``: mean over visible pairs (i, j), j != p, of cos(q_i, k_j).
    """
    B, H, T, _ = weights.shape
    w = weights.double()
    if visible is None:
        vis = torch.ones(T, T, dtype=torch.bool, device=w.device)
        vis = vis.tril() if causal else vis
    else:
        vis = visible.to(device=w.device, dtype=torch.bool)
    rows = vis[..., position].double()  # (..., T): 1 for the queries that see p (the mask's own leading dims)
    n_rows = rows.sum(dim=-1)  # (...), broadcast against (B, H) below
    out = torch.matmul(w, value.double())  # (B, H, T, D)
    on = w[..., position] * value.double()[:, :, position].norm(dim=-1)[..., None]  # (B, H, T)
    on_norm = out.norm(dim=-1)
    share = torch.where(on_norm > 0, on / on_norm.clamp_min(1e-300), torch.zeros_like(on))
    parts = (w * value.double().norm(dim=-1)[:, :, None, :]).sum(dim=-1)  # (B, H, T): sum_j A[i, j] ||v_j||
    nshare = torch.where(parts > 0, on / parts.clamp_min(1e-300), torch.zeros_like(on))
    cos = torch.matmul(F.normalize(query.double(), dim=-1), F.normalize(key.double(), dim=-1).transpose(-1, -2))
    others = rows.clone()
    others[..., position] = 0.0  # the queries i != p that see p
    other_pairs = vis.clone()
    other_pairs[..., position] = False  # the visible pairs (i, j), j != p
    other_pairs = other_pairs.double()
    n_others = others.sum(dim=-1)

    def over_rows(x: Tensor) -> Tensor:  # (B, H, T) -> the mean over the queries that see p, (B, H)
        return (x * rows).sum(dim=-1) / n_rows.clamp_min(1)

    n_others = n_others.expand(B, H)
    return {
        "attention_share": over_rows(w[..., position]),
        "output_share": over_rows(share),
        "value_norm_share": over_rows(nshare),
        "cos_sink": torch.where(n_others > 0, (cos[..., position] * others).sum(dim=-1) / n_others.clamp_min(1),
                                torch.full_like(n_others, float("nan"))),
        "cos_other": (cos * other_pairs).sum(dim=(-1, -2)) / other_pairs.sum(dim=(-1, -2)).clamp_min(1),
    }


def detection(scores: Tensor, truth: Tensor, k: int) -> tuple[float, float]:
    """Precision and recall of the top-``k`` positions by ``scores`` against ``truth``.

    Args:
        scores: (N, T) higher = more sink-like. truth: (N, T) bool, the true sink positions.
        k: positions predicted per sample.

    Returns:
        (precision, recall) in [0, 1]: precision = hits / k averaged over all samples, recall = hits /
        #true averaged over samples with at least one true sink (nan if none has any).
    """
    top = scores.topk(min(k, scores.shape[1]), dim=1).indices  # (N, k)
    hits = truth.gather(1, top).double().sum(dim=1)  # (N,)
    n_true = truth.double().sum(dim=1)
    prec = float((hits / top.shape[1]).mean())
    has = n_true > 0
    rec = float((hits[has] / n_true[has]).mean()) if has.any() else float("nan")
    return prec, rec


def _layer_stats(subj: Subject, position: int, batch_size: int):
    """Run the subject with an inspecting edit: the pass, the (N, L', H) statistics of :func:`head_statistics`
    of its L' attention layers, and their 0-based block numbers."""
    per_layer: dict[int, list[dict]] = {}  # the blocks with attention (a hybrid's others never call inspect)

    def inspect(layer, w, *, query, key, value, mask=None):
        st = head_statistics(w, query, key, value, position, causal=not subj.is_encoder,
                             visible=mask)  # float64, on the model's device; under the layer's own mask
        per_layer.setdefault(layer, []).append({k: v.cpu() for k, v in st.items()})  # (B, H) each
        return None

    res = run_model(subj.model, subj.input_ids, edit=inspect, batch_size=batch_size)
    layers = sorted(per_layer)
    stacked = {name: torch.stack([torch.cat([d[name] for d in per_layer[l]]) for l in layers], dim=1)
               for name in per_layer[layers[0]][0]}  # name -> (N, L', H), L' the blocks with attention
    return res, stacked, layers


def _detection_rows(stats, eps: float, min_rate: float, T: int, ks=(1, 2, 4)) -> list[dict]:
    k_max = rankable_positions(T, stats.causal)
    truth = sink_rate_per_sample(stats.visible_mass, eps)[:, :k_max] >= min_rate  # (N, T')
    by_hidden = stats.hidden_norms.double().mean(dim=1)[:, :k_max]  # (N, T'), mean over layers
    rows = []
    methods = {"hidden_norm": by_hidden}
    if stats.key_norms is not None:
        methods["low_key_norm"] = -stats.key_norms.double().mean(dim=(1, 2))[:, :k_max]
    # baseline without any model signal: the first k positions (k = 1: "always position 0")
    methods["first_positions"] = -torch.arange(k_max, dtype=torch.float64).expand(by_hidden.shape[0], k_max)
    for name, score in methods.items():
        for k in ks:
            p, r = detection(score, truth, k)
            rows.append({"seq_len": T, "method": name, "k": k, "precision": p, "recall": r,
                         "true_sinks_per_sample": float(truth.double().sum(dim=1).mean())})
    return rows


@analysis("keybias", help={
    "position": "0-based sink position (default: the top one)",
    "min_rate": "per-sample sink rate (%) that makes a true sink",
    "long_seq_len": "long-context T for sink detection",
    "long_num_samples": "windows at the long T"})
def keybias(
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
    min_rate: float = 10.0,
    long_seq_len: int | None = 512,
    long_num_samples: int = 8,
    batch_size: int = 16,
) -> AnalysisResult:
    """The key-bias view of the sink at ``position`` (default: the top sink position), per layer and head.

    Per (layer, head): key and value l2 norms at the sink against the mean over the other positions,
    cosine between queries and the sink key against the cosine with other keys (see
    :func:`head_statistics`), attention share against output share. A head "has a sink" when its
    attention share, averaged over samples, exceeds ``eps``. Sink detection without attention
    weights: rank the positions of each sample by hidden-state norm (mean over layers), and by low key
    norm (mean over layers and KV heads), against the baseline ``first_positions`` (the first k positions,
    for k = 1 "always position 0"); truth = positions whose per-sample sink rate Sink^eps is at
    least ``min_rate`` percent; precision and recall at k = 1, 2, 4 (:func:`detection`), at ``seq_len``
    and at ``long_seq_len`` (None: skipped; needs a corpus).

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.

    Raises:
        InputError: ``position`` outside the sequence or never a sink (names the top sink position).
    """
    import pandas as pd

    if not 0.0 < min_rate <= 100.0:
        raise InputError(f"{param('min_rate')} must lie in (0, 100], got {min_rate}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    base = run_model(subj.model, subj.input_ids, batch_size=batch_size)
    pos, rate = sink_position(base.stats, eps, position)
    res, st, blocks = _layer_stats(subj, pos, batch_size)
    stats = res.stats
    N, L, H = st["attention_share"].shape
    T = subj.input_ids.shape[1]
    heads = _head_table(st, stats, pos, eps, blocks)
    det = _detection_rows(base.stats, eps, min_rate, T)
    long_note = None
    if long_seq_len is not None and subj.documents is not None and long_seq_len != T:
        long_ids = subj.windows(long_num_samples, long_seq_len)
        det += _detection_rows(run_model(subj.model, long_ids, batch_size=max(1, batch_size // 4)).stats, eps,
                               min_rate, long_seq_len)
    elif long_seq_len is not None:
        long_note = "long-context detection skipped: needs a corpus (model given as an object) or equals seq_len"
    detect = pd.DataFrame(det)
    summary = _summary(heads, pos, rate, det, {"num_samples": N, "seq_len": T, "long_seq_len": long_seq_len,
                                                "long_num_samples": long_num_samples})
    if long_note:
        summary["note"] = long_note
    plot = functools.partial(_plot, heads=heads, pos=pos)
    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "position": position, "min_rate": min_rate,
                "long_seq_len": long_seq_len, "long_num_samples": long_num_samples}
    return AnalysisResult("keybias", summary, {"heads": heads, "detection": detect}, {"keybias": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("keybias", settings, subj))


def _head_table(st: dict[str, Tensor], stats, pos: int, eps: float, blocks: list[int]):
    """One row per (layer, head): the means over samples of :func:`head_statistics` (``st``: (N, L, H)
    tensors over the L attention layers, whose 0-based block numbers are ``blocks``: a hybrid's), the key /
    value norms at the sink against the other positions (``stats``: the pass's
    :class:`~sinklab.capture.stats.ProbeStats`, its layers in the same order), and ``has_sink`` (attention
    share > eps)."""
    import pandas as pd

    N, L, H = st["attention_share"].shape
    kn, vn = stats.key_norms, stats.value_norms  # (N, L, H_kv, T)
    T = stats.visible_mass.shape[-1]
    rep = H // kn.shape[2] if kn is not None else 1
    others = torch.ones(T, dtype=torch.bool)
    others[pos] = False
    rows = []
    for l in range(L):
        for h in range(H):
            g = h // rep
            row = {"layer": blocks[l], "head": h, "kv_head": g}
            for name, t in st.items():
                row[name] = float(t[:, l, h].mean())
            if kn is not None:
                row.update({
                    "key_norm_sink": float(kn[:, l, g, pos].mean()), "key_norm_others": float(kn[:, l, g, others].mean()),
                    "value_norm_sink": float(vn[:, l, g, pos].mean()),
                    "value_norm_others": float(vn[:, l, g, others].mean()),
                })
            row["has_sink"] = row["attention_share"] > eps
            rows.append(row)
    return pd.DataFrame(rows)


def _median(x) -> float:
    """The lower median of a pandas Series (NaN skipped, as pandas does), as every median in sinklab
    (``torch.nanmedian``; pandas' own ``median`` averages the two middle values of an even count)."""
    return float(torch.nanmedian(torch.tensor(x.to_numpy(dtype="float64", copy=True))))  # a copy: pandas' view is read-only


def _summary(heads, pos: int, rate: float, det: list[dict], sizes: dict) -> dict:
    """The headline medians (lower medians) over the heads with a sink (None without any), the detection rows
    and ``sizes``."""
    s = heads[heads["has_sink"]]
    summary = {
        "sink_position": pos, "sink_rate": rate, "heads": int(len(heads)), "heads_with_sink": int(len(s)),
        "median_attention_share_sink_heads": _median(s["attention_share"]) if len(s) else None,
        "median_output_share_sink_heads": _median(s["output_share"]) if len(s) else None,
        "median_cos_sink_sink_heads": _median(s["cos_sink"]) if len(s) else None,
        "median_cos_other_sink_heads": _median(s["cos_other"]) if len(s) else None,
        "median_value_norm_share_sink_heads": _median(s["value_norm_share"]) if len(s) else None,
        "median_output_share_all_heads": _median(heads["output_share"]),
        # the hypothesis "stores attention, contributes little" predicts output share << attention share
        "median_output_over_attention_share_sink_heads":
            _median((s["output_share"] / s["attention_share"])) if len(s) else None,
        "share_of_sink_heads_output_below_attention": float((s["output_share"] < s["attention_share"]).mean()) if len(s) else None,
        "share_of_sink_heads_output_below_half_attention":
            float((s["output_share"] < 0.5 * s["attention_share"]).mean()) if len(s) else None,
        "pearson_attention_vs_output_share_sink_heads":
            float(s[["attention_share", "output_share"]].corr().iloc[0, 1]) if len(s) > 1 else None,
        "detection": det,
        **sizes,
    }
    if "key_norm_sink" in heads:
        summary["median_key_norm_ratio_sink_heads"] = _median((s["key_norm_sink"] / s["key_norm_others"])) if len(s) else None
        summary["median_value_norm_ratio_sink_heads"] = _median((s["value_norm_sink"] / s["value_norm_others"])) if len(s) else None
    return summary


def _plot(path, *, heads, pos: int) -> None:
    """Attention share against output (and value-norm) share per head; query-key cosines, sink key vs others."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    ax = axes[0]
    ax.scatter(heads["attention_share"], heads["value_norm_share"], marker="x", s=10, color="0.6",
               label="value-norm share (A_p ||v_p|| / sum_j A_j ||v_j||)")
    sc = ax.scatter(heads["attention_share"], heads["output_share"], c=heads["layer"], s=12, cmap="viridis",
                    label="output share")
    ax.legend(fontsize=7, loc="upper left")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set_xlabel(f"attention share on position {pos} (mass)")
    ax.set_ylabel("output share (||a v_sink|| / ||head output||)")
    ax.set_title("attention share vs output share, one dot per head")
    fig.colorbar(sc, ax=ax, label="layer")
    ax = axes[1]
    ax.scatter(heads["cos_other"], heads["cos_sink"], c=heads["has_sink"].map({True: "C3", False: "C0"}), s=12)
    lo = float(min(heads["cos_other"].min(), heads["cos_sink"].min()))
    hi = float(max(heads["cos_other"].max(), heads["cos_sink"].max()))
    ax.plot([lo, hi], [lo, hi], "k:", lw=1)
    ax.set_xlabel("mean cos(q, k) other keys")
    ax.set_ylabel("mean cos(q, k_sink)")
    ax.set_title("red: heads with a sink")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

