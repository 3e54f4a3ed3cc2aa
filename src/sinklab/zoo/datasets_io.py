"""Documents from large corpora: JSON-lines, Parquet and Arrow datasets, or a ``datasets`` hub name.

Read with the Hugging Face ``datasets`` library (Arrow-backed and memory-mapped, converted once into
its cache under ``$SINKLAB_HOME/datasets``). One row is one document: its ``text_field`` column
(default ``"text"``) goes through the same whitespace normalisation as a ``.txt`` file
(:func:`sinklab.zoo.corpora.normalise_whitespace`, applied with ``num_proc`` worker processes), and
empty rows are skipped, so a dataset holding the texts of a folder of ``.txt`` files, in file-name
order, yields the same documents and hence the same token files (:mod:`sinklab.data.tokens`).

The documents stay on disk: :func:`read_dataset` returns them as :class:`ArrowDocuments`, a
sequence over the memory-mapped Arrow table that reads rows in batches, and the tokenizer pipeline
iterates it (content hash, BPE training, chunked encoding) without ever holding the corpus as
Python strings, so a corpus larger than memory can be tokenized. The cleaning pass is cached by
``datasets`` (a second run reuses it).

Accepted corpus strings (``data.corpus``):

* ``PATH.jsonl`` / ``PATH.json`` (JSON lines), ``PATH.parquet``, ``PATH.arrow``: one file;
* a folder of such files (sorted by name, one format), or a folder written by
  ``Dataset.save_to_disk`` (it holds ``state.json``);
* ``hf:NAME`` or ``hf:NAME:CONFIG``: the ``train`` split of a hub dataset (needs a reachable hub,
  or its files already in the ``datasets`` cache).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Iterator

from sinklab.errors import FetchError, InputError

#: file suffix -> ``datasets`` packaged builder
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
HUB_PREFIX = "hf:"


class ArrowDocuments(Sequence):
    """One string column of a ``datasets.Dataset`` as a read-only sequence of str, read from the
    memory-mapped Arrow table on demand (iteration and slices: :attr:`BATCH` rows per read).

    ``select(indices)`` gives the rows ``indices`` (0-based, in that order) as another lazy sequence.
    """

    BATCH = 1024

    def __init__(self, ds, column: str) -> None:
        self.ds = ds.select_columns([column])
        self.column = column

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return self.ds[start:stop][self.column] if stop > start else []
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"document {i} out of range ({n} documents)")
        return self.ds[i][self.column]

    def __iter__(self) -> Iterator[str]:
        for s in range(0, len(self), self.BATCH):
            yield from self.ds[s : s + self.BATCH][self.column]

    def select(self, indices) -> "ArrowDocuments":
        return ArrowDocuments(self.ds.select(indices), self.column)


def is_dataset(spec: str) -> bool:
    """True when ``spec`` names a dataset this module reads (a hub name, a dataset file or folder)."""
    if spec.startswith(HUB_PREFIX):
        return True
    path = Path(spec).expanduser()
    if path.is_file():
        return path.suffix in BUILDERS
    if path.is_dir():
        return (path / "state.json").exists() or (not any(path.glob("*.txt")) and bool(_dataset_files(path)))
    return False


def _dataset_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in BUILDERS)


def _load(spec: str):
    """The ``datasets.Dataset`` behind ``spec`` (see the module docstring)."""
    from sinklab.errors import require

    datasets = require("datasets", "zoo", f"the corpus {spec}")

    from sinklab.paths import cache_dir

    cache = str(cache_dir("datasets"))
    if spec.startswith(HUB_PREFIX):
        name, _, config = spec[len(HUB_PREFIX):].partition(":")
        try:
            return datasets.load_dataset(name, config or None, split="train", cache_dir=cache)
        except Exception as e:  # noqa: BLE001 - offline, unknown name, gated dataset ...
            raise FetchError(f"cannot load hub dataset {name!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                             " (a hub dataset needs a reachable hub or its files in the datasets cache; "
                             "a local .jsonl/.parquet/.arrow path works offline)") from None
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "state.json").exists():
        return datasets.load_from_disk(str(path))
    files = _dataset_files(path) if path.is_dir() else [path]
    kinds = {BUILDERS[f.suffix] for f in files}
    if len(kinds) != 1:
        raise InputError(f"dataset folder {spec!r} mixes formats ({', '.join(sorted(kinds))}); keep one format per folder")
    # the datasets library knows local files by path and modification time: an edited file whose time was kept
    # (tar x, cp -p) came back stale. Its cache is keyed here by the files' content as well.
    cache = str(Path(cache) / _content_digest(files))
    try:
        return datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train", cache_dir=cache)
    except Exception as e:  # noqa: BLE001 - malformed JSON, not a Parquet file ...
        raise InputError(f"cannot read dataset {spec!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def _content_digest(files: list[Path]) -> str:
    """16 hex digits of sha256 over the files' names, sizes and bytes (read in 8 MB blocks)."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f"{f.resolve()}|{f.stat().st_size}|".encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 23), b""):
                h.update(block)
    return h.hexdigest()[:16]


def read_dataset(spec: str, *, text_field: str = "text", num_proc: int | None = None,
                 clean: Callable[[str], str] = lambda t: t) -> tuple[ArrowDocuments, ArrowDocuments, dict]:
    """Documents of a dataset: (titles, documents, source), both lazy sequences on disk.

    Args:
        spec: a dataset path or ``hf:NAME[:CONFIG]`` (module docstring).
        text_field: the column holding each document's text.
        num_proc: worker processes for the cleaning pass (default: ``min(4, os.cpu_count())`` for
            datasets over 10,000 rows, else 1).
        clean: text -> text applied to every row before empty rows are dropped.

    Returns:
        titles (``title`` column when present, else the 0-based row number), documents (empty rows
        dropped), and a provenance dict (``registry``, ``package``, ``n_documents``, ``n_chars``,
        ``text_field``).

    Raises:
        InputError: unreadable file, missing column (names the columns), no text.
        FetchError: a hub dataset that cannot be reached.
    """
    ds = _load(spec)
    if text_field not in ds.column_names:
        raise InputError(f"dataset {spec!r} has no column {text_field!r} (columns: {', '.join(ds.column_names)}); "
                         "set data.text_field")
    if num_proc is None:
        num_proc = min(4, os.cpu_count() or 1) if len(ds) > 10_000 else 1
    has_title = "title" in ds.column_names

    def row(r, i):
        return {"_doc": clean(r[text_field] or ""), "_title": str(r["title"]) if has_title else str(i)}

    proc = num_proc if num_proc > 1 else None
    cleaned = ds.map(row, with_indices=True, num_proc=proc, desc="cleaning documents", remove_columns=ds.column_names)
    cleaned = cleaned.filter(lambda r: bool(r["_doc"]), num_proc=proc, desc="dropping empty documents")
    docs, titles = ArrowDocuments(cleaned, "_doc"), ArrowDocuments(cleaned, "_title")
    if not len(docs):
        raise InputError(f"dataset {spec!r} contains no text in column {text_field!r}")
    n_chars = sum(len(d) for d in docs)
    source = {"registry": "datasets" if spec.startswith(HUB_PREFIX) else "path",
              "package": spec if spec.startswith(HUB_PREFIX) else str(Path(spec).expanduser().resolve()),
              "version": None, "sha256": None, "license": None, "text_field": text_field,
              "n_documents": len(docs), "n_chars": n_chars}
    return titles, docs, source
