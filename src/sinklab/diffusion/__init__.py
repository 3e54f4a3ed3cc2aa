"""Masked diffusion language models (MDLM / LLaDA).

* :mod:`sinklab.diffusion.masking` -- the noising process and the 1/t-weighted loss targets.
* :mod:`sinklab.diffusion.sampler` -- LLaDA's sampler with lowest-confidence remasking.

The names in ``__all__`` are importable from the package itself (``from sinklab.diffusion import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (imported on first use, so importing the package stays cheap)
_EXPORTS = {
    "MASK_TOKEN": "sinklab.diffusion.masking",
    "mask_ratio_and_mask": "sinklab.diffusion.masking",
    "corrupt": "sinklab.diffusion.masking",
    "diffusion_targets": "sinklab.diffusion.masking",
    "DenoiseTrace": "sinklab.diffusion.sampler",
    "unmask_schedule": "sinklab.diffusion.sampler",
    "sample": "sinklab.diffusion.sampler",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
