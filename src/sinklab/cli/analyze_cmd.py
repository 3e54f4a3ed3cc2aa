"""``sinklab analyze KIND``: why sinks exist (massive activations, key bias, interventions, over-mixing,
repeated tokens)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Optional

import typer

from sinklab.cli.common import THREADS, check_outputs, use_threads
from sinklab.cli.main import cli


def _ints(text: str | None, flag: str) -> list[int] | None:
    from sinklab.errors import InputError

    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} takes comma-separated integers, got {text!r}") from None


@cli.command("analyze")
def analyze_cmd(
    kind: str = typer.Argument(..., help="massive | keybias | intervene | overmix | repeat | denoise | "
                                                 "attention | depth"),
    model: str = typer.Option("smollm2-135m", help="zoo name, HF model folder, sinklab run or model folder (depth: a "
                              "run folder analyses every checkpoint it keeps)"),
    corpus: Optional[str] = typer.Option(None, help="corpus zoo name or a .txt file / folder (default sotu; "
                                         "for a sinklab training run: its own held-out data)"),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", "-n", help="probe windows N (default 32; overmix 16; "
                                              "attention 1; depth 8)"),
    seq_len: int = typer.Option(64, "--seq-len", "-t", help="tokens per window T"),
    seed: int = typer.Option(0, help="seed of the probe draw and of random choices"),
    eps: float = typer.Option(0.3, help="sink threshold on attention mass"),
    out: Optional[Path] = typer.Option(None, help="output folder (default runs/analyze/KIND)"),
    batch_size: int = typer.Option(16, "--batch-size", help="sequences per forward pass"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="massive: largest entries per (sample, layer) (default 3); "
                                        "depth: non-first sink positions per layer (default 3)"),
    alpha: Optional[float] = typer.Option(None, help="depth: order of the matrix-based Renyi entropy (default 1 = von Neumann)"),
    massive_ratio: Optional[float] = typer.Option(None, "--massive-ratio", help="massive: multiple of the median |h| "
                                                  "that makes an entry massive (default 100)"),
    position: Optional[int] = typer.Option(None, help="keybias, intervene: 0-based sink position (default: the top one); "
                                           "repeat: position made to attend only to itself (default T // 2)"),
    layers: Optional[str] = typer.Option(None, help="intervene: layers for remove-sink, e.g. 0,1,2 (default all); "
                                         "attention: layers shown (default first, middle, last); repeat: layers where --position is "
                                         "made self-attending (default 0)"),
    heads: Optional[str] = typer.Option(None, help="attention: heads shown, e.g. 0,3 (default all); repeat: heads made "
                                        "self-attending (default: the lowest self-attention shares)"),
    sample: Optional[int] = typer.Option(None, help="attention: 0-based probe window shown (default 0)"),
    max_matrix_len: Optional[int] = typer.Option(None, "--max-matrix-len", help="attention: longest T shown as full "
                                                 "matrices; longer: mass per key, blockwise (default 256)"),
    dims: Optional[str] = typer.Option(None, help="intervene: massive dimensions to ablate (default: found)"),
    massive_layer: Optional[int] = typer.Option(None, "--massive-layer", help="intervene: block whose output is ablated"),
    token: Optional[int] = typer.Option(None, help="intervene: replacement first token; repeat: the repeated token"),
    swap_to: Optional[int] = typer.Option(None, "--swap-to", help="intervene: 0-based t of the position swap (default 4)"),
    only: Optional[str] = typer.Option(None, help="intervene: comma-separated subset of noop, remove-sink, massive-zero, "
                                       "massive-mean, massive-samplemean, drop-first, replace-first, position-replace, position-swap"),
    min_rate: Optional[float] = typer.Option(None, "--min-rate", help="keybias: per-sample sink rate (%) that makes a true sink (default 10)"),
    long_seq_len: Optional[int] = typer.Option(None, "--long-seq-len", help="keybias: long-context T for sink detection (default 512)"),
    long_num_samples: Optional[int] = typer.Option(None, "--long-num-samples", help="keybias: windows at the long T (default 8)"),
    sources: Optional[str] = typer.Option(None, help="overmix: perturbed positions, e.g. 8,16,32"),
    directions: Optional[int] = typer.Option(None, help="overmix: random directions per source (default 3)"),
    scale: Optional[float] = typer.Option(None, help="overmix: perturbation size relative to the embedding norm (default 0.01)"),
    prompt_len: Optional[int] = typer.Option(None, "--prompt-len", help="repeat: natural prompt tokens before the repeats "
                                             "(default 8); denoise: prompt tokens before the masked continuation (default 16)"),
    steps: Optional[int] = typer.Option(None, help="denoise: denoising steps S (default 16)"),
    mask_id: Optional[int] = typer.Option(None, "--mask-id", help="denoise: the mask token id (default: <|mask|> of the tokenizer)"),
    sink_level: Optional[float] = typer.Option(None, "--sink-level", help="denoise: sink rate (%) that makes a step's top "
                                               "position a sink (default 10)"),
    allow_non_sink: bool = typer.Option(False, "--allow-non-sink", help="intervene: allow a --position that is never a "
                                        "sink (e.g. BOS in a model without a sink, to compare models at one position)"),
    temperature: Optional[float] = typer.Option(None, help="denoise: sampling temperature (default 0 = greedy)"),
    counts: Optional[str] = typer.Option(None, help="repeat: numbers of repeats, e.g. 1,4,16,64"),
    threads: Optional[int] = THREADS,
) -> None:
    """Why sinks exist: massive activations, the key-bias view, interventions, over-mixing, repeated tokens;
    a masked diffusion LM's sink across denoising steps (denoise); one window's attention pattern and
    per-head entropy (attention); per-layer sinks, first-token norm and representation entropy, for a model or
    every checkpoint of a training run (depth).

    Writes OUT/analysis.json (every number, command, versions, provenance), CSV tables and PNG plots."""
    out = out or Path("runs/analyze") / kind
    check_outputs([("--out", out)])
    from sinklab import analyze
    from sinklab.errors import InputError

    if kind not in analyze.KINDS:
        raise InputError(f"unknown analysis {kind!r}; choose from {', '.join(analyze.KINDS)}")
    fn = analyze.KINDS[kind]
    given = {
        "top_k": top_k, "massive_ratio": massive_ratio, "position": position, "layers": _ints(layers, "--layers"), "dims": _ints(dims, "--dims"),
        "massive_layer": massive_layer, "token": token, "swap_to": swap_to,
        "only": [x.strip() for x in only.split(",")] if only else None, "min_rate": min_rate,
        "long_seq_len": long_seq_len, "long_num_samples": long_num_samples, "sources": _ints(sources, "--sources"),
        "directions": directions, "scale": scale, "prompt_len": prompt_len, "counts": _ints(counts, "--counts"),
        "steps": steps, "temperature": temperature, "mask_id": mask_id, "sink_level": sink_level,
        "allow_non_sink": True if allow_non_sink else None,
        "heads": _ints(heads, "--heads"), "sample": sample, "max_matrix_len": max_matrix_len, "alpha": alpha,
    }
    params = inspect.signature(fn).parameters
    kwargs = {}
    for name, value in given.items():
        if value is None:
            continue
        if name not in params:
            raise InputError(f"--{name.replace('_', '-')} does not apply to `analyze {kind}`")
        kwargs[name] = value
    if num_samples is not None:
        kwargs["num_samples"] = num_samples
    use_threads(threads)
    result = fn(model, corpus=corpus, seq_len=seq_len, seed=seed, eps=eps, batch_size=batch_size, **kwargs)
    from sinklab.analyze.common import cli_command

    result.command = cli_command(kind, result.settings)
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
