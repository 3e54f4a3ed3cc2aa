"""One owner for what every feature needs: :class:`Subject` (a model with its tokenizer, adapter, device,
dtype and provenance; :meth:`Subject.load` takes a zoo name, a Hugging Face folder or hub id, a ``sinklab
train`` run, or a model object) and :class:`ProbeSpec` (the probe: corpus windows, random, repeated, text,
or a run's own held-out data). ``measure``, ``analyze``, ``stream`` and the diffusion analyses use it.

:func:`load_model` (:mod:`sinklab.models`) is importable from here too.
"""

from sinklab.models import LoadedModel, ModelInfo, load_model
from sinklab.subject.core import (AUTO_INPUTS, DTYPES, ProbeSpec, Subject, check_device, eval_mode,
                                  resolve_device)

__all__ = ["Subject", "ProbeSpec", "DTYPES", "AUTO_INPUTS", "check_device", "resolve_device", "eval_mode", "load_model",
           "LoadedModel", "ModelInfo"]
