"""The compiled tile path (``model.attention_backend = "compiled"``).

For the operations FlexAttention cannot express (sigmoid and ReLU with or without normalisation,
the linear-attention kernels elu1* / linear*, softpick, softmax_pnorm: every operation with
``has_tile_grad``, :mod:`sinklab.nn.backend`), the query-chunked tile loop of
:class:`sinklab.nn.attention._TileAttention` runs with its two per-tile functions under
``torch.compile`` (inductor, ``fullgraph=True``): :func:`sinklab.nn.attention.tile_forward` (scores,
``op.tile_weights``, ``W V``) and :func:`sinklab.nn.attention.tile_backward` (scores and weights
recomputed, ``op.tile_grad``, the three GEMMs of dq, dk, dv). The analytic backward is itself a
compiled function (run under ``no_grad``), so the same code compiles on CPU and on CUDA; the loop
over tiles stays in Python (:func:`sinklab.attention_masks.reduce_tiles` with the tile path's output and
gradient reducers, the same as the eager tile path's) and the result equals the eager tile path up to
float32 rounding (fused element-wise kernels may reorder sums).

Compilation: once per operation class and option values, and per tile shape (after the first shape
change dynamo marks the sizes dynamic); tens of seconds per graph on a busy 2-core CPU. Up to
:data:`RECOMPILE_LIMIT` versions of each function are kept (dynamo's default of 8 would fall back
to eager silently once several operations have been compiled in one process).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["compiled_tile_functions", "RECOMPILE_LIMIT"]

#: compiled versions of each tile function kept before dynamo falls back to eager
RECOMPILE_LIMIT = 64

_FUNCS: dict[tuple[int, int], tuple[Callable, Callable]] = {}


def compiled_tile_functions(tile_forward: Callable, tile_backward: Callable) -> tuple[Callable, Callable]:
    """``(forward, backward)``: ``tile_forward`` and ``tile_backward`` (those of
    :mod:`sinklab.nn.attention`, passed in so that this module does not import it) under
    ``torch.compile(fullgraph=True)``, same arguments and results; built once. A graph break is an
    error (not a silent eager fallback)."""
    key = (id(tile_forward), id(tile_backward))
    if key not in _FUNCS:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _FUNCS[key] = (torch.compile(tile_forward, fullgraph=True), torch.compile(tile_backward, fullgraph=True))
    return _FUNCS[key]
