"""Export a :class:`SinkLM` to a Hugging Face ``LlamaForCausalLM`` folder.

Only models whose parts map one-to-one onto LLaMA export: softmax attention with no
gate, RoPE, pre-norm RMSNorm, SwiGLU, no q/k/v biases, no sliding window. Weights
are copied by name; RoPE uses the same rotate-half layout, so no permutation is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sinklab.errors import ConfigError
from sinklab.nn.model import SinkLM


def unmappable_parts(config) -> list[str]:
    """Parts of ``config`` that ``LlamaForCausalLM`` cannot express (empty if it exports)."""
    bad = []
    if config.attention != "softmax" or config.attention_options.get("gate"):
        bad.append(f"attention={config.attention!r} options={config.attention_options} (LLaMA has plain softmax)")
    if config.positional != "rope":
        bad.append(f"positional={config.positional!r} (LLaMA uses rope)")
    if config.norm_position != "pre":
        bad.append(f"norm_position={config.norm_position!r} (LLaMA is pre-norm)")
    if config.norm != "rmsnorm":
        bad.append(f"norm={config.norm!r} (LLaMA uses rmsnorm)")
    if config.ffn != "swiglu":
        bad.append(f"ffn={config.ffn!r} (LLaMA uses swiglu)")
    if config.qkv_bias:
        bad.append("qkv_bias=true (LlamaForCausalLM export supports no attention biases)")
    if config.qk_norm:
        bad.append("qk_norm=true (LlamaForCausalLM has no query/key norm)")
    if config.sliding_window is not None:
        bad.append(f"sliding_window={config.sliding_window} (LLaMA has full attention)")
    if not getattr(config, "causal", True):
        bad.append("causal=false (a bidirectional masked diffusion model; LlamaForCausalLM is causal)")
    return bad


def llama_config(config):
    """The ``transformers.LlamaConfig`` with the same shapes as a :class:`ModelConfig`."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rms_norm_eps=config.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=config.tie_embeddings,
        initializer_range=config.init_std,
    )


def llama_state_dict(model: SinkLM) -> dict[str, torch.Tensor]:
    """SinkLM weights renamed to ``LlamaForCausalLM``'s parameter names."""
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight,
          "lm_head.weight": model.lm_head.weight}
    for i, blk in enumerate(model.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = blk.attn_norm.weight
        sd[p + "post_attention_layernorm.weight"] = blk.ffn_norm.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{name}.weight"] = getattr(blk.attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[p + f"mlp.{name}.weight"] = getattr(blk.ffn, name).weight
    return {k: v.detach().cpu().clone().contiguous() for k, v in sd.items()}


def export_hf(model: SinkLM, folder: str | os.PathLike, tokenizer=None) -> Path:
    """Write ``model`` as a ``LlamaForCausalLM`` folder (config.json + model.safetensors).

    Args:
        model: a SinkLM whose parts map onto LLaMA (see :func:`unmappable_parts`).
        folder: output folder (created).
        tokenizer: optional HF tokenizer (anything with ``save_pretrained``) saved beside it.

    Returns:
        the folder.

    Raises:
        ConfigError: naming every part that does not map onto LlamaForCausalLM.
    """
    bad = unmappable_parts(model.config)
    if bad:
        raise ConfigError("cannot export to LlamaForCausalLM: " + "; ".join(bad))
    from transformers import LlamaForCausalLM

    folder = Path(folder)
    with torch.device("meta"):
        hf = LlamaForCausalLM(llama_config(model.config))
    hf.load_state_dict(llama_state_dict(model), strict=True, assign=True)
    if model.config.tie_embeddings:
        hf.tie_weights()
    hf.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder
