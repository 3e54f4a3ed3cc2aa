"""Command line interface: the ``sinklab`` command (``sinklab --help`` lists the commands).

* :mod:`sinklab.cli.main` -- the typer app :data:`cli` and :func:`app`, which runs it (bad input: one
  line, exit 2).
* :mod:`sinklab.cli.common` -- the options every command shares and the comma-list grammar.
* :mod:`sinklab.cli.docs` -- the CLI reference ``docs/cli.md``, generated from the app.
* ``*_cmd.py`` -- one module per command, each registering itself on :data:`cli`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"app": "sinklab.cli.main", "cli": "sinklab.cli.main"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
