"""What the commands share: one definition of each common option, the comma-list parser, the
default model, and the check of every output location.

The grammar every command follows:

* lists are comma-separated values after one flag: ``--layers 0,1,2``, ``--sinks 0,1,2,4,8``
  (:func:`list_option` + :func:`split_list`; repeating the flag adds to the list);
* the same short option means the same thing everywhere: ``-n`` = ``--num-samples``,
  ``-t`` = ``--seq-len``, ``-k`` = ``--positions``, ``-w`` = ``--window``, ``-j`` = ``--jobs``;
* every command that runs a model takes ``--device``, ``--dtype``, ``--device-map`` and ``--threads``
  (checked by :func:`sinklab.subject.resolve_device`: ``--device cuda`` without CUDA is one line, exit 2);
* ``--out`` is always a folder;
* library messages name Python parameters (:func:`sinklab.errors.param`); the CLI writes them as its
  options (:func:`cli_text`: ``num_samples`` -> ``--num-samples``, a config key ``data.max_epochs``
  -> ``--set data.max_epochs=...``).

Every command that writes calls :func:`check_outputs` first thing, before any model, corpus or
data work: an output folder or ``SINKLAB_HOME`` that cannot be written is refused in one line
(exit 2) instead of after minutes of work.

The ``*_option`` functions return a fresh ``typer.Option`` (typer reads the option from a
parameter's default value), so each command can give its own help text and default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import typer
from typer.core import TyperGroup

from sinklab.models.load import DTYPE_NAMES  # the dtype names of ``--dtype`` (one list: load_model's)
from sinklab.zoo.models import DEFAULT_MODEL


def split_list(values: str | Sequence[str] | None, cast: Callable[[str], Any] = str, flag: str = "") -> list | None:
    """Parse a comma-list option: ``"0,1,2"`` -> ``[0, 1, 2]`` with ``cast=int``.

    Args:
        values: None (option not given), one string, or the strings of a repeated option (each may
            hold commas: ``["0,1", "2"]`` -> ``[0, 1, 2]``). Blank items are skipped.
        cast: applied to each stripped item (``int``, ``float``, ``str``).
        flag: the option's name, for the error message.

    Returns:
        The flat list in the order given, or None when ``values`` is None or holds no item.

    Raises:
        InputError: an item ``cast`` rejects (names the flag, the item and the expected form).
    """
    from sinklab.errors import InputError

    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    items = [x.strip() for v in values for x in str(v).split(",") if x.strip()]
    if not items:
        return None
    out = []
    for x in items:
        try:
            out.append(cast(x))
        except ValueError:
            kind = {int: "integers", float: "numbers"}.get(cast, "values")
            raise InputError(f"{flag or 'option'} takes comma-separated {kind}, e.g. 0,1,2; got {x!r}") from None
    return out


def list_option(flag: str, help: str, *decls: str) -> Any:
    """A comma-list option (``--flag A,B,C``; repeating the flag adds to the list). The command
    declares it ``Optional[list[str]]`` and parses it with :func:`split_list`."""
    return typer.Option(None, flag, *decls, help=help, metavar="A,B,...")


def model_option(help: str, default: Any = DEFAULT_MODEL) -> Any:
    """``--model``: a zoo name, model folder, run folder or hub id (default :data:`DEFAULT_MODEL`)."""
    return typer.Option(default, "--model", help=help)


def num_samples_option(help: str, default: Optional[int] = None) -> Any:
    """``--num-samples`` / ``-n``: number of probe sequences N."""
    return typer.Option(default, "--num-samples", "-n", help=help)


def seq_len_option(help: str, default: Optional[int] = None) -> Any:
    """``--seq-len`` / ``-t``: tokens per sequence T."""
    return typer.Option(default, "--seq-len", "-t", help=help)


def device_option(default: str = "cpu",
                  help: str = "cpu | cuda | cuda:N | auto (CUDA when available)") -> Any:
    """``--device``: where the model runs."""
    return typer.Option(default, "--device", help=help)


def dtype_option(help: str = "float32 | bfloat16 | float16 | float64 (default: bfloat16 on CUDA, float32 otherwise)") -> Any:
    """``--dtype``: the model's parameter dtype (None: the command's default)."""
    return typer.Option(None, "--dtype", help=help)


def device_map_option(help: str = "auto: spread the model over the GPUs, CPU and disk with accelerate (models that "
                                  "do not fit one device)") -> Any:
    """``--device-map``: ``auto`` (accelerate's placement) or not given (one device, ``--device``)."""
    return typer.Option(None, "--device-map", help=help)


def threads_option(help: str = "torch CPU threads (default: torch's own choice, about one per core)") -> Any:
    """``--threads N``: torch intra-op CPU threads (:func:`use_threads`)."""
    return typer.Option(None, "--threads", min=1, help=help)


def out_option(default: Optional[Path], help: str = "output folder") -> Any:
    """``--out``: always a folder (commands write fixed file names into it)."""
    return typer.Option(default, "--out", help=help)


#: ``--threads N`` of every command that runs a model (one definition; typer copies nothing from it)
THREADS: Optional[int] = threads_option()


def use_threads(threads: int | None) -> None:
    """Apply ``--threads`` to this process (``torch.set_num_threads``); None leaves torch's setting."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


#: library parameters whose option is not ``--`` + the name in kebab case (``sinklab stream --policy`` fills
#: ``stream(policies=...)``, ``sinklab sweep --time`` ``SlurmOptions.time_min``)
OPTION_OF: dict[str, str] = {"policies": "--policy", "budgets": "--budget", "time_min": "--time"}


def option_of(name: str) -> str:
    """The option of the library parameter ``name``: :data:`OPTION_OF`, else ``--`` + ``name`` in kebab
    case (``num_samples`` -> ``--num-samples``)."""
    return OPTION_OF.get(name) or "--" + name.replace("_", "-")


def cli_text(text: str) -> str:
    """A library message (:func:`sinklab.errors.param` marks) as the CLI says it: ``eps`` ->
    ``--eps``, ``eps=0.5`` -> ``--eps 0.5``, True -> ``--flag``, False -> ``--no-flag``, a config key
    ``data.max_epochs=3`` -> ``--set data.max_epochs=3`` (a key without a value: ``--set data.max_epochs``)."""
    from sinklab.errors import render

    def spell(name: str, value: str | None) -> str:
        if "." in name:  # a config key: `sinklab train --set KEY=VALUE`
            return f"--set {name}" + ("" if value is None else f"={'false' if value == chr(0) else value or 'true'}")
        flag = option_of(name)
        if value is None or value == "":
            return flag
        if value == "\0":
            return "--no-" + flag[2:]
        return f"{flag} {value}"

    return render(text, spell)


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


__all__ = ["DEFAULT_MODEL", "DTYPE_NAMES", "THREADS", "split_list", "list_option", "model_option",
           "num_samples_option", "seq_len_option", "device_option", "dtype_option", "threads_option", "out_option",
           "device_map_option", "use_threads", "check_outputs",
           "invoked_command"]


class RegistryGroup(TyperGroup):
    """A command group whose subcommands are made on first use from a registry (``sinklab analyze KIND``,
    ``sinklab stream TASK``), so ``sinklab --help`` and the other commands never import torch. A subclass sets
    :meth:`make_commands` (name -> typer command function) and, optionally, ``command_cls``."""

    command_cls: Any = None

    @staticmethod
    def make_commands() -> dict:
        raise NotImplementedError

    def _ensure(self) -> None:
        made = self.make_commands()
        if not set(made) <= set(self.commands):
            app = typer.Typer(add_completion=False, rich_markup_mode=None)
            app.callback()(lambda: None)  # a group even with one subcommand
            for name, fn in made.items():
                app.command(name, **({"cls": self.command_cls} if self.command_cls else {}))(fn)
            for name, cmd in typer.main.get_command(app).commands.items():
                self.add_command(cmd, name)

    def get_command(self, ctx, cmd_name):
        self._ensure()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        self._ensure()
        return list(self.make_commands())
