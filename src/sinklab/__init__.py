"""sinklab: measure attention sinks in language models and pre-train small models
to see when they emerge.

Top-level entry points:

* :func:`sinklab.measure.measure` -- probe a model and compute sink metrics.
* :mod:`sinklab.metrics` -- pure metric functions (attention mass, sink rate, norm ratio).
* :mod:`sinklab.zoo` -- real models and corpora that install from package registries.
"""

__version__ = "0.1.0"
