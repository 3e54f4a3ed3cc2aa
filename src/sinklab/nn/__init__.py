"""Model side of pre-training: one LLaMA-style decoder with registry-chosen parts.

* :class:`ModelConfig` -- flat, typed, validated config; parts stored as registry names.
* :class:`SinkLM` -- the model; ``forward(input_ids, prefix_len=, observer=, output_hidden_states=)``,
  ``save_pretrained`` / ``from_pretrained``.
* :func:`export_hf` -- to a ``LlamaForCausalLM`` folder when the parts map onto LLaMA.
* Registries: :data:`ATTENTION` (:mod:`sinklab.nn.ops`), :data:`POSITIONAL`, :data:`FFN`, :data:`NORM`.
"""

from sinklab.nn.attention import Attention, AttentionOptions, reference_attention
from sinklab.nn.config import ModelConfig
from sinklab.nn.export import export_hf
from sinklab.nn.ffn import FFN
from sinklab.nn.model import LMOutput, SinkLM
from sinklab.nn.norm import NORM
from sinklab.nn.ops import ATTENTION, AttentionOp
from sinklab.nn.positional import POSITIONAL

__all__ = [
    "ATTENTION", "FFN", "NORM", "POSITIONAL", "Attention", "AttentionOp", "AttentionOptions", "LMOutput", "ModelConfig",
    "SinkLM", "export_hf", "reference_attention",
]
