"""Set-up on a fresh machine (issue 12, item 5): the PyTorch build comes from an explicit index
(Makefile TORCH_INDEX, CPU build by default) with a stated fallback, and the package metadata
builds without deprecation warnings."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_pyproject_license_is_an_spdx_string_without_deprecation_warning(monkeypatch):
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(REPO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    deprecations = [str(w.message) for w in caught if "deprecat" in str(w.message).lower()]
    assert deprecations == []
    assert dist.metadata.license_expression == "Apache-2.0"


def _fake_pip(tmp_path: Path) -> tuple[Path, Path]:
    """A bin/ folder whose `pip` only records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pip.log"
    pip = bin_dir / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\n')
    pip.chmod(0o755)
    return bin_dir, log


def _make_torch(bin_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "--no-print-directory", "torch", f"BIN={bin_dir}", f"PY={sys.executable}", *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})


@needs_make
def test_default_torch_index_is_the_cpu_build():
    r = subprocess.run(["make", "-n", "--no-print-directory", "torch"], cwd=REPO, capture_output=True, text=True,
                       timeout=30, env={**os.environ, "MAKEFLAGS": ""})
    assert r.returncode == 0, r.stderr
    assert "https://download.pytorch.org/whl/cpu" in r.stdout and "--index-url" in r.stdout


@pytest.mark.integration
@needs_make
def test_torch_comes_from_the_index_when_it_answers(tmp_path):
    (tmp_path / "index" / "torch").mkdir(parents=True)
    (tmp_path / "index" / "torch" / "index.html").write_text("<html></html>")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(tmp_path / "index"), **kw)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        bin_dir, log = _fake_pip(tmp_path)
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        r = _make_torch(bin_dir, f"TORCH_INDEX={url}")
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stderr
    assert log.read_text().split() == ["install", "-q", "torch==2.13.0", "--index-url", url]


@pytest.mark.integration
@needs_make
def test_unreachable_index_falls_back_to_pips_configuration_and_says_so(tmp_path):
    bin_dir, log = _fake_pip(tmp_path)
    r = _make_torch(bin_dir, "TORCH_INDEX=http://127.0.0.1:9/simple", "TORCH_VERSION=2.13.0")
    assert r.returncode == 0, r.stderr
    assert "does not answer" in r.stdout and "CUDA" in r.stdout
    assert log.read_text().split() == ["install", "-q", "torch==2.13.0"]
