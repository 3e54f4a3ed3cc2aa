"""Entry point of the ``sinklab`` command.

Each sub-command lives in its own module and registers itself on :data:`cli`;
``list`` dispatches to the listers in :data:`LISTERS`. The grammar every command shares (comma
lists, short options, ``--device``/``--dtype``/``--threads``, ``--out`` a folder) is defined once in
:mod:`sinklab.cli.common`. Bad input -- a :class:`SinklabError`
or an option value the command line parser rejects -- prints a one-line message and exits
with status 2, never a traceback.
"""

from __future__ import annotations

import sys
from typing import Callable

import typer

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as cx

from sinklab.errors import SinklabError
from sinklab.registry import Registry

cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # plain help: flags show no value placeholder, nothing drawn for a terminal
    help="sinklab: measure attention sinks in language models and watch them emerge in pre-training.",
)

@cli.callback()
def _root() -> None:
    """sinklab: measure attention sinks in language models and watch them emerge in pre-training."""


#: ``sinklab list WHAT``: each lister returns (name, description) pairs.
LISTERS: Registry[Callable[[], list[tuple[str, str]]]] = Registry("list topic")


@cli.command("list")
def list_cmd(what: str = typer.Argument(..., help="models | corpora | attention | positional | ffn | presets")) -> None:
    """Print the registered names of WHAT, one per line (description after a tab)."""
    _load_commands()
    for name, desc in LISTERS.get(what)():
        print(f"{name}\t{desc}" if desc else name)


_COMMAND_MODULES = [
    "sinklab.cli.measure_cmd",
    "sinklab.cli.compare_cmd",
    "sinklab.cli.zoo_cmd",
    "sinklab.cli.nn_cmd",
    "sinklab.cli.train_cmd",
    "sinklab.cli.sweep_cmd",
    "sinklab.cli.stream_cmd",
    "sinklab.cli.analyze_cmd",
]
_loaded = False


def _load_commands() -> None:
    """Import the command modules (each registers its commands and listers)."""
    global _loaded
    if _loaded:
        return
    import importlib

    for mod in _COMMAND_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # a real import error inside an existing module
                raise
    _loaded = True


def _one_line(text: str) -> str:
    return " ".join(ln.strip() for ln in str(text).splitlines() if ln.strip())


def app(argv: list[str] | None = None) -> None:
    """Run the CLI; bad input exits 2 with a one-line message."""
    _load_commands()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:  # the command as typed travels on the root context (sinklab.cli.common.invoked_command)
        code = cli(args=argv, prog_name="sinklab", standalone_mode=False, obj={"argv": list(argv)})
    except cx.NoArgsIsHelpError as e:  # `sinklab` or a group without arguments: its help
        typer.echo(e.ctx.get_help() if e.ctx is not None else e.format_message())
        sys.exit(0)
    except cx.UsageError as e:  # unknown option, bad or missing value
        where = e.ctx.command_path if e.ctx is not None else "sinklab"
        typer.secho(f"error: {_one_line(e.format_message())} (see {where} --help)", fg=typer.colors.RED, err=True)
        sys.exit(2)
    except cx.ClickException as e:  # e.g. a file option that cannot be opened
        typer.secho(f"error: {_one_line(e.format_message())}", fg=typer.colors.RED, err=True)
        sys.exit(e.exit_code)
    except SinklabError as e:  # the library names parameters, the CLI its options
        from sinklab.cli.common import cli_text

        typer.secho(f"error: {_one_line(cli_text(e.marked))}", fg=typer.colors.RED, err=True)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        typer.secho("interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(n) from a command returns n


if __name__ == "__main__":
    app()
