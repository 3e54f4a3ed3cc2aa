"""Every package exports its public names from its ``__init__`` (issue 20, item 7)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "sinklab"
PACKAGES = sorted(p.parent.name for p in SRC.glob("*/__init__.py"))


@pytest.mark.parametrize("name", PACKAGES)
def test_package_exports_its_public_names(name):
    pkg = importlib.import_module(f"sinklab.{name}")
    assert getattr(pkg, "__all__", None), f"sinklab.{name} has no __all__"
    missing = [n for n in pkg.__all__ if not hasattr(pkg, n)]  # lazy exports import their module here
    assert missing == [], (name, missing)


def test_lazy_exports_leave_submodules_importable():
    from sinklab.train import distributed, loop

    assert loop.train is importlib.import_module("sinklab.train").train
    assert distributed.__name__ == "sinklab.train.distributed"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        importlib.import_module("sinklab.zoo").nope
