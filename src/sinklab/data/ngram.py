"""Natural-like unlimited training text: documents sampled from an n-gram model of a real corpus.

``data.source = "ngram"`` (../shared/DESIGN.md, "Emergence at laptop scale": the offline corpora
hold ~9M distinct tokens, and the paper finds no sink with too few distinct tokens). The corpus
named by ``data.corpus`` is tokenized as for ``source = "corpus"``; an order-k model is fitted on
its *training* split and the training documents are sampled from it, so a run can see many more
tokens than the corpus holds without repeating a window, with real token statistics. The
validation split (validation loss and the sink probe) stays the corpus's real held-out text.

The model is the maximum-likelihood n-gram with backoff: the next token after context
``c = x[t-k+1 .. t-1]`` is drawn uniformly from the occurrences of ``c`` in the training tokens
(so with the empirical conditional frequencies), at each step from the order-k model with
probability ``1 - backoff`` and from the order-(k-1) model (recursively) otherwise; a context never
seen at an order falls back to the next lower order, down to the unigram. Documents start from the
unigram. Sampling is vectorised over documents (one ``searchsorted`` per position).

Options (``data.ngram`` table): ``order`` (k, default 3), ``backoff`` (default 0.1),
``n_train_docs`` (default 20000), ``doc_len`` (tokens per document, default 255), ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sinklab.data.tokens import TokenizedCorpus, TokenSplit
from sinklab.errors import ConfigError
from sinklab.registry import nearest

#: bits per token in a packed context key (token ids must be < 2 ** BITS)
BITS = 16


@dataclass(kw_only=True)
class NGramConfig:
    """Options of the n-gram source (``data.ngram`` table, with ``data.source = "ngram"``).

    Fields:
        order: k, the model conditions on the previous k - 1 tokens (1 = unigram, at most 4).
        backoff: probability of drawing a token from the next lower order at each step (in [0, 1)).
        n_train_docs: sampled training documents.
        doc_len: tokens per sampled document (documents are joined by EOS by the packing).
        seed: seed of the sampling.
    """

    order: int = 3
    backoff: float = 0.1
    n_train_docs: int = 20_000
    doc_len: int = 255
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.order, bool) or not isinstance(self.order, int) or not 1 <= self.order <= 4:
            raise ConfigError(f"data.ngram.order must be an integer in [1, 4], got {self.order!r}")
        if not isinstance(self.backoff, (int, float)) or not 0.0 <= float(self.backoff) < 1.0:
            raise ConfigError(f"data.ngram.backoff must be in [0, 1), got {self.backoff!r}")
        for k in ("n_train_docs", "doc_len"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"data.ngram.{k} must be a positive integer, got {v!r}")


def make_config(options: dict[str, Any]) -> NGramConfig:
    """Validate ``options`` into an :class:`NGramConfig`. Raises ConfigError on unknown keys or bad values."""
    valid = [f.name for f in fields(NGramConfig)]
    for k in options:
        if k not in valid:
            hint = nearest(k, valid)
            raise ConfigError(f"unknown key in data.ngram: {k!r}"
                              + (f" (did you mean {hint!r}?)" if hint else "") + f"; valid keys: {', '.join(valid)}")
    return NGramConfig(**options)


class _Level:
    """The order-j table: sorted packed contexts of j - 1 tokens, and for each the slice of the
    next tokens that followed it (every occurrence, so a uniform pick is the ML estimate)."""

    def __init__(self, tokens: np.ndarray, starts_ok: np.ndarray, j: int) -> None:
        n = len(tokens)
        if j == 1:
            self.keys = np.zeros(1, dtype=np.int64)
            self.first = np.zeros(1, dtype=np.int64)
            self.count = np.array([n], dtype=np.int64)
            self.next = tokens.astype(np.int64)
            return
        # positions t >= j - 1 whose context t-j+1 .. t-1 lies inside one document
        t = np.arange(j - 1, n)
        t = t[starts_ok[t]]
        key = np.zeros(len(t), dtype=np.int64)
        for m in range(1, j):
            key = (key << BITS) | tokens[t - m].astype(np.int64)
        order = np.argsort(key, kind="stable")
        key, nxt = key[order], tokens[t[order]].astype(np.int64)
        self.keys, self.first, self.count = np.unique(key, return_index=True, return_counts=True)
        self.next = nxt


class NGramModel:
    """An order-k n-gram model with backoff over token ids (see the module docstring).

    Args:
        split: the training tokens, as documents (:class:`~sinklab.data.tokens.TokenSplit`).
        order: k.

    Raises:
        ConfigError: a token id does not fit in :data:`BITS` bits, or the split is empty.
    """

    def __init__(self, split: TokenSplit, order: int) -> None:
        tokens = np.asarray(split.tokens[: split.n_tokens], dtype=np.int64)
        if len(tokens) == 0:
            raise ConfigError("the n-gram source needs a non-empty training split")
        if tokens.max() >= 2**BITS:
            raise ConfigError(f"the n-gram source packs token ids in {BITS} bits; the tokenizer emits id {int(tokens.max())}")
        # depth[t] = tokens since the start of t's document (how long a context ending before t can be)
        doc_of = np.searchsorted(split.offsets, np.arange(len(tokens)), side="right") - 1
        depth = np.arange(len(tokens)) - split.offsets[doc_of]
        self.order = order
        self.levels = [_Level(tokens, depth >= j - 1, j) for j in range(1, order + 1)]

    def sample(self, n_docs: int, doc_len: int, *, backoff: float, seed: int) -> np.ndarray:
        """(n_docs, doc_len) int64 token ids, each row a document sampled from the model."""
        rng = np.random.default_rng([seed, 0x9A3])
        out = np.zeros((n_docs, doc_len), dtype=np.int64)
        for t in range(doc_len):
            # the order used at this step: min(order, t + 1), lowered by one with prob. backoff, repeatedly
            j = np.full(n_docs, min(self.order, t + 1), dtype=np.int64)
            going = np.full(n_docs, backoff > 0)
            while going.any():  # each order is left with probability backoff, once
                going &= (rng.random(n_docs) < backoff) & (j > 1)
                j[going] -= 1
            tok = np.full(n_docs, -1, dtype=np.int64)
            u = rng.random(n_docs)
            for level in range(self.order, 0, -1):  # highest order first; unseen contexts fall through
                want = (j == level) & (tok < 0)
                if not want.any():
                    continue
                lv = self.levels[level - 1]
                idx = np.flatnonzero(want)
                if level == 1:
                    pos = np.zeros(len(idx), dtype=np.int64)
                    seen = np.ones(len(idx), dtype=bool)
                else:
                    key = np.zeros(len(idx), dtype=np.int64)
                    for m in range(1, level):
                        key = (key << BITS) | out[idx, t - m]
                    pos = np.searchsorted(lv.keys, key)
                    pos = np.minimum(pos, len(lv.keys) - 1)
                    seen = lv.keys[pos] == key
                pick = lv.first[pos] + np.floor(u[idx] * lv.count[pos]).astype(np.int64)
                tok[idx[seen]] = lv.next[pick[seen]]
                j[idx[~seen]] = level - 1  # back off
            out[:, t] = tok
        return out


def ngram_corpus(tc: TokenizedCorpus, options: dict[str, Any]) -> TokenizedCorpus:
    """``tc`` with its training split replaced by documents sampled from an n-gram model fitted on it
    (the validation split, tokenizer and special ids unchanged). ``options``: :class:`NGramConfig` fields.

    Raises:
        ConfigError: bad options, or a tokenizer whose ids do not fit in :data:`BITS` bits.
    """
    cfg = make_config(options)
    model = NGramModel(tc.train, cfg.order)
    docs = model.sample(cfg.n_train_docs, cfg.doc_len, backoff=float(cfg.backoff), seed=cfg.seed)
    train = TokenSplit(tokens=docs.reshape(-1).astype(np.uint32),
                       offsets=np.arange(cfg.n_train_docs + 1, dtype=np.int64) * cfg.doc_len)
    meta = {**tc.meta, "ngram": {**vars(cfg), "fitted_on_tokens": int(tc.train.n_tokens)}}
    return TokenizedCorpus(folder=tc.folder, tokenizer=tc.tokenizer, train=train, val=tc.val, meta=meta)
