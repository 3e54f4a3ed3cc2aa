"""``sinklab train CONFIG_OR_PRESET [--set key=value ...] [--steps N] [--device D] [--dtype T] [--threads N]
[--resume] [--nproc N] --out DIR``.

``--device``, ``--dtype`` and ``--threads`` are shorthands for the config keys ``train.device``,
``train.precision`` (float32 -> fp32, bfloat16 -> bf16 autocast) and ``train.threads``; given, they
override the config file, absent they leave it as it is.

``--nproc N`` runs the same command on N local processes under ``torchrun`` (data parallel, see
:mod:`sinklab.train.distributed`); ``torchrun ... -m sinklab train ...`` does the same by hand
(several nodes). Under torchrun only rank 0 prints.

Also registers ``sinklab list presets``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from sinklab.cli.common import DTYPE_NAMES, THREADS, check_outputs, cli_text, invoked_command, out_option
from sinklab.cli.main import LISTERS, cli
from sinklab.fileio import read_json


def _list_presets() -> list[tuple[str, str]]:
    from sinklab.runs.config import preset_description, presets

    return [(name, preset_description(name)) for name in sorted(presets())]


LISTERS.register("presets", _list_presets)


@cli.command("train")
def train_cmd(
    config: str = typer.Argument(..., help="a TOML config file or a preset name (sinklab list presets)"),
    out: Path = out_option(..., "run folder: config.toml, metrics.jsonl, tb/, checkpoint.pt, final/"),
    set_: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                             help="override section.key=value (value parsed as TOML, "
                                             "so it may hold commas); repeat for several"),
    steps: Optional[int] = typer.Option(None, "--steps", help="number of optimizer steps (sets train.steps)"),
    resume: bool = typer.Option(False, "--resume", help="continue the run in --out from its checkpoint"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress bar (nor progress lines in a log file)"),
    nproc: int = typer.Option(1, "--nproc", min=1, help="data-parallel processes on this machine (launches torchrun; "
                              "train.batch_size stays the global batch)"),
    device: Optional[str] = typer.Option(None, "--device", help="auto | cpu | cuda | cuda:N | mps (sets train.device; "
                                         "default: the config's, auto unless it sets one)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="float32 | bfloat16: fp32 or bf16 autocast (sets "
                                        "train.precision; default: the config's)"),
    threads: Optional[int] = THREADS,
) -> None:
    """Pre-train a model from scratch and track its attention sinks on a fixed probe set.

    Ctrl-C stops it with one line: the checkpoint kept and the command that continues the run."""
    _check_out(Path(out), resume)
    import json

    from sinklab.errors import InputError
    from sinklab.train import distributed
    from sinklab.runs.config import load_config
    from sinklab.train.loop import TrainingInterrupted, train

    overrides = list(set_ or [])
    if steps is not None:
        overrides.append(f"train.steps={steps}")
    if device is not None:
        overrides.append(f"train.device={json.dumps(device)}")
    if dtype is not None:
        if dtype not in DTYPE_NAMES:
            raise InputError(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
        overrides.append(f"train.precision={json.dumps(_PRECISION[dtype])}")
    if threads is not None:
        overrides.append(f"train.threads={threads}")
    cfg = load_config(config, overrides)

    def args(resume: bool) -> list[str]:  # this command again (torchrun's ranks; the line that continues it)
        return (["train", config, "--out", str(out), *[a for o in overrides for a in ("--set", o)]]
                + ["--resume"] * resume + ["--no-progress"] * no_progress)

    if nproc > 1 and distributed.env_world_size() == 1:
        distributed.check_batch(distributed.Dist(world=nproc), cfg.train.batch_size)
        try:
            distributed.launch(nproc, args(resume))
        except KeyboardInterrupt:
            typer.echo(f"interrupted; {out} keeps its last checkpoint, if one was written; continue with: "
                       f"{_command(args(True) + ['--nproc', str(nproc)])}", err=True)
            raise typer.Exit(130) from None
        return
    if os.environ.get("RANK", "0") != "0":  # a torchrun rank other than 0: train silently
        train(cfg, out, resume=resume, progress=False)
        return
    typer.echo(f"run folder {out}; {cfg.train.steps} steps x {cfg.tokens_per_step} tokens; "
               f"attention={cfg.model.attention}, packing={cfg.data.packing}, weight decay {cfg.optim.weight_decay} "
               f"on {cfg.optim.decay}", err=True)
    try:
        res = train(cfg, out, resume=resume, progress=not no_progress, notify=lambda m: typer.echo(cli_text(m), err=True),
                    command=invoked_command())
    except TrainingInterrupted as e:
        typer.echo(interrupted_line(e, _command(args(e.checkpoint is not None))), err=True)
        raise typer.Exit(130) from None
    if res.already_finished:
        typer.echo(res.note)
        return
    summary_path = Path(out) / "summary.json"
    if summary_path.exists():
        typer.echo(done_line(read_json(summary_path, "run summary"), Path(out)))
    else:
        typer.echo(f"stopped at step {max(res.losses) if res.losses else 0}; resume with --resume")


#: ``--dtype`` -> ``train.precision``
_PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


def _command(args: list[str]) -> str:
    import shlex

    return shlex.join(["sinklab", *args])


def interrupted_line(e, command: str) -> str:
    """The line ``sinklab train`` prints on Ctrl-C: the step reached, the checkpoint kept and
    ``command``, the exact command that continues the run (or starts it again when no checkpoint
    was written yet). ``e``: the :class:`~sinklab.train.loop.TrainingInterrupted`."""
    from sinklab.train.checkpoint import CHECKPOINT_NAME

    head = f"interrupted at step {e.step} of {e.steps}"
    if e.checkpoint is None:
        return f"{head}, before the first checkpoint: nothing was kept; start it again with: {command}"
    return (f"{head}; kept the checkpoint of step {e.checkpoint} in {e.out / CHECKPOINT_NAME} "
            f"(steps after it are trained again); continue with: {command}")


def _check_out(out: Path, resume: bool) -> None:
    """Refuse a bad --out / --resume combination (or an unwritable --out or SINKLAB_HOME) before
    anything is printed or prepared."""
    from sinklab.errors import InputError

    check_outputs([("--out", out)])
    from sinklab.train.checkpoint import CHECKPOINT_NAME

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
