"""Capture of attention and hidden-state statistics from a model's forward pass.

* :mod:`~sinklab.capture.stats` -- :class:`ProbeStats`, the raw statistics of a probe set.
* :mod:`~sinklab.capture.collectors` -- registry of attention collectors: functions that
  compute a layer's attention output *and* the column sums of its attention matrix
  (``eager`` materialises one layer's T x T matrix at a time; :mod:`~sinklab.capture.blockwise`
  never does, and is the default, ``"auto"``).
* :mod:`~sinklab.capture.recorder` -- per-batch accumulation of layer statistics.
* :mod:`~sinklab.capture.hf` -- the seam into ``transformers`` models (AttentionInterface).
* :mod:`~sinklab.capture.native` -- the seam into sinklab's own :class:`~sinklab.nn.SinkLM`.
* :mod:`~sinklab.capture.sites` -- :class:`~sinklab.capture.sites.Hook` and the named hook sites: the one
  mechanism through which both seams read and edit a forward pass (public as :mod:`sinklab.hooks`).
* :mod:`~sinklab.capture.adapter` -- :class:`ModelAdapter` and :func:`adapt`: one interface to both
  kinds of model (structure, mask, forward with capture and edits, cache decoding).
* :func:`collect` -- run a probe set through any supported model.
"""

from sinklab.capture.adapter import HFAdapter, ModelAdapter, SinkLMAdapter, adapt
from sinklab.capture.collect import collect
from sinklab.capture.collectors import COLLECTORS
from sinklab.capture import blockwise as _blockwise  # noqa: F401 - registers the "blockwise" collector
from sinklab.capture.stats import ProbeStats

__all__ = ["collect", "COLLECTORS", "ProbeStats", "ModelAdapter", "HFAdapter", "SinkLMAdapter", "adapt"]
