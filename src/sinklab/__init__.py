"""sinklab: measure attention sinks in language models and pre-train small models
to see when they emerge.

The public API, importable from the package itself (``from sinklab import measure, SinkCache``)::

    measure      sinklab.measure.run.measure        probe a model, compute the sink metrics
    train        sinklab.train.loop.train           pre-train a SinkLM and track its sinks
    stream       sinklab.streaming.run.stream       perplexity / pass key through cache policies
    compare      sinklab.measure.compare.compare    compare measured models
    analyze      sinklab.analyze                    the analyses, one function each (analyze.keybias, ...)
    load_model   sinklab.models.load_model           a zoo name, a Hugging Face folder or a sinklab run
    SinkCache    sinklab.streaming.cache.SinkCache  StreamingLLM's cache (transformers Cache)
    Run          sinklab.runs.run.Run               a training run's folder
    Result       sinklab.result.Result              the base of every feature's result
    hooks        sinklab.hooks                      named hooks into the attention and the residual stream

Every name is imported on first use (module ``__getattr__``), so ``import sinklab`` imports neither torch
nor transformers and stays fast.

``measure`` and ``train`` are both a function (the attribute of this package) and a subpackage
(``sinklab.measure``, ``sinklab.train``, importable by their dotted path: ``from sinklab.measure import
MeasureConfig``, ``from sinklab.train import loop``). The attribute stays the function whatever was
imported before: this module's class keeps the import system from replacing it with the subpackage
(Python sets ``sinklab.measure`` to the subpackage when one of its modules is imported). So write
``from sinklab.train import loop`` rather than ``import sinklab.train.loop as loop`` (Python resolves the
latter through the attribute, the function); docs/api.md, "Top-level names".
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__version__ = "0.1.0"

#: public name -> (module, attribute in it, or None for the module itself); imported on first use
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "measure": ("sinklab.measure.run", "measure"),
    "train": ("sinklab.train.loop", "train"),
    "stream": ("sinklab.streaming.run", "stream"),
    "compare": ("sinklab.measure.compare", "compare"),
    "analyze": ("sinklab.analyze", None),
    "load_model": ("sinklab.models", "load_model"),
    "SinkCache": ("sinklab.streaming.cache", "SinkCache"),
    "Run": ("sinklab.runs.run", "Run"),
    "Result": ("sinklab.result", "Result"),
    "hooks": ("sinklab.hooks", None),
}

#: the public names that are functions while a subpackage has the same name
_SHADOWED = frozenset(n for n, (_, attr) in _EXPORTS.items() if attr is not None and n in ("measure", "train"))

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        try:
            value = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # a missing dependency inside the module: its own error
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r} ({module} is not in this "
                                 "installation)") from e
        if attr is not None:
            value = getattr(value, attr)
            # cached on the package: later lookups skip this function
            types.ModuleType.__setattr__(sys.modules[__name__], name, value)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({n for n in globals() if n.startswith("__")} | set(__all__))


class _Package(types.ModuleType):
    """The class of the ``sinklab`` module: importing ``sinklab.measure.X`` makes Python set the attribute
    ``sinklab.measure`` to the subpackage; this keeps the public name the function instead (the subpackage
    stays in ``sys.modules`` and importable by its dotted path)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}":
            return  # the name resolves (to the function) through __getattr__
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
