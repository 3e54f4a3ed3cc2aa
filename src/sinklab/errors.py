"""User-facing errors.

Every error a user can cause with bad input derives from :class:`SinklabError`.
The CLI prints the message of such an error and exits with status 2, without a
traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class SinklabError(Exception):
    """Base class of errors caused by input, configuration or the environment."""


class UnknownNameError(SinklabError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class FetchError(SinklabError):
    """A package could not be downloaded from its registry."""


class ChecksumError(FetchError):
    """A downloaded file's sha256 does not match the recipe."""


class InputError(SinklabError, ValueError):
    """An argument is out of range or inconsistent (sequence length, eps, corpus size...)."""


class ConfigError(SinklabError, ValueError):
    """A config file or override is invalid (unknown key, bad value, incompatible choices)."""


class CorruptFileError(InputError):
    """A file sinklab reads is truncated, garbage, unreadable or not in the expected format (the message
    names it)."""


class CaptureError(SinklabError):
    """Attention statistics cannot be captured from this model."""


def plural(n: int, word: str) -> str:
    """``1 document``, ``0 documents``, ``2 documents``: counts in error messages."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
