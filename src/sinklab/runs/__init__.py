"""Training runs: the resolved config of a run and :class:`Run`, which rebuilds everything a run
folder stands for (config, data pipeline, packing, the tracker's probe, model and tokenizer).

* :mod:`sinklab.runs.config` -- TOML <-> dataclasses (model, data, optim, train, track), presets.
* :mod:`sinklab.runs.run` -- :class:`Run` (``Run.open(folder)``), :func:`prepare_data`, :func:`packing_context`.
"""

from sinklab.runs.config import (DataConfig, OptimConfig, RunConfig, TrackConfig, TrainConfig, load_config, presets,
                                 to_toml)
from sinklab.runs.run import Run, packing_context, prepare_data

__all__ = ["DataConfig", "OptimConfig", "Run", "RunConfig", "TrackConfig", "TrainConfig", "load_config",
           "packing_context", "prepare_data", "presets", "to_toml"]
