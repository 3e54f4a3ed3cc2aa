"""The long-stream harness behind ``sinklab stream``: perplexity, latency and memory per cache.

One token stream (a corpus's documents in order, joined by a blank line, the first N tokens) is
fed to a ``transformers`` RoPE decoder one token at a time under each cache configuration, as in
StreamingLLM (Xiao et al. 2024, Fig. 3 and Table 1):

* ``full`` -- the whole history (transformers' ``DynamicCache``), up to the model's context;
* ``window`` -- the last ``window`` tokens only (``SinkCache`` with ``n_sink = 0``);
* ``sinks_k`` -- the first k tokens + the last ``window`` (``SinkCache``);
* ``POLICY@BUDGET[:kvBITS-KEYQUANT-fpN]`` -- with ``--policy``: any cache policy of
  :data:`sinklab.streaming.policies.POLICIES` at a budget of kept tokens, keys/values stored as
  given or quantised (:mod:`sinklab.streaming.quant`), for the cross product given
  (:func:`policy_specs`);
* ``recompute`` -- sliding window with recomputation: for token t, a fresh forward over the
  ``window`` tokens before it and t itself (positions 0..window), the quality reference; it costs a
  whole window per token, so it is evaluated every ``recompute_every``-th token.

Perplexity is exp(mean negative log-likelihood, in nats) of the next token; position t (0-based)
predicts token t + 1. The perplexities of full / window / sinks come from one parallel forward
per configuration that computes exactly what the token-by-token cache computes
(:mod:`sinklab.streaming.parallel`; ``mode="decode"`` feeds the real cache token by token
instead); the other policies and every quantised cache are always fed token by token through the
real cache (:func:`decode_stream`; the attention-based policies with eager attention, whose
weights they read). Latency is the wall time of a decode step through the real cache at the end
of the stream (ms), cache memory the bytes of the kept keys and values there (codes, scales and
zeros of a quantised cache).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, param
from sinklab.fileio import atomic_write_text
from sinklab.models import input_device
from sinklab.progress import progress as show_progress
from sinklab.streaming.cache import SinkCache, long_calls_expected


@dataclass
class CacheSpec:
    """One configuration: ``kind`` is ``full``, ``sink`` (a :class:`SinkCache`) or ``recompute``.

    A ``sink`` configuration has a ``policy`` (:data:`sinklab.streaming.policies.POLICIES`) at a
    ``budget`` of kept tokens, ``n_sink`` sink tokens and ``window = budget - n_sink``, and its
    keys/values stored at ``kv_bits`` (16 = as given; else :mod:`sinklab.streaming.quant` with
    ``kv_group``, ``key_quant`` and ``sinks_full_precision``).
    """

    name: str
    kind: str
    n_sink: int | None
    window: int | None
    policy: str | None = None
    budget: int | None = None
    kv_bits: int = 16
    kv_group: int = 32
    key_quant: str = "token"
    sinks_full_precision: int | str = 0

    @property
    def needs_weights(self) -> bool:
        """True where the cache reads the attention weights (eager attention): an attention-based policy,
        or a quantised cache keeping the detected sinks lossless."""
        from sinklab.streaming.policies import POLICIES

        if self.kind != "sink" or self.policy is None:
            return False
        return POLICIES.get(self.policy).needs_scores or (self.kv_bits != 16 and self.sinks_full_precision == "detected")

    @property
    def parallel_ok(self) -> bool:
        """True where :func:`stream_nll`'s one-forward path computes this cache exactly (full, and
        window / sinks at 16 bits); the others are decoded token by token through the cache."""
        return self.kind == "full" or (self.kind == "sink" and self.policy in ("window", "sinks") and self.kv_bits == 16)

    def cache_kwargs(self) -> dict:
        """Keyword arguments of :class:`SinkCache` for a ``sink`` configuration."""
        return {"n_sink": self.n_sink, "policy": self.policy, "budget": self.budget, "kv_bits": self.kv_bits,
                "kv_group": self.kv_group, "key_quant": self.key_quant,
                "sinks_full_precision": self.sinks_full_precision}


@dataclass
class StreamConfigResult:
    """The numbers of one configuration (one object of ``stream.json``'s ``configs``).

    ppl: perplexity over the evaluated predictions. ppl_by_chunk: per chunk of ``chunk`` stream
    positions (None where a chunk has no evaluated prediction). latency_ms_per_token: mean wall
    time of one decode step at the end of the stream (recompute: one forward over the window).
    cache_bytes: bytes of keys and values held at the end of the stream (recompute: those of one
    window's forward).
    evaluated: number of predictions scored; positions: first and last scored position.
    ppl_matched: perplexity over the positions ``recompute`` scores (the same predictions for
    every configuration: compare these with recompute's ``ppl``); None for a configuration that does not
    score every one of them (the full cache, which stops at the model's context, on a longer stream), so
    that no value rests on a subset of recompute's positions.
    count_by_chunk: predictions scored in each chunk (what each ``ppl_by_chunk`` entry rests on:
    ``chunk`` for the caches, about ``chunk / recompute_every`` for ``recompute``; empty in a
    ``stream.json`` written before it was recorded).
    policy, budget, kv_bits, kv_group, key_quant, sinks_full_precision: the cache (:class:`CacheSpec`;
    policy ``full`` / ``recompute`` and budget None for those two). state_bytes: the cache's other
    bookkeeping at the end (positions, arrival indices, policy scores). mode: how the perplexity was
    computed (``parallel`` or ``decode``); attn_implementation: the attention the decode steps ran.
    kl, top1: agreement with the full cache (DESIGN.md; :mod:`sinklab.metrics.agreement`): the mean over the
    scored positions t (0-based) of KL(p_full || p_this) of the distribution of token t + 1, in nats, and the
    share of them whose argmax tokens agree (None where no full-cache reference was computed: a
    ``stream.json`` written before, or ``agreement=False``); kl_by_chunk, top1_by_chunk: per chunk;
    agreement_positions: how many positions they rest on (the full cache stops at the model's context, so
    positions past it have no reference). ppl_agreement: perplexity over those same positions (None without a
    reference): what a paired comparison with ``full`` rests on when the full cache stopped before the stream's
    end (:func:`sinklab.streaming.streams.summarize_streams`).
    """

    name: str
    n_sink: int | None
    window: int | None
    ppl: float
    ppl_by_chunk: list[float | None]
    latency_ms_per_token: float | None
    cache_bytes: int
    evaluated: int
    positions: list[int]
    ppl_matched: float | None = None
    nll_by_chunk: list[float | None] = field(default_factory=list)
    count_by_chunk: list[int] = field(default_factory=list)
    policy: str | None = None
    budget: int | None = None
    kv_bits: int = 16
    kv_group: int = 32
    key_quant: str = "token"
    sinks_full_precision: int | str = 0
    state_bytes: int = 0
    mode: str | None = None
    attn_implementation: str | None = None
    kl: float | None = None
    top1: float | None = None
    kl_by_chunk: list[float | None] = field(default_factory=list)
    top1_by_chunk: list[float | None] = field(default_factory=list)
    agreement_positions: int = 0
    ppl_agreement: float | None = None


def cache_specs(window: int, sinks: Sequence[int], *, full: bool = True, recompute: bool = True) -> list[CacheSpec]:
    """The configurations of a run: full, window / sinks_k for each k in ``sinks``, recompute.

    Raises:
        InputError: a negative number of sinks, or ``window < 1``.
    """
    if window < 1:
        raise InputError(f"{param('window')} must be >= 1, got {window}")
    if any(k < 0 for k in sinks):
        raise InputError(f"{param('sinks')} must be >= 0, got {list(sinks)}")
    specs = [CacheSpec("full", "full", None, None, policy="full")] if full else []
    for k in dict.fromkeys(sinks):
        specs.append(CacheSpec("window" if k == 0 else f"sinks_{k}", "sink", int(k), window,
                               policy="window" if k == 0 else "sinks", budget=int(k) + window))
    if recompute:
        specs.append(CacheSpec("recompute", "recompute", None, window, policy="recompute"))
    return specs


def spec_name(policy: str, budget: int, kv_bits: int = 16, key_quant: str = "token",
              sinks_full_precision: int | str = 0) -> str:
    """``POLICY@BUDGET``, with ``:kvBITS-KEYQUANT-fpN`` for a quantised cache (e.g. ``sinks@256:kv4-channel-fp4``)."""
    name = f"{policy}@{budget}"
    return name if kv_bits == 16 else f"{name}:kv{kv_bits}-{key_quant}-fp{sinks_full_precision}"


def policy_specs(policies: Sequence[str], budgets: Sequence[int], *, n_sink: int = 4, kv_bits: Sequence[int] = (16,),
                 key_quant: Sequence[str] = ("token",), sinks_full_precision: Sequence[int | str] = (0,), kv_group: int = 32,
                 window: int = 256, full: bool = True, recompute: bool = True) -> list[CacheSpec]:
    """The cross product policies x budgets x kv_bits x key_quant x sinks_full_precision, between
    ``full`` and ``recompute`` (over ``window`` tokens). A 16-bit cache is one configuration, not one per
    combination of the quantisation options (which go to the quantised ones; given with 16 bits alone, they
    are refused: :func:`sinklab.streaming.quant.check_storage_options`); ``n_sink`` goes to the policies with sinks.

    Raises:
        UnknownNameError: an unknown policy. InputError: a bad budget, n_sink or quantisation option
        (:func:`sinklab.streaming.policies.make_policy`, :func:`sinklab.streaming.quant.check_kv_options`).
    """
    from sinklab.streaming.policies import POLICIES, make_policy
    from sinklab.streaming.quant import check_kv_options, check_storage_options, parse_sinks_full_precision

    if window < 1:
        raise InputError(f"{param('window')} must be >= 1, got {window}")
    fps = list(dict.fromkeys(map(parse_sinks_full_precision, sinks_full_precision)))
    if all(int(b) == 16 for b in kv_bits):  # storage options with no quantised cache to apply to
        check_storage_options(min(budgets, default=1), 16, "channel" if "channel" in key_quant else "token",
                              next((fp for fp in fps if fp != 0), 0), kv_group)
    specs = [CacheSpec("full", "full", None, None, policy="full")] if full else []
    seen = set()
    for policy in dict.fromkeys(policies):
        ns = n_sink if POLICIES.get(policy).uses_sinks else 0
        for budget in dict.fromkeys(budgets):
            make_policy(policy, int(budget), ns)
            for bits in dict.fromkeys(kv_bits):
                for kq in dict.fromkeys(key_quant) if bits != 16 else ["token"]:
                    for fp in fps if bits != 16 else [0]:
                        check_kv_options(int(bits), kv_group, kq, fp)
                        check_storage_options(int(budget), int(bits), kq, fp)
                        name = spec_name(policy, int(budget), int(bits), kq, fp)
                        if name in seen:
                            continue
                        seen.add(name)
                        specs.append(CacheSpec(name, "sink", ns, int(budget) - ns, policy=policy, budget=int(budget),
                                               kv_bits=int(bits), kv_group=kv_group, key_quant=kq,
                                               sinks_full_precision=fp))
    if recompute:
        specs.append(CacheSpec("recompute", "recompute", None, window, policy="recompute"))
    return specs


def token_stream(tokenizer, documents: Sequence[str], n_tokens: int, *, corpus_name: str = "corpus") -> Tensor:
    """The first ``n_tokens`` ids of the documents in order, joined by a blank line.

    The tokenizer's own leading special tokens (a BOS where it adds one) start the stream; empty
    documents add nothing.

    Returns:
        (n_tokens,) int64.

    Raises:
        InputError: the corpus has fewer tokens than ``n_tokens`` (says how many it has).
    """
    from sinklab.probe.cache import tokenize_documents
    from sinklab.probe.inputs import bos_tokens, tokenize_plain

    prefix, _ = bos_tokens(tokenizer, "auto")
    sep = list(tokenize_plain(tokenizer, "\n\n"))
    parts: list[np.ndarray] = [np.asarray(prefix, dtype=np.int64)]
    total = len(prefix)
    for i, doc in enumerate(tokenize_documents(tokenizer, list(documents))):
        if len(doc) == 0:
            continue
        if total > len(prefix):
            parts.append(np.asarray(sep, dtype=np.int64))
            total += len(sep)
        parts.append(np.asarray(doc, dtype=np.int64))
        total += len(doc)
        if total >= n_tokens:
            break
    if total < n_tokens:
        raise InputError(f"corpus {corpus_name} has {total} tokens in all, fewer than {param('tokens', n_tokens)}")
    return torch.from_numpy(np.concatenate(parts)[:n_tokens].copy())


def _cache_nbytes(cache) -> int:
    if isinstance(cache, SinkCache):
        return cache.nbytes
    return sum(layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
               for layer in cache.layers if getattr(layer, "keys", None) is not None and layer.keys.numel())


def _chunked(values: dict[int, float], n_positions: int, chunk: int, reduce) -> list:
    out = []
    for c in range(math.ceil(n_positions / chunk)):
        xs = [v for p, v in values.items() if c * chunk <= p < (c + 1) * chunk]
        out.append(reduce(xs) if xs else None)
    return out


def _result(spec: CacheSpec, scores: "Scores", n: int, chunk: int, latency_s: float, nbytes: int,
            matched: Sequence[int], *, state_bytes: int = 0, mode: str | None = None,
            attn: str | None = None) -> StreamConfigResult:
    nll = scores.nll
    mean = float(np.mean(list(nll.values())))
    mean_or_none = lambda xs: float(np.mean(xs))  # noqa: E731  (float64 means)
    agreed = bool(scores.kl)
    by_chunk_nll = _chunked(nll, n, chunk, lambda xs: float(np.mean(xs)))
    # every one of recompute's positions, or none: a subset would not be comparable with recompute's ppl
    common = [nll[t] for t in matched] if all(t in nll for t in matched) else []
    on_reference = [nll[t] for t in scores.kl if t in nll]  # the positions with a full-cache reference
    return StreamConfigResult(
        name=spec.name, n_sink=spec.n_sink, window=spec.window, ppl=math.exp(mean),
        ppl_by_chunk=[None if x is None else math.exp(x) for x in by_chunk_nll],
        latency_ms_per_token=None if latency_s is None else 1000.0 * latency_s, cache_bytes=int(nbytes),
        evaluated=len(nll), positions=[min(nll), max(nll)],
        ppl_matched=math.exp(float(np.mean(common))) if common else None, nll_by_chunk=by_chunk_nll,
        count_by_chunk=[c or 0 for c in _chunked(nll, n, chunk, len)],
        policy=spec.policy, budget=spec.budget, kv_bits=spec.kv_bits, kv_group=spec.kv_group,
        key_quant=spec.key_quant, sinks_full_precision=spec.sinks_full_precision, state_bytes=int(state_bytes),
        mode=mode, attn_implementation=attn,
        kl=mean_or_none(list(scores.kl.values())) if agreed else None,
        top1=mean_or_none(list(scores.agree.values())) if agreed else None,
        kl_by_chunk=_chunked(scores.kl, n, chunk, mean_or_none) if agreed else [],
        top1_by_chunk=_chunked(scores.agree, n, chunk, mean_or_none) if agreed else [],
        agreement_positions=len(scores.kl),
        ppl_agreement=math.exp(float(np.mean(on_reference))) if agreed and on_reference else None)


def _new_cache(model, spec: CacheSpec, max_context: int | None):
    """The cache of ``spec``: transformers' DynamicCache for ``full`` (for a sinklab model: a SinkCache
    that never evicts within its context), else :class:`SinkCache`."""
    if spec.kind != "full":
        if spec.policy is None:
            return SinkCache(model, spec.n_sink, spec.window)
        return SinkCache(model, **spec.cache_kwargs())
    adapter = adapt(model)
    cache = adapter.dynamic_cache()  # None: the model decodes only through sinklab's cache
    return cache if cache is not None else SinkCache(model, 0, max_context or adapter.max_context)


def _step(model, ids: Tensor, cache, start: int, *, last_only: bool = False) -> Tensor:
    """Feed ``ids`` (1, q) at positions ``start ..`` through ``cache``; logits (q or 1, V)."""
    return step_batch(model, ids, cache, start, last_only=last_only)[0]


def step_batch(model, ids: Tensor, cache, start: int, *, last_only: bool = False) -> Tensor:
    """Feed ``ids`` (B, q), B streams of equal length, at positions ``start ..`` (0-based) through
    ``cache``; logits (B, q or 1, V) (:meth:`sinklab.capture.adapter.ModelAdapter.step`: sinklab models
    take cache positions from the cache itself). The call sizes are the caller's choice: a SinkCache does not
    warn about a call above its budget (:func:`~sinklab.streaming.cache.long_calls_expected`)."""
    with long_calls_expected():
        return adapt(model).step(ids, cache, start, last_only=last_only)


def _next_token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """(n, V) logits, (n,) targets -> (n,) float64 NLL in nats."""
    logits = logits.float()
    return (torch.logsumexp(logits, -1) - logits.gather(-1, targets[:, None])[:, 0]).double()


#: elements (rows x vocabulary) scored at once by :func:`_score_rows`: KL keeps several float64 copies of its rows;
#: at Gemma-3's 262,144-token vocabulary 1024 rows at once took 10.0 GiB above the inputs, in these blocks 0.59 GiB
#: (benchmarks/results/stream_score_memory.json)
SCORE_BLOCK_ELEMS = 1 << 22


def _score_rows(logits: Tensor, targets: Tensor, ref: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Scores of q next-token predictions against their targets and the full cache's logits, in blocks of
    rows of at most :data:`SCORE_BLOCK_ELEMS` elements (every score is per row: the blocks change no value).

    Args:
        logits: (q, V) logits as the model gave them. targets: (q,) int64 next tokens.
        ref: (k, V) full-cache logits of the first k <= q rows, on any device; None: k = 0.

    Returns:
        (q,) float64 NLL (nats), KL(p_full || p_this) (nats) and top-1 agreement (1.0 / 0.0), NaN in the
        last two after row k; on the logits' device, nothing read back to the host.
    """
    step = max(1, SCORE_BLOCK_ELEMS // max(1, logits.shape[-1]))
    if logits.shape[0] > step:
        parts = [_score_block(logits[a:a + step], targets[a:a + step], None if ref is None else ref[a:a + step])
                 for a in range(0, logits.shape[0], step)]
        return tuple(torch.cat(p) for p in zip(*parts))  # type: ignore[return-value]
    return _score_block(logits, targets, ref)


def _score_block(logits: Tensor, targets: Tensor, ref: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_score_rows` on one block of rows."""
    from sinklab.metrics.agreement import kl_to_full, top1_agreement

    nll = _next_token_nll(logits, targets)
    kl = torch.full_like(nll, float("nan"))
    agree = torch.full_like(nll, float("nan"))
    if ref is not None and ref.shape[0]:
        k = ref.shape[0]
        ref = ref.to(logits.device)
        kl[:k] = kl_to_full(ref, logits[:k])
        agree[:k] = top1_agreement(ref, logits[:k]).double()
    return nll, kl, agree


class Scores:
    """The per-position scores of one configuration on one stream: the NLL of the next token and, against
    the full cache's logits ``ref``, KL(p_full || p_this) and top-1 agreement
    (:func:`sinklab.metrics.kl_to_full`, :func:`sinklab.metrics.top1_agreement`: float64 reductions of the
    logits as the model gave them, float32 for a float32 model).

    Args:
        ref: (m, V) logits of the full cache at positions 0 .. m-1 (0-based; position t predicts token
            t + 1), on any device; None: no agreement. Positions >= m (past the full cache's context) get
            an NLL only.

    Attributes:
        nll, kl, agree: {position t: value} (nats, nats, 1.0 / 0.0).
    """

    def __init__(self, ref: Tensor | None = None) -> None:
        self.ref = ref
        self.nll: dict[int, float] = {}
        self.kl: dict[int, float] = {}
        self.agree: dict[int, float] = {}

    def score(self, positions: Sequence[int], logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Score ``logits`` (q, V) of the stream positions ``positions`` (q increasing 0-based ints) against
        ``targets`` (q,) without reading them back to the host: (q,) float64 NLL, KL and agreement (NaN at
        positions without a reference), on the logits' device (:func:`_score_rows`); :meth:`add` stores them."""
        m = 0 if self.ref is None else self.ref.shape[0]
        k = sum(1 for p in positions if p < m)  # positions increase: the first k have a reference
        ref = self.ref[torch.as_tensor(list(positions[:k]), device=self.ref.device)] if k else None
        return _score_rows(logits, targets, ref)

    def add(self, positions: Sequence[int], nll: Tensor, kl: Tensor, agree: Tensor) -> None:
        """Store the scores of :meth:`score` (one host read)."""
        for t, a, b, c in zip(positions, nll.tolist(), kl.tolist(), agree.tolist()):
            self.nll[t] = a
            if not math.isnan(b):
                self.kl[t], self.agree[t] = b, c

    def add_logits(self, positions: Sequence[int], logits: Tensor, targets: Tensor) -> None:
        """:meth:`score` then :meth:`add`."""
        self.add(positions, *self.score(positions, logits, targets))


def _row_scores(ref: Tensor | None, rows: int) -> list[Scores]:
    """One fresh :class:`Scores` per stream of a batch, row b against ``ref[b]`` ((B, m, V) or None)."""
    return [Scores(None if ref is None else ref[b]) for b in range(rows)]


@torch.no_grad()
def stream_nll(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None, block: int = 256,
               scores: "Scores | None" = None, keep: list | None = None) -> dict[int, float]:
    """NLL of every next token under ``spec`` (full or sink), from one parallel forward.

    Uses :func:`sinklab.streaming.parallel.sink_window_mode` (exactly the token-by-token cache's
    attention, checked by the tests); the full cache is plain causal attention over the first
    ``max_context`` tokens. The vocabulary projection runs ``block`` positions at a time.

    Args:
        ids: (N,) int64 stream.
        scores: filled with the NLLs and, where it holds a reference, the agreement with the full cache
            (:class:`Scores`); None: a fresh one without a reference.
        keep: the (q, V) logits blocks are appended to it (positions 0 .. in order), as the model gave them.

    Returns:
        {position t: NLL of token t + 1}, t 0-based.
    """
    scores = Scores() if scores is None else scores
    rows: list | None = [] if keep is not None else None
    _stream_nll_rows(model, ids.view(1, -1), spec, max_context=max_context, block=block, scores=[scores], keep=rows)
    if keep is not None:
        keep.extend(k[0] for k in rows)
    return scores.nll


def logits_from_hidden(model, hidden: Tensor) -> Tensor:
    """A ``transformers`` causal LM's logits (..., V) from its last hidden states (..., d), as its own
    forward computes them: the output embedding, then Granite's division by ``logits_scaling`` and
    Gemma 2 / 3's final soft-capping where the config has them."""
    cfg = model.config.get_text_config(decoder=True)
    logits = model.get_output_embeddings()(hidden)
    scaling = getattr(cfg, "logits_scaling", None)
    if scaling not in (None, 1, 1.0):
        logits = logits / scaling
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def _check_logits_from_hidden(model, x: Tensor, n: int = 8) -> None:
    """Refuse a model whose own logits are not :func:`logits_from_hidden` of its last hidden states (checked
    on the first ``n`` tokens of ``x`` (B, T)): the parallel scorer would give other numbers.

    Raises:
        InputError: the two differ by more than 1e-3 of the logits' scale (names ``--mode decode``).
    """
    ids = x[:1, : max(2, min(n, x.shape[1]))]
    own = model(input_ids=ids, use_cache=False).logits.float()
    hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
    ours = logits_from_hidden(model, hidden).float()
    gap = float((own - ours).abs().max())
    if gap > 1e-3 * (1.0 + float(own.abs().max())):
        raise InputError(f"{type(model).__name__} computes its logits from the last hidden state in a way the "
                         f"parallel scorer does not reproduce (they differ by {gap:.3g}): use {param('mode', 'decode')}")


@torch.no_grad()
def _stream_nll_rows(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None, block: int = 256,
                     scores: list[Scores], keep: list | None = None) -> None:
    """:func:`stream_nll` of B streams of equal length in one forward: ``ids`` (B, N) int64, ``scores`` one
    :class:`Scores` per row (filled), ``keep`` gets the (B, q, V) logits blocks (positions 0 .. in order)."""
    from sinklab.streaming.parallel import sink_window_mode

    n = ids.shape[1] if spec.kind != "full" or max_context is None else min(ids.shape[1], max_context)
    x = ids[:, :n].to(input_device(model))
    window = None if spec.kind == "full" else spec.window
    with sink_window_mode(model, spec.n_sink or 0, window, block=block):
        hidden = model.base_model(input_ids=x, position_ids=torch.arange(n, device=x.device)[None],
                                  use_cache=False).last_hidden_state  # (B, n, d)
    _check_logits_from_hidden(model, x)
    for a in range(0, n - 1, block):
        b = min(n - 1, a + block)
        logits = logits_from_hidden(model, hidden[:, a:b])  # (B, q, V)
        if keep is not None:
            keep.append(logits)
        for r, sc in enumerate(scores):
            sc.add_logits(range(a, b), logits[r], x[r, a + 1 : b + 1])


@torch.no_grad()
def stream_nll_decode(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None,
                      progress: bool = True) -> dict[int, float]:
    """The same NLLs fed one token at a time through the real cache (``--mode decode``): sink caches
    get cache positions (0 .. kept), the full cache absolute ones up to ``max_context``."""
    return decode_stream(model, ids, spec, max_context=max_context, progress=progress)[0]


@contextmanager
def attention_for(model, spec: CacheSpec):
    """Within the block ``model`` runs the attention ``spec``'s cache needs: eager for an
    attention-based policy or lossless detected sinks on a ``transformers`` model (the weights come
    from it), else as loaded.
    Yields the implementation's name (None for a sinklab model)."""
    scored = spec.needs_weights
    with adapt(model).attention("eager" if scored else None) as name:
        yield name


@torch.no_grad()
def decode_stream(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None, latency_steps: int = 0,
                  progress: bool = True, scores: "Scores | None" = None,
                  keep: list | None = None) -> tuple[dict[int, float], float, int, int, str | None]:
    """Feed ``ids`` (N,) one token at a time through ``spec``'s real cache (positions as
    :func:`stream_nll_decode`); the last ``latency_steps`` steps are timed. ``scores`` and ``keep`` as
    :func:`stream_nll` (``keep`` gets one (1, V) block per position).

    Returns:
        ({position t: NLL of token t + 1}, ms per timed step (nan without timing), cache bytes and
        state bytes at the end, the attention implementation used).
    """
    scores = Scores() if scores is None else scores
    rows: list | None = [] if keep is not None else None
    ms, nbytes, state, attn = _decode_rows(model, ids.view(1, -1), spec, max_context=max_context,
                                           latency_steps=latency_steps, progress=progress, scores=[scores], keep=rows)
    if keep is not None:
        keep.extend(k[0] for k in rows)
    return scores.nll, ms, nbytes, state, attn


@torch.no_grad()
def _decode_rows(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None, latency_steps: int = 0,
                 progress: bool = True, scores: list[Scores],
                 keep: list | None = None) -> tuple[float, int, int, str | None]:
    """:func:`decode_stream` of B streams of equal length, ``ids`` (B, N), as the rows of one cache (the
    rows need no mask; a policy that scores keeps each row's own tokens); ``scores`` one :class:`Scores`
    per row (filled), ``keep`` gets one (B, 1, V) block per position.

    Returns:
        (ms per timed step of the B rows (nan without timing), the cache's bytes and state bytes at the
        end (all B rows), the attention implementation used).
    """
    B, N = ids.shape
    n = N if spec.kind != "full" or max_context is None else min(N, max_context)
    x = ids.to(_device(model))
    nll = torch.empty(3, max(n - 1, 0), B, dtype=torch.float64, device=x.device)  # on the device: no sync per token
    # each token is scored for all rows in one call, against the rows' full-cache logits at that position
    # (gathered per token: stacking the (m, V) references whole would copy them)
    refs = None if any(sc.ref is None for sc in scores) else [sc.ref for sc in scores]
    m = 0 if refs is None else min(r.shape[0] for r in refs)
    timed = min(latency_steps, n - 1)
    elapsed = 0.0
    with attention_for(model, spec) as attn:
        cache = _new_cache(model, spec, max_context)
        for t in show_progress(range(n - 1), desc=spec.name, unit="token", enabled=progress):
            pos = t if spec.kind == "full" else cache.kept_length()
            clock = t >= n - 1 - timed
            if clock:
                _sync(x.device)
            t0 = time.perf_counter()
            logits = step_batch(model, x[:, t : t + 1], cache, pos)[:, 0]  # (B, V)
            if clock:
                _sync(x.device)  # CUDA runs asynchronously: the step's time is its kernels' time
                elapsed += time.perf_counter() - t0
            if keep is not None:
                keep.append(logits[:, None])
            ref_t = torch.stack([r[t] for r in refs]) if t < m else None  # (B, V)
            nll[:, t] = torch.stack(_score_rows(logits, x[:, t + 1], ref_t))
    for r, sc in enumerate(scores):
        sc.add(range(n - 1), *nll[:, :, r])
    ms = 1000.0 * elapsed / timed if timed else float("nan")
    state = cache.state_nbytes if isinstance(cache, SinkCache) else 0
    return ms, _cache_nbytes(cache), state, attn


@torch.no_grad()
def decode_stacked(model, ids: Tensor, specs: Sequence[CacheSpec], *, progress: bool = True,
                   scores: "dict[str, Scores] | None" = None) -> dict[str, tuple[dict[int, float], int, int]]:
    """Feed ``ids`` (N,) token by token through the caches of ``specs`` at once, one configuration per row
    of the batch (:class:`~sinklab.streaming.cache.StackedCache`; cache positions): the NLLs each
    configuration's cache gives alone, for the cost of one batched decode.

    Args:
        specs: ``sink`` configurations of one budget (and pyramidkv only with pyramidkv).
        scores: {name: :class:`Scores`} filled for each configuration (all with the same reference or none);
            None: fresh ones without a reference.

    Returns:
        {name: ({position t: NLL of token t + 1}, cache bytes, state bytes at the end)}.
    """
    scores = {s.name: Scores() for s in specs} if scores is None else scores
    ref = scores[specs[0].name].ref  # every row is scored against the same reference
    got = _decode_stacked_rows(model, ids.view(1, -1), specs, progress=progress,
                               scores={s.name: [scores[s.name]] for s in specs}, ref=None if ref is None else ref[None])
    return {s.name: (scores[s.name].nll, *got[s.name]) for s in specs}


@torch.no_grad()
def _decode_stacked_rows(model, ids: Tensor, specs: Sequence[CacheSpec], *, progress: bool,
                         scores: dict[str, list[Scores]], ref: Tensor | None) -> dict[str, tuple[int, int]]:
    """:func:`decode_stacked` of B streams of equal length, ``ids`` (B, N): R configurations x B streams as
    the R B rows of one batch (row r B + b: stream b under ``specs[r]``). Each configuration's stream 0 has
    a one-row cache of its own (so its bytes are those of the stream alone), its streams 1 .. B-1 one cache
    of B - 1 rows (each row keeps its own tokens).

    Args:
        scores: {name: one :class:`Scores` per stream} (filled). ref: (B, m, V) full-cache logits of the
            streams' positions 0 .. m-1, or None (no agreement).

    Returns:
        {name: (cache bytes, state bytes) of stream 0's cache at the end}.
    """
    from sinklab.streaming.cache import StackedCache

    B, n = ids.shape
    R = len(specs)
    x = ids.to(_device(model)).repeat(R, 1)  # (R B, n), configuration-major
    scored = next((s for s in specs if s.needs_weights), specs[0])
    m = 0 if ref is None else ref.shape[1]
    with attention_for(model, scored):
        caches, rows = [], []
        for s in specs:
            caches.append(_new_cache(model, s, None))
            rows.append(1)
            if B > 1:
                caches.append(_new_cache(model, s, None))
                rows.append(B - 1)
        cache = StackedCache(caches, rows)
        desc = f"{R} caches @{specs[0].budget}" + (f" x {B} streams" if B > 1 else "")
        nll = torch.empty(3, max(n - 1, 0), R * B, dtype=torch.float64, device=x.device)  # no sync per token
        for t in show_progress(range(n - 1), desc=desc, unit="token", enabled=progress):
            logits = step_batch(model, x[:, t : t + 1], cache, cache.kept_length())[:, 0]  # (R B, V)
            nll[:, t] = torch.stack(_score_rows(logits, x[:, t + 1], ref[:, t].repeat(R, 1) if t < m else None))
        for r, s in enumerate(specs):
            for b in range(B):
                scores[s.name][b].add(range(n - 1), *nll[:, :, r * B + b])
    firsts = caches[::2] if B > 1 else caches
    return {s.name: (c.nbytes, c.state_nbytes) for s, c in zip(specs, firsts)}


def _device(model) -> torch.device:
    return input_device(model)


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously: a timer read without this
    measures the launches, not the work); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def decode_latency(model, ids: Tensor, spec: CacheSpec, *, at: int, steps: int = 32,
                   prefill_chunk: int = 512, state: bool = False) -> tuple[float, int] | tuple[float, int, int]:
    """Wall time of one decode step ``at`` tokens into the stream, and the cache's bytes there.

    The cache is filled with ``ids[:at]`` in chunks of ``prefill_chunk`` tokens (a sink cache: at most the
    model's trained context minus the budget, so that no prefill call goes past that context), then ``steps``
    single-token steps are timed (mean, ms). ``full`` uses transformers' ``DynamicCache``; a
    sink spec :class:`SinkCache` with cache positions.

    Returns:
        (ms per token, cache bytes after the timed steps), and the cache's state bytes with ``state=True``.
    """
    if at + steps > ids.numel():
        raise InputError(f"latency at {at} tokens with {steps} steps needs {at + steps} tokens, the stream has {ids.numel()}")
    cache = _new_cache(model, spec, None if spec.kind != "full" else ids.numel())
    x = ids.view(1, -1).to(_device(model))
    memo = getattr(cache, "_memo", None)  # a SinkCache: its budget and the model's trained context
    if memo is not None and memo.context is not None and memo.budget is not None and memo.budget < memo.context:
        # chunks that keep the cache positions (kept + new) inside the trained context: the call sizes are
        # sinklab's choice here, so they should not take the model past it (and warn about it)
        prefill_chunk = max(1, min(prefill_chunk, memo.context - memo.budget))

    def start(t: int) -> int:
        return t if spec.kind == "full" else cache.kept_length()

    for a in range(0, at, prefill_chunk):
        b = min(at, a + prefill_chunk)
        _step(model, x[:, a:b], cache, start(a), last_only=True)
    _sync(x.device)
    t0 = time.perf_counter()
    for t in range(at, at + steps):
        _step(model, x[:, t : t + 1], cache, start(t))
    _sync(x.device)
    ms = 1000.0 * (time.perf_counter() - t0) / steps
    if state:
        return ms, _cache_nbytes(cache), cache.state_nbytes if isinstance(cache, SinkCache) else 0
    return ms, _cache_nbytes(cache)


@torch.no_grad()
def run_recompute(model, ids: Tensor, spec: CacheSpec, *, chunk: int, every: int,
                  progress: bool = True, ref: Tensor | None = None) -> StreamConfigResult:
    """Sliding window with recomputation on the stream ``ids`` (N,): for t = 0, every, 2 every, ... a fresh
    forward over ``ids[max(0, t - window) : t + 1]`` (positions from 0) scores token t + 1; latency is the
    mean time of one such forward; ``ref``: the full cache's logits for the agreement (:class:`Scores`)."""
    return _recompute_rows(model, ids.view(1, -1), spec, chunk=chunk, every=every, progress=progress,
                           ref=None if ref is None else ref[None], latency_steps=0)[0]


@torch.no_grad()
def _recompute_rows(model, ids: Tensor, spec: CacheSpec, *, chunk: int, every: int, progress: bool,
                    ref: Tensor | None, latency_steps: int) -> list[StreamConfigResult]:
    """:func:`run_recompute` of B streams of equal length, ``ids`` (B, N): each forward takes the B rows'
    windows at once; ``ref`` (B, m, V) or None. One stream (B = 1): every forward timed, as
    :func:`run_recompute`. Several: stream 0's latency and bytes from its own forwards at the last
    ``latency_steps`` scored positions, timed alone (0: not timed, None and 0); the other streams None and 0.

    Returns:
        One result per stream, in row order.
    """
    B, n = ids.shape
    w = spec.window
    x = ids.to(_device(model))
    scores = _row_scores(ref, B)
    todo = list(range(0, n - 1, every))

    def forward(rows: Tensor, t: int) -> tuple[Tensor, float, int]:
        ctx = rows[:, max(0, t - w) : t + 1]
        cache = _new_cache(model, CacheSpec("full", "full", None, None), ctx.shape[1])
        _sync(x.device)
        t0 = time.perf_counter()
        logits = step_batch(model, ctx, cache, 0, last_only=True)[:, -1]  # (rows, V)
        _sync(x.device)
        return logits, time.perf_counter() - t0, _cache_nbytes(cache)

    elapsed, nbytes = 0.0, 0
    for t in show_progress(todo, desc=spec.name, unit="position", enabled=progress):
        logits, s, nbytes = forward(x, t)
        elapsed += s
        for b, sc in enumerate(scores):
            sc.add_logits([t], logits[b : b + 1], x[b, t + 1 : t + 2])
    latency: float | None = elapsed / max(len(todo), 1)
    if B > 1:  # the batch's forwards time B rows: stream 0 is timed alone
        timed = todo[len(todo) - min(latency_steps, len(todo)):] if latency_steps else []
        runs = [forward(x[:1], t)[1:] for t in timed]
        latency = sum(s for s, _ in runs) / len(runs) if runs else None
        nbytes = runs[-1][1] if runs else 0
    return [_result(spec, sc, n, chunk, latency if b == 0 else None, nbytes if b == 0 else 0, todo)
            for b, sc in enumerate(scores)]


def _stacked_result(model, ids: Tensor, spec: CacheSpec, scores: "Scores", nbytes: int, state: int, *, chunk: int,
                    recompute_every: int, latency_steps: int) -> StreamConfigResult:
    """The result of one configuration on the stream ``ids`` (N,) decoded in a stacked batch
    (:func:`decode_stacked`): its latency is timed alone over the last ``latency_steps`` decode steps of
    the stream (0: None)."""
    n = ids.numel()
    steps = max(1, min(latency_steps, n - 1))
    with attention_for(model, spec) as attn:
        ms = decode_latency(model, ids, spec, at=n - steps, steps=steps)[0] if latency_steps else None
    return _result(spec, scores, n, chunk, None if ms is None else ms / 1000.0, nbytes, range(0, n - 1, recompute_every),
                   state_bytes=state, mode="decode", attn=attn)


FULL = CacheSpec("full", "full", None, None, policy="full")


def _run_cache(model, ids: Tensor, spec: CacheSpec, *, chunk: int, recompute_every: int, max_context: int | None,
               mode: str, latency_steps: int, progress: bool, ref: Tensor | None,
               keep: list | None = None) -> list[StreamConfigResult]:
    """One full / sink configuration alone on B streams of equal length, ``ids`` (B, N): their NLLs
    (parallel or decoded, the B rows at once), agreement with ``ref`` ((B, m, V) or None) and stream 0's
    latency and bytes (``latency_steps`` 0: None and 0; the other streams always None and 0). ``keep``
    gets the full cache's (B, q, V) logits blocks. A configuration decoded token by token with its own
    latency (other policies, quantised caches, outside :func:`decode_stacked`) takes one stream only.

    Returns:
        One result per stream, in row order.

    Raises:
        InputError: ``n_sink + window`` above ``max_context``; several streams for a configuration that
            takes one.
    """
    B, n = ids.shape
    if spec.kind == "sink" and max_context is not None and spec.n_sink + spec.window > max_context:
        raise InputError(f"n_sink + window = {spec.n_sink + spec.window} exceeds the model's context of "
                         f"{max_context} tokens")
    matched = range(0, n - 1, recompute_every)
    scores = _row_scores(ref, B)
    if spec.parallel_ok or spec.policy is None:
        if mode == "parallel" and adapt(model).parallel_stream:  # sinklab models: token by token (small, fast)
            _stream_nll_rows(model, ids, spec, max_context=max_context, scores=scores, keep=keep)
            how = "parallel"
        else:
            _decode_rows(model, ids, spec, max_context=max_context, progress=progress, scores=scores, keep=keep)
            how = "decode"
        last = n if spec.kind != "full" or max_context is None else min(n, max_context)
        steps = max(1, min(latency_steps, last - 1))
        if latency_steps:
            ms, nbytes, state = decode_latency(model, ids[0, :last], spec, at=last - steps, steps=steps, state=True)
        else:  # not timed: no latency, and the cache's bytes are not measured either
            ms, nbytes, state = None, 0, 0
        attn = adapt(model).attn_implementation
        return [_result(spec, sc, n, chunk, None if ms is None or b else ms / 1000.0, 0 if b else nbytes, matched,
                        state_bytes=0 if b else state, mode=how, attn=attn) for b, sc in enumerate(scores)]
    if B > 1:
        raise InputError(f"configuration {spec.name} is decoded one stream at a time here (decode_stacked batches it)")
    # other policies, quantised caches: token by token, the last steps timed
    ms, nbytes, state, attn = _decode_rows(model, ids, spec, max_context=max_context, latency_steps=latency_steps,
                                           progress=progress, scores=scores)
    return [_result(spec, scores[0], n, chunk, None if math.isnan(ms) else ms / 1000.0, nbytes, matched,
                    state_bytes=state, mode="decode", attn=attn)]


@torch.no_grad()
def full_logits(model, ids: Tensor, *, max_context: int | None, mode: str = "parallel",
                progress: bool = False) -> Tensor:
    """The full cache's next-token logits of a stream, the reference of the agreement (:class:`Scores`).

    Args:
        ids: (N,) int64 stream, or (B, N) streams of equal length. max_context: the full cache stops
            there. mode: as :func:`evaluate_stream`.

    Returns:
        (m - 1, V) logits as the model gives them ((B, m - 1, V) for (B, N) ids), row t (0-based)
        predicting token t + 1, with m = min(N, max_context); on the model's device.
    """
    x = ids.view(1, -1) if ids.dim() == 1 else ids
    keep: list[Tensor] = []
    scores = _row_scores(None, x.shape[0])
    if mode == "parallel" and adapt(model).parallel_stream:
        _stream_nll_rows(model, x, FULL, max_context=max_context, scores=scores, keep=keep)
    else:
        _decode_rows(model, x, FULL, max_context=max_context, progress=progress, scores=scores, keep=keep)
    ref = torch.cat(keep, dim=1)
    return ref[0] if ids.dim() == 1 else ref


def _stack_key(spec: CacheSpec) -> tuple[int | None, bool]:
    """Configurations with the same key stack in one :class:`~sinklab.streaming.cache.StackedCache`: the same
    budget, and pyramidkv (per-layer budgets) only with pyramidkv."""
    from sinklab.streaming.policies import POLICIES

    return spec.budget, getattr(POLICIES.get(spec.policy), "layer_budgets", None) is not None


def evaluate_stream(model, ids: Tensor, specs: Sequence[CacheSpec], *, chunk: int, recompute_every: int = 1,
                    max_context: int | None = None, mode: str = "parallel", latency_steps: int = 32,
                    progress: bool = True, done: dict | None = None, on_result=None,
                    stack: int = 32, agreement: bool = True) -> list[StreamConfigResult]:
    """Evaluate every configuration of ``specs`` on the stream ``ids``.

    Args:
        model: a ``transformers`` RoPE causal LM in eval mode.
        ids: (N,) int64 token stream, N >= 2.
        specs: from :func:`cache_specs`.
        chunk: stream positions per ``ppl_by_chunk`` entry.
        recompute_every: score every k-th position under ``recompute``.
        max_context: the model's context (the full cache stops there; sink windows must fit in it).
        mode: ``parallel`` (one forward per configuration, :func:`stream_nll`) or ``decode`` (token
            by token through the real cache, :func:`stream_nll_decode`); the same numbers. Models
            trained with ``sinklab train`` are always decoded token by token.
        latency_steps: decode steps timed at the end of the stream (:func:`decode_latency`); 0: no timing
            (``latency_ms_per_token`` None; ``cache_bytes`` and ``state_bytes`` 0 for the configurations whose
            bytes the timing measures: full, window and sinks at 16 bits).
        done: results already computed, by name (a resumed run); they are kept as they are.
        on_result: called with each new result (to save it at once).
        stack: the configurations decoded token by token at 16 bits (the policies beyond full, window and
            sinks) run up to ``stack`` at a time as the rows of one batch, one batch per budget (pyramidkv in
            its own) (:func:`decode_stacked`), a quantised cache alone (:func:`evaluate_streams`); their
            latency is then timed for each alone at the end of the stream (:func:`decode_latency`). 0: one at
            a time, latency from their own last steps.
        agreement: also score every configuration against the full cache (``kl``, ``top1``: the full
            cache's logits are computed once per stream, by the ``full`` configuration when it is in
            ``specs``, else by :func:`full_logits`, kept on the model's device as (min(N, max_context) - 1, V)).

    Raises:
        InputError: N < 2, ``n_sink + window`` above ``max_context``, an unknown mode.
    """
    if ids.dim() != 1 or ids.numel() < 2:
        raise InputError(f"the stream needs at least 2 tokens, got shape {tuple(ids.shape)}")
    return evaluate_streams(model, ids[None], specs, chunk=chunk, recompute_every=recompute_every,
                            max_context=max_context, mode=mode, latency_steps=latency_steps, progress=progress,
                            done=[done or {}], on_result=None if on_result is None else (lambda row, res: on_result(res)),
                            stack=stack, agreement=agreement)[0]


def evaluate_streams(model, ids: Tensor, specs: Sequence[CacheSpec], *, chunk: int, recompute_every: int = 1,
                     max_context: int | None = None, mode: str = "parallel", latency_steps: int = 32,
                     progress: bool = True, done: Sequence[dict] | None = None, on_result=None,
                     stack: int = 32, agreement: bool = True) -> list[list[StreamConfigResult]]:
    """Evaluate every configuration of ``specs`` on B streams of equal length at once, each configuration
    once over the batch: the numbers of :func:`evaluate_stream` on each stream alone (to float rounding:
    the batched matrix products sum in another order; tests check 1e-5 in NLL and KL; a quantised cache's
    exactly, as it is decoded alone).

    How each configuration batches: full, window and sinks at 16 bits run one parallel forward over the
    B streams (or, with ``mode="decode"``, one cache of B rows token by token); the configurations decoded
    token by token (every other policy at 16 bits) run in :func:`decode_stacked` as configuration x
    stream rows, each configuration's stream 0 in a one-row cache of its own and its other streams in one
    cache of B - 1 rows, whose rows keep their own tokens: the scoring policies (h2o, tova, sinks+h2o,
    sinks+tova, detected-sinks, and snapkv, pyramidkv, knorm, which score calls of more than one token)
    select per row from that row's attention weights or keys; recompute runs each window forward over the B
    streams. A quantised cache (``kv_bits`` < 16) decodes each stream alone, one configuration at a time:
    a code near a rounding boundary flips with the float rounding of a batch's layout, and the flip runs
    through the later layers, so batched its numbers would depend on the other rows far beyond float
    rounding; alone they are exactly :func:`evaluate_stream`'s on that stream with that configuration only.

    Args:
        ids: (B, N) int64, B >= 1 streams of N >= 2 tokens (no padding).
        done: per stream (row order), results already computed, by name; a configuration done for every
            stream is not run, one done for some is run for the batch and the done results kept.
        on_result: called as ``on_result(row, result)`` with each new result (0-based row).
        latency_steps: stream 0 (row 0) is timed as :func:`evaluate_stream` times its stream (B > 1: every
            configuration's latency timed alone on stream 0: :func:`decode_latency`, or recompute's own
            forwards over its last ``latency_steps`` scored positions); the other streams are not timed:
            ``latency_ms_per_token`` None, ``cache_bytes`` and ``state_bytes`` 0.
        stack: as :func:`evaluate_stream` (B > 1: at least 1, the token-by-token configurations are always
            stacked).
        (the others as :func:`evaluate_stream`; the reference of the agreement is (B, m - 1, V) here)

    Returns:
        Per stream (row order) the results in the order of ``specs``.

    Raises:
        InputError: ``ids`` not (B, N) with N >= 2, ``chunk`` or ``recompute_every`` below 1, ``done`` of another
            length, B > 1 on a model trained
            with ``sinklab train`` (decoded token by token, one stream at a time), and as
            :func:`evaluate_stream`.
    """
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 2:
        raise InputError(f"the streams need shape (B, N) with N >= 2 tokens, got {tuple(ids.shape)}")
    if chunk < 1 or recompute_every < 1:
        raise InputError(f"chunk and recompute_every must be >= 1, got {chunk} and {recompute_every}")
    if mode not in ("parallel", "decode"):
        raise InputError(f"unknown mode {mode!r}: parallel | decode")
    B, n = ids.shape
    parallel = adapt(model).parallel_stream
    if B > 1 and not parallel:
        raise InputError(f"{B} streams in one batch need a transformers model; this one is decoded one stream at a time")
    done = [dict(d) for d in done] if done is not None else [{} for _ in range(B)]
    if len(done) != B:
        raise InputError(f"done has {len(done)} entries for {B} streams")
    if B > 1:
        stack = max(stack, 1)
    kw = dict(chunk=chunk, recompute_every=recompute_every, max_context=max_context, mode=mode,
              latency_steps=latency_steps, progress=progress)
    new: list[dict[str, StreamConfigResult]] = [{} for _ in range(B)]

    def missing(spec: CacheSpec) -> bool:
        return any(spec.name not in d for d in done)

    def finished(results: Sequence[StreamConfigResult], first: int = 0) -> None:
        """Keep (and report) the results of streams ``first``, ``first + 1``, ..."""
        for b, res in enumerate(results, start=first):
            if res.name in done[b]:
                continue
            new[b][res.name] = res
            if on_result is not None:  # saved at once: a stopped run keeps every finished configuration
                on_result(b, res)

    ref = None  # (B, m - 1, V)
    if agreement and any(missing(s) for s in specs):
        full = next((s for s in specs if s.kind == "full"), None)
        if full is not None and missing(full):  # the full configuration computes the reference
            keep: list[Tensor] = []
            results = _run_cache(model, ids, full, ref=None, keep=keep, **kw)
            ref = torch.cat(keep, dim=1)
            m = ref.shape[1]
            for b, res in enumerate(results):
                scores = Scores(ref[b])  # the full cache against itself: KL 0, top-1 1 at every position
                scores.add_logits(range(m), ref[b], ids[b, 1 : m + 1].to(ref.device))
                a = _result(full, scores, n, chunk, 0.0, 0, range(0))
                res.kl, res.top1, res.kl_by_chunk, res.top1_by_chunk = a.kl, a.top1, a.kl_by_chunk, a.top1_by_chunk
                res.agreement_positions, res.ppl_agreement = a.agreement_positions, a.ppl_agreement
            finished(results)
        else:
            ref = full_logits(model, ids, max_context=max_context, mode=mode, progress=progress)

    def decode_rows(part: Sequence[CacheSpec], b0: int, b1: int) -> None:
        """The configurations ``part`` x the streams ``b0 .. b1 - 1`` as the rows of one stacked decode
        (:func:`_decode_stacked_rows`); stream 0 is timed and its bytes kept, the others' are not."""
        sub_ref = None if ref is None else ref[b0:b1]
        scores = {s.name: _row_scores(sub_ref, b1 - b0) for s in part}
        got = _decode_stacked_rows(model, ids[b0:b1], part, progress=progress, scores=scores, ref=sub_ref)
        for s in part:
            nbytes, state = got[s.name]
            finished([_stacked_result(model, ids[b], s, scores[s.name][b - b0], 0 if b else nbytes, 0 if b else state,
                                      chunk=chunk, recompute_every=recompute_every,
                                      latency_steps=0 if b else latency_steps) for b in range(b0, b1)], first=b0)

    if stack and parallel:  # the token-by-token configurations, one batched decode per budget
        todo = [s for s in specs if s.kind == "sink" and not s.parallel_ok and missing(s)]
        for key in dict.fromkeys(_stack_key(s) for s in todo):
            group = [s for s in todo if _stack_key(s) == key]
            budget = group[0].budget
            if max_context is not None and budget > max_context:
                raise InputError(f"n_sink + window = {budget} exceeds the model's context of {max_context} tokens")
            # a quantised store decodes each stream alone: a code near a rounding boundary flips with the float
            # rounding of the batch's layout (and with the attention kernel the batch's policies need), and the
            # flip runs through the later layers, so stacked it would depend on its batch by far more than float
            # rounding (an outside audit: ~1% in perplexity, SmolLM2 at 4 bits); alone it depends on nothing else
            stacked = [s for s in group if s.kv_bits == 16]
            for a in range(0, len(stacked), stack):
                decode_rows(stacked[a : a + stack], 0, B)
            for s in group:
                if s.kv_bits != 16:
                    for b in range(B):
                        decode_rows([s], b, b + 1)
    bar = show_progress(specs, desc="caches", unit="configuration", enabled=progress)
    for spec in bar:
        bar.set_postfix_str(spec.name)
        if missing(spec) and not all(spec.name in d or spec.name in m for d, m in zip(done, new)):
            if spec.kind == "recompute":
                if max_context is not None and spec.window + 1 > max_context:
                    raise InputError(f"window + 1 = {spec.window + 1} exceeds the model's context of {max_context} tokens")
                finished(_recompute_rows(model, ids, spec, chunk=chunk, every=recompute_every, progress=progress,
                                         ref=ref, latency_steps=latency_steps))
            else:
                finished(_run_cache(model, ids, spec, ref=ref, **kw))
    return [[d[s.name] if s.name in d else m[s.name] for s in specs] for d, m in zip(done, new)]


def run_stream(run_folder, n_tokens: int) -> Tensor:
    """The held-out stream of a ``sinklab train`` run: BOS, then its validation documents in order
    (as the data pipeline prepares them now), the first ``n_tokens`` ids.

    Raises:
        InputError: fewer validation tokens than ``n_tokens`` (says how many).
    """
    from sinklab.runs import Run

    run = Run.find(str(run_folder))
    if run is None:
        raise InputError(f"{param('corpus', 'run')} needs a sinklab train run folder as {param('model')}, got {run_folder}")
    return run.validation_stream(n_tokens)


def result_from_dict(d: dict) -> StreamConfigResult:
    """Inverse of ``dataclasses.asdict`` for a saved configuration."""
    return StreamConfigResult(**d)


def write_outputs(out: Path, meta: dict, results: Sequence[StreamConfigResult], chunk: int) -> None:
    """``stream.json`` (meta + ``configs``), ``stream.csv`` (one row per configuration: ppl, kl, top1, ...),
    ``stream_by_chunk.csv`` (tidy: config, chunk, start, end, ppl, positions scored, kl, top1) and
    ``stream_ppl.png`` (perplexity against stream position, one line per configuration)."""
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    payload = {**meta, "configs": [asdict(r) for r in results]}
    atomic_write_text(out / "stream.json", json.dumps(payload, indent=2) + "\n")
    ints = {"n_sink": "Int64", "window": "Int64", "budget": "Int64"}  # None (full, recompute) stays empty, not 0.0
    pd.DataFrame([{k: v for k, v in asdict(r).items() if not k.endswith("by_chunk") and k != "positions"}
                  for r in results]).astype(ints).to_csv(out / "stream.csv", index=False)
    rows = []
    for r in results:
        for c, p in enumerate(r.ppl_by_chunk):
            rows.append({"config": r.name, "n_sink": r.n_sink, "window": r.window, "policy": r.policy,
                         "budget": r.budget, "kv_bits": r.kv_bits, "key_quant": r.key_quant,
                         "sinks_full_precision": r.sinks_full_precision, "chunk": c,
                         "start": c * chunk, "end": (c + 1) * chunk if meta.get("tokens") is None else min((c + 1) * chunk, meta["tokens"] - 1),
                         "ppl": p,
                         "positions": r.count_by_chunk[c] if r.count_by_chunk else None,
                         "kl": r.kl_by_chunk[c] if r.kl_by_chunk else None,
                         "top1": r.top1_by_chunk[c] if r.top1_by_chunk else None})
    pd.DataFrame(rows).astype({**ints, "positions": "Int64"}).to_csv(out / "stream_by_chunk.csv", index=False)
    plot_ppl(results, chunk, out / "stream_ppl.png", title=meta.get("title", ""))


def plot_ppl(results: Sequence[StreamConfigResult], chunk: int, path: Path, title: str = "") -> None:
    """Perplexity per chunk against stream position (log scale), one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        xs = [(c + 0.5) * chunk for c, p in enumerate(r.ppl_by_chunk) if p is not None]
        ys = [p for p in r.ppl_by_chunk if p is not None]
        if r.name == "recompute":  # sampled positions: a few per chunk, so points, not a line
            per = max(1, round(r.evaluated / max(len(xs), 1)))
            ax.plot(xs, ys, "x", color="0.35", ms=5,
                    label=f"recompute (ppl {r.ppl:.1f} over {r.evaluated} sampled positions, ~{per} per chunk)")
            continue
        style = "--" if r.name == "full" else "-"
        ax.plot(xs, ys, style, marker="o", ms=3, label=f"{r.name} (ppl {r.ppl:.1f})")
    windows = {r.window for r in results if r.window is not None and r.name != "recompute"}
    if len(windows) == 1:
        ax.axvline(next(iter(windows)), color="0.6", lw=0.8, ls=":")
        ax.text(next(iter(windows)), ax.get_ylim()[1], " eviction starts", va="top", fontsize=7, color="0.4")
    ax.set_yscale("log")
    ax.set_xlabel("position in the stream (tokens)")
    ax.set_ylabel(f"perplexity per {chunk}-token chunk")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
