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
from sinklab.progress import progress as show_progress
from sinklab.streaming.cache import SinkCache


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
    every configuration: compare these with recompute's ``ppl``).
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
    positions past it have no reference).
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
    ``full`` and ``recompute`` (over ``window`` tokens). A 16-bit cache ignores the quantisation
    options (one configuration, not one per combination); ``n_sink`` goes to the policies with sinks.

    Raises:
        UnknownNameError: an unknown policy. InputError: a bad budget, n_sink or quantisation option
        (:func:`sinklab.streaming.policies.make_policy`, :func:`sinklab.streaming.quant.check_kv_options`).
    """
    from sinklab.streaming.policies import POLICIES, make_policy
    from sinklab.streaming.quant import check_kv_options, parse_sinks_full_precision

    if window < 1:
        raise InputError(f"{param('window')} must be >= 1, got {window}")
    specs = [CacheSpec("full", "full", None, None, policy="full")] if full else []
    seen = set()
    for policy in dict.fromkeys(policies):
        ns = n_sink if POLICIES.get(policy).uses_sinks else 0
        for budget in dict.fromkeys(budgets):
            make_policy(policy, int(budget), ns)
            for bits in dict.fromkeys(kv_bits):
                for kq in dict.fromkeys(key_quant) if bits != 16 else ["token"]:
                    for fp in dict.fromkeys(map(parse_sinks_full_precision, sinks_full_precision)) if bits != 16 else [0]:
                        check_kv_options(int(bits), kv_group, kq, fp)
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
    common = [nll[t] for t in matched if t in nll]
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
        agreement_positions=len(scores.kl))


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
    take cache positions from the cache itself)."""
    return adapt(model).step(ids, cache, start, last_only=last_only)


def _next_token_nll(logits: Tensor, targets: Tensor) -> Tensor:
    """(n, V) logits, (n,) targets -> (n,) float64 NLL in nats."""
    logits = logits.float()
    return (torch.logsumexp(logits, -1) - logits.gather(-1, targets[:, None])[:, 0]).double()


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
        positions without a reference), on the logits' device; :meth:`add` stores them."""
        from sinklab.metrics.agreement import kl_to_full, top1_agreement

        nll = _next_token_nll(logits, targets)
        kl = torch.full_like(nll, float("nan"))
        agree = torch.full_like(nll, float("nan"))
        m = 0 if self.ref is None else self.ref.shape[0]
        k = sum(1 for p in positions if p < m)  # positions increase: the first k have a reference
        if k:
            ref = self.ref[torch.as_tensor(list(positions[:k]), device=self.ref.device)].to(logits.device)
            kl[:k] = kl_to_full(ref, logits[:k])
            agree[:k] = top1_agreement(ref, logits[:k]).double()
        return nll, kl, agree

    def add(self, positions: Sequence[int], nll: Tensor, kl: Tensor, agree: Tensor) -> None:
        """Store the scores of :meth:`score` (one host read)."""
        for t, a, b, c in zip(positions, nll.tolist(), kl.tolist(), agree.tolist()):
            self.nll[t] = a
            if not math.isnan(b):
                self.kl[t], self.agree[t] = b, c

    def add_logits(self, positions: Sequence[int], logits: Tensor, targets: Tensor) -> None:
        """:meth:`score` then :meth:`add`."""
        self.add(positions, *self.score(positions, logits, targets))


@torch.no_grad()
def stream_nll(model, ids: Tensor, spec: CacheSpec, *, max_context: int | None, block: int = 256,
               scores: "Scores | None" = None, keep: list | None = None) -> dict[int, float]:
    """NLL of every next token under ``spec`` (full or sink), from one parallel forward.

    Uses :func:`sinklab.streaming.parallel.sink_window_mode` (exactly the token-by-token cache's
    attention, checked by the tests); the full cache is plain causal attention over the first
    ``max_context`` tokens. The vocabulary projection runs ``block`` positions at a time.

    Args:
        scores: filled with the NLLs and, where it holds a reference, the agreement with the full cache
            (:class:`Scores`); None: a fresh one without a reference.
        keep: the (q, V) logits blocks are appended to it (positions 0 .. in order), as the model gave them.

    Returns:
        {position t: NLL of token t + 1}, t 0-based.
    """
    from sinklab.streaming.parallel import sink_window_mode

    n = ids.numel() if spec.kind != "full" or max_context is None else min(ids.numel(), max_context)
    x = ids[:n].view(1, -1).to(model.device)
    window = None if spec.kind == "full" else spec.window
    with sink_window_mode(model, spec.n_sink or 0, window, block=block):
        hidden = model.base_model(input_ids=x, position_ids=torch.arange(n, device=x.device)[None],
                                  use_cache=False).last_hidden_state[0]  # (n, d)
    head = model.get_output_embeddings()
    cap = getattr(model.config.get_text_config(decoder=True), "final_logit_softcapping", None)
    scores = Scores() if scores is None else scores
    for a in range(0, n - 1, block):
        b = min(n - 1, a + block)
        logits = head(hidden[a:b])
        if cap:
            logits = torch.tanh(logits / cap) * cap
        if keep is not None:
            keep.append(logits)
        scores.add_logits(range(a, b), logits, x[0, a + 1 : b + 1])
    return scores.nll


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
    """Feed ``ids`` one token at a time through ``spec``'s real cache (positions as
    :func:`stream_nll_decode`); the last ``latency_steps`` steps are timed. ``scores`` and ``keep`` as
    :func:`stream_nll` (``keep`` gets one (1, V) block per position).

    Returns:
        ({position t: NLL of token t + 1}, ms per timed step (nan without timing), cache bytes and
        state bytes at the end, the attention implementation used).
    """
    n = ids.numel() if spec.kind != "full" or max_context is None else min(ids.numel(), max_context)
    x = ids.view(1, -1).to(_device(model))
    nll = torch.empty(3, max(n - 1, 0), dtype=torch.float64, device=x.device)  # on the device: no sync per token
    scores = Scores() if scores is None else scores
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
            logits = _step(model, x[:, t : t + 1], cache, pos)
            if clock:
                _sync(x.device)  # CUDA runs asynchronously: the step's time is its kernels' time
                elapsed += time.perf_counter() - t0
            if keep is not None:
                keep.append(logits)
            nll[:, t] = torch.stack(scores.score([t], logits, x[0, t + 1 : t + 2]))[:, 0]
    scores.add(range(n - 1), *nll)
    out = scores.nll
    ms = 1000.0 * elapsed / timed if timed else float("nan")
    state = cache.state_nbytes if isinstance(cache, SinkCache) else 0
    return out, ms, _cache_nbytes(cache), state, attn


@torch.no_grad()
def decode_stacked(model, ids: Tensor, specs: Sequence[CacheSpec], *, progress: bool = True,
                   scores: "dict[str, Scores] | None" = None) -> dict[str, tuple[dict[int, float], int, int]]:
    """Feed ``ids`` token by token through the caches of ``specs`` at once, one configuration per row of
    the batch (:class:`~sinklab.streaming.cache.StackedCache`; cache positions): the NLLs each
    configuration's cache gives alone, for the cost of one batched decode.

    Args:
        specs: ``sink`` configurations of one budget.
        scores: {name: :class:`Scores`} filled for each configuration (all with the same reference or none);
            None: fresh ones without a reference.

    Returns:
        {name: ({position t: NLL of token t + 1}, cache bytes, state bytes at the end)}.
    """
    from sinklab.streaming.cache import StackedCache

    n, R = ids.numel(), len(specs)
    x = ids.view(1, -1).to(_device(model)).expand(R, -1)
    scored = next((s for s in specs if s.needs_weights), specs[0])
    scores = {s.name: Scores() for s in specs} if scores is None else scores
    scorer = scores[specs[0].name]  # every row is scored against the same reference
    with attention_for(model, scored):
        caches = [_new_cache(model, s, None) for s in specs]
        cache = StackedCache(caches)
        desc = f"{len(specs)} caches @{specs[0].budget}"
        nll = torch.empty(3, max(n - 1, 0), R, dtype=torch.float64, device=x.device)  # no sync per token
        for t in show_progress(range(n - 1), desc=desc, unit="token", enabled=progress):
            logits = step_batch(model, x[:, t : t + 1], cache, cache.kept_length())[:, 0]  # (R, V)
            nll[:, t] = torch.stack(scorer.score([t] * R, logits, x[:, t + 1]))
        for r, s in enumerate(specs):
            scores[s.name].add(range(n - 1), *nll[:, :, r])
    return {s.name: (scores[s.name].nll, c.nbytes, c.state_nbytes) for s, c in zip(specs, caches)}


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (CUDA runs asynchronously: a timer read without this
    measures the launches, not the work); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def decode_latency(model, ids: Tensor, spec: CacheSpec, *, at: int, steps: int = 32,
                   prefill_chunk: int = 512, state: bool = False) -> tuple[float, int] | tuple[float, int, int]:
    """Wall time of one decode step ``at`` tokens into the stream, and the cache's bytes there.

    The cache is filled with ``ids[:at]`` in chunks of ``prefill_chunk`` tokens, then ``steps``
    single-token steps are timed (mean, ms). ``full`` uses transformers' ``DynamicCache``; a
    sink spec :class:`SinkCache` with cache positions.

    Returns:
        (ms per token, cache bytes after the timed steps), and the cache's state bytes with ``state=True``.
    """
    if at + steps > ids.numel():
        raise InputError(f"latency at {at} tokens with {steps} steps needs {at + steps} tokens, the stream has {ids.numel()}")
    cache = _new_cache(model, spec, None if spec.kind != "full" else ids.numel())
    x = ids.view(1, -1).to(_device(model))

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
    """Sliding window with recomputation: for t = 0, every, 2 every, ... a fresh forward over
    ``ids[max(0, t - window) : t + 1]`` (positions from 0) scores token t + 1; latency is the mean
    time of one such forward; ``ref``: the full cache's logits for the agreement (:class:`Scores`)."""
    n, w = ids.numel(), spec.window
    x = ids.view(1, -1).to(_device(model))
    scores = Scores(ref)
    elapsed, nbytes = 0.0, 0
    todo = list(range(0, n - 1, every))
    for t in show_progress(todo, desc=spec.name, unit="position", enabled=progress):
        ctx = x[:, max(0, t - w) : t + 1]
        cache = _new_cache(model, CacheSpec("full", "full", None, None), ctx.shape[1])
        _sync(x.device)
        t0 = time.perf_counter()
        logits = _step(model, ctx, cache, 0, last_only=True)
        _sync(x.device)
        elapsed += time.perf_counter() - t0
        scores.add_logits([t], logits.view(1, -1), x[0, t + 1 : t + 2])
        nbytes = _cache_nbytes(cache)
    return _result(spec, scores, n, chunk, elapsed / max(len(todo), 1), nbytes, todo)


def _stacked_result(model, ids: Tensor, spec: CacheSpec, scores: "Scores", nbytes: int, state: int, *, chunk: int,
                    recompute_every: int, latency_steps: int) -> StreamConfigResult:
    """The result of one configuration decoded in a stacked batch (:func:`decode_stacked`): its
    latency is timed alone over the last ``latency_steps`` decode steps of the stream."""
    n = ids.numel()
    steps = max(1, min(latency_steps, n - 1))
    with attention_for(model, spec) as attn:
        ms = decode_latency(model, ids, spec, at=n - steps, steps=steps)[0] if latency_steps else None
    return _result(spec, scores, n, chunk, None if ms is None else ms / 1000.0, nbytes, range(0, n - 1, recompute_every),
                   state_bytes=state, mode="decode", attn=attn)


FULL = CacheSpec("full", "full", None, None, policy="full")


def _run_cache(model, ids: Tensor, spec: CacheSpec, *, chunk: int, recompute_every: int, max_context: int | None,
               mode: str, latency_steps: int, progress: bool, ref: Tensor | None,
               keep: list | None = None) -> StreamConfigResult:
    """One full / sink configuration alone: its NLLs (parallel or decoded), agreement with ``ref`` and latency."""
    n = ids.numel()
    if spec.kind == "sink" and max_context is not None and spec.n_sink + spec.window > max_context:
        raise InputError(f"n_sink + window = {spec.n_sink + spec.window} exceeds the model's context of "
                         f"{max_context} tokens")
    matched = range(0, n - 1, recompute_every)
    scores = Scores(ref)
    if spec.parallel_ok or spec.policy is None:
        if mode == "parallel" and adapt(model).parallel_stream:  # sinklab models: token by token (small, fast)
            stream_nll(model, ids, spec, max_context=max_context, scores=scores, keep=keep)
            how = "parallel"
        else:
            decode_stream(model, ids, spec, max_context=max_context, progress=progress, scores=scores, keep=keep)
            how = "decode"
        last = n if spec.kind != "full" or max_context is None else min(n, max_context)
        steps = max(1, min(latency_steps, last - 1))
        if latency_steps:
            ms, nbytes, state = decode_latency(model, ids[:last], spec, at=last - steps, steps=steps, state=True)
        else:  # not timed: no latency, and the cache's bytes are not measured either
            ms, nbytes, state = None, 0, 0
        attn = adapt(model).attn_implementation
        return _result(spec, scores, n, chunk, None if ms is None else ms / 1000.0, nbytes, matched, state_bytes=state, mode=how, attn=attn)
    # other policies, quantised caches: token by token, the last steps timed
    _, ms, nbytes, state, attn = decode_stream(model, ids, spec, max_context=max_context, latency_steps=latency_steps,
                                               progress=progress, scores=scores, keep=keep)
    return _result(spec, scores, n, chunk, None if math.isnan(ms) else ms / 1000.0, nbytes, matched, state_bytes=state, mode="decode", attn=attn)


@torch.no_grad()
def full_logits(model, ids: Tensor, *, max_context: int | None, mode: str = "parallel",
                progress: bool = False) -> Tensor:
    """The full cache's next-token logits of a stream, the reference of the agreement (:class:`Scores`).

    Args:
        ids: (N,) int64 stream. max_context: the full cache stops there. mode: as :func:`evaluate_stream`.

    Returns:
        (m - 1, V) logits as the model gives them, row t (0-based) predicting token t + 1, with
        m = min(N, max_context); on the model's device.
    """
    keep: list[Tensor] = []
    if mode == "parallel" and adapt(model).parallel_stream:
        stream_nll(model, ids, FULL, max_context=max_context, keep=keep)
    else:
        decode_stream(model, ids, FULL, max_context=max_context, progress=progress, keep=keep)
    return torch.cat([k.reshape(-1, k.shape[-1]) for k in keep])


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
        stack: the configurations decoded token by token (other policies, quantised caches) run up
            to ``stack`` at a time as the rows of one batch, one batch per budget
            (:func:`decode_stacked`); their latency is then timed for each alone at the end of the
            stream (:func:`decode_latency`). 0: one at a time, latency from their own last steps.
        agreement: also score every configuration against the full cache (``kl``, ``top1``: the full
            cache's logits are computed once per stream, by the ``full`` configuration when it is in
            ``specs``, else by :func:`full_logits`, kept on the model's device as (min(N, max_context) - 1, V)).

    Raises:
        InputError: N < 2, ``n_sink + window`` above ``max_context``, an unknown mode.
    """
    if ids.dim() != 1 or ids.numel() < 2:
        raise InputError(f"the stream needs at least 2 tokens, got shape {tuple(ids.shape)}")
    if mode not in ("parallel", "decode"):
        raise InputError(f"unknown mode {mode!r}: parallel | decode")
    n = ids.numel()
    done = done or {}
    kw = dict(chunk=chunk, recompute_every=recompute_every, max_context=max_context, mode=mode,
              latency_steps=latency_steps, progress=progress)
    new: dict[str, StreamConfigResult] = {}

    def finished(res: StreamConfigResult) -> None:
        new[res.name] = res
        if on_result is not None:  # saved at once: a stopped run keeps every finished configuration
            on_result(res)

    ref = None
    if agreement and any(s.name not in done for s in specs):
        full = next((s for s in specs if s.kind == "full"), None)
        if full is not None and full.name not in done:  # the full configuration computes the reference
            keep: list[Tensor] = []
            res = _run_cache(model, ids, full, ref=None, keep=keep, **kw)
            ref = torch.cat([k.reshape(-1, k.shape[-1]) for k in keep])
            scores = Scores(ref)  # the full cache against itself: KL 0, top-1 1 at every position
            scores.add_logits(range(ref.shape[0]), ref, ids[1 : ref.shape[0] + 1].to(ref.device))
            a = _result(full, scores, n, chunk, 0.0, 0, range(0))
            res.kl, res.top1, res.kl_by_chunk, res.top1_by_chunk = a.kl, a.top1, a.kl_by_chunk, a.top1_by_chunk
            res.agreement_positions = a.agreement_positions
            finished(res)
        else:
            ref = full_logits(model, ids, max_context=max_context, mode=mode, progress=progress)
    if stack and adapt(model).parallel_stream:  # the token-by-token configurations, one batched decode per budget
        todo = [s for s in specs if s.kind == "sink" and not s.parallel_ok and s.name not in done]
        for budget in dict.fromkeys(s.budget for s in todo):
            group = [s for s in todo if s.budget == budget]
            if max_context is not None and budget > max_context:
                raise InputError(f"n_sink + window = {budget} exceeds the model's context of {max_context} tokens")
            for a in range(0, len(group), stack):
                part = group[a : a + stack]
                scores = {s.name: Scores(ref) for s in part}
                for name, (_, nbytes, state) in decode_stacked(model, ids, part, progress=progress,
                                                               scores=scores).items():
                    spec = next(s for s in group if s.name == name)
                    finished(_stacked_result(model, ids, spec, scores[name], nbytes, state, chunk=chunk,
                                             recompute_every=recompute_every, latency_steps=latency_steps))
    out = []
    bar = show_progress(specs, desc="caches", unit="configuration", enabled=progress)
    for spec in bar:
        bar.set_postfix_str(spec.name)
        if spec.name in done:
            out.append(done[spec.name])
            continue
        if spec.name not in new:
            if spec.kind == "recompute":
                if max_context is not None and spec.window + 1 > max_context:
                    raise InputError(f"window + 1 = {spec.window + 1} exceeds the model's context of {max_context} tokens")
                finished(run_recompute(model, ids, spec, chunk=chunk, every=recompute_every, progress=progress, ref=ref))
            else:
                finished(_run_cache(model, ids, spec, ref=ref, **kw))
        out.append(new[spec.name])
    return out


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
                         "start": c * chunk, "end": (c + 1) * chunk, "ppl": p,
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
