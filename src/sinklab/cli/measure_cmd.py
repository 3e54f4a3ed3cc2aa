"""``sinklab measure`` (one model, or several: one folder each)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from sinklab.cli.common import (DEFAULT_MODEL, THREADS, check_outputs, device_map_option, device_option, dtype_option,
                                invoked_command,
                                list_option, num_samples_option, out_option, seq_len_option, split_list, use_threads)
from sinklab.cli.main import cli


@cli.command("measure")
def measure_cmd(
    model: Optional[list[str]] = list_option("--model", f"zoo name, HF model folder, sinklab training run folder (or "
                                             f"its final/), or hub id (default {DEFAULT_MODEL}); several, comma-separated: "
                                             "one folder each under --out"),
    corpus: Optional[str] = typer.Option(None, help="corpus zoo name or a .txt file / folder (natural input only; default sotu)"),
    input: str = typer.Option("auto", "--input", help="auto | run | natural | random | repeated | text; auto = run for a "
                              "sinklab training run (its own held-out data and packing), natural otherwise"),
    num_samples: Optional[int] = num_samples_option("number of probe sequences N (default 100, or the run tracker's)"),
    seq_len: Optional[int] = seq_len_option("tokens per sequence T, special tokens included (default 64, or the run tracker's)"),
    eps: float = typer.Option(0.3, help="sink threshold on attention mass, in (0, 1)"),
    positions: int = typer.Option(8, "--positions", "-k", help="report the sink rate at the first K positions"),
    bos: str = typer.Option("auto", help="auto (tokenizer's choice; a training run's packing) | always | never"),
    seed: Optional[int] = typer.Option(None, help="seed of the probe draw and the bootstrap (default 0, or the run tracker's)"),
    dtype: Optional[str] = dtype_option(),
    device: str = device_option(),
    device_map: Optional[str] = device_map_option(),
    out: Path = out_option(Path("runs/measure")),
    batch_size: int = typer.Option(16, "--batch-size", help="sequences per forward pass"),
    collector: str = typer.Option("auto", help="attention collector: auto | eager | blockwise"),
    token: int | None = typer.Option(None, help="token id for --input repeated (default: random per sample)"),
    text: str | None = typer.Option(None, help="text for --input text"),
    accept_license: bool = typer.Option(False, "--accept-license", help="accept a model's licence terms (gemma3-270m)"),
    allow_long_context: bool = typer.Option(False, "--allow-long-context", help="allow T past the model's context"),
    cloze: int = typer.Option(0, "--cloze", help="also score N items of a HellaSwag-like cloze task built from held-out "
                              "text (the run's own held-out data for a training run) and the held-out loss on the probe "
                              "(0 = off; see `sinklab compare`)"),
    threads: Optional[int] = THREADS,
) -> None:
    """Measure the attention sink of a model: sink rate per position, layer and head, norms, plots."""
    model = split_list(model, str, "--model") or [DEFAULT_MODEL]
    check_outputs([("--out", out)])
    use_threads(threads)
    from sinklab.measure import MeasureConfig, measure
    from sinklab.measure.report import print_summary
    from sinklab.measure.run import measure_many

    cfg = MeasureConfig(
        model=model[0], device=device, device_map=device_map, corpus=corpus, input=input, num_samples=num_samples, seq_len=seq_len, eps=eps,
        positions=positions, bos=bos, seed=seed, dtype=dtype, batch_size=batch_size, collector=collector,
        token=token, text=text, accept_license=accept_license, allow_long_context=allow_long_context, cloze=cloze,
    )
    if len(model) > 1:
        def report(folder: Path, result) -> None:
            typer.echo(f"== {result.config.model}")
            print_summary(result)
            typer.echo(f"wrote {folder} ({result.wall_time_s:.1f} s)")

        measure_many(model, out, cfg, on_result=report, command=invoked_command())
        typer.echo(f"compare them: sinklab compare {' '.join(str(Path(out) / p.name) for p in sorted(Path(out).iterdir()) if (p / 'results.json').exists())}")
        return
    result = measure(cfg, out=out, command=invoked_command())
    print_summary(result)
    if result.downstream:
        from sinklab.measure.report import downstream_line

        typer.echo(downstream_line(result.downstream))
    typer.echo(f"probe: {result.probe_description()['description']}")
    extra = f"; cloze and held-out loss {result.downstream['wall_time_s']:.1f} s" if result.downstream else ""
    typer.echo(f"wrote {out}/results.json, attention.csv, sink_rate.csv and 3 PNG plots ({result.wall_time_s:.1f} s measuring{extra})")

