"""Learned sinks under compression (issue 35 part 5): a model whose attention has sink logits keeps them
applied under every cache policy and every storage.

Two models with per-head sink logits, one layer, float64, eager attention: a tiny gpt-oss
(``transformers``' GptOss: the logit concatenated to each row before the softmax, then dropped) and a
sinklab ``sink_logit`` model. A 12-token prompt in one call, then decode steps at cache positions, each
through the compressed cache; the references, computed without the SinkCache:

* 16-bit storage: a from-scratch forward over exactly the kept tokens (positions 0..K) and the new
  token;
* quantised storage: the model's own attention over the dequantised kept keys and values, read from the
  cache and moved to positions 0..K-1 (a transformers ``DynamicCache`` filled with them for gpt-oss, a
  fixed-state stand-in cache for the sinklab model), and the new token's own key and value.

So the sink logit enters every step exactly as in an uncompressed forward over the kept tokens. The
check can fail: the same references with the sink logits zeroed differ.
"""

from __future__ import annotations

import pytest
import torch

from sinklab.streaming import SinkCache
from sinklab.streaming.policies import POLICIES

POLICY_NAMES = ["window", "sinks", "h2o", "tova", "sinks+h2o", "sinks+tova", "detected-sinks", "snapkv", "pyramidkv",
                "knorm"]
#: storages: (kv_bits, key_quant, sinks_full_precision); groups of 4 channels / 4 tokens
STORAGES = [(16, "token", 0), (4, "token", 0), (2, "channel", 0), (2, "token", 2), (2, "token", "detected")]
PROMPT, STEPS, BUDGET = 12, 4, 6


def tiny_gpt_oss():
    """One full-attention gpt-oss layer, GQA (4 query heads, 2 KV heads), sink logits N(1, 1), YaRN RoPE
    (gpt-oss's, its factor cut to fit the tiny context: the keys carry YaRN's attention scaling)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(vocab_size=80, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
                       layer_types=["full_attention"], max_position_embeddings=128, attn_implementation="eager",
                       rope_parameters={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                        "rope_theta": 150000.0, "original_max_position_embeddings": 32,
                                        "truncate": False})
    cfg._experts_implementation = "eager"  # the grouped-matmul kernel takes no float64
    m = GptOssForCausalLM(cfg).eval().double()
    with torch.no_grad():
        attn = m.model.layers[0].self_attn
        attn.sinks.normal_(1.0, 1.0)
        attn.q_proj.weight.mul_(4.0)
    return m


def tiny_sinklab():
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=80, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64,
                      attention="sink_logit", positional="rope")
    m = SinkLM(cfg).eval().double()
    with torch.no_grad():
        m.layers[0].attn.op.sink_logit.normal_(1.0, 1.0)
    return m


def sink_params(m):
    return m.model.layers[0].self_attn.sinks if hasattr(m, "model") else m.layers[0].attn.op.sink_logit


def make_cache(m, policy, bits, key_quant, lossless):
    n_sink = 2 if POLICIES.get(policy).uses_sinks else 0
    opts = {"observation_window": 2} if POLICIES.get(policy).prefill_time and POLICIES.get(policy).needs_scores else None
    extra = {"eps": 0.2} if policy == "detected-sinks" or lossless == "detected" else {}
    return SinkCache(m, policy=policy, budget=BUDGET, n_sink=n_sink, kv_bits=bits, kv_group=4, key_quant=key_quant,
                     sinks_full_precision=lossless, policy_options=opts, **extra)


def kept_state(layer):
    """Row 0's kept arrival indices and its dequantised keys (moved to positions 0..K-1) and values."""
    k, v = layer.read()
    pos = layer.positions if layer.positions.dim() == 1 else layer.positions[0]
    order = layer.order if layer.order.dim() == 1 else layer.order[0]
    K = order.numel()
    k = layer.rotation.rotate(k, torch.arange(K) - pos)
    return order.tolist(), k[:1], v[:1]


class FixedCache:
    """A stand-in cache for a sinklab model: one layer holding fixed keys/values (B, H_kv, K, d) at cache
    positions 0..K-1; a call appends nothing (the new tokens attend to the fixed ones and to themselves)."""

    class Layer:
        awaiting = 0

        def __init__(self, k, v):
            self.k, self.v, self.kept = k, v, k.shape[-2]

        def update(self, k, v, position_ids=None):
            return torch.cat((self.k, k), dim=-2), torch.cat((self.v, v), dim=-2)

    def __init__(self, k, v):
        self.layers = [self.Layer(k, v)]

    def kept_length(self, layer_idx=None):
        return self.layers[0].kept


def reference(m, ids, kept, k, v, t, bits):
    """Next-token logits (1, V) of token t after the kept tokens, computed without the SinkCache."""
    with torch.no_grad():
        if bits == 16:
            return m(ids[:, kept + [t]]).logits[:, -1]
        K = len(kept)
        if hasattr(m, "model"):  # transformers: its own attention over a DynamicCache holding the state
            from transformers import DynamicCache

            dc = DynamicCache(config=m.config)
            dc.update(k, v, 0)
            return m(ids[:, t : t + 1], cache=dc, use_cache=True, position_ids=torch.tensor([[K]])).logits[:, -1]
        return m(ids[:, t : t + 1], cache=FixedCache(k, v)).logits[:, -1]


@pytest.mark.parametrize("model", ["gpt_oss", "sinklab"])
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_sink_logits_stay_applied_under_every_policy_and_storage(model, policy):
    m = tiny_gpt_oss() if model == "gpt_oss" else tiny_sinklab()
    ids = torch.randint(0, 80, (1, PROMPT + STEPS), generator=torch.Generator().manual_seed(31))
    hf = model == "gpt_oss"
    for bits, key_quant, lossless in STORAGES:
        cache = make_cache(m, policy, bits, key_quant, lossless)
        layer = cache.layers[0]
        with torch.no_grad():
            if hf:
                m(ids[:, :PROMPT], cache=cache, use_cache=True)
            else:
                m(ids[:, :PROMPT], cache=cache)
        assert layer.kept == BUDGET
        for t in range(PROMPT, PROMPT + STEPS):
            kept, k, v = kept_state(layer)
            with torch.no_grad():
                if hf:
                    got = m(ids[:, t : t + 1], cache=cache, use_cache=True,
                            position_ids=torch.tensor([[cache.kept_length()]])).logits[:, -1]
                else:
                    got = m(ids[:, t : t + 1], cache=cache).logits[:, -1]
            ref = reference(m, ids, kept, k, v, t, bits)
            assert torch.allclose(got, ref, atol=1e-8), (bits, key_quant, lossless, t, (got - ref).abs().max())
            if t == PROMPT:  # the check can fail: without the sink logits the reference moves
                saved = sink_params(m).detach().clone()
                with torch.no_grad():
                    sink_params(m).zero_()
                    off = reference(m, ids, kept, k, v, t, bits)
                    sink_params(m).copy_(saved)
                assert not torch.allclose(got, off, atol=1e-4)
