"""Which code produced a result: the git commit of the sinklab source tree.

Every training run records :func:`code_version` in its ``summary.json`` (``code``, and ``code_starts``: every
start's) so that ``sinklab report`` can flag study rows produced by a different code version than the rest
of their study, and can find the training-code fingerprint that the study tool computed for that source
(:mod:`sinklab.sweep.fingerprints`).
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

import sinklab


def source_digest() -> str:
    """SHA-256 (64 hex digits) of the imported sinklab package's source files (``*.py``, ``*.toml``, ``*.cpp``, with
    their paths relative to the package): the code itself, committed or not (a commit plus its dirty
    diff, or an installed copy outside git). About 10 ms."""
    pkg = Path(sinklab.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for p in pkg.rglob("*") if p.suffix in (".py", ".toml", ".cpp") and "__pycache__" not in p.parts):
        h.update(str(f.relative_to(pkg)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"commit": sha or None, "dirty": bool or None, "version": package version, "source": digest}``,
    computed once per process.

    ``commit`` is the ``HEAD`` of the git checkout that holds the imported ``sinklab`` package
    (None for an installed copy outside git, or when git is missing); ``dirty`` tells whether
    tracked files under ``src/sinklab`` differ from that commit (results then come from
    uncommitted code); ``source`` is :func:`source_digest` (None when the files cannot be read),
    which tells two dirty trees apart. Never raises.
    """
    pkg = Path(sinklab.__file__).resolve().parent
    out = {"commit": None, "dirty": None, "version": getattr(sinklab, "__version__", None), "source": None}
    try:
        out["source"] = source_digest()
    except OSError:
        pass
    try:
        top = subprocess.run(["git", "-C", str(pkg), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10)
        if top.returncode != 0:
            return out
        root = top.stdout.strip()
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            out["commit"] = head.stdout.strip()
        st = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", str(pkg)],
                            capture_output=True, text=True, timeout=10)
        if st.returncode == 0:
            out["dirty"] = bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def commit_label(width: int = 12) -> str:
    """The code's commit as a short label for a results file: the first ``width`` hex digits of
    :func:`code_version`'s commit, ``+dirty`` when ``src/sinklab`` differs from it, ``unknown`` outside git."""
    cv = code_version()
    if not cv["commit"]:
        return "unknown"
    return cv["commit"][:width] + ("+dirty" if cv["dirty"] else "")
