"""The training-code fingerprint on the study side: computed by the study tool, once per config shape
and code version, never by a training.

A training records what its numbers depend on besides the config (``summary.json``: ``torch_version``,
``cpu_model``, ``threads``; ``code``: the last start's commit, dirty flag and source digest,
:func:`sinklab.provenance.code_version`; ``code_starts``: every start's). The fingerprint itself
(:mod:`sinklab.train.fingerprint`: the hash of a 3-step canonical training of the config) is computed
here, with the current code, cached under ``$SINKLAB_HOME/fingerprints/`` by the config's shape (its
canonical config: seed and starting weights left out), the code's source digest (the commit and its
dirty diff) and this machine's torch and CPU (:func:`sinklab.train.fingerprint.cached_fingerprint`):

* ``sinklab sweep`` calls :func:`record_start` before it launches each training (every start): the
  fingerprint of the code it launches goes into the run's ``sweep.json`` (``fingerprints``: source
  digest -> fingerprint, the torch and CPU it was computed on, the commit); once the run has finished,
  :func:`annotate` writes into its ``summary.json`` ``code_fingerprints`` (every start's, through its
  source digest; ``"none"`` for a start the sweep did not launch), ``code_fingerprint`` (the last
  start's) and ``fingerprint_env`` (the torch and CPU the fingerprints were computed on), the fields
  that the summary, the copy rule (:func:`sinklab.sweep.run.same_numerics`) and ``report --check``
  read. The seeds of a point share one canonical training (the seed is not part of it).
* ``sinklab report --check`` computes :func:`current_fingerprint` of every seed's config and decides
  whether the seed was trained by code with the current numerics
  (:func:`sinklab.sweep.summary.seed_is_current`).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from sinklab.fileio import atomic_write_text, read_json
from sinklab.runs.config import RunConfig

#: the run folder's record of the sweep (also written by :mod:`sinklab.sweep.run`)
RECORD_NAME = "sweep.json"
SUMMARY_NAME = "summary.json"


def with_threads(cfg: RunConfig, threads: int | None) -> RunConfig:
    """``cfg`` with ``train.threads`` set to the torch threads the run trains with, when the config leaves it
    unset (a copy; ``cfg`` itself otherwise): the thread count changes the rounding, so the canonical
    training runs with the run's."""
    if cfg.train.threads is not None or not threads:
        return cfg
    c = copy.deepcopy(cfg)
    c.train.threads = int(threads)
    return c


def current_fingerprint(cfg: RunConfig, threads: int | None = None, out: Path | None = None) -> str:
    """The current code's training-code fingerprint of ``cfg`` trained with ``threads`` torch threads
    (used when ``train.threads`` is unset), on this machine: 16 hex digits, cached
    (:func:`sinklab.train.fingerprint.cached_fingerprint`; a few seconds the first time). ``out``: the run
    folder, only to find a run-local token cache.

    Raises:
        whatever :func:`sinklab.train.loop.train` raises for the config (a config that cannot start has
        no fingerprint); a divergence within the canonical steps is a fingerprint, not an error.
    """
    from sinklab.train.fingerprint import cached_fingerprint
    from sinklab.train.loop import code_fingerprint

    return cached_fingerprint(with_threads(cfg, threads), code_fingerprint, out)


def run_fingerprint(run: Path) -> str:
    """The current code's fingerprint for the finished run folder ``run``: its ``config.toml`` trained with
    the threads its ``summary.json`` records (see :func:`current_fingerprint`).

    Raises:
        InputError: no ``config.toml`` or ``summary.json`` there; and what :func:`current_fingerprint` raises.
    """
    from sinklab.runs.config import load_config

    s = read_json(run / SUMMARY_NAME, "run summary")
    return current_fingerprint(load_config(run / "config.toml"), s.get("threads"), run)


def _record(d: Path) -> dict[str, Any]:
    p = d / RECORD_NAME
    return read_json(p, "sweep record") if p.exists() else {"wall_s": 0.0, "starts": 0}


def record_start(d: Path, cfg: RunConfig, threads: int | None) -> dict[str, Any]:
    """Before the sweep launches a start of the training ``cfg`` in run folder ``d`` (created): record in
    ``d/sweep.json`` (``fingerprints``, keyed by the source digest of the code the sweep runs) the
    current code's fingerprint of the config with ``threads`` threads, the torch and CPU it was computed
    on and the commit. A config whose canonical training cannot start gets ``fingerprint`` None and the
    ``error`` (its training fails with its own message). Returns the entry.
    """
    from sinklab.provenance import code_version
    from sinklab.train.fingerprint import environment

    code = code_version()
    try:
        fp, error = current_fingerprint(cfg, threads, d), None
    except Exception as e:  # noqa: BLE001 - the training that follows reports the same failure
        fp, error = None, f"{type(e).__name__}: {e}".splitlines()[0]
    entry = {"fingerprint": fp, **environment(), "threads": threads, "commit": code.get("commit"),
             "dirty": code.get("dirty"), **({"error": error} if error else {})}
    if code.get("source") is None:  # the package's files cannot be read: no key to link the run's start to
        return entry
    d.mkdir(parents=True, exist_ok=True)
    rec = _record(d)
    rec.setdefault("fingerprints", {})[code["source"]] = entry
    atomic_write_text(d / RECORD_NAME, json.dumps(rec, indent=1))
    return entry


def annotate(d: Path) -> bool:
    """Write the fingerprints recorded by :func:`record_start` into the finished run's ``summary.json``:
    ``code_fingerprints`` (one per start in ``code_starts``, through its source digest; ``"none"`` for a
    start the sweep did not launch), ``code_fingerprint`` (the last start's) and ``fingerprint_env``
    (``torch_version``, ``cpu_model`` where they were computed). Nothing is written for a run that is not
    finished, that no recorded fingerprint covers, or that already says the same (a run trained by code
    before ``code_starts`` keeps the fingerprints its trainer wrote). Returns whether it wrote."""
    s_path = d / SUMMARY_NAME
    if not s_path.exists():
        return False
    known = _record(d).get("fingerprints") or {}
    s = read_json(s_path, "run summary")
    starts = s.get("code_starts")
    if not known or not starts:
        return False
    per = [known.get(st.get("source")) if isinstance(st, dict) else None for st in starts]
    fps = [p["fingerprint"] if p and p.get("fingerprint") else "none" for p in per]
    found = [p for p in per if p and p.get("fingerprint")]
    if not found:
        return False
    new = {"code_fingerprint": fps[-1], "code_fingerprints": fps,
           "fingerprint_env": {"torch_version": found[-1].get("torch_version"), "cpu_model": found[-1].get("cpu_model")}}
    if all(s.get(k) == v for k, v in new.items()):
        return False
    s.update(new)
    atomic_write_text(s_path, json.dumps(s, indent=1))
    return True


def fingerprint_env(s: dict[str, Any]) -> dict[str, Any]:
    """Where the fingerprints in the run summary ``s`` were computed: its ``fingerprint_env`` (written by
    :func:`annotate`), else (a run whose trainer computed them itself) the run's own torch and CPU."""
    env = s.get("fingerprint_env")
    if isinstance(env, dict):
        return env
    return {"torch_version": s.get("torch_version"), "cpu_model": s.get("cpu_model")}
