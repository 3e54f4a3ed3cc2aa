"""A small name -> object registry used for every swappable component.

Registries map names to builders, reject duplicate names, and list the valid
names (plus the nearest match) when a lookup fails. They are the only way the
model, the zoo and the CLI pick a component, so configs can store plain names.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Generic, Iterator, TypeVar

from sinklab.errors import UnknownNameError

T = TypeVar("T")


def nearest(name: str, choices: list[str]) -> str | None:
    """Return the closest string to ``name`` among ``choices`` (difflib ratio), or None."""
    match = difflib.get_close_matches(name, choices, n=1, cutoff=0.5)
    return match[0] if match else None


def first_unknown(keys, valid: list[str], what: str) -> str | None:
    """The message for the first of ``keys`` not in ``valid`` (``"{what} 'kye' (did you mean 'key'?); valid keys:
    ..."``), or None when every key is known: what a config table or a function's keyword options say of a typo."""
    for k in keys:
        if k not in valid:
            hint = nearest(k, valid)
            return f"{what} {k!r}" + (f" (did you mean {hint!r}?)" if hint else "") + f"; valid keys: {', '.join(valid)}"
    return None


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    description: str


class Registry(Generic[T]):
    """Mapping from unique names to objects (usually builders or recipes).

    Args:
        kind: what the registry holds, used in error messages ("attention operation").

    Raises:
        ValueError: on registering a name twice.
        UnknownNameError: on looking up a name that is not registered; the message
            lists every valid name and the nearest one.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, obj: T | None = None, *, description: str = "",
                 before: str | None = None) -> Callable[[T], T] | T:
        """Register ``obj`` under ``name``; without ``obj`` act as a decorator.

        Names keep their registration order (:meth:`names`, iteration); ``before`` (a registered
        name) places the new entry in front of that one instead of at the end, for registries
        whose order is a priority (:data:`sinklab.nn.attention.ATTENTION_PATHS`).

        Raises:
            ValueError: ``name`` is already registered.
            UnknownNameError: ``before`` is not registered.
        """
        if before is not None:
            self.get(before)

        def add(o: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            desc = description or (getattr(o, "__doc__", None) or "").strip().split("\n")[0]
            entry = Entry(name, o, desc)
            if before is None:
                self._entries[name] = entry
            else:
                items = list(self._entries.items())
                at = [n for n, _ in items].index(before)
                self._entries = dict(items[:at] + [(name, entry)] + items[at:])
            return o

        if obj is not None:
            return add(obj)
        return add

    def get(self, name: str) -> T:
        """Return the object registered under ``name``."""
        try:
            return self._entries[name].obj
        except KeyError:
            names = sorted(self._entries)
            hint = nearest(name, names)
            msg = f"unknown {self.kind} {name!r}"
            if hint:
                msg += f" (did you mean {hint!r}?)"
            msg += f"; valid names: {', '.join(names)}"
            raise UnknownNameError(msg) from None

    def describe(self, name: str) -> str:
        self.get(name)
        return self._entries[name].description

    def names(self) -> list[str]:
        return list(self._entries)

    def items(self) -> list[tuple[str, T]]:
        """(name, object) pairs in registration order."""
        return [(n, e.obj) for n, e in self._entries.items()]

    def remove(self, name: str) -> T:
        """Unregister ``name`` and return its object.

        Raises:
            UnknownNameError: ``name`` is not registered.
        """
        obj = self.get(name)
        del self._entries[name]
        return obj

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
