"""Run long-context task items through a cache: chunked prefill, greedy decoding, one row per item.

The prompt is fed in chunks of ``chunk`` tokens (default: the cache's window, ``budget - n_sink``, so
that a chunk attends to at most ``budget`` kept tokens and itself, and the cache is cut back to its
budget after every chunk: the prompt never sits in the cache whole); the full cache (the ceiling)
takes the prompt in one call. A :class:`~sinklab.streaming.SinkCache` is fed at cache positions
(0 .. kept, as StreamingLLM does, so no position passes the model's context), the full cache at
absolute positions (0 .. n - 1; a prompt that with its answer passes the model's context is refused).
Then up to ``max_new_tokens`` tokens are decoded greedily (argmax), one call each, stopping after the
tokenizer's end-of-sequence token; the decoded continuation is scored by the item's task
(:mod:`sinklab.streaming.tasks.scoring`).

``query_aware`` (kvpress's setting of that name): True feeds context and question as one stream, so
every eviction made while the prompt is read may already depend on the question's tokens (in the last
chunk); False feeds the context alone and then the question in its own calls, so the evictions made
while the context is read cannot depend on the question (the question's own calls evict as any call
does under a decode-time policy).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch

from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, param
from sinklab.models import input_device
from sinklab.progress import progress as show_progress
from sinklab.streaming.cache import SinkCache, long_calls_expected
from sinklab.streaming.tasks.items import TaskItem


@dataclass(frozen=True)
class CacheFactory:
    """A recipe for a fresh :class:`~sinklab.streaming.SinkCache` per item: any policy of
    :data:`sinklab.streaming.policies.POLICIES` at a budget, keys/values stored as given or quantised
    (:mod:`sinklab.streaming.quant`). The arguments are :class:`SinkCache`'s.

    Calling it with a model returns the cache; :attr:`name` is the configuration's name as ``sinklab
    stream`` writes it (``sinks@256``, ``h2o@128:kv4-channel-fp4``).
    """

    policy: str = "sinks"
    budget: int = 256
    n_sink: int | None = None
    recent: int | None = None
    eps: float = 0.3
    kv_bits: int = 16
    kv_group: int = 32
    key_quant: str = "token"
    sinks_full_precision: int | str = 0

    @property
    def name(self) -> str:
        from sinklab.streaming.harness import spec_name

        return spec_name(self.policy, self.budget, self.kv_bits, self.key_quant, self.sinks_full_precision)

    @property
    def needs_weights(self) -> bool:
        """True when the cache reads attention weights (eager attention): an attention-based policy, or
        quantised storage keeping the detected sinks lossless."""
        from sinklab.streaming.policies import POLICIES

        return POLICIES.get(self.policy).needs_scores or (self.kv_bits != 16 and self.sinks_full_precision == "detected")

    def __call__(self, model) -> SinkCache:
        return SinkCache(model, self.n_sink, policy=self.policy, budget=self.budget, recent=self.recent, eps=self.eps,
                         kv_bits=self.kv_bits, kv_group=self.kv_group, key_quant=self.key_quant,
                         sinks_full_precision=self.sinks_full_precision)


def _config_of(factory) -> dict:
    """Name and cache columns of a configuration: None (full), a :class:`CacheFactory`, a
    ``CacheSpec`` of ``sinklab stream`` (``kind`` full / sink) or any callable ``model -> cache``."""
    if factory is None or getattr(factory, "kind", None) == "full":
        return {"config": "full", "policy": "full", "budget": None, "kv_bits": 16, "key_quant": None,
                "sinks_full_precision": None}
    get = lambda k, d=None: getattr(factory, k, d)  # noqa: E731
    return {"config": get("name") or getattr(factory, "__name__", repr(factory)), "policy": get("policy"),
            "budget": get("budget"), "kv_bits": get("kv_bits", 16), "key_quant": get("key_quant"),
            "sinks_full_precision": get("sinks_full_precision")}


def _make_cache(model, factory):
    if factory is None or getattr(factory, "kind", None) == "full":
        adapter = adapt(model)
        cache = adapter.dynamic_cache()  # None: a sinklab model decodes through sinklab's cache only
        return cache if cache is not None else SinkCache(model, 0, adapter.max_context)
    if hasattr(factory, "cache_kwargs"):  # a CacheSpec of ``sinklab stream``
        return SinkCache(model, **factory.cache_kwargs())
    return factory(model)


@torch.no_grad()
def evaluate_items(model, tokenizer, items: Sequence[TaskItem], cache_factory=None, max_new_tokens: int | None = None,
                   *, query_aware: bool = True, chunk: int | None = None, progress: bool = False):
    """Answer every item through a fresh cache of ``cache_factory`` (None: the full cache, the ceiling).

    Args:
        model: a ``transformers`` RoPE causal LM (or a sinklab model) in eval mode; an attention-based
            policy switches it to eager attention for the run (its weights are read).
        tokenizer: the model's tokenizer (decodes the answers; its ``eos_token_id`` stops decoding).
        items: from :func:`sinklab.streaming.tasks.needle_items` / :func:`ruler_items` / :func:`make_items`.
        cache_factory: None (full cache: ``transformers``' DynamicCache), a :class:`CacheFactory`, a
            ``CacheSpec`` of ``sinklab stream`` (kind full or sink), or any callable ``model -> cache``
            (a SinkCache is fed at cache positions, any other cache at absolute ones).
        max_new_tokens: greedy tokens per answer (default: each task's ``answer_tokens``).
        query_aware: question fed with the context (True) or after it, in its own calls (False); see the module.
        chunk: prompt tokens per call (default: the SinkCache's window ``budget - n_sink``; the whole
            prompt for any other cache).

    Returns:
        pandas DataFrame, one row per item: ``config``, ``policy``, ``budget``, ``kv_bits``, ``key_quant``,
        ``sinks_full_precision`` (None for the full cache), ``task``, ``index``, ``length`` (asked),
        ``n_tokens`` (prompt tokens), ``depth`` (NaN without one), ``at`` (0-based first token of the
        needle, NaN without one), ``answers`` (expected, ``|``-joined), ``output`` (the decoded
        continuation), ``new_tokens``, ``score`` in [0, 1], ``correct`` (score == 1), ``query_aware``,
        ``chunk``, ``wall_s`` (prefill + decoding of the item).

    Raises:
        InputError: no items, ``max_new_tokens`` or ``chunk`` < 1, a full cache whose prompt and answer
            pass the model's context (the message names the item).
    """
    import pandas as pd

    from sinklab.streaming.tasks.registry import TASKS, score_item

    if not items:
        raise InputError(f"{param('items')} is empty: nothing to evaluate")
    if max_new_tokens is not None and max_new_tokens < 1:
        raise InputError(f"{param('max_new_tokens')} must be >= 1, got {max_new_tokens}")
    if chunk is not None and chunk < 1:
        raise InputError(f"{param('chunk')} must be >= 1 token, got {chunk}")
    adapter = adapt(model)
    full = cache_factory is None or getattr(cache_factory, "kind", None) == "full"
    if full and adapter.max_context is not None:
        for it in items:
            need = it.n_tokens + (max_new_tokens or TASKS.get(it.task).answer_tokens)
            if need > adapter.max_context:
                raise InputError(f"the full cache needs {need} positions for item {it.task} #{it.index} at "
                                 f"{param('lengths', it.length)}, more than the model's context of {adapter.max_context}")
    config = _config_of(cache_factory)
    eos = getattr(tokenizer, "eos_token_id", None)
    device = input_device(model)
    needs_weights = bool(getattr(cache_factory, "needs_weights", False))
    rows = []
    with adapter.attention("eager" if needs_weights else None), long_calls_expected():  # chunks chosen here
        for it in show_progress(items, desc=f"tasks {config['config']}", unit="item", enabled=progress):
            t0 = time.perf_counter()
            cache = _make_cache(model, cache_factory)
            sink = isinstance(cache, SinkCache)
            step = chunk or (cache.window if sink else None)
            parts = [it.ids] if query_aware else [list(it.context_ids), list(it.question_ids)]
            seen = 0

            def feed(ids: list[int]):
                nonlocal seen
                x = torch.tensor([ids], dtype=torch.long, device=device)
                logits = adapter.step(x, cache, cache.kept_length() if sink else seen, last_only=True)
                seen += len(ids)
                return logits[0, -1]

            logits = None
            for part in parts:
                size = step or len(part)
                for a in range(0, len(part), size):
                    logits = feed(part[a : a + size])
            gen: list[int] = []
            budget = max_new_tokens or TASKS.get(it.task).answer_tokens
            while True:
                nxt = int(logits.argmax())
                gen.append(nxt)
                if len(gen) >= budget or (eos is not None and nxt == eos):
                    break
                logits = feed([nxt])
            output = tokenizer.decode(gen, skip_special_tokens=True)
            score = score_item(it, output)
            rows.append({**config, "task": it.task, "index": it.index, "length": it.length, "n_tokens": it.n_tokens,
                         "depth": it.depth, "at": it.at, "answers": "|".join(it.answers), "output": output,
                         "new_tokens": len(gen), "score": score, "correct": score == 1.0, "query_aware": query_aware,
                         "chunk": step or it.n_tokens, "wall_s": time.perf_counter() - t0})
    df = pd.DataFrame(rows)
    return df.astype({"budget": "Int64", "at": "Int64", "depth": "float64"})


__all__ = ["CacheFactory", "evaluate_items"]
