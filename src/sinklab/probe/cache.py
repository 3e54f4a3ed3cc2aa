"""A cache of tokenized corpora for probe generation (tokenizing 10 MB of text takes seconds).

Files live in ``$SINKLAB_HOME/probe_tokens/<key>.npz`` where the key is a sha256 of the
tokenizer's serialised definition and of every document's text, so a changed tokenizer
or corpus never reuses stale ids. Written to a temporary file and renamed into place; a damaged
file is tokenized again and rewritten.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np

from sinklab.fileio import atomic_write
from sinklab.paths import cache_dir
from sinklab.probe.inputs import tokenize_plain


#: how :func:`~sinklab.probe.inputs.tokenize_plain` encodes (part of the key). 2: a special token's text inside a
#: document is encoded as text (1 encoded it as the special id).
ENCODING_VERSION = 2


def _key(tokenizer, documents: Sequence[str]) -> str | None:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # slow tokenizers have no stable serialised form: do not cache
        return None
    h = hashlib.sha256(f"encoding {ENCODING_VERSION}\n".encode())
    h.update(backend.to_str().encode())
    for doc in documents:
        h.update(hashlib.sha256(doc.encode()).digest())
    return h.hexdigest()[:32]


def tokenize_documents(tokenizer, documents: Sequence[str]) -> list[np.ndarray]:
    """Token ids of every document (no special tokens), cached on disk.

    Args:
        tokenizer: a ``transformers`` tokenizer.
        documents: plain-text documents.

    Returns:
        One int64 array of token ids per document, in order.
    """
    key = _key(tokenizer, documents)
    path = cache_dir("probe_tokens") / f"{key}.npz" if key else None
    if path is not None and path.exists():
        try:
            with np.load(path) as z:
                ids, offsets = z["ids"], z["offsets"]
            return [ids[offsets[d] : offsets[d + 1]] for d in range(len(offsets) - 1)]
        except Exception:  # noqa: BLE001 - a damaged cache file: tokenize again and rewrite it
            pass
    docs = tokenize_plain(tokenizer, list(documents))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    ids = np.fromiter((t for d in docs for t in d), dtype=np.int64, count=int(offsets[-1]))
    if path is not None:
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, ids=ids, offsets=offsets)

        atomic_write(path, write)
    return [ids[offsets[d] : offsets[d + 1]] for d in range(len(docs))]
