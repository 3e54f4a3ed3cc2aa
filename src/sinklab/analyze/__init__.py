"""Why sinks exist: analyses of a measured sink (``sinklab analyze KIND``).

Each analysis is one module with one entry point, registered by name in :data:`ANALYSES` (a
:class:`~sinklab.registry.Registry`, as the attention operations are); each returns an
:class:`~sinklab.analyze.common.AnalysisResult` (``.save(out)`` writes ``analysis.json``, CSV tables and
PNG plots). ``sinklab analyze KIND`` has one subcommand per registered analysis, its options the
entry point's keywords.

* :func:`massive` -- massive activations per layer, their dimensions and positions (Sun et al. 2024).
* :func:`keybias` -- key/value norms, query-key cosines, attention share vs output share of the sink;
  finding sinks without attention weights.
* :func:`intervene` -- the interventions of :data:`~sinklab.analyze.interventions.INTERVENTIONS` (remove
  the sink, ablate massive activations, drop/replace the first token, swap learned positions), one
  class each; loss and sink rate after each.
* :func:`overmix` -- spread of a one-token perturbation with and without the sink (Barbero et al. 2025).
* :func:`repeat` -- a prompt followed by one repeated token: similarity to the first position, sink rate.
* :func:`denoise` -- a masked diffusion LM's sink at every denoising step of generation.
* :func:`depth` -- per layer Sink_1, secondary sinks, the first token's norm ratio and the matrix entropy
  of the hidden states (the "compression valley"); for a training run, at every checkpoint it keeps.
* :func:`attention` -- one window's attention matrices (or mass per key) for chosen layers and heads,
  every head's attention entropy on it.
* :func:`frames` -- reference frames per layer (centralized / distributed / bidirectional, Ruscio et al.
  2025) and the KL reduction of the sinks.

All forward passes go through the capture seam (:mod:`sinklab.capture.hf`, :mod:`sinklab.capture.native`);
interventions are its optional attention / block-output edits.
"""

# imported in the order ``sinklab analyze --help`` lists them (registration order)
from sinklab.analyze.common import ANALYSES, AnalysisResult, resolve_subject
from sinklab.subject import ProbeSpec, Subject
from sinklab.analyze.massive import massive
from sinklab.analyze.keybias import keybias  # noqa: I001
from sinklab.analyze.intervene import intervene
from sinklab.analyze.overmix import overmix
from sinklab.analyze.repeat import repeat
from sinklab.analyze.denoise import denoise
from sinklab.analyze.attention import attention
from sinklab.analyze.depth import depth
from sinklab.analyze.frames import frames
from sinklab.analyze.interventions import INTERVENTIONS, Intervention

__all__ = ["ANALYSES", "INTERVENTIONS", "AnalysisResult", "Intervention", "Subject", "ProbeSpec", "resolve_subject", "massive",
           "keybias", "intervene", "overmix", "repeat", "denoise", "attention", "depth", "frames"]
