"""``sinklab compare DIR DIR ...``: the sink rates of measured models side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from sinklab.cli.common import check_outputs, invoked_command
from sinklab.cli.main import cli


@cli.command("compare")
def compare_cmd(
    folders: list[Path] = typer.Argument(..., help="result folders written by sinklab measure (two or more)"),
    out: Path = typer.Option(Path("runs/compare"), help="output folder: compare.csv, compare_layers.csv, compare.png, compare.json"),
) -> None:
    """Print and plot the sink rates of measured models side by side (Sink_1, and beside it the mask-aware Sink_1 of
    a model whose own mask hides keys, Sink* of a virtual sink and the gate-weighted Sink_1 where a model has them;
    per layer over relative depth)."""
    check_outputs([("--out", out)], home=False)
    from sinklab.measure.compare import compare, comparison_warnings

    result = compare(folders, command=invoked_command())
    result.save(out)
    models = result.models
    width = max(len(m) for m in models["model"])
    has_cloze = models["cloze_accuracy"].notna().any()
    # beside Sink_1: Sink* of a virtual sink (learned sink logits) and the gate-weighted Sink_1, where a model has one
    beside = [(c, h) for c, h in (("sink_rate_visible_1", "mask-aware S_1 (%)"), ("sink_rate_virtual", "Sink* (%)"),
                                  ("sink_rate_gated_1", "gated Sink_1 (%)"))
              if models[c].notna().any()]
    typer.echo(f"{'model':{width}s}  Sink_1 (%)  {'95% CI':>14s}  " + "".join(f"{h:>18s}  " for _, h in beside)
               + "layers  " + ("cloze (%) [95% CI]    loss  " if has_cloze else "") + "probe")
    for r in models.itertuples():
        ci = "none (N = 1)" if r.ci_low is None or r.ci_low != r.ci_low else f"[{r.ci_low:.1f}, {r.ci_high:.1f}]"
        extra = ""
        if has_cloze:
            extra = (f"{r.cloze_accuracy:5.1f} [{r.cloze_ci_lo:4.1f}, {r.cloze_ci_hi:4.1f}] n={r.cloze_items:<4.0f}"
                     if r.cloze_accuracy == r.cloze_accuracy else f"{'-':22s}")
            extra += f" {r.heldout_loss:5.3f}  " if r.heldout_loss == r.heldout_loss else "    -  "
        cells = "".join(f"{'-' if v is None or v != v else f'{v:.2f}':>18s}  " for v in (getattr(r, c) for c, _ in beside))
        typer.echo(f"{r.model:{width}s}  {r.sink_rate_1:10.2f}  {ci:>14s}  {cells}{r.n_layers:6d}  {extra}{r.probe} "
                   f"N={r.num_samples} T={r.seq_len}")
    for w in comparison_warnings(models):
        typer.echo(f"warning: {w}")
    typer.echo(f"wrote {out}/compare.csv, compare_layers.csv, compare.json and compare.png")
