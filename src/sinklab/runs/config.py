"""Run configs: TOML files mapped onto one flat dataclass per concern.

A run config has five sections::

    [model]  -> sinklab.nn.ModelConfig (vocab_size defaults to the tokenizer's, max_seq_len to
                the longer of data.seq_len and track.probe_len)
    [data]   -> DataConfig   corpus, tokenizer, packing, token cap, split
    [optim]  -> OptimConfig  AdamW, weight decay, schedule, clipping
    [train]  -> TrainConfig  steps, batch, seed, device, precision, prefix LM, checkpoints
    [track]  -> TrackConfig  sink tracking on the probe set

A file may start from a shipped preset with a top-level ``preset = "tiny-cpu"`` and change only
some keys. Unknown keys are errors naming the nearest valid key; ``--set section.key=value``
overrides parse the value as TOML (a bare word is taken as a string). Incompatible choices are
rejected with the reason. :func:`to_toml` writes the fully resolved config (saved as
``DIR/config.toml``), which :func:`load_config` reads back to an equal config.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import tomllib
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sinklab.errors import ConfigError
from sinklab.fileio import read_toml
from sinklab.registry import nearest

#: training objectives (``train.objective``): :mod:`sinklab.train.objective` implements them
OBJECTIVES = ("causal", "masked_diffusion")

#: ``data.attention_mask`` values: attention across the documents of a packed window, or only inside each
ATTENTION_MASKS = ("causal", "document")

GPT2_VOCAB = 50258  # 50257 GPT-2 ids + the added <|bos|>


@dataclass(kw_only=True)
class DataConfig:
    """What the model reads.

    Fields:
        corpus: corpus zoo name, a path to a .txt file/folder, or a list of them (a mix).
        tokenizer: "bpe" (byte-level BPE trained on the training split) or "gpt2".
        vocab_size: BPE vocabulary size (ignored for gpt2).
        seq_len: T, tokens per training window (model inputs).
        packing: name in :data:`sinklab.data.packing.PACKING`.
        packing_position: 0-based position p of the inserted token (``fixed_token``).
        packing_token: the inserted token as a string (``fixed_token``), default BOS.
        attention_mask: "causal" (default: every token attends to all earlier tokens of the packed
            window, across document boundaries) or "document" (intra-document masking: each token
            attends only to the earlier tokens of its own document; a document ends with its EOS,
            :func:`sinklab.attention_masks.document_ids`; training and validation batches, every
            attention backend). The tracker's probe windows are single documents and run without it.
            Positions are not restarted per document (window positions 0..T-1) unless
            ``restart_positions``: RoPE / ALiBi / T5 / NoPE depend on j - i only, so a document gets
            the attention it would get alone either way; learned / sinusoidal absolute positions
            only with the restart. Only with the packings that mark every
            document with EOS (``concat``, ``bos``), a causal objective and no prefix LM (ConfigError
            otherwise). Stored as None for "causal", which is not written to ``config.toml`` (configs
            written before this option read back byte-identical).
        restart_positions: with ``attention_mask = "document"``: every document's tokens get
            positions 0, 1, ... (absolute tables and RoPE; ALiBi / T5 need nothing), so each
            document is computed exactly as if alone (``SinkLM.forward(restart_positions=True)``).
            None / false (default, not written): window positions. ConfigError without the
            document mask.
        max_train_tokens: keep only this many training tokens (0 = all) and repeat them.
        val_fraction: share of documents held out (validation loss and probe set).
        split_seed: seed of the document split.
        cache_dir: token cache folder; "" = ``$SINKLAB_HOME/tokens``, "run" = ``DIR/tokens``.
        source: "corpus" (read ``corpus``), "ngram" (training documents sampled from an n-gram
            model fitted on ``corpus``'s training split, validation on its real held-out text;
            :mod:`sinklab.data.ngram`), or a synthetic source from
            :data:`sinklab.data.synthetic.SYNTHETIC` (e.g. "synthetic-bigram-backcopy"); a
            synthetic source ignores corpus/tokenizer/vocab_size and brings its own vocabulary.
        synthetic: options of the synthetic source (e.g. ``{vocab = 64, n_triggers = 3}``).
        ngram: options of the n-gram source (:class:`sinklab.data.ngram.NGramConfig`, e.g.
            ``{order = 3, n_train_docs = 20000}``); None (not written) for the other sources.
        text_field: column holding the text when ``corpus`` is a dataset (JSON lines, Parquet,
            Arrow, ``hf:NAME``; see :mod:`sinklab.zoo.datasets_io`); None = "text".
        num_proc: processes for reading a dataset; None = automatic. Neither option changes the
            tokens of a ``.txt`` or zoo corpus; None values are not written to ``config.toml``.
        max_epochs: the most passes over the distinct training windows (``train.steps x batch_size x
            grad_accum / training windows``) the run may make: more refuses to start (InputError, before
            any training). None (not written) = no limit, only the warning past
            :data:`sinklab.train.loop.EPOCHS_WARN` passes. 4 in the paper presets, whose step
            counts would repeat the offline corpus zoo (6.0M tokens with their BPE) 220-440 times.
    """

    corpus: str | list[str] = "sotu"
    tokenizer: str = "bpe"
    vocab_size: int = 8192
    seq_len: int = 256
    packing: str = "concat"
    packing_position: int = 0
    packing_token: str = "<|bos|>"
    attention_mask: str | None = None
    restart_positions: bool | None = None
    max_train_tokens: int = 0
    val_fraction: float = 0.05
    split_seed: int = 0
    cache_dir: str = ""
    source: str = "corpus"
    synthetic: dict[str, Any] = field(default_factory=dict)
    ngram: dict[str, Any] | None = None
    text_field: str | None = None
    num_proc: int | None = None
    max_epochs: float | None = None

    def __post_init__(self) -> None:
        _check_types(self, "data")
        if self.num_proc is not None and self.num_proc < 1:
            raise ConfigError(f"data.num_proc must be >= 1, got {self.num_proc}")
        if self.max_epochs is not None:
            _positive("data.max_epochs", self.max_epochs)
            self.max_epochs = float(self.max_epochs)
        if self.source == "ngram":
            from sinklab.data.ngram import make_config as ngram_config

            ngram_config(self.ngram or {})  # validates the options
        elif self.source != "corpus":
            from sinklab.data.synthetic import vocab_size as synthetic_vocab

            synthetic_vocab(self.source, self.synthetic)  # validates the name and the options
        if self.tokenizer not in ("bpe", "gpt2"):
            raise ConfigError(f"data.tokenizer must be 'bpe' or 'gpt2', got {self.tokenizer!r}")
        _positive("data.seq_len", self.seq_len)
        _positive("data.vocab_size", self.vocab_size)
        if self.max_train_tokens < 0 or self.packing_position < 0:
            raise ConfigError("data.max_train_tokens and data.packing_position must be >= 0")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        from sinklab.data.packing import PACKING

        PACKING.get(self.packing)
        if self.attention_mask not in (None, *ATTENTION_MASKS):
            hint = nearest(str(self.attention_mask), list(ATTENTION_MASKS))
            raise ConfigError(f"data.attention_mask must be one of {', '.join(map(repr, ATTENTION_MASKS))}, "
                              f"got {self.attention_mask!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
        if self.attention_mask == "causal":
            self.attention_mask = None  # the default, not written
        if self.document_mask and not PACKING.get(self.packing).documents:
            raise ConfigError(f"data.attention_mask='document' cannot be combined with data.packing={self.packing!r}: "
                              "its inserted token belongs to no document (use packing 'concat' or 'bos')")

        if self.restart_positions is False:
            self.restart_positions = None  # the default, not written
        if self.restart_positions and not self.document_mask:
            raise ConfigError("data.restart_positions=true needs data.attention_mask='document' "
                              "(positions restart at each document of a packed window)")

    @property
    def document_mask(self) -> bool:
        """True for intra-document masking (``attention_mask = "document"``)."""
        return self.attention_mask == "document"

    @property
    def tokenizer_vocab_size(self) -> int:
        """Largest number of ids the tokenizer can emit."""
        if self.source not in ("corpus", "ngram"):
            from sinklab.data.synthetic import vocab_size as synthetic_vocab

            return synthetic_vocab(self.source, self.synthetic)
        return GPT2_VOCAB if self.tokenizer == "gpt2" else self.vocab_size


@dataclass(kw_only=True)
class OptimConfig:
    """AdamW and the learning-rate schedule.

    Fields:
        lr: peak learning rate.
        beta1, beta2, eps: AdamW moments.
        weight_decay: decoupled weight decay.
        decay: "matrices" (every parameter with 2 or more dimensions: weight matrices, embeddings and the
            per-head (H_kv, d_h) key / value biases of ``kv_bias``, ``k_bias``, ``v_bias``; vectors such as norm
            gains, linear biases, the sink token and sink logits are not decayed) or "all" (every parameter, as
            the paper's code does).
        schedule: "cosine" (to ``min_lr_ratio * lr`` at the last step) or "constant".
        warmup_steps: linear warm-up steps.
        min_lr_ratio: floor of the cosine schedule as a fraction of ``lr``.
        grad_clip: clip the global gradient l2 norm to this (0 = no clipping).
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay: str = "matrices"
    schedule: str = "cosine"
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        _check_types(self, "optim")
        _positive("optim.lr", self.lr)
        if self.decay not in ("matrices", "all"):
            raise ConfigError(f"optim.decay must be 'matrices' or 'all', got {self.decay!r}")
        if self.schedule not in ("cosine", "constant"):
            raise ConfigError(f"optim.schedule must be 'cosine' or 'constant', got {self.schedule!r}")
        for k in ("weight_decay", "grad_clip", "warmup_steps", "eps"):
            if getattr(self, k) < 0:
                raise ConfigError(f"optim.{k} must be >= 0, got {getattr(self, k)}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for k in ("beta1", "beta2"):
            if not 0 <= getattr(self, k) < 1:
                raise ConfigError(f"optim.{k} must be in [0, 1), got {getattr(self, k)}")


@dataclass(kw_only=True)
class TrainConfig:
    """The loop.

    Fields:
        steps: optimizer steps.
        batch_size: windows per micro-batch; tokens per step = batch_size * grad_accum * seq_len.
        grad_accum: micro-batches per optimizer step.
        seed: seed of the model init, the window order and the random-first tokens.
        device: "auto" (CUDA when available), "cpu", "cuda", "cuda:N" or "mps".
        precision: "bf16" (autocast on CPU and GPU) or "fp32".
        compile: apply ``torch.compile`` to the model (from outside the model).
        prefix_len: bidirectional prefix length p of a prefix LM (0 = causal LM).
        log_every: steps between metrics.jsonl lines.
        checkpoint_every: steps between checkpoints (always one at the end; 0 = end only).
        tensorboard: also log to ``DIR/tb``.
        parallel: data-parallel engine when launched on several processes (``torchrun`` or
            ``sinklab train --nproc N``): None or "ddp" (DistributedDataParallel, the default) or
            "fsdp" (FSDP2 ``fully_shard``: parameters, gradients and optimizer state sharded).
            Ignored by a single process. ``batch_size`` stays the global batch: each of the W
            ranks takes ``batch_size / W`` windows of every micro-batch, so the losses do not
            depend on W (see :mod:`sinklab.train.distributed`). None is written as an absent key,
            so configs written before this option existed read back byte-identical.
        objective: "causal" (next-token loss; the model is causal) or "masked_diffusion" (the
            masked diffusion loss of MDLM / LLaDA on a bidirectional model, ``model.causal =
            false``, with a mask token added to the vocabulary; see
            :mod:`sinklab.diffusion.masking`). Nothing else changes between the two.
        mask_eps: lower end of the masked diffusion mask ratio t ~ U(mask_eps, 1).
        threads: torch intra-op CPU threads, set by :func:`sinklab.train.train` before any work
            (so ``OMP_NUM_THREADS`` in the environment cannot change a run: CPU reductions split
            over a different number of threads round differently, and the losses of two runs of
            one config drift apart after some tens of steps). 1 in the CPU presets; None = leave
            torch's own setting (GPU runs; not written to ``config.toml``). Part of what a run's
            numbers depend on: a resume must use the same value.
        init_from: a finished run folder (or its ``final/``) whose weights the model starts from
            (fine-tuning): a fresh optimizer and schedule on this config's data. The model config
            must equal the run's, and the tokenizer too (token ids must mean the same tokens).
            None (not written) = a random initialisation from ``seed``.
    """

    steps: int = 1000
    batch_size: int = 16
    grad_accum: int = 1
    seed: int = 0
    device: str = "auto"
    precision: str = "bf16"
    compile: bool = False
    prefix_len: int = 0
    log_every: int = 10
    checkpoint_every: int = 200
    tensorboard: bool = True
    parallel: str | None = None
    objective: str = "causal"
    mask_eps: float = 1e-3
    threads: int | None = None
    init_from: str | None = None

    def __post_init__(self) -> None:
        _check_types(self, "train")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"train.threads must be >= 1 (or absent: torch's own setting), got {self.threads}")
        if self.objective not in OBJECTIVES:
            hint = nearest(self.objective, list(OBJECTIVES))
            raise ConfigError(f"train.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}"
                              + (f" (did you mean {hint!r}?)" if hint else ""))
        if not 0.0 < self.mask_eps < 1.0:
            raise ConfigError(f"train.mask_eps must be in (0, 1), got {self.mask_eps}")
        if self.parallel not in (None, "ddp", "fsdp"):
            raise ConfigError(f"train.parallel must be 'ddp' or 'fsdp', got {self.parallel!r}")
        for k in ("steps", "batch_size", "grad_accum", "log_every"):
            _positive(f"train.{k}", getattr(self, k))
        if self.prefix_len < 0 or self.checkpoint_every < 0:
            raise ConfigError("train.prefix_len and train.checkpoint_every must be >= 0")
        if self.precision not in ("bf16", "fp32"):
            raise ConfigError(f"train.precision must be 'bf16' or 'fp32', got {self.precision!r}")
        if not (self.device in ("auto", "cpu", "cuda", "mps") or self.device.startswith("cuda:")):
            raise ConfigError(f"train.device must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}")


@dataclass(kw_only=True)
class TrackConfig:
    """Sink tracking on a fixed held-out probe set (paper probe: 100 x 64 tokens, eps 0.3).

    Fields:
        every: steps between tracker evaluations (always one at the final step; 0 = final only).
        n_probe: probe windows N.
        probe_len: probe window length T (tokens).
        eps: sink threshold on the attention mass.
        positions: report Sink_k for the first ``positions`` positions.
        emerge_level: Sink_1 level (percent) whose first crossing is reported.
        val_windows: validation windows for the validation loss.
        seed: seed of the probe windows.
        batch_size: probe sequences per forward pass.
    """

    every: int = 100
    n_probe: int = 100
    probe_len: int = 64
    eps: float = 0.3
    positions: int = 8
    emerge_level: float = 10.0
    val_windows: int = 64
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        _check_types(self, "track")
        for k in ("n_probe", "probe_len", "positions", "val_windows", "batch_size"):
            _positive(f"track.{k}", getattr(self, k))
        if self.every < 0:
            raise ConfigError("track.every must be >= 0")
        if not 0 < self.eps < 1:
            raise ConfigError(f"track.eps must be in (0, 1), got {self.eps}")
        if not 0 < self.emerge_level <= 100:
            raise ConfigError(f"track.emerge_level is a Sink_1 level in percent: it must be in (0, 100], got {self.emerge_level}")
        if self.positions > self.probe_len:
            raise ConfigError(f"track.positions={self.positions} exceeds track.probe_len={self.probe_len}")


#: attention operations that cannot be combined with a bidirectional prefix (prefix LM).
PREFIX_INCOMPATIBLE = {
    "sink_token": "a learnable sink token is prepended at position 0 and a bidirectional prefix would let "
    "it attend to the text, so it no longer acts as a fixed sink",
}


@dataclass
class RunConfig:
    """A whole run: model, data, optimizer, loop and tracker configs."""

    model: Any  # sinklab.nn.ModelConfig
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    track: TrackConfig = field(default_factory=TrackConfig)

    def __post_init__(self) -> None:
        m, d, t, k = self.model, self.data, self.train, self.track
        if m.vocab_size < self.vocab_needed:
            raise ConfigError(
                f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's "
                f"{d.tokenizer_vocab_size} ids (data.tokenizer={d.tokenizer!r})"
                + (" plus the mask token of train.objective='masked_diffusion'" if self.diffusion else "")
            )
        if m.causal != (not self.diffusion):
            raise ConfigError(
                f"model.causal={str(m.causal).lower()} does not fit train.objective={t.objective!r}: "
                + ("masked diffusion predicts masked tokens from both sides, so the model must be bidirectional "
                   "(leave model.causal unset)" if self.diffusion else
                   "a bidirectional model would see the token it has to predict (leave model.causal unset)")
            )
        if self.diffusion and t.prefix_len:
            raise ConfigError(f"train.prefix_len={t.prefix_len} has no meaning with train.objective='masked_diffusion': "
                              "the model is bidirectional over the whole window")
        for name, T in (("data.seq_len", d.seq_len), ("track.probe_len", k.probe_len)):
            if T > m.max_seq_len:
                raise ConfigError(f"{name}={T} is past model.max_seq_len={m.max_seq_len} (the positional encoding's limit)")
        if t.prefix_len:
            if t.prefix_len >= d.seq_len:
                raise ConfigError(f"train.prefix_len={t.prefix_len} must be below data.seq_len={d.seq_len}")
            if m.attention in PREFIX_INCOMPATIBLE:
                raise ConfigError(
                    f"train.prefix_len > 0 (prefix LM) cannot be combined with model.attention={m.attention!r}: "
                    + PREFIX_INCOMPATIBLE[m.attention]
                )
            if m.sliding_window is not None and m.sliding_window < t.prefix_len:
                raise ConfigError(
                    f"model.sliding_window={m.sliding_window} is narrower than train.prefix_len={t.prefix_len}: "
                    "the bidirectional prefix would not fit in the window"
                )
        if d.document_mask and t.prefix_len:
            raise ConfigError(f"data.attention_mask='document' cannot be combined with train.prefix_len={t.prefix_len}: "
                              "the bidirectional prefix would span documents")
        if d.document_mask and self.diffusion:
            raise ConfigError("data.attention_mask='document' cannot be combined with train.objective='masked_diffusion': "
                              "not built (document ids would have to come from the clean windows before masking)")
        if d.packing == "fixed_token" and d.packing_position >= d.seq_len:
            raise ConfigError(f"data.packing_position={d.packing_position} must be below data.seq_len={d.seq_len}")
        if d.packing == "fixed_token" and d.packing_position >= k.probe_len:
            raise ConfigError(f"data.packing_position={d.packing_position} must be below track.probe_len={k.probe_len}")

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (every field, resolved)."""
        return {
            "model": self.model.to_dict(),
            "data": dataclasses.asdict(self.data),
            "optim": dataclasses.asdict(self.optim),
            "train": dataclasses.asdict(self.train),
            "track": dataclasses.asdict(self.track),
        }

    @property
    def diffusion(self) -> bool:
        """True for a masked diffusion run (``train.objective = "masked_diffusion"``)."""
        return self.train.objective == "masked_diffusion"

    @property
    def vocab_needed(self) -> int:
        """Embedding rows the run needs: the tokenizer's ids, plus the mask token for masked diffusion."""
        return self.data.tokenizer_vocab_size + (1 if self.diffusion else 0)

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.train.grad_accum * self.data.seq_len


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig, "track": TrackConfig}
TOP_KEYS = ["preset", "model", *SECTIONS]


# ----------------------------------------------------------------------------- checks


def _positive(name: str, v: Any) -> None:
    if v <= 0:
        raise ConfigError(f"{name} must be > 0, got {v}")


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return True
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return any(_type_ok(value, a) for a in typing.get_args(tp))
    if origin is list:
        (a,) = typing.get_args(tp)
        return isinstance(value, list) and all(_type_ok(x, a) for x in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def _check_types(obj: Any, section: str) -> None:
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if not _type_ok(v, hints[f.name]):
            if isinstance(v, float) and not math.isfinite(v) and _type_ok(0.0, hints[f.name]):
                raise ConfigError(f"{section}.{f.name} must be a finite number, got {v!r}")
            raise ConfigError(f"{section}.{f.name} must be of type {hints[f.name]}, got {v!r}")
        if f.name.endswith("seed") and isinstance(v, int) and not 0 <= v < 2**32:  # NumPy's and torch's seed range
            raise ConfigError(f"{section}.{f.name} must be in [0, 2**32), got {v}")
        if hints[f.name] is float and isinstance(v, int):
            setattr(obj, f.name, float(v))


def _unknown(key: str, valid: list[str], where: str) -> ConfigError:
    hint = nearest(key, valid)
    return ConfigError(
        f"unknown key {where}{key!r}" + (f" (did you mean {hint!r}?)" if hint else "") + f"; valid keys: {', '.join(valid)}"
    )


def _build_section(cls: type, name: str, raw: Any) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"[{name}] must be a table, got {raw!r}")
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in valid:
            raise _unknown(key, valid, f"in [{name}]: ")
    return cls(**raw)


def _build_model(raw: Any, data: DataConfig, track: TrackConfig, train: TrainConfig):
    from sinklab.nn.config import ModelConfig

    if not isinstance(raw, dict):
        raise ConfigError(f"[model] must be a table, got {raw!r}")
    raw = dict(raw)
    diffusion = train.objective == "masked_diffusion"
    raw.setdefault("vocab_size", data.tokenizer_vocab_size + (1 if diffusion else 0))  # + the mask token
    raw.setdefault("causal", not diffusion)
    raw.setdefault("max_seq_len", max(data.seq_len, track.probe_len))
    valid = [f.name for f in dataclasses.fields(ModelConfig)]
    for key in raw:
        if key not in valid:
            raise _unknown(key, valid, "in [model]: ")
    try:
        return ModelConfig.from_dict(raw)
    except TypeError as e:  # e.g. a wrong type that the model config did not catch
        raise ConfigError(f"[model]: {e}") from None


def from_dict(raw: dict[str, Any]) -> RunConfig:
    """Build a :class:`RunConfig` from a nested dict (a parsed TOML file).

    Raises:
        ConfigError: unknown section or key (names the nearest valid one), bad value, or an
            incompatible combination (says which and why).
    """
    raw = copy.deepcopy(raw)
    if "preset" in raw:
        base = preset_dict(raw.pop("preset"))
        raw = merge(base, raw)
    for key in raw:
        if key not in TOP_KEYS:
            raise _unknown(key, TOP_KEYS, "section ")
    data = _build_section(DataConfig, "data", raw.get("data", {}))
    track = _build_section(TrackConfig, "track", raw.get("track", {}))
    train = _build_section(TrainConfig, "train", raw.get("train", {}))
    if "model" not in raw:
        raise ConfigError("the config has no [model] section")
    return RunConfig(
        model=_build_model(raw["model"], data, track, train),
        data=data,
        optim=_build_section(OptimConfig, "optim", raw.get("optim", {})),
        train=train,
        track=track,
    )


def merge(base: dict, over: dict) -> dict:
    """Deep merge of two nested dicts (``over`` wins), new dict."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "attention_options":
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# ----------------------------------------------------------------------------- presets, files, overrides


def presets() -> dict[str, Path]:
    """Shipped presets: name -> path of its TOML file (``src/sinklab/presets/*.toml``)."""
    root = resources.files("sinklab") / "presets"
    return {Path(p.name).stem: Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml")}


def preset_description(name: str) -> str:
    """A preset's description: its leading comment block (the ``#`` lines before the first other line),
    joined into one line, so a description that runs over several lines is never cut mid-sentence."""
    lines = []
    for line in presets()[name].read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)


def _read_toml(path: Path) -> dict:
    return read_toml(path, "config file")


def preset_dict(name: str, _seen: tuple[str, ...] = ()) -> dict:
    """The raw dict of preset ``name``; a preset may itself start from another (``preset = "..."``),
    whose keys it overrides. Raises ConfigError listing the presets, or naming a cycle."""
    p = presets()
    if name not in p:
        hint = nearest(name, sorted(p))
        raise ConfigError(
            f"unknown preset {name!r}" + (f" (did you mean {hint!r}?)" if hint else "") + f"; presets: {', '.join(sorted(p))}"
        )
    if name in _seen:
        raise ConfigError(f"presets start from each other in a cycle: {' -> '.join((*_seen, name))}")
    raw = _read_toml(p[name])
    if "preset" in raw:
        raw = merge(preset_dict(raw.pop("preset"), (*_seen, name)), raw)
    return raw


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], value); value parsed as TOML, else a string.

    Raises:
        ConfigError: no ``=`` or no dotted key.
    """
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    key, value = text.split("=", 1)
    parts = [p.strip() for p in key.strip().split(".")]
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"override key {key!r} must be section.key (e.g. optim.lr=3e-4)")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return parts, parsed


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``--set`` overrides to a raw config dict (new dict)."""
    out = copy.deepcopy(raw)
    for text in overrides:
        parts, value = parse_override(text)
        d = out
        for p in parts[:-1]:
            d = d.setdefault(p, {})
            if not isinstance(d, dict):
                raise ConfigError(f"override {text!r}: {p!r} is not a table")
        d[parts[-1]] = value
    return out


def load_raw(config_or_preset: str | Path) -> dict:
    """Raw dict of a TOML file path or a preset name. Raises ConfigError when neither exists."""
    path = Path(config_or_preset)
    if path.suffix == ".toml" or path.exists():
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist")
        return _read_toml(path)
    return {"preset": str(config_or_preset)}


def load_config(config_or_preset: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a config file or preset, apply ``--set`` overrides, validate. Raises ConfigError."""
    return from_dict(apply_overrides(load_raw(config_or_preset), overrides or []))


# ----------------------------------------------------------------------------- writing and diffing


def toml_value(v: Any) -> str:
    """One value as a one-line TOML literal (inline tables and arrays), as ``--set key=VALUE`` takes it
    (:func:`parse_override`; used by ``sinklab sweep`` for a study's overrides). Config *files* are
    written by :func:`to_toml` with ``tomli_w``, which has no public one-line value writer."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        import json

        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise ConfigError(f"cannot write {v!r} ({type(v).__name__}) to TOML")


def _toml_key(k: str) -> str:
    import re

    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_value(k)


TOML_HEADER = "# sinklab run config (fully resolved)\n\n"


def _drop_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_drop_none(x) for x in v]
    return v


def to_toml(cfg: RunConfig | dict) -> str:
    """The resolved config as TOML text, written by ``tomli_w`` (None values are omitted: they are
    the defaults). :func:`load_config` reads it back to an equal config.

    The text is what ``sinklab train`` saves as ``config.toml``. Files written before sinklab used
    ``tomli_w`` (hand-formatted: inline tables such as ``attention_options = {}``) differ in
    formatting, not in content, and load the same.

    Raises:
        ConfigError: a value TOML cannot hold.
    """
    import tomli_w

    d = cfg.to_dict() if isinstance(cfg, RunConfig) else cfg
    try:
        return TOML_HEADER + tomli_w.dumps(_drop_none(d))
    except TypeError as e:
        raise ConfigError(f"cannot write the config to TOML: {e}") from None


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v and k != "attention_options":
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


#: keys added after configs were first written, with the value an older config (which lacks them) means
ADDED_KEYS = {"model.causal": True, "train.objective": "causal", "train.mask_eps": 1e-3}


def diff_keys(a: dict, b: dict, ignore: set[str] = frozenset()) -> list[str]:
    """Dotted keys whose values differ between two nested config dicts (a key of :data:`ADDED_KEYS`
    missing on one side counts as its default there)."""
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) | set(fb)
                  if k not in ignore and fa.get(k, ADDED_KEYS.get(k)) != fb.get(k, ADDED_KEYS.get(k)))
