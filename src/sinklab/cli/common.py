"""What the commands share: the ``--threads`` option, the check of every output location and the command
line a result records (:func:`invoked_command`).

Every command that writes calls :func:`check_outputs` first thing, before any model, corpus or
data work: an output folder, a report file or ``SINKLAB_HOME`` that cannot be written is refused
in one line (exit 2) instead of after minutes of work.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

import typer

#: ``--threads N`` of every command that runs a model (one definition; typer copies nothing from it)
THREADS: Optional[int] = typer.Option(
    None, "--threads", min=1, help="torch CPU threads (default: torch's own choice, about one per core)")


def use_threads(threads: int | None) -> None:
    """Apply ``--threads`` to this process (``torch.set_num_threads``); None leaves torch's setting."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def check_outputs(folders: Iterable[tuple[str, str | os.PathLike]] = (),
                  files: Iterable[tuple[str, str | os.PathLike]] = (), *, home: bool = True) -> None:
    """Refuse output locations that cannot be written, before any work.

    Args:
        folders: (flag, path) of folders the command creates or fills, e.g. ``[("--out", out)]``.
        files: (flag, path) of files it writes, e.g. ``[("--out", "REPORT.md")]``.
        home: also check sinklab's cache folder (``$SINKLAB_HOME``, default ``~/.cache/sinklab``),
            for commands that fetch, cache or tokenize.

    Raises:
        InputError: names the location and why it cannot be written
            (:func:`sinklab.fileio.check_writable`).
    """
    from sinklab.fileio import check_writable
    from sinklab.paths import home_path

    for flag, path in folders:
        check_writable(path, flag)
    for flag, path in files:
        check_writable(path, flag, folder=False)
    if home:
        where = home_path()
        what = "SINKLAB_HOME=" if "SINKLAB_HOME" in os.environ else "sinklab's cache folder (set SINKLAB_HOME to move it)"
        check_writable(where, what)


def invoked_command() -> str:
    """The ``sinklab`` command line of this CLI run, as typed (shell-quoted, :func:`sinklab.result.command_of`):
    the arguments :func:`sinklab.cli.main.app` received, which it keeps on the root click context; outside
    ``app`` (a command function called directly), ``sys.argv``. Library code never reads ``sys.argv``: the
    CLI passes this to what it calls (``Result.command``)."""
    import sys

    from sinklab.result import command_of

    try:
        from typer._click.globals import get_current_context
    except ImportError:  # pragma: no cover - older typer on click
        from click import get_current_context
    ctx = get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    if isinstance(obj, dict) and "argv" in obj:
        return command_of(obj["argv"])
    return command_of(sys.argv[1:])


__all__ = ["THREADS", "use_threads", "check_outputs", "invoked_command"]
