"""The training-code fingerprint: a hash of the numbers the training code produces for a config.

A study is only as current as the code that trained it. A git commit says which *source* made a
run, but a refactor changes the commit without changing a single number, and an innocent-looking
edit (a chunked loss, a new kernel) changes the numbers without changing the config. The
fingerprint follows the numerics instead of the source text: it is the SHA-256 of what a short
*canonical training* of the run's own config computes with the current code
(:func:`sinklab.train.loop.code_fingerprint` runs it; this module hashes it):

* the first :data:`FINGERPRINT_STEPS` optimizer steps of the config (its model, attention
  operation, positional encoding, loss / objective, optimizer, gradient clipping, precision and
  threads) from a fixed seed (``train.seed = 0``: the seed is not part of what identifies the
  code): every step's training loss and every parameter tensor after the last step (exact bytes,
  hashed without their names, so renaming a module keeps the fingerprint);
* the tracker's evaluation after each of those steps (validation loss, sink rate, attention
  mass, norm ratios: the metric code);
* the learning rate of every step of the full schedule;
* the data pipeline: the whole training token stream and the batches of steps spread over the
  whole run (so a change that only bites late, in a later epoch's window order, is seen).

Two code versions that give identical numbers for a config give the same fingerprint; a change
to any of those numbers flips it. What it cannot see: a change that first shows after step
:data:`FINGERPRINT_STEPS` in the model or optimizer alone (not in the schedule or data). The
fingerprint depends on the config (a change to the sigmoid kernel flips the sigmoid rows' and
leaves softmax's), on the torch build and on the CPU (summary.json records both beside it).

Cost: one data preparation plus three optimizer steps and three tracker evaluations of the config
(about 2-4 s for ``emergence-cpu`` on one core). Training does not compute it: a run records its
environment and code (``summary.json`` ``code``, ``code_starts``, ``torch_version``, ``cpu_model``,
``threads``), and the study tool (:mod:`sinklab.sweep.fingerprints`: ``sinklab sweep`` and ``sinklab
report``) computes the fingerprint once per config shape and code version (:func:`cached_fingerprint`)
and records it beside the runs it launches.
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sinklab.fileio import atomic_write_text
from sinklab.runs.config import RunConfig

#: optimizer steps of the canonical training
FINGERPRINT_STEPS = 3
#: steps, spread over the run, whose batches are hashed
DATA_PROBES = 8
#: hex digits kept
LENGTH = 16


def canonical_config(cfg: RunConfig, out: Path | None = None) -> RunConfig:
    """The config of the canonical training: ``cfg`` with ``train.seed = 0``, the tracker after every
    step, no TensorBoard and no intermediate checkpoint. The schedule keeps ``train.steps`` (its
    learning rates are those of the real run). A run-local token cache (``data.cache_dir = "run"``)
    points at the run folder ``out`` so the corpus is not tokenized again. A fine-tuning run's
    ``train.init_from`` is dropped: the fingerprint identifies the training code, not the weights a
    run starts from (the seeds of a fine-tuning study start from different parents, and share one
    fingerprint), so its canonical training starts from the seed-0 initialisation like any other."""
    c = copy.deepcopy(cfg)
    c.train.seed = 0
    c.train.init_from = None
    c.train.tensorboard = False
    c.train.checkpoint_every = 0
    c.train.log_every = 1
    c.track.every = 1
    if c.data.cache_dir == "run" and out is not None:
        c.data.cache_dir = str(Path(out) / "tokens")
    return c


def _num(v: Any) -> Any:
    """Floats as exact hex strings (nested), so the hash sees every bit."""
    if isinstance(v, float):
        return float(v).hex()
    if isinstance(v, dict):
        return {k: _num(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_num(x) for x in v]
    return v


def _tensor_digest(t: torch.Tensor) -> str:
    a = t.detach().cpu().contiguous()
    return hashlib.sha256(str(a.dtype).encode() + str(tuple(a.shape)).encode() + a.view(torch.uint8).numpy().tobytes()
                          if a.numel() else b"").hexdigest()


def data_digest(train_data, batch_size: int, grad_accum: int, steps: int, prefix_len: int = 0) -> str:
    """SHA-256 of the training token stream and of the batches of :data:`DATA_PROBES` steps spread over
    ``steps`` (``train_data``: a :class:`~sinklab.data.packing.PackedData`)."""
    h = hashlib.sha256(np.ascontiguousarray(train_data.stream).astype(np.int64).tobytes())
    for s in sorted({round(i * (steps - 1) / max(DATA_PROBES - 1, 1)) for i in range(DATA_PROBES)}):
        x, y = train_data.samples(s * grad_accum * batch_size, batch_size * grad_accum, prefix_len=prefix_len)
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    return h.hexdigest()


def digest(losses: dict[int, float], history: list[dict[str, Any]], model_state: dict[str, Any], cfg: RunConfig,
           data: str | None) -> str:
    """The fingerprint of one canonical training: its losses (step -> loss), tracker records, final
    model state dict, config (for the schedule) and data digest (see the module docstring).
    Returns :data:`LENGTH` hex digits."""
    from sinklab.train.schedule import lr_at

    params = sorted(_tensor_digest(t) for t in model_state.values() if isinstance(t, torch.Tensor))
    record = {
        "losses": _num([losses[k] for k in sorted(losses)]),
        "tracker": _num([{k: v for k, v in r.items() if k != "step"} for r in history]),
        "params": params,
        "schedule": _num([lr_at(s, cfg.optim, cfg.train.steps) for s in range(cfg.train.steps)]),
        "data": data,
    }
    return _sha(record)


def diverged_digest(record: dict[str, Any]) -> str:
    """The fingerprint of a canonical training that diverged (``record``: step, what, value)."""
    return _sha({"diverged": {k: record[k] for k in ("step", "what", "value")}})


def _sha(record: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:LENGTH]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict[str, str]:
    """``{"torch_version", "cpu_model"}``: what, beside the fingerprint, a run's bits depend on."""
    return {"torch_version": torch.__version__, "cpu_model": cpu_model()}


def cached_fingerprint(cfg: RunConfig, compute, out: Path | None = None) -> str:
    """``compute(cfg, out)`` (the canonical training, :func:`sinklab.train.loop.code_fingerprint`) of the
    *current* code, cached in :func:`cache_path` under the code's source digest
    (:func:`sinklab.provenance.source_digest`: the commit and its dirty diff, or a copy outside git),
    this machine's torch and CPU and the canonical config's text (the config's shape: its seed and
    starting weights are not part of it), so that a study computes each canonical training once per
    config shape and code version. The cache file also records the commit and whether the tree was
    dirty, for a reader. ``sinklab.sweep.fingerprints`` is the study tool that calls it; training
    itself never does."""
    from sinklab.provenance import code_version, source_digest
    from sinklab.runs.config import to_toml

    canon = to_toml(canonical_config(cfg))
    key = _key(["source", source_digest(), environment(), canon])
    fp = _cache_read(key)
    if fp is None:
        fp = compute(cfg, out)
        code = code_version()
        _cache_write(key, fp, {"commit": code.get("commit"), "dirty": code.get("dirty")})
    return fp


def _key(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_path(key: str) -> Path:
    """The cache file of one fingerprint: ``$SINKLAB_HOME/fingerprints/<key>.json`` (one file per key, so
    trainings and reports that run at once never lose each other's entries)."""
    from sinklab.paths import cache_dir

    return cache_dir("fingerprints") / f"{key}.json"


def _cache_read(key: str) -> str | None:
    """The cached fingerprint under ``key`` (None when missing, unreadable, not UTF-8 or not a fingerprint:
    a cache, computed again)."""
    try:
        rec = json.loads(cache_path(key).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    fp = rec.get("fingerprint") if isinstance(rec, dict) else None
    return fp if isinstance(fp, str) and len(fp) == LENGTH else None


def _cache_write(key: str, fp: str, extra: dict[str, Any]) -> None:
    atomic_write_text(cache_path(key), json.dumps({"fingerprint": fp, **environment(), **extra}, indent=1))


#: the program a subprocess runs to compute a fingerprint with another commit's code (argv: config path)
_AT_COMMIT = ("import sys, sinklab\nassert sinklab.__file__.startswith(sys.argv[2]), sinklab.__file__\n"
              "try:\n    from sinklab.runs.config import load_config\n"
              "except ImportError:  # code before sinklab.runs\n    from sinklab.train.config import load_config\n"
              "from sinklab.train.loop import code_fingerprint\n"
              "print(code_fingerprint(load_config(sys.argv[1])))")


def fingerprint_at_commit(cfg: RunConfig, commit: str, repo: Path, config_text: str | None = None) -> str | None:
    """The fingerprint that the training code of ``commit`` gives for ``cfg`` *on this machine*
    (its ``src/`` exported with ``git archive`` into a temporary folder and run in a subprocess),
    cached in :func:`cache_path` under the commit, this machine's torch and CPU and the canonical
    config.

    This is how a run trained on another CPU is checked: its own recorded fingerprint holds that
    CPU's rounding, so it cannot be compared with this machine's; but if the code that trained it and
    the current code give the same fingerprint *here*, the two codes compute the same numbers.

    Args:
        cfg: the run's config. commit: the full commit that trained it. repo: a folder inside a git
            checkout that has the commit.
        config_text: the run's ``config.toml`` as that commit wrote it, given to the commit's code
            as is (default: ``to_toml(cfg)``, which carries today's keys, e.g.
            ``model.attention_backend``, that older code rejects as unknown).

    Returns:
        16 hex digits, or None when the commit is not in the repository or its code cannot compute a
        fingerprint (older than fingerprints, or failing).
    """
    import subprocess
    import sys
    import tempfile

    from sinklab.runs.config import to_toml

    key = _key(["commit", commit, environment(), to_toml(canonical_config(cfg))])
    cached = _cache_read(key)
    if cached is not None:
        return cached
    with tempfile.TemporaryDirectory(prefix="sinklab-fp-") as tmp:
        tmp = Path(tmp)
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
        if top.returncode != 0:
            return None
        archive = subprocess.run(["git", "-C", top.stdout.strip(), "archive", "--format=tar", commit, "src"],
                                 capture_output=True)
        if archive.returncode != 0:
            return None
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        cfg_file = tmp / "config.toml"
        cfg_file.write_text(to_toml(cfg) if config_text is None else config_text)
        env = {k: v for k, v in __import__("os").environ.items() if k != "PYTHONPATH"}
        env.update(PYTHONPATH=str(tmp / "src"), OMP_NUM_THREADS=str(cfg.train.threads or 1))
        proc = subprocess.run([sys.executable, "-c", _AT_COMMIT, str(cfg_file), str(tmp / "src")], capture_output=True,
                              text=True, env=env, cwd=top.stdout.strip())
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines or len(lines[-1]) != LENGTH:
            return None
        fp = lines[-1]
    _cache_write(key, fp, {"commit": commit, "dirty": False})
    return fp
