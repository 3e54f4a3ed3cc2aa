"""Where sinklab keeps downloads and caches.

``$SINKLAB_HOME`` (default ``~/.cache/sinklab``) holds ``models/<name>/``,
``corpora/<name>/`` and ``downloads/``.
"""

from __future__ import annotations

import os
from pathlib import Path


def home() -> Path:
    """Root of sinklab's cache folder; created on first use."""
    root = Path(os.environ.get("SINKLAB_HOME", Path.home() / ".cache" / "sinklab")).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_dir(*parts: str) -> Path:
    """A sub-folder of :func:`home`, created on first use."""
    d = home().joinpath(*parts)
    d.mkdir(parents=True, exist_ok=True)
    return d
