"""Data pipeline for pre-training: tokenizers, memory-mapped token files, packing, probe set.

* :mod:`sinklab.data.tokenizer` -- train a byte-level BPE or build the GPT-2 tokenizer.
* :mod:`sinklab.data.tokens` -- tokenize a corpus once into memmapped token files, split by document.
* :mod:`sinklab.data.packing` -- packing strategies (registry ``PACKING``) and batches.

The probe set the sink tracker measures on is cut by :mod:`sinklab.probe.windows` (one window cutter
for every probe).

The names in ``__all__`` are importable from the package itself (``from sinklab.data import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (imported on first use, so importing the package stays cheap)
_EXPORTS = {
    "build_tokenizer": "sinklab.data.tokenizer",
    "train_bpe": "sinklab.data.tokenizer",
    "gpt2_tokenizer": "sinklab.data.tokenizer",
    "TokenizedCorpus": "sinklab.data.tokens",
    "TokenSplit": "sinklab.data.tokens",
    "prepare_corpus": "sinklab.data.tokens",
    "make_packer": "sinklab.data.packing",
    "Packer": "sinklab.data.packing",
    "PackedData": "sinklab.data.packing",
    "bigram_backcopy_corpus": "sinklab.data.synthetic",
    "BigramBackcopyConfig": "sinklab.data.synthetic",
    "ngram_corpus": "sinklab.data.ngram",
    "NGramModel": "sinklab.data.ngram",
    "unigram_loss": "sinklab.data.baseline",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
