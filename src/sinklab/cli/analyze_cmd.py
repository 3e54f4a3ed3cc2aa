"""``sinklab analyze KIND``: why sinks exist (massive activations, key bias, interventions, over-mixing,
repeated tokens, denoising, depth, attention patterns).

One subcommand per analysis registered in :data:`sinklab.analyze.ANALYSES`, made from its entry point's
signature: the probe and output options every analysis shares (:data:`COMMON`), and one option per keyword
that is the analysis' own (its ``cli_help`` line, the entry point's default). Lists are comma-separated
(``--layers 0,1,2``). An option left out takes the entry point's default, so a ``sinklab train`` run's
probe length comes from the run. An option of another analysis is refused in one line ("does not apply").
"""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from sinklab.cli.common import (THREADS, RegistryGroup, check_outputs, device_map_option, device_option, dtype_option,
                                invoked_command, list_option, model_option, num_samples_option, out_option,
                                seq_len_option, split_list, use_threads)
from sinklab.cli.main import cli

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as cx

#: options every analysis has: name -> (typer option, what the entry point gets: None = not passed to it)
COMMON = {
    "model": model_option("zoo name, HF model folder, sinklab run or model folder (depth: a run folder analyses "
                          "every checkpoint it keeps)"),
    "corpus": typer.Option(None, help="corpus zoo name or a .txt file / folder (default sotu; for a sinklab "
                           "training run: its own held-out data)"),
    "num_samples": num_samples_option("probe windows N"),
    "seq_len": seq_len_option("tokens per window T (default: a sinklab training run's probe length, else 64)"),
    "seed": typer.Option(None, help="seed of the probe draw and of random choices (default 0)"),
    "eps": typer.Option(None, help="sink threshold on attention mass (default 0.3)"),
    "batch_size": typer.Option(None, "--batch-size", help="sequences per forward pass (default 16)"),
    "out": out_option(None, "output folder (default runs/analyze/KIND)"),
    "device": device_option(),
    "dtype": dtype_option(),
    "device_map": device_map_option(),
    "threads": THREADS,
}
_COMMON_TYPES = {"model": Optional[str], "corpus": Optional[str], "num_samples": Optional[int],
                 "seq_len": Optional[int], "seed": Optional[int], "eps": Optional[float],
                 "batch_size": Optional[int], "out": Optional[Path], "device": str, "dtype": Optional[str],
                 "device_map": Optional[str],
                 "threads": Optional[int]}
#: keywords of an entry point the CLI does not give it (the probe's, taken by COMMON)
_PROBE = ("corpus", "num_samples", "seq_len", "seed", "eps", "batch_size", "device", "dtype", "device_map")


def _option_type(hint) -> tuple[type, object]:
    """The typer type of an entry point keyword's type hint and the parser of its text (None: as typer gives it)."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    base = args[0]
    if typing.get_origin(base) is list:
        item = typing.get_args(base)[0]
        return Optional[list[str]], (lambda values, flag: split_list(values, item, flag))
    if base is bool:
        return bool, None
    return Optional[base], None


def _own_options(fn) -> list[tuple[str, type, object, typer.models.OptionInfo]]:
    """(keyword, typer type, parser, option) for every keyword of ``fn`` that is the analysis' own."""
    hints = typing.get_type_hints(fn)
    helps = getattr(fn, "cli_help", {})
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if name == "model" or name in _PROBE:
            continue
        kind, parse = _option_type(hints[name])
        flag = "--" + name.replace("_", "-")
        text = helps.get(name, "")
        if p.default not in (None, False) and "default" not in text:
            shown = ",".join(map(str, p.default)) if isinstance(p.default, (list, tuple)) else p.default
            text += f" (default {shown})"
        if parse is not None:  # a comma list: --layers 0,1,2 (repeating the flag adds to the list)
            option = list_option(flag, text.strip())
        else:
            option = typer.Option(False if kind is bool else None, flag, help=text.strip())
        out.append((name, kind, parse, option))
    return out


def _help(fn) -> str:
    """The entry point's first paragraph as plain text (reST roles and literals unmarked)."""
    first = inspect.getdoc(fn).split("\n\n")[0]
    first = re.sub(r":\w+:`~?([^`]+)`", lambda m: m.group(1).split(".")[-1], first)
    return first.replace("``", "") + "\n\nWrites OUT/analysis.json (every number, command, versions, provenance), " \
        "CSV tables and PNG plots."


class _AnalysisGroup(RegistryGroup):
    """``sinklab analyze``: its subcommands are made on first use from :data:`sinklab.analyze.ANALYSES`
    (so ``sinklab --help`` and the other commands never import torch); an unknown KIND is an
    :class:`~sinklab.errors.UnknownNameError` listing the registered analyses (one line, exit 2)."""

    make_commands = staticmethod(lambda: commands())  # command_cls: _AnalysisCommand, set below it

    def resolve_command(self, ctx, args):
        from sinklab.analyze import ANALYSES

        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            ANALYSES.get(args[0])  # raises, naming the valid analyses and the nearest one
        return super().resolve_command(ctx, args)


class _AnalysisCommand(TyperCommand):
    """One ``sinklab analyze KIND``: an option of another analysis is refused as not applying to this one."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except cx.NoSuchOption as e:
            commands()
            owners = [k for k, flags in _FLAGS.items() if e.option_name in flags]
            if not owners:
                raise
            raise cx.UsageError(f"{e.option_name} does not apply to `analyze {self.name}` (an option of "
                                f"{', '.join('analyze ' + k for k in owners)})", ctx) from None


_AnalysisGroup.command_cls = _AnalysisCommand


analyze_app = typer.Typer(cls=_AnalysisGroup, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                          help="Why sinks exist: one subcommand per analysis (sinklab analyze KIND --help for its "
                               "options). Writes OUT/analysis.json, CSV tables and PNG plots.")
cli.add_typer(analyze_app, name="analyze")
_FLAGS: dict[str, set[str]] = {}  # analysis -> its own flags


_COMMANDS: dict = {}  # analysis -> its typer command function


def commands() -> dict:
    """``{kind: command function}`` for every registered analysis (made once, on first use: it imports
    :mod:`sinklab.analyze`). Each function's ``threads`` default is :data:`~sinklab.cli.common.THREADS`."""
    from sinklab.analyze import ANALYSES

    for kind in ANALYSES:
        if kind not in _COMMANDS:
            _COMMANDS[kind] = _make_command(kind, ANALYSES.get(kind))
    return dict(_COMMANDS)


def _make_command(kind: str, fn):
    """The typer command function of ``sinklab analyze KIND``, its options made from ``fn``'s signature."""
    own = _own_options(fn)
    sig = inspect.signature(fn).parameters
    params, parsers = [], {}
    for name, opt in COMMON.items():
        if name == "num_samples":
            opt = num_samples_option(f"probe windows N (default {sig[name].default})")
        elif name == "out":
            opt = out_option(None, f"output folder (default runs/analyze/{kind})")
        kind_ = str if name == "model" else _COMMON_TYPES[name]
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind_))
    for name, kind_, parse, opt in own:
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind_))
        parsers[name] = parse
    _FLAGS[kind] = {"--" + n.replace("_", "-") for n, *_ in own}

    def command(**given) -> None:
        _run(kind, given, parsers)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = f"analyze_{kind}"
    command.__doc__ = _help(fn)
    return command


def _run(kind: str, given: dict, parsers: dict) -> None:
    """Check the output folder, set the threads, call the registered entry point with the options given
    (only those: the others take the entry point's defaults), save and print the result."""
    from sinklab.analyze import ANALYSES

    out = given.pop("out") or Path("runs/analyze") / kind
    check_outputs([("--out", out)])
    use_threads(given.pop("threads"))
    model = given.pop("model")
    kwargs = {}
    for name, value in given.items():
        parse = parsers.get(name)
        if parse is not None:
            value = parse(value, "--" + name.replace("_", "-"))
        if value is not None and value is not False:
            kwargs[name] = value
    result = ANALYSES.get(kind)(model, **kwargs)
    result.command = invoked_command()
    folder = result.save(out)
    _print_summary(result)
    typer.echo(f"\nwrote {folder}/analysis.json, {', '.join(n + '.csv' for n in result.tables)} and "
               f"{', '.join(n + '.png' for n in result.plots)}")


_MAX_ROWS = 64  # tables up to this many rows are printed in full (massive's per-layer table, ...)


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def _print_summary(result) -> None:
    """Headline numbers: scalars, flat dicts and lists of numbers (overmix intact vs removed, repeat's
    cosines by layer), warnings, and every table of at most ``_MAX_ROWS`` rows."""
    for k, v in result.summary.items():
        if k == "warnings":
            continue
        flat_dict = isinstance(v, dict) and all(isinstance(x, (int, float, str)) or x is None for x in v.values())
        flat_list = isinstance(v, list) and all(isinstance(x, (int, float)) for x in v)
        if isinstance(v, (int, float, str)) or v is None or flat_dict or flat_list:
            typer.echo(f"{k}: {_fmt(v)}")
    for w in result.summary.get("warnings", []):
        typer.echo(f"warning: {w}")
    for name, df in result.tables.items():
        if 0 < len(df) <= _MAX_ROWS:
            typer.echo(f"\n{name}:\n{df.to_string(index=False)}")

