"""Prefilling a prompt through a cache: in chunks by default, in one call as an option.

A prompt given to a :class:`~sinklab.streaming.SinkCache` in one call attends to all of itself
(every prompt token sees every earlier one, as with the full cache) and is cut to the budget only
afterwards; a prompt longer than the model's trained context is then also fed at positions the model
never saw. That is the protocol of the prefill-time presses (SnapKV, PyramidKV and kvpress score
the whole prompt's attention), but it is not what the cache does while decoding: a prefill/decode
mismatch. :func:`prefill` feeds the prompt in chunks of ``chunk`` tokens (default the cache's
``window = budget - n_sink``), each at cache positions: a token of a chunk attends to the at most
``budget`` tokens the cache kept before the chunk and to the chunk's tokens up to itself, so no
token sees more than ``budget + chunk`` keys, and positions stay below ``budget + chunk``. After
each chunk the cache is cut back to its budget (a prefill-time policy scores at the end of each
chunk with that chunk's last queries).

What chunking does not give: equality with feeding the prompt one token at a time once the cache
evicts (``chunk = 1`` is that). A chunk's later tokens also see the chunk's earlier ones beyond the
budget, and no single rotation of the kept keys can give every query of a chunk the distances
token-by-token decoding gives it (StreamingLLM's sinks sit at a fixed distance ``budget - s`` from
every decoded query). Each chunk is exactly a forward over the kept tokens and the chunk
(tests/test_streaming_prefill.py checks it).

:func:`prefill_question` adds kvpress's distinction between a question after the context
(``query_aware``: the question is part of the prompt the press scores) and a question the press
must not see (the context prefilled and cut first, the question then fed one token at a time, as
decode steps, which evict first in, first out under a prefill-time policy). :func:`generate` is
``model.generate`` after a chunked prefill of the prompt.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, param
from sinklab.streaming.cache import SinkCache, long_calls_expected

POSITIONS = ("cache", "stream")


def default_chunk(cache) -> int | None:
    """The chunk :func:`prefill` uses by default: the window of a :class:`SinkCache`
    (``budget - n_sink`` tokens), None (one call) for any other cache (a full cache keeps everything)."""
    return cache.window if isinstance(cache, SinkCache) else None


def _check_ids(ids, name: str) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] < 1 or ids.dtype not in (torch.long, torch.int):
        raise InputError(f"{param(name)} must be an integer tensor (B, L) with L >= 1, got "
                         f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")


@torch.no_grad()
def prefill(model, ids: Tensor, cache, *, chunk: int | None = None, one_call: bool = False,
            positions: str = "cache", logits: str = "last") -> Tensor:
    """Feed a prompt through ``cache``, in chunks of ``chunk`` tokens (default :func:`default_chunk`).

    Args:
        model: a ``transformers`` causal LM or a sinklab model (:class:`sinklab.nn.SinkLM`).
        ids: (B, L) int64 token ids, B streams of equal length (no padding).
        cache: a :class:`SinkCache` (or any cache the model takes; a cache other than a SinkCache is
            fed in one call).
        chunk: tokens per call (>= 1); 1 is token-by-token decoding.
        one_call: feed the whole prompt in one call (every prompt token attends to all earlier ones).
        positions: ``"cache"`` (each call at the cache's positions: the first new token at
            ``cache.kept_length()``, as StreamingLLM and ``sinklab stream`` do) or ``"stream"`` (0-based
            positions in the stream, as ``generate`` counts them; a long prompt passes the model's
            context and the cache warns once).
        logits: ``"last"`` (B, V) the last token's next-token logits, or ``"all"`` (B, L, V).

    Returns:
        the logits, in the model's dtype.

    Raises:
        InputError: ``ids`` not (B, L) integers, ``chunk`` < 1, ``positions`` or ``logits`` unknown.
    """
    _check_ids(ids, "ids")
    if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
        raise InputError(f"{param('chunk', chunk)} must be an integer >= 1")
    if positions not in POSITIONS:
        raise InputError(f"{param('positions', positions)} must be one of {', '.join(POSITIONS)}")
    if logits not in ("last", "all"):
        raise InputError(f"{param('logits', logits)} must be 'last' or 'all'")
    L = ids.shape[1]
    size = L if one_call or not isinstance(cache, SinkCache) else (chunk or default_chunk(cache) or L)
    adapter = adapt(model)
    seen = cache.get_seq_length()
    outs = []
    with long_calls_expected():  # the chunk is the caller's choice: no warning about calls above the budget
        for a in range(0, L, size):
            b = min(L, a + size)
            start = cache.kept_length() if positions == "cache" and isinstance(cache, SinkCache) else seen + a
            outs.append(adapter.step(ids[:, a:b], cache, start, last_only=logits == "last"))
    if logits == "last":
        return outs[-1][:, -1]
    return torch.cat(outs, dim=1)


@torch.no_grad()
def prefill_question(model, context: Tensor, question: Tensor, cache, *, query_aware: bool = True,
                     chunk: int | None = None, one_call: bool = False, positions: str = "cache") -> Tensor:
    """Prefill a context and a question after it, with or without the question in what the press scores.

    ``query_aware=True``: context + question form one prompt (:func:`prefill`; the question is in the
    last chunk, so a prefill-time policy's observation window holds the question's last tokens).
    ``query_aware=False`` (kvpress's question-agnostic compression): the context alone is prefilled and
    cut, then the question is fed one token at a time; a prefill-time policy then evicts the oldest
    kept token per question token (decode steps), so the question never scores anything.

    Args:
        context: (B, Lc) int64; question: (B, Lq) int64.
        (the others as :func:`prefill`)

    Returns:
        (B, V) next-token logits after the question's last token.

    Raises:
        InputError: as :func:`prefill`.
    """
    _check_ids(context, "context")
    _check_ids(question, "question")
    if query_aware:
        return prefill(model, torch.cat((context, question), dim=1), cache, chunk=chunk, one_call=one_call,
                       positions=positions)
    prefill(model, context, cache, chunk=chunk, one_call=one_call, positions=positions)
    return prefill(model, question, cache, chunk=1, positions=positions)


@torch.no_grad()
def generate(model, input_ids: Tensor, cache, *, chunk: int | None = None, one_call: bool = False, **kwargs) -> Tensor:
    """``model.generate(input_ids, cache=cache, **kwargs)`` after a chunked prefill of all but
    the last prompt token (:func:`prefill` at stream positions, which ``generate`` continues from).

    With ``one_call=True`` it is plain ``model.generate`` (the prompt in one call, without the
    :class:`~sinklab.streaming.SinkCache` warning about a call above its budget). ``generate``
    takes the prefilled tokens from the cache (it slices ``input_ids`` at ``cache.get_seq_length()``).

    Args:
        input_ids: (B, L) int64, no padding.
        cache: an empty :class:`SinkCache`.
        kwargs: passed to ``model.generate`` (``max_new_tokens``, ``do_sample``, ...).

    Returns:
        (B, L + new) int64, as ``model.generate`` returns.

    Raises:
        InputError: a cache that has seen tokens already, or ``input_ids`` not (B, L) integers.
    """
    _check_ids(input_ids, "input_ids")
    if cache.get_seq_length():
        raise InputError(f"generate needs an empty cache; this one has seen {cache.get_seq_length()} tokens")
    if not one_call and input_ids.shape[1] > 1:
        prefill(model, input_ids[:, :-1], cache, chunk=chunk, positions="stream")
        return model.generate(input_ids, cache=cache, **kwargs)
    with long_calls_expected():  # one call asked for: no warning about the prompt above the budget
        return model.generate(input_ids, cache=cache, **kwargs)


__all__ = ["default_chunk", "generate", "prefill", "prefill_question"]
