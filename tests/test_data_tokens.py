"""Tokenizer training, memmapped token files, split by document, cache reuse."""

import numpy as np
import pytest

from sinklab.data.tokenizer import BOS, EOS, special_ids, train_bpe
from sinklab.data.tokens import load_token_folder, split_documents, tokenize_corpus
from sinklab.errors import InputError

DOCS = [f"Document number {i}. " + " ".join(f"word{i % 7}x{j}" for j in range(30 + i)) for i in range(20)]


def test_split_by_document_is_a_partition_and_seeded():
    tr, va = split_documents(20, 0.2, seed=5)
    assert len(va) == 4 and len(tr) == 16
    assert sorted(np.concatenate([tr, va]).tolist()) == list(range(20))
    tr2, va2 = split_documents(20, 0.2, seed=5)
    assert tr.tolist() == tr2.tolist() and va.tolist() == va2.tolist()
    assert split_documents(20, 0.2, seed=6)[1].tolist() != va.tolist()
    with pytest.raises(InputError, match="at least 2"):
        split_documents(1, 0.1, 0)


def test_bpe_round_trip_and_specials():
    tok = train_bpe(DOCS, 300)
    assert tok.get_vocab_size() <= 300
    assert special_ids(tok) == (0, 1) and tok.id_to_token(0) == EOS and tok.id_to_token(1) == BOS
    text = "Unseen text: ünïcode ✓ 123"
    assert tok.decode(tok.encode(text).ids) == text


def test_tokenize_documents_split_by_document(tmp_path):
    tc = tokenize_corpus(DOCS, vocab_size=300, val_fraction=0.2, split_seed=1, cache_root=tmp_path)
    assert tc.train.n_docs == 16 and tc.val.n_docs == 4
    assert tc.train.tokens.dtype == np.uint16
    assert isinstance(tc.val.tokens, np.memmap)
    # every document decodes to exactly one source document, each split holds whole documents
    for split, idx in ((tc.train, tc.meta["train_docs"]), (tc.val, tc.meta["val_docs"])):
        for d, src in enumerate(idx):
            assert tc.tokenizer.decode(split.doc(d).tolist()) == DOCS[src]
    assert not set(tc.meta["train_docs"]) & set(tc.meta["val_docs"])
    # the tokenizer never saw validation text: a validation-only word is not a single token
    # second call reuses the cache folder
    tc2 = tokenize_corpus(DOCS, vocab_size=300, val_fraction=0.2, split_seed=1, cache_root=tmp_path)
    assert tc2.folder == tc.folder
    assert np.array_equal(np.asarray(tc2.train.tokens), np.asarray(tc.train.tokens))
    assert load_token_folder(tc.folder).meta["key"] == tc.meta["key"]
    # a change of settings gives a new folder
    tc3 = tokenize_corpus(DOCS, vocab_size=280, val_fraction=0.2, split_seed=1, cache_root=tmp_path)
    assert tc3.folder != tc.folder
    assert len([p for p in tmp_path.iterdir() if not p.name.startswith(".")]) == 2


def test_bpe_trained_on_train_split_only(tmp_path):
    docs = ["alpha beta gamma " * 50 for _ in range(9)] + ["zyzzyva " * 200]
    # find a seed that puts the odd document into validation
    for seed in range(50):
        tr, va = split_documents(len(docs), 0.1, seed)
        if 9 in va:
            break
    tc = tokenize_corpus(docs, vocab_size=320, val_fraction=0.1, split_seed=seed, cache_root=tmp_path)
    assert tc.tokenizer.token_to_id("Ġzyzzyva") is None
    assert tc.tokenizer.token_to_id("Ġbeta") is not None


def test_empty_corpus():
    with pytest.raises(InputError):
        tokenize_corpus(["", "  "])


@pytest.mark.network
def test_gpt2_tokenizer_matches_gpt2_ids():
    from sinklab.data.tokenizer import gpt2_tokenizer

    tok = gpt2_tokenizer()
    # GPT-2's published ids: "Hello" 15496, " world" 995, "," 11, "<|endoftext|>" 50256
    assert tok.encode("Hello world,").ids == [15496, 995, 11]
    assert special_ids(tok) == (50256, 50257)
    assert tok.get_vocab_size() == 50258


def test_corpus_mix_of_folders(tmp_path):
    from sinklab.data.tokens import load_documents

    for name, n in (("a", 3), ("b", 2)):
        (tmp_path / name).mkdir()
        for i in range(n):
            (tmp_path / name / f"{i}.txt").write_text(f"text {name} {i}")
    docs, source = load_documents([str(tmp_path / "a"), str(tmp_path / "b")])
    assert docs == ["text a 0", "text a 1", "text a 2", "text b 0", "text b 1"]
    assert [s["n_docs"] for s in source.values()] == [3, 2]


def test_chunked_encoding_writes_the_bytes_of_one_batch(tmp_path, monkeypatch):
    """Token files are written chunk by chunk (bounded memory); the bytes equal encoding every
    document in one batch and concatenating, across chunk boundaries and with empty documents."""
    import random

    import numpy as np

    import sinklab.data.tokens as tokens
    from sinklab.data.tokenizer import train_bpe

    rng = random.Random(0)
    docs = [" ".join(rng.choice("a b c the of x y zz".split()) for _ in range(rng.randint(0, 30))) for _ in range(10)]
    tok = train_bpe(docs, 280)
    monkeypatch.setattr(tokens, "ENCODE_CHUNK", 3)
    tokens._encode_split(tmp_path, "x", tok, docs, np.dtype(np.uint16))
    ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
    assert (tmp_path / "x.bin").read_bytes() == np.concatenate([np.asarray(i, dtype=np.uint16) for i in ids]).tobytes()
    assert np.load(tmp_path / "x.idx.npy").tolist() == np.cumsum([0] + [len(i) for i in ids]).tolist()


class _Interrupt(Exception):
    pass


def test_interrupted_tokenization_resumes_after_the_last_complete_chunk(tmp_path, monkeypatch):
    """A run stopped mid-split keeps its trained tokenizer and finished chunks; the rerun encodes only
    the rest and writes the same token folder as an uninterrupted run."""
    import random

    import numpy as np

    import sinklab.data.tokens as tokens

    rng = random.Random(1)
    docs = [" ".join(rng.choice("a b c the of x y zz".split()) for _ in range(rng.randint(1, 30))) for _ in range(40)]
    monkeypatch.setattr(tokens, "ENCODE_CHUNK", 4)
    clean = tokens.tokenize_corpus(docs, vocab_size=280, cache_root=tmp_path / "clean")

    calls = {"encode": 0, "build": 0}
    real_build = tokens.build_tokenizer

    def counting_build(*a, **k):
        calls["build"] += 1
        return real_build(*a, **k)

    monkeypatch.setattr(tokens, "build_tokenizer", counting_build)
    real_encode = tokens._encode_split

    def flaky_encode(folder, name, tok, split_docs, dtype, fail_after=None):
        class Wrapped:
            def encode_batch(self, batch, **k):
                calls["encode"] += 1
                if fail_after is not None and calls["encode"] > fail_after:
                    raise _Interrupt()
                return tok.encode_batch(batch, **k)
        return real_encode(folder, name, Wrapped(), split_docs, dtype)

    monkeypatch.setattr(tokens, "_encode_split", lambda *a: flaky_encode(*a, fail_after=3))
    with pytest.raises(_Interrupt):
        tokens.tokenize_corpus(docs, vocab_size=280, cache_root=tmp_path / "resumed")
    partial = next((tmp_path / "resumed").glob(".*.partial"))
    assert (partial / "tokenizer.json").exists()
    assert len(np.fromfile(partial / "train.len.bin", dtype=np.int64)) == 12  # 3 chunks of 4 documents
    monkeypatch.setattr(tokens, "_encode_split", lambda *a: flaky_encode(*a))
    calls["encode"] = 0
    resumed = tokens.tokenize_corpus(docs, vocab_size=280, cache_root=tmp_path / "resumed")
    n_train = len(clean.meta["train_docs"])
    n_val = len(clean.meta["val_docs"])
    expect_chunks = -(-(n_train - 12) // 4) + -(-n_val // 4)
    assert calls["build"] == 1 and calls["encode"] == expect_chunks
    for split in ("train", "val"):
        a, b = getattr(clean, split), getattr(resumed, split)
        assert np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens)) and np.array_equal(a.offsets, b.offsets)
    assert not list((tmp_path / "resumed").glob(".*.partial"))
    assert resumed.folder.name == clean.folder.name


def test_a_special_tokens_text_inside_a_document_is_text(tmp_path):
    """A document that contains the text "<|endoftext|>" or "<|bos|>" (web text, code) was stored with the EOS /
    BOS id in its middle: a fake document boundary for the packing and the document mask (outside audit,
    2026-12-07). Now no document holds a special id, and each decodes back to its text."""
    docs = [f"plain words {i} and more words" for i in range(8)]
    docs[2] = f"before {EOS} after and more words"
    docs[5] = f"start {BOS} middle {EOS} end"
    tc = tokenize_corpus(docs, vocab_size=300, val_fraction=0.25, split_seed=0, cache_root=tmp_path)
    specials = set(special_ids(tc.tokenizer))
    for split, idx in ((tc.train, tc.meta["train_docs"]), (tc.val, tc.meta["val_docs"])):
        for d, src in enumerate(idx):
            ids = split.doc(d).tolist()
            assert not specials & set(ids), (docs[src], ids)
            assert tc.tokenizer.decode(ids) == docs[src]


def test_probe_tokenization_keeps_a_special_tokens_text_as_text():
    """The probe's tokenize_plain on a byte-level BPE wrapped by transformers: "<|endoftext|>" inside a text is
    text, not the tokenizer's EOS id."""
    from transformers import PreTrainedTokenizerFast

    from sinklab.probe.inputs import tokenize_plain

    tok = PreTrainedTokenizerFast(tokenizer_object=train_bpe(DOCS, 300), eos_token=EOS, bos_token=BOS)
    text = f"alpha {EOS} beta"
    ids = tokenize_plain(tok, text)
    assert tok.eos_token_id not in ids and tok.bos_token_id not in ids
    assert tok.decode(ids) == text


def test_a_token_cache_entry_is_built_under_its_lock(tmp_path):
    """Two trainings tokenizing one corpus at once wrote into the same '.<key>.partial' folder and published a
    garbled split (an audit's race: 51,576 'documents' of 27,000). The build now holds the entry's lock: while
    another holder has it, nothing is written; once it is released the entry is built whole."""
    import threading
    import time

    from sinklab.data.tokens import tokenize_corpus
    from sinklab.fileio import exclusive

    docs = [f"doc {i} " + "the cat sat on the mat " * (1 + i % 5) for i in range(60)]
    kw = dict(tokenizer="bpe", vocab_size=300, val_fraction=0.2, split_seed=0)
    ref = tokenize_corpus(docs, cache_root=tmp_path / "a", **kw)
    key = ref.folder.name
    built = {}
    with exclusive(tmp_path / "b" / f".{key}.lock"):  # another process building this entry
        t = threading.Thread(target=lambda: built.setdefault("tc", tokenize_corpus(docs, cache_root=tmp_path / "b", **kw)))
        t.start()
        time.sleep(0.5)
        assert not (tmp_path / "b" / key).exists() and not list((tmp_path / "b").glob(".*.partial"))
    t.join(60)
    got = built["tc"]
    assert got.folder == tmp_path / "b" / key
    assert np.array_equal(np.asarray(got.train.tokens), np.asarray(ref.train.tokens))
    assert np.array_equal(np.asarray(got.val.tokens), np.asarray(ref.val.tokens))
