"""``sinklab.result.versions``: what every result and training records of the packages that set the numbers,
read without importing transformers (a CPU-second in every ``sinklab train`` process and distributed rank)."""

import sys

import transformers

from sinklab.result import package_version, versions


def test_transformers_version_is_read_without_importing_it(monkeypatch):
    want = transformers.__version__  # the reference: the imported module's own version
    monkeypatch.delitem(sys.modules, "transformers")
    assert package_version("transformers") == want
    assert "transformers" not in sys.modules
    v = versions()
    assert v["transformers"] == want and "transformers" not in sys.modules
    assert set(v) == {"sinklab", "torch", "transformers", "python"}


def test_an_imported_module_gives_its_own_version_and_a_missing_package_says_so(monkeypatch):
    fake = type(sys)("transformers")
    fake.__version__ = "9.9.9.dev0"  # e.g. a source checkout on the path, ahead of the installed metadata
    monkeypatch.setitem(sys.modules, "transformers", fake)
    assert package_version("transformers") == "9.9.9.dev0"
    assert package_version("no-such-distribution-sinklab") == "not installed"
