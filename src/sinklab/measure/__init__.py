"""``sinklab measure``: probe a model, compute the sink metrics, save and plot them."""

from sinklab.measure.run import MeasureConfig, MeasureResult, measure

__all__ = ["MeasureConfig", "MeasureResult", "measure"]
