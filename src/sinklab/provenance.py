"""Which code produced a result: the git commit of the sinklab source tree.

Every training run records :func:`code_version` in its ``summary.json`` so that ``sinklab report``
can flag study rows produced by a different code version than the rest of their study.
"""

from __future__ import annotations

import subprocess
from functools import lru_cache
from pathlib import Path

import sinklab


@lru_cache(maxsize=1)
def code_version() -> dict:
    """``{"commit": sha or None, "dirty": bool or None, "version": package version}``.

    ``commit`` is the ``HEAD`` of the git checkout that holds the imported ``sinklab`` package
    (None for an installed copy outside git, or when git is missing); ``dirty`` tells whether
    tracked files under ``src/sinklab`` differ from that commit (results then come from
    uncommitted code). Never raises.
    """
    pkg = Path(sinklab.__file__).resolve().parent
    out = {"commit": None, "dirty": None, "version": getattr(sinklab, "__version__", None)}
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
