"""Large-corpus sources via ``datasets``: JSON lines, Parquet and Arrow give the token files of the
equivalent .txt folder; bad datasets are clear errors."""

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sinklab.data.tokens import prepare_corpus
from sinklab.errors import FetchError, InputError
from sinklab.zoo.corpora import load_corpus

WORDS = "alpha beta gamma delta the of and to in a is that for it as was with".split()
TOKEN_FILES = ("train.bin", "val.bin", "train.idx.npy", "val.idx.npy", "tokenizer.json")


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(3)
    # ragged whitespace, so the cleaning step has work to do; one empty document is dropped by both paths
    docs = [f"  Doc {i}\r\n\n\n" + "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(30)) + "  " for _ in range(3))
            for i in range(12)]
    docs[5] = "   \n"
    return docs


@pytest.fixture(scope="module")
def sources(texts, tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    folder = root / "txt"
    folder.mkdir()
    for i, t in enumerate(texts):
        (folder / f"d{i:02d}.txt").write_text(t)
    jl = root / "corpus.jsonl"
    jl.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
    pq_dir = root / "parquet"  # a folder of two Parquet shards, read in file-name order
    pq_dir.mkdir()
    pq.write_table(pa.table({"text": texts[:7]}), pq_dir / "part-0.parquet")
    pq.write_table(pa.table({"text": texts[7:]}), pq_dir / "part-1.parquet")
    return {"txt": str(folder), "jsonl": str(jl), "parquet": str(pq_dir), "root": root}


def token_bytes(spec, cache, **kw):
    tc = prepare_corpus(spec, vocab_size=300, val_fraction=0.25, cache_root=cache, **kw)
    return {f: (tc.folder / f).read_bytes() for f in TOKEN_FILES}


def test_jsonl_and_parquet_give_the_txt_folder_token_files(sources, tmp_path, monkeypatch):
    """The dataset path never materialises the corpus (hashing, BPE training and encoding iterate
    the on-disk documents, several read batches); its token files equal the .txt folder's."""
    from sinklab.zoo.datasets_io import ArrowDocuments

    monkeypatch.setattr(ArrowDocuments, "BATCH", 4)
    by_slice = ArrowDocuments.__getitem__

    def batches_only(self, i):  # one document at a time would mean a per-row Python loop over the corpus
        assert isinstance(i, slice), "the dataset path read a single document"
        return by_slice(self, i)

    monkeypatch.setattr(ArrowDocuments, "__getitem__", batches_only)
    ref = token_bytes(sources["txt"], tmp_path / "a")
    assert len(ref["train.bin"]) > 0
    assert token_bytes(sources["jsonl"], tmp_path / "b", text_field="body") == ref  # separate caches: recomputed
    assert token_bytes(sources["parquet"], tmp_path / "c") == ref


def test_dataset_documents_are_cleaned_like_txt_files(sources, texts):
    txt, jl = load_corpus(sources["txt"]), load_corpus(sources["jsonl"], text_field="body", num_proc=2)
    assert list(jl.documents) == txt.documents and len(jl.documents) == len(texts) - 1
    assert jl.documents[-1] == txt.documents[-1] and jl.documents[1:3] == txt.documents[1:3]
    assert jl.titles[:2] == ["0", "1"] and jl.titles[5] == "6"  # row numbers; the empty row 5 is dropped
    assert jl.documents[0].startswith("Doc 0\n\n") and jl.source["text_field"] == "body"


def test_arrow_saved_dataset(sources, texts, tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": texts, "title": [f"t{i}" for i in range(len(texts))]}).save_to_disk(str(tmp_path / "ds"))
    c = load_corpus(str(tmp_path / "ds"))
    assert list(c.documents) == load_corpus(sources["txt"]).documents and c.titles[:2] == ["t0", "t1"]


def test_bad_datasets(sources, tmp_path, monkeypatch):
    with pytest.raises(InputError, match="no column 'text'.*body"):
        load_corpus(sources["jsonl"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(InputError, match="cannot read dataset"):
        load_corpus(str(bad))
    import datasets.config
    import huggingface_hub.constants

    # offline mode (read at import time, so set on the modules): the hub lookup fails at once
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FetchError, match="hub dataset"):
        load_corpus("hf:sinklab-no-such/dataset")


def test_an_edited_dataset_file_is_read_again_even_with_its_old_modification_time(tmp_path, monkeypatch):
    """The datasets library knows a local file by path and modification time: a row edited with the time restored
    (tar x, cp -p do that) came back stale, and the token cache, hashed on that stale text, was reused. The
    library's cache is keyed by the files' content too now: the edit is read."""
    import json
    import os

    from sinklab.zoo.datasets_io import read_dataset

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))
    f = tmp_path / "c.jsonl"
    f.write_text("\n".join(json.dumps({"text": f"document {i} alpha beta"}) for i in range(5)))
    _, docs, _ = read_dataset(str(f))
    assert docs[3] == "document 3 alpha beta"
    st = f.stat()
    f.write_text(f.read_text().replace("document 3 alpha", "document 3 EDITED alpha"))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    _, docs, _ = read_dataset(str(f))
    assert docs[3] == "document 3 EDITED alpha beta"
