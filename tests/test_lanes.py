"""The test suite's lanes (issue 38 part 5): markers registered, a per-test timeout, `make check` = the
unit lane, `make test` = everything over the cores with the slowest printed; shared code in helpers.py."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LANES = ["integration", "compile", "network", "slow", "cuda"]


def test_markers_timeout_and_strictness_are_configured():
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert [m.split(":")[0] for m in ini["markers"]] == LANES
    assert "--strict-markers" in ini["addopts"].split() and int(ini["timeout"]) == 300


def test_make_check_runs_the_unit_lane_and_make_test_everything():
    make = (REPO / "Makefile").read_text()
    check = re.search(r"^check: setup\n\t(.+)$", make, re.M).group(1)
    test = re.search(r"^test: setup\n\t(.+)$", make, re.M).group(1)
    assert re.search(r"^setup: \$\(BIN\)/sinklab\n\t@\$\(BIN\)/python -m sinklab.nn.native$", make, re.M)  # kernels
    assert f'-m "{" and ".join(f"not {m}" for m in LANES)}"' in check
    assert "-m \"" not in test and "-n $(TEST_WORKERS)" in test and "--durations=25" in test
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_tests_import_shared_code_from_helpers_not_conftest():
    offenders = [p.name for p in (REPO / "tests").glob("*.py") if re.search(r"^\s*(from|import) conftest\b",
                                                                        p.read_text(), re.M)]
    assert offenders == []


def test_compiled_kernels_are_keyed_by_the_torch_build_not_the_checkouts_venv():
    """conftest points inductor's compile command at a link named by torch's version and build, so a new clone's
    venv path does not change the kernels' cache keys (helpers.share_compiled_kernels_between_checkouts)."""
    import torch
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    torch_dir = Path(torch.__file__).resolve().parent
    command = CppBuilder(name="o", sources="i", BuildOption=CppTorchDeviceOptions(device_type="cpu")).get_command_line()
    includes = [a[2:] for a in command.split() if a.startswith("-I") and "torch" in a]
    assert includes, command
    for inc in includes:
        assert f"sinklab-torch-{torch.__version__}".replace("+", "_") in inc and str(REPO) not in inc
        # the link may point at another checkout's venv (a checkout beside this one re-points it when its tests
        # start): what counts is that it holds this same torch build
        parts = Path(inc).parts
        link = Path(*parts[: next(i for i, p in enumerate(parts) if p.startswith("sinklab-torch-")) + 1])
        assert (link.resolve() / "version.py").read_text() == (torch_dir / "version.py").read_text(), link.resolve()
