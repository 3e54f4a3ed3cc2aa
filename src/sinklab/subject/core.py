"""The one owner of "what every feature needs": a model with its tokenizer, adapter, device and dtype
(:class:`Subject`, made by :meth:`Subject.load`), and the probe it is run on (:class:`ProbeSpec`, built by
:meth:`Subject.with_probe`).

``measure``, every ``analyze`` entry, ``stream`` and the diffusion analyses load their model here; the
model itself is loaded by :func:`sinklab.models.load_model`, the probe generators are
:mod:`sinklab.probe`, a training run's own held-out probe is :meth:`sinklab.runs.Run.probe`.

Positions are 0-based everywhere (position 0 is the paper's token 1).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch import Tensor, nn

from sinklab.errors import InputError, UnknownNameError, param
from sinklab.models.load import DTYPE_NAMES, cast_model, is_encoder_config

if TYPE_CHECKING:
    from sinklab.capture.adapter import ModelAdapter
    from sinklab.probe import Probe
    from sinklab.runs import Run

#: ``--dtype`` names -> torch dtypes (the model's parameter dtype; statistics are reduced in float32/float64):
#: load_model's names and ``float64`` (a CPU reference; a model object in float64 is measured as it is)
DTYPES = {name: getattr(torch, name) for name in (*DTYPE_NAMES, "float64")}
#: ``ProbeSpec.input`` values besides the probe generators of :data:`sinklab.probe.INPUTS`
AUTO_INPUTS = ("auto", "run")
#: the probe of a model that is not a ``sinklab train`` run, when the caller gives no size (``sinklab measure``'s)
DEFAULT_CORPUS, DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN, DEFAULT_SEED = "sotu", 100, 64, 0


def weights_digest(model: nn.Module) -> str:
    """A 16-hex-digit sha256 of ``model``'s state dict (every parameter and buffer: name, dtype, shape and bytes):
    what tells two models held in memory apart where their class names agree (e.g. whether a saved ``stream``
    result may be resumed for this model). Reads every weight once (about a second for 500 MB)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block every module of ``model`` is in eval mode (dropout off, as every measurement assumes);
    after it each module's own ``training`` flag is what it was before, whatever the block raised.

    Every feature that runs a model it was given (``measure``, each ``analyze`` entry point, ``stream``) runs
    it inside this: a model left in training mode would otherwise give dropout-perturbed numbers that change
    from call to call, and the caller's model is not left changed.
    """
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


def check_device(device: str, device_map: str | None = None, dtype: str | None = None) -> None:
    """Refuse a ``--device`` / ``--device-map`` / ``--dtype`` value no command can take (one line each).

    Raises:
        InputError: device not cpu / cuda / cuda:N / auto, device map not ``auto``, unknown dtype.
    """
    if not (device in ("cpu", "cuda", "auto") or device.startswith("cuda:")):
        raise InputError(f"{param('device')} must be cpu, cuda, cuda:N or auto, got {device!r}")
    if device_map not in (None, "auto"):
        raise InputError(f"{param('device_map')} must be auto (accelerate's placement), got {device_map!r}")
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"{param('dtype')} must be one of {', '.join(DTYPES)}, got {dtype!r}")


def resolve_device(device: str, device_map: str | None, dtype: str | None) -> dict[str, str]:
    """``device`` "auto" -> "cuda" when available else "cpu"; ``dtype`` None -> "bfloat16" when the
    model will run on CUDA (a CUDA device, or a device map with a GPU present), else "float32".

    Returns:
        ``{"device": ..., "dtype": ...}`` (names, not torch objects).

    Raises:
        InputError: a bad value (:func:`check_device`); CUDA asked for but not available here (one line).
    """
    check_device(device, device_map, dtype)
    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if device.startswith("cuda") and not cuda:
        raise InputError(f"{param('device', device)} but CUDA is not available here; use {param('device')} cpu or auto")
    on_gpu = device.startswith("cuda") or (device_map is not None and cuda)
    return {"device": device, "dtype": dtype or ("bfloat16" if on_gpu else "float32")}


@dataclass(frozen=True)
class ProbeSpec:
    """Which probe to draw: the inputs of ``sinklab measure`` (and of every analysis).

    Attributes:
        input: ``auto`` (a ``sinklab train`` run: ``run`` unless ``corpus`` is given; else ``natural``),
            ``run`` (the run's own held-out data in its packing, :meth:`sinklab.runs.Run.probe`) or a
            generator of :data:`sinklab.probe.INPUTS` (``natural``, ``random``, ``repeated``, ``text``).
        corpus: zoo corpus name or a .txt file / folder (natural input; default ``sotu``).
        num_samples, seq_len: N windows of T tokens (special tokens included). None: the run tracker's
            probe for a run, else the defaults the caller gives to :meth:`resolve`.
        bos: ``auto`` | ``always`` | ``never``. seed: the draw's seed (None: the run tracker's, else 0).
        token: the token id of ``repeated`` (None: random per sample). text: the text of ``text``.

    Raises:
        InputError / UnknownNameError: a bad value, at construction.
    """

    input: str = "auto"
    corpus: str | None = None
    num_samples: int | None = None
    seq_len: int | None = None
    bos: str = "auto"
    seed: int | None = None
    token: int | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        from sinklab.probe import INPUTS
        from sinklab.probe.inputs import BOS_POLICIES

        if self.num_samples is not None and self.num_samples < 1:
            raise InputError(f"{param('num_samples')} must be >= 1, got {self.num_samples}")
        if self.seq_len is not None and self.seq_len < 2:
            raise InputError(f"{param('seq_len')} must be >= 2, got {self.seq_len}")
        if self.seed is not None and self.seed < 0:
            raise InputError(f"{param('seed')} must be >= 0, got {self.seed}")
        if self.token is not None and self.token < 0:
            raise InputError(f"{param('token')} must be a token id >= 0, got {self.token}")
        if self.bos not in BOS_POLICIES:
            raise InputError(f"{param('bos')} must be one of {', '.join(BOS_POLICIES)}, got {self.bos!r}")
        if self.input not in AUTO_INPUTS:
            try:
                INPUTS.get(self.input)
            except UnknownNameError as e:
                raise UnknownNameError(f"{param('input')}: {e}; or {' / '.join(AUTO_INPUTS)}") from None

    def resolve(self, run: "Run | None", *, num_samples: int = DEFAULT_NUM_SAMPLES,
                seq_len: int = DEFAULT_SEQ_LEN) -> "ProbeSpec":
        """Every ``None`` / ``auto`` filled in. For a ``sinklab train`` run: ``input`` auto is ``run``
        (``natural`` when a corpus is given), N / T / seed the run tracker's (T of the run input:
        :meth:`~sinklab.runs.Run.probe_len`), ``bos`` auto of another input the run's packing policy.
        Otherwise: ``natural`` on ``sotu``, N = ``num_samples``, T = ``seq_len``, seed 0.

        Raises:
            InputError: ``input="run"`` without a run; natural text for a run trained on a synthetic task;
                ``input="text"`` (one sample) with ``num_samples`` other than 1.
        """
        if self.input == "text":  # one sample, the text itself: a sample count other than 1 would be recorded, not used
            if self.num_samples not in (None, 1):
                raise InputError(f"{param('input', 'text')} is one sample (the text itself): "
                                 f"{param('num_samples', self.num_samples)} cannot apply; leave it out")
            num_samples = 1
        if run is None:
            if self.input == "run":
                raise InputError(f"{param('input', 'run')} needs a model trained by `sinklab train` (its run folder or final/)")
            return replace(self, input="natural" if self.input == "auto" else self.input,
                           corpus=self.corpus or DEFAULT_CORPUS, num_samples=self.num_samples or num_samples,
                           seq_len=self.seq_len or seq_len, seed=DEFAULT_SEED if self.seed is None else self.seed)
        t = run.config.track
        inp = self.input if self.input != "auto" else ("run" if self.corpus is None else "natural")
        if run.synthetic and inp == "natural":
            raise InputError(
                f"{run.folder} was trained on the synthetic task {run.config.data.source!r}, so natural text "
                f"({param('corpus', self.corpus) if self.corpus else 'a corpus'}) means nothing to it: measure it on "
                f"its own held-out data (the default, {param('input', 'run')}) or on {param('input', 'random')} or repeated")
        return replace(
            self, input=inp, corpus=self.corpus or (DEFAULT_CORPUS if inp == "natural" else None),
            num_samples=self.num_samples or (1 if inp == "text" else t.n_probe),
            seq_len=self.seq_len or (run.probe_len(self.bos) if inp == "run" else t.probe_len),
            seed=t.seed if self.seed is None else self.seed,
            # the run's own probe applies its packing itself; other inputs follow the run's BOS policy
            bos=self.bos if self.bos != "auto" or inp == "run" else run.bos_policy,
        )


@dataclass
class Subject:
    """A model ready for every feature, and (after :meth:`with_probe`) the probe it is run on.

    Made by :meth:`load` (from a name, folder, run or model object); ``Subject(model, input_ids)`` wraps a
    model and a probe built by hand (a test, a notebook).

    Attributes:
        model: a ``transformers`` model or a :class:`sinklab.nn.SinkLM`. One loaded here is in eval mode; a model
            object keeps the caller's mode, and every feature runs it in eval mode (:func:`eval_mode`).
        input_ids: (N, T) int64 probe token ids (position 0 first); (0, 0) before :meth:`with_probe`.
        tokenizer: its tokenizer, or None (a model built in a test).
        model_info: provenance of the model (JSON-serialisable; :class:`sinklab.models.ModelInfo` fields,
            plus ``run`` and ``prefix_len`` for a training run). Also :attr:`info`.
        corpus_info: provenance of the probe's text (``name`` + source, or ``run`` + details), or None.
        is_encoder: bidirectional encoder (no LM head, no loss readout).
        seed: seed of the probe draw and of every random choice of an analysis.
        documents: the corpus' documents (for analyses that draw more windows: :meth:`windows`), or None.
        source: the name / path it was loaded from (None: a model object given in Python).
        run: the :class:`~sinklab.runs.Run` behind the model, or None.
        probe: the :class:`~sinklab.probe.Probe` of :meth:`with_probe` (kind, BOS prefix...), or None.
    """

    model: nn.Module
    input_ids: Tensor = field(default_factory=lambda: torch.zeros(0, 0, dtype=torch.int64))
    tokenizer: Any = None
    model_info: dict = field(default_factory=dict)
    corpus_info: dict | None = None
    is_encoder: bool = False
    seed: int = 0
    documents: list | None = None
    source: str | None = None
    run: Any = None
    probe: Any = None

    # ------------------------------------------------------------------ the model
    @classmethod
    def load(cls, model: "str | Run | nn.Module | Subject", *, tokenizer: Any = None, device: str | None = None,
             dtype: "str | torch.dtype | None" = None, device_map: str | None = None, accept_license: bool = False,
             attn_implementation: str | None = "sdpa") -> "Subject":
        """Load (or wrap) a model.

        Args:
            model: a zoo name, a Hugging Face folder or hub id, a sinklab-trained model folder, a
                ``sinklab train`` run folder or its ``final/``, a :class:`~sinklab.runs.Run`, an
                ``nn.Module`` already in memory (a ``transformers`` model or a SinkLM), or a Subject (returned
                as it is: it is placed already).
            tokenizer: the tokenizer of a model object (ignored when loading from disk, which reads its own).
            device: ``cpu`` | ``cuda`` | ``cuda:N`` | ``auto`` (CUDA when available). None: ``cpu`` for a model
                loaded here; a model object stays where it is unless a device is given.
            dtype: ``float32`` | ``bfloat16`` | ``float16`` | ``float64`` (or a torch dtype). None: bfloat16 on CUDA, float32
                otherwise; a model object keeps its dtype unless one is given, and one given converts the
                caller's module in place (``nn.Module.to`` returns the same object): pass a copy to keep it.
            device_map: ``auto``: spread a ``transformers`` model over the GPUs, CPU and disk (``accelerate``).
            accept_license: accept an opt-in licence (gemma3-270m).
            attn_implementation: passed to ``from_pretrained`` (analyses capture through their own seam).

        Returns:
            A :class:`Subject` without a probe (``input_ids`` (0, 0)); see :meth:`with_probe`.

        Raises:
            InputError: a bad device / dtype, CUDA asked for but not available here, a device / dtype / device
                map for a Subject, and as
                :func:`sinklab.models.load_model` (a path that does not exist, a run without ``final/``...).
            UnknownNameError / FetchError / ChecksumError / CaptureError: as :func:`sinklab.models.load_model`.
        """
        from sinklab.models import check_model_spec, load_model
        from sinklab.runs import Run

        if isinstance(model, Subject):
            placed = [n for n, v in (("device", device), ("dtype", dtype), ("device_map", device_map)) if v is not None]
            if placed:
                raise InputError(f"{' / '.join(param(n) for n in placed)} cannot move a Subject: it is already placed "
                                 "(Subject.load places a model)")
            return model
        if isinstance(model, nn.Module):
            return cls._wrap(model, tokenizer, device, dtype, device_map)
        torch_dtype = dtype if isinstance(dtype, torch.dtype) else None
        res = resolve_device(device or "cpu", device_map, None if torch_dtype is not None else dtype)
        torch_dtype = torch_dtype or DTYPES[res["dtype"]]
        run = model if isinstance(model, Run) else Run.find(str(model))
        source = str(run.folder) if isinstance(model, Run) else str(model)
        if run is None:
            check_model_spec(source)  # a bad name fails before anything is fetched
        loaded = load_model(str(run.final) if run is not None else source, dtype=torch_dtype,
                            attn_implementation=attn_implementation, accept_license=accept_license,
                            device=res["device"], device_map=device_map)
        info = {**asdict(loaded.info), "device": "device_map=" + device_map if device_map else res["device"],
                "dtype": str(torch_dtype).removeprefix("torch.")}
        if run is not None:
            info["run"] = str(run.folder)
            info["prefix_len"] = run.config.train.prefix_len
        return cls(loaded.model, tokenizer=loaded.tokenizer, model_info=info, is_encoder=bool(loaded.info.is_encoder),
                   source=source, run=run)

    @classmethod
    def _wrap(cls, model: nn.Module, tokenizer, device, dtype, device_map) -> "Subject":
        if device_map is not None:
            raise InputError(f"{param('device_map')} places a model while it loads; a model object is already placed "
                             "(move it with .to(device))")
        if device is not None:
            model.to(resolve_device(device, None, "float32")["device"])
        if dtype is not None:
            check_device("cpu", None, None if isinstance(dtype, torch.dtype) else dtype)
            cast_model(model, dtype if isinstance(dtype, torch.dtype) else DTYPES[dtype])  # RoPE stays float32
        first = next((p for p in model.parameters() if p.is_floating_point()), None)
        config = getattr(model, "config", None)
        # a transformers encoder (BERT, MiniLM...) as its folder would load it: bidirectional, no next-token readout
        encoder = bool(getattr(config, "model_type", None)) and is_encoder_config(config)
        info = {"name": type(model).__name__, "source": "python object", "is_encoder": encoder,
                "max_context": _max_context(model), "architecture": type(model).__name__,
                "dtype": None if first is None else str(first.dtype).removeprefix("torch.")}
        return cls(model, tokenizer=tokenizer, model_info=info, is_encoder=encoder)

    @property
    def info(self) -> dict:
        """The model's provenance (:attr:`model_info`)."""
        return self.model_info

    @property
    def adapter(self) -> "ModelAdapter":
        """The model's :class:`~sinklab.capture.adapter.ModelAdapter` (layers, heads, capture, step)."""
        from sinklab.capture.adapter import adapt

        return adapt(self.model)

    @property
    def device(self) -> torch.device:
        """Where the model's inputs go: the device the input embedding runs on (:func:`sinklab.models.input_device`;
        with a device map, its hook's execution device, also when its weights are offloaded)."""
        from sinklab.models import input_device

        return input_device(self.model)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's floating-point parameters (the first one's)."""
        return next(p.dtype for p in self.model.parameters() if p.is_floating_point())

    @property
    def num_layers(self) -> int:
        return self.adapter.n_layers

    # ------------------------------------------------------------------ the probe
    def with_probe(self, spec: ProbeSpec, *, num_samples: int = DEFAULT_NUM_SAMPLES,
                   seq_len: int = DEFAULT_SEQ_LEN, allow_long_context: bool | None = None) -> "Subject":
        """A copy of this subject with the probe of ``spec`` (resolved by :meth:`ProbeSpec.resolve` with
        these defaults): ``input_ids`` (N, T) on the CPU, ``probe``, ``corpus_info``, ``documents``, ``seed``.

        Raises:
            InputError: T past the model's context (unless ``allow_long_context`` is True; False: the message
                says that ``--allow-long-context`` exists, None: not), a tokenizer that cannot
                encode the text, ids past the model's embeddings, no tokenizer, too few windows; as
                :meth:`ProbeSpec.resolve` and the generators of :mod:`sinklab.probe`.
            UnknownNameError / FetchError: an unknown or unfetchable corpus.
        """
        from sinklab.probe import make_probe
        from sinklab.probe.cache import tokenize_documents
        from sinklab.zoo.corpora import load_corpus

        spec = spec.resolve(self.run, num_samples=num_samples, seq_len=seq_len)
        corpus = load_corpus(spec.corpus) if spec.input == "natural" else None
        self._check_len(spec.seq_len, allow_long_context)
        if self.tokenizer is None:
            raise InputError(f"a {spec.input} probe needs the model's tokenizer: pass tokenizer= with a model object "
                             "(sinklab.measure, Subject.load)")
        try:
            if spec.input == "run":
                probe = self.run.probe(spec.num_samples, spec.seq_len, spec.seed, spec.bos, self.tokenizer)
            else:
                extra = {}
                if corpus is not None:
                    extra = dict(documents=corpus.documents,
                                 token_docs=tokenize_documents(self.tokenizer, corpus.documents))
                probe = make_probe(spec.input, self.tokenizer, num_samples=spec.num_samples, seq_len=spec.seq_len,
                                   bos=spec.bos, seed=spec.seed, token=spec.token, text=spec.text, **extra)
        except Exception as e:
            if type(e) is Exception:  # what the `tokenizers` library raises, e.g. a word missing from a vocabulary
                what = (f"this model's tokenizer (trained on {self.run.data_name}) cannot encode the input"
                        if self.run is not None else "the model's tokenizer cannot encode the input")
                raise InputError(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
            raise
        vocab = self.adapter.embeddings.num_embeddings
        if int(probe.input_ids.max()) >= vocab:
            raise InputError(f"the tokenizer produced id {int(probe.input_ids.max())} past the model's {vocab} embeddings")
        if corpus is not None:
            corpus_info, documents = {"name": corpus.name, **corpus.source}, corpus.documents
        elif probe.kind == "run":
            corpus_info, documents = {"name": "run", **probe.details}, None
        else:
            corpus_info, documents = None, None
        return replace(self, input_ids=probe.input_ids, probe=probe, corpus_info=corpus_info, documents=documents,
                       seed=spec.seed)

    def _check_len(self, seq_len: int, allow_long_context: bool | None) -> None:
        limit = self.model_info.get("max_context")
        if limit is not None and seq_len > limit and allow_long_context:
            from sinklab.capture.adapter import adapt

            try:
                adapter = adapt(self.model)
                n_pos = adapter.position_table().num_embeddings - adapter.position_offset()
            except (InputError, NotImplementedError, AttributeError):
                n_pos = None
            if n_pos is not None and seq_len > n_pos:  # no position past the table exists
                raise InputError(f"{param('seq_len', seq_len)} is past {self.model_info.get('name')}'s learned position "
                                 f"table of {n_pos} positions: no model input exists past it, long "
                                 "context allowed or not")
        if limit is not None and seq_len > limit and not allow_long_context:
            raise InputError(f"{param('seq_len', seq_len)} is past {self.model_info.get('name')}'s context of {limit} tokens"
                             + (f"; pass {param('allow_long_context', True)} to try anyway (only meaningful for RoPE models)"
                                if allow_long_context is not None else ""))

    def windows(self, num_samples: int, seq_len: int, *, bos: str = "auto") -> Tensor:
        """(num_samples, seq_len) more windows of the subject's corpus (:func:`sinklab.probe.make_probe`,
        natural, seeded with :attr:`seed`), for analyses that need longer or more sequences than the probe.

        Raises:
            InputError: the subject has no tokenizer or corpus, T past the model's context, too few windows.
        """
        from sinklab.probe import make_probe
        from sinklab.probe.cache import tokenize_documents

        if self.tokenizer is None or self.documents is None:
            raise InputError("this analysis needs natural text: give a model name or folder and a corpus")
        self._check_len(seq_len, None)
        probe = make_probe("natural", self.tokenizer, documents=self.documents, num_samples=num_samples,
                           seq_len=seq_len, bos=bos, seed=self.seed,
                           token_docs=tokenize_documents(self.tokenizer, self.documents))
        return probe.input_ids



def _max_context(model: nn.Module) -> int | None:
    """The longest sequence a model object's positions allow, read off its config as :func:`sinklab.models.load_model`
    reads a folder's (a SinkLM's ``max_seq_len``; a transformers model's ``max_position_embeddings``, ...), so a model
    passed in memory is held to the same context as the same model loaded from its folder; None when unknown."""
    from sinklab.models.load import max_context_of

    config = getattr(model, "config", None)
    if config is None:
        return None
    if isinstance(getattr(config, "max_seq_len", None), int):  # sinklab's SinkLM
        return int(config.max_seq_len)
    try:
        return max_context_of(config)
    except Exception:  # a config that is not a transformers one
        return None

__all__ = ["Subject", "ProbeSpec", "eval_mode", "DTYPES", "AUTO_INPUTS", "check_device", "resolve_device", "DEFAULT_CORPUS",
           "DEFAULT_NUM_SAMPLES", "DEFAULT_SEQ_LEN", "DEFAULT_SEED"]
