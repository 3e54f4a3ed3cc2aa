"""Eviction policies of the streaming cache: which tokens a layer keeps at a fixed budget.

Every policy keeps at most ``budget`` tokens per layer between calls; the new tokens of a call
first attend to the kept ones and to each other, then the cache is cut back to ``budget``
(:class:`sinklab.streaming.SinkCache`). Slots stay in stream order, so the positions assigned
inside the cache (slot k at ``P0 - K + k``) keep the order of the stream.

* ``window`` -- the ``budget`` most recent tokens.
* ``sinks`` -- StreamingLLM (Xiao et al. 2024, sec. 3.2): the first ``n_sink`` tokens of the stream
  and the ``budget - n_sink`` most recent.
* ``h2o`` -- Heavy-Hitter Oracle (Zhang et al. 2023, "H2O", sec. 4 / Alg. 1): the ``recent`` most
  recent tokens (default half of the budget) and the tokens with the largest attention accumulated
  over every query since they arrived. One kept set per layer for all heads (the scores summed over
  the query heads; the paper keeps one set per head), so a layer's cache is the cache of a set of
  tokens that a from-scratch forward can reproduce.
* ``tova`` -- Token Omission Via Attention (Oren et al. 2024, "Transformers are Multi-State RNNs",
  sec. 4): the tokens with the largest attention from the current (last) query, averaged over the
  layer's heads, as in the paper; the newest token is a candidate too.
* ``sinks+h2o``, ``sinks+tova`` -- the same, the first ``n_sink`` tokens always kept.
* ``snapkv``, ``pyramidkv``, ``knorm`` -- prefill-time policies (presses): applied at the end of every
  call that brings more than one token (the prompt, or each chunk of a chunked prefill,
  :mod:`sinklab.streaming.prefill`), they keep the prompt's tokens by a score; at a one-token decode
  step they evict the oldest kept token (first in, first out), so the budget holds while the decoded
  tokens push the compressed prompt out. See :class:`PrefillPolicy`.
* ``detected-sinks`` -- sinklab's own sink metric measured on the fly: the attention mass of a kept
  token ``alpha[h, j] = mean over the queries i >= j that saw it of A[h, i, j]`` (Gu et al. 2025,
  Eq. 2; nothing is lost from the mean since a kept token was seen by every later query) flags it
  as a sink in head h when it exceeds ``eps`` (0.3, the sink rate's threshold). The cache keeps the
  ``budget - n_sink`` most recent tokens and, among the older ones, up to ``n_sink`` flagged sinks
  (most flagged heads first, then the largest mass), wherever they are in the stream: secondary
  sinks beyond the first token included; slots no sink needs go to the next most recent tokens.

The three attention-based policies read the attention weights of every call (per row of the
batch: each stream keeps its own tokens), from an eager attention (``transformers``) or the
reference path of a ``sinklab train`` model.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.errors import InputError, param
from sinklab.registry import Registry

#: the sink metric's default threshold on a token's attention mass (the sink rate's eps)
DEFAULT_EPS = 0.3

#: cache policies by name; each entry a class built per layer as ``cls(budget, n_sink=, recent=, eps=, **options)``
POLICIES: Registry[type] = Registry("cache policy")


class CachePolicy:
    """One layer's eviction rule (one instance per layer).

    Class attributes:
        needs_scores: reads attention weights (:meth:`observe`); its kept sets are per row.
        uses_sinks: takes ``n_sink`` (default 4); the others refuse ``n_sink > 0``.
        takes_recent: takes ``recent``.
        needs_keys: reads the new keys of every call (:meth:`observe_keys`); its kept sets are per row.
        prefill_time: a prefill-time policy (:class:`PrefillPolicy`).
        OPTIONS: the policy's own options (``policy_options``) and their defaults.

    Args:
        budget: tokens kept between calls (>= 1).
        n_sink: sink tokens (first ones, or the most detected ones for ``detected-sinks``).
        recent: most recent tokens always kept (``h2o``; default half of what the sinks leave).
        eps: sink threshold of ``detected-sinks``.
    """

    needs_scores = False
    uses_sinks = False
    takes_recent = False
    contiguous = False  # keeps runs of slots known in advance (:meth:`ranges`)
    needs_keys = False
    prefill_time = False
    OPTIONS: dict = {}

    def __init__(self, budget: int, n_sink: int = 0, recent: int | None = None, eps: float = 0.3, **options) -> None:
        self.budget, self.n_sink, self.eps = budget, n_sink, eps
        self.recent = recent
        bad = sorted(set(options) - set(self.OPTIONS))
        if bad:
            raise InputError(f"{param('policy_options')} {bad} are not options of this policy (it takes "
                             f"{sorted(self.OPTIONS) or 'none'})")
        self.given = dict(options)  # as given (fresh() passes these, not the defaults filled in)
        self.options = {**self.OPTIONS, **options}

    @property
    def per_row(self) -> bool:
        """True where the rows of a batch keep different tokens (a policy that scores them)."""
        return self.needs_scores or self.needs_keys

    def fresh(self) -> "CachePolicy":
        """A new, empty policy with this one's budget and options."""
        return type(self)(self.budget, self.n_sink, self.recent, self.eps, **self.given)

    def observe_keys(self, keys: Tensor) -> None:
        """Take a call's new keys (B, H_kv, q, head_dim) (policies with ``needs_keys``)."""

    def keep(self, n: int, order: Tensor) -> Tensor | None:
        """Slots to keep out of ``n`` (sorted ascending; (K',) for every row or (B, K') per row), or None
        when nothing is evicted. ``order`` (n,) or (B, n): arrival index (0-based) of each slot."""
        raise NotImplementedError

    def observe(self, weights: Tensor, q: int) -> None:
        """Take the attention weights (B, H, q, n) of the q new queries on the n slots."""

    def select(self, idx: Tensor) -> None:
        """Keep the policy's per-slot state for slots ``idx`` (B, K')."""

    def batch(self, fn) -> None:
        """Apply ``fn`` (a function of a tensor's batch dimension) to the per-slot state."""

    @property
    def nbytes(self) -> int:
        """Bytes of per-slot state (scores)."""
        return 0


def _top(score: Tensor, protect: Tensor, budget: int) -> Tensor:
    """(B, budget) slot indices, sorted: every protected slot ((B, n) or (n,) bool, at most ``budget``
    of them) and the highest ``score`` (B, n) among the rest."""
    s = score.masked_fill(protect, float("inf"))
    return s.topk(budget, dim=-1).indices.sort(dim=-1).values


@POLICIES.register("window")
class WindowPolicy(CachePolicy):
    """The budget most recent tokens."""

    contiguous = True

    def ranges(self, n: int) -> list[tuple[int, int]] | None:
        """The slots :meth:`keep` keeps out of n, as [start, stop) runs (None: nothing evicted)."""
        return None if n <= self.budget else [(n - self.budget, n)]

    def keep(self, n, order):
        if n <= self.budget:
            return None
        return torch.arange(n - self.budget, n, device=order.device)


@POLICIES.register("sinks")
class SinksPolicy(CachePolicy):
    """StreamingLLM: the first n_sink tokens and the budget - n_sink most recent (Xiao et al. 2024)."""

    uses_sinks = True
    contiguous = True

    def ranges(self, n: int) -> list[tuple[int, int]] | None:
        """The slots :meth:`keep` keeps out of n, as [start, stop) runs (None: nothing evicted)."""
        if n <= self.budget:
            return None
        return [r for r in ((0, self.n_sink), (n - (self.budget - self.n_sink), n)) if r[1] > r[0]]

    def keep(self, n, order):
        if n <= self.budget:
            return None
        dev = order.device
        return torch.cat((torch.arange(self.n_sink, device=dev), torch.arange(n - (self.budget - self.n_sink), n, device=dev)))


class _ScoreState(CachePolicy):
    """A policy that keeps one score per kept slot (``score``: (B, n) float64, or None before any), moved with
    the slots it scores: gathered on a cut, transformed with the batch (beam search), counted in ``nbytes``."""

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)
        self.score: Tensor | None = None  # (B, n) float64

    def select(self, idx):
        if self.score is not None and self.score.shape[-1] >= idx.shape[-1]:
            self.score = self.score.gather(1, idx)

    def batch(self, fn):
        if self.score is not None:
            self.score = fn(self.score)

    @property
    def nbytes(self):
        return 0 if self.score is None else self.score.numel() * self.score.element_size()


class _Scored(_ScoreState):
    needs_scores = True

    def _protected(self, n: int, order: Tensor) -> Tensor:
        return order < self.n_sink  # the first n_sink arrivals (none without sinks)

    def keep(self, n, order):
        if n <= self.budget:
            return None
        return _top(self.score, self._protected(n, order), self.budget)


@POLICIES.register("h2o")
class H2OPolicy(_Scored):
    """Heavy hitters by attention accumulated since arrival + a recent window (Zhang et al. 2023)."""

    takes_recent = True

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)
        free = budget - n_sink
        self.recent = free // 2 if recent is None else recent
        if not 0 <= self.recent <= free:
            raise InputError(f"h2o's recent window must lie in [0, budget - n_sink = {free}], got {self.recent}")

    def observe(self, weights, q):
        add = weights.to(torch.float64).sum(dim=(1, 2))  # (B, n): over query heads and the q queries
        old = self.score
        self.score = add if old is None else torch.cat((old, old.new_zeros(old.shape[0], q)), dim=1) + add

    def _protected(self, n, order):
        recent = torch.arange(n, device=order.device) >= n - self.recent  # (n,)
        return (order < self.n_sink) | recent


@POLICIES.register("tova")
class TOVAPolicy(_Scored):
    """The tokens with the most attention from the current query, mean over heads (Oren et al. 2024)."""

    def observe(self, weights, q):
        self.score = weights[:, :, -1, :].to(torch.float64).mean(dim=1)  # (B, n)


@POLICIES.register("sinks+h2o")
class SinksH2OPolicy(H2OPolicy):
    """h2o with the first n_sink tokens always kept."""

    uses_sinks = True


@POLICIES.register("sinks+tova")
class SinksTOVAPolicy(TOVAPolicy):
    """tova with the first n_sink tokens always kept."""

    uses_sinks = True


class SinkMetric:
    """sinklab's sink metric measured on the fly over a cache's slots (one per layer).

    The attention mass of a kept slot j in head h is ``alpha[h, j] = mean over the queries i >= j
    that saw it of A[h, i, j]`` (Gu et al. 2025, "When Attention Sink Emerges in Language Models",
    Eq. 2; nothing is lost from the mean, since a kept token was seen by every later query); the
    slot is flagged as a sink when ``alpha[h, j] > eps`` in at least one head (the sink rate's
    threshold, 0.3). Used by the ``detected-sinks`` policy and by ``sinks_full_precision =
    "detected"`` (:mod:`sinklab.streaming.quant`).

    Args:
        eps: the threshold, in (0, 1).

    Attributes:
        mass_sum: (B, H, n) float64, the sum over the queries so far of ``A[h, i, j]``; None before
            the first :meth:`observe`.
        count: (B, n) float64, queries that saw each slot.

    Raises:
        InputError: ``eps`` outside (0, 1).
    """

    def __init__(self, eps: float = 0.3) -> None:
        if not 0.0 < eps < 1.0:
            raise InputError(f"eps must lie in (0, 1), got {eps}")
        self.eps = eps
        self.mass_sum: Tensor | None = None
        self.count: Tensor | None = None

    def observe(self, weights: Tensor, q: int) -> None:
        """Add the attention weights (B, H, q, n) of q new queries on the n slots, the last q of which
        are new (slot n - q + c is seen by q - c of them, causally)."""
        B, H, _, n = weights.shape
        add = weights.to(torch.float64).sum(dim=2)  # (B, H, n)
        new = (q - torch.arange(q, device=weights.device, dtype=torch.float64)).expand(B, q)  # new slot c: q - c queries
        if self.mass_sum is None:
            self.mass_sum, self.count = add, new.clone()
        else:
            self.mass_sum = torch.cat((self.mass_sum, self.mass_sum.new_zeros(B, H, q)), dim=2) + add
            self.count = torch.cat((self.count + q, new), dim=1)

    def mass(self) -> Tensor:
        """(B, H, n) float64 attention mass of each kept slot: sinklab's ``alpha`` over the queries so far."""
        return self.mass_sum / self.count[:, None, :]

    def flagged(self) -> Tensor:
        """(B, n) bool: slots whose mass exceeds eps in at least one head (sinks by sinklab's metric)."""
        return (self.mass() > self.eps).any(dim=1)

    def select(self, idx: Tensor) -> None:
        """Keep slots ``idx``: (B, K') per row, or (K',) for every row."""
        if self.mass_sum is None:
            return
        if idx.dim() == 1:
            idx = idx[None].expand(self.count.shape[0], -1)
        self.mass_sum = self.mass_sum.gather(2, idx[:, None, :].expand(-1, self.mass_sum.shape[1], -1))
        self.count = self.count.gather(1, idx)

    def batch(self, fn) -> None:
        """Apply ``fn`` (a function of a tensor's batch dimension) to the state."""
        if self.mass_sum is not None:
            self.mass_sum, self.count = fn(self.mass_sum), fn(self.count)

    @property
    def nbytes(self) -> int:
        """Bytes of the state (``mass_sum`` and ``count``)."""
        return sum(t.numel() * t.element_size() for t in (self.mass_sum, self.count) if t is not None)


@POLICIES.register("detected-sinks")
class DetectedSinksPolicy(_Scored):
    """Up to n_sink tokens flagged by the on-the-fly sink metric (alpha > eps in a head) + the most recent."""

    uses_sinks = True

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)
        self.metric = SinkMetric(eps)  # checks eps

    @property
    def mass_sum(self) -> Tensor | None:
        """(B, H, n) float64: sum over queries of A[h, i, j] (:class:`SinkMetric`)."""
        return self.metric.mass_sum

    @property
    def count(self) -> Tensor | None:
        """(B, n) float64: queries that saw each slot."""
        return self.metric.count

    def observe(self, weights, q):
        self.metric.observe(weights, q)

    def mass(self) -> Tensor:
        """(B, H, n) float64 attention mass of each kept slot: sinklab's ``alpha`` over the queries so far."""
        return self.metric.mass()

    def flagged(self) -> Tensor:
        """(B, n) bool: slots whose mass exceeds eps in at least one head (sinks by sinklab's metric)."""
        return self.metric.flagged()

    def keep(self, n, order):
        if n <= self.budget:
            return None
        alpha = self.mass()
        heads = (alpha > self.eps).sum(dim=1).to(torch.float64)  # (B, n) flagged heads
        slot = torch.arange(n, device=order.device, dtype=torch.float64)
        score = torch.where(heads > 0, 2.0 + heads + alpha.amax(dim=1), slot / n)  # sinks first, then recency
        return _top(score, slot >= n - (self.budget - self.n_sink), self.budget)

    def select(self, idx):
        self.metric.select(idx)

    def batch(self, fn):
        self.metric.batch(fn)

    @property
    def nbytes(self):
        return self.metric.nbytes


class PrefillPolicy(_ScoreState):
    """A prefill-time policy (a "press"): scores the kept and new tokens at the end of every call that
    brings ``q > 1`` tokens (a prompt, or one chunk of a chunked prefill) and keeps the ``budget``
    best; at a one-token decode step it evicts the oldest kept token (first in, first out).

    One kept set per layer and row, as sinklab's ``h2o`` and ``tova``: the per-head scores are
    averaged over the layer's heads, so a layer's cache is the cache of a set of tokens, which a
    from-scratch forward over those tokens at their positions reproduces. SnapKV (Li et al. 2024),
    PyramidKV (Cai et al. 2024) and kvpress keep one set per KV head instead; at one KV head the two
    agree. The kept slots stay in stream order (sorted by arrival, whatever the score order; kvpress's
    presses keep the score order of ``topk``).

    A prompt much longer than the budget in one call attends to all of itself before the cut (the
    presses' protocol); :func:`sinklab.streaming.prefill.prefill` feeds it in chunks instead, the
    policy then applied at the end of each chunk (each chunk's last queries score the cache).
    """

    prefill_time = True

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)  # score: of the slots of the last call (None: decode)
        self.protect = 0  # most recent slots kept whatever their score (the observation window)
        self.q = 0  # new tokens of the last call

    def keep(self, n, order):
        if n <= self.budget:
            return None
        if self.q > 1 and self.score is not None:
            recent = torch.arange(n, device=order.device) >= n - min(self.protect, self.budget)
            return _top(self.score, recent, self.budget)
        keep = torch.arange(n - self.budget, n, device=order.device)  # decode step: the oldest goes
        return keep.expand(order.shape[0], -1) if order.dim() == 2 else keep


def pool_scores(x: Tensor, kernel: int, pooling: str) -> Tensor:
    """SnapKV's clustering: pool scores ``x`` (..., n) along the slots with a window of ``kernel`` slots
    (odd), stride 1 and ``kernel // 2`` padding on each side, so the output has n entries; ``avgpool``
    counts the zero padding in the mean (``torch.nn.functional.avg_pool1d``'s default, as SnapKV's
    ``snapkv_utils.py`` and PyramidKV's ``pyramidkv_utils.py`` call it), ``maxpool`` ignores it."""
    import torch.nn.functional as F

    shape = x.shape
    flat = x.reshape(-1, 1, shape[-1])
    if pooling == "maxpool":
        out = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        out = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    return out.reshape(shape)


@POLICIES.register("snapkv")
class SnapKVPolicy(PrefillPolicy):
    """SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation", sec. 4.1-4.2,
    Alg. 1; FasterDecoding/SnapKV ``snapkv_utils.py``, kvpress's ``SnapKVPress``): the last ``w`` queries
    of the prompt (the observation window) vote for the earlier tokens.

    For a call of q > 1 tokens on n slots (kept + new) with weights ``A[h, i, j]`` (B, H, q, n):
    ``w = min(observation_window, q)``; for each earlier slot j < n - w,
    ``s[h, j] = sum over the last w queries i of A[h, i, j]``, pooled along j (:func:`pool_scores`,
    ``kernel_size`` 5, ``avgpool`` or ``maxpool``); per KV head the mean over its group of query heads
    (kvpress, after FasterDecoding/SnapKV issue 22), then the mean over the layer's KV heads (one
    set per layer: equal groups, so the mean over all query heads). The cache keeps the w window slots
    and the ``budget - w`` best-scored earlier slots, in stream order.

    Options: ``observation_window`` (at most the budget; by default 32, SnapKV's, or half the budget if
    that is less; kvpress uses 64),
    ``kernel_size`` (odd, default 5), ``pooling`` (``avgpool`` default, or ``maxpool``).
    """

    needs_scores = True
    OPTIONS = {"observation_window": 32, "kernel_size": 5, "pooling": "avgpool"}

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)
        o = self.options
        w, k = o["observation_window"], o["kernel_size"]
        if not isinstance(w, int) or w < 1:
            raise InputError(f"{param('observation_window', w)} must be an integer >= 1")
        if not isinstance(k, int) or k < 1 or k % 2 == 0:
            raise InputError(f"{param('kernel_size', k)} must be an odd integer >= 1")
        if o["pooling"] not in ("avgpool", "maxpool"):
            raise InputError(f"{param('pooling', o['pooling'])} must be avgpool or maxpool")
        if "observation_window" in options and w > budget:
            raise InputError(f"{param('observation_window', w)} must not exceed the budget {budget}")
        self.window = w if "observation_window" in options else min(w, max(1, budget // 2))

    def observe(self, weights, q):
        self.q = q
        if q <= 1:
            self.score = None
            return
        n = weights.shape[-1]
        w = min(self.window, q)
        self.protect = w
        if n == w:  # every slot is in the window: nothing to vote for
            self.score = weights.new_zeros(weights.shape[0], n, dtype=torch.float64)
            return
        votes = weights[:, :, -w:, : n - w].to(torch.float64).sum(dim=2)  # (B, H, n - w)
        pooled = pool_scores(votes, self.options["kernel_size"], self.options["pooling"]).mean(dim=1)  # (B, n - w)
        self.score = torch.cat((pooled, pooled.new_zeros(pooled.shape[0], w)), dim=1)  # the window: protected


def pyramid_budgets(budget: int, n_layers: int, window: int, beta: int = 20) -> list[int]:
    """PyramidKV's per-layer budgets (Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on
    Pyramidal Information Funneling", sec. 3.3; Zefan-Cai/PyramidKV ``pyramidkv_utils.py``): of the
    ``budget - window`` slots each layer selects on average (``window`` the observation window every
    layer keeps), the top layer selects ``m = (budget - window) // beta`` and the bottom one
    ``2 (budget - window) - m``, the layers between on the straight line, so the total over the layers
    is ``n_layers * budget`` exactly (the line's values rounded down, the slots left given to the layers
    with the largest remainders). A deliberate variant of PyramidKV's code, which steps by
    ``(max - min) // (n_layers - 1)`` rounded down (upper layers get more and the total exceeds
    ``n_layers * budget``: +150 slots at 30 layers, budget 128, window 32), gives every layer SnapKV's
    uniform budget for prompts shorter than ``2 (budget - window)`` and clips the bottom layer's budget to the
    prompt: sinklab keeps the total and has neither short-prompt rule (docs/streaming.md, "Departures").

    Returns:
        the budgets of layers 0 .. n_layers - 1 (0-based, bottom first), each >= ``window``.
    """
    free = budget - window
    if n_layers == 1:
        return [budget]
    lo = free // beta
    hi = 2 * free - lo
    exact = [hi - l * (hi - lo) / (n_layers - 1) for l in range(n_layers)]
    base = [int(x) for x in exact]
    left = n_layers * free - sum(base)
    for l in sorted(range(n_layers), key=lambda l: -(exact[l] - base[l]))[:left]:
        base[l] += 1
    return [b + window for b in base]


@POLICIES.register("pyramidkv")
class PyramidKVPolicy(SnapKVPolicy):
    """PyramidKV (Cai et al. 2024; Zefan-Cai/PyramidKV): SnapKV's scores in every layer, at per-layer
    budgets that decrease with depth (:func:`pyramid_budgets`, ``beta`` 20), the same total over the
    full-attention layers as SnapKV at ``budget``. :class:`sinklab.streaming.SinkCache` gives each
    full-attention layer its budget; built alone (one layer) it is SnapKV."""

    layer_budgets = staticmethod(pyramid_budgets)


@POLICIES.register("knorm")
class KeyNormPolicy(PrefillPolicy):
    """Key norm (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache
    Compression"; kvpress's ``KnormPress``): keep the tokens whose keys have the lowest L2 norm.

    The score of a slot is minus the L2 norm of its key (over ``head_dim``), averaged over the layer's
    KV heads (kvpress scores per head); the norm is that of the key as the model computed it (a
    rotation by RoPE keeps it, so the position does not matter; a quantised store keeps the norm of
    the key before quantisation). Nothing is protected: the newest tokens of a prompt may go too.
    """

    needs_keys = True

    def __init__(self, budget, n_sink=0, recent=None, eps=0.3, **options):
        super().__init__(budget, n_sink, recent, eps, **options)
        self.norms: Tensor | None = None  # (B, n) float64 mean key norm of every slot

    def observe_keys(self, keys):
        q = keys.shape[-2]
        new = keys.to(torch.float64).norm(dim=-1).mean(dim=1)  # (B, q)
        self.norms = new if self.norms is None else torch.cat((self.norms, new), dim=1)
        self.q = q
        self.score = -self.norms

    def select(self, idx):
        if idx.dim() == 1:
            idx = idx[None].expand(self.norms.shape[0], -1)
        self.norms = self.norms.gather(1, idx)
        self.score = -self.norms

    def batch(self, fn):
        if self.norms is not None:
            self.norms = fn(self.norms)
            self.score = -self.norms

    @property
    def nbytes(self):
        return 0 if self.norms is None else self.norms.numel() * self.norms.element_size()


def make_policy(name: str, budget: int, n_sink: int | None = None, *, recent: int | None = None,
                eps: float = 0.3, options: dict | None = None) -> CachePolicy:
    """One layer's policy ``name`` from :data:`POLICIES`.

    Args:
        budget: tokens kept (>= 1).
        n_sink: sink tokens; default 4 for the policies with sinks, 0 (and nothing else) for the others.
        options: the policy's own options (:attr:`CachePolicy.OPTIONS`; ``snapkv`` / ``pyramidkv``:
            ``observation_window``, ``kernel_size``, ``pooling``).

    Raises:
        UnknownNameError: an unknown policy (the message lists the valid ones).
        InputError: ``budget < 1``, ``n_sink`` negative, not below the budget, or given to a policy
            without sinks; ``recent`` outside [0, budget - n_sink]; ``eps`` outside (0, 1); an option
            the policy does not take or out of range.
    """
    cls = POLICIES.get(name)
    if not isinstance(budget, int) or budget < 1:
        raise InputError(f"budget must be an integer >= 1, got {budget!r}")
    if n_sink is None:
        n_sink = 4 if cls.uses_sinks else 0
    if not isinstance(n_sink, int) or n_sink < 0:
        raise InputError(f"n_sink (number of sink tokens) must be an integer >= 0, got {n_sink!r}")
    if n_sink and not cls.uses_sinks:
        raise InputError(f"policy {name} keeps no sink tokens (n_sink = {n_sink}); use sinks, sinks+h2o, sinks+tova or "
                         "detected-sinks")
    if n_sink >= budget:
        raise InputError(f"policy {name} needs budget > n_sink, got budget {budget} and n_sink {n_sink}")
    if recent is not None and not cls.takes_recent:
        raise InputError(f"recent applies to h2o and sinks+h2o only, not {name}")
    return cls(budget, n_sink, recent, eps, **(options or {}))


__all__ = ["DEFAULT_EPS", "POLICIES", "CachePolicy", "PrefillPolicy", "SinkMetric", "make_policy", "pool_scores", "pyramid_budgets"]
