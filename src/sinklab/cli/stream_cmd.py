"""``sinklab stream``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sinklab.cli.common import THREADS, check_outputs
from sinklab.cli.main import cli


@cli.command("stream")
def stream_cmd(
    model: str = typer.Option("smollm2-135m", help="zoo name or Hugging Face folder of a RoPE causal LM, or a "
                              "sinklab train run with relative positions"),
    corpus: str = typer.Option("sotu", help="corpus zoo name, a .txt file / folder (documents concatenated in order), "
                               "or run (a sinklab run's own validation documents)"),
    tokens: int = typer.Option(4096, "--tokens", "-n", help="stream length N: the first N tokens of the corpus"),
    window: int = typer.Option(256, "--window", "-w", help="recent tokens kept by the sink caches (and seen by recompute)"),
    sinks: List[int] = typer.Option([0, 1, 2, 4, 8], "--sinks", help="numbers of sink tokens, e.g. --sinks 0 1 2 4 8 "
                                    "(0 = window only)"),
    out: Path = typer.Option(Path("runs/stream"), help="output folder (a stopped run resumes there)"),
    chunk: Optional[int] = typer.Option(None, help="positions per perplexity chunk (default: the window)"),
    recompute_every: Optional[int] = typer.Option(None, "--recompute-every", help="score every k-th position with "
                                                  "recomputation (default: N/128 rounded up)"),
    mode: str = typer.Option("parallel", help="parallel (one exact forward per cache configuration) | decode "
                             "(token by token through the real cache: same numbers, much slower)"),
    no_full: bool = typer.Option(False, "--no-full", help="skip the full cache"),
    no_recompute: bool = typer.Option(False, "--no-recompute", help="skip sliding window with recomputation"),
    threads: Optional[int] = THREADS,
) -> None:
    """StreamingLLM on one long stream: perplexity, decode latency and cache memory for the full cache,
    window only, sinks + window and sliding window with recomputation."""
    check_outputs([("--out", out)])
    from sinklab.streaming import stream

    res = stream(model, corpus, tokens=tokens, window=window, sinks=sinks, out=out, chunk=chunk,
                 recompute_every=recompute_every, mode=mode, full=not no_full, recompute=not no_recompute, threads=threads)
    typer.echo(f"{res['title']}")
    typer.echo(f"{'config':<11} {'n_sink':>6} {'ppl':>9} {'ppl@recomp':>10} {'last chunk (n)':>16} {'ms/token':>9} "
               f"{'cache MiB':>9}")
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
        typer.echo(f"{c['name']:<11} {ns:>6} {c['ppl']:>9.2f} {matched:>10} {last:>16} "
                   f"{c['latency_ms_per_token']:>9.1f} {c['cache_bytes'] / 2**20:>9.2f}")
    typer.echo("last chunk (n): perplexity of the last chunk, over the n positions scored in it (recompute scores "
               "every k-th position only)")
    typer.echo(f"wrote {out}/stream.json, stream.csv, stream_by_chunk.csv, stream_ppl.png")
