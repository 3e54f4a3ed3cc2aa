"""One result type: what ``measure``, ``compare``, ``analyze``, ``stream`` and ``train`` return.

Every feature's result is a :class:`Result` subclass with the same four methods: ``save(out)`` writes
it into the folder ``out`` (its own files, unchanged: ``results.json``, ``compare.json``,
``analysis.json``, ``stream.json``, ``train_result.json``, with their CSVs and plots), ``load(path)``
reads it back (the folder or its main file), ``table()`` gives its main table as a pandas DataFrame and
``to_dict()`` the JSON content. ``repr(result)`` is a few lines (the headline figures and where the tables
are, :meth:`Result.headline` and :meth:`Result.guide`), ``_repr_html_`` the same for a notebook. The command that made a result and the versions behind it are recorded
one way: :attr:`Result.command` (the CLI passes :func:`command_of` of the arguments it was given --
library code never reads ``sys.argv``; a Python call records how it was called) and :func:`versions`.

This module is in the core layer: it imports nothing of sinklab but :mod:`sinklab.errors`,
:mod:`sinklab.fileio` and :mod:`sinklab.provenance`.
"""

from __future__ import annotations

import html
import json
import platform
import shlex
from pathlib import Path
from typing import Any, ClassVar, Sequence


def command_of(argv: Sequence[str], prog: str = "sinklab") -> str:
    """The command line ``prog argv...`` as one shell-quoted string (what :attr:`Result.command` holds
    for a result made by the CLI; ``argv`` without the program name, as typed)."""
    return " ".join(shlex.quote(str(a)) for a in [prog, *argv])


def python_call(function: str, *args: str, **kwargs: Any) -> str:
    """How a result made in Python was called, marked as such: ``python: FUNCTION(ARGS, K=V!r, ...)``
    (``args`` already written as wanted; keyword values with ``repr``; None values left out). What
    :attr:`Result.command` holds for a Python call of a function that has no equivalent command line
    (``sinklab.analyze.KIND``, ``sinklab.train.train``); ``measure`` and ``stream`` record instead the
    ``sinklab`` command that reproduces the call."""
    parts = [*args, *(f"{k}={v!r}" for k, v in kwargs.items() if v is not None)]
    return f"python: {function}({', '.join(parts)})"


def package_version(name: str) -> str:
    """The installed version of distribution ``name``: the module's ``__version__`` when it is imported
    already, else the installed metadata's (without importing the package); ``"not installed"`` when there
    is neither."""
    import sys
    from importlib import metadata

    mod = sys.modules.get(name)
    if getattr(mod, "__version__", None):
        return str(mod.__version__)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Versions of Python and of the packages that determine the numbers: ``sinklab``, ``torch``,
    ``transformers``, ``python``. transformers' is :func:`package_version`'s (not imported for it; its
    ``__version__`` when imported already, else the installed metadata's, ``"not installed"`` without one)."""
    import torch

    import sinklab

    return {
        "sinklab": sinklab.__version__,
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
    }


def resolve_file(path: str | Path, name: str, what: str) -> Path:
    """``path`` itself when it is a file, else ``path / name``.

    Raises:
        InputError: no such file (names ``what`` it should hold).
    """
    from sinklab.errors import InputError

    p = Path(path)
    f = p / name if p.is_dir() else p
    if not f.exists():
        raise InputError(f"no {name} at {p} ({what})")
    return f


class Result:
    """Base of every feature's result.

    Subclasses set :attr:`FILE` (the main file ``save`` writes) and :attr:`WHAT` (what it holds, for
    messages) and implement :meth:`to_dict`, :meth:`table` and :meth:`from_dict`; :meth:`save` writes
    ``to_dict()`` as ``FILE`` by default (subclasses that write more override it), :meth:`load` reads
    ``FILE`` and calls :meth:`from_dict`.

    Attributes:
        command: the command that made the result (``sinklab ...`` from the CLI, else the Python call).
    """

    FILE: ClassVar[str] = "result.json"
    WHAT: ClassVar[str] = "a sinklab result"
    command: str  # each subclass holds it (a dataclass field, or read from its dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON content of :attr:`FILE`."""
        raise NotImplementedError

    def title(self) -> str:
        """The first line of the repr: the class and what the result is of (subclasses add to it)."""
        return type(self).__name__

    def headline(self) -> list[tuple[str, str]]:
        """The headline figures the repr shows: (label, value as text) pairs, a few at most."""
        return []

    def guide(self) -> list[tuple[str, str]]:
        """Where the tables and the rest are: (how to reach it, what it holds) pairs."""
        return [(".table()", "the main table (pandas DataFrame)"), (".save(out)", f"writes {self.FILE}")]

    def _repr_lines(self) -> list[tuple[str, str]]:
        cmd = self.command or ""
        rows = [*self.headline(), *([("command", cmd)] if cmd else []), *self.guide()]
        return [(k, _clip(v)) for k, v in rows]

    def __repr__(self) -> str:
        """A few lines: the title, the headline figures, the command, where the tables are (every value
        clipped to 100 characters)."""
        rows = self._repr_lines()
        w = max((len(k) for k, _ in rows), default=0)
        return "\n".join([self.title(), *(f"  {k.ljust(w)}  {v}" for k, v in rows)])

    def _repr_html_(self) -> str:
        """The repr as an HTML table (Jupyter)."""
        rows = "".join(f"<tr><td style='text-align:left'><code>{html.escape(k)}</code></td>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in self._repr_lines())
        return f"<div><strong>{html.escape(self.title())}</strong><table>{rows}</table></div>"

    def table(self):
        """The result's main table (pandas DataFrame)."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path | None = None) -> "Result":
        """The result from the content of its :attr:`FILE` (``folder``: where it was read, for side files)."""
        raise NotImplementedError

    def save(self, out: str | Path) -> Path:
        """Write :attr:`FILE` into the folder ``out`` (created); returns ``out``.

        Raises:
            InputError: ``out`` is a file.
        """
        from sinklab.fileio import atomic_write_text

        out = out_folder(out)
        atomic_write_text(out / self.FILE, json.dumps(self.to_dict(), indent=1) + "\n")
        return out

    @classmethod
    def load(cls, path: str | Path) -> "Result":
        """Read a result saved by :meth:`save` (its folder or its :attr:`FILE`). On this base class,
        ``Result.load(path)`` reads any feature's result: the class is the one whose main file
        (:data:`RESULT_FILES`) ``path`` is or holds.

        Raises:
            InputError: no such file; on the base class, a folder with no result file or with several (names
                them). CorruptFileError: the file is not valid JSON.
        """
        from sinklab.fileio import read_json

        if cls is Result:
            return _result_class(path).load(path)
        f = resolve_file(path, cls.FILE, cls.WHAT)
        return cls.from_dict(read_json(f, cls.WHAT), f.parent)


#: each feature's main result file -> the :class:`Result` subclass that reads it (module, class name), for
#: :meth:`Result.load` on the base class; named as strings and imported on use, as the package's own
#: top-level names are (``sinklab.__init__``): this core module imports no feature
RESULT_FILES: dict[str, tuple[str, str]] = {
    "results.json": ("sinklab.measure.run", "MeasureResult"),
    "compare.json": ("sinklab.measure.compare", "CompareResult"),
    "analysis.json": ("sinklab.analyze.common", "AnalysisResult"),
    "stream.json": ("sinklab.streaming.run", "StreamResult"),
    "passkey.json": ("sinklab.streaming.run", "PasskeyResult"),
    "tasks.json": ("sinklab.streaming.longctx", "TaskResult"),
    "train_result.json": ("sinklab.train.loop", "TrainResult"),
}


def _result_class(path: str | Path) -> type:
    """The :class:`Result` subclass of the result file ``path`` (by its name) or of the one result file in the
    folder ``path``.

    Raises:
        InputError: no such file or folder; a file that is no result file; a folder with none or several.
    """
    import importlib

    from sinklab.errors import InputError

    p = Path(path)
    known = ", ".join(RESULT_FILES)
    if p.is_dir():
        found = [name for name in RESULT_FILES if (p / name).is_file()]
        if len(found) != 1:
            what = "no sinklab result file" if not found else f"several result files ({', '.join(found)})"
            raise InputError(f"{what} in {p}: Result.load reads a folder with one of {known}; load several with "
                             "their own classes (e.g. MeasureResult.load)")
        name = found[0]
    elif p.is_file():
        if p.name not in RESULT_FILES:
            raise InputError(f"{p} is not a sinklab result file ({known})")
        name = p.name
    else:
        raise InputError(f"no result at {p}: no such file or folder")
    module, attr = RESULT_FILES[name]
    return getattr(importlib.import_module(module), attr)


def _clip(text: Any, n: int = 100) -> str:
    """``text`` on one line, cut to ``n`` characters (an ellipsis marks the cut)."""
    t = " ".join(str(text).split())
    return t if len(t) <= n else t[: n - 1] + "…"


def percents(values: Sequence[float], k: int = 4) -> str:
    """``98.2%, 10.3%, ...``: the first ``k`` values in percent (the rest counted)."""
    shown = ", ".join(f"{float(v):.1f}%" for v in list(values)[:k])
    more = len(values) - k
    return shown + (f" (+{more} more)" if more > 0 else "")


def out_folder(out: str | Path) -> Path:
    """``out`` as a folder, created (every ``Result.save`` writes into one).

    Raises:
        InputError: ``out`` is a file (the message names the parameter ``out``).
    """
    from sinklab.errors import InputError, param

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{param('out', str(out))} is a file; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    return out


class DictResult(Result, dict):
    """A result that is its JSON content, a dict (``stream.json``, ``passkey.json``): indexing works as on
    the dict read from the file; :meth:`table` is the DataFrame of its ``configs`` list (one row each)."""

    FILE = "stream.json"
    WHAT = "stream results"

    @property
    def command(self) -> str:  # type: ignore[override]
        return self.get("command") or ""

    def to_dict(self) -> dict[str, Any]:
        return dict(self)

    def table(self):
        import pandas as pd

        return pd.DataFrame(self.get("configs", []))

    def headline(self) -> list[tuple[str, str]]:
        """The scalar entries (model, corpus, tokens, ...) and the configurations' names."""
        rows = [(k, str(v)) for k, v in self.items() if isinstance(v, (str, int, float, bool)) and k != "command"][:6]
        configs = self.get("configs") or []
        names = [str(c.get("name", c.get("config", i))) if isinstance(c, dict) else str(c) for i, c in enumerate(configs)]
        return rows + ([("configs", f"{len(configs)}: {', '.join(names)}")] if configs else [])

    def guide(self) -> list[tuple[str, str]]:
        return [(".table()", f"DataFrame, one row per configuration ({len(self.get('configs') or [])} rows)"),
                ("[key]", f"the {self.FILE} content: {', '.join(self)}"),
                (".save(out)", f"writes {self.FILE} with its CSV tables and plot")]

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path | None = None) -> "DictResult":
        return cls(data)


__all__ = ["Result", "DictResult", "RESULT_FILES", "command_of", "python_call", "versions", "resolve_file", "percents"]
