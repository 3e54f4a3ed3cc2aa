"""``sinklab stream TASK``: one subcommand per streaming task registered in
:data:`sinklab.streaming.task_registry.TASKS` (``perplexity``, ``passkey``, and any task registered later),
in the grammar of ``sinklab analyze KIND``.

Each subcommand's options are made from its task's options dataclass (:mod:`sinklab.streaming.options`:
one flag per field, lists comma-separated, a bool that defaults to True as ``--no-NAME``), plus ``--model``
and ``--out``. The command builds the options object, calls :func:`sinklab.streaming.stream` (which writes
nothing) with the result already in ``--out`` to resume from and a callback that saves each partial
result there, then saves the result and prints its table. The command recorded is the options object's
(:meth:`~sinklab.streaming.options.StreamOptions.command_line`), so the same call from Python and from the
CLI records the same line.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer


from sinklab.cli.common import THREADS, RegistryGroup, check_outputs, list_option, model_option, out_option, split_list
from sinklab.cli.main import cli

try:  # typer >= 0.2x carries its own copy of click
    from typer._click import exceptions as cx
except ImportError:  # pragma: no cover - older typer on click
    from click import exceptions as cx

_COMMANDS: dict = {}


def commands() -> dict:
    """``{task: command function}`` for every registered streaming task (made on first use: it imports
    :mod:`sinklab.streaming`)."""
    import sinklab.streaming  # noqa: F401  (registers perplexity, passkey, needle, ruler)
    from sinklab.streaming.task_registry import TASKS

    for name in TASKS:
        if name not in _COMMANDS:
            _COMMANDS[name] = _make_command(TASKS.get(name))
    return dict(_COMMANDS)


class _StreamGroup(RegistryGroup):
    """``sinklab stream``: subcommands made on first use from the task registry; the old grammar
    (``sinklab stream --model ...``) is refused in one line naming the subcommands."""

    make_commands = staticmethod(lambda: commands())

    def parse_args(self, ctx, args):
        if args and args[0].startswith("-") and args[0] not in ("--help", "-h"):
            raise cx.UsageError("sinklab stream takes a task first: sinklab stream perplexity ... (was sinklab stream "
                                "...) or sinklab stream passkey ... (was --task passkey); tasks: "
                                + ", ".join(commands()), ctx)
        return super().parse_args(ctx, args)

    def resolve_command(self, ctx, args):
        from sinklab.streaming.task_registry import TASKS

        if args and self.get_command(ctx, args[0]) is None:
            TASKS.get(args[0])  # raises, naming the tasks and the nearest one
        return super().resolve_command(ctx, args)


stream_app = typer.Typer(cls=_StreamGroup, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                         help="Caches compared on long streams (StreamingLLM): one subcommand per task (sinklab stream "
                              "TASK --help for its options).")
cli.add_typer(stream_app, name="stream")


def _make_command(task):
    """The typer command function of ``sinklab stream TASK``, one option per field of its options class."""
    params = [inspect.Parameter("model", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                                default=model_option("zoo name or Hugging Face folder of a RoPE causal LM, or a "
                                                     "sinklab train run with relative positions")),
              inspect.Parameter("out", inspect.Parameter.KEYWORD_ONLY, annotation=Path,
                                default=out_option(Path(f"runs/stream/{task.name}"),
                                                   "output folder (a stopped run resumes there)"))]
    flags = task.options.flags()
    for fl in flags:
        decls = [fl.flag] + ([fl.short] if fl.short else [])
        if fl.name == "threads":  # the one --threads option of every command that runs a model
            opt, kind = THREADS, Optional[int]
        elif fl.kind == "list":
            shown = "" if fl.default is None else f" (default {','.join(map(str, fl.default))})"
            opt, kind = list_option(fl.flag, fl.help + shown, *decls[1:]), Optional[list[str]]
        elif fl.kind == "bool":
            opt, kind = typer.Option(False, *decls, help=fl.help if fl.default is False else "leave out " + fl.help), bool
        else:
            opt, kind = typer.Option(fl.default, *decls, help=fl.help), (fl.item if fl.default is not None
                                                                         else Optional[fl.item])
        params.append(inspect.Parameter(fl.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=kind))

    def command(**given) -> None:
        _run(task, flags, given)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__name__ = f"stream_{task.name}"
    command.__doc__ = task.help + f"\n\nWrites OUT/{task.result.FILE} (every number, command, versions) with CSV " \
                                  "tables and a PNG plot."
    return command


def _options(task, flags, given: dict):
    """The task's options object from the parsed flags."""
    values = {}
    for fl in flags:
        v = given[fl.name]
        if fl.kind == "list":
            v = split_list(v, fl.item, fl.flag)
            v = None if v is None else tuple(v)
            if v is None and fl.default is not None:
                v = fl.default
        elif fl.kind == "bool":
            v = (not v) if fl.default is True else v
        values[fl.name] = v
    return task.options(**values)


def _run(task, flags, given: dict) -> None:
    from sinklab.errors import CorruptFileError
    from sinklab.fileio import read_json
    from sinklab.streaming import stream

    out, model = given.pop("out"), given.pop("model")
    check_outputs([("--out", out)])
    opts = _options(task, flags, given)
    resume = None
    if (out / task.result.FILE).exists():
        try:
            resume = read_json(out / task.result.FILE, task.result.WHAT)
        except CorruptFileError:  # computed again and rewritten
            resume = None
    res = stream(model, options=opts, task=task.name, resume=resume, on_result=lambda partial: partial.save(out),
                 command=opts.command_line(model, out=out))
    res.save(out)
    printer = _PRINTERS.get(task.name)
    if printer is not None:
        printer(res, out)
    elif task.summary is not None:
        for line in task.summary(res, out):
            typer.echo(line)
    else:
        typer.echo(repr(res))
        typer.echo(f"wrote {out}/{task.result.FILE}")


def _print_passkey(res, out: Path) -> None:
    typer.echo(f"{res['title']}")
    depths = sorted(res["configs"][0]["accuracy_by_depth"], key=float) if res["configs"] else []
    typer.echo(f"{'config':<28} {'accuracy':>8}  " + " ".join(f"{'d=' + d:>7}" for d in depths))
    for c in res["configs"]:
        typer.echo(f"{c['name']:<28} {c['accuracy']:>8.2f}  "
                   + " ".join(f"{c['accuracy_by_depth'][d]:>7.2f}" for d in depths))
    typer.echo(f"wrote {out}/passkey.json, passkey.csv, passkey_accuracy.csv, passkey.png")


def _print_perplexity(res, out: Path) -> None:
    typer.echo(f"{res['title']}")
    if "streams" in res:
        _print_stream_set(res, out)
        return
    w = max([11] + [len(c["name"]) for c in res["configs"]])
    typer.echo(f"{'config':<{w}} {'n_sink':>6} {'ppl':>9} {'ppl@recomp':>10} {'last chunk (n)':>16} {'ms/token':>9} "
               f"{'cache MiB':>9} {'KL nats':>9} {'top-1':>6}")
    for c in res["configs"]:
        last_chunk = next((i for i in reversed(range(len(c["ppl_by_chunk"]))) if c["ppl_by_chunk"][i] is not None), None)
        counts = c.get("count_by_chunk") or []
        if last_chunk is None:
            last = "-"
        else:  # the perplexity of the last chunk with a scored position, and how many positions it rests on
            n = f"{counts[last_chunk]}" if counts else "?"
            last = f"{c['ppl_by_chunk'][last_chunk]:.2f} ({n})"
        ns = "-" if c["n_sink"] is None else str(c["n_sink"])
        matched = "-" if c["ppl_matched"] is None else f"{c['ppl_matched']:.2f}"
        typer.echo(f"{c['name']:<{w}} {ns:>6} {c['ppl']:>9.2f} {matched:>10} {last:>16} "
                   f"{_num(c['latency_ms_per_token'], '.1f'):>9} "
                   f"{'-' if c['latency_ms_per_token'] is None else format(c['cache_bytes'] / 2**20, '.2f'):>9} "
                   f"{_num(c.get('kl'), '.4f'):>9} {_num(c.get('top1'), '.3f'):>6}")
    typer.echo("KL nats, top-1: agreement with the full cache (mean KL(full || config) of the next-token distribution, "
               "share of equal argmax tokens)")
    typer.echo("last chunk (n): perplexity of the last chunk, over the n positions scored in it (recompute scores "
               "every k-th position only)")
    typer.echo(f"wrote {out}/stream.json, stream.csv, stream_by_chunk.csv, stream_ppl.png")




_PRINTERS = {"perplexity": _print_perplexity, "passkey": _print_passkey}


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ci(c: dict, f: str, fmt: str) -> str:
    if c.get(f) is None:
        return "-"
    lo, hi = c.get(f + "_low"), c.get(f + "_high")
    return format(c[f], fmt) + ("" if lo is None else f" [{format(lo, fmt)}, {format(hi, fmt)}]")


def _print_stream_set(res, out: Path) -> None:
    """The summary over streams and the decided comparisons of a multi-stream run."""
    w = max([11] + [len(c["name"]) for c in res["configs"]])
    n = len(res["streams"])
    cols = [("ppl [95% CI]", "ppl", ".2f"), ("KL nats [95% CI]", "kl", ".4f"), ("top-1 [95% CI]", "top1", ".3f")]
    cells = [[_ci(c, f, fmt) for _, f, fmt in cols] for c in res["configs"]]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, (h, _, _) in enumerate(cols)]
    typer.echo(f"{'config':<{w}}" + "".join(f"  {h:>{widths[i]}}" for i, (h, _, _) in enumerate(cols)))
    for c, row in zip(res["configs"], cells):
        typer.echo(f"{c['name']:<{w}}" + "".join(f"  {v:>{widths[i]}}" for i, v in enumerate(row)))
    typer.echo(f"means over {n} streams, 95% t-intervals over streams; ppl = exp(mean per-stream NLL)"
               + ("; the intervals are not clipped, so with few streams a KL bound can be below 0 or a top-1 bound "
                  "above 1" if n < 8 else ""))
    decided = [x for x in res["comparisons"] if x["better"] != "inconclusive"]
    typer.echo(f"paired comparisons (A - B per stream): {len(decided)} of {len(res['comparisons'])} decided")
    for x in decided:
        typer.echo(f"  {x['figure']:<5} {x['better']} better ({x['a']} vs {x['b']}: mean diff {x['diff_mean']:+.4g} "
                   f"[{x['diff_low']:+.4g}, {x['diff_high']:+.4g}])")
    typer.echo(f"wrote {out}/stream.json, stream.csv, stream_by_stream.csv, stream_comparisons.csv, stream_by_chunk.csv, "
               "stream_ppl.png")
