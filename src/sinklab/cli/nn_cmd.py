"""Listers for the model's registries: ``sinklab list attention|positional|ffn``."""

from __future__ import annotations

from sinklab.cli.main import LISTERS


def _lister(registry_name: str):
    def lister() -> list[tuple[str, str]]:
        import sinklab.nn as nn_pkg

        reg = getattr(nn_pkg, registry_name)
        return [(name, reg.describe(name)) for name in reg]

    return lister


LISTERS.register("attention", _lister("ATTENTION"))
LISTERS.register("positional", _lister("POSITIONAL"))
LISTERS.register("ffn", _lister("FFN"))
LISTERS.register("norm", _lister("NORM"))
