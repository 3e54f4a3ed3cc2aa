"""Loading a model: a zoo name, a local Hugging Face folder, a sinklab-trained model or ``sinklab train``
run folder, or a hub id -> :class:`LoadedModel` (model, tokenizer, :class:`ModelInfo`); and the run-folder
layout (:func:`is_run_folder`, :func:`run_final_folder`).

The zoo (:mod:`sinklab.zoo.models`) only fetches and caches registry packages; this module loads what is on
disk (or on a hub). A model together with its probe, adapter, device and dtype is a
:class:`sinklab.subject.Subject`.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sinklab.errors import CaptureError, FetchError, InputError, SinklabError, UnknownNameError, param
from sinklab.fileio import check_model_files, read_json, reading
from sinklab.paths import cache_dir
from sinklab.zoo import fetch
from sinklab.zoo import models as zoo  # looked up at call time: tests swap the zoo's registry

if TYPE_CHECKING:  # heavy imports stay lazy
    import torch
    import transformers

#: the file that marks a folder as a sinklab-trained model (``SinkLM.save_pretrained``)
NATIVE_MARKER = "sinklab_model.json"




@dataclass
class ModelInfo:
    """Where a loaded model came from; JSON-serialisable with ``dataclasses.asdict``.

    Attributes:
        name: zoo name, or the path / hub id given.
        source: ``pypi:pkg==ver:file`` for zoo models, ``path:/abs`` or ``hub:org/id``.
        sha256: hex sha256 of the original artifact (GGUF or safetensors) when known.
        license: licence name when known.
        path: the local folder actually loaded (for a hub id: the id).
        is_encoder: True for a bidirectional (BERT-like) encoder, False for a causal LM.
        max_context: ``max_position_embeddings`` (or ``n_positions``...) from the config, or None.
        architecture: ``config.model_type``.
    """

    name: str
    source: str
    sha256: str | None
    license: str | None
    path: str
    is_encoder: bool
    max_context: int | None
    architecture: str

    def to_dict(self) -> dict:
        return asdict(self)


#: buffer names kept in float32 by :func:`cast_model`: RoPE's frequencies (transformers' rotary embeddings and
#: sinklab's :class:`~sinklab.nn.positional.RoPE`), which ``from_pretrained(dtype=...)`` leaves in float32
ROPE_BUFFERS = ("inv_freq", "original_inv_freq")


def cast_model(model, dtype):
    """``model.to(dtype)`` in place, except its RoPE frequencies (buffers named :data:`ROPE_BUFFERS`), which stay
    float32 as ``from_pretrained(dtype=...)`` leaves them: cast to bfloat16 they are off by up to 3.7e-3 relative,
    a rotation phase error that grows with the position (1.2 rad at distance 1000). Returns ``model``."""
    import torch

    keep = [(mod, name, buf.detach().clone()) for mod in model.modules() for name, buf in mod._buffers.items()
            if name in ROPE_BUFFERS and buf is not None and buf.dtype == torch.float32]
    model.to(dtype)
    for mod, name, buf in keep:
        mod._buffers[name] = buf.to(mod._buffers[name].device)
    return model


@dataclass
class LoadedModel:
    """A model ready for probing: eval mode, on CPU, in the requested dtype."""

    model: "transformers.PreTrainedModel"
    tokenizer: "transformers.PreTrainedTokenizerBase"
    info: ModelInfo

    def __repr__(self) -> str:  # the module's own repr lists every layer: one line instead
        p = next(self.model.parameters(), None)
        n = sum(x.numel() for x in self.model.parameters())
        return (f"LoadedModel({self.info.name!r}: {type(self.model).__name__}, {n / 1e6:.1f}M parameters, "
                f"{'no parameters' if p is None else str(p.dtype).removeprefix('torch.') + ' on ' + str(p.device)}, "
                f"source {self.info.source})")


#: model_type values of bidirectional encoders (loaded with AutoModel unless config.is_decoder).
ENCODER_TYPES = frozenset({
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "camembert", "deberta",
    "deberta-v2", "mpnet", "modernbert", "nomic_bert", "xlm", "flaubert", "ernie", "megatron-bert",
    "rembert", "roformer", "funnel", "layoutlm", "squeezebert", "mobilebert", "convbert", "canine",
})


def is_encoder_config(config) -> bool:
    """True when ``config`` describes a bidirectional encoder (every query sees every key).

    BERT-like model types count as encoders unless ``config.is_decoder`` is set;
    a model type with no causal-LM class in transformers counts as an encoder too.
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    mt = getattr(config, "model_type", "")
    if mt in ENCODER_TYPES:
        return not bool(getattr(config, "is_decoder", False))
    return mt not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def input_device(model: "torch.nn.Module") -> "torch.device":
    """Where a model's input ids go: the device its input embedding runs on.

    That is the embedding weight's device, except under an ``accelerate`` device map (``device_map``) whose
    offloaded modules keep their weights on the ``meta`` device between calls: there it is the device the
    embedding's hook executes on (accelerate's ``execution_device``), where the weights are brought for the
    call. A model without ``get_input_embeddings`` gives its first parameter's device.

    Raises:
        InputError: the model has no parameters."""
    import torch

    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if emb is not None:
        hook = getattr(emb, "_hf_hook", None)
        run_on = getattr(hook, "execution_device", None)
        if run_on is not None:
            return torch.device(run_on if not isinstance(run_on, int) else f"cuda:{run_on}")
        weight = getattr(emb, "weight", None)
        if isinstance(weight, torch.Tensor):
            return weight.device
    first = next(iter(model.parameters()), None)
    if first is None:
        raise InputError(f"{type(model).__name__} has no parameters: no device to send its inputs to")
    return first.device


def max_context_of(config) -> int | None:
    """Longest sequence the model's positions allow, from its config (None when unbounded/unknown)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "n_ctx", "seq_length"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _weights_sha256(folder: Path) -> str | None:
    """sha256 of the folder's single weights file (safetensors or bin), None if several or none."""
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    return fetch.sha256_file(files[0]) if len(files) == 1 else None


def _model_class(auto_cls, config):
    """The class ``auto_cls.from_pretrained`` would build for ``config``, or None when unknown."""
    try:
        return auto_cls._model_mapping[type(config)]
    except (KeyError, AttributeError):
        return None


def _from_pretrained(where: str | Path, *, dtype, attn_implementation, what: str, local_files_only: bool = False,
                     device: str = "cpu", device_map: str | dict | None = None):
    """Load config, model (AutoModelForCausalLM or AutoModel) and tokenizer from a folder or hub id;
    on ``device``, or spread over devices by ``accelerate`` with ``device_map``.

    A local folder's files are checked first (:func:`sinklab.fileio.check_model_files`), and an error
    transformers raises while reading them becomes a CorruptFileError naming the folder."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    folder = Path(where).is_dir()
    if folder:
        check_model_files(where)
    local = {"local_files_only": True} if local_files_only else {}
    with reading(where, "model folder") if folder else contextlib.nullcontext():
        config = AutoConfig.from_pretrained(where, **local)
    encoder = is_encoder_config(config)
    cls = AutoModel if encoder else AutoModelForCausalLM
    kwargs = {"dtype": dtype, **local}
    if device_map is not None:  # accelerate places each module (and offloads to disk what fits nowhere)
        kwargs.update(device_map=device_map, offload_folder=str(cache_dir("offload")))
    if attn_implementation == "sdpa" and not getattr(_model_class(cls, config), "_supports_sdpa", True):
        attn_implementation = "eager"  # gpt-oss (sink logits SDPA cannot take): capture swaps it out anyway
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar per load (it lands in logs); downloads keep theirs
    try:
        with reading(where, "model folder") if folder else contextlib.nullcontext():
            model = cls.from_pretrained(where, config=config, **kwargs)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, **local)
    except Exception as e:  # noqa: BLE001 - OSError, ValueError, the tokenizers library's bare Exception...
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"{what} has no usable tokenizer ({why}); save one with tokenizer.save_pretrained") from None
    model.eval()
    if device_map is None:
        model.to(device)
    return model, tokenizer, config, encoder


def _load_native(path: Path, *, dtype, attn_implementation) -> LoadedModel:
    """Hook for sinklab-trained native models (a folder holding ``sinklab_model.json``).

    Contract for the training side: ``sinklab.nn`` provides
    ``load_native(path, dtype=..., attn_implementation=...) -> LoadedModel``.
    Until it exists this raises CaptureError.

    Raises:
        CaptureError: ``sinklab.nn`` (or its ``load_native``) is not available.
    """
    try:
        import sinklab.nn as nn
    except ImportError as e:
        raise CaptureError(
            f"{path} is a sinklab-trained model ({NATIVE_MARKER}) but sinklab.nn is not available to load it"
        ) from e
    loader = getattr(nn, "load_native", None)
    if loader is not None:
        return loader(path, dtype=dtype, attn_implementation=attn_implementation)
    # SinkLM.save_pretrained + the HF tokenizer saved by `sinklab train` (DIR/final)
    import torch
    from transformers import PreTrainedTokenizerFast

    if not (path / "tokenizer.json").exists():
        raise InputError(f"{path} holds a sinklab model but no tokenizer.json; save one with tokenizer.save_pretrained")
    check_model_files(path)
    model = cast_model(nn.SinkLM.from_pretrained(path), dtype or torch.float32)
    model.eval()
    with reading(path / "tokenizer.json", "tokenizer"):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    info = ModelInfo(name=str(path), source=f"path:{path.resolve()}", sha256=_weights_sha256(path), license=None,
                     path=str(path), is_encoder=False, max_context=model.config.max_seq_len,
                     architecture=f"sinklab:{model.config.attention}")
    return LoadedModel(model, tokenizer, info)


RUN_FILES = ("checkpoint.pt", "metrics.jsonl", "summary.json")


def is_run_folder(path: Path) -> bool:
    """True when ``path`` is a ``sinklab train`` run folder (config.toml plus a checkpoint, metrics or final/)."""
    return (path / "config.toml").is_file() and (
        any((path / f).exists() for f in RUN_FILES) or (path / "final" / NATIVE_MARKER).exists())


def run_final_folder(path: Path) -> Path:
    """The model folder of the run folder ``path``: ``path/final``.

    Raises:
        InputError: the run has no ``final/`` yet (says where it is expected and how to finish the run).
    """
    final = path / "final"
    if not (final / NATIVE_MARKER).exists():
        raise InputError(
            f"{path} is a sinklab training run without a final model: expected it in {final}/, which "
            f"`sinklab train` writes when the run finishes (finish it with: "
            f"`sinklab train {path / 'config.toml'} --out {path} --resume`)"
        )
    return final


def _looks_like_path(s: str) -> bool:
    return s.startswith(("/", "./", "../", "~")) or s.count("/") > 1 or "\\" in s or s.endswith("/")


def check_model_spec(name_or_path: str) -> None:
    """Fail fast, before anything is downloaded or loaded, on a ``--model`` value that cannot load.

    Raises:
        UnknownNameError: not a zoo name, not a path, not a hub id ``org/name`` (lists the zoo names).
        InputError: a path that does not exist, a file, a folder that is neither a Hugging Face
            model folder nor a sinklab model or training run, a run without ``final/``.
    """
    if name_or_path in zoo.MODELS:
        return
    path = Path(name_or_path).expanduser()
    if path.exists():
        path = path.resolve()
        if not path.is_dir():
            raise InputError(f"model path {str(path)!r} is a file; give the folder that holds config.json")
        if (path / NATIVE_MARKER).exists():
            return
        if is_run_folder(path):
            run_final_folder(path)
            return
        if not (path / "config.json").exists():
            raise InputError(f"model folder {str(path)!r} has no config.json: neither a Hugging Face model folder "
                             "nor a sinklab training run (a run folder holds config.toml and final/)")
        return
    if _looks_like_path(name_or_path):
        raise InputError(f"model path {name_or_path!r} does not exist")
    if "/" not in name_or_path:
        try:
            zoo.MODELS.get(name_or_path)
        except UnknownNameError as e:
            raise UnknownNameError(f"{e.marked}; {name_or_path!r} is not a local path either") from None


#: seconds to wait for the model hub before giving up on a hub id
HUB_TIMEOUT_S = 5.0


def _hub_unreachable(repo_id: str) -> str | None:
    """Why the hub cannot serve ``repo_id`` (one line), or None when it can or when that is unclear.

    One metadata request with a short timeout and no retries: a machine without a hub learns it in
    well under a second instead of after ``huggingface_hub``'s retries (about 25 s).
    """
    try:
        import huggingface_hub
        from huggingface_hub import constants
        from huggingface_hub.errors import OfflineModeIsEnabled, RepositoryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    if constants.HF_HUB_OFFLINE:
        return "no model hub reachable (HF_HUB_OFFLINE is set) and the model is not in the local Hugging Face cache"
    try:
        huggingface_hub.model_info(repo_id, timeout=HUB_TIMEOUT_S)
    except OfflineModeIsEnabled:
        return "no model hub reachable (HF_HUB_OFFLINE is set) and the model is not in the local Hugging Face cache"
    except RepositoryNotFoundError:
        return f"the hub at {constants.ENDPOINT} has no model {repo_id!r} (or it is private)"
    except Exception as e:  # noqa: BLE001 - connection refused, DNS failure, timeout, proxy error...
        names = {c.__name__ for c in type(e).__mro__}  # httpx / requests transport errors, by name
        if isinstance(e, OSError) or names & {"TransportError", "RequestError", "ConnectionError", "Timeout",
                                               "TimeoutException", "ProxyError"}:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            return f"no model hub reachable at {constants.ENDPOINT} ({reason})"
        return None  # e.g. a gated model: let from_pretrained say what it needs
    return None


def _load_hub(name_or_path: str, *, dtype, attn_implementation, device, device_map) -> LoadedModel:
    """A hub id such as ``org/name``: from the local Hugging Face cache first, then from the hub if it
    answers quickly (:data:`HUB_TIMEOUT_S`).

    Raises:
        FetchError: neither in the cache nor loadable from the hub (says why).
    """
    not_zoo = f"{name_or_path!r}: it is not a zoo name ({', '.join(zoo.MODELS.names())}) nor an existing local path"
    try:
        model, tok, config, enc = _from_pretrained(name_or_path, dtype=dtype, attn_implementation=attn_implementation,
                                                   what=f"hub model {name_or_path}", local_files_only=True,
                                                   device=device, device_map=device_map)
    except SinklabError:
        raise
    except Exception:  # noqa: BLE001 - not (fully) in the local cache
        why = _hub_unreachable(name_or_path)
        if why is not None:
            raise FetchError(f"could not load {not_zoo}, and as a hub id: {why}") from None
        try:
            model, tok, config, enc = _from_pretrained(name_or_path, dtype=dtype,
                                                       attn_implementation=attn_implementation,
                                                       what=f"hub model {name_or_path}", device=device,
                                                       device_map=device_map)
        except SinklabError:
            raise
        except Exception as e:  # OSError / HTTP errors from huggingface_hub
            raise FetchError(
                f"could not load {not_zoo}, and loading it as a hub id failed: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            ) from e
    info = ModelInfo(name=name_or_path, source=f"hub:{name_or_path}", sha256=None, license=None,
                     path=name_or_path, is_encoder=enc, max_context=max_context_of(config),
                     architecture=config.model_type)
    return LoadedModel(model, tok, info)


#: the dtype names :func:`load_model` takes besides torch dtypes; the one list (the CLI's ``--dtype`` values,
#: :data:`sinklab.subject.DTYPES`)
DTYPE_NAMES = ("float32", "bfloat16", "float16")


def _torch_dtype(dtype) -> "torch.dtype":
    """``dtype`` (None, a name of :data:`DTYPE_NAMES` or a floating-point torch dtype) as a torch dtype.

    Raises:
        InputError: anything else (names the parameter and the accepted values).
    """
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return getattr(torch, dtype)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise InputError(f"{param('dtype', dtype)}: give {' | '.join(DTYPE_NAMES)} or a floating-point torch dtype")


def load_model(
    name_or_path: str,
    *,
    dtype: "torch.dtype | None" = None,
    attn_implementation: str | None = "eager",
    accept_license: bool = False,
    device: str = "cpu",
    device_map: str | dict | None = None,
) -> LoadedModel:
    """Load a zoo model, a local Hugging Face folder, or a hub id, in eval mode on ``device`` (CPU by default).

    Args:
        name_or_path: a zoo name (``sinklab list models``), a local folder with
            ``config.json`` + weights + tokenizer, a sinklab-trained folder (holds
            ``sinklab_model.json``), a ``sinklab train`` run folder (its ``final/`` is loaded),
            or a hub id ``org/name`` (needs a reachable hub).
        dtype: parameter dtype: a floating-point ``torch.dtype`` or its name ``float32`` | ``bfloat16`` |
            ``float16`` (default ``torch.float32``).
        attn_implementation: passed to ``from_pretrained``; ``"eager"`` (default) makes
            the layers return attention weights. None keeps transformers' choice.
        accept_license: accept an opt-in licence (gemma3-270m).
        device: "cpu", "cuda", "cuda:N" (ignored with ``device_map``).
        device_map: ``accelerate`` placement for models that do not fit one device: "auto" (fill
            the GPUs, then CPU, then disk) or a dict module name -> device ("cpu", GPU index,
            "disk"; disk-offloaded weights go to ``$SINKLAB_HOME/offload``). transformers models only.

    Returns:
        LoadedModel(model, tokenizer, info). Decoders load with AutoModelForCausalLM,
        encoders (``ModelInfo.is_encoder``) with AutoModel.

    Raises:
        UnknownNameError: not a zoo name and not an existing path (lists the zoo names).
        InputError: a path that does not exist, or a folder without config/tokenizer.
        FetchError: a zoo package or a hub id could not be fetched (names it).
        ChecksumError: a downloaded archive has the wrong sha256.
        CaptureError: a sinklab-trained folder but sinklab.nn cannot load it.
        InputError: ``device_map`` for a sinklab-trained model (it loads on one device); a ``dtype`` that is
            neither a floating-point torch dtype nor one of the names above.
    """
    dtype = _torch_dtype(dtype)
    check_model_spec(name_or_path)
    if name_or_path in zoo.MODELS:
        recipe = zoo.MODELS.get(name_or_path)
        folder = zoo.fetch_model(name_or_path, accept_license=accept_license)
        src = read_json(folder / zoo.SOURCE_FILE, "model source record")
        model, tok, config, enc = _from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation,
                                                   what=f"zoo model {name_or_path}", device=device, device_map=device_map)
        info = ModelInfo(name=name_or_path, source=recipe.source, sha256=src.get("sha256"),
                         license=recipe.license, path=str(folder), is_encoder=enc,
                         max_context=max_context_of(config), architecture=config.model_type)
        return LoadedModel(model, tok, info)

    path = Path(name_or_path).expanduser()
    if path.exists():  # a folder, checked by check_model_spec
        path = path.resolve()
        if not (path / NATIVE_MARKER).exists() and is_run_folder(path):
            path = run_final_folder(path)
        if (path / NATIVE_MARKER).exists():
            if device_map is not None:
                raise InputError(f"{name_or_path}: a sinklab-trained model loads on one device; use {param('device')}, not {param('device_map')}")
            loaded = _load_native(path, dtype=dtype, attn_implementation=attn_implementation)
            loaded.model.to(device)
            return loaded
        model, tok, config, enc = _from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation,
                                                   what=f"model folder {str(path)!r}", device=device,
                                                   device_map=device_map)
        src_file = path / zoo.SOURCE_FILE
        src = read_json(src_file, "model source record") if src_file.exists() else {}
        info = ModelInfo(name=name_or_path, source=f"path:{path}",
                         sha256=src.get("sha256") or _weights_sha256(path), license=src.get("license"),
                         path=str(path), is_encoder=enc, max_context=max_context_of(config),
                         architecture=config.model_type)
        return LoadedModel(model, tok, info)

    return _load_hub(name_or_path, dtype=dtype, attn_implementation=attn_implementation, device=device,
                     device_map=device_map)


__all__ = [
    "ModelInfo", "LoadedModel", "load_model", "is_encoder_config", "max_context_of", "is_run_folder",
    "run_final_folder", "check_model_spec", "NATIVE_MARKER", "RUN_FILES", "ENCODER_TYPES", "HUB_TIMEOUT_S",
]
