"""Accumulates one batch's per-layer statistics as the forward pass runs.

Attention seams call :meth:`BatchRecorder.add_attention` once per layer in
execution order; hidden-state hooks call :meth:`BatchRecorder.add_hidden`. Each
layer is reduced immediately, so no layer's T x T matrix outlives its own call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.attention_masks import CAUSAL, MaskSpec
from sinklab.capture.stats import ProbeStats
from sinklab.errors import CaptureError, InputError
from sinklab.metrics.sink import (
    attention_mass_from_column_sums,
    gate_magnitude,
    attention_mass_visible_from_column_sums,
    visible_key_counts,
)


def _mean_over_queries(x: Tensor, query_mask: Tensor | None) -> Tensor:
    """(B, H, T_q) per-query values -> (B, H) float64 on CPU: their mean over the queries, over ``query_mask``'s
    (B or 1, H or 1, T_q) real queries only when given (a left-padded batch)."""
    x = x.to(torch.float64)
    if query_mask is None:
        return x.mean(dim=-1).cpu()
    qm = query_mask.to(device=x.device, dtype=torch.float64)
    return ((x * qm).sum(dim=-1) / qm.sum(dim=-1).clamp_min(1.0)).cpu()


def median_nonnegative(x: Tensor) -> Tensor:
    """Lower median of each row of a non-negative float32 matrix, as ``x.median(dim=1).values``.

    ``torch.median`` sorts-selects the whole row (35 ms for SmolLM2's 4096 x 576 hidden
    entries on one core); here a radix selection: non-negative float32 values order as
    their bit patterns, so a histogram of the top 16 bits (one ``bincount``) finds the
    bucket holding the median and only that bucket is selected exactly (about 6x faster).

    Args:
        x: (B, N) float32, every entry >= 0 with its sign bit clear, or NaN (as ``abs()`` gives), N >= 1.

    Returns:
        (B,) float32: the ``(N - 1) // 2``-th smallest entry of each row (0-based: the lower
        of the two middle values for even N); NaN for a row holding a NaN, as ``torch.median``.

    Raises:
        InputError: not a non-empty 2-D float32 tensor, or a negative entry.
    """
    if x.dim() != 2 or x.shape[1] == 0 or x.dtype != torch.float32:
        raise InputError(f"expected a non-empty (B, N) float32 tensor, got {tuple(x.shape)} {x.dtype}")
    kth = (x.shape[1] - 1) // 2  # 0-based rank of the lower median
    out = torch.full((x.shape[0],), float("nan"), dtype=x.dtype, device=x.device)
    has_nan = torch.isnan(x).any(dim=1).tolist()
    for b, row in enumerate(x):
        if has_nan[b]:
            continue
        top = row.contiguous().view(torch.int32) >> 16  # order-preserving for floats >= 0 (sign bit 0)
        try:
            below = torch.bincount(top).cumsum_(0)  # below[v]: entries whose top 16 bits are <= v
        except RuntimeError:  # bincount refuses negative values: a negative float (sign bit set)
            raise InputError("median_nonnegative needs entries >= 0 (sign bit clear, as abs() gives)") from None
        bucket = int(torch.searchsorted(below, kth, right=True))  # first v with more than kth entries <= v
        skipped = int(below[bucket - 1]) if bucket > 0 else 0
        out[b] = row[top == bucket].kthvalue(kth - skipped + 1).values
    return out


class BatchRecorder:
    """Per-layer statistics of one batch of ``B`` sequences of ``T`` tokens."""

    def __init__(self, num_layers: int, collector: str, *, keep_hidden: bool = False, entropy: bool = False) -> None:
        self.num_layers = num_layers
        #: the seams compute each layer's row entropies (:meth:`add_attention`'s ``entropy``) when True
        self.wants_entropy = entropy
        self.entropy: list[Tensor | None] = [None] * num_layers
        #: with ``keep_hidden``, ``full_hidden[l]`` keeps layer l's whole output (B, T, d) float32
        self.keep_hidden = keep_hidden
        self.full_hidden: list[Tensor | None] = [None] * num_layers
        #: (B, T, V) logits when the seam ran the model's head (``logits=True``), else None
        self.logits: Tensor | None = None
        self.collector = collector
        self.attn_calls = 0
        self.mass: list[Tensor | None] = [None] * num_layers
        self.mass_visible: list[Tensor | None] = [None] * num_layers
        self.masked = False  # some layer's mask differs from plain causal / bidirectional
        self.mask: dict = CAUSAL.to_dict()  # MaskSpec.to_dict() of the last masked layer, if any
        self.layer_masks: list[dict | None] = [None] * num_layers  # each layer's own MaskSpec.to_dict()
        self.extra: list[Tensor | None] = [None] * num_layers
        #: gated layers: the gate magnitude (B, H, T_q) float64 handed over by :meth:`add_gate` before the layer's
        #: attention, the gate-weighted attention mass (B, H, T) and the mean gate magnitude over queries (B, H)
        self.gate: list[Tensor | None] = [None] * num_layers
        self.gated_mass: list[Tensor | None] = [None] * num_layers
        self.gated_mass_visible: list[Tensor | None] = [None] * num_layers  # the mask-aware gate-weighted mass
        self.gate_mean: list[Tensor | None] = [None] * num_layers
        self.key_norms: list[Tensor | None] = [None] * num_layers
        self.value_norms: list[Tensor | None] = [None] * num_layers
        self.hidden: list[tuple[Tensor, ...] | None] = [None] * num_layers
        #: (B, T) bool, the real tokens of a left-padded batch once an attention layer has seen its mask (None: all)
        self.real_tokens: Tensor | None = None
        self.causal = True
        self.renormalised = False
        self.notes: list[str] = []
        #: 0-based index of the block whose forward is running (set by the capture's pre-hooks), or None:
        #: attention calls are then attributed to that block, so hybrid models (attention + SSM blocks)
        #: record each attention layer under its own block index
        self.current_block: int | None = None
        #: block index -> class name of the blocks that have no attention (SSM / Mamba blocks of a hybrid)
        self.block_types: dict[int, str] = {}

    def next_layer(self) -> int:
        """Index (0-based) of the block whose attention is being called: the running block when the
        capture tracks blocks (:attr:`current_block`), else the call's place in execution order."""
        idx = self.attn_calls if self.current_block is None else self.current_block
        self.attn_calls += 1
        if idx >= self.num_layers:
            raise CaptureError(f"attention was called {idx + 1} times for a model with {self.num_layers} layers")
        return idx

    def add_gate(self, layer: int, gate: Tensor) -> None:
        """Record the output gate of gated layer ``layer`` (0-based): ``gate`` (B, H, T_q, G), the factor each
        head's output is multiplied by (G = 1 head-wise, G = D element-wise). The seams call it before the
        layer's attention, which then passes :meth:`add_attention` the gate-weighted column sums
        (:func:`~sinklab.metrics.gate_weighted_column_sums` with :meth:`gate_of`)."""
        m = gate_magnitude(gate)  # (B, H, T_q)
        self.gate[layer] = m
        self.gate_mean[layer] = m.mean(dim=-1).cpu()

    def gate_of(self, layer: int) -> Tensor | None:
        """The gate magnitude (B, H, T_q) float64 of ``layer`` (:func:`~sinklab.metrics.gate_magnitude`), or None
        for a layer without a gate."""
        return self.gate[layer] if 0 <= layer < self.num_layers else None

    def add_attention(
        self,
        layer: int,
        column_sums: Tensor,
        mask: MaskSpec,
        *,
        key: Tensor | None = None,
        value: Tensor | None = None,
        extra: Tensor | None = None,
        renormalised: bool = False,
        causal_column_sums: Tensor | None = None,
        entropy: Tensor | None = None,
        gated_column_sums: Tensor | None = None,
        visible_counts: Tensor | None = None,
        gated_visible_sums: Tensor | None = None,
        query_mask: Tensor | None = None,
    ) -> None:
        """Record a layer's attention.

        Two masses are kept: the paper's (Gu et al. 2025, Eq. 2: the sum over queries
        ``i >= j`` divided by ``T - j``, or by ``T`` for a bidirectional layer) and the
        mask-aware one (the sum over every query divided by the number of queries the
        layer's mask lets see key ``j``, :func:`~sinklab.metrics.visible_key_counts`).

        Args:
            layer: 0-based layer index.
            column_sums: (B, H, T) sums over all queries of the attention on each key.
            mask: the layer's mask (:class:`~sinklab.attention_masks.MaskSpec`): ``causal`` sets the
                attention-mass denominator; a prefix (prefix LM) or a window narrower than T makes
                the mask-aware mass differ from the paper's.
            causal_column_sums: (B, H, T) sums over queries ``i >= j`` only, needed with a
                prefix (where queries before ``j`` may see ``j``); default ``column_sums``.
            key, value: (B, H_kv, T, D) keys (after RoPE) and values, or None.
            extra: (B, H, T_q) attention on a virtual key (sink token / bias / sink logit), or None.
            renormalised: rows were renormalised to sum to 1 before the column sums.
            entropy: (B, H, T_q) each query's attention entropy in nats, or None; its mean over
                the T_q queries (over ``query_mask``'s, with one) is kept, (B, H).
            gated_visible_sums: (B, H, T) the gate-weighted sums over every query that sees key ``j`` (with a
                prefix, the queries before ``j`` too), for the mask-aware gate-weighted mass; default
                ``gated_column_sums`` (the same without a prefix).
            visible_counts: (B or 1, H or 1, T) number of queries the layer's own mask tensor lets see each
                key (a transformers model that passes one: chunked attention, a padded batch), or None: the
                counts of ``mask``. Used, and the layer counted as masked, when it differs from the plain
                causal / bidirectional counts.
            gated_column_sums: (B, H, T) for a gated layer, ``sum_i A[b, h, i, j] * m[b, h, i]`` with ``m`` the
                gate magnitude of :meth:`gate_of`; its mass (the paper's denominator) is the gate-weighted
                attention mass.
            query_mask: (B or 1, H or 1, T_q) bool, the queries of real tokens of a left-padded batch (its pads see
                no key and add nothing to the column sums), or None: every query.

        Raises:
            CaptureError: gate-weighted column sums for a layer whose gate was not recorded.
        """
        causal, prefix_len, window = mask.causal, mask.prefix_len, mask.window
        self.causal = causal
        self.layer_masks[layer] = mask.to_dict()
        self.renormalised = self.renormalised or renormalised
        paper_sums = column_sums if causal_column_sums is None else causal_column_sums
        self.mass[layer] = attention_mass_from_column_sums(paper_sums, causal=causal).cpu()
        T = column_sums.shape[-1]
        counts = None
        if visible_counts is not None and not bool(
                (visible_counts == visible_key_counts(T, MaskSpec(causal=causal), device=visible_counts.device)).all()):
            self.masked = True  # the mask tensor hides keys the plain mask shows (chunked attention)
            self.mask = {**mask.to_dict(), "from_mask_tensor": True}
            counts = visible_counts.to(device=column_sums.device, dtype=torch.float64).clamp_min(1.0)  # no query: 0
        elif prefix_len or (window is not None and window < T):
            self.masked = True
            self.mask = mask.to_dict()
            counts = visible_key_counts(T, mask, device=column_sums.device)
        else:
            if not self.masked:
                self.mask["causal"] = causal
        self.mass_visible[layer] = (self.mass[layer] if counts is None
                                    else attention_mass_visible_from_column_sums(column_sums, counts).cpu())
        if extra is not None:
            self.extra[layer] = extra.to(torch.float64).mean(dim=-1).cpu()
        if query_mask is not None:  # a left-padded batch: the real tokens of each row, (B, T)
            self.real_tokens = query_mask.any(dim=1)
            if self.gate[layer] is not None:  # the gate's mean over the row's real queries only
                self.gate_mean[layer] = _mean_over_queries(self.gate[layer], query_mask)
        if gated_column_sums is not None:
            if self.gate[layer] is None:
                raise CaptureError(f"gate-weighted attention of layer {layer} without its gate")
            self.gated_mass[layer] = attention_mass_from_column_sums(gated_column_sums, causal=causal).cpu()
            gv = gated_column_sums if gated_visible_sums is None else gated_visible_sums
            self.gated_mass_visible[layer] = (self.gated_mass[layer] if counts is None
                                              else attention_mass_visible_from_column_sums(gv, counts).cpu())
            self.gate[layer] = None  # used: no (B, H, T_q) per layer outlives its attention call
        if entropy is not None:
            self.entropy[layer] = _mean_over_queries(entropy, query_mask)
        if key is not None:
            self.key_norms[layer] = key.float().norm(dim=-1).cpu()
        if value is not None:
            self.value_norms[layer] = value.float().norm(dim=-1).cpu()

    def add_hidden(self, layer: int, hidden: Tensor) -> None:
        """Record a layer's output hidden state ``hidden`` (B, T, d); in a left-padded batch (:attr:`real_tokens`)
        each row's largest and median |h| are taken over its real tokens only."""
        h = hidden.detach().float()
        if self.keep_hidden:
            self.full_hidden[layer] = h.cpu()
        B, T, d = h.shape
        real = self.real_tokens
        if real is not None and tuple(real.shape) == (B, T) and not bool(real.all()):
            # a left-padded batch: each row's largest and median |h| over its real tokens only (pads carry no text)
            real = real.to(h.device)
            rows = []
            for b in range(B):
                pos = real[b].nonzero()[:, 0]  # (n_b,) positions of the row's real tokens
                a = h[b, pos].abs().reshape(1, -1)
                m, f = a.max(dim=1)
                rows.append((m, median_nonnegative(a), pos[f // d], f % d))
            max_abs, med, at, ch = (torch.cat(x) for x in zip(*rows))
            self.hidden[layer] = (h.norm(dim=-1).cpu(), max_abs.cpu(), med.cpu(), at.cpu(), ch.cpu())
            return
        a = h.abs().reshape(B, T * d)
        max_abs, flat = a.max(dim=1)
        self.hidden[layer] = (
            h.norm(dim=-1).cpu(),  # (B, T)
            max_abs.cpu(),
            median_nonnegative(a).cpu(),  # = a.median(dim=1).values, faster
            (flat // d).cpu(),
            (flat % d).cpu(),
        )

    def finish(self) -> ProbeStats:
        """Stack the attention layers into a :class:`ProbeStats`.

        In a hybrid model the blocks without attention (named in :attr:`block_types`: SSM / Mamba
        blocks) are left out of every per-layer tensor and listed in ``ProbeStats.other_layers``;
        ``ProbeStats.layer_ids`` gives each kept layer's block index.

        Raises:
            CaptureError: a block with attention (or any block, when the block types are unknown)
                recorded no attention statistics, or hidden states are missing.
        """
        missing = [i for i, m in enumerate(self.mass) if m is None and i not in self.block_types]
        if missing or all(m is None for m in self.mass):
            raise CaptureError(
                f"no attention statistics were captured for layers {missing or list(range(self.num_layers))}: "
                "this model's attention could not be intercepted"
            )
        if any(h is None for h in self.hidden):
            raise CaptureError("hidden states of some layers were not captured")
        keep = [i for i, m in enumerate(self.mass) if m is not None]
        if len(keep) < self.num_layers:
            for name in ("mass", "mass_visible", "extra", "key_norms", "value_norms", "hidden", "entropy",
                         "gated_mass", "gated_mass_visible", "gate_mean", "layer_masks"):
                setattr(self, name, [getattr(self, name)[i] for i in keep])

        def stack(items: list, dim: int = 1) -> Tensor | None:
            return None if any(x is None for x in items) else torch.stack(items, dim=dim)

        hid = list(zip(*self.hidden))  # 5 lists of per-layer tensors
        gated_mass = gated_visible = gate_mean = None
        if any(g is not None for g in self.gated_mass):
            # a layer without a gate multiplies its heads' outputs by 1: its gate-weighted mass is its mass
            gated_mass = torch.stack([m if g is None else g for m, g in zip(self.mass, self.gated_mass)], dim=1)
            if self.masked:
                gated_visible = torch.stack([m if g is None else g for m, g in
                                             zip(self.mass_visible, self.gated_mass_visible)], dim=1)
            gate_mean = torch.stack([torch.ones(m.shape[:2], dtype=torch.float64) if g is None else g
                                     for m, g in zip(self.mass, self.gate_mean)], dim=1)
        return ProbeStats(
            mass=torch.stack(self.mass, dim=1),  # (B, L, H, T)
            hidden_norms=torch.stack(hid[0], dim=1),  # (B, L, T)
            max_abs=torch.stack(hid[1], dim=1),
            median_abs=torch.stack(hid[2], dim=1),
            max_position=torch.stack(hid[3], dim=1),
            max_channel=torch.stack(hid[4], dim=1),
            key_norms=stack(self.key_norms),
            value_norms=stack(self.value_norms),
            extra_mass=stack(self.extra),
            attention_entropy=stack(self.entropy),
            gated_mass=gated_mass,
            gated_mass_visible=gated_visible,
            gate_mean=gate_mean,
            causal=self.causal,
            renormalised=self.renormalised,
            collector=self.collector,
            notes=list(self.notes),
            mass_visible=torch.stack(self.mass_visible, dim=1) if self.masked else None,
            mask=dict(self.mask),
            layer_masks=[dict(m) if m is not None else dict(self.mask) for m in self.layer_masks],
            layer_ids=keep if len(keep) < self.num_layers else None,
            other_layers={i: self.block_types[i] for i in sorted(self.block_types)},
        )
