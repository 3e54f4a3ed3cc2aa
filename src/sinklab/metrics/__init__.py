"""Pure sink metrics: tensors in, tensors out, no hooks and no module state.

See :mod:`sinklab.metrics.sink` for the definitions (Gu et al., ICLR 2025) and
:func:`sinklab.metrics.summary.summarize` for the bundle reported by ``sinklab measure``
and the training tracker.
"""

from sinklab.metrics.sink import (
    attention_mass,
    attention_mass_from_column_sums,
    bootstrap_sink_rate_ci,
    gate_magnitude,
    gate_weighted_column_sums,
    key_counts,
    massive_activation_ratio,
    norm_ratio,
    norm_ratio_per_layer,
    sink_rate,
    sink_rate_per_head,
    sink_rate_per_layer,
    sink_rate_per_sample,
    sink_rate_virtual,
    visible_key_counts,
    attention_mass_visible_from_column_sums,
)
from sinklab.metrics.agreement import kl_to_full, top1_agreement
from sinklab.metrics.entropy import attention_entropy, matrix_entropy
from sinklab.metrics.proportion import wilson_interval
from sinklab.metrics.summary import summarize

__all__ = [
    "attention_mass",
    "attention_mass_from_column_sums",
    "bootstrap_sink_rate_ci",
    "gate_magnitude",
    "gate_weighted_column_sums",
    "key_counts",
    "kl_to_full",
    "top1_agreement",
    "massive_activation_ratio",
    "norm_ratio",
    "norm_ratio_per_layer",
    "attention_entropy",
    "matrix_entropy",
    "sink_rate",
    "sink_rate_per_head",
    "sink_rate_per_layer",
    "sink_rate_per_sample",
    "summarize",
    "sink_rate_virtual",
    "visible_key_counts",
    "attention_mass_visible_from_column_sums",
    "wilson_interval",
]
