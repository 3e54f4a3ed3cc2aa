"""``sinklab train CONFIG_OR_PRESET [--set key=value ...] [--steps N] [--resume] [--nproc N] --out DIR``.

``--nproc N`` runs the same command on N local processes under ``torchrun`` (data parallel, see
:mod:`sinklab.train.distributed`); ``torchrun ... -m sinklab train ...`` does the same by hand
(several nodes). Under torchrun only rank 0 prints.

Also registers ``sinklab list presets``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from sinklab.cli.main import LISTERS, cli


def _list_presets() -> list[tuple[str, str]]:
    from sinklab.train.config import preset_description, presets

    return [(name, preset_description(name)) for name in sorted(presets())]


LISTERS.register("presets", _list_presets)


@cli.command("train")
def train_cmd(
    config: str = typer.Argument(..., help="a TOML config file or a preset name (sinklab list presets)"),
    out: Path = typer.Option(..., "--out", help="run folder: config.toml, metrics.jsonl, tb/, checkpoint.pt, final/"),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="override section.key=value (value parsed as TOML); repeatable"),
    steps: Optional[int] = typer.Option(None, "--steps", help="number of optimizer steps (sets train.steps)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its checkpoint"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="data-parallel processes on this machine (launches torchrun; "
                              "train.batch_size stays the global batch)"),
) -> None:
    """Pre-train a model from scratch and track its attention sinks on a fixed probe set."""
    from sinklab.train import distributed
    from sinklab.train.config import load_config
    from sinklab.train.loop import train

    overrides = list(set_ or [])
    if steps is not None:
        overrides.append(f"train.steps={steps}")
    cfg = load_config(config, overrides)
    _check_out(Path(out), resume)
    if nproc > 1 and distributed.env_world_size() == 1:
        distributed.check_batch(distributed.Dist(world=nproc), cfg.train.batch_size)
        args = ["train", config, "--out", str(out), *[a for o in overrides for a in ("--set", o)]]
        args += ["--resume"] * resume + ["--no-progress"] * no_progress
        distributed.launch(nproc, args)
        return
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: train silently
        train(cfg, out, resume=resume, progress=False)
        return
    typer.echo(f"run folder {out}; {cfg.train.steps} steps x {cfg.tokens_per_step} tokens; "
               f"attention={cfg.model.attention}, packing={cfg.data.packing}, weight decay {cfg.optim.weight_decay} "
               f"on {cfg.optim.decay}", err=True)
    res = train(cfg, out, resume=resume, progress=not no_progress, notify=lambda m: typer.echo(m, err=True))
    if res.already_finished:
        typer.echo(res.note)
        return
    summary_path = Path(out) / "summary.json"
    if summary_path.exists():
        typer.echo(done_line(json.loads(summary_path.read_text()), Path(out)))
    else:
        typer.echo(f"stopped at step {max(res.losses) if res.losses else 0}; resume with --resume")


def _check_out(out: Path, resume: bool) -> None:
    """Refuse a bad --out / --resume combination before anything is printed or prepared."""
    from sinklab.errors import InputError
    from sinklab.train.checkpoint import CHECKPOINT_NAME

    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; give a folder for the run")
    if resume and not (out / CHECKPOINT_NAME).exists():
        raise InputError(f"no checkpoint at {out / CHECKPOINT_NAME}; nothing to resume (run without --resume)")


def _num(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def done_line(s: dict, out: Path) -> str:
    """The last line of ``sinklab train``, from the run's summary.json.

    The throughput is the run's average over its wall time (all starts, data preparation, tracker
    and checkpoints included); the optimizer-step rate is labelled as such.
    """
    fin = s.get("final") or {}
    lvl = s.get("emerge_level")
    emerged = (f"Sink_1 first reached {lvl}% at step {s['emergence_step']}" if s.get("emergence_step") is not None
               else f"Sink_1 never reached {lvl}%")
    sink1 = (fin.get("sink_rate") or [None])[0]
    if s.get("wall_s") is not None:
        rate = (f"{_num(s['wall_s'], ',.1f')} s wall time, {_num(s.get('tokens_per_s'), ',.0f')} tokens/s on average "
                f"(optimizer steps alone: {_num(s.get('median_step_tokens_per_s'), ',.0f')} tokens/s, median step)")
    else:  # a summary written before wall time was recorded: its rate is the median step's
        rate = f"{_num(s.get('tokens_per_s'), ',.0f')} tokens/s (median optimizer step, tracker excluded)"
    return (f"done: {s['steps']} steps, {s['tokens']:,} tokens, {rate}; final loss {_num(s.get('final_loss'), '.4f')}, "
            f"val loss {_num(fin.get('val_loss'), '.4f')}, Sink_1 {_num(sink1, '.1f')}%; {emerged}; model in {out / 'final'}")
