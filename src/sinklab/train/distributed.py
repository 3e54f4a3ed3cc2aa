"""Data-parallel training on ``torch.distributed``: process group, batch sharding, DDP / FSDP2, state dicts.

The training loop (:func:`sinklab.train.loop.train`) stays single-device code; this module applies
data parallelism from outside, the way torchtitan's ``parallelize`` does:

* :func:`setup` joins the process group that ``torchrun`` describes in the environment
  (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``) with a backend for each
  device type in use (:func:`backend_for`: ``"cpu:gloo,cuda:nccl"`` on CUDA, ``"gloo"`` on CPU).
  Without those variables it returns a one-process context and every function below is the
  identity, so a plain ``sinklab train`` computes exactly what it did before.
* **Collectives per step.** Besides the engine's own gradient reduction, a step makes two
  collectives, both on tensors of the training device and neither per micro-batch: the target
  counts of all its micro-batches (:func:`loss_weights`, before the first forward) and the
  micro-batch losses (:func:`mean_over_ranks`, after the last backward), followed by the step's
  one host synchronisation (torchtitan and nanochat keep these on the device the same way).
* **Global batch.** ``train.batch_size`` B and ``train.grad_accum`` A keep their single-process
  meaning: step s reads global samples ``g = (s*A + m)*B + b`` for micro-batch m = 0..A-1 and
  b = 0..B-1 (:meth:`~sinklab.data.packing.PackedData.batch`). With W ranks, rank r takes
  ``b = r*B/W ... (r+1)*B/W - 1`` of every micro-batch (:func:`micro_batch`), so no two ranks read
  the same window in a step and the union of the ranks' samples is the one-process batch.
* **Loss arithmetic.** A rank's loss is the mean cross-entropy over its own unmasked targets
  (c_r of them), scaled by ``c_r * W / C`` with ``C = sum_r c_r``. DDP and FSDP2 average the
  ranks' gradients (divide by W), so the applied gradient is that of ``sum over all C targets / C``:
  the one-process micro-batch mean, whatever W is and however the masks fall.
* **Engines.** :func:`wrap` applies ``DistributedDataParallel`` (``train.parallel = "ddp"``, default)
  or FSDP2 ``fully_shard`` on every block and then the root (``"fsdp"``).
* **Checkpoints.** :func:`state_dicts` gathers full (unsharded) model and optimizer state dicts on
  rank 0 in the one-process format (optimizer state keyed by parameter index), so a checkpoint
  written by W ranks resumes on any number of ranks, one included (:func:`load_state`).
* Logging, TensorBoard, the summary and ``final/`` are written by rank 0 only (:attr:`Dist.is_main`).

``SINKLAB_DIST_TIMEOUT_S`` (default 600) bounds how long a rank waits in a collective for a peer
that stopped answering before it fails. ``SINKLAB_FAULT=RANK:STEP`` makes that rank kill itself
with SIGKILL when it starts that 1-based step (used by the tests to check that a dead rank fails
the launch cleanly).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from sinklab.data.packing import IGNORE_INDEX, PackedData
from sinklab.errors import ConfigError, SinklabError

#: seconds a rank waits in a collective before failing (a dead or stuck peer)
DEFAULT_TIMEOUT_S = 600


@dataclass
class Dist:
    """Where this process stands in the process group.

    Attributes:
        rank: 0-based global rank.
        world: number of processes W (1 = not distributed).
        local_rank: 0-based rank on this node (picks the CUDA device).
        strategy: "ddp" or "fsdp".
        owns_group: :func:`setup` created the process group (so :func:`teardown` destroys it).
        fault: the test hook ``SINKLAB_FAULT`` (``"RANK:STEP"``, see :func:`maybe_fault`) as
            :func:`setup` read it from the environment, or None.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    strategy: str = "ddp"
    owns_group: bool = False
    fault: str | None = None

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes logs, checkpoints and the summary."""
        return self.rank == 0


def env_world_size() -> int:
    """``WORLD_SIZE`` set by ``torchrun`` (1 when absent)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def backend_for(device: torch.device) -> str:
    """The ``init_process_group`` backend for training on ``device``: one backend per device type in use.

    CUDA: ``"cpu:gloo,cuda:nccl"`` (NCCL serves CUDA tensors; a CPU tensor, e.g. a DCP state-dict
    gather with CPU offload, goes through gloo instead of failing with "No backend type associated
    with device type cpu"). Anything else: ``"gloo"``.
    """
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def setup(parallel: str | None, device: torch.device) -> Dist:
    """Join the process group described by the ``torchrun`` environment, if any.

    Args:
        parallel: ``train.parallel`` (None = "ddp").
        device: the configured device; the backend is :func:`backend_for` (NCCL for CUDA tensors,
            gloo for CPU tensors).

    Returns:
        A :class:`Dist`; ``world == 1`` (nothing initialised) when ``WORLD_SIZE`` is unset or 1.
        The environment (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``SINKLAB_DIST_TIMEOUT_S``, the
        test hook ``SINKLAB_FAULT``) is read here, once per training, not in the step loop.
    """
    strategy = parallel or "ddp"
    world = env_world_size()
    fault = os.environ.get("SINKLAB_FAULT") or None
    if world <= 1:
        return Dist(strategy=strategy, fault=fault)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=float(os.environ.get("SINKLAB_DIST_TIMEOUT_S", DEFAULT_TIMEOUT_S)))
        if device.type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend_for(device), timeout=timeout)
        owns = True
    return Dist(rank=rank, world=world, local_rank=local, strategy=strategy, owns_group=owns, fault=fault)


def teardown(d: Dist) -> None:
    """Destroy the process group if :func:`setup` created it."""
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(d: Dist, device: torch.device) -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` for CUDA runs, else ``device`` unchanged."""
    if d.enabled and device.type == "cuda":
        return torch.device("cuda", d.local_rank)
    return device


def check_batch(d: Dist, batch_size: int) -> None:
    """Raises ConfigError when the global batch does not split evenly over the ranks."""
    if batch_size % d.world:
        raise ConfigError(
            f"train.batch_size={batch_size} (the global batch) does not split over {d.world} processes; "
            f"use a multiple of {d.world} or another number of processes"
        )


def barrier(d: Dist) -> None:
    """Wait for every rank (no-op on one process)."""
    if d.enabled:
        dist.barrier()


@contextlib.contextmanager
def main_first(d: Dist) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. tokenizes a corpus into the shared cache), then the others
    (which find the cache)."""
    if d.enabled and not d.is_main:
        dist.barrier()
    yield
    if d.enabled and d.is_main:
        dist.barrier()


def first_sample(d: Dist, step: int, micro: int, grad_accum: int, batch_size: int) -> int:
    """Global 0-based index of this rank's first sample in micro-batch ``micro`` of ``step``."""
    first = (step * grad_accum + micro) * batch_size
    return first + d.rank * (batch_size // d.world) if d.enabled else first


def micro_batch(d: Dist, data: PackedData, step: int, micro: int, grad_accum: int, batch_size: int,
                *, prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of micro-batch ``micro`` of ``step`` (both 0-based); no collective.

    Returns:
        (input_ids (B/W, T) int64, targets (B/W, T) int64 with -100 masked), on the CPU; the whole
        micro-batch (B, T) on one process.
    """
    first = first_sample(d, step, micro, grad_accum, batch_size)
    share = batch_size // d.world if d.enabled else batch_size
    return data.samples(first, share, prefix_len=prefix_len)


def stat_dtype(device: torch.device) -> torch.dtype:
    """dtype of a step's counts and losses on ``device``: float64 (a float32 loss converts exactly, so
    sums in it are those of Python floats), float32 on MPS (no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def loss_weights(d: Dist, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                 count=None) -> torch.Tensor | None:
    """The loss weights of this rank's micro-batches of one step: one collective for the whole step.

    Args:
        batches: the A micro-batches ``(x, y)`` of the step (:func:`micro_batch`).
        device: the training device; the counts are reduced as a tensor there.
        count: ``count(x, y) -> float``, the number of positions the rank's mean loss runs over
            (default: the targets that are not -100; the masked diffusion objective counts every
            position).

    Returns:
        (A,) tensor on ``device`` (float64; float32 on MPS): ``w[m] = c_{r,m} * W / C_m`` with
        ``C_m = sum_r c_{r,m}`` (see the module docstring), to multiply micro-batch m's mean loss
        by; None on one process (every weight is 1 and the loss is left untouched).
    """
    if not d.enabled:
        return None
    c = [float((y != IGNORE_INDEX).sum()) if count is None else float(count(x, y)) for x, y in batches]
    counts = torch.tensor(c, dtype=stat_dtype(device), device=device)  # (A,)
    total = counts.clone()
    dist.all_reduce(total)
    return counts * d.world / total


def mean_over_ranks(d: Dist, values: torch.Tensor) -> torch.Tensor:
    """Element-wise mean over the ranks of a tensor on the training device: one collective
    (``values`` itself on one process). ``values``: any shape, float."""
    if not d.enabled:
        return values
    t = values.clone()
    dist.all_reduce(t)
    return t / d.world


def wrap(d: Dist, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Apply the data-parallel engine; returns the module to run forward/backward through.

    "ddp": ``DistributedDataParallel(model)`` (parameters broadcast from rank 0). "fsdp":
    ``fully_shard`` on each block of ``model.layers`` and then on ``model`` itself (in place;
    returns ``model``): parameters become DTensors sharded over the ranks, so build the optimizer
    after this. One process: ``model`` unchanged.
    """
    if not d.enabled:
        return model
    if d.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.layers:
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def grad_sync(d: Dist, wrapped: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Context for one micro-batch's backward: gradients are reduced over the ranks only when
    ``sync`` (the last micro-batch of a step); earlier ones accumulate locally."""
    if not d.enabled or sync:
        if d.enabled and d.strategy == "fsdp":
            wrapped.set_requires_gradient_sync(True)
        return contextlib.nullcontext()
    if d.strategy == "fsdp":
        wrapped.set_requires_gradient_sync(False)
        return contextlib.nullcontext()
    return wrapped.no_sync()


def local_full(x: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP2: e.g. the clipped gradient norm) as a plain tensor (a collective); any other
    tensor unchanged. Stays on its device (no host synchronisation)."""
    full = getattr(x, "full_tensor", None)
    return full() if full is not None else x


def _param_names(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[str]:
    """Parameter names in the optimizer's index order (the keys of ``opt.state_dict()['state']``)."""
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [by_id[id(p)] for g in opt.param_groups for p in g["params"]]


def state_dicts(d: Dist, model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict | None, dict | None]:
    """Full model and optimizer state dicts on rank 0, in the one-process format; (None, None) elsewhere.

    A collective under FSDP2: every rank must call it. ``model`` is the unwrapped module.
    """
    if not d.enabled or d.strategy != "fsdp":
        return (model.state_dict(), opt.state_dict()) if d.is_main else (None, None)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=o)
    osd = get_optimizer_state_dict(model, opt, options=o)
    if not d.is_main:
        return None, None
    index = {n: i for i, n in enumerate(_param_names(model, opt))}
    osd = {"state": {index[k]: v for k, v in osd["state"].items()},
           "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}
    return msd, osd


def load_state(d: Dist, model: torch.nn.Module, opt: torch.optim.Optimizer, model_sd: dict, opt_sd: dict) -> None:
    """Load full state dicts (as :func:`state_dicts` returns and every rank reads from the checkpoint)
    into the (possibly sharded) model and its optimizer."""
    if not d.enabled or d.strategy != "fsdp":
        model.load_state_dict(model_sd)
        opt.load_state_dict(opt_sd)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    o = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_sd, options=o)
    names = _param_names(model, opt)
    fqn = {"state": {names[i]: v for i, v in opt_sd["state"].items()},
           "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in opt_sd["param_groups"]]}
    set_optimizer_state_dict(model, opt, fqn, options=o)


def full_model(d: Dist, model: torch.nn.Module, build: Any) -> torch.nn.Module | None:
    """An unsharded copy of the model on rank 0 (None elsewhere); ``build()`` makes an empty one.

    DDP / one process: ``model`` itself. FSDP2: a collective (every rank calls it).
    """
    if not d.enabled or d.strategy != "fsdp":
        return model if d.is_main else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    msd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not d.is_main:
        return None
    m = build()
    m.load_state_dict(msd)
    return m


def maybe_fault(d: Dist, step: int) -> None:
    """Test hook: ``SINKLAB_FAULT=RANK:STEP`` (read by :func:`setup` into ``d.fault``) kills rank RANK
    with SIGKILL as it starts 1-based step STEP."""
    spec = d.fault
    if spec and spec == f"{d.rank}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------- launching


class LaunchError(SinklabError):
    """A multi-process launch failed (a rank died or exited with an error)."""


_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


def failure_message(nproc: int, returncode: int, torchrun_stderr: str) -> str:
    """One line naming the rank that failed first and how, from torchrun's "Root Cause" report."""
    text = torchrun_stderr[torchrun_stderr.find("Root Cause"):] if "Root Cause" in torchrun_stderr else torchrun_stderr
    m = _FAILURE.search(text)
    if m is None:
        return (f"distributed training on {nproc} processes failed (torchrun exit code {returncode}); "
                "see the messages above; resume from the last checkpoint with --resume")
    rank, code = int(m.group(1)), int(m.group(2))
    how = f"was killed by signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() \
        else f"exited with code {code}"
    return (f"distributed training on {nproc} processes failed: rank {rank} {how}, and torchrun stopped the other "
            "ranks; the last checkpoint is kept, resume with --resume")


def launch(nproc: int, args: list[str], *, env: dict[str, str] | None = None) -> None:
    """Run ``sinklab ARGS`` on ``nproc`` local processes under torchrun and wait for it.

    The command is ``python -m torch.distributed.run --standalone --nproc-per-node NPROC
    --max-restarts 0 -m sinklab ARGS`` (what ``sinklab train --nproc N`` runs). The ranks' output
    is passed through to stderr.

    Raises:
        LaunchError: a rank died or failed; the message names the first one and its exit code or
            signal. torchrun stops the remaining ranks as soon as one fails, and a rank blocked in a
            collective with a dead peer fails after at most ``SINKLAB_DIST_TIMEOUT_S`` seconds.
    """
    import subprocess
    import sys
    from collections import deque

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "--max-restarts=0", "-m", "sinklab", *args]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, errors="replace", env=env)
    tail: deque[str] = deque(maxlen=400)
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        tail.append(line)
    rc = proc.wait()
    if rc != 0:
        raise LaunchError(failure_message(nproc, rc, "".join(tail)))
