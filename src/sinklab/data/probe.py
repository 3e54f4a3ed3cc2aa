"""The fixed held-out probe set the sink tracker measures on.

Paper probe (Gu et al. 2025): 100 sequences of 64 tokens of natural text, eps = 0.3. Here the
windows are cut at seeded random offsets inside validation documents (never across a document
boundary), then given the training format's extra token (BOS for ``bos`` packing, the random
first token or the fixed token), so the metric sees what the model was trained on.
"""

from __future__ import annotations

import numpy as np
import torch

from sinklab.data.packing import Packer
from sinklab.data.tokens import TokenSplit
from sinklab.errors import InputError, plural


def _too_few_starts(total: int, n: int, chunk: int, lengths: np.ndarray, inserted: int,
                    settings: tuple[str, str, str | None]) -> str:
    n_name, len_name, other = settings
    longest = int(lengths.max()) if len(lengths) else 0
    size = f"{plural(len(lengths), 'document')}, {plural(int(lengths.sum()), 'token')}"
    more = f", or {other}" if other else ""
    if longest == 0:
        return f"the validation split ({size}) holds no text to cut probe windows from{more.replace(', or', ';')}"
    if total == 0:
        return (f"the validation split ({size}) has no probe window of {plural(chunk, 'text token')} within "
                f"a document; need {n}: lower {len_name} to at most {longest + inserted} (the longest document "
                f"has {plural(longest, 'token')}){more}")
    return (f"the validation split ({size}) has only {plural(total, 'possible probe window')} of "
            f"{plural(chunk, 'text token')}; need {n}: lower {n_name} to {total} or lower {len_name}{more}")


#: the settings named in the too-few-windows message of :func:`probe_set` (the tracker's)
TRACKER_SETTINGS = ("track.n_probe", "track.probe_len", "raise data.val_fraction")


def probe_set(split: TokenSplit, packer: Packer, n: int, length: int, *, seed: int = 0,
              settings: tuple[str, str, str | None] = TRACKER_SETTINGS) -> torch.Tensor:
    """N probe windows of ``length`` tokens from ``split``'s documents, seeded.

    Every start (document d, offset o) with the text chunk inside document d is equally likely;
    starts are drawn without replacement.

    ``settings``: what the error message calls N and the length, and one more fix or None
    (``sinklab measure`` passes ``("--num-samples", "--seq-len", None)``).

    Returns:
        LongTensor (n, length).

    Raises:
        InputError: fewer than ``n`` possible starts (validation documents too short or too few); the
            message gives the split's documents and tokens and the fix that helps (with no start at
            all, the largest length that fits in its longest document).
    """
    chunk = length - packer.n_probe_inserted
    if chunk < 1:
        raise InputError(f"probe length {length} leaves no room for text")
    lengths = np.diff(split.offsets)
    starts_per_doc = np.maximum(0, lengths - chunk + 1)
    total = int(starts_per_doc.sum())
    if total < n:
        raise InputError(_too_few_starts(total, n, chunk, lengths, packer.n_probe_inserted, settings))
    rng = np.random.default_rng([seed, 0x9B0BE])
    picks = np.sort(rng.choice(total, size=n, replace=False))
    cum = np.concatenate([[0], np.cumsum(starts_per_doc)])
    docs = np.searchsorted(cum, picks, side="right") - 1
    rows = []
    for i, (d, g) in enumerate(zip(docs, picks)):
        o = int(split.offsets[d] + (g - cum[d]))
        rows.append(packer.probe(np.asarray(split.tokens[o : o + chunk]), index=(1 << 40) + i))
    return torch.from_numpy(np.stack(rows)).long()
