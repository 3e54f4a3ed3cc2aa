"""The ``blockwise`` collector: exact attention column sums without a T x T matrix.

The column sums ``sum_i A[b, h, i, j]`` are computed block by block over queries::

    A[b, h, i, j] = exp(scaling * q_i . k_j + bias_ij - LSE_i)

(``bias`` is 0 where query ``i`` may attend key ``j`` and -inf where it may not; LSE_i is
query i's log-sum-exp). A block of ``n`` queries needs only its ``(B, H_q, n, span)``
tile of scores, where ``span`` is the range of keys the block can see (``<= T_k``;
about half of it on average for a causal layer, at most ``window + n`` for a
sliding-window layer). Extra memory is therefore ``O(B H_q n T_k)`` for one layer at a
time, never ``O(T^2)``.

Where the attention output comes from (``output``, see :func:`blockwise_attention`):

* **tiles** (default on CPU; always with soft-capping as in Gemma 2, per-head sink
  logits as in gpt-oss, a sliding window that no mask expresses, or a causal layer
  with fewer queries than keys and no mask, which SDPA cannot compute): each block's
  tile of scores gives its rows' max, ``exp2`` and sum, the output
  ``softmax(tile) @ V`` and the column sums, in one pass in float32: one Q K^T and one
  P V GEMM per block, and only the square on the causal diagonal is masked. On CPU
  this is faster than the fused kernel below plus one more Q K^T.
* **fused** (CPU, opt-in): ``aten._scaled_dot_product_flash_attention_for_cpu``
  returns the output *and* the LSE in one call -- the kernel
  ``F.scaled_dot_product_attention`` dispatches to on CPU, so the output is
  bit-identical to the plain SDPA forward. Without a mask the column sums then cost
  one more Q K^T with ``-LSE`` folded into the GEMM, an ``exp2`` and a sum, in (1024
  keys x 64 queries) tiles that skip everything above the causal diagonal, but no
  P V product (:func:`column_sums_from_lse`); with a padding mask each block's tile
  of probabilities costs one GEMM with ``-LSE + bias`` as its accumulator.
* **sdpa** (default on other devices, where SDPA has fast kernels): the output from
  ``F.scaled_dot_product_attention`` exactly as ``transformers`` calls it, and the
  LSE of each tile computed in the tile (max, exp, sum).

The block loop (``tiles`` and ``sdpa``, and ``fused`` with a mask) is
:func:`sinklab.attention_masks.reduce_tiles` over the query blocks, with one reducer per statistic on the
same score tiles (``_ScoreTiles``: each block's probabilities, from a softmax in the tile or from the output
kernel's log-sum-exp, computed once per block): ``_ColumnSums``, ``_RowEntropies`` and, with ``tiles``,
``_OutputRows``.

The block size is chosen from a memory budget (:data:`DEFAULT_BUDGET_BYTES` for the
score tile, 64 MiB), on CPU at most :data:`MAX_BLOCK` queries, and can be fixed with
:func:`blockwise_options` or the ``SINKLAB_BLOCK_SIZE`` environment variable.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.attention_masks import MaskSpec, TileReducer, key_range, reduce_tiles, repeat_kv, visible
from sinklab.capture.collectors import COLLECTORS
from sinklab.errors import InputError

DEFAULT_BUDGET_BYTES = 64 * 2**20
"""Largest float32 score tile per block (the collector's extra memory is about twice the tile)."""

MAX_BLOCK = 32
"""Queries per block at most when the block size is chosen on CPU: measured on one core, larger
blocks gain no GEMM speed and their tiles fall out of cache (SmolLM2 shapes, T = 4096 and 8192)."""

OUTPUTS = ("auto", "tiles", "fused", "sdpa")
"""Where the attention output comes from; see :func:`blockwise_attention`."""

_FUSED_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


@dataclass
class BlockwiseOptions:
    """Settings of the ``blockwise`` collector.

    Attributes:
        block_size: queries per block; None chooses it from ``budget_bytes``.
        budget_bytes: bytes of one float32 score tile (B x H_q x block x span).
        output: one of :data:`OUTPUTS` (see :func:`blockwise_attention`).
    """

    block_size: int | None = None
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    output: str = "auto"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BlockwiseOptions:
        """The default options: ``SINKLAB_BLOCK_SIZE`` (a positive integer) fixes the block size.

        Raises:
            InputError: ``SINKLAB_BLOCK_SIZE`` is set but not a positive integer.
        """
        env = (os.environ if environ is None else environ).get("SINKLAB_BLOCK_SIZE")
        if not env:
            return cls()
        try:
            size = int(env)
        except ValueError:
            raise InputError(f"SINKLAB_BLOCK_SIZE must be a positive integer, got {env!r}") from None
        if size <= 0:
            raise InputError(f"SINKLAB_BLOCK_SIZE must be a positive integer, got {env!r}")
        return cls(block_size=size)


_local = threading.local()


@functools.lru_cache(maxsize=1)
def _env_options() -> BlockwiseOptions:
    """:meth:`BlockwiseOptions.from_env`, read once per process (at the first blockwise capture, not
    at every layer of every forward)."""
    return BlockwiseOptions.from_env()


def current_options() -> BlockwiseOptions:
    """The options in force in this thread: those of the innermost :func:`blockwise_options` block,
    else the process default (:meth:`BlockwiseOptions.from_env`, ``SINKLAB_BLOCK_SIZE`` read once)."""
    opts = getattr(_local, "options", None)
    return opts if opts is not None else _env_options()


@contextlib.contextmanager
def blockwise_options(
    block_size: int | None = None, budget_bytes: int = DEFAULT_BUDGET_BYTES, output: str = "auto"
) -> Iterator[BlockwiseOptions]:
    """Within the block, the ``blockwise`` collector uses these settings (this thread only).

    Raises:
        InputError: ``block_size`` or ``budget_bytes`` not positive, ``output`` not in :data:`OUTPUTS`.
    """
    if block_size is not None and block_size <= 0:
        raise InputError(f"block_size must be positive, got {block_size}")
    if budget_bytes <= 0:
        raise InputError(f"budget_bytes must be positive, got {budget_bytes}")
    _check_output(output)
    previous = getattr(_local, "options", None)
    _local.options = BlockwiseOptions(block_size, budget_bytes, output)
    try:
        yield _local.options
    finally:
        _local.options = previous


def _check_output(output: str) -> None:
    """Raise InputError unless ``output`` is one of :data:`OUTPUTS`."""
    if output not in OUTPUTS:
        raise InputError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")


def choose_block_size(
    batch: int, heads: int, t_q: int, t_k: int, budget_bytes: int = DEFAULT_BUDGET_BYTES,
    max_block: int | None = MAX_BLOCK,
) -> int:
    """Queries per block so that one (batch, heads, block, t_k) float32 tile fits ``budget_bytes``.

    At least 16 (or ``t_q`` if smaller), at most ``max_block`` (None: no limit) and ``t_q``;
    a multiple of 16 when below ``t_q``.
    """
    per_row = max(1, batch * heads * t_k * 4)
    n = budget_bytes // per_row
    if max_block is not None:
        n = min(n, max_block)
    if n >= t_q:
        return t_q
    return max(min(16, t_q), (n // 16) * 16)


def _float_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive mask (0 = attend, -inf = masked) of a boolean or additive-float mask."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    m = mask.to(dtype)
    return m.masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))


def _sdpa_output(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, is_causal: bool, scale: float) -> Tensor:
    """(B, H_q, T_q, D) attention output exactly as ``transformers``' SDPA integration computes it."""
    n_rep = query.shape[1] // key.shape[1]
    kwargs = {}
    if n_rep > 1:
        if mask is None and key.shape[-1] == value.shape[-1] <= 256:
            kwargs["enable_gqa"] = True
        else:
            key, value = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, is_causal=is_causal and mask is None, scale=scale, **kwargs
    )


def _tile_bias(
    mask: Tensor | None, q0: int, q1: int, k0: int, k1: int, offset: int, spec: MaskSpec, device
) -> Tensor | None:
    """Additive bias (0 / -inf) of the query rows [q0, q1) and keys [k0, k1), or None if all visible.

    With a mask tensor: its (Bm, Hm, n, span) slice as floats. Without: ``spec`` (causal with
    its sliding window: query row i, position i + offset, sees keys offset + i - window < j <= i + offset;
    bidirectional: None), shape (n, span).
    """
    if mask is not None:
        rows = mask[..., q0:q1, k0:k1] if mask.shape[-2] > 1 else mask[..., k0:k1]
        return _float_mask(rows, torch.float32)
    if not spec.causal:
        return None
    qpos = torch.arange(q0, q1, device=device) + offset
    hidden = ~visible(qpos, torch.arange(k0, k1, device=device), spec)  # (n, span)
    if not bool(hidden.any()):
        return None
    return torch.zeros(hidden.shape, device=device).masked_fill_(hidden, float("-inf"))


def _block_keys(
    mask: Tensor | None, q0: int, q1: int, t_k: int, offset: int, spec: MaskSpec
) -> tuple[int, int]:
    """[k0, k1): the keys that some query row in [q0, q1) may attend (an empty range gives k0 == k1):
    read off the ``mask`` tensor when there is one, else :func:`sinklab.attention_masks.key_range`
    of ``spec``."""
    if mask is not None:
        rows = mask[..., q0:q1, :] if mask.shape[-2] > 1 else mask
        allowed = rows if rows.dtype == torch.bool else rows > torch.finfo(rows.dtype).min / 2
        cols = allowed.reshape(-1, t_k).any(dim=0).nonzero()
        if cols.numel() == 0:
            return 0, 0
        return int(cols[0]), int(cols[-1]) + 1
    if not spec.causal:
        return 0, t_k
    return key_range(q0, q1, t_k, spec, offset=offset)


_LOG2E = 1.0 / math.log(2.0)

COLSUM_TILE_BYTES = 4 * 2**20
"""Largest float32 probability tile of :func:`column_sums_from_lse` (B x H_q x queries x keys)."""

COLSUM_QUERIES = 64
"""Queries per tile of :func:`column_sums_from_lse` (fewer when the tile would exceed :data:`COLSUM_TILE_BYTES`)."""

COLSUM_KEYS = 1024
"""Keys per tile of :func:`column_sums_from_lse` (rounded down to a multiple of the queries per tile): the
key block (1024 x 65 floats per key head, 260 KiB) stays in the L2 cache while every query block passes it."""


def column_sums_from_lse(
    query: Tensor, key: Tensor, lse: Tensor, *, scaling: float, is_causal: bool, tile_bytes: int = COLSUM_TILE_BYTES,
    block_size: int | None = None, key_block: int = COLSUM_KEYS, entropy: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Column sums of softmax attention from each query's log-sum-exp: one more Q K^T, no P V.

    ``c_j = sum_i exp(scaling * q_i . k_j - LSE_i)`` over the queries ``i`` that see key ``j``
    (Vaswani et al. 2017 softmax; the LSE comes from the fused kernel's forward). The
    ``-LSE_i`` is folded into the GEMM as one more head dimension (``q'_i = [scaling q_i,
    -LSE_i]``, ``k'_j = [k_j, 1]``; a 65th dimension costs no measurable GEMM time), so each
    tile of (queries, keys) costs one batched GEMM, one in-place ``exp2`` (the GEMM gives
    base-2 log-probabilities: both columns carry a factor log2(e)) and one sum over the
    tile's queries. Tiles are two-dimensional and visited key block by key block: each key
    block (``key_block`` keys, a multiple of the queries per tile) meets every query block
    that sees it (causal: the blocks at or after it; tiles above the diagonal are never
    computed, and only the tile on the diagonal needs a mask). A tile has
    :data:`COLSUM_QUERIES` queries, fewer if it would exceed ``tile_bytes`` of float32 (at
    least 16); a fixed ``block_size`` (queries per tile) overrides that. (A second
    fused-kernel call on the transposed problem, keys as queries, would also multiply by
    the values.)

    Args:
        query: (B, H_q, T_q, D); key: (B, H_kv, T_k, D) (grouped-query heads not repeated).
        lse: (B, H_q, T_q) log-sum-exp of each query's scaled scores, finite (every query
            sees a key), 0-based positions.
        scaling: the score scale used for ``lse``.
        is_causal: query i sees keys j <= i (then T_q == T_k), or every key (no mask).
        tile_bytes: largest float32 tile when choosing the queries per tile.
        block_size: queries per tile (overrides ``tile_bytes``).
        key_block: keys per tile (rounded down to a multiple of the queries per tile).
        entropy: also return each query's attention entropy in nats, ``-sum_j A[i, j] log A[i, j]``,
            accumulated over the same tiles (one more ``xlogy`` and sum per tile).

    Returns:
        (B, H_q, T_k) float64 column sums ``sum_i A[b, h, i, j]``; with ``entropy``, the pair
        (column sums, row entropies (B, H_q, T_q) float64).

    Raises:
        InputError: ``is_causal`` with T_q != T_k; ``block_size`` or ``key_block`` not positive.
    """
    B, Hq, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    if is_causal and Tq != Tk:
        raise InputError(f"causal column sums need as many queries as keys, got {Tq} and {Tk}")
    if (block_size is not None and block_size <= 0) or key_block <= 0:
        raise InputError(f"block_size and key_block must be positive, got {block_size} and {key_block}")
    n_rep = Hq // Hkv
    # base-2 log-probabilities (torch's exp2 is several times faster than exp on CPU)
    qa = torch.cat([query.float() * (scaling * _LOG2E), -lse.float()[..., None] * _LOG2E], dim=-1)  # (B, H_q, T_q, D+1)
    qa = qa.view(B, Hkv, n_rep, Tq, D + 1)
    ka = torch.cat([key.float(), key.new_ones(B, Hkv, Tk, 1, dtype=torch.float32)], dim=-1)  # (B, H_kv, T_k, D+1)
    ka = ka.reshape(B * Hkv, Tk, D + 1)
    m = min(key_block, Tk)
    n = block_size if block_size is not None else max(16, min(COLSUM_QUERIES, tile_bytes // max(1, B * Hq * m * 4)))
    n = min(n, Tq)
    m = max(n, m // n * n) if is_causal else m  # causal: the diagonal tile lies inside one key block
    # one buffer for every tile: a fresh multi-MB tensor per tile costs an mmap and page faults
    buf = torch.empty(B * Hq * n * m, dtype=torch.float32, device=query.device)
    hidden = torch.ones(n, n, dtype=torch.bool, device=query.device).tril_(-1)[:, None]  # [key j, 1, query i]: j > i
    # tiles are keys x queries: the GEMM is a little faster that way round and each key's sum is over
    # contiguous memory; col[b, g, j, r] belongs to query head g * n_rep + r
    col = torch.zeros(B, Hkv, Tk, n_rep, dtype=torch.float64, device=query.device)
    ent = torch.zeros(B, Hkv, n_rep, Tq, dtype=torch.float64, device=query.device) if entropy else None
    for k0 in range(0, Tk, m):
        for q0 in range(k0 if is_causal else 0, Tq, n):  # causal: k0 is a multiple of n
            q1 = min(Tq, q0 + n)
            k1 = min(q1, k0 + m) if is_causal else min(Tk, k0 + m)
            qbT = qa[:, :, :, q0:q1].reshape(B * Hkv, n_rep * (q1 - q0), D + 1).transpose(1, 2)  # (B*H_kv, D+1, .)
            tile = buf[: B * Hq * (q1 - q0) * (k1 - k0)].view(B * Hkv, k1 - k0, n_rep * (q1 - q0))
            torch.bmm(ka[:, k0:k1], qbT, out=tile)
            tile = tile.view(B, Hkv, k1 - k0, n_rep, q1 - q0)  # log2-probabilities
            if is_causal and k1 == q1:  # the diagonal tile: hide keys after the query
                tile[:, :, q0 - k0 :].masked_fill_(hidden[: q1 - q0, :, : q1 - q0], float("-inf"))
            col[:, :, k0:k1] += tile.exp2_().sum(dim=-1)  # (B, H_kv, k1 - k0, n_rep)
            if ent is not None:  # -sum over the tile's keys of p log p (natural log), per query
                ent[..., q0:q1] -= torch.special.xlogy(tile, tile).sum(dim=2)  # (B, H_kv, n_rep, q1 - q0)
    col = col.transpose(2, 3).reshape(B, Hq, Tk)
    return (col, ent.reshape(B, Hq, Tq)) if ent is not None else col


def blockwise_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    scaling: float | None,
    attention_mask: Tensor | None,
    is_causal: bool,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    sliding_window: int | None = None,
    block_size: int | None = None,
    budget_bytes: int | None = None,
    output: str | None = None,
    entropy: bool = False,
) -> tuple[Tensor, ...]:
    """Attention output and exact column sums, block by block over queries.

    Computes the same as the ``eager`` collector (softmax attention, Vaswani et al.
    2017, with Gemma 2 soft-capping ``softcap * tanh(s / softcap)``, gpt-oss sink
    logits in the denominator, and Gemma 3 / Mistral sliding windows), but the
    largest temporary is one (B, H_q, block, span) float32 score tile.

    Args:
        query: (B, H_q, T_q, D), after RoPE.
        key, value: (B, H_kv, T_k, D) with H_q a multiple of H_kv (grouped-query
            heads are not repeated).
        scaling: score scale; None means ``1/sqrt(D)``.
        attention_mask: None, a boolean mask (True = may attend) or an additive
            float mask, broadcastable to (B, H_q, T_q, T_k); it already contains
            causality and the window when given.
        is_causal: without a mask, query ``i`` (0-based) sees keys
            ``j <= i + T_k - T_q``.
        softcap: Gemma 2 attention-logit soft-capping, or None.
        sinks: (H_q,) per-head sink logits added to the softmax denominator
            (gpt-oss), or None.
        sliding_window: without a mask, a causal layer's query ``i`` also needs
            ``j > i + T_k - T_q - sliding_window`` (``transformers`` semantics).
        block_size: queries per block; None uses :func:`current_options` or
            :func:`choose_block_size`.
        budget_bytes: memory budget of one score tile when choosing the block size.
        output: where the attention output comes from (None: :func:`current_options`):
            ``tiles`` -- from the score tiles, ``softmax(tile) @ V``, in the same pass as the
            column sums: one Q K^T and one P V GEMM per block, in float32 (the fastest on
            CPU: the whole SmolLM2-135M capture costs 1.12x the plain forward at T = 4096
            against 1.31x with ``fused``, ``benchmarks/results/long_context_paired_after{3,2}-T4096.json``);
            ``fused`` -- CPU only: the fused SDPA kernel
            (``_scaled_dot_product_flash_attention_for_cpu``), so the output is bit-identical to
            the plain SDPA forward, and its log-sum-exp feeds one more Q K^T for the column
            sums (:func:`column_sums_from_lse`); ``sdpa`` -- ``F.scaled_dot_product_attention``
            as ``transformers`` calls it, the tiles computing their own log-sum-exp (fast where
            SDPA has fast kernels: CUDA); ``auto`` -- ``tiles`` on CPU, ``sdpa`` elsewhere.
            Soft-capping, sink logits, a sliding window that no mask expresses, or fewer
            causal queries than keys without a mask always use ``tiles`` (SDPA cannot compute
            them); ``fused`` off CPU (or with value and query head sizes differing) is ``sdpa``.
        entropy: also return the row entropies, from the same tiles: with ``u_j`` a row's
            unnormalised weights (after the max shift) and ``Z = sum_j u_j`` (the sink logit's
            ``u`` included), ``H = log Z - sum_j u_j log u_j / Z``; on the log-sum-exp paths
            ``H = -sum_j p_j log p_j`` directly. Costs one ``xlogy`` over every tile.

    Returns:
        output (B, T_q, H_q, D) in ``value``'s dtype; column sums (B, H_q, T_k)
        float64, ``sum_i A[b, h, i, j]`` over 0-based query positions ``i``. Queries
        whose every key is masked (padding) contribute nothing. With ``entropy``, a third
        tensor: the row entropies (B, H_q, T_q) float64 in nats (0 for a fully masked query).

    Raises:
        InputError: mismatched shapes, H_q not a multiple of H_kv, a block size
            that is not positive, or ``output`` not in :data:`OUTPUTS`.
    """
    s = _resolve(query, key, value, scaling=scaling, attention_mask=attention_mask, is_causal=is_causal,
                 softcap=softcap, sinks=sinks, sliding_window=sliding_window, block_size=block_size,
                 budget_bytes=budget_bytes, output=output)
    if s.output == "fused" and s.mask is None:
        # output and LSE from the fused kernel, column sums from one more Q K^T (see column_sums_from_lse)
        out, lse = _FUSED_CPU(query, key, value, 0.0, bool(is_causal), scale=s.scale)
        if query.dtype != torch.float32:  # the LSE of the float32 scores the statistics use
            _, lse = _FUSED_CPU(query.float(), key.float(), value.float(), 0.0, bool(is_causal), scale=s.scale)
        col = column_sums_from_lse(query, key, lse, scaling=s.scale, is_causal=is_causal, block_size=s.fixed_block,
                                   entropy=entropy)
        if entropy:
            return out.transpose(1, 2).contiguous(), *col
        return out.transpose(1, 2).contiguous(), col
    out, lse = _output_and_lse(query, key, value, s, is_causal)
    # the block loop: each block's score tile (its probabilities, from a softmax in the tile or from the
    # kernel's log-sum-exp) reduced to column sums, row entropies and, with output "tiles", output rows
    scores = _ScoreTiles(query, key, s, lse=lse, is_causal=is_causal, softcap=softcap, sinks=sinks)
    reducers = [_ColumnSums(scores)]
    if entropy:
        reducers.append(_RowEntropies(scores))
    if s.output == "tiles":
        reducers.append(_OutputRows(scores, value, out))
    results = reduce_tiles(reducers, query.shape[2], s.block_size, keys=scores.keys)
    col, more = results[0], results[1:2] if entropy else ()
    if s.output == "tiles":
        return out.to(value.dtype), col, *more
    return out.transpose(1, 2).contiguous(), col, *more


@dataclass
class _Plan:
    """How :func:`blockwise_attention` runs on given inputs (:func:`_resolve`)."""

    block_size: int  # queries per block
    fixed_block: int | None  # the block size asked for (None: chosen)
    output: str  # "tiles", "fused" or "sdpa" (resolved)
    scale: float  # score scale
    offset: int  # T_k - T_q: query i is at key position i + offset
    window: int | None  # the sliding window still to apply (no mask expresses it), or None
    mask: Tensor | None  # the attention mask as 4-D, or None
    n_rep: int  # query heads per key/value head


def _resolve(query: Tensor, key: Tensor, value: Tensor, *, scaling: float | None, attention_mask: Tensor | None,
             is_causal: bool, softcap: float | None, sinks: Tensor | None, sliding_window: int | None,
             block_size: int | None, budget_bytes: int | None, output: str | None) -> _Plan:
    """Check the inputs of :func:`blockwise_attention` and resolve its options (the thread's
    :func:`current_options` for those left None). Raises InputError as it documents."""
    if query.dim() != 4 or key.dim() != 4 or value.shape[:3] != key.shape[:3]:
        raise InputError(
            f"expected query (B, H_q, T_q, D) and key/value (B, H_kv, T_k, D), got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    B, Hq, Tq, D = query.shape
    Hkv, Tk = key.shape[1], key.shape[2]
    if Hq % Hkv != 0:
        raise InputError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv})")
    opts = current_options()
    block_size = block_size if block_size is not None else opts.block_size
    fixed_block = block_size
    budget_bytes = budget_bytes if budget_bytes is not None else opts.budget_bytes
    output = opts.output if output is None else output
    _check_output(output)
    if block_size is None:
        # the MAX_BLOCK cap is for CPU caches; on an accelerator fewer, larger blocks mean fewer launches
        cap = MAX_BLOCK if query.device.type == "cpu" else None
        block_size = choose_block_size(B, Hq, Tq, Tk, budget_bytes, max_block=cap)
    if block_size <= 0:
        raise InputError(f"block_size must be positive, got {block_size}")
    scale = scaling if scaling is not None else 1.0 / math.sqrt(D)
    offset = Tk - Tq
    # a window matters only if, without a mask, some query could see a key `window` or more back
    window = sliding_window if (attention_mask is None and is_causal and sliding_window is not None) else None
    if window is not None and Tq - 1 + offset < window:
        window = None
    # SDPA's is_causal aligns the triangle to the first query; ours (and eager's) to the last
    misaligned = is_causal and attention_mask is None and Tq != Tk
    tiled_output = softcap is not None or sinks is not None or window is not None or misaligned
    mask = attention_mask
    if mask is not None and mask.dim() != 4:
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if output == "auto":
        output = "tiles" if query.device.type == "cpu" else "sdpa"
    if output == "fused" and (_FUSED_CPU is None or query.device.type != "cpu" or value.shape[-1] != D):
        output = "sdpa"  # the fused kernel runs on CPU with equal query and value head sizes only
    if tiled_output:
        output = "tiles"
    return _Plan(block_size=block_size, fixed_block=fixed_block, output=output, scale=scale, offset=offset,
                 window=window, mask=mask, n_rep=Hq // Hkv)


def _output_and_lse(query: Tensor, key: Tensor, value: Tensor, s: _Plan, is_causal: bool) -> tuple[Tensor, Tensor | None]:
    """The attention output as the plan's ``output`` makes it, before the tiles: ``tiles`` -> an empty
    float32 (B, T_q, H_q, D_v) that the tiles fill; ``fused`` (with a mask) -> the kernel's (B, H_q, T_q,
    D_v) output and its float32 log-sum-exp (B, H_q, T_q); ``sdpa`` -> SDPA's (B, H_q, T_q, D_v) output.
    Returns ``(out, lse)`` (lse None but for ``fused``)."""
    B, Hq, Tq, _ = query.shape
    mask, scale = s.mask, s.scale
    lse = None  # (B, H_q, T_q) float32, when the output kernel provides it
    if s.output == "tiles":
        # written straight in the (B, T_q, H_q, D_v) layout the caller wants: no transposed copy at the end
        out = torch.empty(B, Tq, Hq, value.shape[-1], dtype=torch.float32, device=query.device)
    elif s.output == "fused":
        # transformers built a (B, 1, T_q, T_k) boolean mask for the padding; the kernel wants it additive
        fmask = None if mask is None else _float_mask(mask, query.dtype)
        out, lse = _FUSED_CPU(query, key, value, 0.0, bool(is_causal and mask is None), attn_mask=fmask, scale=scale)
        if query.dtype != torch.float32:
            fmask = None if mask is None else _float_mask(mask, torch.float32)
            _, lse = _FUSED_CPU(query.float(), key.float(), value.float(), 0.0, False, attn_mask=fmask, scale=scale)
        lse = lse.float()
    else:
        out = _sdpa_output(query, key, value, mask, is_causal, scale)
    return out, lse


@dataclass
class _Block:
    """One block's probabilities (:meth:`_ScoreTiles.block`), valid until the next block is computed (they live
    in the shared score buffer). ``n`` queries, ``span`` keys."""

    tile: Tensor  # (B*H_kv, n_rep*n, span): the probabilities in the score buffer, each KV group's heads stacked
    probs: Tensor  # (B*H_q, n, span): the same, per query head
    weights: Tensor  # (B*H_q, 1, n): each row's normaliser (1 / denominator; all 1 from a log-sum-exp)
    inv: Tensor | None  # (B, H_q, n, 1) 1 / denominator (in-tile softmax), None from a log-sum-exp
    denom: Tensor | None  # (B, H_q, n, 1) the softmax denominator (sink included), None from a log-sum-exp
    u_sink: Tensor | None  # (B, H_q, n, 1) the sink logit's unnormalised weight, or None


class _ScoreTiles:
    """The score tiles of :func:`blockwise_attention`: each block of queries' probabilities over the keys it sees,
    computed once per block and shared by the reducers of the walk (:class:`_ColumnSums`, :class:`_RowEntropies`,
    :class:`_OutputRows`). From the output kernel's log-sum-exp ``lse`` (B, H_q, T_q) when given (``fused``
    with a mask), else by a softmax in the tile (max, exp, sum; soft-capping and sink logits included). Query
    (B, H_q, T_q, D), key (B, H_kv, T_k, D); 0-based positions, end-exclusive ranges."""

    def __init__(self, query: Tensor, key: Tensor, s: _Plan, *, lse: Tensor | None, is_causal: bool,
                 softcap: float | None, sinks: Tensor | None) -> None:
        B, Hq, Tq, D = query.shape
        Hkv, Tk = key.shape[1], key.shape[2]
        self.s, self.lse, self.softcap = s, lse, softcap
        self.shape, self.device = (B, Hq, Hkv, Tq, Tk, D), query.device
        # scores in base 2 (exp2 is several times faster than exp on CPU) with the scale folded into
        # the queries; soft-capping needs natural units, so it keeps base e
        self.base = base = _LOG2E if softcap is None else 1.0
        self.qf = query.float() * (s.scale * base)
        self.kT = key.float().reshape(B * Hkv, Tk, D).transpose(1, 2)  # (B*H_kv, D, T_k)
        self.sink_logits = None if sinks is None else sinks.float().reshape(1, Hq, 1, 1) * base
        self.exp_ = Tensor.exp2_ if base != 1.0 else Tensor.exp_  # in place
        # one score buffer for every block: a fresh multi-MB tile per block costs an mmap and page faults
        n_max = min(s.block_size, Tq)
        self.buf = torch.empty(B * Hq * n_max * Tk, dtype=torch.float32, device=query.device)
        # causal without mask or window: only the (n x n) square on the diagonal has hidden keys
        self.triangle = s.mask is None and is_causal and s.window is None
        self.upper = torch.ones(n_max, n_max, dtype=torch.bool, device=query.device).triu_(1) if self.triangle else None
        self.spec = MaskSpec(causal=is_causal, window=s.window)  # the mask when no mask tensor is given
        self._at: tuple[int, int, int, int] | None = None
        self._block: _Block | None = None

    def keys(self, q0: int, q1: int) -> tuple[int, int]:
        """The key range [k0, k1) of the query rows [q0, q1) (:func:`_block_keys`; the driver's ``keys``)."""
        s = self.s
        return _block_keys(s.mask, q0, q1, self.shape[4], s.offset, self.spec)

    def block(self, q0: int, q1: int, k0: int, k1: int) -> _Block:
        """The probabilities of query rows [q0, q1) over keys [k0, k1) (a non-empty range), computed at the first
        call for this tile (one Q K^T GEMM), the same object for the other reducers of the tile."""
        if self._at == (q0, q1, k0, k1):
            return self._block
        s = self.s
        B, Hq, Hkv, Tq, Tk, D = self.shape
        n, span = q1 - q0, k1 - k0
        # query block with each KV group's n_rep heads stacked: (B*H_kv, n_rep*n, D)
        qb = self.qf[:, :, q0:q1].reshape(B * Hkv, s.n_rep * n, D)
        tile = self.buf[: B * Hq * n * span].view(B * Hkv, s.n_rep * n, span)
        diagonal = self.triangle and k0 == 0 and q0 + s.offset >= 0 and k1 == q1 + s.offset
        bias = None if diagonal else _tile_bias(s.mask, q0, q1, k0, k1, s.offset, self.spec, self.device)
        if bias is not None and self.base != 1.0:
            bias = bias * self.base  # additive float masks in base-2 units (0 and -inf stay)
        if self.lse is not None:
            b = self._from_lse(qb, tile, bias, q0, q1, k0, k1)
        else:
            b = self._softmax(qb, tile, bias, diagonal, q0, q1, k0, k1)
        self._at, self._block = (q0, q1, k0, k1), b
        return b

    def _from_lse(self, qb: Tensor, tile: Tensor, bias: Tensor | None, q0: int, q1: int, k0: int, k1: int) -> _Block:
        """A block's probabilities from the output kernel's log-sum-exp: ``exp(scores + bias - LSE)``
        (base 2 here), ``(bias - LSE)`` as the GEMM's accumulator; normalised already (weights all 1)."""
        B, Hq = self.shape[:2]
        n, span = q1 - q0, k1 - k0
        scores = tile.view(B, Hq, n, span)
        lse_b = self.lse[:, :, q0:q1, None]  # (B, H_q, n, 1)
        lse_b = torch.where(torch.isinf(lse_b), torch.zeros_like(lse_b), lse_b) * self.base  # fully masked rows
        if bias is None:
            scores.copy_(lse_b.neg().expand_as(scores))
        else:
            torch.sub(bias, lse_b, out=scores)
        probs = self.exp_(tile.baddbmm_(qb, self.kT[:, :, k0:k1])).view(B * Hq, n, span)
        weights = torch.ones(B * Hq, 1, n, device=self.device)
        return _Block(tile, probs, weights, None, None, None)

    def _softmax(self, qb: Tensor, tile: Tensor, bias: Tensor | None, diagonal: bool, q0: int, q1: int, k0: int,
                 k1: int) -> _Block:
        """A block's softmax in the tile (max, exp, sum; soft-capping and sink logits included): the
        probabilities unnormalised, each row's 1 / denominator as its weight."""
        B, Hq = self.shape[:2]
        n, span, offset, softcap, sink_logits, exp_ = q1 - q0, k1 - k0, self.s.offset, self.softcap, self.sink_logits, self.exp_
        scores = tile.view(B, Hq, n, span)
        torch.bmm(qb, self.kT[:, :, k0:k1], out=tile)  # (B*H_kv, n_rep*n, span): scaled scores
        if softcap is not None:
            scores.div_(softcap).tanh_().mul_(softcap)
        if diagonal:  # key j > query i + offset: the upper triangle of the last n keys
            scores[..., q0 + offset - k0 :].masked_fill_(self.upper[:n, :n], float("-inf"))
        elif bias is not None:
            scores.add_(bias)
        row_max = scores.amax(dim=-1, keepdim=True)  # (B, H_q, n, 1)
        if sink_logits is not None:
            row_max = torch.maximum(row_max, sink_logits.expand_as(row_max))
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        scores.sub_(row_max)
        probs = exp_(scores)  # unnormalised
        denom = probs.sum(dim=-1, keepdim=True)
        u_sink = None if sink_logits is None else exp_(sink_logits - row_max)  # (B, H_q, n, 1)
        if u_sink is not None:
            denom = denom + u_sink
        inv = torch.where(denom > 0, 1.0 / denom, torch.zeros_like(denom))  # (B, H_q, n, 1)
        return _Block(tile, probs.view(B * Hq, n, span), inv.view(B * Hq, 1, n), inv, denom, u_sink)


class _ColumnSums(TileReducer):
    """Column sums of the score tiles: each block adds its (normalised) probabilities summed over its queries,
    ``weights^T @ probs``, to keys [k0, k1). Result: (B, H_q, T_k) float64; a block that sees no key adds nothing."""

    def __init__(self, scores: _ScoreTiles) -> None:
        B, Hq, _, _, Tk, _ = scores.shape
        self.scores = scores
        self.col = torch.zeros(B, Hq, Tk, dtype=torch.float64, device=scores.device)

    def tile(self, q0: int, q1: int, k0: int, k1: int) -> None:
        B, Hq = self.scores.shape[:2]
        b = self.scores.block(q0, q1, k0, k1)
        self.col[:, :, k0:k1] += torch.bmm(b.weights, b.probs).view(B, Hq, k1 - k0)  # (B*H_q, 1, span) summed rows

    def result(self) -> Tensor:
        return self.col


class _RowEntropies(TileReducer):
    """Each query's attention entropy in nats from its block's probabilities: ``-sum_j p_j log p_j`` from a
    log-sum-exp; from an in-tile softmax ``H = log Z - sum_j u_j log u_j / Z`` (``u`` the unnormalised weights,
    the sink's included in ``Z``). Result: (B, H_q, T_q) float64, 0 for queries that see no key."""

    def __init__(self, scores: _ScoreTiles) -> None:
        B, Hq, _, Tq, _, _ = scores.shape
        self.scores = scores
        self.ent = torch.zeros(B, Hq, Tq, dtype=torch.float64, device=scores.device)

    def tile(self, q0: int, q1: int, k0: int, k1: int) -> None:
        B, Hq = self.scores.shape[:2]
        n = q1 - q0
        b = self.scores.block(q0, q1, k0, k1)
        if b.denom is None:  # normalised probabilities: -sum p log p
            self.ent[:, :, q0:q1] = -torch.special.xlogy(b.probs, b.probs).sum(dim=-1).view(B, Hq, n)
            return
        u = b.probs.view(B, Hq, n, k1 - k0)  # unnormalised
        ulogu = torch.special.xlogy(u, u).sum(dim=-1, keepdim=True)
        if b.u_sink is not None:
            ulogu = ulogu + torch.special.xlogy(b.u_sink, b.u_sink)
        denom = b.denom
        h = torch.where(denom > 0, torch.log(denom.clamp_min(1e-38)) - ulogu * b.inv, torch.zeros_like(denom))
        self.ent[:, :, q0:q1] = h.squeeze(-1)

    def result(self) -> Tensor:
        return self.ent


class _OutputRows(TileReducer):
    """The attention output from the score tiles (``output = "tiles"``, in-tile softmax only): the rows [q0, q1)
    of ``out`` (B, T_q, H_q, D_v) float32 are ``softmax(tile) @ V`` (one P V GEMM per block, the normaliser
    applied after it); a block that sees no key gets zeros. value (B, H_kv, T_k, D_v). Result: ``out``."""

    def __init__(self, scores: _ScoreTiles, value: Tensor, out: Tensor) -> None:
        B, _, Hkv, _, Tk, _ = scores.shape
        self.scores, self.out = scores, out
        self.vf = value.float().reshape(B * Hkv, Tk, -1)

    def tile(self, q0: int, q1: int, k0: int, k1: int) -> None:
        B, Hq = self.scores.shape[:2]
        b = self.scores.block(q0, q1, k0, k1)
        o = torch.bmm(b.tile, self.vf[:, k0:k1])  # (B*H_kv, n_rep*n, D_v), unnormalised
        self.out[:, q0:q1] = (o.view(B, Hq, q1 - q0, -1) * b.inv).transpose(1, 2)

    def empty(self, q0: int, q1: int) -> None:
        self.out[:, q0:q1] = 0.0

    def result(self) -> Tensor:
        return self.out


@COLLECTORS.register(
    "blockwise",
    description="exact column sums block by block over queries, with the output from the same score tiles "
    "(CPU) or SDPA; no T x T matrix",
)
def blockwise_collector(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    scaling: float | None,
    attention_mask: Tensor | None,
    is_causal: bool,
    softcap: float | None = None,
    sinks: Tensor | None = None,
    sliding_window: int | None = None,
    entropy: bool = False,
) -> tuple[Tensor, ...]:
    """The registered collector: :func:`blockwise_attention` with the thread's :func:`current_options`."""
    return blockwise_attention(
        query,
        key,
        value,
        scaling=scaling,
        attention_mask=attention_mask,
        is_causal=is_causal,
        softcap=softcap,
        sinks=sinks,
        sliding_window=sliding_window,
        entropy=entropy,
    )
