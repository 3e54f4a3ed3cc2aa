"""The speed-only switches of :class:`sinklab.nn.Attention` (:class:`~sinklab.nn.AttentionOptions`) change no result.

* ``fused_qkv``: one matmul with the stacked [W_q; W_k; W_v] == three separate projections.
* ``cpu_fp32_sdpa_backward``: under bf16 autocast on CPU, training runs SDPA in float32 (checked
  by spying on the dtype SDPA receives) and agrees with the float32 model within bf16 rounding.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sinklab.nn import ModelConfig, SinkLM
from sinklab.nn.attention import AttentionOptions


def _model(**kw) -> SinkLM:
    torch.manual_seed(0)
    base = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16)
    return SinkLM(ModelConfig(**{**base, **kw}))


def _loss_and_grads(model: SinkLM, x: torch.Tensor, autocast: bool = False):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(x).logits
    loss = F.cross_entropy(logits.float()[:, :-1].flatten(0, 1), x[:, 1:].flatten())
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=2), dict(qkv_bias=True), dict(attention="sink_token")])
def test_fused_qkv_equals_separate_projections(kw, monkeypatch):
    model = _model(**kw)
    if kw.get("qkv_bias"):
        with torch.no_grad():
            for layer in model.layers:
                for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj):
                    proj.bias.normal_()
    x = torch.randint(0, 64, (2, 16))
    model.set_attention_options(fused_qkv=True)
    l1, g1 = _loss_and_grads(model, x)
    model.set_attention_options(fused_qkv=False)
    l0, g0 = _loss_and_grads(model, x)
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6, msg=n)


def test_attention_options_are_per_model_and_explicit():
    """Options given to one model reach each of its layers and no other model (no class-wide switch).
    (The layers' options carry the config's attention_backend, "auto" here: tests/test_nn_backends.py.)"""
    slow = SinkLM(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=16),
                  attention_options=AttentionOptions(fused_qkv=False, chunk_elems=7))
    other = _model()
    default = AttentionOptions(attention_backend="auto")
    assert all(b.attn.options == AttentionOptions(fused_qkv=False, chunk_elems=7, attention_backend="auto")
               for b in slow.layers)
    assert all(b.attn.options == default for b in other.layers)
    before = other.set_attention_options(tile_autograd=False)
    assert before == default and other.layers[1].attn.options.tile_autograd is False
    other.set_attention_options(before)
    assert other.layers[0].attn.options == default
    with pytest.raises(TypeError):
        other.set_attention_options(no_such_switch=True)



def _spy_sdpa_dtypes(monkeypatch) -> list:
    """The dtype of the queries of every ``F.scaled_dot_product_attention`` call from now on (a list that fills)."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, *a, **k):
        seen.append(q.dtype)
        return sdpa(q, *a, **k)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen

@pytest.mark.parametrize("attention", ["softmax", "softmax_off_by_one", "kv_bias"])
def test_cpu_bf16_training_runs_sdpa_in_float32(attention, monkeypatch):
    seen = _spy_sdpa_dtypes(monkeypatch)
    model = _model(attention=attention)
    x = torch.randint(0, 64, (2, 16))
    l_ref, g_ref = _loss_and_grads(model, x)  # float32 throughout
    seen.clear()
    l_up, g_up = _loss_and_grads(model, x, autocast=True)
    assert seen and all(d == torch.float32 for d in seen)
    model.set_attention_options(cpu_fp32_sdpa_backward=False)
    seen.clear()
    l_bf, g_bf = _loss_and_grads(model, x, autocast=True)
    assert seen and all(d == torch.bfloat16 for d in seen)
    # both bf16-autocast variants agree with float32 within bf16 rounding (relative 2^-8 per op)
    for loss in (l_up, l_bf):
        torch.testing.assert_close(loss, l_ref, rtol=2e-2, atol=2e-2)
    for n in g_ref:
        scale = g_ref[n].abs().max().item() + 1e-8
        assert (g_up[n] - g_ref[n]).abs().max().item() / scale < 0.1, n
    # forward-only passes keep half precision
    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert seen and all(d == torch.bfloat16 for d in seen)


@pytest.mark.parametrize("attention", ["sink_token", "kv_bias", "k_bias", "softmax_off_by_one", "sink_logit"])
@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_causal_virtual_key_equals_explicit_mask(attention, n_kv_heads, monkeypatch):
    """The dummy-query causal call == SDPA with the explicit (T, 1+T) mask, values and gradients."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append(attn_mask is None and kw.get("is_causal", False))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model = _model(attention=attention, n_kv_heads=n_kv_heads)
    with torch.no_grad():  # make the virtual key matter
        for n, p in model.named_parameters():
            if "op." in n:
                p.normal_()
    x = torch.randint(0, 64, (2, 16))
    model.set_attention_options(causal_virtual_key=True)
    l1, g1 = _loss_and_grads(model, x)
    assert calls and all(calls)
    calls.clear()
    model.set_attention_options(causal_virtual_key=False)
    l0, g0 = _loss_and_grads(model, x)
    assert calls and not any(calls)
    torch.testing.assert_close(l1, l0, rtol=1e-6, atol=1e-6)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-5, atol=1e-6, msg=n)


def test_cpu_bf16_training_keeps_sdpa_in_bf16_past_the_upcast_length(monkeypatch):
    """Past ``cpu_fp32_sdpa_max_keys`` keys the bf16-autocast training step calls SDPA in bfloat16 (PyTorch's bf16 CPU
    kernel is the faster one at long sequences: benchmarks/results/sdpa_dtype_cpu.json), up to it in float32; both agree
    with the float32 model within bf16 rounding."""
    seen = _spy_sdpa_dtypes(monkeypatch)
    model = _model()
    x = torch.randint(0, 64, (2, 16))
    l_ref, g_ref = _loss_and_grads(model, x)
    assert AttentionOptions().cpu_fp32_sdpa_max_keys == 512
    for max_keys, want in ((16, torch.float32), (15, torch.bfloat16), (None, torch.float32)):
        model.set_attention_options(cpu_fp32_sdpa_max_keys=max_keys)
        seen.clear()
        loss, grads = _loss_and_grads(model, x, autocast=True)
        assert seen and all(d == want for d in seen), (max_keys, seen)
        torch.testing.assert_close(loss, l_ref, rtol=2e-2, atol=2e-2)
        for n in g_ref:
            assert (grads[n] - g_ref[n]).abs().max().item() / (g_ref[n].abs().max().item() + 1e-8) < 0.1, n
    # float16 autocast is upcast at every length (its kernel's speed was not measured)
    model.set_attention_options(cpu_fp32_sdpa_max_keys=15)
    seen.clear()
    with torch.autocast("cpu", dtype=torch.float16):
        model(x, targets=x).loss.backward()
    assert seen and all(d == torch.float32 for d in seen), seen
