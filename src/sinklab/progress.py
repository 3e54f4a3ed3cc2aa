"""Progress of long loops (training steps, probe batches, stream positions): a live bar on a
terminal, plain lines in a log file.

:func:`progress` is the one helper that training, measurement and streaming use. When stderr is a
terminal it is a ``tqdm`` bar. Otherwise (``sinklab train ... 2> log``, a pipe, a sweep's
``train.log``) it prints a plain line to stderr every :data:`EVERY_FRACTION` of the total (10 %) or
every :data:`EVERY_S` seconds (30 s), whichever comes first, and at the end; never a carriage
return or a cursor code::

    train: step 40/400 (10%), 12.3 s elapsed, about 1 min 51 s left; loss 3.210, tok/s 1,234
"""

from __future__ import annotations

import sys
import time
from typing import Any, Iterable, Iterator, TextIO

#: a plain line every this share of the total ...
EVERY_FRACTION = 0.1
#: ... or after this many seconds without one, whichever comes first
EVERY_S = 30.0


def _duration(s: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"


class PlainProgress:
    """The log-file form of :func:`progress`: the tqdm methods sinklab uses (``update``,
    ``set_postfix``, ``set_postfix_str``, ``close``, iteration, ``with``), printing plain lines.

    Args:
        iterable: iterated over by ``for x in bar`` (each item counts one ``unit``).
        total: number of units (``len(iterable)`` when None and it has one); None = unknown, then
            a line every :data:`EVERY_S` seconds only.
        desc: what is counted, starts every line (``train``, ``probe``...).
        unit: the unit's name, printed before the count (``step 40/400``).
        initial: units already done (a resumed run), counted in the total but not in the rate.
        stream: where lines go (default ``sys.stderr``).
        clock: seconds (``time.monotonic``); tests pass a fake one.
    """

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "step", initial: int = 0, stream: TextIO | None = None, clock=time.monotonic) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self.initial = initial
        self.stream, self.clock = stream, clock
        self.t0 = self.t_last = clock()
        self.postfix = ""
        self.printed_at = initial
        self.closed = False

    # ---- the tqdm interface
    def __iter__(self) -> Iterator:
        for x in self.iterable or ():
            yield x
            self.update(1)
        self.close()

    def __enter__(self) -> "PlainProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kw: Any) -> None:
        items = {**(ordered_dict or {}), **kw}
        self.postfix = ", ".join(f"{k} {v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self._crossed() or now - self.t_last >= EVERY_S:
            self._print(now)

    def close(self) -> None:
        if not self.closed and self.n != self.printed_at:
            self._print(self.clock())
        self.closed = True

    # ---- lines
    def _crossed(self) -> bool:
        """True when ``n`` passed the next multiple of EVERY_FRACTION of the total (or reached it)."""
        if not self.total:
            return False
        step = EVERY_FRACTION * self.total
        return int(self.n / step + 1e-9) > int(self.printed_at / step + 1e-9) or self.n >= self.total

    def line(self, now: float | None = None) -> str:
        """The plain line for the current count."""
        now = self.clock() if now is None else now
        elapsed = now - self.t0
        head = f"{self.desc}: " if self.desc else ""
        if self.total:
            text = f"{head}{self.unit} {self.n}/{self.total} ({100 * self.n / self.total:.0f}%), {_duration(elapsed)} elapsed"
            done = self.n - self.initial
            if 0 < done and self.n < self.total:
                text += f", about {_duration(elapsed / done * (self.total - self.n))} left"
        else:
            text = f"{head}{self.unit} {self.n}, {_duration(elapsed)} elapsed"
        return text + (f"; {self.postfix}" if self.postfix else "")

    def _print(self, now: float) -> None:
        if self.total and self.n > self.total:  # more updates than announced: say so, do not print 110%
            self.total = self.n
        out = self.stream or sys.stderr
        print(self.line(now), file=out, flush=True)
        self.t_last, self.printed_at = now, self.n


class _Off:
    """:func:`progress` with ``enabled=False``: iterates, counts nothing, prints nothing."""

    def __init__(self, iterable: Iterable | None = None) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self.iterable or ())

    def __enter__(self) -> "_Off":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, *a, **kw) -> None:
        pass

    def set_postfix_str(self, *a, **kw) -> None:
        pass

    def close(self) -> None:
        pass


def is_terminal(stream: TextIO | None = None) -> bool:
    """True when ``stream`` (default stderr) is an interactive terminal."""
    s = stream or sys.stderr
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "step",
             initial: int = 0, enabled: bool = True, leave: bool = False, stream: TextIO | None = None):
    """A progress display over ``iterable`` (or updated by hand with ``update(n)``).

    Args:
        iterable, total, desc, unit, initial: as for ``tqdm``.
        enabled: False: nothing is shown (``--no-progress``, a torchrun rank other than 0).
        leave: keep the terminal bar when done (plain lines always stay).
        stream: where it goes (default stderr).

    Returns:
        a ``tqdm`` bar when ``stream`` is a terminal, else a :class:`PlainProgress`; both support
        iteration, ``with``, ``update``, ``set_postfix``, ``set_postfix_str`` and ``close``.
    """
    if not enabled:
        return _Off(iterable)
    if is_terminal(stream):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave, dynamic_ncols=True,
                    file=stream, mininterval=0.5)
    return PlainProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, stream=stream)


__all__ = ["progress", "PlainProgress", "is_terminal", "EVERY_FRACTION", "EVERY_S"]
