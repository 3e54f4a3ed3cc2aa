"""Documents from large corpora: JSON-lines, Parquet and Arrow datasets, or a ``datasets`` hub name.

Read with the Hugging Face ``datasets`` library (Arrow-backed and memory-mapped, converted once into
its cache under ``$SINKLAB_HOME/datasets``). One row is one document: its ``text_field`` column
(default ``"text"``) goes through the same whitespace normalisation as a ``.txt`` file
(:func:`sinklab.zoo.corpora.normalise_whitespace`, applied with ``num_proc`` worker processes), and
empty rows are skipped, so a dataset holding the texts of a folder of ``.txt`` files, in file-name
order, yields the same documents and hence the same token files (:mod:`sinklab.data.tokens`).

Accepted corpus strings (``data.corpus``):

* ``PATH.jsonl`` / ``PATH.json`` (JSON lines), ``PATH.parquet``, ``PATH.arrow``: one file;
* a folder of such files (sorted by name, one format), or a folder written by
  ``Dataset.save_to_disk`` (it holds ``state.json``);
* ``hf:NAME`` or ``hf:NAME:CONFIG``: the ``train`` split of a hub dataset (needs a reachable hub,
  or its files already in the ``datasets`` cache).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from sinklab.errors import FetchError, InputError

#: file suffix -> ``datasets`` packaged builder
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
HUB_PREFIX = "hf:"


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
    import datasets

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
    try:
        return datasets.load_dataset(kinds.pop(), data_files=[str(f) for f in files], split="train", cache_dir=cache)
    except Exception as e:  # noqa: BLE001 - malformed JSON, not a Parquet file ...
        raise InputError(f"cannot read dataset {spec!r}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def read_dataset(spec: str, *, text_field: str = "text", num_proc: int | None = None,
                 clean: Callable[[str], str] = lambda t: t) -> tuple[list[str], list[str], dict]:
    """Documents of a dataset: (titles, documents, source).

    Args:
        spec: a dataset path or ``hf:NAME[:CONFIG]`` (module docstring).
        text_field: the column holding each document's text.
        num_proc: worker processes for the cleaning pass (default: ``min(4, os.cpu_count())`` for
            datasets over 10,000 rows, else 1).
        clean: text -> text applied to every row before empty rows are dropped.

    Returns:
        titles (``title`` column when present, else ``"<row>"``, 0-based), documents, and a
        provenance dict (``registry``, ``package``, ``n_documents``, ``n_chars``, ``text_field``).

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
    cleaned = ds.map(lambda row: {"_doc": clean(row[text_field] or "")}, num_proc=num_proc if num_proc > 1 else None,
                     desc="cleaning documents", remove_columns=[c for c in ds.column_names if c != "title"])
    docs = cleaned["_doc"]
    titles = cleaned["title"] if has_title else [str(i) for i in range(len(docs))]
    keep = [i for i, d in enumerate(docs) if d]
    docs, titles = [docs[i] for i in keep], [str(titles[i]) for i in keep]
    if not docs:
        raise InputError(f"dataset {spec!r} contains no text in column {text_field!r}")
    source = {"registry": "datasets" if spec.startswith(HUB_PREFIX) else "path",
              "package": spec if spec.startswith(HUB_PREFIX) else str(Path(spec).expanduser().resolve()),
              "version": None, "sha256": None, "license": None, "text_field": text_field,
              "n_documents": len(docs), "n_chars": sum(len(d) for d in docs)}
    return titles, docs, source
