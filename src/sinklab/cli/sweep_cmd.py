"""``sinklab sweep STUDY.toml [--jobs J] [--out DIR] [--launcher local|slurm|submitit-local ...]``,
``sinklab report [ROOT] [--out DIR]`` (DIR/REPORT.md), ``sinklab dynamics LABEL=RUN ... --out DIR``
(DIR/dynamics.png)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from sinklab.cli.common import check_outputs, list_option, out_option, split_list
from sinklab.cli.main import cli


@cli.command("sweep")
def sweep_cmd(
    study: Path = typer.Argument(..., help="a study file, e.g. experiments/weight_decay.toml"),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="trainings at once (default 1); each gets cores // J "
                                       "torch threads. With --launcher slurm: the most jobs running at once (default: no cap)"),
    out: Optional[Path] = out_option(None, "sweep folder (default runs/NAME; a published study: --out results/NAME)"),
    cores: Optional[int] = typer.Option(None, "--cores", help="cores to share between the jobs (default: all)"),
    only: Optional[list[str]] = list_option("--only", "run only these points: folder names or labels, "
                                            "comma-separated (a label that holds a comma is taken whole)"),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="training seeds per point, train.seed = first_seed.. (default: the study's)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the points and their train commands, run nothing"),
    no_progress: bool = typer.Option(False, "--no-progress", help="no progress display"),
    pack: bool = typer.Option(False, "--pack", help="after the summary, keep the runs as one table "
                              "(runs.jsonl.gz: every run's lines with point / seed columns) instead of run folders; "
                              "a later sweep unpacks it first"),
    launcher: str = typer.Option("local", "--launcher", help="local (child processes of this command), slurm (one "
                                 "Slurm job per point and seed, through submitit) or submitit-local (the same jobs "
                                 "through submitit's local executor, all at once)"),
    partition: Optional[str] = typer.Option(None, "--partition", help="Slurm partition of the jobs"),
    gpus: int = typer.Option(0, "--gpus", help="GPUs per job (more than 1: data parallel, sinklab train --nproc)"),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="CPUs per job; the torch threads of a config without "
                                       "train.threads (default: the job's CPUs)"),
    time_min: int = typer.Option(24 * 60, "--time", help="time limit per job, minutes; a job that reaches it is "
                                 "requeued and resumes from its last checkpoint"),
    slurm_opt: Optional[list[str]] = list_option("--slurm-opt", "further sbatch options KEY=VALUE, comma-separated "
                                                 "(account=lab,qos=high,mem=64G; a comma inside a value stays: "
                                                 "exclude=n1,n2)"),
) -> None:
    """Run a study's grid (one `sinklab train` per point and seed), skip finished runs, resume stopped
    ones, then write summary.csv, summary.md and sink_rate.png (mean ± std over seeds)."""
    from sinklab.sweep.run import is_finished, run_dir, run_sweep, select_points, shell_command
    from sinklab.sweep.spec import point_config
    from sinklab.sweep.spec import load_study
    from sinklab.sweep.summary import markdown_table, summarize_sweep

    from sinklab.errors import InputError

    from sinklab.sweep.run import LAUNCHERS, SlurmOptions

    if launcher not in LAUNCHERS:
        raise InputError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    given = [n for n, v in (("--partition", partition), ("--gpus", gpus or None), ("--cpus", cpus),
                            ("--slurm-opt", slurm_opt or None), ("--time", None if time_min == 24 * 60 else time_min))
             if v is not None]
    if launcher == "local" and given:
        raise InputError(f"{', '.join(given)}: options of the submitted jobs; add --launcher slurm (or submitit-local)")
    extra = {}
    for o in slurm_pairs(slurm_opt):
        k, eq, v = o.partition("=")
        if not eq or not k.strip():
            raise InputError(f"--slurm-opt {o!r}: expected KEY=VALUE, e.g. account=lab")
        extra[k.strip()] = v.strip()
    opts = SlurmOptions(partition=partition, gpus=gpus, cpus=cpus, time_min=time_min, extra=extra)
    s = load_study(study)
    only = only_names(only, {p.label for p in s.points})
    if seeds is not None:
        if seeds < 1:
            raise InputError(f"--seeds must be >= 1, got {seeds}")
        s.seeds = seeds
    out = out or Path("runs") / s.name  # results/ only when asked (--out)
    if not dry_run:  # a dry run writes nothing
        check_outputs([("--out", out)])
    if dry_run:
        points = select_points(s, only)
        share = max(1, (cores or os.cpu_count() or 1) // (jobs or 1)) if launcher == "local" else cpus
        threads = {p.slug: point_config(s, p).train.threads or share or "$SLURM_CPUS_PER_TASK" for p in points}
        for k in s.seed_list:
            for p in points:
                d = run_dir(out, p, k)
                state = "finished" if is_finished(d) else ("resume" if (d / "checkpoint.pt").exists() else "new")
                typer.echo(f"[{state}] {p.label} (seed {k}): {shell_command(s, p, d, k, threads[p.slug], gpus)}")
        return
    status = run_sweep(s, out, jobs=jobs, cores=cores or os.cpu_count(), progress=not no_progress, only=only,
                       launcher=launcher, slurm=opts)
    failed = {k: v for k, v in status.items() if v.startswith("failed")}
    rows = summarize_sweep(out)
    typer.echo(markdown_table(rows))
    typer.echo(f"summary: {out / 'summary.md'}, {out / 'summary.csv'}, {out / 'sink_rate.png'}")
    if pack and not failed:
        from sinklab.sweep.store import pack as pack_runs

        typer.echo(f"runs packed into {pack_runs(out)}")
    for k, v in failed.items():
        typer.secho(f"{k}: {v}", fg=typer.colors.RED, err=True)
    if failed:
        raise typer.Exit(1)


def only_names(values: list[str] | None, labels: set[str]) -> list[str] | None:
    """``--only`` values -> point names: each value is split at its commas (``--only a,b``), except a
    value that is itself a point's label (a label of a grid over two keys holds a comma:
    ``"optim.weight_decay=0, optim.lr=0.001"``; its folder name never does). None: every point."""
    names: list[str] = []
    for v in values or []:
        names += [v] if v in labels else split_list(v, str, "--only") or []
    return names or None


def slurm_pairs(values: list[str] | None) -> list[str]:
    """``--slurm-opt`` values -> ``KEY=VALUE`` items: each value is split at the commas that start a
    new ``KEY=`` (``account=lab,qos=high`` -> two items), so a comma inside a value stays
    (``exclude=n1,n2`` -> one item)."""
    items: list[str] = []
    for v in values or []:
        for piece in v.split(","):
            if items and "=" not in piece and piece.strip():
                items[-1] += "," + piece
            elif piece.strip():
                items.append(piece)
    return items


#: the file ``sinklab report`` writes into its --out folder
REPORT_NAME = "REPORT.md"


@cli.command("report")
def report_cmd(
    root: Path = typer.Argument(Path("runs"), help="folder holding the sweep folders (default runs; the published studies: results)"),
    out: Optional[Path] = out_option(None, f"folder of the Markdown report {REPORT_NAME} (default ROOT)"),
    check: bool = typer.Option(False, "--check", help="exit 1 when any reported row was trained by code whose "
                               "training-code fingerprint differs from the current code's; write each row's "
                               "check to ROOT/fingerprint_check.csv"),
) -> None:
    """Gather finished sweeps into one Markdown report: tables, plots, paper values and verdicts. Every row's
    training-code fingerprint is compared with the current code's (one short canonical training per config
    shape and code version, cached); rows that differ are marked stale."""
    from sinklab.fileio import output_in_folder

    out = output_in_folder(root if out is None else out, REPORT_NAME)
    check_outputs([("--out", out.parent)])  # the fingerprint cache is in SINKLAB_HOME
    from sinklab.sweep.report import build_report, stale_rows, write_fingerprint_log

    build_report(root, out)
    typer.echo(f"report: {out}")
    if check:
        typer.echo(f"fingerprint checks: {write_fingerprint_log(root)}")
    stale = stale_rows(root)
    for s in stale:
        typer.secho(f"stale: {s}", fg=typer.colors.YELLOW, err=True)
    if stale:
        typer.echo(f"{len(stale)} reported rows were not trained by the current training code", err=True)
        if check:
            raise typer.Exit(1)
    else:
        typer.echo("every reported row was trained by the current training code (fingerprints match)")


@cli.command("dynamics")
def dynamics_cmd(
    runs: list[str] = typer.Argument(..., help="LABEL=RUN_FOLDER pairs, or bare run folders (an existing folder is "
                                     "taken as a folder even when its name holds =)"),
    out: Path = typer.Option(..., "--out", help="output folder: dynamics.png"),
    title: str = typer.Option("", "--title"),
    level: float = typer.Option(10.0, "--level", help="emergence level drawn on the Sink_1 panel (percent)"),
) -> None:
    """Plot Sink_1, attention mass on token 1 and validation loss against training step."""
    from sinklab.fileio import output_in_folder
    from sinklab.sweep.dynamics import DEFAULT_NAME, plot_dynamics

    path = output_in_folder(out, DEFAULT_NAME)
    check_outputs([("--out", out)], home=False)
    written = plot_dynamics(run_pairs(runs), path, level=level, title=title)
    typer.echo(f"dynamics: {written}")


def run_pairs(runs: list[str]) -> dict[str, str]:
    """``LABEL=RUN_FOLDER`` or a bare run folder (labelled by its name) -> {label: folder}. An existing
    path wins over the label syntax, so a folder whose name holds ``=`` is a bare run folder."""
    pairs = {}
    for r in runs:
        label, run = r.split("=", 1) if "=" in r and not Path(r).exists() else (Path(r).name, r)
        pairs[label] = run
    return pairs
