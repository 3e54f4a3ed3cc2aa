"""A StreamingLLM KV cache (attention sinks + a window of recent tokens) on the ``transformers`` Cache API.

StreamingLLM (Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks",
sec. 3.2): keep the key/value states of the first ``n_sink`` tokens of the stream (the attention
sinks) and of the ``window`` most recent tokens; evict everything in between. Positions are
assigned *inside the cache*: the kept keys are re-rotated (:mod:`sinklab.streaming.rope`) so that,
seen from the current query, they sit at contiguous positions right before it, whatever
positions the caller used (``generate`` counts absolute positions; :func:`sinklab.streaming.harness.evaluate_stream`
passes cache positions, as the paper does). The stored keys keep the rotation the model gave
them, with that position; every read rotates them by the difference, so no rounding accumulates
over a long stream.

Semantics of one call with ``q`` new tokens, ``K`` kept tokens before the call: the new tokens
attend causally to the K kept tokens and to each other (K + q keys); afterwards the cache keeps
the first ``n_sink`` tokens of the stream and the last ``window`` tokens (so a one-token decode
step sees at most ``n_sink + window + 1`` keys, itself included). A prompt longer than
``n_sink + window`` given in one call attends to all of itself, like the full cache, and is then
cut down; :func:`sinklab.streaming.prefill.prefill` feeds it in chunks of the window instead (the
default there). The cache warns once (``warnings.warn``) at the first call that brings more new tokens
than its budget (``model.generate`` with a long prompt: use :func:`sinklab.streaming.prefill.generate`;
sinklab's own feeders, which choose their chunks, run inside :func:`long_calls_expected` and do not
warn), and once when a call uses a position past the model's trained context. Layers the model declares as sliding-window layers (Gemma 3's local layers) keep their
own window of ``sliding_window - 1`` tokens and no sinks, as the model was trained, unless the budget fits
inside that window (then the window cannot hide a kept token and the layer keeps what a full layer keeps;
:func:`own_window`).

That is the default policy, ``sinks``; others keep other tokens at the same budget
(:mod:`sinklab.streaming.policies`: window, H2O, TOVA, with or without sinks, and the sinks
sinklab's metric detects on the fly; the prefill-time SnapKV, PyramidKV with per-layer budgets, key
norm). Slots always stay in stream order, so the positions inside
the cache keep the stream's order. The attention-based policies cut the cache after the call's
attention, from its weights (a forward hook on each attention module hands them over; eager
attention only). Keys and values may be stored quantised (:mod:`sinklab.streaming.quant`),
dequantised on every read; the new tokens of a call attend to their own keys as computed.

Every row of a batch is one stream. Rows of the same length need no mask (attention-based policies
keep their own tokens per row). Rows of different lengths come **left-padded with an attention mask**
(``generate`` with a padded batch, or a manual forward given ``attention_mask``): the cache then keeps
one cache per row (:class:`PaddedRows`), whose sinks are the row's own first real tokens, whose
positions are the row's own and whose evictions are the row's own: each row computes what it computes
run alone (tests check it through several evictions, for every policy and storage). The kept tokens of
a row sit right-aligned in the slots the model attends to, so the caller's left-padding mask, indexed
the way ``transformers`` indexes it (slot j of K kept <-> mask column ``seen - K + j``), masks exactly
the empty slots of shorter rows. What cannot be honoured is refused in one line: a mask with a padding
token after a real one (right padding, holes), padding that first shows after the first call, a 4D
mask, a call without the mask once the batch is padded, and position ids that skip or repeat within a
row's real tokens.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from sinklab.capture.families import check_sink_cache
from sinklab.errors import InputError, param
from sinklab.streaming.policies import DEFAULT_EPS, POLICIES, CachePolicy, DetectedSinksPolicy, SinkMetric, make_policy
from sinklab.streaming.quant import (DETECTED, DenseKV, QuantKV, check_storage_options, make_store,
                                    parse_sinks_full_precision)
from sinklab.streaming.rope import KeyRotation, key_rotations

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")

#: True inside :func:`long_calls_expected`: calls with more new tokens than the budget are chosen, not warned about
_LONG_CALLS_EXPECTED: ContextVar[bool] = ContextVar("sinklab_long_calls_expected", default=False)


@contextmanager
def long_calls_expected():
    """Within the block no :class:`SinkCache` warns about a call with more new tokens than its budget
    (sinklab's feeders that choose their chunk sizes: :func:`sinklab.streaming.prefill.prefill`, the
    harness's latency prefill, the pass-key and long-context tasks' ``chunk``). Nests; restored after."""
    token = _LONG_CALLS_EXPECTED.set(True)
    try:
        yield
    finally:
        _LONG_CALLS_EXPECTED.reset(token)


def layer_windows(model) -> list[int | None]:
    """Per decoder layer of a ``transformers`` model: its own sliding window (tokens), or None for a
    full-attention layer.

    Raises:
        InputError: a layer type other than full or sliding attention (linear, chunked, ...).
    """
    types, kws = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    bad = sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})
    if bad:
        raise InputError(f"SinkCache supports full and sliding attention layers, this model has {', '.join(bad)}")
    return [int(kw["sliding_window"]) if t == "sliding_attention" else None for t, kw in zip(types, kws)]


def own_window(model_window: int | None, budget: int | None) -> int | None:
    """The window a layer keeps on its own under a cache of ``budget`` tokens (``n_sink + window``; None: the
    full cache), or None when the cache's policy applies to it.

    A full-attention layer (``model_window`` None) takes the cache's policy. A sliding layer of window
    ``w`` (query i sees keys i - w < j <= i) whose budget fits inside that window (``budget < w``) takes it
    too: the kept tokens sit at cache positions 0 .. budget - 1 and the query at ``budget``, so the model's
    window never hides one of them and the layer is a full layer over the kept tokens (Mistral-7B-v0.1,
    whose every layer has a 4096-token window, under StreamingLLM's 4 + 1020). Otherwise (``budget >= w``,
    or the full cache) it keeps its own ``w - 1`` recent tokens and no sinks, as the model was trained
    (Gemma 3's local layers); with the sinks policy that is what a forward over the kept tokens gives
    whenever ``window >= w - 1``.
    """
    if model_window is None or (budget is not None and budget < model_window):
        return None
    return model_window - 1


def _position_start(kwargs: dict, recorded: Tensor | None, default: int) -> int:
    """First position id of the new tokens.

    From the kwargs the attention passes to ``update`` (``transformers`` 5 LLaMA-like models call
    ``cache.update(k, v, layer_idx, kwargs=attn_kwargs)`` with the decoder layer's ``position_ids``
    (B, q) inside), else from the ids the rotary module saw (``recorded``), else ``default``: the
    model counted from ``cache.get_seq_length()``.

    Raises:
        InputError: rows of ``position_ids`` that differ (padded batches are not supported).
    """
    inner = kwargs.get("kwargs")
    pos = None
    for d in (inner if isinstance(inner, dict) else {}, kwargs):
        if isinstance(d.get("position_ids"), Tensor):
            pos = d["position_ids"]
            break
    if pos is None:
        pos = recorded
    if pos is None:
        return default
    pos = pos.reshape(-1, pos.shape[-1]) if pos.dim() > 1 else pos[None]
    if pos.shape[0] > 1 and not bool((pos == pos[:1]).all()):
        raise InputError("SinkCache needs the same position ids in every row of the batch (equal-length streams, "
                         "no padding)")
    return int(pos[0, 0])


def _position_ids(kwargs: dict, recorded: Tensor | None) -> Tensor | None:
    """The ``position_ids`` the attention passed to ``update`` (``transformers`` 5 LLaMA-like models call
    ``cache.update(k, v, layer_idx, kwargs=attn_kwargs)`` with them inside), else ``recorded``."""
    inner = kwargs.get("kwargs")
    for d in (inner if isinstance(inner, dict) else {}, kwargs):
        if isinstance(d.get("position_ids"), Tensor):
            return d["position_ids"]
    return recorded


class _StepMemo:
    """What the layers of one cache compute alike in one step, computed once: the first position id
    of a ``position_ids`` tensor, the runs of consecutive positions of a positions tensor, and the
    positions / order tensors a contiguous cut makes (:meth:`SinkCacheLayer._update_contiguous`).
    Keyed by the input tensors themselves (identity and in-place version), so a hit is the value the
    layer would compute; the layers then share those (never modified in place) tensors."""

    def __init__(self) -> None:
        self._start: tuple[Tensor, int, int] | None = None
        self._runs: tuple[Tensor, int, list[tuple[int, int, int]]] | None = None
        self._cuts: dict[tuple, tuple[Tensor, Tensor]] = {}
        self._empty: dict[torch.device, Tensor] = {}
        self._moves: tuple | None = None
        self.padded: PaddedRows | None = None  # set by SinkCache when the batch is left-padded
        self.context: int | None = None  # the model's trained context (max_position_embeddings), None: unknown
        self.warned_context = False
        self.budget: int | None = None  # the cache's budget (tokens kept between calls), None: no long-call check
        self.warned_long_call = False

    def check_call(self, q: int) -> None:
        """Warn once (per cache) at the first call with more than ``budget`` new tokens ``q`` outside
        :func:`long_calls_expected`: such a call attends to all of itself, as the full cache does, and is
        cut to the budget only afterwards (``model.generate`` prefills a long prompt that way)."""
        if self.budget is not None and q > self.budget and not self.warned_long_call \
                and not _LONG_CALLS_EXPECTED.get():
            self.warned_long_call = True
            import warnings

            warnings.warn(f"SinkCache: one call brings {q} new tokens, more than the budget of {self.budget}: they "
                          "attend to all of themselves before the cut; prefill a long prompt in chunks with "
                          "sinklab.streaming.prefill.generate (or prefill)", stacklevel=2)

    def check_context(self, last: int) -> None:
        """Warn once (per cache) when a call uses a position id ``last`` (0-based) at or past the model's
        trained context: RoPE angles the model never saw in training."""
        if self.context is not None and last >= self.context and not self.warned_context:
            self.warned_context = True
            import warnings

            warnings.warn(f"SinkCache: position {last} is past the model's trained context of {self.context} "
                          "positions (feed the stream at cache positions, or prefill in chunks)", stacklevel=2)

    def empty(self, device: torch.device) -> Tensor:
        """A (0,) int64 tensor on ``device``, the same one every time."""
        if device not in self._empty:
            self._empty[device] = torch.zeros((0,), dtype=torch.long, device=device)
        return self._empty[device]

    def position_start(self, kwargs: dict, recorded: Tensor | None, default: int) -> int:
        """:func:`_position_start`, reused for the same ``position_ids`` tensor."""
        pos = _position_ids(kwargs, recorded)
        if pos is None:
            return default
        m = self._start
        if m is not None and m[0] is pos and m[1] == pos._version:
            return m[2]
        p0 = _position_start(kwargs, recorded, default)
        self._start = (pos, pos._version, p0)
        return p0

    def position_runs(self, positions: Tensor) -> list[tuple[int, int, int]]:
        """(slot, length, first position) of each run of consecutive positions in a (K,) tensor."""
        m = self._runs
        if m is not None and m[0] is positions and m[1] == positions._version:
            return m[2]
        runs: list[tuple[int, int, int]] = []
        for slot, p in enumerate(positions.tolist()):
            if runs and runs[-1][2] + runs[-1][1] == p:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1, runs[-1][2])
            else:
                runs.append((slot, 1, p))
        self._runs = (positions, positions._version, runs)
        return runs

    def moves(self, positions: Tensor, p0: int, K: int) -> list[tuple[int, int, int | Tensor | None]]:
        """How the K kept slots move when the new tokens start at position ``p0``: (slot, length, offset)
        runs, the offset an int for a run of consecutive positions (one scalar rotation), None for an
        unmoved run, or a (length,) tensor of per-slot offsets (positions that are not consecutive: a
        stream fed at cache positions keeps every window key at the position it arrived at)."""
        key = (id(positions), positions._version, p0, K)
        m = self._moves
        if m is not None and m[0] == key and m[1] is positions:
            return m[2]
        runs = self.position_runs(positions)
        if len(runs) <= 4:
            out = [(slot, n, (p0 - K + slot - pos) or None) for slot, n, pos in runs]
        else:
            delta = (p0 - K + torch.arange(K, device=positions.device)) - positions
            idx = (delta != 0).nonzero().squeeze(-1)
            if not idx.numel():
                out = [(0, K, None)]
            else:
                a, b = int(idx[0]), int(idx[-1]) + 1  # rotation by 0 inside [a, b) is exact (cos 1, sin 0)
                out = [r for r in ((0, a, None), (a, b - a, delta[a:b]), (b, K - b, None)) if r[1]]
        self._moves = (key, positions, out)
        return out

    def runs(self, old: Tensor, start: int, q: int, ranges: list[tuple[int, int]] | None) -> Tensor:
        """``_runs(old, arange(start, start + q), ranges)`` (all of the concatenation where ranges is None)."""
        key = (id(old), old._version, start, q, None if ranges is None else tuple(ranges))
        hit = self._cuts.get(key)
        if hit is not None and hit[0] is old:
            return hit[1]
        new = torch.arange(start, start + q, device=old.device)
        out = _runs(old, new, ranges if ranges is not None else [(0, old.shape[-1] + q)])
        if len(self._cuts) >= 8:
            self._cuts.clear()
        self._cuts[key] = (old, out)
        return out


class PaddedRows:
    """The left padding of a batch held by a :class:`SinkCache`: which tokens of each call are real, per
    row, checked against everything the cache saw before.

    Built by :meth:`SinkCache.note_attention_mask` at the first call whose mask pads a row; every
    layer then keeps one cache per row (:meth:`SinkCacheLayer._update_rows`).

    Args:
        batch: number of rows B.
    """

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.lead: list[int] = [0] * batch  # leading padding tokens of each row (so far: all its tokens if not started)
        self._seen = 0  # stream length (padding included) the lead counts refer to
        self._step: tuple[int, int, list[int]] | None = None  # (seen, q, first real new token per row) of the coming call
        self._memos = [_StepMemo() for _ in range(batch)]
        self.last_position: list[int | None] = [None] * batch  # position id of each row's latest real token

    def memo(self, row: int) -> _StepMemo:
        """The step memo shared by row ``row``'s caches in every layer."""
        return self._memos[row]

    def note(self, mask: Tensor, seen: int, q: int) -> None:
        """Take the mask (B, seen + q) bool of a call with ``q`` new tokens after ``seen``.

        Raises:
            InputError: another batch size, or a mask that disagrees with what the earlier calls' masks
                said of the tokens already in the cache.
        """
        if mask.shape[0] != self.batch:
            raise InputError(f"attention_mask has {mask.shape[0]} rows, the cache holds {self.batch}")
        lead = (~mask).sum(-1).tolist()  # 0*1* rows: the number of leading padding tokens
        for r, (old, new) in enumerate(zip(self.lead, lead)):
            started = old < self._seen
            if (started and new != old) or (not started and new < self._seen):
                raise InputError(f"attention_mask row {r} disagrees with the earlier calls' masks on the tokens "
                                 "already in the cache (a padded batch's mask must only grow at the end)")
        self.lead, self._seen = lead, seen + q
        firsts = [min(q, max(0, n - seen)) for n in lead]  # each row's first real new token (q: none)
        self._step = (seen, q, firsts)

    def step_firsts(self, seen: int, q: int, batch: int) -> list[int]:
        """Per row, the index in 0..q of its first real token among a call's ``q`` new ones (q: none),
        from the mask :meth:`note` took (host integers, computed once per call for every layer).

        Raises:
            InputError: the cache did not see this call's attention mask (a call of a module other than
                the model the cache was built for, or no mask).
        """
        st = self._step
        if st is None or st[0] != seen or st[1] != q or batch != self.batch:
            raise InputError("this SinkCache holds a left-padded batch and did not see this call's attention_mask: "
                             "call the model the cache was built for, with attention_mask (B, tokens so far + new)")
        return st[2]

    def check_positions(self, row: int, positions: Tensor, check: bool, quantised: bool) -> None:
        """Row ``row``'s position ids (1, q_r) of its real new tokens must count up by one from its latest;
        with quantised storage they must start at 0 at the row's first real token.

        Keys are stored rotated at their positions, so a quantised key's codes depend on its absolute
        position: a row fed at positions shifted by its padding (a forward without ``position_ids``)
        would be quantised differently from the same stream alone. At 16 bits only the differences of
        positions matter (RoPE), and any start is exact.

        Raises:
            InputError: positions that skip or repeat (they contradict the mask), or, quantised, a row
                whose positions do not start at 0."""
        if not check:
            return
        p = positions[0]
        prev = self.last_position[row]
        bad = bool((p[1:] - p[:-1] != 1).any()) or (prev is not None and int(p[0]) != prev + 1)
        if bad:
            raise InputError(f"position_ids of row {row} skip or repeat within its real tokens ({p.tolist()[:8]}..."
                             f" after {prev}): they contradict the attention_mask")
        if quantised and prev is None and int(p[0]) != 0:
            raise InputError(f"a left-padded batch in a quantised SinkCache needs position_ids that count each row's "
                             f"real tokens from 0 (as generate passes them); row {row} starts at {int(p[0])}")
        self.last_position[row] = int(p[-1])


class SinkCacheLayer(CacheLayerMixin):
    """The cache of one attention layer: a policy's ``budget`` tokens, stored as given or quantised.

    Args:
        n_sink: number of initial tokens kept by the default ``sinks`` policy (>= 0).
        window: number of most recent tokens kept by it (>= 1).
        rotation: the layer's :class:`KeyRotation`, or None for a model without RoPE (no re-rotation).
        is_sliding: True for a layer the model declares sliding-window (informs transformers' masks).
        policy: the eviction rule (:mod:`sinklab.streaming.policies`); default ``sinks`` with budget
            ``n_sink + window`` (StreamingLLM).
        store: where keys and values live (:mod:`sinklab.streaming.quant`); default as given. A
            quantised store with ``sinks_full_precision = "detected"`` makes the layer measure the
            sink metric (:class:`SinkMetric`, the ``detected-sinks`` policy's own when that is the
            policy) from every call's attention weights, like an attention-based policy.
        eps: the sink metric's threshold for such a store (default 0.3).

    Attributes:
        keys, values: (B, H_kv, K, head_dim) kept states of a 16-bit store (None when quantised: see
            :meth:`read`), keys rotated at ``positions``.
        positions: (K,) int64 position each kept key was rotated at, or (B, K) for a policy whose
            rows keep different tokens (attention-based ones).
        order: the same shape, arrival index (0-based position in the stream) of each kept token;
            slots are in stream order.
        seen: tokens passed through :meth:`update` so far (the stream length).
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, n_sink: int, window: int, rotation: KeyRotation | None, is_sliding: bool = False, *,
                 policy: CachePolicy | None = None, store: DenseKV | QuantKV | None = None, eps: float = 0.3) -> None:
        super().__init__()
        self.n_sink, self.window, self.rotation, self.is_sliding = n_sink, window, rotation, is_sliding
        self.policy = policy if policy is not None else make_policy("sinks", n_sink + window, n_sink)
        self.store = store if store is not None else DenseKV()
        self.eps = eps
        self.detector = self._make_detector()
        self.positions: Tensor | None = None
        self.order: Tensor | None = None
        self.seen = 0
        self.awaiting = 0  # new tokens of the last update whose attention weights have not been observed
        self._memo = _StepMemo()  # shared by the layers of a SinkCache
        self.rows: list[SinkCacheLayer] | None = None  # one cache per row of a left-padded batch
        self._rows_call: tuple[int, int, list[tuple[int, int]]] | None = None  # (K, q, [(K_r, q_r)]) of the last call

    def _make_detector(self) -> SinkMetric | None:
        """The sink metric a ``"detected"`` lossless store needs (the policy's own for detected-sinks)."""
        if not getattr(self.store, "detected", False):
            return None
        return self.policy.metric if isinstance(self.policy, DetectedSinksPolicy) else SinkMetric(self.eps)

    def _own_detector(self) -> bool:
        return self.detector is not None and self.detector is not getattr(self.policy, "metric", None)

    @property
    def needs_weights(self) -> bool:
        """True when every call's attention weights must come (:meth:`observe`): an attention-based
        policy, or lossless detected sinks."""
        return self.policy.needs_scores or self.detector is not None

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        self.store.init(key_states, value_states)
        if self.policy.per_row:
            self.positions = torch.zeros((key_states.shape[0], 0), dtype=torch.long, device=key_states.device)
            self.order = torch.zeros((key_states.shape[0], 0), dtype=torch.long, device=key_states.device)
        else:  # one empty tensor for the layers of a cache: their later cuts are then computed once (_StepMemo)
            self.positions = self.order = self._memo.empty(key_states.device)
        self._sync()
        self.is_initialized = True

    def _sync(self) -> None:
        self.keys, self.values = (self.store.keys, self.store.values) if isinstance(self.store, DenseKV) else (None, None)

    @property
    def kept(self) -> int:
        """Number of tokens held now (a left-padded batch: the most any row holds)."""
        if self.rows is not None:
            return max(r.kept for r in self.rows)
        return 0 if self.order is None else self.order.shape[-1]

    def read(self) -> tuple[Tensor, Tensor]:
        """The kept keys (rotated at ``positions``) and values, (B, H_kv, K, head_dim), dequantised.

        Raises:
            InputError: a left-padded batch (read each row's cache in ``rows``)."""
        if self.rows is not None:
            raise InputError("this cache layer holds a left-padded batch: read each row's cache (layer.rows[r].read())")
        return self.store.read(self.order)

    def empty_like(self) -> "SinkCacheLayer":
        """A new, empty layer with this one's policy, storage, rotation and window (nothing shared but the
        rotation, which holds no state of the stream)."""
        store = DenseKV() if isinstance(self.store, DenseKV) else \
            QuantKV(self.store.bits, self.store.group, self.store.key_quant, self.store.lossless)
        policy = self.policy.fresh()
        return SinkCacheLayer(self.n_sink, self.window, self.rotation, self.is_sliding, policy=policy, store=store,
                              eps=self.eps)

    def _update_rows(self, key_states: Tensor, value_states: Tensor, kwargs: dict,
                     padded: "PaddedRows") -> tuple[Tensor, Tensor]:
        """:meth:`update` of a left-padded batch: each row's real new tokens go to that row's own cache
        (``rows[r]``, a one-row layer, which computes what the row run alone computes); the rows' kept
        tokens come back right-aligned in K = max_r K_r slots, the new tokens at their own columns, zeros
        in the slots the caller's mask hides (see the module docstring).

        Raises:
            InputError: a call the cache did not see the mask of, or position ids that skip or repeat
                within a row's real tokens.
        """
        B, _, q, _ = key_states.shape
        firsts = padded.step_firsts(self.seen, q, B)  # index of each row's first real new token (q: none)
        if self.rows is None:
            self.rows = [self.empty_like() for _ in range(B)]
            for r, sub in enumerate(self.rows):
                sub._memo = padded.memo(r)
                sub._memo.context = self._memo.context
        recorded = self.rotation.last_position_ids() if self.rotation is not None else None
        pos = _position_ids(kwargs, recorded)
        if pos is None or pos.shape[-1] != q:
            pos = torch.arange(self.seen, self.seen + q, device=key_states.device)
        pos = pos.reshape(-1, q).expand(B, q)
        K = self.kept
        out_k = key_states.new_zeros(key_states.shape[:2] + (K + q, key_states.shape[-1]))
        out_v = value_states.new_zeros(value_states.shape[:2] + (K + q, value_states.shape[-1]))
        call = []
        for r, (sub, f) in enumerate(zip(self.rows, firsts)):
            Kr, qr = sub.kept, q - f
            call.append((Kr, qr))
            if not qr:
                continue
            pr = pos[r : r + 1, f:]
            padded.check_positions(r, pr, self.layer_check, not isinstance(self.store, DenseKV))
            kr, vr = sub.update(key_states[r : r + 1, :, f:].contiguous(), value_states[r : r + 1, :, f:].contiguous(),
                                position_ids=pr)
            out_k[r, :, K - Kr : K], out_v[r, :, K - Kr : K] = kr[0, :, :Kr], vr[0, :, :Kr]
            out_k[r, :, K + f :], out_v[r, :, K + f :] = kr[0, :, Kr:], vr[0, :, Kr:]
        self._rows_call = (K, q, call)
        self.seen += q
        self.awaiting = max(sub.awaiting for sub in self.rows)
        return out_k, out_v

    @property
    def layer_check(self) -> bool:
        """Whether this layer checks the rows' position ids (the first layer of the cache does, once per call)."""
        return getattr(self, "_checks_positions", False)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Add ``q`` new tokens; return the keys/values the new queries attend to.

        Args:
            key_states: (B, H_kv, q, head_dim) new keys, rotated by the model at positions P0 .. P0+q-1
                (P0 read from ``position_ids`` in the kwargs, else ``seen``).
            value_states: (B, H_kv, q, head_dim).

        Returns:
            keys, values (B, H_kv, K + q, head_dim): the K kept tokens re-rotated to positions
            P0-K .. P0-1 (dequantised from a quantised store), then the new ones as given.
            A policy without scores evicts at once; an attention-based one after :meth:`observe`.

        Raises:
            InputError: an attention-based policy whose previous call's weights never came.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.awaiting:
            raise InputError(f"cache policy {_policy_name(self.policy)} got no attention weights for the previous call: "
                             "it needs eager attention (transformers' sdpa returns none), called through the model")
        self._memo.check_call(key_states.shape[-2])
        if self._memo.padded is not None:
            return self._update_rows(key_states, value_states, kwargs, self._memo.padded)
        q, K = key_states.shape[-2], self.kept
        recorded = self.rotation.last_position_ids() if self.rotation is not None else None
        if recorded is not None and recorded.shape[-1] != q:
            recorded = None
        p0 = self._memo.position_start(kwargs, recorded, self.seen)
        self._memo.check_context(p0 + q - 1)
        if self.policy.needs_keys:
            self.policy.observe_keys(key_states)
        if self._contiguous():  # window / sinks at 16 bits: cut at once, by slices (the same values as _select)
            return self._update_contiguous(key_states, value_states, p0)
        dev = key_states.device
        new_pos = torch.arange(p0, p0 + q, device=dev)
        new_order = torch.arange(self.seen, self.seen + q, device=dev)
        stored_k, stored_v = self.store.read(self.order)
        keys_old = stored_k
        if K and self.rotation is not None:
            delta = (p0 - K + torch.arange(K, device=dev)) - self.positions  # (K,) or (B, K)
            moved = delta != 0
            if bool(moved.all()) or (delta.dim() == 2 and bool(moved.any())):
                keys_old = self.rotation.rotate(stored_k, delta)
            elif bool(moved.any()):
                idx = moved.nonzero().squeeze(-1)
                keys_old = stored_k.clone()
                keys_old[..., idx, :] = self.rotation.rotate(keys_old[..., idx, :], delta[idx])
        full_k = torch.cat((keys_old, key_states), dim=-2)
        full_v = torch.cat((stored_v, value_states), dim=-2)
        if self.positions.dim() == 2:
            B = key_states.shape[0]
            new_pos, new_order = new_pos.expand(B, q), new_order.expand(B, q)
        self.seen += q
        # keep the model's own rotation and its position; evict what the policy drops
        self.positions = torch.cat((self.positions, new_pos), dim=-1)
        self.order = torch.cat((self.order, new_order), dim=-1)
        self.store.append(key_states, value_states, self.order, cat_k=full_k if keys_old is stored_k else None,
                          cat_v=full_v)
        if self.needs_weights:
            self.awaiting = q
        else:
            keep = self.policy.keep(K + q, self.order)
            if keep is not None:
                self._select(keep)
        self._sync()
        return full_k, full_v

    def _update_contiguous(self, key_states: Tensor, value_states: Tensor, p0: int) -> tuple[Tensor, Tensor]:
        """:meth:`update` for a policy whose eviction is a few runs of slots (window, sinks) on a 16-bit
        store with one position per slot: the kept slots are runs of consecutive positions, each
        moved by one offset (one rotation by a scalar angle per run, no per-slot tables), the cut made
        by slices; positions and order tensors shared by the layers of a cache that agree (computed once
        per step). The same values as the general path."""
        q, K = key_states.shape[-2], self.kept
        stored_k, stored_v = self.store.keys, self.store.values
        memo = self._memo
        pieces, rotated = [], False
        for slot, n, delta in memo.moves(self.positions, p0, K):
            piece = stored_k.narrow(-2, slot, n)
            if delta is not None and self.rotation is not None:
                piece, rotated = (self.rotation.rotate_by(piece, delta) if isinstance(delta, int)
                                  else self.rotation.rotate(piece, delta)), True
            pieces.append(piece)
        pieces.append(key_states)
        full_k = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-2)
        full_v = value_states if not K else torch.cat((stored_v, value_states), dim=-2)
        ranges = self.policy.ranges(K + q)
        self.positions = memo.runs(self.positions, p0, q, ranges)
        self.order = memo.runs(self.order, self.seen, q, ranges)
        self.seen += q
        if ranges is None:
            self.store.keys = torch.cat((stored_k, key_states), dim=-2) if rotated else full_k
            self.store.values = full_v
        else:
            self.store.keys = _runs(stored_k, key_states, ranges, dim=-2)
            self.store.values = _runs(stored_v, value_states, ranges, dim=-2)
        self._sync()
        return full_k, full_v

    def _contiguous(self) -> bool:
        """True where a call's eviction is a few runs of slots known before the call (window, sinks) and
        the store is as given: :meth:`update` then cuts by slicing, without the general path's copies."""
        return getattr(self.policy, "contiguous", False) and isinstance(self.store, DenseKV) \
            and self.detector is None and self.positions.dim() == 1

    def observe(self, weights: Tensor) -> None:
        """Attention weights of the last :meth:`update`'s queries: (B, H, q, K + q), H query heads,
        rows over the K + q keys it returned. The policy scores the slots, then the cache is cut to
        the budget.

        Raises:
            InputError: weights of another shape.
        """
        if self.rows is not None:  # a left-padded batch: row r's real queries on row r's kept + new keys
            K, q, call = self._rows_call
            if weights.dim() != 4 or weights.shape[-1] != K + q or weights.shape[-2] != q:
                raise InputError(f"attention weights of shape {tuple(weights.shape)} do not match the cache's last call "
                                 f"({q} queries on {K + q} keys)")
            for r, (sub, (Kr, qr)) in enumerate(zip(self.rows, call)):
                if sub.awaiting:
                    dev = weights.device
                    cols = torch.cat((torch.arange(K - Kr, K, device=dev), torch.arange(K + q - qr, K + q, device=dev)))
                    sub.observe(weights[r : r + 1, :, q - qr :].index_select(-1, cols))
            self.awaiting = 0
            return
        n = self.kept
        if weights.dim() != 4 or weights.shape[-1] != n or weights.shape[-2] != self.awaiting:
            raise InputError(f"attention weights of shape {tuple(weights.shape)} do not match the cache's last call "
                             f"({self.awaiting} queries on {n} keys)")
        if self.policy.needs_scores:
            self.policy.observe(weights, self.awaiting)
        if self.detector is not None:
            if self._own_detector():
                self.detector.observe(weights, self.awaiting)
            self.store.mark_lossless(self.detector.flagged())
        self.awaiting = 0
        keep = self.policy.keep(n, self.order)
        if keep is not None:
            self._select(keep)
            self._sync()

    def _select(self, keep: Tensor) -> None:
        """Keep slots ``keep`` ((K',) or (B, K'), sorted) everywhere."""
        if keep.dim() == 1:
            self.positions, self.order = self.positions[keep], self.order[keep]
        else:
            self.positions, self.order = self.positions.gather(1, keep), self.order.gather(1, keep)
            self.policy.select(keep)
        if self._own_detector():
            self.detector.select(keep)
        self.store.select(keep, self.order)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for transformers' masks: the K kept + q new keys sit at the K
        positions right before the queries (queries at ``seen`` .. ``seen + q - 1``)."""
        return self.kept + query_length, self.seen - self.kept

    def get_seq_length(self) -> int:
        """Tokens seen so far (what ``generate`` needs to slice new input ids), not tokens kept."""
        return self.seen

    def get_max_length(self) -> int:
        """Most tokens held between calls: the policy's budget."""
        return self.policy.budget

    def reset(self) -> None:
        fresh = self.empty_like()
        self.store, self.policy = fresh.store, fresh.policy
        self.detector = self._make_detector()
        self.keys = self.values = self.positions = self.order = None
        self.is_initialized = False
        self.seen = self.awaiting = 0
        self.rows = self._rows_call = None

    def _batch(self, fn) -> None:
        if self.rows is not None:
            raise InputError("a left-padded batch in a SinkCache cannot be reordered or expanded (beam search, "
                             "num_return_sequences > 1): expand the prompts before the first call")
        if not self.kept:
            return
        self.store.batch(fn)
        if self.positions.dim() == 2:
            self.positions, self.order = fn(self.positions), fn(self.order)
            self.policy.batch(fn)
        if self._own_detector():
            self.detector.batch(fn)
        self._sync()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._batch(lambda t: t[indices])

    def reorder_cache(self, beam_idx: Tensor) -> None:
        self._batch(lambda t: t.index_select(0, beam_idx.to(t.device)))

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept keys and values (packed codes, scales, zeros and full-precision copies
        when quantised)."""
        return self.store.nbytes if self.is_initialized else 0

    @property
    def state_nbytes(self) -> int:
        """Bytes of bookkeeping besides the keys and values: positions, arrival indices, policy scores."""
        if self.rows is not None:
            return sum(r.state_nbytes for r in self.rows)
        if not self.is_initialized:
            return 0
        own = self.detector.nbytes if self._own_detector() else 0
        return sum(t.numel() * t.element_size() for t in (self.positions, self.order)) + self.policy.nbytes + own


def _runs(old: Tensor, new: Tensor, ranges: list[tuple[int, int]], dim: int = -1) -> Tensor:
    """``cat((old, new), dim)`` restricted to the slots in ``ranges`` ([start, stop) pairs, ascending, over
    the K + q slots of the concatenation), built from slices: the values ``index_select`` of the
    concatenation gives, without making it."""
    K = old.shape[dim]
    parts = []
    for a, b in ranges:
        if a < K:
            parts.append(old.narrow(dim, a, min(b, K) - a))
        if b > K:
            lo = max(a, K)
            parts.append(new.narrow(dim, lo - K, b - lo))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


def _policy_name(policy: CachePolicy) -> str:
    return next((n for n in POLICIES if POLICIES.get(n) is type(policy)), type(policy).__name__)


def _native_layers(model, budget: int, max_context: int | None, make) -> list[SinkCacheLayer]:
    """Cache layers for a model trained with ``sinklab train`` (:class:`sinklab.nn.SinkLM`).

    Its learned sinks (a sink token, key/value biases, a sink logit) live in the attention
    operation and are always attended, whatever the cache keeps: ``n_sink = 0`` is the
    learned-sink variant of StreamingLLM (Xiao et al. 2024, sec. 3.3).

    Raises:
        InputError: absolute positions (learned, sinusoidal), a sliding-window model, or
            a budget (``n_sink + window``) above ``max_seq_len``.
    """
    cfg = model.config
    if model.positional.absolute(1, torch.device("cpu")) is not None:
        raise InputError(f"SinkCache needs relative positions; this sinklab model uses {cfg.positional!r} absolute "
                         "positions, baked into the hidden states")
    if cfg.sliding_window is not None:
        raise InputError("SinkCache does not support sinklab models trained with a sliding window")
    limit = cfg.max_seq_len if max_context == -1 else max_context
    if limit is not None and budget > limit:
        raise InputError(f"n_sink + window = {budget} exceeds the model's context of {limit} tokens")
    inv = getattr(model.positional, "inv_freq", None)
    rotation = KeyRotation(inv) if isinstance(inv, Tensor) else None  # RoPE; None: NoPE / ALiBi / T5 buckets
    return [make(rotation) for _ in range(cfg.n_layers)]


def _hf_layers(model, budget: int, max_context: int | None, make) -> list[SinkCacheLayer]:
    """Cache layers for a ``transformers`` RoPE decoder (a sliding layer keeps its own window and no sinks
    unless the budget fits inside that window: :func:`own_window`).

    Raises:
        InputError: not a transformers model, a budget (``n_sink + window``) above the context, an
            unsupported layer type or RoPE convention.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise InputError(f"SinkCache needs a transformers model with a config, got {type(model).__name__}")
    check_sink_cache(config)  # the model type first (sinklab.capture.families.sink_cache_status, docs/models.md)
    if max_context == -1:
        max_context = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    if max_context is not None and budget > max_context:
        raise InputError(f"n_sink + window = {budget} exceeds the model's context of {max_context} tokens")
    windows = layer_windows(model)
    rotations = key_rotations(model, [("full_attention" if w is None else "sliding_attention") for w in windows])
    return [make(rot) if (own := own_window(w, budget)) is None else SinkCacheLayer(0, own, rot, is_sliding=True)
            for w, rot in zip(windows, rotations)]


def _hf_observers(adapter, what: str) -> None:
    """Make a ``transformers`` model hand each attention's weights to its cache layer (forward hooks).

    Raises:
        InputError: an attention implementation that does not return the weights (sdpa, flash).
    """
    impl = adapter.attn_implementation
    if impl != "eager":
        raise InputError(f"{what} needs the attention weights, which {impl!r} attention does not return: load "
                         "the model with attn_implementation='eager' (or call model.set_attn_implementation('eager'))")
    _install_observers(adapter.model)


#: per model kind (:attr:`sinklab.capture.adapter.ModelAdapter.kind`): the cache layers of a model, and
#: how its attention weights reach the layers for an attention-based policy (a sinklab model's
#: attention hands them to its cache itself)
_CACHE_LAYERS = {"sinklab": _native_layers, "hf": _hf_layers}
_WEIGHT_OBSERVERS = {"sinklab": lambda adapter, what: None, "hf": _hf_observers}


def _observe_hook(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
    """Forward hook on a ``transformers`` attention module: hand its attention weights (B, H, q, K + q)
    to the layer of the :class:`SinkCache` (or :class:`StackedCache`) it was called with, when that
    layer waits for them."""
    cache = next((kwargs[k] for k in ("cache", "past_key_values", "past_key_value", "layer_past") if k in kwargs), None)
    if not isinstance(cache, (SinkCache, StackedCache)):
        return
    layer = cache.layers[module.layer_idx]
    if not layer.awaiting:
        return
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if not isinstance(weights, Tensor):
        raise InputError(f"cache policy {cache.policy} needs the attention weights, and this model's attention "
                         f"({cache.attn_implementation(module)}) returns none: use attn_implementation='eager'")
    layer.observe(weights)


def _mask_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook on a ``transformers`` model (and its base model): hand the call's
    ``attention_mask`` to the :class:`SinkCache` it was called with (:meth:`SinkCache.note_attention_mask`)."""
    cache = next((kwargs[k] for k in ("cache", "past_key_values") if k in kwargs), None)
    if isinstance(cache, StackedCache):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, Tensor) and mask.dim() == 2 and not bool(mask.all()):
            raise InputError("a StackedCache takes rows of equal length without padding (its caches do not read the "
                             "attention mask: the pads would be kept as tokens, the first ones as sinks); run padded "
                             "rows through one SinkCache")
        return
    if not isinstance(cache, SinkCache):
        return
    x = kwargs.get("input_ids", args[0] if args else None)
    if not isinstance(x, Tensor):
        x = kwargs.get("inputs_embeds")
    if isinstance(x, Tensor):
        cache.note_attention_mask(kwargs.get("attention_mask"), x.shape[1])


def _install_mask_hooks(model: nn.Module) -> None:
    """Add :func:`_mask_hook` (once) to every module of ``model`` that takes input ids, an attention mask and a
    cache (the causal-LM wrapper and its base model)."""
    import inspect

    for m in model.modules():
        if getattr(m, "_sinklab_mask_hook", False):
            continue
        try:
            params = inspect.signature(m.forward).parameters
        except (TypeError, ValueError):
            continue
        if "attention_mask" in params and "input_ids" in params and ({"cache", "past_key_values"} & set(params)):
            m.register_forward_pre_hook(_mask_hook, with_kwargs=True)
            m._sinklab_mask_hook = True


def _trained_context(model, kind: str) -> int | None:
    """The positions a model was trained on: ``max_position_embeddings`` of a ``transformers`` config,
    ``max_seq_len`` of a sinklab model; None when the config has neither."""
    cfg = model.config
    if kind == "hf":
        cfg = cfg.get_text_config(decoder=True)
        n = getattr(cfg, "max_position_embeddings", None)
    else:
        n = getattr(cfg, "max_seq_len", None)
    return int(n) if isinstance(n, int) else None


def _trim_mask_hook(module: nn.Module, args: tuple, kwargs: dict):
    """Forward pre-hook on a ``transformers`` attention module under a cache whose layers keep different
    numbers of tokens (PyramidKV): ``transformers`` builds one mask per layer type, from the first
    layer's sizes (K_0 kept + q new columns, the kept ones right-aligned); this layer keeps K_l <= K_0,
    so its mask is the last K_l + q columns (a :class:`StackedCache` of PyramidKV caches alike: its rows
    keep equally many tokens per layer)."""
    cache = next((kwargs[k] for k in ("cache", "past_key_values", "past_key_value", "layer_past") if k in kwargs), None)
    mask = kwargs.get("attention_mask")
    if not isinstance(cache, (SinkCache, StackedCache)) or not isinstance(mask, Tensor) or mask.dim() != 4:
        return None
    layer = cache.layers[module.layer_idx]
    h = kwargs.get("hidden_states", args[0] if args else None)
    if layer.is_sliding or not isinstance(h, Tensor):
        return None
    width = layer.kept + h.shape[1]
    if mask.shape[-1] > width:
        kwargs["attention_mask"] = mask[..., -width:]
        return args, kwargs
    return None


def _install_mask_trims(model: nn.Module) -> None:
    """Add :func:`_trim_mask_hook` to every attention module of a ``transformers`` model (once)."""
    for m in model.modules():
        if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int):
            if not getattr(m, "_sinklab_trim_hook", False):
                m.register_forward_pre_hook(_trim_mask_hook, with_kwargs=True)
                m._sinklab_trim_hook = True


def _install_observers(model: nn.Module) -> None:
    """Add :func:`_observe_hook` to every attention module of a ``transformers`` model (once)."""
    for m in model.modules():
        if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int):
            if not getattr(m, "_sinklab_observe_hook", False):
                m.register_forward_hook(_observe_hook, with_kwargs=True)
                m._sinklab_observe_hook = True


class SinkCache(Cache):
    """A fixed-budget KV cache for a ``transformers`` RoPE decoder: StreamingLLM's sinks + window by
    default, or another eviction policy, keys and values stored as given or quantised.

    Use::

        cache = SinkCache(model, n_sink=4, window=1020)     # StreamingLLM
        cache = SinkCache(model, policy="sinks+h2o", budget=256, kv_bits=4, key_quant="channel",
                          sinks_full_precision=4)
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=4000)  # or cache=cache

    or a manual loop ``model(ids_t, cache=cache, use_cache=True)`` one token (or chunk) at a time.

    Args:
        model: a ``transformers`` causal LM with RoPE (LLaMA, Mistral, Qwen, Gemma 1-3, Phi, ...;
            see :data:`sinklab.streaming.rope.ROTATE_HALF_MODEL_TYPES`); grouped-query attention
            and partial rotary are handled. Or a model trained with ``sinklab train``
            (:class:`sinklab.nn.SinkLM`, relative positions), decoded with ``model(ids, cache=cache)``:
            its learned sinks (sink token, key/value bias, sink logit) stay in every step, so
            ``n_sink = 0`` is the learned-sink variant.
        n_sink: sink tokens: the first ones (``sinks``, ``sinks+h2o``, ``sinks+tova``; default 4) or
            the most detected ones (``detected-sinks``); 0 for the other policies.
        window: most recent tokens kept (>= 1) by ``sinks``: the budget is ``n_sink + window``
            (default window 1020 when no budget is given).
        policy: a name from :data:`sinklab.streaming.policies.POLICIES`: ``window``, ``sinks``,
            ``h2o``, ``tova``, ``sinks+h2o``, ``sinks+tova``, ``detected-sinks``, and the prefill-time
            ``snapkv``, ``pyramidkv``, ``knorm`` (:class:`sinklab.streaming.policies.PrefillPolicy`).
            The attention-based ones (h2o, tova, detected-sinks, snapkv, pyramidkv) need eager
            attention (``attn_implementation="eager"``).
        budget: tokens each full-attention layer keeps between calls (``pyramidkv``: on average over
            the full-attention layers, :func:`sinklab.streaming.policies.pyramid_budgets`).
        recent: ``h2o``'s recent window (default half of ``budget - n_sink``).
        eps: the threshold on the attention mass of ``detected-sinks`` and of ``sinks_full_precision =
            "detected"`` (default 0.3, the sink rate's); another value given to a cache that uses neither
            is refused.
        kv_bits: 16 (stored as given) or 8 / 4 / 3 / 2 (asymmetric min-max codes, :mod:`sinklab.streaming.quant`).
        kv_group: channels per group (per-token) or tokens per block (per-channel keys); default 32.
        key_quant: keys per ``"token"`` or per ``"channel"`` (KIVI); values are always per token.
        sinks_full_precision: an integer N: the first N tokens of the stream are kept lossless besides;
            or ``"detected"``: the tokens sinklab's sink metric flags (attention mass above ``eps`` in
            a head, measured on the fly as ``detected-sinks`` does; :mod:`sinklab.streaming.quant`
            says when a token gets and loses its copy). ``"detected"`` needs the attention weights,
            so eager attention, whatever the policy. At most ``budget`` tokens. A 16-bit cache takes
            only the defaults of ``key_quant`` and ``sinks_full_precision`` (it stores everything as given).
        max_context: refuse a budget above this many tokens (default: the model's
            ``max_position_embeddings``; None in the config = no check). Independently, the cache warns
            once (``warnings.warn``) when a call uses a position at or past the model's trained context,
            and once at the first call with more new tokens than ``budget`` (a long prompt given to
            ``model.generate`` in one call: :func:`sinklab.streaming.prefill.generate` prefills it in
            chunks; no warning inside :func:`long_calls_expected`).
        policy_options: the policy's own options (``snapkv`` / ``pyramidkv``: ``observation_window``,
            ``kernel_size``, ``pooling``).

    Raises:
        InputError: ``window < 1``, ``n_sink < 0``, a budget above the model's context or not above
            ``n_sink``, a window that disagrees with the budget, quantisation options out of range or
            given to a 16-bit cache, ``sinks_full_precision`` above the budget, an ``eps`` that no part of
            the cache uses,
            an attention-based policy on a model whose attention returns no weights, a layer type
            other than full or sliding attention, or a model without a supported RoPE (the message
            names what is missing).
        UnknownNameError: an unknown policy (the valid names listed).
    """

    def __init__(self, model: nn.Module, n_sink: int | None = None, window: int | None = None, *,
                 policy: str = "sinks", budget: int | None = None, recent: int | None = None, eps: float = 0.3,
                 kv_bits: int = 16, kv_group: int = 32, key_quant: str = "token", sinks_full_precision: int | str = 0,
                 max_context: int | None = -1, policy_options: dict | None = None) -> None:
        cls = POLICIES.get(policy)
        if isinstance(sinks_full_precision, str):
            sinks_full_precision = parse_sinks_full_precision(sinks_full_precision)
        if n_sink is None:
            n_sink = 4 if cls.uses_sinks else 0
        if window is not None and (not isinstance(window, int) or window < 1):
            raise InputError(f"window must be an integer >= 1, got {window!r}")
        if not isinstance(n_sink, int) or n_sink < 0:
            raise InputError(f"n_sink (number of sink tokens) must be an integer >= 0, got {n_sink!r}")
        if budget is None:
            budget = n_sink + (1020 if window is None else window)
        elif window is not None and n_sink + window != budget:
            raise InputError(f"n_sink + window = {n_sink + window} disagrees with budget {budget}: give one of them")
        make_policy(policy, budget, n_sink, recent=recent, eps=eps, options=policy_options)  # checks the arguments
        make_store(kv_bits, kv_group, key_quant, sinks_full_precision)
        check_storage_options(budget, kv_bits, key_quant, sinks_full_precision)
        detect = sinks_full_precision == DETECTED and kv_bits != 16
        if eps != DEFAULT_EPS and not (detect or policy == "detected-sinks"):
            raise InputError(f"{param('eps', eps)} is used by the detected-sinks policy and by "
                             f"sinks_full_precision='detected' only, and this cache ({policy}, {kv_bits} bits) has neither")
        if detect:
            SinkMetric(eps)  # checks eps
        from sinklab.capture.adapter import adapt

        def make(rotation) -> SinkCacheLayer:
            return SinkCacheLayer(n_sink, budget - n_sink, rotation, policy=make_policy(policy, budget, n_sink,
                                  recent=recent, eps=eps, options=policy_options),
                                  store=make_store(kv_bits, kv_group, key_quant, sinks_full_precision), eps=eps)

        adapter = adapt(model)
        layers = _CACHE_LAYERS[adapter.kind](model, budget, max_context, make)
        per_layer = getattr(cls, "layer_budgets", None)
        if per_layer is not None:  # PyramidKV: each full-attention layer its own budget, the same total
            full = [layer for layer in layers if not layer.is_sliding]
            obs = full[0].policy.window
            for layer, b in zip(full, per_layer(budget, len(full), obs)):
                layer.policy = make_policy(policy, b, n_sink, recent=recent, eps=eps,
                                           options={**(policy_options or {}), "observation_window": obs})
                layer.policy.window = obs  # every layer keeps the same observation window
                layer.window = b - n_sink
            if adapter.kind == "hf":
                _install_mask_trims(model)
        if cls.needs_scores or detect:
            _WEIGHT_OBSERVERS[adapter.kind](adapter, f"cache policy {policy}" if cls.needs_scores
                                            else "sinks_full_precision='detected'")
        super().__init__(layers=layers)
        memo = _StepMemo()
        memo.context = _trained_context(model, adapter.kind)
        memo.budget = budget
        for layer in layers:
            layer._memo = memo
        self.n_sink, self.window, self.policy, self.budget = n_sink, budget - n_sink, policy, budget
        self.policy_options = dict(policy_options or {})
        self.kv_bits, self.kv_group, self.key_quant = kv_bits, kv_group, key_quant
        self.sinks_full_precision = sinks_full_precision
        self.detects_sinks = detect
        self._model_config = None if adapter.kind == "sinklab" else model.config
        self._memo = memo
        full = [layer for layer in layers if not layer.is_sliding] or layers
        full[0]._checks_positions = True  # one layer checks the padded rows' position ids per call
        if adapter.kind == "hf":
            _install_mask_hooks(model)

    def note_attention_mask(self, mask: Tensor | None, q: int) -> None:
        """Take the 2D ``attention_mask`` of a call with ``q`` new tokens (called by a forward pre-hook on
        the model before its layers run; a caller never needs to).

        A mask that pads some row (zeros before its first real token) at the first call makes the cache
        keep one cache per row (:class:`PaddedRows`); an all-ones mask, or none, changes nothing.

        Args:
            mask: (B, seen + q) 0/1 or bool, 1 for real tokens, ``seen`` the tokens passed so far
                (:meth:`get_seq_length`); or None.
            q: the call's new tokens.

        Raises:
            InputError: a mask that is not 2D, of another length, with a padding token after a real one
                (right padding or a hole), padding that first shows after the first call, a padded
                batch's call without its mask, or a mask that disagrees with the earlier ones.
        """
        if isinstance(mask, dict):  # masks a multimodal wrapper prepared per layer type for its language model:
            return  # the wrapper's own call handed over the 2D mask they were built from
        padded = self._memo.padded
        seen = self.get_seq_length()
        if mask is None:
            if padded is not None:
                raise InputError("this SinkCache holds a left-padded batch: pass its attention_mask (B, tokens so far + "
                                 "new) at every call")
            return
        if not isinstance(mask, Tensor) or mask.dim() != 2:
            raise InputError("SinkCache takes a 2D attention_mask (B, tokens so far + new), 1 for real tokens; got "
                             f"{'a ' + str(mask.dim()) + 'D tensor' if isinstance(mask, Tensor) else type(mask).__name__}")
        if mask.shape[-1] != seen + q:
            raise InputError(f"attention_mask covers {mask.shape[-1]} tokens; this call needs {seen + q} (the {seen} "
                             f"tokens the cache has seen + {q} new)")
        m = mask != 0
        if bool((m[:, :-1] & ~m[:, 1:]).any()):
            raise InputError("attention_mask has a padding token after a real one (right padding or a hole): SinkCache "
                             "takes left-padded batches only")
        if padded is None:
            if bool(m.all()):
                return
            if seen:
                raise InputError("attention_mask pads a row only after the cache's first call: left-pad the batch in "
                                 "the first call")
            padded = self._memo.padded = PaddedRows(m.shape[0])
        padded.note(m, seen, q)

    def attn_implementation(self, module=None) -> str:
        """The attention implementation of the model this cache was built for ('?' when unknown)."""
        cfg = self._model_config
        return getattr(cfg, "_attn_implementation", None) or "?"

    @property
    def needs_scores(self) -> bool:
        """True for an attention-based policy."""
        return POLICIES.get(self.policy).needs_scores

    @property
    def needs_weights(self) -> bool:
        """True when the cache reads the attention weights: an attention-based policy, or lossless
        detected sinks (``sinks_full_precision = "detected"``, quantised)."""
        return self.needs_scores or self.detects_sinks

    def reset(self) -> None:
        """Empty every layer (and forget a padded batch's rows)."""
        super().reset()
        self._memo.padded = None

    @property
    def padded(self) -> bool:
        """True when the cache holds a left-padded batch (one cache per row)."""
        return self._memo.padded is not None

    def __repr__(self) -> str:
        kv = "" if self.kv_bits == 16 else (f", kv_bits={self.kv_bits}, kv_group={self.kv_group}, "
                                            f"key_quant={self.key_quant!r}, sinks_full_precision={self.sinks_full_precision}")
        return (f"SinkCache(policy={self.policy!r}, budget={self.budget}, n_sink={self.n_sink}{kv}, "
                f"layers={len(self.layers)}, seen={self.get_seq_length()})")

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' kept keys and values (packed codes, scales and zeros when quantised)."""
        return sum(layer.nbytes for layer in self.layers)

    @property
    def state_nbytes(self) -> int:
        """Bytes of all layers' bookkeeping: positions, arrival indices, policy scores."""
        return sum(layer.state_nbytes for layer in self.layers)

    def kept_length(self, layer_idx: int | None = None) -> int:
        """Tokens held now by layer ``layer_idx`` (default: the first full-attention layer; <= the budget).

        This is the cache position of the next token: pass it as ``position_ids`` to give
        positions inside the cache, as StreamingLLM does."""
        if layer_idx is None:
            layer_idx = next((i for i, layer in enumerate(self.layers) if not layer.is_sliding), 0)
        return self.layers[layer_idx].kept if layer_idx < len(self.layers) else 0


class StackedLayer(CacheLayerMixin):
    """One layer of a :class:`StackedCache`: rows ``starts[i] .. starts[i] + rows[i] - 1`` of the batch go to
    ``subs[i]`` (a :class:`SinkCacheLayer` of ``rows[i]`` rows, default one); every sub-layer keeps the same
    number of tokens."""

    is_compileable = False
    is_croppable = False

    def __init__(self, subs: list[SinkCacheLayer], rows: list[int] | None = None) -> None:
        super().__init__()
        self.subs = subs
        self.rows = list(rows) if rows is not None else [1] * len(subs)
        self.starts = [sum(self.rows[:i]) for i in range(len(self.rows))]
        self.is_sliding = subs[0].is_sliding

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.is_initialized = True

    @property
    def kept(self) -> int:
        return self.subs[0].kept

    @property
    def awaiting(self) -> int:
        return max(s.awaiting for s in self.subs)

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """(R, H_kv, q, d) new keys/values, R = sum of ``rows``, each sub-layer its rows; returns the rows'
        (R, H_kv, K + q, d)."""
        if key_states.shape[0] != sum(self.rows):
            raise InputError(f"a StackedCache of {len(self.subs)} configurations needs {sum(self.rows)} rows, got "
                             f"{key_states.shape[0]}")
        self.is_initialized = True
        outs = [s.update(key_states[a : a + n], value_states[a : a + n], *args, **kwargs)
                for s, a, n in zip(self.subs, self.starts, self.rows)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])

    def observe(self, weights: Tensor) -> None:
        """(R, H, q, K + q) attention weights: each sub-layer its rows (where it waits for them)."""
        for s, a, n in zip(self.subs, self.starts, self.rows):
            if s.awaiting:
                s.observe(weights[a : a + n])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.subs[0].get_mask_sizes(query_length)

    def get_seq_length(self) -> int:
        return self.subs[0].get_seq_length()

    def get_max_length(self) -> int:
        return self.subs[0].get_max_length()

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.subs)


class StackedCache(Cache):
    """Several :class:`SinkCache` configurations fed as the rows of one batch: the first ``rows[0]`` rows of
    every call go through ``caches[0]``, the next ``rows[1]`` through ``caches[1]``, and so on (default one
    row each). One forward then evaluates several configurations on the same stream, or on several
    streams of equal length (``sinklab stream`` uses it for the configurations it decodes token by token;
    a decode step costs little more for R rows than for one on a CPU). Each row computes what its cache
    alone computes on that row (tests check it); they must keep equally many tokens (the same budget) so
    that the rows' keys stack.

    Args:
        caches: SinkCaches built for the same model, ``caches[i]`` used for ``rows[i]`` rows only.
        rows: rows per cache (>= 1 each); None: one each.

    Raises:
        InputError: no caches, a ``rows`` of another length or with a count < 1, different budgets (per
            layer: pyramidkv with another policy), or caches with different layers.
    """

    def __init__(self, caches: list[SinkCache], rows: list[int] | None = None) -> None:
        if not caches:
            raise InputError("a StackedCache needs at least one SinkCache")
        if rows is not None and (len(rows) != len(caches) or any(int(n) < 1 for n in rows)):
            raise InputError(f"a StackedCache needs one row count >= 1 per cache, got {list(rows)} for {len(caches)} caches")
        budgets = sorted({c.budget for c in caches})
        if len(budgets) > 1:
            raise InputError(f"a StackedCache needs one budget for all its caches, got {budgets}")
        if len({len(c.layers) for c in caches}) > 1:
            raise InputError("a StackedCache needs caches of the same model")
        if len({tuple(layer.policy.budget for layer in c.layers) for c in caches}) > 1:
            raise InputError("a StackedCache needs the same budget in every layer of its caches; pyramidkv's per-layer "
                             "budgets differ from the other policies': decode it alone")
        super().__init__(layers=[StackedLayer([c.layers[i] for c in caches], rows) for i in range(len(caches[0].layers))])
        self.caches = caches
        self.rows = list(rows) if rows is not None else [1] * len(caches)
        self.policy = ", ".join(dict.fromkeys(c.policy for c in caches))

    def attn_implementation(self, module=None) -> str:
        return self.caches[0].attn_implementation(module)

    def kept_length(self, layer_idx: int | None = None) -> int:
        """Tokens held now (the same in every row); the cache position of the next token."""
        return self.caches[0].kept_length(layer_idx)
