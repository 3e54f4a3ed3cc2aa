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
    assert f'-m "{" and ".join(f"not {m}" for m in LANES)}"' in check
    assert "-m \"" not in test and "-n $(TEST_WORKERS)" in test and "--durations=25" in test
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_tests_import_shared_code_from_helpers_not_conftest():
    offenders = [p.name for p in (REPO / "tests").glob("*.py") if re.search(r"^\s*(from|import) conftest\b",
                                                                        p.read_text(), re.M)]
    assert offenders == []
