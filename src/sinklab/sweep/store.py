"""A study's runs as one table instead of hundreds of run folders (``sinklab sweep --pack``).

A sweep folder holds ``runs/<point>/seed<k>/`` with a handful of small files per run (``config.toml``,
``metrics.jsonl``, ``summary.json``, ``sweep.json``, ``final_ci.json``, ``train.log``). A published
study keeps them in **one file**, :data:`TABLE` (``runs.jsonl.gz``): one JSON line per line of
``metrics.jsonl`` and one per other file, each with the columns ``point``, ``seed``, ``file``, ``line``
(0-based line of ``metrics.jsonl``; None for a whole file) and ``text`` (the exact text), so
``pandas.read_json(path, lines=True)`` reads every run's tracker lines with run / seed columns, and
:func:`unpack` restores the folders byte for byte (the tests check it). Model weights, checkpoints
and ``final/`` are never packed (nothing published keeps them).

Every reader of a sweep folder goes through :func:`runs_dir`: the ``runs/`` folder when it is there,
else the table unpacked once into sinklab's cache (keyed by the table's sha256), so summaries,
dynamics, the report and ``report --check`` read a packed study as they read folders.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

from sinklab.errors import InputError
from sinklab.fileio import atomic_write, exclusive, reading

#: the table's file name inside a sweep folder
TABLE = "runs.jsonl.gz"
#: the files of a run folder that are packed (whatever else a run folder holds is left out)
PACKED_FILES = ("config.toml", "metrics.jsonl", "summary.json", "sweep.json", "final_ci.json", "train.log",
                "diverged.json", "train_result.json")


def _run_folders(runs: Path) -> list[Path]:
    """``runs/<point>/seed<k>/``; or, in sweeps made before seed folders (``results/archive``), the
    one-run ``runs/<point>/`` folders (their table rows have seed ``""``)."""
    seeded = sorted(d for d in runs.glob("*/seed*") if d.is_dir())
    return seeded or sorted(d for d in runs.glob("*") if d.is_dir() and (d / "metrics.jsonl").is_file())


def _point_seed(runs: Path, d: Path) -> tuple[str, int | str]:
    if d.parent == runs:  # a one-run point folder (no seed folders)
        return d.name, ""
    return d.parent.name, int(d.name[4:]) if d.name[4:].isdigit() else d.name


def _lines(text: str) -> list[str]:
    """``text`` cut after each ``\n`` only, line ends kept (``str.splitlines`` also cuts at ``\r``, ``\x85``
    and ``\u2028``, which a JSON string written with ``ensure_ascii=False`` may hold raw)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    return out + [parts[-1]] if parts[-1] else out


def pack(out: str | Path, *, remove: bool = True) -> Path:
    """Write ``out/runs.jsonl.gz`` from ``out/runs/<point>/seed<k>/`` and (``remove``) delete ``out/runs``.

    Args:
        out: a sweep folder.
        remove: delete the run folders once the table is written and read back equal.

    Returns:
        the table's path.

    Raises:
        InputError: ``out`` has no ``runs/`` folder with run folders, or a run folder holds a file that
            would be lost (anything but :data:`PACKED_FILES`, ``checkpoint.pt`` and ``final/``) while
            ``remove`` is set.
    """
    out = Path(out)
    runs = out / "runs"
    folders = _run_folders(runs) if runs.is_dir() else []
    if not folders:
        raise InputError(f"{out} has no run folders (runs/<point>/seed<k>/) to pack")
    lost = sorted(str(p.relative_to(out)) for d in folders for p in d.iterdir()
                  if p.name not in PACKED_FILES and p.name not in ("checkpoint.pt", "final"))
    if remove and lost:
        raise InputError(f"packing {out} would lose {', '.join(lost[:5])}{' ...' if len(lost) > 5 else ''}")
    lines = []
    for d in folders:
        point, seed = _point_seed(runs, d)
        for name in PACKED_FILES:
            p = d / name
            if not p.exists():
                continue
            text = p.read_bytes().decode("utf-8")  # bytes: no newline translation, a '\r' is kept
            if name == "metrics.jsonl" and text:
                for i, ln in enumerate(_lines(text)):
                    lines.append({"point": point, "seed": seed, "file": name, "line": i, "text": ln})
            else:  # a whole file (an empty metrics.jsonl too: one row, line None, so it comes back)
                lines.append({"point": point, "seed": seed, "file": name, "line": None, "text": text})
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in lines).encode("utf-8")
    table = out / TABLE
    atomic_write(table, lambda tmp: tmp.write_bytes(gzip.compress(body, mtime=0)))
    if remove:
        check = Path(str(table) + ".check")
        shutil.rmtree(check, ignore_errors=True)
        unpack(out, check)
        for d in folders:
            for name in PACKED_FILES:
                if (d / name).exists() and (d / name).read_bytes() != (check / d.relative_to(runs) / name).read_bytes():
                    shutil.rmtree(check)
                    raise InputError(f"the table of {out} does not restore {d / name} exactly; nothing removed")
        shutil.rmtree(check)
        shutil.rmtree(runs)
    return table


def unpack(out: str | Path, dest: str | Path) -> Path:
    """Recreate the run folders of ``out``'s table under ``dest`` (``dest/<point>/seed<k>/<file>``; a table
    of one-run point folders, seed ``""``: ``dest/<point>/<file>``).

    Raises:
        CorruptFileError: the table is unreadable or holds a line that is not a run record.
    """
    table = Path(out) / TABLE
    dest = Path(dest)
    files: dict[tuple[str, str, str], list[str]] = {}
    with reading(table, "sweep run table"):
        for raw in _lines(gzip.decompress(table.read_bytes()).decode("utf-8")):
            r = json.loads(raw)
            seed = r["seed"] if isinstance(r["seed"], str) else f"seed{r['seed']}"
            files.setdefault((r["point"], seed, r["file"]), []).append(r["text"])
    for (point, seed, name), parts in files.items():
        d = dest / point / seed
        d.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes("".join(parts).encode("utf-8"))
    return dest


def runs_dir(out: str | Path) -> Path:
    """The folder holding a sweep's run folders: ``out/runs`` when it exists (or when there is no table),
    else the table unpacked once into ``$SINKLAB_HOME/unpacked/<sha256>`` (read-only use)."""
    out = Path(out)
    runs, table = out / "runs", out / TABLE
    if runs.is_dir() or not table.exists():
        return runs
    from sinklab.paths import cache_dir

    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
    dest = cache_dir("unpacked") / digest
    done = dest / ".complete"
    if not done.exists():
        with exclusive(dest.with_name(f".{dest.name}.lock")):  # one reader unpacks; another waits and reads it
            if not done.exists():
                tmp = dest.with_name(dest.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                unpack(out, tmp)
                (tmp / ".complete").write_text(str(table), encoding="utf-8")
                shutil.rmtree(dest, ignore_errors=True)
                tmp.rename(dest)
    return dest


def unpack_in_place(out: str | Path) -> bool:
    """Before training into a packed sweep folder: restore ``out/runs`` from the table (so finished runs are
    skipped, not trained again) and remove the table. Returns True when it unpacked."""
    out = Path(out)
    if (out / "runs").is_dir() or not (out / TABLE).exists():
        return False
    unpack(out, out / "runs")
    (out / TABLE).unlink()
    return True
