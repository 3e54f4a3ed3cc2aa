"""Run a study's grid: one ``sinklab train`` per point, each in its own folder, J at a time.

Layout of ``--out`` (default ``results/NAME``)::

    study.json              the parsed study (labels, overrides, paper values, expectations)
    runs/<slug>/            one training run (config.toml, metrics.jsonl, final/, summary.json)
    runs/<slug>/train.log   the run's stdout/stderr
    runs/<slug>/sweep.json  wall time accumulated over every (re)start, exit status
    summary.csv, summary.md one row per point (see :data:`COLUMNS`)
    sink_rate.png           Sink_1 (95% CI) against the swept value, paper values beside

A run is *finished* when ``summary.json`` exists: it is skipped. A run with ``checkpoint.pt`` but
no ``summary.json`` (stopped or killed) is continued with ``--resume``. Stopping the sweep
(Ctrl-C, SIGTERM) stops the running trainings, which keep their last checkpoint; running the
same command again continues where it stopped. Each job runs with ``cores // J`` torch threads
(``OMP_NUM_THREADS``), since oversubscribed threads slow small models down many times over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from sinklab.errors import InputError
from sinklab.sweep.spec import Point, Study

SUMMARY_NAME = "summary.json"


def run_dir(out: Path, point: Point) -> Path:
    """Folder of one point's training run."""
    return out / "runs" / point.slug


def is_finished(d: Path) -> bool:
    """A run is finished when the trainer wrote ``summary.json``."""
    return (d / SUMMARY_NAME).exists()


def train_command(study: Study, point: Point, d: Path) -> list[str]:
    """The ``sinklab train`` command line of one point (``--resume`` when a checkpoint exists)."""
    cmd = [sys.executable, "-c", "from sinklab.cli.main import app; app()", "train", study.base, "--out", str(d), "--no-progress"]
    for s in point.set_args():
        cmd += ["--set", s]
    if (d / "checkpoint.pt").exists():
        cmd.append("--resume")
    return cmd


def _record(d: Path) -> dict:
    p = d / "sweep.json"
    return json.loads(p.read_text()) if p.exists() else {"wall_s": 0.0, "starts": 0}


def _write_record(d: Path, rec: dict) -> None:
    tmp = d / "sweep.json.tmp"
    tmp.write_text(json.dumps(rec, indent=1))
    os.replace(tmp, d / "sweep.json")


def _last_step(d: Path) -> int:
    p = d / "metrics.jsonl"
    if not p.exists():
        return 0
    try:
        lines = p.read_text().strip().splitlines()
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (ValueError, KeyError, json.JSONDecodeError):
        return 0


def write_study_json(study: Study, out: Path) -> None:
    """``study.json``: what the report needs to read the sweep without the study file."""
    out.mkdir(parents=True, exist_ok=True)
    d = {k: v for k, v in asdict(study).items() if k != "path"}
    d["path"] = str(study.path) if study.path else None
    (out / "study.json").write_text(json.dumps(d, indent=1, default=str))


def run_sweep(study: Study, out: str | Path, *, jobs: int = 1, cores: int | None = None, progress: bool = True,
              only: list[str] | None = None, poll_s: float = 1.0,
              on_event: Callable[[str, Point], None] | None = None) -> dict[str, str]:
    """Run every unfinished point of ``study``; return {slug: "done" | "skipped" | "failed (rc)"}.

    Args:
        study: the parsed study.
        out: the sweep folder.
        jobs: J, trainings at once.
        cores: cores to share (default ``os.cpu_count()``); each job gets ``max(1, cores // J)`` threads.
        progress: show a rich progress display (one bar per running point, one for the sweep).
        only: run only the points with these labels or slugs.
        on_event: called with ("start" | "done" | "failed", point), for tests.

    Raises:
        InputError: ``jobs < 1`` or a label in ``only`` matches no point.
        KeyboardInterrupt: re-raised after stopping the running trainings (their checkpoints survive).
    """
    if jobs < 1:
        raise InputError(f"--jobs must be >= 1, got {jobs}")
    out = Path(out)
    write_study_json(study, out)
    points = study.points
    if only:
        keep = [p for p in points if p.label in only or p.slug in only]
        missing = set(only) - {p.label for p in keep} - {p.slug for p in keep}
        if missing:
            raise InputError(f"no point labelled {', '.join(sorted(missing))}; labels: {', '.join(p.label for p in points)}")
        points = keep
    threads = max(1, (cores or os.cpu_count() or 1) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}
    status: dict[str, str] = {}
    todo = []
    for p in points:
        if is_finished(run_dir(out, p)):
            status[p.slug] = "skipped"
        else:
            todo.append(p)
    # steps per point, for the progress bars
    steps = {}
    for p in todo:
        from sinklab.sweep.spec import point_config

        steps[p.slug] = point_config(study, p).train.steps  # validates every config before starting any run

    display = _Display(study, len(points), len(points) - len(todo), progress)
    prev_term = _term_as_interrupt()
    running: dict[str, tuple[subprocess.Popen, Point, float, object]] = {}
    queue = list(todo)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                p = queue.pop(0)
                d = run_dir(out, p)
                d.mkdir(parents=True, exist_ok=True)
                cmd = train_command(study, p, d)
                log = open(d / "train.log", "a")
                log.write(f"\n$ {' '.join(cmd)}\n")
                log.flush()
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                running[p.slug] = (proc, p, time.time(), log)
                display.start(p, steps[p.slug])
                if on_event:
                    on_event("start", p)
            time.sleep(poll_s)
            for slug, (proc, p, t0, log) in list(running.items()):
                d = run_dir(out, p)
                display.update(p, _last_step(d))
                rc = proc.poll()
                if rc is None:
                    continue
                log.close()
                rec = _record(d)
                rec["wall_s"] = round(rec["wall_s"] + time.time() - t0, 1)
                rec["starts"] += 1
                rec["returncode"] = rc
                _write_record(d, rec)
                del running[slug]
                ok = rc == 0 and is_finished(d)
                status[slug] = "done" if ok else f"failed ({rc}; see {d / 'train.log'})"
                display.finish(p, ok)
                if on_event:
                    on_event("done" if ok else "failed", p)
    except BaseException:
        for slug, (proc, p, t0, log) in running.items():
            _stop(proc)
            log.close()
            d = run_dir(out, p)
            rec = _record(d)
            rec["wall_s"] = round(rec["wall_s"] + time.time() - t0, 1)
            rec["starts"] += 1
            rec["returncode"] = "stopped"
            _write_record(d, rec)
        raise
    finally:
        display.close()
        if prev_term is not None:
            signal.signal(signal.SIGTERM, prev_term)
    return status


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

    def start(self, p: Point, steps: int) -> None:
        if self.enabled:
            self.tasks[p.slug] = self.progress.add_task(f"  {p.label}", total=steps)

    def update(self, p: Point, step: int) -> None:
        if self.enabled and p.slug in self.tasks:
            self.progress.update(self.tasks[p.slug], completed=step)

    def finish(self, p: Point, ok: bool) -> None:
        if not self.enabled:
            return
        t = self.tasks.pop(p.slug, None)
        if t is not None:
            self.progress.update(t, description=f"  {p.label} {'done' if ok else 'FAILED'}")
            self.progress.stop_task(t)
        self.progress.advance(self.sweep)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()
