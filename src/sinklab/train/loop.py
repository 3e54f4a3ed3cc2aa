"""The pre-training loop: AdamW, warm-up + schedule, clipping, bf16 autocast, checkpoints, sink tracking.

Run folder ``DIR``::

    config.toml      the fully resolved config
    metrics.jsonl    one JSON object per logged step: step, loss, lr, grad_norm, tokens, tokens_per_s,
                     and at tracker steps val_loss, sink_rate (list, position 1 first, percent),
                     attention_mass_first, norm_ratio, max_norm_ratio
    tb/              TensorBoard events
    checkpoint.pt    latest checkpoint (model, optimizer, RNG, step), replaced atomically
    final/           SinkLM.save_pretrained + HF tokenizer: ``sinklab measure --model DIR/final``
    summary.json     emergence step of Sink_1, final metrics, weight-decay mode, throughput, command, versions
    train_result.json  the TrainResult train() returns (TrainResult.load(DIR) reads it)

The batch of a step is a pure function of (seed, step) and every RNG state is checkpointed, so
``resume=True`` continues a killed run with the same losses as an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from sinklab.data.packing import IGNORE_INDEX, PackedData
from sinklab.data.tokens import TokenizedCorpus
from sinklab.errors import ConfigError, InputError, SinklabError, param, render, require
from sinklab.fileio import atomic_write_text, check_writable, publish, read_json, read_jsonl
from sinklab.progress import progress as show_progress
from sinklab.result import Result
from sinklab.runs.config import RunConfig, diff_keys, flatten, load_config, to_toml
from sinklab.runs.run import Run
from sinklab.train import distributed
from sinklab.train.checkpoint import (CHECKPOINT_NAME, load_checkpoint, load_run_checkpoint, rng_state, save_checkpoint,
                                      set_rng_state)
from sinklab.train.objective import make_objective
from sinklab.train.schedule import lr_at
from sinklab.train.tracker import SinkTracker

#: config keys that may change between a run and its resume without changing the losses
RESUME_MAY_DIFFER = {
    "data.num_proc", "data.max_epochs", "train.device", "train.compile", "train.log_every", "train.checkpoint_every", "train.tensorboard",
    "train.parallel", "track.every", "track.batch_size", "track.emerge_level",
}


class TrainingDiverged(SinklabError):
    """The loss or the gradient norm became NaN or infinite."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped :func:`train`. The run folder keeps its last checkpoint (none is written
    on the way out), from which ``resume=True`` continues with the same losses.

    Attributes:
        out: the run folder.
        step: optimizer steps completed when it stopped.
        checkpoint: the step of the last checkpoint in the run folder, or None (nothing to resume).
        steps: the run's planned steps (``train.steps``).
    """

    def __init__(self, out: Path, step: int, checkpoint: int | None, steps: int) -> None:
        super().__init__(f"training interrupted at step {step}")
        self.out, self.step, self.checkpoint, self.steps = out, step, checkpoint, steps


@dataclass
class _Status:
    """Where a training stands, for the message of an interruption."""

    step: int = 0
    checkpoint: int | None = None


@dataclass(repr=False)  # Result's short repr
class TrainResult(Result):
    """What :func:`train` returns (its numbers also in ``DIR/summary.json``, which the loop writes); a
    :class:`~sinklab.result.Result`: ``save(out)`` writes these fields as ``train_result.json``, ``load`` reads
    them back, ``table()`` is the training loss by step."""

    FILE: ClassVar[str] = "train_result.json"
    WHAT: ClassVar[str] = "sinklab train result"

    out: Path
    steps: int
    losses: dict[int, float] = field(default_factory=dict)  # step (1-based) -> training loss of that step
    history: list[dict[str, Any]] = field(default_factory=list)  # tracker records
    emergence_step: int | None = None
    tokens_per_s: float = 0.0  # average over the run's wall time (all starts, data preparation and tracker included)
    seconds_per_step: float = 0.0  # median wall time of an optimizer step (tracker excluded)
    median_step_tokens_per_s: float = 0.0  # tokens of one step / seconds_per_step: the optimizer steps alone
    wall_s: float = 0.0  # wall time of the run, all starts together (up to the checkpoint each resumed from)
    already_finished: bool = False  # resume of a run that had reached its steps: nothing was done
    note: str = ""  # what a resume changed (steps raised on a finished run: the schedule consequence)
    data_digest: str | None = None  # the canonical training's data hash (sinklab.train.fingerprint.data_digest)
    command: str = ""  # the command that made it (the CLI's; from Python: the call, sinklab.train.train(...))
    versions: dict[str, str] = field(default_factory=dict)  # sinklab.result.versions() of the run's last start

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``out`` as a string, ``losses`` keyed by step as strings)."""
        d = asdict(self)
        d["out"], d["losses"] = str(self.out), {str(k): v for k, v in self.losses.items()}
        return d

    def title(self) -> str:
        return f"TrainResult: {self.out}, {self.steps} steps" + (" (already finished)" if self.already_finished else "")

    def headline(self) -> list[tuple[str, str]]:
        """The last logged loss (nats), the sink's emergence step (1-based), throughput, wall time."""
        rows = []
        if self.losses:
            last = max(self.losses)
            rows.append(("loss", f"{self.losses[last]:.4f} nats at step {last}"))
        rows.append(("emergence step", "none yet" if self.emergence_step is None else str(self.emergence_step)))
        rows.append(("speed", f"{self.tokens_per_s:,.0f} tokens/s, {self.seconds_per_step:.3g} s/step; wall {self.wall_s:.1f} s"))
        return rows + ([("note", self.note)] if self.note else [])

    def guide(self) -> list[tuple[str, str]]:
        return [(".table()", f"DataFrame of the loss by step ({len(self.losses)} rows)"),
                (".history", f"the sink tracker's records ({len(self.history)})"),
                (".save(out)", "writes train_result.json (the run folder has the rest)")]

    def table(self):
        """The training loss by step: columns ``step`` (1-based optimizer step) and ``loss`` (nats)."""
        import pandas as pd

        return pd.DataFrame({"step": list(self.losses), "loss": list(self.losses.values())}, columns=["step", "loss"])

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path | None = None) -> "TrainResult":
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in data.items() if k in known}  # a file from older code may carry more (code_fingerprint)
        d["out"], d["losses"] = Path(d["out"]), {int(k): v for k, v in d.get("losses", {}).items()}
        return cls(**d)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over unmasked targets.

    Args:
        logits: (B, T, V) any float dtype (computed in float32).
        targets: (B, T) int64; -100 marks positions excluded from the loss.
    """
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU. Raises InputError when CUDA is asked for but absent."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"train.device={name!r} but CUDA is not available here; use device = \"cpu\" or \"auto\"")
    return torch.device(name)


def param_groups(model: torch.nn.Module, weight_decay: float, decay: str) -> list[dict[str, Any]]:
    """AdamW parameter groups.

    ``decay="matrices"``: parameters with 2 or more dimensions (weight matrices, embeddings, per-head
    bias tables, and the (H_kv, d_h) key / value biases of ``kv_bias`` / ``k_bias`` / ``v_bias``) are decayed;
    vectors (norm gains, linear biases, the sink token, per-head scalars such as sink logits) are not.
    ``decay="all"``: every parameter is decayed (the paper's code).
    """
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if decay == "all":
        return [{"params": [p for _, p in params], "weight_decay": weight_decay, "names": [n for n, _ in params]}]
    dec = [(n, p) for n, p in params if p.dim() >= 2]
    nodec = [(n, p) for n, p in params if p.dim() < 2]
    return [
        {"params": [p for _, p in dec], "weight_decay": weight_decay, "names": [n for n, _ in dec]},
        {"params": [p for _, p in nodec], "weight_decay": 0.0, "names": [n for n, _ in nodec]},
    ]


def build_optimizer(model: torch.nn.Module, cfg: RunConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (fused on CUDA)."""
    o = cfg.optim
    groups = param_groups(model, o.weight_decay, o.decay)
    for g in groups:
        g.pop("names")
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, **kw)


class _MetricsLog:
    """Appends JSON lines to ``metrics.jsonl`` and scalars to TensorBoard (``enabled=False``: writes nothing,
    as on every distributed rank but rank 0)."""

    def __init__(self, out: Path, tensorboard: bool, start: int = 0, enabled: bool = True) -> None:
        self.path = out / "metrics.jsonl"
        self.tb = None
        self.enabled = enabled
        if tensorboard and enabled:
            require("tensorboard", "tensorboard", "train.tensorboard = true (logging to DIR/tb)")
            from torch.utils.tensorboard import SummaryWriter

            # on resume, drop TensorBoard events logged after the checkpoint by the killed run
            self.tb = SummaryWriter(str(out / "tb"), purge_step=start + 1 if start else None)

    def truncate_after(self, step: int) -> None:
        """Drop lines past ``step`` (a killed run may have logged beyond its last checkpoint)."""
        if not self.enabled or not self.path.exists():
            return
        keep = [r for r in read_jsonl(self.path, "training log") if r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))  # a kill here keeps the old log

    def write(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.tb is not None:
            step = rec["step"]
            for k, v in rec.items():
                if k == "step" or isinstance(v, bool):
                    continue
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
                elif k == "sink_rate" and v:
                    self.tb.add_scalar("sink_rate_1", v[0], step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _save_final(model: torch.nn.Module, tc: TokenizedCorpus, out: Path, *, mask_token: bool = False) -> Path:
    """``DIR/final``: the model (SinkLM.save_pretrained) and the HF tokenizer, written atomically;
    ``mask_token``: the tokenizer gets the masked diffusion mask token (id = its former size)."""
    from sinklab.data.tokenizer import save_hf, with_mask_token

    final = out / "final"
    tmp = out / "final.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    save_hf(with_mask_token(tc.tokenizer) if mask_token else tc.tokenizer, tmp)
    if final.exists():
        shutil.rmtree(final)
    return publish(tmp, final)


def train(
    cfg: RunConfig | str | Path,
    out: str | Path,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    notify: Callable[[str], None] | None = None,
    command: str | None = None,
    _canonical: bool = False,
) -> TrainResult:
    """Pre-train a :class:`~sinklab.nn.SinkLM` as configured and track its sinks.

    Args:
        cfg: the resolved run config (:class:`~sinklab.runs.config.RunConfig`), or a preset name
            (``"emergence-cpu"``) or TOML file, loaded as ``sinklab train NAME`` does
            (:func:`~sinklab.runs.config.load_config`, no overrides).
        out: run folder DIR (created).
        resume: continue from ``DIR/checkpoint.pt``; its config must equal ``cfg`` except the keys in
            :data:`RESUME_MAY_DIFFER` (``train.steps`` only with a constant schedule).
        progress: show a progress bar (loss, tokens/s, ETA) when stderr is a terminal.
        stop_after: stop (with a checkpoint) after this many steps, as if killed there; for tests
            and time-boxed runs.
        notify: called with a one-line message when a resume changes something (see ``note``).
        command: the command that made the run, recorded in ``summary.json`` and ``train_result.json``
            (the CLI passes the ``sinklab train ...`` line; default: this Python call,
            :func:`sinklab.result.python_call`).
        _canonical: internal: the short canonical training of :mod:`sinklab.train.fingerprint`
            (one process, data digest recorded, no ``train_result.json``).

    ``train.threads`` (when set) is applied with ``torch.set_num_threads`` before any work and the
    previous setting restored on return, so the environment's ``OMP_NUM_THREADS`` cannot change
    the losses. The run seeds torch's and NumPy's global generators (``train.seed``; a resume sets them and
    Python's from its checkpoint); the caller's states of all three are restored on return (and on an error), so a
    caller's own random streams go on unchanged. ``summary.json`` records the environment (threads, torch version, CPU model) and the
    code of every start (``code``: the last start's :func:`sinklab.provenance.code_version`, commit,
    dirty flag and source digest; ``code_starts``: every start's, in order). The training-code
    fingerprint is not computed here: the study tool computes it once per config shape and code
    version (:mod:`sinklab.sweep.fingerprints`).

    A resume of a finished run (its checkpoint at its last step) does nothing and returns a result
    with ``already_finished=True``, unless ``train.steps`` was raised: then it continues to the new
    step count (any schedule) and ``note`` states what that does to the learning-rate schedule.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) every process calls this with the same arguments; the
    ranks share the global batch and rank 0 writes the run folder (:mod:`sinklab.train.distributed`).

    Returns:
        :class:`TrainResult` (losses: the global batch's, equal on every rank).

    Raises:
        InputError: corpus too small for one batch, DIR already holds a run without ``resume``,
            no checkpoint to resume; ``cfg`` neither a RunConfig nor a name or path.
        ConfigError: ``cfg`` an unknown preset or a file that does not load; resume with a differing config
            (names the keys); a global batch that does not split over the processes.
        TrainingDiverged: non-finite loss or gradient (names the step; the last checkpoint is kept).
        CheckpointError: a checkpoint write failed (the previous one is intact), or ``checkpoint.pt``
            is corrupt or not a sinklab checkpoint.
        TrainingInterrupted: Ctrl-C (a KeyboardInterrupt) after the resume checks; says which step
            was reached and which checkpoint is kept.

    A resume calls ``notify`` with the step it continues from (or with ``note``, when it extends a
    finished run).
    """
    t_start = time.perf_counter()
    if isinstance(cfg, (str, Path)):
        cfg = load_config(cfg)  # ConfigError for an unknown preset or a missing file (with the presets it knows)
    elif not isinstance(cfg, RunConfig):
        raise InputError(f"cfg must be a RunConfig, a preset name or a TOML file, got {type(cfg).__name__}")
    caller_rng = rng_state()  # the run seeds the global generators; the caller's streams are given back on return
    try:
        out = Path(out)
        check_writable(out, param("out"))
        created = _missing_folders(out)
        out.mkdir(parents=True, exist_ok=True)
        try:
            return _train_in_folder(cfg, out, resume=resume, progress=progress, stop_after=stop_after, notify=notify,
                                    canonical=_canonical, t_start=t_start, command=command)
        except BaseException:
            _remove_empty(created)  # a run refused before it wrote anything leaves no empty folder behind
            raise
    finally:
        set_rng_state(caller_rng)


def _missing_folders(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, deepest first ([] if ``path`` exists)."""
    missing = []
    p = path.absolute()
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is an empty folder; stop at the first that is not
    (another rank may have removed it already, or the run wrote into it)."""
    for f in folders:
        try:
            f.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return


def _train_in_folder(cfg: RunConfig, out: Path, *, resume: bool, progress: bool, stop_after: int | None,
                     notify: Callable[[str], None] | None, canonical: bool, t_start: float,
                     command: str | None) -> TrainResult:
    """:func:`train` once the run folder exists."""
    _canonical = canonical
    ckpt_path = out / CHECKPOINT_NAME
    if not resume and ckpt_path.exists():
        raise InputError(f"{out} already holds a run ({ckpt_path.name}); pass {param('resume', True)} to continue it or choose a new {param('out')}")
    status = _Status()
    ckpt, note, finished = _check_resume(cfg, out, notify, status) if resume else (None, "", None)
    if finished is not None:
        return finished
    if command is None:
        from sinklab.result import python_call

        command = python_call("sinklab.train.train", "config", repr(str(out)), resume=resume or None)
    threads_before = torch.get_num_threads()
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    try:
        return _train_in_group(cfg, out, ckpt, note, t_start=t_start, progress=progress, stop_after=stop_after,
                               notify=notify, canonical=_canonical, status=status, command=command)
    except KeyboardInterrupt as e:
        if _canonical or isinstance(e, TrainingInterrupted):
            raise
        raise TrainingInterrupted(out, status.step, status.checkpoint, cfg.train.steps) from None
    finally:
        torch.set_num_threads(threads_before)


def _check_resume(cfg: RunConfig, out: Path, notify: Callable[[str], None] | None,
                  status: _Status) -> tuple[dict, str, TrainResult | None]:
    """The resume checks of :func:`train`: load ``DIR/checkpoint.pt`` and compare its config with ``cfg``.

    Returns:
        ``(checkpoint, note, finished)``: ``note`` says what extending a finished run does to the
        schedule ("" otherwise); ``finished`` is the result to return at once when the run had
        already reached its steps (None otherwise). ``status`` is set to the checkpoint's step.

    Raises:
        ConfigError: the configs differ outside :data:`RESUME_MAY_DIFFER`, or a finished run's
            checkpoint is past ``train.steps``.
        CheckpointError: ``checkpoint.pt`` is corrupt or not a sinklab checkpoint.
    """
    t_cfg, note = cfg.train, ""
    ckpt = load_run_checkpoint(out / CHECKPOINT_NAME)
    done_before, planned_before = int(ckpt["step"]), int(ckpt["config"]["train"]["steps"])
    finished_before = done_before >= planned_before
    ignore = set(RESUME_MAY_DIFFER)
    if cfg.optim.schedule == "constant" or finished_before:
        ignore.add("train.steps")
    differ = diff_keys(ckpt["config"], cfg.to_dict(), ignore)
    if differ:
        flat_old, flat_new = flatten(ckpt["config"]), flatten(cfg.to_dict())
        detail = "; ".join(f"{k}: {flat_old.get(k)!r} -> {flat_new.get(k)!r}" for k in differ)
        raise ConfigError(f"cannot resume {out}: the config differs from the checkpoint's in {', '.join(differ)} ({detail})")
    if finished_before and t_cfg.steps < done_before and not (out / "summary.json").exists():
        raise ConfigError(f"cannot resume {out}: its checkpoint is at step {done_before}, past train.steps={t_cfg.steps}")
    if finished_before and t_cfg.steps <= done_before and (out / "summary.json").exists():
        done = f"{out} is finished: {done_before} of {planned_before} steps done; nothing to resume (raise train.steps to train longer)"
        if (out / TrainResult.FILE).is_file():  # the finished run's own result (emergence, losses, timings)
            return ckpt, note, replace(TrainResult.load(out), out=out, already_finished=True, note=done)
        # a run written before train_result.json: the tracker's records (checkpoint) and summary.json's figures
        summary = read_json(out / "summary.json", "run summary")
        return ckpt, note, TrainResult(out=out, steps=done_before, history=list(ckpt.get("tracker", [])),
                                       emergence_step=summary.get("emergence_step"),
                                       tokens_per_s=summary.get("tokens_per_s", 0.0),
                                       seconds_per_step=summary.get("seconds_per_step", 0.0),
                                       wall_s=summary.get("wall_s", 0.0), already_finished=True, note=done)
    if finished_before and t_cfg.steps > done_before:
        note = _extend_note(cfg, done_before, planned_before)
        if notify is not None:
            notify(note)  # says where it continues from
    elif notify is not None:
        notify(f"resuming {out} from its checkpoint at step {done_before} (of {t_cfg.steps})")
    status.step = status.checkpoint = done_before
    return ckpt, note, None


def _train_in_group(cfg: RunConfig, out: Path, ckpt: dict | None, note: str, *, t_start: float, progress: bool,
                    stop_after: int | None, notify: Callable[[str], None] | None, canonical: bool,
                    status: _Status, command: str = "") -> TrainResult:
    """:func:`_run` on the configured device inside the process group (if any)."""
    device = resolve_device(cfg.train.device)
    dd = distributed.Dist() if canonical else distributed.setup(cfg.train.parallel, device)
    try:
        result = _run(cfg, out, ckpt, note, distributed.rank_device(dd, device), dd, t_start=t_start,
                      progress=progress, stop_after=stop_after, notify=notify, canonical=canonical, status=status,
                      command=command)
        distributed.barrier(dd)  # every rank done (rank 0 wrote final/ and summary.json) before the group goes
        return result
    finally:
        distributed.teardown(dd)


def _run(cfg: RunConfig, out: Path, ckpt: dict | None, note: str, device: torch.device, dd: distributed.Dist, *,
         t_start: float, progress: bool, stop_after: int | None, notify: Callable[[str], None] | None,
         canonical: bool = False, status: _Status | None = None, command: str = "") -> TrainResult:
    """The body of :func:`train` once the resume checks passed and the process group (if any) is up:
    set up (:class:`_Trainer`), train up to ``train.steps`` (or ``stop_after``), write ``final/`` and
    ``summary.json``."""
    tr = _Trainer(cfg, out, ckpt, note, device, dd, t_start=t_start, notify=notify, canonical=canonical,
                  status=status or _Status(), command=command)
    if cfg.train.init_from and ckpt is None:
        # fine-tuning: the starting model measured on this run's data and probe (step 0), so that the
        # sink before and after fine-tuning are read on the same inputs
        tr.log.write({"step": 0, **{k: v for k, v in tr.evaluate(0).items() if k != "step"}})
    end = cfg.train.steps if stop_after is None else min(cfg.train.steps, stop_after)
    tr.train_steps(end, progress)
    return tr.finish(end)


@dataclass
class _Data:
    """The data side of a training (:func:`_setup_data`)."""

    tc: TokenizedCorpus
    objective: Any  # a sinklab.train.objective objective: .loss(forward, x, y, first_sample), .count
    train_data: PackedData
    val_y: torch.Tensor  # (val_windows, T) validation targets (for the unigram baseline)
    tracker: SinkTracker


def _setup_data(cfg: RunConfig, out: Path, dd: distributed.Dist, *, notify: Callable[[str], None] | None,
                canonical: bool) -> _Data:
    """Corpus, packing, objective, training windows, validation windows, probe and tracker of a run.

    Raises:
        InputError: fewer training windows than one batch; a validation split too small; more passes
            over the training tokens than ``data.max_epochs``.
        ConfigError: a global batch that does not split over the processes; a bad packing token.
    """
    t_cfg = cfg.train
    # ---- data (rank 0 tokenizes into the shared cache first)
    run = Run(cfg, out)
    with distributed.main_first(dd):
        tc = run.corpus
    packer = run.packer()
    objective = make_objective(cfg, tc, packer)
    T, B, p = cfg.data.seq_len, t_cfg.batch_size, t_cfg.prefix_len
    train_data = PackedData(tc.train, packer, T, max_tokens=cfg.data.max_train_tokens, seed=t_cfg.seed)
    if train_data.n_windows < B:
        raise InputError(
            f"the training data has {train_data.n_windows} windows of {T} tokens, fewer than one batch of {B}; "
            "use a larger corpus, a smaller train.batch_size or data.seq_len, or a larger data.max_train_tokens"
        )
    distributed.check_batch(dd, B)
    check_epochs(cfg, train_data.n_windows, train_data.n_tokens)
    for warn in (warmup_warning(cfg), epochs_warning(cfg, train_data.n_windows, train_data.n_tokens),
                 alignment_warning(cfg, train_data, tc.eos_id)):
        if warn and dd.is_main and not canonical:  # the fingerprint's canonical training would repeat it
            (notify or _warn)(warn)
    try:
        val_data = PackedData(tc.val, packer, T, seed=t_cfg.seed)
    except InputError as e:
        raise InputError(f"validation split too small: {e.marked}; raise data.val_fraction") from None
    val_x, val_y = val_data.sequential(cfg.track.val_windows, prefix_len=p)
    probe = run.tracker_probe()
    tracker = SinkTracker(probe, val_x, val_y, cfg.track, prefix_len=p, objective=objective)
    return _Data(tc=tc, objective=objective, train_data=train_data, val_y=val_y, tracker=tracker)


class _Trainer:
    """One start of a training, in parts: set-up (data, model, optimizer, resume state), the optimizer
    step with its micro-batches, the tracker's evaluation and logging, the checkpoint, the summary.

    The order of the set-up is that of the numerics (seeded init after the data; optimizer and RNG
    state restored from the checkpoint), so a run and its resume give the same losses.
    """

    def __init__(self, cfg: RunConfig, out: Path, ckpt: dict | None, note: str, device: torch.device,
                 dd: distributed.Dist, *, t_start: float, notify: Callable[[str], None] | None,
                 canonical: bool, status: _Status, command: str = "") -> None:
        self.cfg, self.out, self.device, self.dd, self.status, self.t_start = cfg, out, device, dd, status, t_start
        self.canonical = canonical
        self.ckpt_path = out / CHECKPOINT_NAME
        self.data = _setup_data(cfg, out, dd, notify=notify, canonical=canonical)
        self.data_key = self.data.tc.meta.get("key")  # the content digest of the tokenized data (None: synthetic)
        if ckpt is not None and ckpt.get("data_key") not in (None, self.data_key):
            raise InputError(f"cannot resume {out}: its training data changed since the checkpoint at step "
                             f"{ckpt['step']} (tokenized data {ckpt['data_key']}, now {self.data_key}: a corpus file "
                             "edited, added or removed); the rest of the run would train on other windows. Restore the "
                             "corpus, or train a new run")
        self._setup_model(ckpt)
        self.last_ckpt = self.start if ckpt is not None else None
        self.wall_before = float(ckpt.get("wall_s", 0.0)) if ckpt is not None else 0.0
        from sinklab.provenance import code_version
        from sinklab.result import versions

        self.result = TrainResult(out=out, steps=cfg.train.steps, history=self.data.tracker.history, note=note,
                                  command=command, versions=versions())
        self.result.losses.update(self.earlier_losses)
        if canonical:
            from sinklab.train.fingerprint import data_digest

            t_cfg = cfg.train
            self.result.data_digest = data_digest(self.data.train_data, t_cfg.batch_size, t_cfg.grad_accum, t_cfg.steps,
                                                  prefix_len=t_cfg.prefix_len)
        # the code of every start (commit, dirty flag, source digest), in order: the study tool maps each
        # to its training-code fingerprint (a checkpoint from older code has none: its starts are unknown)
        self.code_starts = []
        if ckpt is not None:  # a checkpoint from before code_starts: its earlier starts' code is unknown
            self.code_starts = list(ckpt.get("code_starts", [{"commit": None, "dirty": None, "source": None}]))
        self.code_starts.append(code_version())
        # the processes of every start, in order (None for the starts of a checkpoint that did not record them)
        self.processes_starts = list(ckpt.get("processes_starts", [None] * (len(self.code_starts) - 1))
                                     if ckpt is not None else [])
        self.processes_starts.append(dd.world)
        self.step_times: list[float] = []  # wall seconds of each optimizer step of this start

    def _setup_model(self, ckpt: dict | None) -> None:
        """The seeded model, its distributed wrapper, the optimizer, the metrics log and the resume state.

        Raises:
            ConfigError: ``model.vocab_size`` below the tokenizer's vocabulary; a bad ``train.init_from``.
        """
        from sinklab.nn.model import SinkLM

        cfg, t_cfg, device, dd, tc = self.cfg, self.cfg.train, self.device, self.dd, self.data.tc
        # ---- model and optimizer (seeded init)
        torch.manual_seed(t_cfg.seed)
        np.random.seed(t_cfg.seed)
        model = SinkLM(cfg.model).to(device)
        if tc.vocab_size > cfg.model.vocab_size:
            raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} < tokenizer vocabulary {tc.vocab_size}")
        if t_cfg.init_from and ckpt is None:  # fine-tuning: start from a run's weights (a resume has its own)
            model.load_state_dict(init_weights(cfg, tc).state_dict())
        self.model = model
        self.wrapped = distributed.wrap(dd, model, device)  # DDP / FSDP2 from outside; `model` stays the plain module
        self.opt = build_optimizer(model, cfg, device)
        self.start = int(ckpt["step"]) if ckpt is not None else 0
        self.log = _MetricsLog(self.out, t_cfg.tensorboard, self.start, enabled=dd.is_main)
        self.earlier_losses: dict[int, float] = {}
        if ckpt is not None:
            distributed.load_state(dd, model, self.opt, ckpt["model"], ckpt["optimizer"])
            set_rng_state(ckpt["rng"])
            self.data.tracker.history = list(ckpt.get("tracker", []))
            self.log.truncate_after(self.start)
            # the earlier starts' losses: TrainResult.losses covers every step, not only this start's (a checkpoint
            # written before they were kept gives the logged ones, every log_every steps, to 6 decimals)
            earlier = ckpt.get("losses")
            if earlier is None and self.log.path.exists():
                earlier = {r["step"]: r["loss"] for r in read_jsonl(self.log.path, "training log") if "loss" in r}
            self.earlier_losses = {int(k): float(v) for k, v in (earlier or {}).items() if int(k) <= self.start}
        else:
            self.log.truncate_after(-1)
        if dd.is_main:
            atomic_write_text(self.out / "config.toml", to_toml(cfg))
        # compile and autocast are applied from outside the model (the model stays plain PyTorch)
        self.fwd = torch.compile(self.wrapped) if t_cfg.compile else self.wrapped
        self.bf16 = t_cfg.precision == "bf16"

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the run's device when ``train.precision = "bf16"`` (a no-op context otherwise)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def step(self, step: int) -> tuple[float, float, float]:
        """Optimizer step ``step`` (0-based): its micro-batches, clipping, the NaN checks, AdamW.

        Returns:
            ``(lr, loss, grad_norm)``: the step's learning rate, its training loss (the micro-batch
            losses, mean over the ranks, summed in micro-batch order in float64) and the gradient
            norm before clipping.

        Raises:
            TrainingDiverged: a non-finite micro-batch loss or gradient norm (recorded in
                ``DIR/diverged.json``; the optimizer step is not taken).
        """
        cfg, t_cfg, dd, device = self.cfg, self.cfg.train, self.dd, self.device
        lr = lr_at(step, cfg.optim, t_cfg.steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        # this rank's share of the step's micro-batches and their loss weights: the step's first
        # collective (None on one process: the loss is left untouched)
        batches = [distributed.micro_batch(dd, self.data.train_data, step, m, t_cfg.grad_accum, t_cfg.batch_size,
                                           prefix_len=t_cfg.prefix_len) for m in range(t_cfg.grad_accum)]
        weights = distributed.loss_weights(dd, batches, device, self.data.objective.count)
        micro_losses = [self.micro_batch(step, micro, x, y, weights) for micro, (x, y) in enumerate(batches)]
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        # the micro-batch losses, mean over the ranks (the step's second collective), and the
        # gradient norm: the step's one host synchronisation
        lvs = distributed.mean_over_ranks(dd, torch.stack(micro_losses).to(distributed.stat_dtype(device)))
        *lvs, gnv = torch.cat([lvs, distributed.local_full(gn).detach().reshape(1).to(lvs.dtype)]).tolist()
        for lv in lvs:  # the first non-finite micro-batch loss, as it would have been seen on its own
            if not math.isfinite(lv):
                _diverged("loss", lv, step + 1, self.last_ckpt, self.ckpt_path)
        loss_sum = 0.0
        for lv in lvs:  # summed in micro-batch order, in float64 (the logged loss of the step)
            loss_sum += lv
        if not math.isfinite(gnv):
            _diverged("gradient norm", gnv, step + 1, self.last_ckpt, self.ckpt_path)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return lr, loss_sum, gnv

    def micro_batch(self, step: int, micro: int, x: torch.Tensor, y: torch.Tensor,
                    weights: torch.Tensor | None) -> torch.Tensor:
        """Forward and backward of micro-batch ``micro`` (0-based) of step ``step``: ``x``, ``y`` (B, T)
        int64 inputs and targets. The gradient is synchronised over the ranks at the step's last
        micro-batch only. Returns the detached scaled loss (loss / grad_accum, times this rank's
        weight when distributed), a 0-d tensor."""
        t_cfg = self.cfg.train
        first = distributed.first_sample(self.dd, step, micro, t_cfg.grad_accum, t_cfg.batch_size)  # seeds the diffusion masks
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with distributed.grad_sync(self.dd, self.wrapped, sync=micro == t_cfg.grad_accum - 1):
            with self.autocast():
                loss = self.data.objective.loss(self.fwd, x, y, first) / t_cfg.grad_accum
            if weights is not None:
                loss = loss * weights[micro].to(loss.dtype)
            detached = loss.detach()
            loss.backward()
        return detached

    def evaluate(self, step: int) -> dict[str, Any]:
        """The tracker's metrics of the model at ``step`` (:meth:`SinkTracker.evaluate`, appended to its history).

        Raises:
            TrainingDiverged: the probe's attention mass is NaN (recorded as a divergence at ``step``)."""
        from sinklab.errors import NonFiniteMassError

        try:
            return self.data.tracker.evaluate(self.model, step, self.device, self.autocast)
        except NonFiniteMassError:
            _diverged("attention mass on the probe", float("nan"), step, self.last_ckpt, self.ckpt_path)
            raise  # unreachable: _diverged raises

    def train_steps(self, end: int, progress: bool) -> None:
        """Optimizer steps ``start + 1 .. end`` (1-based) with logging, tracking, checkpoints and a progress bar."""
        cfg, t_cfg, dd = self.cfg, self.cfg.train, self.dd
        tokens_per_step = cfg.tokens_per_step
        # a bar on a terminal, a plain line every 10% or 30 s in a log file (sinklab.progress)
        bar = show_progress(total=t_cfg.steps, initial=self.start, unit="step", desc="train", enabled=progress and dd.is_main)
        self.model.train()
        t_log, tok_log, t_first = time.perf_counter(), 0, time.perf_counter()
        try:
            for step in range(self.start, end):
                t0 = time.perf_counter()
                distributed.maybe_fault(dd, step + 1)
                lr, loss_sum, gnv = self.step(step)
                done = step + 1
                self.step_times.append(time.perf_counter() - t0)
                tok_log += tokens_per_step
                self.result.losses[done] = loss_sum
                track_now = done == t_cfg.steps or (cfg.track.every and done % cfg.track.every == 0)
                if done % t_cfg.log_every == 0 or track_now or done == end:
                    now = time.perf_counter()
                    tps = tok_log / max(now - t_log, 1e-9)
                    rec = self.log_step(done, lr, loss_sum, gnv, tps, now - t_first, track=bool(track_now))
                    t_log, tok_log = time.perf_counter(), 0
                    post = {"loss": f"{loss_sum:.3f}", "tok/s": f"{tps:,.0f}"}
                    if "sink_rate" in rec:
                        post["sink1"] = f"{rec['sink_rate'][0]:.1f}%"
                    bar.set_postfix(post, refresh=False)
                bar.update(1)
                self.status.step = done
                if done == end or (t_cfg.checkpoint_every and done % t_cfg.checkpoint_every == 0):
                    self.checkpoint(done)
        finally:
            bar.close()
            self.log.close()

    def log_step(self, done: int, lr: float, loss: float, grad_norm: float, tokens_per_s: float, elapsed_s: float,
                 *, track: bool) -> dict[str, Any]:
        """Write the ``metrics.jsonl`` record of step ``done`` (1-based), with the tracker's metrics when
        ``track``; returns the record."""
        rec = {"step": done, "loss": round(loss, 6), "lr": lr, "grad_norm": round(grad_norm, 6),
               "tokens": done * self.cfg.tokens_per_step, "tokens_per_s": round(tokens_per_s, 1),
               "elapsed_s": round(elapsed_s, 2)}
        if track:
            rec.update({k: v for k, v in self.evaluate(done).items() if k != "step"})
        self.log.write(rec)
        return rec

    def checkpoint(self, step: int) -> None:
        """Write ``DIR/checkpoint.pt`` after ``step`` optimizer steps (atomically, on rank 0; every rank
        takes part in the state-dict gather and waits until it is on disk)."""
        t_cfg, dd = self.cfg.train, self.dd
        model_sd, opt_sd = distributed.state_dicts(dd, self.model, self.opt)  # full, on rank 0 (a collective under FSDP2)
        self.last_ckpt = step
        if not dd.is_main:
            distributed.barrier(dd)
            return
        save_checkpoint(self.ckpt_path, {
            "step": step,
            "model": model_sd,
            "optimizer": opt_sd,
            "rng": rng_state(),
            "data_position": {"samples": step * t_cfg.grad_accum * t_cfg.batch_size, "seed": t_cfg.seed},
            "config": self.cfg.to_dict(),
            "data_key": self.data_key,
            "tracker": self.data.tracker.history,
            "losses": {k: v for k, v in self.result.losses.items() if k <= step},  # a resume's result has them all
            "wall_s": self.wall_before + time.perf_counter() - self.t_start,
            "code_starts": self.code_starts,
            "processes_starts": self.processes_starts,
        })
        self.status.checkpoint = step
        distributed.barrier(dd)  # no rank runs ahead of a checkpoint that is not on disk yet

    def finish(self, end: int) -> TrainResult:
        """The result's timings and emergence step; at the run's last step, ``final/`` and ``summary.json``
        (rank 0)."""
        from sinklab.nn.model import SinkLM

        cfg, t_cfg, result = self.cfg, self.cfg.train, self.result
        tokens_per_step = cfg.tokens_per_step
        # median step time: robust to the first (compile / warm-up) steps and to tracker pauses
        result.seconds_per_step = float(np.median(self.step_times)) if self.step_times else 0.0
        result.median_step_tokens_per_s = tokens_per_step / result.seconds_per_step if self.step_times else 0.0
        result.wall_s = self.wall_before + time.perf_counter() - self.t_start
        result.tokens_per_s = end * tokens_per_step / max(result.wall_s, 1e-9)  # the run's average over its wall time
        result.emergence_step = self.data.tracker.emergence_step()
        # the unsharded model on rank 0 (gathered under FSDP2); None on the other ranks
        final_model = distributed.full_model(self.dd, self.model, lambda: SinkLM(cfg.model)) if end == t_cfg.steps else None
        if final_model is not None:
            _save_final(final_model, self.data.tc, self.out, mask_token=cfg.diffusion)
            summary = self.summary(final_model)
            atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=1))  # the mark of a finished run
            if not self.canonical:
                result.save(self.out)  # train_result.json: the Result every feature returns
        return result

    def summary(self, final_model: torch.nn.Module) -> dict[str, Any]:
        """The contents of ``summary.json`` for the finished run (see the module docstring)."""
        from sinklab.data.baseline import unigram_logprobs
        from sinklab.provenance import code_version
        from sinklab.train.fingerprint import environment

        cfg, t_cfg, result, train_data, tracker = self.cfg, self.cfg.train, self.result, self.data.train_data, self.data.tracker
        tokens_per_step = cfg.tokens_per_step
        return {
            "steps": t_cfg.steps,
            "data_key": self.data_key,  # what Run.corpus checks the data against when the run is measured
            "tokens": t_cfg.steps * tokens_per_step,
            "train_tokens_available": train_data.n_tokens,
            "epochs": round(passes(cfg, train_data.n_windows), 3),
            "final_loss": result.losses.get(t_cfg.steps),
            "final": tracker.history[-1] if tracker.history else None,
            "emerge_level": cfg.track.emerge_level,
            "emergence_step": result.emergence_step,
            "weight_decay": {"value": cfg.optim.weight_decay, "applied_to": cfg.optim.decay},
            "parameters": sum(p.numel() for p in final_model.parameters()),
            "seconds_per_step": round(result.seconds_per_step, 4),
            "tokens_per_s": round(result.tokens_per_s, 1),
            "wall_s": round(result.wall_s, 3),
            "median_step_tokens_per_s": round(result.median_step_tokens_per_s, 1),
            "device": str(self.device),
            "processes": self.dd.world,  # the last start's; every start's in processes_starts
            "processes_starts": self.processes_starts,
            # the unigram predictor under the run's own objective and validation (masked diffusion: its loss on the
            # tracker's fixed masks), so that ``degenerate`` compares like with like
            "unigram_loss": round(tracker.baseline_loss(unigram_logprobs(train_data.stream, cfg.model.vocab_size)), 6),
            "seed": t_cfg.seed,
            "objective": t_cfg.objective,
            "mask_token_id": getattr(self.data.objective, "mask_id", None),
            "code": code_version(),
            "command": result.command,
            "versions": result.versions,
            "code_starts": self.code_starts,
            "init_from": t_cfg.init_from,
            "threads": torch.get_num_threads(),
            **environment(),
        }


def init_weights(cfg: RunConfig, tc: TokenizedCorpus):
    """The model of the run ``cfg.train.init_from`` (a run folder or its ``final/``), checked against
    ``cfg``: a :class:`~sinklab.nn.SinkLM` on the CPU.

    Raises:
        InputError: no finished model there.
        ConfigError: its model config differs from ``cfg.model`` (names the keys), or its tokenizer
            differs from the one this run's data uses (token ids would mean other tokens).
    """
    from sinklab.nn.model import CONFIG_FILE, SinkLM

    src = Path(cfg.train.init_from)
    final = src if (src / CONFIG_FILE).exists() else src / "final"
    if not (final / CONFIG_FILE).exists():
        raise InputError(f"train.init_from={str(src)!r}: no finished sinklab model there (expected {final / CONFIG_FILE})")
    model = SinkLM.from_pretrained(final)
    differ = diff_keys(model.config.to_dict(), cfg.model.to_dict())
    if differ:
        raise ConfigError(f"train.init_from={str(src)!r}: its model differs from this config's in {', '.join(differ)}; "
                          "fine-tuning keeps the architecture (set the model keys to the run's)")
    tok = final / "tokenizer.json"
    if tok.exists() and json.loads(tok.read_text()).get("model") != json.loads(tc.tokenizer.to_str()).get("model"):
        raise ConfigError(f"train.init_from={str(src)!r}: its tokenizer ({tok}) differs from the one of this run's data: "
                          "token ids would mean other tokens (use the same tokenizer, e.g. data.tokenizer = 'gpt2', "
                          "or a synthetic task with the same vocabulary)")
    return model


def code_fingerprint(cfg: RunConfig, out: str | Path | None = None) -> str:
    """The training-code fingerprint of ``cfg`` under the current code (:mod:`sinklab.train.fingerprint`):
    the hash of a canonical training of the config's first
    :data:`~sinklab.train.fingerprint.FINGERPRINT_STEPS` steps from seed 0, in a temporary folder.

    Args:
        cfg: a resolved run config (its seed is ignored).
        out: the run folder, only to find a run-local token cache.

    Returns:
        16 hex digits. A config that diverges within those steps gets the hash of where it diverged.

    Raises:
        whatever :func:`train` raises for this config, divergence aside (a config that cannot start
        has no fingerprint).
    """
    import tempfile

    from sinklab.train import fingerprint as fpm

    c = fpm.canonical_config(cfg, None if out is None else Path(out))
    with tempfile.TemporaryDirectory(prefix="sinklab-fingerprint-") as tmp:
        try:
            res = train(c, tmp, progress=False, stop_after=fpm.FINGERPRINT_STEPS, _canonical=True)
        except TrainingDiverged:  # diverging within the first steps is a numeric outcome like any other
            return fpm.diverged_digest(read_json(Path(tmp) / DIVERGED_NAME, "divergence record"))
        state = load_checkpoint(Path(tmp) / CHECKPOINT_NAME)
    return fpm.digest(res.losses, res.history, state["model"], c, res.data_digest)


#: passes over the distinct training windows above which :func:`train` warns (memorisation regime)
EPOCHS_WARN = 4.0


def windows_per_step(cfg: RunConfig) -> int:
    """Training windows one optimizer step reads: ``train.batch_size x train.grad_accum``."""
    return cfg.train.batch_size * cfg.train.grad_accum


def passes(cfg: RunConfig, n_windows: int) -> float:
    """Passes the run makes over its distinct training windows: ``train.steps x windows per step / n_windows``
    (``n_windows``: the whole training windows, after any cap; each holds ``data.seq_len + 1 - n_inserted`` stream
    tokens, so this is also the stream tokens read over those available; tokens per step over tokens available
    was off by ``seq_len / (seq_len + 1 - n_inserted)``)."""
    return cfg.train.steps * windows_per_step(cfg) / max(n_windows, 1)


def check_epochs(cfg: RunConfig, n_windows: int, train_tokens: int) -> None:
    """Refuse a run that would pass over its training windows more than ``data.max_epochs`` times
    (``train_tokens``: the stream tokens they hold, for the message).

    Raises:
        InputError: ``data.max_epochs`` is set and :func:`passes` exceeds it; the one-line message
            gives the count and the fixes (a larger corpus, fewer steps, a higher limit).
    """
    limit = cfg.data.max_epochs
    epochs = passes(cfg, n_windows)
    if limit is None or epochs <= limit:
        return
    raise InputError(
        f"{cfg.train.steps} steps x {windows_per_step(cfg):,} windows would pass over the {n_windows:,} distinct "
        f"training windows ({train_tokens:,} tokens) {epochs:.1f} times, more than data.max_epochs={limit:g}: give it a corpus of the paper's size "
        "(data.corpus = \"hf:NAME\" or a folder of Parquet or JSON-lines shards, see docs/scaling.md, 'Large corpora'), "
        f"fewer train.steps, or allow the repetition with {param('data.max_epochs', math.ceil(epochs))}"
    )


def epochs_warning(cfg: RunConfig, n_windows: int, train_tokens: int) -> str:
    """The warning for a run that passes over its distinct training windows more than :data:`EPOCHS_WARN`
    times ("" otherwise). ``n_windows``: whole training windows (after any cap); ``train_tokens``: the stream
    tokens they hold.

    The data-amount study (README) shows that repeated passes put the model into a memorisation
    regime whose sinks differ from those of a run on fresh tokens.
    """
    epochs = passes(cfg, n_windows)
    if epochs <= EPOCHS_WARN:
        return ""
    return (f"warning: {cfg.train.steps} steps x {windows_per_step(cfg):,} windows pass over the {n_windows:,} distinct "
            f"training windows ({train_tokens:,} tokens) {epochs:.1f} times (more than {EPOCHS_WARN:g}): the model will memorise them; use a larger "
            "corpus (a JSON-lines, Parquet or Arrow dataset, see docs/scaling.md, 'Large corpora') or fewer steps")


#: the packings whose windows are meant to be cut from concatenated documents wherever they fall (no BOS)
MID_DOCUMENT_PACKINGS = ("concat", "random_first", "random_first2")


def alignment_warning(cfg: RunConfig, data: PackedData, eos_id: int) -> str:
    """The one-line warning for a packing of :data:`MID_DOCUMENT_PACKINGS` whose training windows never hold a
    document boundary among their inputs ("" otherwise, and for a stream of fewer than two documents): every window
    then lies inside one document (:meth:`sinklab.data.packing.PackedData.boundary_share` is 0), as with synthetic
    documents of equal length whose period (``doc_len + 1`` with its EOS) is a multiple of the window's stream tokens
    (a random first token at T 64 or 256 with ``doc_len`` 255: 64 divides 256), so the windows do not fall across
    documents as concatenated text does, and a comparison with a packing whose windows do changes two things."""
    if cfg.data.packing not in MID_DOCUMENT_PACKINGS or data.n_windows < 2:
        return ""
    if data.boundary_share(eos_id) > 0 or int((data.stream[: data.n_tokens] == eos_id).sum()) < 2:
        return ""  # (the usual case returns after one pass over the stream)
    return (f"warning: no training window holds a document boundary among its inputs (packing {cfg.data.packing!r}, "
            f"windows of {data.chunk} stream tokens): every window lies inside one document, unlike windows cut from "
            f"concatenated text; with synthetic documents of equal length choose data.synthetic.doc_len so that "
            f"doc_len + 1 is not a multiple of {data.chunk}")


def warmup_warning(cfg: RunConfig) -> str:
    """The one-line warning for a run shorter than its learning-rate warm-up ("" otherwise): with
    ``train.steps < optim.warmup_steps`` the learning rate of :func:`sinklab.train.schedule.lr_at` peaks at
    its last step at ``lr * steps / warmup_steps`` and never reaches ``optim.lr`` (``sinklab train tiny-cpu
    --steps 20``: 2e-4 instead of 1e-3)."""
    steps, warm = cfg.train.steps, cfg.optim.warmup_steps
    if steps >= warm:
        return ""
    peak = lr_at(steps - 1, cfg.optim, steps)
    return (f"warning: train.steps = {steps} is shorter than the warm-up optim.warmup_steps = {warm}: the learning rate "
            f"peaks at {peak:.3g} ({steps}/{warm} of optim.lr = {cfg.optim.lr:g}) and never decays; lower it, e.g. "
            f"{param('optim.warmup_steps', max(1, steps // 10))}")


def _warn(message: str) -> None:
    import warnings

    warnings.warn(render(message), stacklevel=3)


def _extend_note(cfg: RunConfig, done: int, planned: int) -> str:
    """The message for a finished run of ``planned`` steps continued to ``cfg.train.steps``."""
    o, new = cfg.optim, cfg.train.steps
    head = f"the run finished its {planned} steps; continuing to {new} steps"
    if o.schedule == "constant":
        return f"{head}; the constant schedule does not depend on the step count, so the losses are those of {new} steps trained in one go"
    lr_end, lr_next = lr_at(done - 1, o, planned), lr_at(done, o, new)
    return (f"{head}; the {o.schedule} schedule was fitted to {planned} steps and ended at lr {lr_end:.3g}; it is "
            f"refitted to {new} steps, so the learning rate goes back up to {lr_next:.3g} at step {done + 1} and "
            f"decays to {lr_at(new - 1, o, new):.3g} by step {new}: the result differs from {new} steps trained in one go")


#: written to the run folder when training diverges: {"step", "what", "value", "last_checkpoint", "message"}
DIVERGED_NAME = "diverged.json"


def _diverged(what: str, value: float, step: int, last_ckpt: int | None, path: Path) -> None:
    """Raise :class:`TrainingDiverged` after recording it in ``DIR/diverged.json`` (a sweep reads it as
    a finished outcome: the row reports the step at which the run diverged)."""
    kept = (f"the last good checkpoint (step {last_ckpt}) is kept at {path}" if last_ckpt is not None
            else "no checkpoint was written before it")
    msg = (f"training stopped: the {what} is {value} at step {step}; {kept}. "
           "Lower optim.lr, raise optim.warmup_steps or enable optim.grad_clip")
    rec = {"step": step, "what": what, "value": str(value), "last_checkpoint": last_ckpt, "message": msg}
    atomic_write_text(path.parent / DIVERGED_NAME, json.dumps(rec, indent=1))
    raise TrainingDiverged(msg)
