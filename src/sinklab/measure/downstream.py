"""Downstream next to the sink: a cloze task built offline and the held-out loss (``measure --cloze N``).

Gu et al. 2025 (seed 000, W1 / Q1(a), Fig. 10) set HellaSwag accuracy against Sink_1 across model
families. No HellaSwag ships offline, so sinklab builds a HellaSwag-like cloze task from held-out
text: each item is a context (the sentences before a target sentence and the first half of it) and
``n_choices`` endings, the true second half of the target sentence and the second halves of
sentences from *other* documents. The model picks the ending with the highest log-likelihood given
the context (:func:`score_cloze`); chance is ``1 / n_choices``. Two scores, as lm-evaluation-harness
reports for HellaSwag: ``accuracy`` on the mean log-likelihood per ending token (length-normalised,
HellaSwag's ``acc_norm`` up to token vs byte normalisation) and ``accuracy_sum`` on the summed
log-likelihood (``acc``).

For a run trained on a synthetic task (no sentences) the items are token spans instead
(:func:`token_cloze_items`): a context of the first tokens of a held-out document and the document's
true next tokens against spans of other documents at the same offset.

The held-out loss is the mean next-token cross-entropy (nats per predicted token) over the probe's
windows (:func:`heldout_loss`): position t predicts token t + 1 (0-based), every position but the
last of each window is scored.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from sinklab.errors import InputError, param
from sinklab.metrics.proportion import wilson_interval

#: sentence boundary: '.', '!' or '?' (optionally closing quotes/brackets) followed by whitespace
_SENTENCE = re.compile(r"(?<=[.!?][\"')\]])\s+|(?<=[.!?])\s+")


@dataclass
class ClozeItem:
    """One cloze question: token ids of the context and of each ending; ``answer`` is the 0-based
    index of the true ending in ``endings``."""

    context: list[int]
    endings: list[list[int]]
    answer: int


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (split after ., ! or ? followed by whitespace), stripped, non-empty."""
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def text_cloze_items(documents: Sequence[str], tokenizer, n_items: int, *, n_choices: int = 4, seed: int = 0,
                     context_sentences: int = 2, min_words: int = 8) -> list[ClozeItem]:
    """HellaSwag-like items from plain-text documents.

    Each item: a target sentence of at least ``min_words`` words from one document, split at its middle
    word; the context is the ``context_sentences`` sentences before it (when the document has them) and
    the first half; the true ending is " " + the second half; the ``n_choices - 1`` distractors are the
    second halves of target-length sentences from other documents. The true ending's slot is uniform.

    Args:
        documents: D >= ``n_choices`` documents.
        tokenizer: a ``transformers`` tokenizer (``tokenizer(text, add_special_tokens=False)``).
        n_items: N, items to build (each from a distinct sentence).
        n_choices: endings per item (4 as in HellaSwag).
        seed: seed of the choice of sentences, distractors and answer slots.

    Returns:
        N :class:`ClozeItem`.

    Raises:
        InputError: fewer than ``n_choices`` documents with a usable sentence, or fewer usable
            sentences than ``n_items``.
    """
    if n_items < 1 or n_choices < 2:
        raise InputError(f"{param('cloze')} needs at least 1 item and 2 choices, got {n_items} and {n_choices}")
    pool: list[tuple[int, int, list[str]]] = []  # (document, sentence index, sentences of the document)
    docs_sents = [split_sentences(d) for d in documents]
    for d, sents in enumerate(docs_sents):
        for i, s in enumerate(sents):
            if len(s.split()) >= min_words:
                pool.append((d, i, sents))
    docs_with = {d for d, _, _ in pool}
    if len(docs_with) < n_choices:
        raise InputError(f"the cloze task needs sentences of >= {min_words} words in at least {n_choices} documents; "
                         f"the text has them in {len(docs_with)}")
    if len(pool) < n_items:
        raise InputError(f"{param('cloze', n_items)}: the text has only {len(pool)} usable sentences (>= {min_words} words)")
    rng = np.random.default_rng([seed, 0xC10])
    picks = rng.choice(len(pool), size=n_items, replace=False)

    def halves(sentence: str) -> tuple[str, str]:
        words = sentence.split()
        k = len(words) // 2
        return " ".join(words[:k]), " " + " ".join(words[k:])

    items = []
    for j in picks:
        d, i, sents = pool[int(j)]
        head, tail = halves(sents[i])
        context = " ".join(sents[max(0, i - context_sentences):i] + [head])
        others = [k for k in rng.permutation(len(pool)) if pool[int(k)][0] != d][: 8 * n_choices]
        # distractors of about the true ending's length (words), from distinct other documents
        n_tail = len(tail.split())
        others.sort(key=lambda k: abs(len(halves(pool[int(k)][2][pool[int(k)][1]])[1].split()) - n_tail))
        chosen, seen = [], set()
        for k in others:
            dk = pool[int(k)][0]
            if dk in seen:
                continue
            seen.add(dk)
            chosen.append(halves(pool[int(k)][2][pool[int(k)][1]])[1])
            if len(chosen) == n_choices - 1:
                break
        if len(chosen) < n_choices - 1:
            raise InputError(f"the cloze task needs {n_choices} documents with usable sentences")
        answer = int(rng.integers(n_choices))
        endings = chosen[:answer] + [tail] + chosen[answer:]
        items.append(ClozeItem(_encode(tokenizer, context), [_encode(tokenizer, e) for e in endings], answer))
    return items


def token_cloze_items(docs: Sequence[np.ndarray], n_items: int, *, n_choices: int = 4, seed: int = 0,
                      context_len: int = 24, ending_len: int = 8) -> list[ClozeItem]:
    """Cloze items from token documents (a synthetic task): the first ``context_len`` tokens of a
    document, its true next ``ending_len`` tokens, and the same span (positions ``context_len`` ..
    ``context_len + ending_len - 1``, 0-based) of ``n_choices - 1`` other documents.

    Raises:
        InputError: fewer than ``max(n_items, n_choices)`` documents of ``context_len + ending_len`` tokens.
    """
    if n_items < 1 or n_choices < 2:
        raise InputError(f"{param('cloze')} needs at least 1 item and 2 choices, got {n_items} and {n_choices}")
    need = context_len + ending_len
    ok = [np.asarray(d) for d in docs if len(d) >= need]
    if len(ok) < max(n_items, n_choices):
        raise InputError(f"{param('cloze', n_items)}: the held-out data has {len(ok)} documents of >= {need} tokens; "
                         f"need {max(n_items, n_choices)}")
    rng = np.random.default_rng([seed, 0xC11])
    items = []
    for j in rng.choice(len(ok), size=n_items, replace=False):
        others = [int(k) for k in rng.choice(len(ok) - 1, size=n_choices - 1, replace=False)]
        others = [k if k < j else k + 1 for k in others]  # skip the item's own document
        answer = int(rng.integers(n_choices))
        ends = [ok[k][context_len:need].tolist() for k in others]
        ends.insert(answer, ok[int(j)][context_len:need].tolist())
        items.append(ClozeItem(ok[int(j)][:context_len].tolist(), ends, answer))
    return items


@torch.no_grad()
def ending_logprobs(model, context: list[int], ending: list[int], prefix: Sequence[int] = (),
                    device: str | torch.device = "cpu") -> np.ndarray:
    """Log-probabilities (nats, float64) of each ending token given ``prefix + context`` and the
    ending tokens before it: shape (len(ending),). One forward over ``prefix + context + ending``."""
    ids = list(prefix) + list(context) + list(ending)
    x = torch.tensor([ids], dtype=torch.long, device=device)
    logits = model(x).logits[0].double()  # (T, V)
    start = len(prefix) + len(context)
    lp = torch.log_softmax(logits[start - 1:len(ids) - 1], dim=-1)
    return lp.gather(1, torch.tensor(ending, device=device)[:, None])[:, 0].cpu().numpy()


def score_cloze(model, items: Sequence[ClozeItem], *, prefix: Sequence[int] = (), device="cpu",
                progress: bool = False) -> dict[str, Any]:
    """Accuracy of ``model`` on cloze ``items``.

    Args:
        model: a causal LM whose call on (1, T) ids returns an object with ``.logits`` (1, T, V).
        items: the questions.
        prefix: token ids put before every context (the probe's BOS policy).

    Returns:
        ``accuracy`` and ``accuracy_sum`` in percent (mean and summed ending log-likelihood), their
        Wilson 95% intervals ``accuracy_ci`` / ``accuracy_sum_ci`` (percent), ``n_items``, ``n_choices``,
        ``chance`` (percent). Ties go to the lowest index.
    """
    from sinklab.progress import progress as show_progress

    mean_hits = sum_hits = 0
    bar = show_progress(total=len(items), unit="item", desc="cloze", enabled=progress)
    for it in items:
        lps = [ending_logprobs(model, it.context, e, prefix, device) for e in it.endings]
        mean_hits += int(np.argmax([lp.mean() for lp in lps]) == it.answer)
        sum_hits += int(np.argmax([lp.sum() for lp in lps]) == it.answer)
        bar.update(1)
    bar.close()
    n = len(items)
    n_choices = len(items[0].endings) if items else 0
    return {"accuracy": 100.0 * mean_hits / n, "accuracy_ci": [100.0 * v for v in wilson_interval(mean_hits, n)],
            "accuracy_sum": 100.0 * sum_hits / n, "accuracy_sum_ci": [100.0 * v for v in wilson_interval(sum_hits, n)],
            "n_items": n, "n_choices": n_choices, "chance": 100.0 / n_choices if n_choices else None}


@torch.no_grad()
def heldout_loss(model, input_ids: torch.Tensor, *, batch_size: int = 8, device="cpu", prefix_len: int = 0) -> float:
    """Mean next-token cross-entropy (nats per predicted token) of ``model`` on windows ``input_ids``
    (N, T): position t predicts token t + 1 (0-based), N * (T - 1) predictions in all.

    ``prefix_len`` p > 0 (a prefix LM, a :class:`sinklab.nn.SinkLM` run trained with ``train.prefix_len``): the
    model attends bidirectionally over positions 0..p-1 (``model(x, prefix_len=p)``) and only the predictions
    from position p - 1 on count (tokens p, p + 1, ...), as in training
    (:func:`sinklab.data.packing.apply_prefix_mask`): N * (T - max(p, 1)) predictions.

    Raises:
        InputError: ``prefix_len`` negative or at least T (no prediction left)."""
    T = input_ids.shape[1]
    if prefix_len < 0 or max(prefix_len, 1) >= T:
        raise InputError(f"prefix_len {prefix_len} leaves no prediction in windows of {T} tokens")
    first = max(prefix_len - 1, 0)  # the first counted prediction's position
    kw = {"prefix_len": prefix_len} if prefix_len else {}
    total, count = 0.0, 0
    for i in range(0, input_ids.shape[0], batch_size):
        x = input_ids[i:i + batch_size].to(device)
        logits = model(x, **kw).logits[:, first:-1].double()
        y = x[:, first + 1:]
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                                         reduction="sum"))
        count += y.numel()
    return total / max(count, 1)
