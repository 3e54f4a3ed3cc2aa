"""The bundle of sink metrics reported by ``sinklab measure`` and the training tracker."""

from __future__ import annotations

import math
from typing import Any

import torch

from sinklab.attention_masks import MaskSpec
from sinklab.errors import InputError
from sinklab.metrics.entropy import uniform_attention_entropy
from sinklab.metrics.sink import (
    bootstrap_sink_rate_ci,
    massive_activation_ratio,
    norm_ratio,
    sink_rate,
    sink_rate_per_head,
    sink_rate_per_layer,
    sink_rate_virtual,
)

#: a :class:`sinklab.capture.ProbeStats` (the metrics layer sits below capture and does not import it)
_ProbeStats = Any


def _r(x: torch.Tensor, nd: int = 6) -> Any:
    """Tensor -> nested lists of floats rounded to ``nd`` decimals (JSON friendly)."""
    if x.dim() == 0:
        return round(float(x), nd)
    return [_r(v, nd) for v in x]


def _ci(x: torch.Tensor) -> list[list[float | None]]:
    """(K, 2) interval bounds -> nested lists rounded to 4 decimals; a NaN bound (no interval: one
    sample, see :func:`bootstrap_sink_rate_ci`) becomes None (JSON null, an empty CSV cell)."""
    return [[None if math.isnan(float(b)) else round(float(b), 4) for b in row] for row in x]


def rankable_positions(seq_len: int, causal: bool, min_share: float = 0.1) -> int:
    """Number of leading key positions eligible as "top sink" (0-based ``j < result``).

    In a causal model the attention mass on key ``j`` is a mean over only ``T - j``
    queries, so the last keys' masses rest on one or two queries (the last query's
    attention to itself) and are not sinks in any useful sense. Keys seen by fewer
    than ``min_share * T`` queries are excluded from the ranking; a bidirectional
    encoder keeps every position.
    """
    if not causal:
        return seq_len
    return max(1, seq_len - math.ceil(min_share * seq_len) + 1)


def summarize(
    stats: _ProbeStats,
    eps: float = 0.3,
    positions: int = 8,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Every sink metric of a probe set, as plain JSON-serialisable values.

    Positions in the output lists are 0-based indices (index 0 = the paper's token 1).

    Keys:
        ``sink_rate`` (K,) percent, ``sink_rate_ci`` (K, 2) bootstrap CI in percent ([None, None] for
        every position when N = 1: one sample has no interval),
        ``sink_rate_curve`` (T,) sink rate at every position, ``sink_rate_per_layer`` (L, K),
        ``sink_rate_per_head`` (L, H, K), ``attention_mass`` (L, H, K) mean over samples,
        ``attention_mass_first`` mean mass on position 0, ``norm_ratio`` / ``norm_ratio_median``
        (K,) ``Sink'_k`` mean over samples, ``max_norm_ratio`` and ``max_norm_ratio_position``,
        ``top_sink_position`` (argmax of the sink rate curve over the positions that at
        least 10% of the queries see, see :func:`rankable_positions`) with ``top_sink_rate`` (its
        sink rate: eps applied per sample, as for every ``sink_rate*`` key) and
        ``top_sink_mean_mass_head_share`` (the one quantity with eps applied to a *mean over
        samples*: the share, in [0, 1], of (layer, head) pairs whose sample-mean mass there
        exceeds eps), ``has_sink`` (False when no (sample, layer, head) puts mass > eps on any of those
        positions: ``top_sink_position`` is then only the arg-max of zeros), ``strongest_layers`` (0-based indices into the L layers, sorted by sink rate at
        position 0, top 3), ``layer_ids`` (L,) the 0-based block index of each layer (a hybrid model's
        attention blocks; 0..L-1 otherwise), ``other_layers`` {block index: class name} of the blocks
        without attention (SSM / Mamba blocks of a hybrid model; empty otherwise),
        ``hidden_norm_sink`` / ``hidden_norm_others`` (L,) mean l2 norm of the top sink
        token vs the other tokens, ``massive_activation_ratio`` (L,) mean max/median
        ``|h|``, ``key_norm`` / ``value_norm`` (L, H_kv, K) when captured, ``extra_mass``
        (L, H) when the model has a virtual sink key, with ``sink_rate_virtual`` (Sink*, percent) and
        ``sink_rate_virtual_per_layer`` (L,), the mask-aware ``sink_rate_visible`` (K,) with
        ``sink_rate_visible_ci``, ``sink_rate_visible_per_layer``, ``attention_mass_visible``,
        ``attention_mass_first_visible`` (the mass averaged over the queries the model's own mask lets
        see each key), ``mask`` and ``mask_aware_differs`` (True when some layer's mask hides keys
        beyond plain causal or bidirectional attention -- a sliding window shorter than T, a prefix LM
        -- so the mask-aware values differ from the plain ones),
        ``attention_entropy`` (L, H) nats: the mean over
        samples and query positions of each head's attention entropy, with ``attention_entropy_per_layer``
        (L,) its mean over heads and ``attention_entropy_uniform_per_layer`` (L,) the value of evenly spread
        attention under each layer's own mask (:func:`~sinklab.metrics.entropy.uniform_attention_entropy`),
        ``attention_entropy_uniform`` that value when every layer has it (None for a model that mixes
        sliding-window and global layers), when the
        capture recorded entropies, for models whose heads are gated after attention (DESIGN "gate-weighted
        attention", ``stats.gated_mass``) ``sink_rate_gated`` (K,) percent with ``sink_rate_gated_ci``,
        ``sink_rate_gated_per_layer`` (L, K), ``sink_rate_gated_per_head`` (L, H, K), ``attention_mass_gated``
        (L, H, K), ``attention_mass_first_gated`` (the same metrics on the gate-weighted attention mass; with a
        mask that hides keys also ``sink_rate_gated_visible``, ``sink_rate_gated_visible_per_layer``,
        ``attention_mass_gated_visible``, ``attention_mass_first_gated_visible``, the mask-aware ones) and
        ``gate_mean`` (L, H) each head's mean gate magnitude over samples and queries, plus ``eps``, ``positions``,
        ``num_samples``, ``seq_len``, ``causal``, ``renormalised``, ``collector``.

    Raises:
        InputError: eps outside (0, 1) or ``positions`` < 1.
    """
    if positions < 1:
        raise InputError(f"positions must be >= 1, got {positions}")
    K = min(positions, stats.seq_len)
    mass = stats.mass
    curve = sink_rate(mass, eps)  # (T,)
    sink = _top_sink(mass, curve, eps, K, stats.causal)
    top = sink["top_sink_position"]
    ratio = norm_ratio(stats.hidden_norms, "mean").mean(dim=0)  # (T,)
    ratio_med = norm_ratio(stats.hidden_norms, "median").mean(dim=0)
    per_layer = sink_rate_per_layer(mass, eps, K)
    hn = stats.hidden_norms.to(torch.float64).mean(dim=0)  # (L, T)
    others = torch.cat([hn[:, :top], hn[:, top + 1 :]], dim=1)
    out: dict[str, Any] = {
        "eps": eps,
        "positions": K,
        "num_samples": stats.num_samples,
        "seq_len": stats.seq_len,
        "causal": stats.causal,
        "renormalised": stats.renormalised,
        "collector": stats.collector,
        "sink_rate": _r(curve[:K], 4),
        "sink_rate_ci": _ci(bootstrap_sink_rate_ci(mass, eps, K, n_boot=n_boot, level=level, seed=seed)),
        "sink_rate_curve": _r(curve, 4),
        "sink_rate_per_layer": _r(per_layer, 4),
        "sink_rate_per_head": _r(sink_rate_per_head(mass, eps, K), 2),
        "attention_mass": _r(mass[..., :K].mean(dim=0)),
        "attention_mass_first": round(float(mass[..., 0].mean()), 6),
        "norm_ratio": _r(ratio[:K], 4),
        "norm_ratio_median": _r(ratio_med[:K], 4),
        "max_norm_ratio": round(float(ratio.max()), 4),
        "max_norm_ratio_position": int(ratio.argmax()),
        **sink,
        "layer_ids": stats.block_ids,
        "other_layers": {str(i): name for i, name in stats.other_layers.items()},
        "hidden_norm_sink": _r(hn[:, top], 4),
        "hidden_norm_others": _r(others.mean(dim=1) if others.numel() else hn[:, top] * 0, 4),
        "massive_activation_ratio": _r(massive_activation_ratio(stats.max_abs, stats.median_abs).mean(dim=0), 2),
    }
    _add_mask_aware(out, stats, eps, K, n_boot=n_boot, level=level, seed=seed)
    _add_captured_extras(out, stats, eps, K)
    if stats.gated_mass is not None:  # DESIGN "gate-weighted attention"
        g = stats.gated_mass
        out["sink_rate_gated"] = _r(sink_rate(g, eps, K), 4)
        out["sink_rate_gated_ci"] = _ci(bootstrap_sink_rate_ci(g, eps, K, n_boot=n_boot, level=level, seed=seed))
        out["sink_rate_gated_per_layer"] = _r(sink_rate_per_layer(g, eps, K), 4)
        out["sink_rate_gated_per_head"] = _r(sink_rate_per_head(g, eps, K), 2)
        out["attention_mass_gated"] = _r(g[..., :K].mean(dim=0))
        out["attention_mass_first_gated"] = round(float(g[..., 0].mean()), 6)
        gv = stats.gated_mass_visible
        if gv is not None:  # some layer's mask hides keys: the mask-aware variant, as sink_rate_visible
            out["sink_rate_gated_visible"] = _r(sink_rate(gv, eps, K), 4)
            out["sink_rate_gated_visible_per_layer"] = _r(sink_rate_per_layer(gv, eps, K), 4)
            out["attention_mass_gated_visible"] = _r(gv[..., :K].mean(dim=0))
            out["attention_mass_first_gated_visible"] = round(float(gv[..., 0].mean()), 6)
        out["gate_mean"] = _r(stats.gate_mean.to(torch.float64).mean(dim=0), 4)
    return out


def _top_sink(mass: torch.Tensor, curve: torch.Tensor, eps: float, K: int, causal: bool) -> dict[str, Any]:
    """:func:`summarize`'s top-sink keys of ``mass`` (N, L, H, T) with its sink-rate ``curve`` (T,):
    ``top_sink_position``, ``top_sink_rate``, ``has_sink``, ``top_sink_mean_mass_head_share`` and
    ``strongest_layers`` (by Sink_1 over the first ``K`` positions' per-layer rates)."""
    top = int(curve[: rankable_positions(mass.shape[-1], causal)].argmax())
    per_layer = sink_rate_per_layer(mass, eps, K)
    return {
        "top_sink_position": top,
        "top_sink_rate": round(float(curve[top]), 4),
        "has_sink": bool(float(curve[top]) > 0),
        "top_sink_mean_mass_head_share": round(float((mass[..., top].mean(dim=0) > eps).to(torch.float64).mean()), 4),
        "strongest_layers": [int(i) for i in per_layer[:, 0].argsort(descending=True, stable=True)[:3]],
    }


def _add_mask_aware(out: dict[str, Any], stats: _ProbeStats, eps: float, K: int, *, n_boot: int, level: float,
                    seed: int) -> None:
    """:func:`summarize`'s mask-aware keys (``mask``, ``mask_aware_differs``, ``sink_rate_visible*``,
    ``attention_mass*_visible``; with a mask that hides keys also ``top_sink_position_visible``,
    ``top_sink_rate_visible``, ``has_sink_visible``, ``top_sink_mean_mass_head_share_visible`` and
    ``strongest_layers_visible``, the plain ones' mask-aware twins), added to ``out`` in place (after
    ``sink_rate_ci``, which they reuse)."""
    vis = stats.visible_mass
    out["mask"] = dict(stats.mask) or MaskSpec(causal=stats.causal).to_dict()
    out["mask_aware_differs"] = stats.mass_visible is not None
    out["sink_rate_visible"] = _r(sink_rate(vis, eps, K), 4)
    out["sink_rate_visible_ci"] = (out["sink_rate_ci"] if stats.mass_visible is None
                                   else _ci(bootstrap_sink_rate_ci(vis, eps, K, n_boot=n_boot, level=level, seed=seed)))
    out["sink_rate_visible_per_layer"] = _r(sink_rate_per_layer(vis, eps, K), 4)
    out["attention_mass_visible"] = _r(vis[..., :K].mean(dim=0))
    out["attention_mass_first_visible"] = round(float(vis[..., 0].mean()), 6)
    if stats.mass_visible is not None:  # the top sink and strongest layers as the mask-aware rate sees them
        out.update({f"{k}_visible": v for k, v in _top_sink(vis, sink_rate(vis, eps), eps, K, stats.causal).items()})


def _add_captured_extras(out: dict[str, Any], stats: _ProbeStats, eps: float, K: int) -> None:
    """:func:`summarize`'s keys of what the capture recorded only for some models (key/value norms,
    attention entropies, the virtual sink key's mass), added to ``out`` in place (after ``mask``)."""
    if stats.key_norms is not None:
        out["key_norm"] = _r(stats.key_norms[..., :K].to(torch.float64).mean(dim=0), 4)
    if stats.value_norms is not None:
        out["value_norm"] = _r(stats.value_norms[..., :K].to(torch.float64).mean(dim=0), 4)
    if stats.attention_entropy is not None:
        ent = stats.attention_entropy.to(torch.float64).mean(dim=0)  # (L, H)
        m = out["mask"]
        out["attention_entropy"] = _r(ent, 4)
        out["attention_entropy_per_layer"] = _r(ent.mean(dim=1), 4)
        # each layer's own mask (Gemma 2 / 3 mix windowed and global layers): one uniform value per layer, the
        # scalar only when every layer has the same (else None: read attention_entropy_uniform_per_layer)
        own = getattr(stats, "layer_masks", None) or [m] * ent.shape[0]
        uniforms = [round(uniform_attention_entropy(stats.seq_len, MaskSpec.from_dict(x, causal=stats.causal)), 4)
                    for x in own]
        out["attention_entropy_uniform"] = uniforms[0] if len(set(uniforms)) == 1 else None
        out["attention_entropy_uniform_per_layer"] = uniforms
    if stats.extra_mass is not None:
        out["extra_mass"] = _r(stats.extra_mass.mean(dim=0))
        out["sink_rate_virtual"] = round(sink_rate_virtual(stats.extra_mass, eps), 4)
        out["sink_rate_virtual_per_layer"] = [round(sink_rate_virtual(stats.extra_mass[:, l : l + 1], eps), 4)
                                              for l in range(stats.num_layers)]
