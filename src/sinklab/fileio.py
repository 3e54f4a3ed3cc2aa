"""The files sinklab writes and reads.

* :func:`output_in_folder`: the file a command writes into its ``--out`` folder (``--out`` is always a
  folder; a value that names a file of that kind is refused, saying so).
* :func:`output_file`: the file a Python function that takes one output path writes (a folder given:
  the default name inside it).
* :func:`check_writable`: an output location (a folder to create or fill, a file to write) can be
  written. Every command checks its outputs with it before any model or data work, so a bad
  ``--out`` or ``SINKLAB_HOME`` costs nothing and says why in one line.
* :func:`atomic_write` (and :func:`atomic_write_text`): a file is written under a temporary name in
  its folder and renamed over the target, so a crash never leaves half a file. The file gets the
  permission bits a plain ``open(path, "w")`` would give (``0o666`` minus the umask; a temporary
  file alone would stay ``0o600``, readable by its owner only); :func:`publish` does the same for a
  file or folder built under a temporary name (a folder: ``0o777`` minus the umask).
* :func:`reading`, :func:`read_json`, :func:`read_jsonl`, :func:`read_toml`,
  :func:`check_safetensors`, :func:`check_model_files`: a file that is truncated, garbage or
  unreadable raises :class:`~sinklab.errors.CorruptFileError` (a TOML file:
  :class:`~sinklab.errors.ConfigError`) naming the file, never a parser's traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from sinklab.errors import ConfigError, CorruptFileError, InputError, SinklabError

# ---------------------------------------------------------------------------------------- writing


def umask() -> int:
    """The process's umask (e.g. ``0o022``), read without changing it where Linux shows it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)  # elsewhere: set and restore (the only portable way to read it)
    os.umask(old)
    return old


def file_mode() -> int:
    """Permission bits of a file created by a plain ``open(path, "w")``: ``0o666 & ~umask``."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """Permission bits of a folder created by a plain ``mkdir``: ``0o777 & ~umask``."""
    return 0o777 & ~umask()


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file in the same folder (it may open,
    truncate or recreate it), which then gets :func:`file_mode` and is renamed over ``path``.

    On any error (or Ctrl-C) the temporary file is removed and a previous ``path`` is left as it was.

    Returns:
        ``path`` as a Path.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def publish(tmp: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Rename ``tmp``, a file or folder built under a temporary name (``tempfile.mkstemp`` makes a file
    ``0o600``, ``tempfile.mkdtemp`` a folder ``0o700``), to ``dest`` with the mode a plain write would
    give: :func:`file_mode` or :func:`dir_mode`. A folder ``dest`` must not exist or be empty (as for
    ``os.replace``). Returns ``dest``."""
    os.chmod(tmp, dir_mode() if Path(tmp).is_dir() else file_mode())
    os.replace(tmp, dest)
    return Path(dest)


@contextlib.contextmanager
def exclusive(lock: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (created; an OS advisory lock, ``fcntl.flock``) for the block:
    two processes building the same cache entry (two trainings tokenizing one corpus, two readers unpacking one
    study table) take turns, so the second finds the first's finished entry instead of writing into the same
    temporary folder. The lock goes with the process (a killed holder frees it). Without ``fcntl`` (Windows) the
    block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    Path(lock).parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def output_file(out: str | os.PathLike, default_name: str) -> Path:
    """The file an output asked for at ``out`` is written to (the rule of every option that names one
    file: ``sinklab dynamics --out``, ``sinklab report --out``): ``out/default_name`` when ``out`` is an
    existing folder or ends with a path separator (``plots/``: a folder, created if need be), ``out``
    plus ``default_name``'s suffix when ``out`` has none (``fig`` -> ``fig.png``, as matplotlib would
    write it), else ``out`` itself. The command prints the path this returns.

    Args:
        out: the option's value, as typed (a ``str`` keeps its trailing separator; ``Path`` drops it).
        default_name: e.g. ``"dynamics.png"``, ``"REPORT.md"``.
    """
    text = os.fspath(out)
    p = Path(text).expanduser()
    if p.is_dir() or text.endswith(("/", os.sep)):
        return p / default_name
    return p if p.suffix else p.with_name(p.name + Path(default_name).suffix)


def output_in_folder(out: str | os.PathLike, name: str, flag: str = "--out") -> Path:
    """``out / name``: the fixed-name file a command writes into its ``--out`` folder
    (``sinklab report`` -> ``OUT/REPORT.md``, ``sinklab dynamics`` -> ``OUT/dynamics.png``).

    Args:
        out: the folder, as typed (created by the command if need be).
        name: the file name written inside it.
        flag: the option's name, for the error message.

    Raises:
        InputError: ``out`` ends in ``name``'s suffix (``--out r.md``, ``--out plot.png``): a file name
            where a folder is expected; the message names the file that would be written inside it.
    """
    from sinklab.errors import InputError

    p = Path(os.fspath(out)).expanduser()
    suffix = Path(name).suffix
    if suffix and p.suffix.lower() == suffix.lower() and not p.is_dir():
        raise InputError(f"{flag} {os.fspath(out)} names a {suffix} file, but {flag} is a folder: {name} is written "
                         f"inside it (e.g. {flag} {p.parent if str(p.parent) != '.' else 'DIR'})")
    return p / name


def check_writable(path: str | os.PathLike, what: str, *, folder: bool = True) -> None:
    """Refuse an output location that cannot be written, before any work is done.

    A test file is created (and removed at once) in ``path`` when it is an existing folder, else in
    the nearest existing folder above it: nothing else is created. Works for root too (permission
    bits alone would say yes) and for pseudo file systems such as ``/proc``.

    Args:
        path: the folder that will be created or filled (``folder=True``), or the file that will be
            written (``folder=False``).
        what: how the message names the location, e.g. ``"--out"`` (``--out PATH ...``) or
            ``"SINKLAB_HOME="`` (``SINKLAB_HOME=PATH ...``).

    Raises:
        InputError: ``path`` is a file where a folder is wanted (or a folder where a file is), a
            file lies where a folder above it should be, or nothing can be created there (the
            message names the path and the system's reason).
    """
    p = Path(path).expanduser()
    name = f"{what}{path}" if what.endswith("=") else f"{what} {path}"
    if p.exists():
        if folder and not p.is_dir():
            raise InputError(f"{name} is a file; give a folder")
        if not folder and p.is_dir():
            raise InputError(f"{name} is a folder; give a file name")
        if not folder:
            try:
                with open(p, "ab"):  # appends nothing: the file is left as it is
                    pass
            except OSError as e:
                raise InputError(f"{name} is not writable ({e.strerror or e})") from None
            return
        where = p
    else:
        where = p.parent
        while not where.exists() and where != where.parent:
            where = where.parent
        if not where.is_dir():
            raise InputError(f"{name} cannot be created: {where} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".sinklab-write-check-", dir=where)
    except OSError as e:
        raise InputError(f"{name} is not writable: nothing can be created in {where} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe)


# ---------------------------------------------------------------------------------------- reading


def _reason(e: BaseException) -> str:
    """The first line of an exception's message (its type when it has none)."""
    if isinstance(e, UnicodeDecodeError):
        return f"not UTF-8 text (byte 0x{e.object[e.start]:02x} at position {e.start})"
    text = str(e).strip()
    if isinstance(e, OSError) and e.strerror:
        text = e.strerror
    return text.splitlines()[0][:200] if text else type(e).__name__


@contextlib.contextmanager
def reading(path: str | os.PathLike, what: str = "file", *, error: type[SinklabError] = CorruptFileError,
            hint: str = "it is corrupt, truncated or not a file sinklab can read") -> Iterator[None]:
    """Turn any error raised while reading or parsing ``path`` into ``error`` naming the file::

        with reading(p, "weights file"):
            state = load_file(p)

    A :class:`~sinklab.errors.SinklabError` raised inside passes through unchanged, and so do errors that
    say nothing about the file: running out of (GPU) memory and a missing optional package.

    Raises:
        error (default :class:`~sinklab.errors.CorruptFileError`): ``cannot read WHAT PATH: REASON; HINT``.
    """
    try:
        yield
    except (SinklabError, MemoryError, ImportError):
        raise
    except Exception as e:  # noqa: BLE001 - parsers raise anything (UnicodeDecodeError, SafetensorError, KeyError...)
        if type(e).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError, without importing torch
            raise
        raise error(f"cannot read {what} {path}: {_reason(e)}; {hint}") from None


def read_json(path: str | os.PathLike, what: str = "JSON file") -> Any:
    """Parse a JSON file. Raises CorruptFileError naming it (unreadable, not UTF-8, not JSON)."""
    with reading(path, what):
        return json.loads(Path(path).read_text(encoding="utf-8"))


def read_jsonl(path: str | os.PathLike, what: str = "JSON-lines file") -> list[Any]:
    """Parse a JSON-lines file (one value a line; blank lines skipped). Raises CorruptFileError naming
    the file and the line."""
    out = []
    with reading(path, what):
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if line.strip():
            with reading(f"{path} (line {i})", what):
                out.append(json.loads(line))
    return out


def read_toml(path: str | os.PathLike, what: str = "TOML file") -> dict[str, Any]:
    """Parse a TOML file. Raises ConfigError naming it (unreadable, not UTF-8, not TOML)."""
    import tomllib

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{path} is a folder, not a {what}")
    with reading(path, what, error=ConfigError, hint="not valid TOML"):
        return tomllib.loads(p.read_text(encoding="utf-8"))


def check_safetensors(path: str | os.PathLike) -> None:
    """Check the structure of a ``.safetensors`` file without loading its tensors: the 8-byte header
    length, the JSON header, and that every tensor's byte range lies inside the file.

    Raises:
        CorruptFileError: the file is truncated, garbage or unreadable (names it and why).
    """
    p = Path(path)

    def bad(why: str) -> CorruptFileError:
        return CorruptFileError(f"{p} is not a valid safetensors weights file ({why}); it is corrupt or truncated")

    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 << 20:
                raise bad(f"header length {n} past the file's {size} bytes")
            raw = f.read(n)
    except OSError as e:
        raise CorruptFileError(f"cannot read weights file {p}: {_reason(e)}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise bad("its header is not JSON") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    data = size - 8 - n
    for name, t in header.items():
        if name == "__metadata__":
            continue
        offs = t.get("data_offsets") if isinstance(t, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise bad(f"tensor {name!r} has no data offsets")
        if not 0 <= offs[0] <= offs[1] <= data:
            raise bad(f"tensor {name!r} ends at byte {offs[1]} of {data} data bytes")


#: JSON files of a model folder (Hugging Face's and sinklab's) that :func:`check_model_files` parses
MODEL_JSON_FILES = ("config.json", "sinklab_model.json", "sinklab_source.json", "generation_config.json",
                    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "model.safetensors.index.json")


def check_model_files(folder: str | os.PathLike) -> None:
    """Check the files of a local model folder before a loader reads them: every JSON file of
    :data:`MODEL_JSON_FILES` that is present parses, every ``*.safetensors`` passes
    :func:`check_safetensors`.

    Raises:
        CorruptFileError: names the first bad file.
    """
    folder = Path(folder)
    for name in MODEL_JSON_FILES:
        if (folder / name).is_file():
            read_json(folder / name, "model file")
    for w in sorted(folder.glob("*.safetensors")):
        check_safetensors(w)


__all__ = ["atomic_write", "atomic_write_text", "publish", "check_writable", "file_mode", "dir_mode", "umask",
           "reading", "read_json", "read_jsonl", "read_toml", "check_safetensors", "check_model_files",
           "MODEL_JSON_FILES"]
