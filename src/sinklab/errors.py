"""User-facing errors.

Every error a user can cause with bad input derives from :class:`SinklabError`.
The CLI prints the message of such an error and exits with status 2, without a
traceback; anything else is a bug and keeps its traceback.

Messages name the parameter the caller gave, marked with :func:`param`: a Python caller reads the
parameter's name (``eps must lie in (0, 1)``), the CLI its option (``--eps must lie in (0, 1)``,
:func:`sinklab.cli.common.cli_text`). One mechanism for every message: library code never writes a flag.
"""

from __future__ import annotations

import re
from typing import Any, Callable

# a parameter inside a message: OPEN name [SEP python-repr SEP cli-value] CLOSE (control characters no
# message contains otherwise)
_OPEN, _SEP, _CLOSE = "\x02", "\x1f", "\x03"
_MARK = re.compile("\x02([^\x1f\x03]*)(?:\x1f([^\x1f\x03]*)\x1f([^\x03]*))?\x03")
_NO_VALUE = object()


def param(name: str, value: Any = _NO_VALUE) -> str:
    """A parameter named inside a message, shown as the caller knows it.

    ``name`` is the keyword of the public function (``"eps"``, ``"num_samples"``) or a dotted config key
    (``"data.max_epochs"``). :func:`render` (what ``str(error)`` shows) writes ``eps`` or, with a
    ``value``, ``eps=0.5``; the CLI (:func:`sinklab.cli.common.cli_text`) writes ``--eps`` / ``--eps 0.5``
    (``--flag`` for True, ``--no-flag`` for False) and ``--set data.max_epochs=3`` for a config key.

    >>> render(f"{param('eps')} must lie in (0, 1), got 2")
    'eps must lie in (0, 1), got 2'
    """
    if value is _NO_VALUE:
        return f"{_OPEN}{name}{_CLOSE}"
    cli = "" if value is True else ("\0" if value is False else str(value))  # \0: False, --no-flag
    return f"{_OPEN}{name}{_SEP}{value!r}{_SEP}{cli}{_CLOSE}"


def render(text: str, spell: Callable[[str, str | None], str] | None = None) -> str:
    """``text`` with each :func:`param` mark written out: by ``spell(name, value)`` (``value``: the CLI
    form of the value given to :func:`param`, ``""`` for True, ``"\0"`` for False, None without one),
    else as Python reads it (``name`` / ``name=value``)."""

    def one(m: re.Match) -> str:
        name, py, cli = m.group(1), m.group(2), m.group(3)
        if spell is not None:
            return spell(name, cli)
        return name if py is None else f"{name}={py}"

    return _MARK.sub(one, str(text))


class SinklabError(Exception):
    """Base class of errors caused by input, configuration or the environment.

    The message may name parameters with :func:`param`; ``str(error)`` writes them as Python names,
    :attr:`marked` keeps the marks (for the CLI, which writes its options)."""

    @property
    def marked(self) -> str:
        """The message with its :func:`param` marks."""
        return str(self.args[0]) if self.args else ""

    def __str__(self) -> str:
        return render(self.marked) if len(self.args) == 1 else super().__str__()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class UnknownNameError(SinklabError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return render(self.marked)


class FetchError(SinklabError):
    """A package could not be downloaded from its registry."""


class ChecksumError(FetchError):
    """A downloaded file's sha256 does not match the recipe."""


class InputError(SinklabError, ValueError):
    """An argument is out of range or inconsistent (sequence length, eps, corpus size...)."""


class ConfigError(SinklabError, ValueError):
    """A config file or override is invalid (unknown key, bad value, incompatible choices)."""


class NonFiniteMassError(InputError):
    """An attention mass holds a NaN (a numerically broken forward): a sink rate would count it as no sink."""


class CorruptFileError(InputError):
    """A file sinklab reads is truncated, garbage, unreadable or not in the expected format (the message
    names it)."""


class CaptureError(SinklabError):
    """Attention statistics cannot be captured from this model."""


class MissingExtraError(SinklabError, ImportError):
    """A feature needs a package of an optional extra (``pip install 'sinklab[EXTRA]'``) that is not installed."""


#: the optional extras (pyproject.toml's [project.optional-dependencies]) and what each adds
EXTRAS = {
    "zoo": "the zoo's GGUF models, Wikipedia corpus and dataset files (gguf, mwparserfromhell, datasets, pyarrow)",
    "tensorboard": "TensorBoard logging of training runs (tensorboard)",
    "studies": "the studies' statistics, sinklab sweep | report (scipy)",
    "slurm": "sinklab sweep --launcher slurm | submitit-local (submitit)",
}


def require(module: str, extra: str, what: str):
    """Import ``module`` of the optional extra ``extra``, or refuse in one line naming the extra.

    Args:
        module: the module to import, e.g. ``"scipy.stats"``.
        extra: the extra that installs it (a key of :data:`EXTRAS`).
        what: the feature that needs it, for the message (``"sinklab sweep --launcher slurm"``).

    Returns:
        The module.

    Raises:
        MissingExtraError: ``module``'s package is not installed (``{what} needs {package}: pip install
            'sinklab[{extra}]'``). An import error inside the installed package is raised as it is.
    """
    import importlib

    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; one of {', '.join(EXTRAS)}")
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != top:  # the package is there, something it needs is not
            raise
        raise MissingExtraError(f"{what} needs {top}, which is not installed: pip install 'sinklab[{extra}]' "
                                f"(or 'sinklab[all]')") from None


def plural(n: int, word: str) -> str:
    """``1 document``, ``0 documents``, ``2 documents``: counts in error messages."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
