"""``sinklab compare DIR DIR ...``: the sink rates of measured models side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from sinklab.cli.common import check_outputs
from sinklab.cli.main import cli


@cli.command("compare")
def compare_cmd(
    folders: list[Path] = typer.Argument(..., help="result folders written by sinklab measure (two or more)"),
    out: Path = typer.Option(Path("runs/compare"), help="output folder: compare.csv, compare_layers.csv, compare.png"),
) -> None:
    """Print and plot the sink rates of measured models side by side (Sink_1; per layer over relative depth)."""
    check_outputs([("--out", out)], home=False)
    import shlex
    import sys

    from sinklab.measure.compare import write_comparison

    models = write_comparison(folders, out, command=" ".join(shlex.quote(a) for a in ["sinklab", *sys.argv[1:]]))
    width = max(len(m) for m in models["model"])
    typer.echo(f"{'model':{width}s}  Sink_1 (%)  layers  probe")
    for r in models.itertuples():
        typer.echo(f"{r.model:{width}s}  {r.sink_rate_1:10.2f}  {r.n_layers:6d}  {r.input} N={r.num_samples} T={r.seq_len}")
    typer.echo(f"wrote {out}/compare.csv, compare_layers.csv and compare.png")
