"""Run a study's grid: one ``sinklab train`` per point, each in its own folder, J at a time.

Layout of ``--out`` (default ``results/NAME``)::

    study.json                    the parsed study (labels, overrides, paper values, expectations, seeds)
    runs/<slug>/seed<k>/          one training run with ``train.seed = k`` (config.toml, metrics.jsonl,
                                  final/, summary.json), k = first_seed .. first_seed + S - 1
    runs/<slug>/seed<k>/train.log the run's stdout/stderr
    runs/<slug>/seed<k>/sweep.json wall time accumulated over every (re)start, exit status, the
                                   last start's jobs, torch threads and load average at its end, and
                                   the training-code fingerprint of the code of each start
                                   (:mod:`sinklab.sweep.fingerprints`; also written into
                                   summary.json once the run has finished)
    summary.csv, summary.md one row per point (see :data:`COLUMNS`)
    sink_rate.png           Sink_1 (95% CI) against the swept value, paper values beside

Launchers (``launcher``): ``"local"`` (default) runs J trainings at once as child processes of the
sweep; ``"slurm"`` submits one Slurm job per point and seed through ``submitit`` (a job array: the
partition, GPUs, CPUs, time limit and any other ``sbatch`` option from :class:`SlurmOptions`; J caps
the array's running jobs) and waits for them; ``"submitit-local"`` runs the same jobs through
submitit's local executor on this machine (all at once: a check of the Slurm path). Each job runs
the same ``sinklab train`` command in the same run folder and writes the same files, so the skip /
resume / copy rules and the summary are the launcher's business in no way. A job that reaches its
time limit (or is preempted) is requeued by submitit and resumes from its last checkpoint; the
submitit logs and job pickles are in ``--out/submitit/``.

A run is *finished* when ``summary.json`` exists: it is skipped. A run with ``checkpoint.pt`` but
no ``summary.json`` (stopped or killed) is continued with ``--resume``. Stopping the sweep
(Ctrl-C, SIGTERM) stops the running trainings, which keep their last checkpoint; running the
same command again continues where it stopped. Each job runs with its config's ``train.threads``
(set by ``sinklab train`` itself; ``OMP_NUM_THREADS`` is set to match), or ``cores // J`` torch
threads when the config leaves it unset, since oversubscribed threads slow small models down many
times over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from sinklab.errors import InputError, param
from sinklab.fileio import atomic_write_text, read_json, reading
from sinklab.sweep.fingerprints import annotate, record_start
from sinklab.sweep.spec import Point, Study, point_config

SUMMARY_NAME = "summary.json"


def point_dir(out: Path, point: Point) -> Path:
    """Folder of one point (holding one run folder per seed)."""
    return out / "runs" / point.slug


def run_dir(out: Path, point: Point, seed: int = 0) -> Path:
    """Folder of one point's training run with ``train.seed = seed``."""
    return point_dir(out, point) / f"seed{seed}"


#: written by the trainer when a run diverges (sinklab.train.loop.DIVERGED_NAME): a finished outcome
DIVERGED_NAME = "diverged.json"


def is_finished(d: Path) -> bool:
    """A run is finished when the trainer wrote ``summary.json``, or ``diverged.json`` (it diverged:
    running it again would diverge at the same step)."""
    return (d / SUMMARY_NAME).exists() or (d / DIVERGED_NAME).exists()


def diverged_step(d: Path) -> int | None:
    """The step at which the run in ``d`` diverged (``diverged.json``), or None."""
    p = d / DIVERGED_NAME
    return int(read_json(p, "divergence record")["step"]) if p.exists() else None


def train_command(study: Study, point: Point, d: Path, seed: int = 0, nproc: int = 1) -> list[str]:
    """The ``sinklab train`` command line of one point and seed (``--resume`` when a checkpoint exists;
    ``--nproc N`` when ``nproc`` > 1: data parallel over the job's N GPUs)."""
    cmd = [sys.executable, "-c", "from sinklab.cli.main import app; app()", "train", study.base, "--out", str(d), "--no-progress"]
    for s in point.set_args(seed):
        cmd += ["--set", s]
    cmd += ["--set", f"train.seed={seed}"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    if (d / "checkpoint.pt").exists():
        cmd.append("--resume")
    return cmd


def _train_env(threads: int) -> dict[str, str]:
    """The environment of one training: this one with ``threads`` OpenMP / MKL threads."""
    n = str(threads)
    return {**os.environ, "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TOKENIZERS_PARALLELISM": "false"}


def _record(d: Path) -> dict:
    p = d / "sweep.json"
    return read_json(p, "sweep record") if p.exists() else {"wall_s": 0.0, "starts": 0}


def _close_record(d: Path, t0: float, returncode, jobs: int, threads: int, **extra) -> None:
    """Add one start's wall time to ``sweep.json`` with its exit status and the conditions it ran under
    (trainings at once, torch threads each, the load average at its end: 1, 5, 15 min; ``extra``:
    e.g. the launcher and the job id of a Slurm job)."""
    rec = _record(d)
    rec["wall_s"] = round(rec["wall_s"] + time.time() - t0, 1)
    rec["starts"] += 1
    rec["returncode"] = returncode
    rec.update(jobs=jobs, threads=threads, load_at_end=[round(x, 2) for x in os.getloadavg()], **extra)
    _write_record(d, rec)


def _write_record(d: Path, rec: dict) -> None:
    atomic_write_text(d / "sweep.json", json.dumps(rec, indent=1))


def _last_step(d: Path) -> int:
    p = d / "metrics.jsonl"
    if not p.exists():
        return 0
    try:
        lines = p.read_text().strip().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (ValueError, KeyError, TypeError, OSError):  # a line being written, or a damaged file: no progress shown
        return 0


def finished_runs_by_config(root: Path) -> dict[str, Path]:
    """Finished run folders (with ``final/``) of every sweep under ``root`` (``root/*/runs/*/seed*``),
    keyed by the text of their ``config.toml`` (the first in path order wins).

    Training is bit-deterministic for a resolved config *on one machine, torch build, thread count
    and training code*, so a run found here under the text of a pending run's config is the run
    that config would produce only when :func:`same_numerics` holds as well: only then does a sweep
    copy it instead of training again (the reference point that several studies share is trained once).
    """
    index: dict[str, Path] = {}
    for cfg in sorted(root.glob("*/runs/*/seed*/config.toml")):
        d = cfg.parent
        if is_finished(d) and (d / "final").exists():
            with reading(cfg, "run config"):
                index.setdefault(cfg.read_text(encoding="utf-8"), d)
    return index


def same_numerics(src: Path, cfg, threads: int, fingerprint: Callable[[], str]) -> str:
    """Why the finished run ``src`` is *not* the run ``cfg`` would give here ("" when it is): its
    ``summary.json`` must record the current code's fingerprint (``fingerprint()``, called only
    when needed), computed on the CPU that trained it (a fingerprint holds its CPU's rounding), this
    torch version and ``threads`` torch threads."""
    import torch

    from sinklab.sweep.fingerprints import fingerprint_env

    s = read_json(src / SUMMARY_NAME, "run summary")
    if s.get("torch_version") != torch.__version__:
        return f"torch {s.get('torch_version')} there, {torch.__version__} here"
    if s.get("threads") != threads:
        return f"{s.get('threads')} threads there, {threads} here"
    fenv = fingerprint_env(s)
    if (fenv.get("cpu_model"), fenv.get("torch_version")) != (s.get("cpu_model"), s.get("torch_version")):
        return f"fingerprint computed on {fenv.get('cpu_model')}, the run trained on {s.get('cpu_model')}"
    fp = fingerprint()
    if s.get("code_fingerprint") != fp:
        return f"training-code fingerprint {s.get('code_fingerprint')} there, {fp} here"
    return ""


def copy_run(src: Path, dst: Path) -> None:
    """Copy a finished run folder (final model included, checkpoint left out) and note its origin in
    ``sweep.json`` (``copied_from``; wall time 0: nothing was trained)."""
    import shutil

    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoint.pt", "checkpoint.pt.tmp*", "sweep.json",
                                                            "final_ci.json"))
    _write_record(dst, {"wall_s": 0.0, "starts": 0, "returncode": 0,
                        "copied_from": os.path.relpath(src.resolve(), dst.resolve())})


def write_study_json(study: Study, out: Path) -> None:
    """``study.json``: what the report needs to read the sweep without the study file. The study file's
    ``path`` is stored relative to the sweep folder, so a clone elsewhere finds its own copy."""
    out.mkdir(parents=True, exist_ok=True)
    d = {k: v for k, v in asdict(study).items() if k != "path"}
    d["path"] = os.path.relpath(Path(study.path).resolve(), out.resolve()) if study.path else None
    atomic_write_text(out / "study.json", json.dumps(d, indent=1, default=str))


def select_points(study: Study, only: list[str] | None) -> list[Point]:
    """The points of ``study`` named in ``only`` (labels or folder names; None or empty: all).

    Raises:
        InputError: a name in ``only`` matches no point (lists the valid labels).
    """
    if not only:
        return list(study.points)
    keep = [p for p in study.points if p.label in only or p.slug in only]
    missing = set(only) - {p.label for p in keep} - {p.slug for p in keep}
    if missing:
        raise InputError(f"no point labelled {', '.join(repr(m) for m in sorted(missing))}; labels: "
                         f"{', '.join(repr(p.label) for p in study.points)}")
    return keep


def shell_command(study: Study, point: Point, d: Path, seed: int, threads: int | str, nproc: int = 1) -> str:
    """The exact shell line the sweep runs for one point and seed (``sinklab train ...`` with the
    thread setting it applies: a number, or a shell expression such as ``$SLURM_CPUS_PER_TASK``),
    quoted so that it can be pasted into a shell."""
    import shlex

    args = train_command(study, point, d, seed, nproc=nproc)[3:]
    return f"OMP_NUM_THREADS={threads} sinklab " + " ".join(shlex.quote(a) for a in args)


def run_sweep(study: Study, out: str | Path, *, jobs: int | None = 1, cores: int | None = None, progress: bool = True,
              only: list[str] | None = None, poll_s: float = 1.0, seeds: int | None = None,
              reuse: bool = True, on_event: Callable[[str, Point], None] | None = None,
              launcher: str = "local", slurm: "SlurmOptions | None" = None) -> dict[str, str]:
    """Run every unfinished (point, seed) of ``study``; return {"slug/seed<k>": "done" | "skipped" | "failed (rc)"}.

    Args:
        study: the parsed study.
        out: the sweep folder.
        jobs: J, trainings at once (local; None = 1); with a submitit launcher the most jobs of the
            array running at once (None = no cap).
        launcher: one of :data:`LAUNCHERS` (see the module docstring).
        slurm: the jobs' resources for the submitit launchers (default :class:`SlurmOptions`()).
        seeds: S, training seeds per point (``train.seed = first_seed .. first_seed + S - 1``);
            default ``study.seeds``. The number used is written to ``study.json``.
        reuse: copy a finished run with a byte-identical resolved config from a sibling sweep folder
            (``out/..``, this one included) instead of training it again, when it was trained by code
            with the current fingerprint, the same torch and the same threads (see
            :func:`finished_runs_by_config`, :func:`same_numerics`); status "copied".
        cores: cores to share (default ``os.cpu_count()``); each job gets ``max(1, cores // J)`` threads.
        progress: show a rich progress display (one bar per running point, one for the sweep).
        only: run only the points with these labels or slugs.
        on_event: called with ("start" | "done" | "failed", point), for tests.

    Raises:
        InputError: ``jobs < 1``, an unknown launcher, or a label in ``only`` matches no point.
        KeyboardInterrupt: re-raised after stopping the running trainings (their checkpoints survive;
            submitted jobs are cancelled).
    """
    if launcher not in LAUNCHERS:
        raise InputError(f"{param('launcher')} must be one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    local = launcher == "local"
    if jobs is None and local:
        jobs = 1
    if jobs is not None and jobs < 1:
        raise InputError(f"{param('jobs')} must be >= 1, got {jobs}")
    slurm = slurm or SlurmOptions()
    if seeds is not None:
        if seeds < 1:
            raise InputError(f"{param('seeds')} must be >= 1, got {seeds}")
        study.seeds = seeds
    out = Path(out)
    from sinklab.sweep.store import unpack_in_place

    unpack_in_place(out)  # a packed (published) study: its finished runs are skipped, not trained again
    write_study_json(study, out)
    points = select_points(study, only)
    # torch threads of a training whose config leaves train.threads unset: the local jobs share the
    # cores; a submitted job takes its --cpus (or, when not given, the CPUs it finds on its node)
    share = max(1, (cores or os.cpu_count() or 1) // jobs) if local else slurm.cpus
    status, todo, run_threads = _plan_runs(study, out, points, share, reuse=reuse, on_event=on_event)
    # steps per point, for the progress bars
    steps = {}
    for p, _ in todo:
        if p.slug not in steps:
            steps[p.slug] = point_config(study, p).train.steps  # validates every config before starting any run

    n_jobs = len(points) * study.seeds
    display = _Display(study, n_jobs, n_jobs - len(todo), progress)
    if not local:
        _run_submitted(study, out, todo, run_threads, steps, status, display, launcher=launcher, slurm=slurm,
                       jobs=jobs, poll_s=poll_s, on_event=on_event)
        return status
    _run_local(study, out, todo, run_threads, steps, status, display, jobs=jobs, poll_s=poll_s, on_event=on_event)
    return status


def _plan_runs(study: Study, out: Path, points: list[Point], share: int, *, reuse: bool,
               on_event: Callable[[str, Point], None] | None) -> tuple[dict[str, str], list[tuple[Point, int]], dict[str, int]]:
    """Which (point, seed) runs :func:`run_sweep` still has to train, in seed-major order.

    Runs already finished get status "skipped"; with ``reuse``, a finished sibling run of the same
    resolved config and numerics is copied (status "copied"). ``share``: threads of a run whose config
    leaves ``train.threads`` unset.

    Returns:
        ``(status, todo, run_threads)``: status by ``"slug/seed<k>"``, the (point, seed) pairs to train,
        the torch threads of each point's runs by slug.
    """
    status: dict[str, str] = {}
    todo: list[tuple[Point, int]] = []
    # seed-major order: every point's first seed before any second seed, so a stopped sweep has
    # the whole grid at one seed rather than a few points at all seeds
    from sinklab.runs.config import to_toml

    finished = finished_runs_by_config(out.resolve().parent) if reuse else {}
    run_threads: dict[str, int] = {}
    for k in study.seed_list:
        for p in points:
            d = run_dir(out, p, k)
            cfg = point_config(study, p, k)
            run_threads[p.slug] = cfg.train.threads or share
            if is_finished(d):
                status[f"{p.slug}/seed{k}"] = "skipped"
                annotate(d)  # a run finished while no sweep was watching: its recorded fingerprints
                continue
            if reuse and not (d / "checkpoint.pt").exists():
                src = finished.get(to_toml(cfg))
                if src is not None and src.resolve() != d.resolve():
                    from sinklab.sweep.fingerprints import current_fingerprint

                    threads = run_threads[p.slug]
                    why = same_numerics(src, cfg, threads, lambda: current_fingerprint(cfg, threads, src))
                    if not why:
                        copy_run(src, d)
                        status[f"{p.slug}/seed{k}"] = "copied"
                        continue
                    if on_event:
                        on_event(f"not copied: {why}", p)
            todo.append((p, k))
    return status, todo, run_threads


def _run_local(study: Study, out: Path, todo: list[tuple[Point, int]], run_threads: dict[str, int],
               steps: dict[str, int], status: dict[str, str], display: "_Display", *, jobs: int, poll_s: float,
               on_event: Callable[[str, Point], None] | None) -> None:
    """Train ``todo`` as local subprocesses, ``jobs`` at once, polling every ``poll_s`` seconds; fills
    ``status``. On any exception (Ctrl-C, SIGTERM) the running trainings are stopped (their
    checkpoints survive) and it is re-raised."""
    prev_term = _term_as_interrupt()
    running: dict[str, tuple[subprocess.Popen, Point, float, object, int]] = {}
    queue = list(todo)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                p, k = queue.pop(0)
                running[f"{p.slug}/seed{k}"] = _start_local(study, out, p, k, run_threads[p.slug])
                display.start(p, k, steps[p.slug])
                if on_event:
                    on_event("start", p)
            time.sleep(poll_s)
            for slug, (proc, p, t0, log, k) in list(running.items()):
                d = run_dir(out, p, k)
                display.update(slug, _last_step(d))
                rc = proc.poll()
                if rc is None:
                    continue
                log.close()
                _close_record(d, t0, rc, jobs, run_threads[p.slug])
                del running[slug]
                ok = rc == 0 and is_finished(d)
                annotate(d)
                status[slug] = _outcome(d, rc)
                display.finish(slug, ok)
                if on_event:
                    on_event("done" if ok else "failed", p)
    except BaseException:
        for slug, (proc, p, t0, log, k) in running.items():
            _stop(proc)
            log.close()
            _close_record(run_dir(out, p, k), t0, "stopped", jobs, run_threads[p.slug])
        raise
    finally:
        display.close()
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)


def _start_local(study: Study, out: Path, p: Point, k: int, threads: int) -> tuple[subprocess.Popen, Point, float, object, int]:
    """Start seed ``k`` of point ``p`` as a ``sinklab train`` subprocess logging to its ``train.log``;
    returns ``(process, point, start time, log file, seed)``."""
    d = run_dir(out, p, k)
    d.mkdir(parents=True, exist_ok=True)
    record_start(d, point_config(study, p, k), threads)  # the code fingerprint: once per config shape and code (cached)
    cmd = train_command(study, p, d, k)
    log = open(d / "train.log", "a")
    log.write(f"\n$ {' '.join(cmd)}\n")
    log.flush()
    env = _train_env(threads)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, p, time.time(), log, k


def _outcome(d: Path, rc) -> str:
    """The status of a training that ended with exit status ``rc`` in run folder ``d``."""
    if rc == 0 and is_finished(d):
        return "done"
    div = diverged_step(d)
    return f"diverged at step {div}" if div is not None else f"failed ({rc}; see {d / 'train.log'})"


# ----------------------------------------------------------------------------- submitit (Slurm) jobs

#: the values of ``sinklab sweep --launcher``
LAUNCHERS = ("local", "slurm", "submitit-local")


@dataclass
class SlurmOptions:
    """Resources of each submitted job (one training).

    Fields:
        partition: Slurm partition (None: the cluster's default).
        gpus: GPUs per job; more than 1 trains data parallel over them (``sinklab train --nproc``).
        cpus: CPUs per job (``--cpus-per-task``); also the torch threads of a config that leaves
            ``train.threads`` unset (None: the CPUs the job finds on its node).
        time_min: time limit of a job in minutes; a job that reaches it is requeued (up to
            ``max_requeue`` times) and resumes from its last checkpoint.
        max_requeue: requeues after a time limit or preemption.
        extra: further ``sbatch`` options, e.g. ``{"account": "lab", "qos": "high", "mem": "64G"}``.
    """

    partition: str | None = None
    gpus: int = 0
    cpus: int | None = None
    time_min: int = 24 * 60
    max_requeue: int = 3
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise InputError(f"{param('gpus')} must be >= 0, got {self.gpus}")
        if self.cpus is not None and self.cpus < 1:
            raise InputError(f"{param('cpus')} must be >= 1, got {self.cpus}")
        if self.time_min < 1:
            raise InputError(f"{param('time_min')} must be >= 1 minute, got {self.time_min}")


def make_executor(launcher: str, folder: Path, opts: SlurmOptions, *, name: str = "sinklab",
                  jobs: int | None = None):
    """The submitit executor of ``launcher`` ("slurm" or "submitit-local"), logs and pickles in ``folder``.

    "slurm": ``submitit.SlurmExecutor`` with the partition, ``--gpus-per-node``, ``--cpus-per-task``,
    ``--time`` (minutes), ``--array`` parallelism ``jobs`` and ``opts.extra`` as further ``#SBATCH``
    lines; USR2 90 s before the limit lets submitit requeue the job. "submitit-local":
    ``submitit.LocalExecutor`` with the same time limit and GPUs.

    Raises:
        InputError: "slurm" where Slurm is not installed (no ``srun``).
        MissingExtraError: submitit is not installed (the extra ``slurm``).
    """
    from sinklab.errors import require

    submitit = require("submitit", "slurm", f"sinklab sweep --launcher {launcher}")

    if launcher == "slurm":
        import shutil

        if shutil.which("srun") is None:
            raise InputError(f"{param('launcher', 'slurm')}: no Slurm here (srun not found on PATH); run the sweep on the "
                             f"cluster's login node, or use {param('launcher', 'local')} (or submitit-local)")
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=opts.max_requeue)
        params = {"time": opts.time_min, "job_name": name, "signal_delay_s": 90, "ntasks_per_node": 1, "nodes": 1}
        if opts.partition:
            params["partition"] = opts.partition
        if opts.gpus:
            params["gpus_per_node"] = opts.gpus
        if opts.cpus:
            params["cpus_per_task"] = opts.cpus
        if jobs is not None:
            params["array_parallelism"] = jobs
        if opts.extra:
            params["additional_parameters"] = dict(opts.extra)
        ex.update_parameters(**params)
        return ex
    ex = submitit.LocalExecutor(folder=folder, max_num_timeout=opts.max_requeue)
    ex.update_parameters(timeout_min=opts.time_min, gpus_per_node=opts.gpus)
    return ex


class TrainJob:
    """What one submitted job runs: ``sinklab train`` of one point and seed in its run folder, as the
    local launcher does (``train.log``, ``sweep.json``), on the node. Returns the exit status.

    ``checkpoint()`` (called by submitit at a time limit or preemption) stops the training, which
    keeps its last checkpoint, and resubmits this job, which then continues it (``--resume``).
    """

    def __init__(self, study: Study, point: Point, d: Path, seed: int, threads: int | None, gpus: int = 0) -> None:
        self.study, self.point, self.d, self.seed, self.threads, self.gpus = study, point, d, seed, threads, gpus
        self._proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_proc": None}

    def __call__(self) -> int:
        threads = self.threads or len(os.sched_getaffinity(0))
        self.d.mkdir(parents=True, exist_ok=True)
        cmd = train_command(self.study, self.point, self.d, self.seed, nproc=self.gpus)
        t0 = time.time()
        with open(self.d / "train.log", "a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_train_env(threads),
                                          start_new_session=True)
            rc = self._proc.wait()
        _close_record(self.d, t0, rc, 1, threads, launcher="submitit", job_id=_job_id())
        return rc

    def checkpoint(self, *args, **kwargs):
        import submitit

        if self._proc is not None and self._proc.poll() is None:
            _stop(self._proc)  # SIGINT: the training stops and keeps its last checkpoint
        return submitit.helpers.DelayedSubmission(TrainJob(self.study, self.point, self.d, self.seed, self.threads,
                                                           self.gpus))


def _job_id() -> str | None:
    """The submitit job id of this process (the Slurm job id, array index included), None outside a job."""
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # not in a submitit job
        return None


def _run_submitted(study: Study, out: Path, todo: list[tuple[Point, int]], run_threads: dict[str, int | None],
                   steps: dict[str, int], status: dict[str, str], display: "_Display", *, launcher: str,
                   slurm: SlurmOptions, jobs: int | None, poll_s: float,
                   on_event: Callable[[str, Point], None] | None) -> None:
    """Submit one job per (point, seed) of ``todo`` as one array and wait for them, filling ``status``.
    Stopping the sweep (Ctrl-C, SIGTERM) cancels the jobs not finished (their checkpoints survive)."""
    if not todo:
        display.close()
        return
    executor = make_executor(launcher, out / "submitit", slurm, name=f"sinklab-{study.name}", jobs=jobs)
    for p, k in todo:  # computed here, on the submitting machine (fingerprint_env says so), once per config shape
        record_start(run_dir(out, p, k), point_config(study, p, k), run_threads[p.slug])
    submitted = []
    with executor.batch():
        for p, k in todo:
            submitted.append((executor.submit(TrainJob(study, p, run_dir(out, p, k), k, run_threads[p.slug],
                                                       slurm.gpus)), p, k))
    pending = {f"{p.slug}/seed{k}": (job, p, k) for job, p, k in submitted}
    for _, p, _k in submitted:
        if on_event:
            on_event("start", p)
    prev_term = _term_as_interrupt()
    try:
        while pending:
            time.sleep(poll_s)
            for key, (job, p, k) in list(pending.items()):
                d = run_dir(out, p, k)
                step = _last_step(d)
                if step and key not in display.tasks:
                    display.start(p, k, steps[p.slug])
                display.update(key, step)
                if not job.done():
                    continue
                del pending[key]
                try:
                    rc = job.result()
                except Exception as e:  # the job itself failed (killed, out of time after its requeues)
                    rc = f"job {job.job_id}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}"
                annotate(d)
                status[key] = _outcome(d, rc)
                display.finish(key, status[key] == "done")
                if on_event:
                    on_event("done" if status[key] == "done" else "failed", p)
    except BaseException:
        for job, _p, _k in pending.values():
            job.cancel(check=False)
        raise
    finally:
        display.close()
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)


def _raise_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def _term_as_interrupt():
    """Treat SIGTERM like Ctrl-C (so the running trainings are stopped cleanly); returns the old handler,
    or None when not in the main thread (signal handlers can only be set there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:  # started in the background by a shell
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return old


def _stop(proc: subprocess.Popen) -> None:
    """Stop one training process group (SIGINT first so it exits cleanly, then SIGKILL)."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


class _Display:
    """rich progress: one bar for the sweep, one per running point (steps from metrics.jsonl)."""

    def __init__(self, study: Study, total: int, done: int, enabled: bool) -> None:
        self.enabled = enabled and total > 0
        self.tasks: dict[str, int] = {}
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), transient=False)
        self.progress.start()
        self.sweep = self.progress.add_task(f"sweep {study.name}", total=total, completed=done)

    def start(self, p: Point, seed: int, steps: int) -> None:
        if self.enabled:
            self.tasks[f"{p.slug}/seed{seed}"] = self.progress.add_task(f"  {p.label} (seed {seed})", total=steps)
            self.labels = {**getattr(self, "labels", {}), f"{p.slug}/seed{seed}": f"{p.label} (seed {seed})"}

    def update(self, key: str, step: int) -> None:
        if self.enabled and key in self.tasks:
            self.progress.update(self.tasks[key], completed=step)

    def finish(self, key: str, ok: bool) -> None:
        if not self.enabled:
            return
        t = self.tasks.pop(key, None)
        if t is not None:
            self.progress.update(t, description=f"  {self.labels.get(key, key)} {'done' if ok else 'FAILED'}")
            self.progress.stop_task(t)
        self.progress.advance(self.sweep)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()
