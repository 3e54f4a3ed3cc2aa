"""Probe inputs for sink measurement: natural text windows, random tokens, a repeated token, user text,
and the probe of a training run's held-out data.

* :mod:`sinklab.probe.inputs` -- the generators (registry :data:`INPUTS`) and BOS policies.
* :mod:`sinklab.probe.windows` -- the one window cutter (:func:`cut_windows`), the one too-few-windows
  message (:func:`too_few_windows`) and the tracker's probe set (:func:`probe_set`).
* :mod:`sinklab.probe.cache` -- the on-disk cache of documents tokenized by a model's tokenizer.
"""

from sinklab.probe.inputs import INPUTS, Probe, bos_tokens, make_probe
from sinklab.probe.windows import Windows, Wording, cut_windows, probe_set, too_few_windows

__all__ = ["INPUTS", "Probe", "Windows", "Wording", "bos_tokens", "cut_windows", "make_probe", "probe_set",
           "too_few_windows"]
