"""One window cutter for every probe of natural text: ``sinklab measure``'s natural-text probe, the
probe of a training run's held-out data and the sink tracker's fixed probe set.

Paper probe (Gu et al. 2025): 100 sequences of 64 tokens of natural text, eps = 0.3. Windows are
cut inside documents (never across a document boundary) by :func:`cut_windows`; when there are too
few, :func:`too_few_windows` builds the one message (corpus size, and the fix that helps).

Two draws are kept, each for exact reproduction of the probes it has always produced:

* ``stride = content``, ``draw = "permutation"`` (``sinklab measure --input natural``): the
  non-overlapping windows at offsets 0, C, 2C, ... of every document, N of them picked by
  ``torch.randperm`` seeded with ``seed``;
* ``stride = 1``, ``draw = "choice"`` (:func:`probe_set`, the tracker and ``--input run``): every
  start (document, offset) with the chunk inside the document is equally likely, N picked without
  replacement by ``numpy.random.default_rng([seed, 0x9B0BE]).choice``.

Either way the picks come back in corpus order (document, then offset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from sinklab.errors import InputError, param, plural

if TYPE_CHECKING:
    from sinklab.data.packing import Packer
    from sinklab.data.tokens import TokenSplit


@dataclass(frozen=True)
class Wording:
    """What a too-few-windows message calls things (see :func:`too_few_windows`).

    Attributes:
        where: the text the windows come from (``the corpus``, ``the validation split``).
        n_name, len_name: the settings of the number of windows N and of their length T.
        fix: one more fix, appended as ``, or FIX`` (None: none).
        empty_fix: the fix when there is no text at all (None: ``fix``).
        window: the noun of a window (``window``, ``probe window``).
        counted: the noun of the windows counted (``window``, ``possible probe window``).
        unit: the noun of a window's token (``content token``, ``text token``).
    """

    where: str
    n_name: str
    len_name: str
    fix: str | None
    empty_fix: str | None = None
    window: str = "window"
    counted: str = "window"
    unit: str = "content token"


#: ``sinklab measure``'s natural-text probe
CORPUS_WORDING = Wording("the corpus", param('num_samples'), param('seq_len'), "use a larger corpus", "use another corpus")
#: the sink tracker's probe set (``track.*`` settings)
TRACKER_WORDING = Wording("the validation split", "track.n_probe", "track.probe_len", "raise data.val_fraction",
                          window="probe window", counted="possible probe window", unit="text token")
#: a training run's held-out data measured by ``sinklab measure --input run`` (and analyze, on a run)
RUN_WORDING = Wording("the validation split", param('num_samples'), param('seq_len'), None,
                      window="probe window", counted="possible probe window", unit="text token")


def too_few_windows(found: int, wanted: int, content: int, doc_lengths: Sequence[int], special: int = 0,
                    wording: Wording = CORPUS_WORDING) -> str:
    """The message for text with fewer than ``wanted`` windows of ``content`` tokens within documents.

    States the text's size (documents and tokens) and the fix that helps: with no window at all
    lowering N cannot help, so it names the longest document and the largest T that fits in it
    (``special`` = tokens a window adds to its ``content``: BOS, special tokens, inserted tokens);
    with some windows, the N that fits.
    """
    w = wording
    lengths = [int(n) for n in doc_lengths]
    tokens, longest = sum(lengths), max(lengths, default=0)
    size = f"{plural(len(lengths), 'document')}, {plural(tokens, 'token')}"
    more = f", or {w.fix}" if w.fix else ""
    if longest == 0:
        empty = w.empty_fix or w.fix
        return f"{w.where} ({size}) holds no text to cut {w.window}s from" + (f"; {empty}" if empty else "")
    if found == 0:
        return (f"{w.where} ({size}) has no {w.window} of {plural(content, w.unit)} within a document; "
                f"need {wanted}: lower {w.len_name} to at most {longest + special} (the longest document has "
                f"{plural(longest, 'token')}){more}")
    return (f"{w.where} ({size}) has only {plural(found, w.counted)} of {plural(content, w.unit)} within documents; "
            f"need {wanted}: lower {w.n_name} to {found} or lower {w.len_name}{more}")


@dataclass
class Windows:
    """Windows picked by :func:`cut_windows`: ``doc`` (N,) 0-based document indices, ``offset`` (N,)
    0-based token offsets inside them (corpus order), ``available``: how many windows there were."""

    doc: np.ndarray
    offset: np.ndarray
    available: int


def cut_windows(doc_lengths: Sequence[int], n: int, content: int, *, stride: int, draw: str, seed: int,
                special: int = 0, wording: Wording = CORPUS_WORDING) -> Windows:
    """Pick ``n`` windows of ``content`` tokens inside documents (see the module docstring for the draws).

    Args:
        doc_lengths: tokens of every document, in order.
        n: windows wanted (N). content: tokens per window (T minus the tokens a window adds).
        stride: distance between the candidate starts of a document (``content``: non-overlapping
            windows from offset 0; 1: every offset).
        draw: ``permutation`` (torch) or ``choice`` (numpy). seed: the draw's seed.
        special, wording: for the message (:func:`too_few_windows`).

    Raises:
        InputError: ``content < 1``, or fewer than ``n`` windows (the message says how many and what to do).
    """
    if content < 1:
        raise InputError(f"probe windows of {content} tokens leave no room for text")
    lengths = np.asarray(doc_lengths, dtype=np.int64).reshape(-1)
    per_doc = np.where(lengths >= content, (lengths - content) // stride + 1, 0)
    total = int(per_doc.sum())
    if total < n:
        raise InputError(too_few_windows(total, n, content, lengths.tolist(), special, wording))
    if draw == "permutation":
        gen = torch.Generator().manual_seed(seed)
        picks = np.asarray(sorted(torch.randperm(total, generator=gen)[:n].tolist()), dtype=np.int64)
    elif draw == "choice":
        picks = np.sort(np.random.default_rng([seed, 0x9B0BE]).choice(total, size=n, replace=False))
    else:
        raise InputError(f"unknown window draw {draw!r}: permutation | choice")
    cum = np.concatenate([[0], np.cumsum(per_doc)])
    docs = np.searchsorted(cum, picks, side="right") - 1
    return Windows(docs.astype(np.int64), ((picks - cum[docs]) * stride).astype(np.int64), total)


def probe_set(split: "TokenSplit", packer: "Packer", n: int, length: int, *, seed: int = 0,
              settings: Wording | tuple[str, str, str | None] = TRACKER_WORDING) -> torch.Tensor:
    """N probe windows of ``length`` tokens from ``split``'s documents, in ``packer``'s training format
    (its BOS, random first token or fixed token added to each text chunk), seeded.

    Every start (document d, offset o) with the text chunk inside document d is equally likely;
    starts are drawn without replacement (:func:`cut_windows`, ``stride=1, draw="choice"``).

    ``settings``: the wording of the too-few-windows message (default: the tracker's ``track.*``
    settings; ``sinklab measure`` passes :data:`RUN_WORDING`), or a tuple (N setting, length
    setting, one more fix or None) for a validation split.

    Returns:
        LongTensor (n, length).

    Raises:
        InputError: fewer than ``n`` possible starts (validation documents too short or too few); the
            message gives the split's documents and tokens and the fix that helps (with no start at
            all, the largest length that fits in its longest document).
    """
    if isinstance(settings, tuple):  # (N setting, length setting, one more fix or None)
        settings = Wording("the validation split", *settings, window="probe window", counted="possible probe window",
                           unit="text token")
    inserted = packer.n_probe_inserted
    chunk = length - inserted
    if chunk < 1:
        raise InputError(f"probe length {length} leaves no room for text")
    w = cut_windows(np.diff(split.offsets), n, chunk, stride=1, draw="choice", seed=seed, special=inserted,
                    wording=settings)
    rows = []
    for i, (d, off) in enumerate(zip(w.doc, w.offset)):
        o = int(split.offsets[d] + off)
        rows.append(packer.probe(np.asarray(split.tokens[o : o + chunk]), index=(1 << 40) + i))
    return torch.from_numpy(np.stack(rows)).long()
