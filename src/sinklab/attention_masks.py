"""Which keys each query may see (:class:`MaskSpec`), and grouped-query head repetition: the one
definition that sinklab's own attention (:mod:`sinklab.nn.attention`), the capture collectors
(:mod:`sinklab.capture.collectors`, :mod:`sinklab.capture.blockwise`) and the mask-aware metrics
(:mod:`sinklab.metrics`) share.

Positions are 0-based. Under ``MaskSpec(causal, prefix_len=p, window=w)`` query ``i`` sees key ``j`` iff

* causal: ``j <= i`` or ``j < p`` (a bidirectional prefix, prefix LM);
  bidirectional (``causal=False``): every key;
* and, with a sliding window ``w``: ``|i - j| < w`` (for a causal key ``j <= i``: ``j > i - w``).

Document mask (packed training windows, :func:`document_ids`): with ``documents`` (B, T) int
document ids, query ``i`` of row ``b`` additionally sees key ``j`` only if
``documents[b, i] == documents[b, j]`` (intra-document attention). Masks with documents are
(B, 1, C, Tk) instead of (C, Tk).

When there are fewer queries than keys (``t_q < t_k``), the queries are the *last* ``t_q``
positions: query row ``q`` is position ``q + offset`` with ``offset = t_k - t_q``.

Blocked attention: :func:`query_blocks` walks the query blocks with the key ranges a mask lets them see, and
:func:`reduce_tiles` hands each tile to a :class:`TileReducer` (several at once with :class:`Reducers`), the
driver of sinklab's tiled attention loops over query blocks (all but the mask-free fused capture's column sums,
:func:`sinklab.capture.blockwise.column_sums_from_lse`, which walks key blocks first).

Depends on torch and :mod:`sinklab.errors` only, so every layer of sinklab may import it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sinklab.errors import InputError

__all__ = ["MaskSpec", "CAUSAL", "visible", "build_mask", "key_range", "query_blocks", "TileReducer", "Reducers",
           "reduce_tiles", "repeat_kv", "same_document", "document_ids", "document_positions"]


@dataclass(frozen=True)
class MaskSpec:
    """The attention mask of a layer or a model: which keys each query may see (module docstring).

    Attributes:
        causal: True: query ``i`` sees keys ``j <= i`` (and the prefix); False: every key
            (bidirectional encoder / masked diffusion model), within the window.
        prefix_len: length ``p`` of the bidirectional prefix of a prefix LM: keys ``0 .. p-1``
            (0-based) are seen by every query; 0 = none (1 is the same as 0). Ignored when
            ``causal`` is False. May exceed the sequence length (then every key is in the prefix).
        window: sliding-window width ``w >= 1``: query ``i`` sees only keys with ``|i - j| < w``
            (``w = 1``: itself only); None = no window.

    Raises:
        InputError: ``prefix_len`` is not an integer >= 0, or ``window`` is not None or an integer >= 1.
    """

    causal: bool = True
    prefix_len: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        # integers of any kind (Python, NumPy, 0-d torch) are stored as Python ints
        prefix = _as_int(self.prefix_len)
        if prefix is None or prefix < 0:
            raise InputError(f"MaskSpec.prefix_len must be an integer >= 0, got {self.prefix_len!r}")
        window = None if self.window is None else _as_int(self.window)
        if self.window is not None and (window is None or window < 1):
            raise InputError(f"MaskSpec.window must be None or an integer >= 1, got {self.window!r}")
        object.__setattr__(self, "causal", bool(self.causal))
        object.__setattr__(self, "prefix_len", prefix)
        object.__setattr__(self, "window", window)

    def plain_causal(self, seq_len: int) -> bool:
        """True when, over ``seq_len`` positions, this mask is exactly the lower triangle ``j <= i``
        (causal, a prefix of at most 1, no window narrower than the sequence)."""
        return self.causal and self.prefix_len <= 1 and (self.window is None or self.window >= seq_len)

    def to_dict(self) -> dict[str, Any]:
        """``{"causal": bool, "prefix_len": int, "window": int | None}`` (the form
        :attr:`sinklab.capture.ProbeStats.mask` stores)."""
        return {"causal": bool(self.causal), "prefix_len": int(self.prefix_len),
                "window": None if self.window is None else int(self.window)}

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, causal: bool = True) -> "MaskSpec":
        """The spec of a :meth:`to_dict` dict; missing keys: ``causal`` (the argument), no prefix,
        no window (a ``prefix_len`` or ``window`` of None counts as missing).

        Raises:
            InputError: values :class:`MaskSpec` rejects.
        """
        return cls(causal=bool(data.get("causal", causal)), prefix_len=int(data.get("prefix_len") or 0),
                   window=None if data.get("window") is None else int(data["window"]))


def _as_int(x: Any) -> int | None:
    """``x`` as a Python int when it is an integer (not a bool), else None."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


#: plain causal attention: no prefix, no window
CAUSAL = MaskSpec()


def visible(qpos: Tensor, kpos: Tensor, mask: MaskSpec = CAUSAL) -> Tensor:
    """Which keys each query may attend under ``mask``.

    Args:
        qpos: (C,) 0-based query positions (int64). kpos: (Tk,) 0-based key positions (int64).
        mask: the mask (module docstring); default plain causal.

    Returns:
        (C, Tk) bool, True where query i sees key j.
    """
    i, j = qpos[:, None], kpos[None, :]
    if mask.causal:
        m = (j <= i) | (j < mask.prefix_len)
    else:
        m = torch.ones(i.shape[0], j.shape[1], dtype=torch.bool, device=i.device)
    if mask.window is not None:
        m = m & ((i - j).abs() < mask.window)
    return m


def same_document(documents: Tensor, qpos: Tensor, kpos: Tensor) -> Tensor:
    """Which keys are in the query's own document.

    Args:
        documents: (B, T) int document ids of the positions of a packed window (:func:`document_ids`).
        qpos: (C,) 0-based query positions; kpos: (Tk,) 0-based key positions (both < T).

    Returns:
        (B, 1, C, Tk) bool, True where ``documents[b, i] == documents[b, j]`` (broadcasts over heads).
    """
    return (documents[:, qpos][:, :, None] == documents[:, kpos][:, None, :])[:, None]


def document_ids(input_ids: Tensor, eos_id: int) -> Tensor:
    """Document ids of packed windows whose documents end with EOS (``concat``: ``doc EOS doc EOS``;
    ``bos``: ``BOS doc EOS BOS doc EOS``, :mod:`sinklab.data.packing`).

    A document is the tokens after an EOS up to and including the next EOS (its EOS belongs to it,
    a following BOS to the next document); a window that starts mid-document starts with document 0.

    Args:
        input_ids: (B, T) int token ids of the windows (model inputs).
        eos_id: the EOS token id.

    Returns:
        (B, T) int64: ``documents[b, t]`` = the number of EOS tokens at positions ``0 .. t-1``
        (0-based) of row b.
    """
    is_eos = (input_ids == eos_id).to(torch.int64)  # (B, T)
    return torch.cumsum(is_eos, dim=1) - is_eos


def document_positions(documents: Tensor) -> Tensor:
    """0-based position of every token inside its own document: (B, T) int64 from document ids
    ``documents`` (B, T), non-decreasing along each row (:func:`document_ids`); a window's first
    (partial) document starts at 0 like the others."""
    T = documents.shape[1]
    first = torch.searchsorted(documents.contiguous(), documents.contiguous(), side="left")  # (B, T) start of each one's document
    return torch.arange(T, device=documents.device)[None, :] - first


def build_mask(t_q: int, t_k: int | None = None, mask: MaskSpec = CAUSAL, *, device=None,
               documents: Tensor | None = None) -> Tensor:
    """(T_q, T_k) bool mask of :func:`visible`, True = may attend; (B, 1, T_q, T_k) with ``documents``
    (B, T_k) int ids (:func:`same_document` ANDed in).

    Keys are positions ``0..T_k-1`` (``T_k`` defaults to ``T_q``, and must be >= ``T_q``); the
    queries are the last ``T_q`` of them (query row ``q`` is position ``q + T_k - T_q``).
    """
    t_k = t_q if t_k is None else t_k
    kpos = torch.arange(t_k, device=device)
    qpos = torch.arange(t_q, device=device) + (t_k - t_q)
    m = visible(qpos, kpos, mask)
    if documents is not None:
        m = m & same_document(documents, qpos, kpos)
    return m


def key_range(q0: int, q1: int, t_k: int, mask: MaskSpec = CAUSAL, *, offset: int = 0) -> tuple[int, int]:
    """Keys ``[k0, k1)`` (0-based, end exclusive) that contain every key some query row in
    ``[q0, q1)`` may see under ``mask``, out of ``t_k`` keys.

    Query row ``q`` is position ``q + offset``. Tight at both ends for causal attention without
    a prefix; with a prefix the range may hold keys that only some rows see (the mask inside
    the range decides). An empty range has ``k0 >= k1``.
    """
    window = mask.window
    if mask.causal:
        k1 = min(t_k, max(q1 + offset, mask.prefix_len))
    else:
        k1 = t_k if window is None else min(t_k, q1 + offset + window - 1)
    k0 = 0 if window is None else max(0, q0 + offset - window + 1)
    return k0, k1


def query_blocks(t_q: int, block: int, mask: MaskSpec = CAUSAL, *, t_k: int | None = None, offset: int = 0,
                 keys=None):
    """The blocked-attention iterator: query blocks ``[q0, q1)`` of at most ``block`` rows (0-based rows,
    end exclusive, in order) with the key range ``[k0, k1)`` they may see, as ``(q0, q1, k0, k1)``.

    Every tiled attention loop of sinklab over query blocks walks them through this, by way of :func:`reduce_tiles`
    (the one loop with key blocks outer, :func:`sinklab.capture.blockwise.column_sums_from_lse`, does not):
    what a loop does with a tile is its :class:`TileReducer` (the model's tile path: its output and its
    gradient, plain or with compiled per-tile functions, and its chunked path's output,
    :mod:`sinklab.nn.attention`; the blockwise capture's column sums, row entropies and output rows, from a
    softmax in the tile or from a log-sum-exp, :mod:`sinklab.capture.blockwise`; the streaming sink + window
    attention's output, :mod:`sinklab.streaming.parallel`). Key ranges are :func:`key_range` of ``mask``
    (``t_k`` keys, default ``t_q``; query row ``q`` at position ``q + offset``), or ``keys(q0, q1)`` when
    given (e.g. read off a mask tensor). A range may be empty (``k0 >= k1``): :func:`reduce_tiles` hands it
    to :meth:`TileReducer.empty`.

    Raises:
        InputError: ``block`` < 1.
    """
    if block < 1:
        raise InputError(f"query block size must be at least 1, got {block}")
    t_k = t_q if t_k is None else t_k
    for q0 in range(0, t_q, block):
        q1 = min(t_q, q0 + block)
        k0, k1 = keys(q0, q1) if keys is not None else key_range(q0, q1, t_k, mask, offset=offset)
        yield q0, q1, k0, k1


class TileReducer:
    """What a blocked-attention loop does with each tile of :func:`reduce_tiles`: one per-tile reducer (an
    output, a log-sum-exp, column sums, a gradient, ...), the loop itself being the driver's.

    Subclasses override :meth:`tile`, and :meth:`empty` and :meth:`result` where they need to. Positions are
    0-based rows of the queries and columns of the keys the reducer was built for; ranges are end exclusive.
    """

    def tile(self, q0: int, q1: int, k0: int, k1: int) -> None:
        """One non-empty tile: query rows ``[q0, q1)`` against keys ``[k0, k1)`` (``q0 < q1``, ``k0 < k1``)."""
        raise NotImplementedError(f"{type(self).__name__} does not reduce tiles")

    def empty(self, q0: int, q1: int) -> None:
        """A query block ``[q0, q1)`` that sees no key (its key range is empty). Default: nothing."""

    def result(self) -> Any:
        """What :func:`reduce_tiles` returns once every tile was reduced. Default: None."""
        return None


class Reducers(TileReducer):
    """Several reducers over one walk: each tile (and each empty block) goes to ``reducers`` in the order
    given; :meth:`result` is the tuple of their results, in that order. Reducers that share a tile's work
    (e.g. its probabilities) share it through an object of their own, not through this one."""

    def __init__(self, *reducers: TileReducer) -> None:
        self.reducers = reducers

    def tile(self, q0: int, q1: int, k0: int, k1: int) -> None:
        """The tile (0-based, end exclusive) to every reducer, in order."""
        for r in self.reducers:
            r.tile(q0, q1, k0, k1)

    def empty(self, q0: int, q1: int) -> None:
        """The query block without a key to every reducer, in order."""
        for r in self.reducers:
            r.empty(q0, q1)

    def result(self) -> tuple:
        """The reducers' results, in their order."""
        return tuple(r.result() for r in self.reducers)


def reduce_tiles(reducer: TileReducer | tuple | list, t_q: int, block: int, mask: MaskSpec = CAUSAL, *,
                 t_k: int | None = None, offset: int = 0, keys=None) -> Any:
    """The blocked-attention driver: walk :func:`query_blocks` (same arguments, same order) and hand each
    block to ``reducer``: :meth:`TileReducer.tile` ``(q0, q1, k0, k1)`` when its key range is non-empty,
    :meth:`TileReducer.empty` ``(q0, q1)`` when it is (``k0 >= k1``).

    Args:
        reducer: a :class:`TileReducer`, or a tuple / list of them (run as :class:`Reducers`, in order).
        t_q, block, mask, t_k, offset, keys: as :func:`query_blocks`.

    Returns:
        ``reducer.result()`` (a tuple of the results for a tuple / list of reducers).

    Raises:
        InputError: ``block`` < 1.
    """
    if isinstance(reducer, (tuple, list)):
        reducer = Reducers(*reducer)
    for q0, q1, k0, k1 in query_blocks(t_q, block, mask, t_k=t_k, offset=offset, keys=keys):
        if k1 > k0:
            reducer.tile(q0, q1, k0, k1)
        else:
            reducer.empty(q0, q1)
    return reducer.result()


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * n_rep, T, D): each key/value head repeated for its group of
    ``n_rep`` query heads (grouped-query attention; query head h uses kv head ``h // n_rep``)."""
    if n_rep == 1:
        return x
    B, H, T, D = x.shape
    return x[:, :, None].expand(B, H, n_rep, T, D).reshape(B, H * n_rep, T, D)
