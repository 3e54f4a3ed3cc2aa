"""Tokenize a corpus once into memory-mapped token files, split into train/validation by document.

Layout of a token folder (cached under ``$SINKLAB_HOME/tokens/<key>/`` or a chosen folder)::

    tokenizer.json          the HF tokenizer (trained on the training split only)
    train.bin, val.bin      1-D token ids, uint16 when the vocabulary fits, else uint32
    train.idx.npy, val.idx.npy
                            int64 document offsets, length n_docs + 1: document d is
                            tokens[offsets[d]:offsets[d+1]] (0-based, no EOS/BOS stored)
    meta.json               key inputs, dtype, counts, document indices of each split

The key is a sha256 of the document texts and every setting that changes the tokens, so a
changed corpus or tokenizer never reuses a stale cache. The folder is written under the name
``.<key>.partial`` and renamed into place when complete, so an interrupted run never leaves a
half-written cache; it resumes: the trained tokenizer is kept there, and each split's documents
are appended chunk by chunk with their lengths (``<split>.len.bin``), so a rerun continues after
the last complete chunk instead of starting over.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from tokenizers import Tokenizer

from sinklab.data.tokenizer import build_tokenizer, special_ids
from sinklab.errors import InputError
from sinklab.fileio import atomic_write, exclusive, publish, read_json, reading
from sinklab.progress import progress as show_progress

FORMAT_VERSION = 2
"""Version of the stored token folders (part of the cache key). 2: a special token's text inside a document
(``<|endoftext|>``, ``<|bos|>``) is encoded as ordinary text, not as the special id (1 stored it as the id)."""


@dataclass
class TokenSplit:
    """One split: a flat memmapped token array plus document offsets (0-based)."""

    tokens: np.ndarray  # (n_tokens,) uint16 | uint32
    offsets: np.ndarray  # (n_docs + 1,) int64

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def doc(self, d: int) -> np.ndarray:
        """Token ids of document ``d`` (0-based), shape (len_d,)."""
        return self.tokens[self.offsets[d] : self.offsets[d + 1]]


@dataclass
class TokenizedCorpus:
    """A tokenized corpus: tokenizer, train and validation splits, and metadata."""

    folder: Path
    tokenizer: Tokenizer
    train: TokenSplit
    val: TokenSplit
    meta: dict

    @property
    def eos_id(self) -> int:
        return special_ids(self.tokenizer)[0]

    @property
    def bos_id(self) -> int:
        return special_ids(self.tokenizer)[1]

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer can emit (ids are < this)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)


def split_documents(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of document indices (0-based) into (train, validation), by whole document.

    ``round(n_docs * val_fraction)`` documents (at least 1) go to validation; both arrays keep the
    seeded permutation order, so a token cap on the training split takes a random subset of
    documents rather than the oldest ones.

    Raises:
        InputError: fewer than 2 documents, or ``val_fraction`` outside (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if n_docs < 2:
        raise InputError(
            f"the corpus has {n_docs} document(s); a train/validation split by document needs at least 2 "
            "(give a folder of .txt files or a corpus with several documents)"
        )
    perm = np.random.default_rng(seed).permutation(n_docs)
    n_val = min(n_docs - 1, max(1, int(round(n_docs * val_fraction))))
    return perm[n_val:].copy(), perm[:n_val].copy()


def _digest(documents: Sequence[str], settings: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(settings, sort_keys=True).encode())
    for d in documents:
        b = d.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()[:20]


#: documents encoded per ``encode_batch`` call (bounds the token ids held in memory at once)
ENCODE_CHUNK = 4096


def _encode_split(folder: Path, name: str, tok: Tokenizer, docs: Sequence[str], dtype: np.dtype) -> None:
    """Encode ``docs`` (in order) into ``name.bin`` (flat ids) and ``name.idx.npy`` (offsets).

    Chunks of :data:`ENCODE_CHUNK` documents are encoded in parallel by ``tokenizers`` and appended
    to the file, so only one chunk's ids are in memory; progress is shown when there is more than
    one chunk (:func:`sinklab.progress.progress`: a bar on a terminal, plain lines in a log file). The bytes equal those of encoding all at once.

    Resumable: after each chunk its document lengths are appended to ``name.len.bin`` (int64),
    after its ids. A rerun on the same folder keeps the documents whose lengths were written,
    cuts ``name.bin`` back to their ids (a chunk cut off mid-write is redone), and continues
    with the next chunk. Nothing is done when ``name.idx.npy`` exists.
    """
    idx_path, bin_path, len_path = folder / f"{name}.idx.npy", folder / f"{name}.bin", folder / f"{name}.len.bin"
    if idx_path.exists():
        return
    done = np.fromfile(len_path, dtype=np.int64) if len_path.exists() else np.zeros(0, dtype=np.int64)
    n_done = len(done)
    keep_bytes = int(done.sum()) * dtype.itemsize
    with open(bin_path, "ab") as f:  # drop ids written after the last complete chunk
        f.truncate(keep_bytes)
    with open(bin_path, "ab") as f, open(len_path, "ab") as lf, show_progress(
            total=len(docs), initial=n_done, desc=f"tokenizing {name}", unit="document",
            enabled=len(docs) > ENCODE_CHUNK) as bar:
        # a special token's text inside a document is text: only the packing puts EOS / BOS between documents
        tok.encode_special_tokens = True
        for s in range(n_done, len(docs), ENCODE_CHUNK):
            lengths = []
            for e in tok.encode_batch(list(docs[s : s + ENCODE_CHUNK]), add_special_tokens=False):
                np.asarray(e.ids, dtype=dtype).tofile(f)
                lengths.append(len(e.ids))
            f.flush()
            np.asarray(lengths, dtype=np.int64).tofile(lf)
            lf.flush()
            bar.update(len(lengths))
    lengths_all = np.fromfile(len_path, dtype=np.int64)
    offsets = np.zeros(len(lengths_all) + 1, dtype=np.int64)
    np.cumsum(lengths_all, out=offsets[1:])
    np.save(idx_path, offsets)
    len_path.unlink()


def _read_split(folder: Path, name: str, dtype: str) -> TokenSplit:
    offsets = np.load(folder / f"{name}.idx.npy")
    n = int(offsets[-1])
    if n == 0:
        tokens = np.zeros(0, dtype=dtype)
    else:
        tokens = np.memmap(folder / f"{name}.bin", dtype=dtype, mode="r", shape=(n,))
    return TokenSplit(tokens=tokens, offsets=offsets)


def load_token_folder(folder: str | Path) -> TokenizedCorpus:
    """Open a token folder written by :func:`tokenize_corpus` (memmapped, read-only).

    Raises:
        InputError: the folder is missing or incomplete.
        CorruptFileError: one of its files is unreadable or damaged (names it; deleting the folder
            makes the next run tokenize again).
    """
    folder = Path(folder)
    if not (folder / "meta.json").exists():
        raise InputError(f"{folder} is not a sinklab token folder (no meta.json)")
    hint = f"it is damaged; delete {folder} to tokenize again"
    meta = read_json(folder / "meta.json", "token folder record")
    with reading(folder / "tokenizer.json", "tokenizer", hint=hint):
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    with reading(folder, "token folder", hint=hint):
        splits = {name: _read_split(folder, name, meta["dtype"]) for name in ("train", "val")}
    return TokenizedCorpus(folder=folder, tokenizer=tok, train=splits["train"], val=splits["val"], meta=meta)


def tokenize_corpus(
    documents: Sequence[str],
    *,
    tokenizer: str = "bpe",
    vocab_size: int = 8192,
    val_fraction: float = 0.05,
    split_seed: int = 0,
    cache_root: str | Path | None = None,
    source: dict | None = None,
) -> TokenizedCorpus:
    """Tokenize ``documents`` once (cached) and return memmapped train/validation splits.

    The split is by whole document (:func:`split_documents`); a BPE tokenizer is trained on the
    training documents only.

    Args:
        documents: the corpus, one string per document: a list, or a lazy sequence on disk with
            ``select(indices)`` (:class:`sinklab.zoo.datasets_io.ArrowDocuments`, whose empty
            documents are already dropped), which is only ever iterated in batches.
        tokenizer: "bpe" (train a byte-level BPE of ``vocab_size``) or "gpt2".
        vocab_size: BPE vocabulary size (ignored for gpt2).
        val_fraction: share of documents held out for validation and the probe set.
        split_seed: seed of the document permutation.
        cache_root: folder holding token folders; default ``$SINKLAB_HOME/tokens``.
        source: provenance recorded in meta.json (corpus names, versions...).

    Raises:
        InputError: empty documents list or too few documents to split.
    """
    from sinklab.paths import cache_dir

    lazy = callable(getattr(documents, "select", None))
    docs = documents if lazy else [d for d in documents if d and d.strip()]
    if not len(docs):
        raise InputError("the corpus has no non-empty documents")
    settings = {
        "format": FORMAT_VERSION,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size if tokenizer == "bpe" else None,
        "val_fraction": val_fraction,
        "split_seed": split_seed,
    }
    key = _digest(docs, settings)
    root = Path(cache_root) if cache_root else cache_dir("tokens")
    folder = root / key
    if (folder / "meta.json").exists():
        return load_token_folder(folder)
    with exclusive(root / f".{key}.lock"):  # one process builds an entry; another waits, then reads it
        if not (folder / "meta.json").exists():
            _build_token_folder(docs, settings, key, root, folder, tokenizer, vocab_size, val_fraction, split_seed,
                                lazy, source)
    return load_token_folder(folder)


def _build_token_folder(docs, settings: dict, key: str, root: Path, folder: Path, tokenizer: str, vocab_size: int,
                        val_fraction: float, split_seed: int, lazy: bool, source) -> None:
    """Tokenize ``docs`` into the cache entry ``folder`` (through ``.<key>.partial``, which a stopped build resumes);
    called under the entry's lock."""
    train_idx, val_idx = split_documents(len(docs), val_fraction, split_seed)
    if lazy:
        train_docs, val_docs = docs.select(train_idx), docs.select(val_idx)
    else:
        train_docs, val_docs = [docs[i] for i in train_idx], [docs[i] for i in val_idx]
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{key}.partial"  # a stopped run resumes here (same key = same documents and settings)
    tmp.mkdir(exist_ok=True)
    if (tmp / "tokenizer.json").exists():
        tok = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    else:
        tok = build_tokenizer(tokenizer, train_docs, vocab_size)
        atomic_write(tmp / "tokenizer.json", lambda p: tok.save(str(p)))
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.uint16 if n_vocab <= 1 << 16 else np.uint32)

    try:
        for name, split_docs in (("train", train_docs), ("val", val_docs)):
            _encode_split(tmp, name, tok, split_docs, dtype)
        meta = {
            **settings,
            "key": key,
            "dtype": dtype.name,
            "tokenizer_vocab_size": n_vocab,
            "n_docs": len(docs),
            "train_docs": train_idx.tolist(),
            "val_docs": val_idx.tolist(),
            "source": source or {},
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            publish(tmp, folder)
        except OSError:  # a folder published by other means (an older sinklab without the lock): use it
            shutil.rmtree(tmp, ignore_errors=True)
    except (InputError, ValueError, TypeError):  # bad input: nothing worth resuming
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_documents(corpus: str | Sequence[str], *, text_field: str = "text",
                   num_proc: int | None = None) -> tuple[list[str], dict]:
    """Documents of one corpus or a mix (list of names/paths/datasets) from :mod:`sinklab.zoo.corpora`
    (``text_field``, ``num_proc``: for datasets, see :mod:`sinklab.zoo.datasets_io`).

    Returns (documents, source) where ``source`` maps each corpus name to its recorded provenance.
    ``documents`` is a list, except for a single dataset corpus: then its lazy on-disk
    :class:`~sinklab.zoo.datasets_io.ArrowDocuments` (a mix of corpora is joined into a list).

    Raises:
        UnknownNameError / InputError / FetchError: from ``load_corpus``.
    """
    from sinklab.zoo.corpora import load_corpus

    names = [corpus] if isinstance(corpus, str) else list(corpus)
    if not names:
        raise InputError("data.corpus is empty; give a corpus name, a path, or a list of them")
    if len(names) == 1:  # one corpus: its documents as they are (a dataset's stay on disk)
        c = load_corpus(names[0], text_field=text_field, num_proc=num_proc)
        return c.documents, {str(names[0]): {"name": c.name, "n_docs": len(c.documents), **_jsonable(c.source)}}
    docs: list[str] = []
    source: dict = {}
    for n in names:
        c = load_corpus(n, text_field=text_field, num_proc=num_proc)
        docs.extend(c.documents)
        source[str(n)] = {"name": c.name, "n_docs": len(c.documents), **_jsonable(c.source)}
    return docs, source


def _jsonable(d) -> dict:
    try:
        return json.loads(json.dumps(d, default=str)) if isinstance(d, dict) else {"source": str(d)}
    except (TypeError, ValueError):
        return {"source": str(d)}


def prepare_corpus(
    corpus: str | Sequence[str],
    *,
    tokenizer: str = "bpe",
    vocab_size: int = 8192,
    val_fraction: float = 0.05,
    split_seed: int = 0,
    cache_root: str | Path | None = None,
    text_field: str = "text",
    num_proc: int | None = None,
) -> TokenizedCorpus:
    """:func:`load_documents` followed by :func:`tokenize_corpus` (see both)."""
    docs, source = load_documents(corpus, text_field=text_field, num_proc=num_proc)
    return tokenize_corpus(
        docs,
        tokenizer=tokenizer,
        vocab_size=vocab_size,
        val_fraction=val_fraction,
        split_seed=split_seed,
        cache_root=cache_root,
        source=source,
    )
