"""Synthetic training data known to produce attention sinks in small models (registry ``SYNTHETIC``).

``bigram-backcopy`` -- the Bigram-Backcopy task of Guo et al. 2024 ("Active-Dormant Attention
Heads: Mechanistically Demystifying Extreme-Token Phenomena in LLMs", Sec. 2). Every sequence
starts with BOS (position 0, added by the ``bos`` packing); its tokens follow a fixed random
bigram (Markov) transition matrix over a small vocabulary, except after one of a few *trigger*
tokens, where the next token copies the token just before the trigger::

    x[t] = x[t - 2]                  if x[t - 1] is a trigger
    x[t] ~ P[x[t - 1], :]            otherwise

(positions 0-based inside a document; the first document token is drawn uniformly from the
non-trigger tokens). Predicting a copy needs an attention head that looks one token back; on
every other token that head has nothing to do and, in softmax attention, goes *dormant* by
putting its attention on BOS -- which is a first-token sink.

By induction the token before a trigger is never a trigger (a copied token is the token before
an earlier trigger), so copies are always of non-trigger tokens.

The corpus is returned as a :class:`~sinklab.data.tokens.TokenizedCorpus` with a word-level
tokenizer whose tokens are ``t0 ... t{V-1}`` (ids 0..V-1, the triggers are the last
``n_triggers`` ids) plus ``<|endoftext|>`` (id V) and ``<|bos|>`` (id V+1), so the trainer, the
probe set and ``sinklab measure`` treat it like any tokenized text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from sinklab.data.tokenizer import SPECIAL_TOKENS
from sinklab.data.tokens import TokenizedCorpus, TokenSplit
from sinklab.errors import ConfigError
from sinklab.registry import Registry, first_unknown


@dataclass(kw_only=True)
class BigramBackcopyConfig:
    """Options of the Bigram-Backcopy task (``data.synthetic`` table of a run config).

    Fields:
        vocab: V, number of ordinary tokens (ids 0..V-1), triggers included.
        n_triggers: number of trigger tokens (the last ``n_triggers`` ids).
        alpha: Dirichlet concentration of each row of the transition matrix (small = peaked rows).
        n_train_docs, n_val_docs: number of training / validation sequences.
        doc_len: tokens per sequence without BOS/EOS; 0 = ``seq_len - 1`` so that
            ``BOS doc EOS`` is exactly one training window of ``seq_len + 1`` ids.
        seed: seed of the transition matrix and of the sequences.
    """

    vocab: int = 64
    n_triggers: int = 3
    alpha: float = 0.5
    n_train_docs: int = 50_000
    n_val_docs: int = 512
    doc_len: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):  # a TOML value of the wrong type: one line, not a TypeError deep in the generator
            v, want = getattr(self, f.name), (float,) if f.type in (float, "float") else (int,)
            if isinstance(v, bool) or not isinstance(v, (int, float) if want == (float,) else int) or \
                    (isinstance(v, float) and not math.isfinite(v)):
                raise ConfigError(f"data.synthetic.{f.name} must be {'a finite number' if want == (float,) else 'an integer'}, "
                                  f"got {v!r}")
        if not 0 <= self.seed < 2**32:
            raise ConfigError(f"data.synthetic.seed must be in [0, 2**32), got {self.seed}")
        if self.vocab < 4:
            raise ConfigError(f"data.synthetic.vocab must be >= 4, got {self.vocab}")
        if not 1 <= self.n_triggers < self.vocab:
            raise ConfigError(f"data.synthetic.n_triggers must be in [1, vocab), got {self.n_triggers}")
        if self.alpha <= 0:
            raise ConfigError(f"data.synthetic.alpha must be > 0, got {self.alpha}")
        if self.n_train_docs < 1 or self.n_val_docs < 1 or self.doc_len < 0:
            raise ConfigError("data.synthetic.n_train_docs and n_val_docs must be >= 1, doc_len >= 0")

    @property
    def triggers(self) -> np.ndarray:
        """Trigger token ids, shape (n_triggers,)."""
        return np.arange(self.vocab - self.n_triggers, self.vocab)


def transition_matrix(cfg: BigramBackcopyConfig) -> np.ndarray:
    """Row-stochastic bigram matrix P, shape (V, V) float64; P[a, b] = Pr(next = b | current = a)."""
    rng = np.random.default_rng([cfg.seed, 0xB16])
    return rng.dirichlet(np.full(cfg.vocab, cfg.alpha), size=cfg.vocab)


def bigram_backcopy(cfg: BigramBackcopyConfig, n_docs: int, doc_len: int, stream: int) -> np.ndarray:
    """Generate ``n_docs`` Bigram-Backcopy sequences (no BOS/EOS), shape (n_docs, doc_len) int64.

    ``stream`` separates independent draws with the same matrix (0 = train, 1 = validation).
    """
    P = transition_matrix(cfg)
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0
    is_trig = np.zeros(cfg.vocab, dtype=bool)
    is_trig[cfg.triggers] = True
    rng = np.random.default_rng([cfg.seed, 0xD0C, stream])
    x = np.empty((n_docs, doc_len), dtype=np.int64)
    x[:, 0] = rng.integers(0, cfg.vocab - cfg.n_triggers, size=n_docs)
    for t in range(1, doc_len):
        prev = x[:, t - 1]
        u = rng.random(n_docs)
        nxt = (cdf[prev] < u[:, None]).sum(axis=1)
        copy = is_trig[prev]
        if t >= 2:
            nxt = np.where(copy, x[:, t - 2], nxt)
        x[:, t] = nxt
    return x


def word_tokenizer(vocab: int) -> Tokenizer:
    """Word-level tokenizer ``t0 .. t{vocab-1}`` (ids 0..vocab-1) + EOS (id vocab) + BOS (id vocab+1)."""
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def _split(docs: np.ndarray) -> TokenSplit:
    n, L = docs.shape
    return TokenSplit(tokens=docs.reshape(-1).astype(np.uint16 if docs.max(initial=0) < 65535 else np.uint32),
                      offsets=np.arange(n + 1, dtype=np.int64) * L)


SYNTHETIC: Registry[Any] = Registry("synthetic data source")


@SYNTHETIC.register("synthetic-bigram-backcopy",
                    description="Bigram-Backcopy task (Guo et al. 2024): Markov tokens, copy after trigger tokens")
def bigram_backcopy_corpus(options: dict[str, Any], seq_len: int) -> TokenizedCorpus:
    """The Bigram-Backcopy corpus as a :class:`TokenizedCorpus` (see the module docstring).

    Args:
        options: :class:`BigramBackcopyConfig` fields (the ``data.synthetic`` table).
        seq_len: training window length T; documents are ``T - 1`` tokens unless ``doc_len`` is set.

    Raises:
        ConfigError: an unknown option (names the nearest valid one) or a bad value.
    """
    cfg = make_config(options)
    L = cfg.doc_len or seq_len - 1
    if L < 2:
        raise ConfigError(f"bigram-backcopy documents need at least 2 tokens, got doc_len {L}")
    train = bigram_backcopy(cfg, cfg.n_train_docs, L, 0)
    val = bigram_backcopy(cfg, cfg.n_val_docs, L, 1)
    meta = {"source": "synthetic-bigram-backcopy", "options": vars(cfg), "doc_len": L}
    return TokenizedCorpus(folder=Path("synthetic-bigram-backcopy"), tokenizer=word_tokenizer(cfg.vocab),
                           train=_split(train), val=_split(val), meta=meta)


def make_config(options: dict[str, Any]) -> BigramBackcopyConfig:
    """Validate ``options`` into a :class:`BigramBackcopyConfig`. Raises ConfigError on unknown keys."""
    bad = first_unknown(options, [f.name for f in fields(BigramBackcopyConfig)], "unknown key in data.synthetic:")
    if bad:
        raise ConfigError(bad)
    return BigramBackcopyConfig(**options)


def vocab_size(source: str, options: dict[str, Any]) -> int:
    """Number of token ids the synthetic source ``source`` emits (ordinary tokens + EOS + BOS)."""
    SYNTHETIC.get(source)
    return make_config(options).vocab + len(SPECIAL_TOKENS)


def load_synthetic(source: str, options: dict[str, Any], seq_len: int) -> TokenizedCorpus:
    """Build the synthetic corpus ``source``. Raises UnknownNameError listing the valid sources."""
    return SYNTHETIC.get(source)(options, seq_len)
