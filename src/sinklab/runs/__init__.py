"""Training runs: the resolved config of a run and :class:`Run`, which rebuilds everything a run
folder stands for (config, data pipeline, packing, the tracker's probe, model and tokenizer).

* :mod:`sinklab.runs.config` -- TOML <-> dataclasses (model, data, optim, train, track), presets.
* :mod:`sinklab.runs.run` -- :class:`Run` (``Run.open(folder)``), :func:`prepare_data`, :func:`packing_context`.
"""

from sinklab.runs.config import RunConfig, load_config, to_toml
from sinklab.runs.run import Run, packing_context, prepare_data

__all__ = ["Run", "RunConfig", "load_config", "packing_context", "prepare_data", "to_toml"]
