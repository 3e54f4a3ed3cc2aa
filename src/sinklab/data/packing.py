"""Packing strategies: how documents become fixed-length training windows (registry ``PACKING``).

Every window holds ``T + 1`` token ids: inputs are ``window[:-1]`` (T tokens) and targets
``window[1:]`` (T tokens); windows do not overlap. Strategies (positions 0-based):

* ``concat`` -- documents joined by EOS (EOS after each document) and cut into windows; no BOS.
  The paper's default (Gu et al. 2025, Sec. 3).
* ``bos`` -- like ``concat`` but every document starts with BOS: ``BOS doc EOS BOS doc EOS ...``.
* ``random_first`` -- a uniformly random non-special token is put at position 0 of every window,
  followed by T stream tokens.
* ``random_first2`` -- random non-special tokens at positions 0 and 1 (Gu et al.'s "random x1 and
  x2"); the loss on predicting the second one is masked.
* ``fixed_token`` -- a fixed token (default BOS) is inserted at position ``p`` of every window;
  the target that predicts it (position p - 1) is masked out of the loss. ``p = 0`` puts a fixed
  first token (BOS) at every window start.

A cap on the number of training tokens (data-amount ablation) keeps the first N tokens of the
training stream (documents are in seeded random order, see :func:`~sinklab.data.tokens.split_documents`)
and repeats that subset for as many epochs as the run needs.

The batch for a step is a pure function of (seed, step): window order is a seeded permutation
per epoch, so a resumed run sees exactly the batches an uninterrupted run would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sinklab.data.tokens import TokenSplit
from sinklab.errors import InputError
from sinklab.registry import Registry

IGNORE_INDEX = -100


@dataclass(frozen=True)
class PackingContext:
    """Token ids and options a packer needs."""

    eos_id: int
    bos_id: int
    vocab_size: int  # ids a tokenizer can emit are < vocab_size
    position: int = 0  # fixed_token: 0-based position of the inserted token
    token_id: int | None = None  # fixed_token: id of the inserted token (default BOS)
    seed: int = 0


class Packer:
    """Base class: build the token stream of a split and insert extra tokens into chunks."""

    name = "base"
    #: every document of a window ends with EOS and nothing is inserted, so the document of every
    #: position is known (:meth:`document_ids`; ``data.attention_mask = "document"`` needs it)
    documents = True
    n_inserted = 0  # tokens added to each window that do not come from the stream
    n_probe_inserted = 0  # tokens :meth:`probe` adds to a text chunk

    def __init__(self, ctx: PackingContext) -> None:
        self.ctx = ctx

    @staticmethod
    def inserted_at(position: int) -> tuple[int, ...]:
        """0-based positions of the tokens this packing inserts into every window (not text; empty when
        none), given the configured ``data.packing_position`` (used only by ``fixed_token``)."""
        return ()

    @property
    def inserted_positions(self) -> tuple[int, ...]:
        """:meth:`inserted_at` for this packer's context."""
        return self.inserted_at(self.ctx.position)

    def stream(self, split: TokenSplit) -> np.ndarray:
        """1-D stream of the split's documents, each followed by EOS. Shape (n_tokens + n_docs,)."""
        return join_documents(split, self.ctx.eos_id, None)

    def insert(self, chunk: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Turn ``chunk`` (L stream tokens) into a window of L + n_inserted tokens.

        Returns (window (L + n_inserted,) int64, target_mask (L + n_inserted - 1,) bool) where
        ``target_mask[i]`` says whether predicting ``window[i + 1]`` from position i counts in the loss.
        ``index`` is the global sample index (seeds any randomness).
        """
        w = chunk.astype(np.int64)
        return w, np.ones(len(w) - 1, dtype=bool)

    def probe(self, chunk: np.ndarray, index: int) -> np.ndarray:
        """A probe window from natural text ``chunk`` taken inside one document, in the training format."""
        return self.insert(chunk, index)[0]

    def document_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 document ids of windows (B, T) of this packing: a document ends with its EOS
        (:func:`sinklab.attention_masks.document_ids`). Raises InputError for a packing whose
        inserted tokens belong to no document (``documents = False``)."""
        if not self.documents:
            raise InputError(f"packing {self.name!r} inserts a token that belongs to no document: no document ids")
        from sinklab.attention_masks import document_ids

        return document_ids(input_ids, self.ctx.eos_id)


PACKING: Registry[type[Packer]] = Registry("packing strategy")


def join_documents(split: TokenSplit, eos: int, bos: int | None) -> np.ndarray:
    """Documents joined as ``[BOS] doc EOS`` (BOS only when given). Shape (n_tokens + k * n_docs,)."""
    n_docs, n_tok = split.n_docs, split.n_tokens
    extra = 1 + (bos is not None)
    out = np.empty(n_tok + extra * n_docs, dtype=np.int64)
    lengths = np.diff(split.offsets)
    # start of document d in the output: offsets[d] + extra * d
    starts = split.offsets[:-1] + extra * np.arange(n_docs)
    is_text = np.ones(len(out), dtype=bool)
    eos_pos = starts + lengths + (bos is not None)
    is_text[eos_pos] = False
    out[eos_pos] = eos
    if bos is not None:
        is_text[starts] = False
        out[starts] = bos
    out[is_text] = np.asarray(split.tokens[:n_tok], dtype=np.int64)
    return out


@PACKING.register("concat", description="documents joined by EOS, cut into windows, no BOS (paper default)")
class ConcatPacker(Packer):
    name = "concat"


@PACKING.register("bos", description="BOS at every document start, documents joined by EOS")
class BosPacker(Packer):
    name = "bos"
    n_probe_inserted = 1

    def stream(self, split: TokenSplit) -> np.ndarray:
        return join_documents(split, self.ctx.eos_id, self.ctx.bos_id)

    def probe(self, chunk: np.ndarray, index: int) -> np.ndarray:
        # probe text is cut inside a document: give it the BOS a tokenizer that adds BOS would give
        return np.concatenate([[self.ctx.bos_id], chunk.astype(np.int64)])


def _normal_ids(ctx: PackingContext) -> np.ndarray:
    special = {ctx.eos_id, ctx.bos_id}
    return np.array([i for i in range(ctx.vocab_size) if i not in special], dtype=np.int64)


@PACKING.register("random_first", description="a random non-special token at position 0 of every window")
class RandomFirstPacker(Packer):
    name = "random_first"
    documents = False
    n_inserted = 1
    n_probe_inserted = 1

    def __init__(self, ctx: PackingContext) -> None:
        super().__init__(ctx)
        self._ids = _normal_ids(ctx)

    @staticmethod
    def inserted_at(position: int) -> tuple[int, ...]:
        return (0,)

    def insert(self, chunk: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.ctx.seed, 0x5EED, index])
        first = self._ids[rng.integers(len(self._ids))]
        w = np.concatenate([[first], chunk.astype(np.int64)])
        return w, np.ones(len(w) - 1, dtype=bool)  # position 0 is never a target


@PACKING.register("random_first2", description="random non-special tokens at positions 0 and 1 of every window")
class RandomFirstTwoPacker(RandomFirstPacker):
    """Gu et al.'s "random x1 and x2": two independent uniformly random non-special tokens at
    positions 0 and 1, then T - 1 stream tokens. Predicting the random token at position 1 (the
    target of position 0) is masked out of the loss: it teaches nothing about text."""

    name = "random_first2"
    n_inserted = 2
    n_probe_inserted = 2

    @staticmethod
    def inserted_at(position: int) -> tuple[int, ...]:
        return (0, 1)

    def insert(self, chunk: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.ctx.seed, 0x5EED, index])
        two = self._ids[rng.integers(len(self._ids), size=2)]
        w = np.concatenate([two, chunk.astype(np.int64)])
        mask = np.ones(len(w) - 1, dtype=bool)
        mask[0] = False
        return w, mask


@PACKING.register("fixed_token", description="a fixed token (default BOS) inserted at position p of every window")
class FixedTokenPacker(Packer):
    name = "fixed_token"
    documents = False
    n_inserted = 1
    n_probe_inserted = 1

    @staticmethod
    def inserted_at(position: int) -> tuple[int, ...]:
        return (position,)

    def insert(self, chunk: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        p = self.ctx.position
        if p > len(chunk):
            raise InputError(f"fixed_token position {p} is past the window of {len(chunk) + 1} tokens")
        tok = self.ctx.bos_id if self.ctx.token_id is None else self.ctx.token_id
        c = chunk.astype(np.int64)
        w = np.concatenate([c[:p], [tok], c[p:]])
        mask = np.ones(len(w) - 1, dtype=bool)
        if p >= 1:
            mask[p - 1] = False  # predicting the inserted token teaches nothing about text
        return w, mask


def make_packer(name: str, ctx: PackingContext) -> Packer:
    """Instantiate the packing strategy ``name``. Raises UnknownNameError listing the valid names."""
    return PACKING.get(name)(ctx)


def apply_prefix_mask(targets: torch.Tensor, prefix_len: int) -> torch.Tensor:
    """Mask targets inside a bidirectional prefix of length ``prefix_len`` (prefix LM).

    With positions 0..p-1 attending to each other, position i < p - 1 can see its own target
    (token i + 1 < p), so only targets from position p - 1 on (tokens p, p+1, ... after the prefix)
    count. ``targets`` (B, T) int64 is changed in place and returned; ``prefix_len = 0`` is a plain
    causal LM. Positions 0-based.
    """
    if prefix_len > 1:
        targets[:, : prefix_len - 1] = IGNORE_INDEX
    return targets


class PackedData:
    """Fixed-length training (or validation) windows from one split with one packing strategy.

    Args:
        split: the token split.
        packer: a :class:`Packer`.
        seq_len: T, the number of model inputs per window (windows hold T + 1 ids).
        max_tokens: keep only the first ``max_tokens`` stream tokens (0 = all); data-amount ablation.
        seed: seed of the per-epoch window order.

    Raises:
        InputError: the split has fewer stream tokens than one window.
    """

    def __init__(self, split: TokenSplit, packer: Packer, seq_len: int, *, max_tokens: int = 0, seed: int = 0) -> None:
        self.packer = packer
        self.seq_len = seq_len
        self.seed = seed
        stream = packer.stream(split)
        if max_tokens:
            stream = stream[:max_tokens]
        self.stream = stream
        self.chunk = seq_len + 1 - packer.n_inserted
        self.n_windows = len(stream) // self.chunk
        if self.n_windows == 0:
            raise InputError(
                f"the data has {len(stream)} tokens, fewer than one window of {self.chunk} "
                f"(seq_len {seq_len}); use a larger corpus or a shorter seq_len"
            )
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    @property
    def n_tokens(self) -> int:
        """Stream tokens used (after any cap) that fall into whole windows."""
        return self.n_windows * self.chunk

    def boundary_share(self, eos_id: int) -> float:
        """Share (0..1) of the windows that hold a document boundary among their inputs: an ``eos_id`` at stream
        offset 0 .. chunk - 2 of the window (its last stream token is only a target). 0 when every window lies
        inside one document (e.g. equal documents whose period, length + 1, is a multiple of :attr:`chunk`)."""
        pos = np.flatnonzero(self.stream[: self.n_tokens] == eos_id)
        inside = pos[pos % self.chunk < self.chunk - 1]
        return len(np.unique(inside // self.chunk)) / self.n_windows

    def window(self, w: int, index: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Window ``w`` (0-based, in stream order): (ids (T+1,), target_mask (T,))."""
        c = self.stream[w * self.chunk : (w + 1) * self.chunk]
        return self.packer.insert(c, w if index is None else index)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)
            self._perm_epoch = epoch
        return self._perm

    def batch(self, step: int, batch_size: int, *, prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Training batch of ``step`` (0-based): (input_ids (B, T) int64, targets (B, T) int64).

        Sample ``g = step * B + b`` is window ``perm_e[g mod n_windows]`` of epoch
        ``e = g // n_windows``; masked targets are -100. A pure function of (seed, step).
        """
        return self.samples(step * batch_size, batch_size, prefix_len=prefix_len)

    def samples(self, start: int, n: int, *, prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``g = start, ..., start + n - 1`` (0-based global sample indices, as in :meth:`batch`):
        (input_ids (n, T) int64, targets (n, T) int64). A distributed rank reads its slice of a
        step's batch with this (see :func:`sinklab.train.distributed.micro_batch`).
        """
        rows, tgts = [], []
        for g in range(start, start + n):
            epoch, j = divmod(g, self.n_windows)
            ids, mask = self.window(int(self._order(epoch)[j]), index=g)
            rows.append(ids)
            t = ids[1:].copy()
            t[~mask] = IGNORE_INDEX
            tgts.append(t)
        x = torch.from_numpy(np.stack(rows))
        targets = apply_prefix_mask(torch.from_numpy(np.stack(tgts)), prefix_len)
        return x[:, :-1].contiguous(), targets

    def sequential(self, n: int, *, prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` windows in stream order (validation): (inputs (n', T), targets (n', T)), n' = min(n, n_windows)."""
        rows, tgts = [], []
        for w in range(min(n, self.n_windows)):
            ids, mask = self.window(w)
            rows.append(ids)
            t = ids[1:].copy()
            t[~mask] = IGNORE_INDEX
            tgts.append(t)
        x = torch.from_numpy(np.stack(rows))
        return x[:, :-1].contiguous(), apply_prefix_mask(torch.from_numpy(np.stack(tgts)), prefix_len)
