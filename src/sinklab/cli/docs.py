"""The CLI reference, generated from the typer app: ``python -m sinklab.cli.docs > docs/cli.md``.

Every command (and every subcommand of a command group such as ``analyze``) gets its help text, its
usage line and a table of its arguments and options with the value each takes and its default, all
read from the app itself (click's help records), so the reference cannot drift from the parser;
``tests/test_docs.py`` fails when the committed ``docs/cli.md`` differs from this module's output.
"""

from __future__ import annotations

import inspect
import re
import sys


def _cell(text: str) -> str:
    """One Markdown table cell: pipes escaped, whitespace runs folded."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _split_help(record_help: str) -> tuple[str, str]:
    """click's help text ``"... [default: X]"`` -> (help, "X" or "required" or "")."""
    m = re.search(r"\s*\[(default: (?P<d>.*?)|(?P<r>required)|(?P<x>[^\]]*))\]\s*$", record_help)
    if not m:
        return record_help, ""
    if m.group("d") is not None:
        extra = m.group("d")
    elif m.group("r"):
        extra = "required"
    else:  # a range such as x>=1: part of the value, not a default
        return record_help, ""
    return record_help[: m.start()], extra


def subcommands(cmd, ctx=None) -> dict:
    """``{name: command}`` of a click group (through ``list_commands``/``get_command``, so a group that
    makes its subcommands on first use, such as ``analyze``, lists them all); ``{}`` for a leaf command."""
    if not hasattr(cmd, "list_commands"):
        return {}
    return {n: cmd.get_command(ctx, n) for n in cmd.list_commands(ctx)}


def _command_section(path: list[str], cmd, ctx) -> list[str]:
    lines = [f"## `{' '.join(path)}`", ""]
    if cmd.help:
        lines += [inspect.cleandoc(cmd.help), ""]
    usage = cmd.get_usage(ctx).replace("Usage: ", "", 1).strip()
    lines += ["```", usage, "```", ""]
    rows = []
    for p in cmd.params:
        if getattr(p, "hidden", False):
            continue
        rec = p.get_help_record(ctx)
        if rec is None:
            continue
        decl, help_text = rec
        help_text, default = _split_help(help_text)
        if p.param_type_name == "argument":
            rows.append((f"`{p.name.upper()}`" + (" ..." if p.nargs == -1 else ""), "argument", _cell(default),
                         _cell(help_text)))
            continue
        m = re.match(r"^((?:-{1,2}[\w-]+(?:, | / )?)+)\s*(.*)$", decl)
        names = re.split(r", | / ", m.group(1).strip()) if m else [decl]
        value = m.group(2).strip() if m else ""
        if "; " in default:  # "1; x>=1": the default, then the range
            default, _, rng = default.partition("; ")
            value = f"{value} ({rng})"
        range_ = re.search(r"\[(x[^\]]*)\]\s*$", help_text)
        if range_:
            help_text = help_text[: range_.start()]
            value = f"{value} ({range_.group(1)})"
        rows.append((", ".join(f"`{n}`" for n in names), _cell(value) or "flag",
                     _cell(default), _cell(help_text)))
    if rows:
        lines += ["| option | value | default | meaning |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
        lines.append("")
    return lines


def render() -> str:
    """The whole reference as Markdown (commands in alphabetical order, subcommands under their group)."""
    import typer.main

    from sinklab.cli.main import _load_commands, cli

    _load_commands()
    root = typer.main.get_command(cli)
    root_ctx = root.make_context("sinklab", ["--help"], resilient_parsing=True)
    out = ["# CLI reference", "",
           "Generated from the `sinklab` command itself by `python -m sinklab.cli.docs > docs/cli.md`; "
           "`tests/test_docs.py` fails when this file and the generator's output differ. "
           "The grammar every command follows is in [the overview](README.md#one-grammar).", ""]
    out += ["```", root.get_usage(root_ctx).replace("Usage: ", "", 1).strip(), "```", ""]
    names = sorted(root.commands)
    out += ["Commands: " + ", ".join(f"[`{n}`](#sinklab-{n})" for n in names) + ".", ""]

    def walk(path: list[str], cmd, parent_ctx) -> None:
        ctx = cmd.make_context(path[-1], [], parent=parent_ctx, resilient_parsing=True)
        subs = subcommands(cmd, ctx)
        if subs:
            out.extend([f"## `{' '.join(path)}`", ""])
            if cmd.help:
                out.extend([inspect.cleandoc(cmd.help), ""])
            out.extend(["Subcommands: " + ", ".join(f"`{n}`" for n in sorted(subs)) + ".", ""])
            for n in sorted(subs):
                walk([*path, n], subs[n], ctx)
            return
        out.extend(_command_section(path, cmd, ctx))

    for n in names:
        walk(["sinklab", n], root.commands[n], root_ctx)
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
