"""Tiny random models of any ``transformers`` model type, built from the type's own config class (no download):
a generic shrinker over config fields (2 layers, hidden 32, 4 heads, vocabulary 128, one layer of each kind
``layer_types`` lists, shrunken sub-configs) with per-type overrides where a type needs them. Shared by the
architecture matrix and the sink-cache family matrix."""

from __future__ import annotations

import dataclasses

import torch

VOCAB = 128

#: the generic shrinker: every field a config class has among these is set to this value
SMALL = dict(
    num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, vocab_size=VOCAB, max_position_embeddings=64, sliding_window=8, attention_chunk_size=8,
    moe_intermediate_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    n_shared_experts=1, shared_expert_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1,
    q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
    linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
    mamba_d_state=4, mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, ssm_state_size=4, state_size=4, d_state=4,
    mamba_expand=2, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_inner=64, d_model=32, num_layers=2, ffn_dim=64,
    decoder_layers=2, decoder_attention_heads=4, decoder_ffn_dim=64, max_seq_len=64, n_ctx=64, encoder_layers=2,
    encoder_attention_heads=4, encoder_ffn_dim=64, depth=2, num_heads=4, embed_dim=32, image_size=32, patch_size=8,
    vision_start_layer=0, rotary_dim=4, dim=32, hidden_dim=64, n_heads=4, n_layers=2,
    vocab_size_per_layer_input=VOCAB, hidden_size_per_layer_input=8,  # Gemma-3n / Gemma-4 per-layer embeddings
)

#: per-type settings the generic shrinker cannot guess
OVERRIDES: dict[str, dict] = {
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=8),
    "zaya": dict(num_experts_per_tok=1),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=8),
    "falcon_h1": dict(mamba_n_heads=8, mamba_d_ssm=64),
    "recurrent_gemma": dict(num_hidden_layers=3),  # its block pattern is recurrent, recurrent, attention
    "granitemoehybrid": dict(mamba_n_heads=8),
    "jamba": dict(num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, mamba_dt_rank=4, mamba_d_conv=2),
}

def _fields(cls) -> set[str]:
    try:
        return {f.name for f in dataclasses.fields(cls)}
    except TypeError:
        import inspect

        return set(inspect.signature(cls.__init__).parameters)


def shrink_kwargs(cls, default) -> dict:
    """Constructor arguments of a tiny config of class ``cls`` (``default``: its default instance)."""
    from transformers.configuration_utils import PreTrainedConfig

    names = _fields(cls) | set(getattr(cls, "attribute_map", {}))
    kw = {k: v for k, v in SMALL.items() if k in names}
    if "kv_lora_rank" in names:  # MLA: keys and values come per query head
        kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    layer_types = getattr(default, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and layer_types and "layer_types" in _fields(cls):  # not an alias
        kinds = list(dict.fromkeys(layer_types))  # one layer of each kind, in the default's order
        kw["layer_types"] = (kinds * 2)[: max(2, len(kinds))]
        for k in ("num_hidden_layers", "num_layers", "n_layer"):
            if k in kw:
                kw[k] = len(kw["layer_types"])
    kw.update(OVERRIDES.get(getattr(cls, "model_type", ""), {}))
    for name in getattr(cls, "sub_configs", {}) or {}:
        sub = getattr(default, name, None)
        if isinstance(sub, PreTrainedConfig):
            kw[name] = type(sub)(**shrink_kwargs(type(sub), sub))
    return kw


def tiny_model(model_type: str):
    """A tiny random model of ``model_type`` (its causal-LM class; ``AutoModel`` for an encoder), eval mode."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    cls = CONFIG_MAPPING[model_type]
    cfg = cls(**shrink_kwargs(cls, cls()))
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) or MODEL_MAPPING_NAMES[model_type]
    torch.manual_seed(0)
    return getattr(transformers, name)(cfg).eval()


