"""Raw statistics of a probe set, the input of every sink metric."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class ProbeStats:
    """Statistics of ``N`` probe sequences of ``T`` tokens through ``L`` layers.

    All positions are 0-based (position 0 is the paper's token 1).

    Attributes:
        mass: (N, L, H, T) float64 attention mass ``alpha`` on every key position
            (Gu et al. 2025, Eq. 2); for causal layers the mean over the ``T - j``
            queries that see key ``j``, for bidirectional layers over all ``T``.
        hidden_norms: (N, L, T) float32 l2 norm of each layer's output hidden state.
        max_abs: (N, L) largest ``|h|`` entry of each layer's output.
        median_abs: (N, L) median ``|h|`` entry of each layer's output.
        max_position: (N, L) int64 token position of that largest entry.
        max_channel: (N, L) int64 hidden channel of that largest entry.
        key_norms: (N, L, H_kv, T) l2 norms of the keys (after RoPE), or None.
        value_norms: (N, L, H_kv, T) l2 norms of the values, or None.
        extra_mass: (N, L, H) mass on a virtual key (learned sink token, key bias,
            sink logit) for models that have one, else None.
        causal: whether the layers were causal (False for an encoder).
        renormalised: True when the attention rows were not normalised by the
            operation itself and were renormalised to sum to 1 before the metric.
        collector: name of the collector that produced ``mass``.
        notes: free-form remarks (e.g. a fallback that was taken).
        mass_visible: (N, L, H, T) float64 mask-aware attention mass: the sum of the
            attention on key ``j`` over all queries divided by the number of queries the
            model's own mask lets see ``j`` (sliding window, prefix LM); None means equal to
            ``mass`` (plain causal or bidirectional attention).
        mask: the mask the probe ran under, as :meth:`sinklab.attention_masks.MaskSpec.to_dict`:
            ``{"causal": bool, "prefix_len": int, "window": int | None}`` (the window of the last
            windowed layer; models that mix windowed and global layers count each layer with its
            own mask); ``MaskSpec.from_dict(stats.mask)`` gives the spec back.
        layer_masks: each of the ``L`` layers' own mask in the same form (Gemma 2 / 3 mix windowed and global
            layers), or None for statistics made without it.
        layer_ids: 0-based block index of each of the ``L`` layers, or None when layer l is
            block l. A hybrid model (attention + SSM blocks) keeps only its attention blocks here.
        other_layers: block index -> class name of the blocks without attention (not in ``L``).
        attention_entropy: (N, L, H) float64 mean over the T query positions of each query's
            attention entropy ``-sum_j A[i, j] log A[i, j]`` in nats (a virtual key's weight counted
            as one more entry; rows taken as ``|w| / sum |w|``), when the capture computed it
            (``collect(..., entropy=True)``), else None.
        gated_mass: (N, L, H, T) float64 gate-weighted attention mass for models whose heads are gated after
            attention (DESIGN "gate-weighted attention"): ``mean over queries i >= j of A[i, j] * m[i]`` with
            ``m`` the head's gate magnitude for query i (:func:`sinklab.metrics.gate_magnitude`: ``|g|``, or the
            mean ``|g|`` over the head's channels for an element-wise gate), the paper's denominator as
            ``mass``; a layer without a gate counts as gate 1 (its ``mass``). None for a model without gates.
        gated_mass_visible: (N, L, H, T) the mask-aware gate-weighted attention mass (the sum over every query
            the layer's mask lets see key j, divided by their number, as ``mass_visible``), when the model is
            gated and some layer's mask hides keys (``mass_visible`` is set); else None.
        gate_mean: (N, L, H) float64 mean over queries of each head's gate magnitude (1 for a layer without a
            gate), with ``gated_mass``; else None.
    """

    mass: Tensor
    hidden_norms: Tensor
    max_abs: Tensor
    median_abs: Tensor
    max_position: Tensor
    max_channel: Tensor
    key_norms: Tensor | None = None
    value_norms: Tensor | None = None
    extra_mass: Tensor | None = None
    causal: bool = True
    renormalised: bool = False
    collector: str = "eager"
    notes: list[str] = field(default_factory=list)
    mass_visible: Tensor | None = None
    mask: dict = field(default_factory=dict)
    layer_masks: list[dict] | None = None
    layer_ids: list[int] | None = None
    other_layers: dict[int, str] = field(default_factory=dict)
    attention_entropy: Tensor | None = None
    gated_mass: Tensor | None = None
    gate_mean: Tensor | None = None
    gated_mass_visible: Tensor | None = None

    @property
    def block_ids(self) -> list[int]:
        """0-based block index of each layer (``layer_ids``, or 0..L-1)."""
        return list(self.layer_ids) if self.layer_ids is not None else list(range(self.num_layers))

    @property
    def num_samples(self) -> int:
        return self.mass.shape[0]

    @property
    def num_layers(self) -> int:
        return self.mass.shape[1]

    @property
    def num_heads(self) -> int:
        return self.mass.shape[2]

    @property
    def seq_len(self) -> int:
        return self.mass.shape[3]

    @staticmethod
    def concat(parts: list["ProbeStats"]) -> "ProbeStats":
        """Join the statistics of several batches along the sample axis."""
        first = parts[0]

        def cat(name: str) -> Tensor | None:
            vals = [getattr(p, name) for p in parts]
            return None if vals[0] is None else torch.cat(vals, dim=0)

        notes: list[str] = []
        for p in parts:
            notes.extend(n for n in p.notes if n not in notes)
        return ProbeStats(
            mass=cat("mass"),
            hidden_norms=cat("hidden_norms"),
            max_abs=cat("max_abs"),
            median_abs=cat("median_abs"),
            max_position=cat("max_position"),
            max_channel=cat("max_channel"),
            key_norms=cat("key_norms"),
            value_norms=cat("value_norms"),
            extra_mass=cat("extra_mass"),
            causal=first.causal,
            renormalised=first.renormalised,
            collector=first.collector,
            notes=notes,
            mass_visible=None if any(p.mass_visible is None for p in parts) else cat("mass_visible"),
            mask=dict(first.mask),
            layer_masks=None if first.layer_masks is None else [dict(m) for m in first.layer_masks],
            layer_ids=None if first.layer_ids is None else list(first.layer_ids),
            other_layers=dict(first.other_layers),
            attention_entropy=None if any(p.attention_entropy is None for p in parts) else cat("attention_entropy"),
            gated_mass=None if any(p.gated_mass is None for p in parts) else cat("gated_mass"),
            gated_mass_visible=None if any(p.gated_mass_visible is None for p in parts) else cat("gated_mass_visible"),
            gate_mean=None if any(p.gate_mean is None for p in parts) else cat("gate_mean"),
        )

    @property
    def visible_mass(self) -> Tensor:
        """(N, L, H, T) mask-aware attention mass (``mass`` when the two coincide)."""
        return self.mass if self.mass_visible is None else self.mass_visible
