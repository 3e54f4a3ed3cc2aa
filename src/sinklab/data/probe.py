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
from sinklab.errors import InputError


def probe_set(split: TokenSplit, packer: Packer, n: int, length: int, *, seed: int = 0) -> torch.Tensor:
    """N probe windows of ``length`` tokens from ``split``'s documents, seeded.

    Every start (document d, offset o) with the text chunk inside document d is equally likely;
    starts are drawn without replacement.

    Returns:
        LongTensor (n, length).

    Raises:
        InputError: fewer than ``n`` possible starts (validation documents too short or too few).
    """
    chunk = length - packer.n_probe_inserted
    if chunk < 1:
        raise InputError(f"probe length {length} leaves no room for text")
    lengths = np.diff(split.offsets)
    starts_per_doc = np.maximum(0, lengths - chunk + 1)
    total = int(starts_per_doc.sum())
    if total < n:
        raise InputError(
            f"the validation split has only {total} possible probe windows of {chunk} text tokens, "
            f"need {n}; lower track.n_probe or track.probe_len, or raise data.val_fraction"
        )
    rng = np.random.default_rng([seed, 0x9B0BE])
    picks = np.sort(rng.choice(total, size=n, replace=False))
    cum = np.concatenate([[0], np.cumsum(starts_per_doc)])
    docs = np.searchsorted(cum, picks, side="right") - 1
    rows = []
    for i, (d, g) in enumerate(zip(docs, picks)):
        o = int(split.offsets[d] + (g - cum[d]))
        rows.append(packer.probe(np.asarray(split.tokens[o : o + chunk]), index=(1 << 40) + i))
    return torch.from_numpy(np.stack(rows)).long()
