"""Where sinklab keeps downloads and caches.

``$SINKLAB_HOME`` (default ``~/.cache/sinklab``) holds ``models/<name>/``,
``corpora/<name>/`` and ``downloads/``.
"""

from __future__ import annotations

import os
from pathlib import Path


def home_path() -> Path:
    """Root of sinklab's cache folder, ``$SINKLAB_HOME`` or ``~/.cache/sinklab`` (not created)."""
    return Path(os.environ.get("SINKLAB_HOME", Path.home() / ".cache" / "sinklab")).expanduser()


def home() -> Path:
    """Root of sinklab's cache folder; created on first use."""
    root = home_path()
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(*parts: str) -> Path:
    """A sub-folder of :func:`home`, created on first use."""
    d = home().joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    return d
