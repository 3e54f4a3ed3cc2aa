"""Experiment sweeps: study files, running their grids, summary tables, verdicts and the report.

* :mod:`sinklab.sweep.spec` -- parse ``experiments/NAME.toml`` into points.
* :mod:`sinklab.sweep.run` -- run a study's points (one ``sinklab train`` each, J at once, resumable).
* :mod:`sinklab.sweep.summary` -- per-sweep summary table (CSV, Markdown) and Sink_1 plot.
* :mod:`sinklab.sweep.verdict` -- agrees / disagrees / inconclusive against the paper's direction.
* :mod:`sinklab.sweep.report` -- one Markdown report over every finished sweep.
* :mod:`sinklab.sweep.dynamics` -- Sink_1, first-token mass and validation loss against step.
* :mod:`sinklab.sweep.store` -- a study's runs as one table (``runs.jsonl.gz``) instead of run folders.

The names in ``__all__`` are importable from the package itself (``from sinklab.sweep import ...``).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it (imported on first use, so importing the package stays cheap)
_EXPORTS = {
    "Study": "sinklab.sweep.spec",
    "Point": "sinklab.sweep.spec",
    "load_study": "sinklab.sweep.spec",
    "parse_study": "sinklab.sweep.spec",
    "point_config": "sinklab.sweep.spec",
    "run_sweep": "sinklab.sweep.run",
    "select_points": "sinklab.sweep.run",
    "SlurmOptions": "sinklab.sweep.run",
    "summarize_sweep": "sinklab.sweep.summary",
    "markdown_table": "sinklab.sweep.summary",
    "plot_sweep": "sinklab.sweep.summary",
    "build_report": "sinklab.sweep.report",
    "stale_rows": "sinklab.sweep.report",
    "plot_dynamics": "sinklab.sweep.dynamics",
    "study_dynamics": "sinklab.sweep.dynamics",
    "tracker_records": "sinklab.sweep.dynamics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
