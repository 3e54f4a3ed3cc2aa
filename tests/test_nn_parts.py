"""Positional encodings, FFNs and norms against naive references written here."""

from __future__ import annotations

import math

import pytest
import torch

from sinklab.errors import InputError, UnknownNameError
from sinklab.nn import FFN, NORM, POSITIONAL, ModelConfig, SinkLM
from sinklab.nn.positional import alibi_slopes, t5_bucket


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


# ============================================================ positional
def test_every_positional_has_a_test():
    assert set(POSITIONAL.names()) == {"nope", "rope", "sinusoidal", "learned", "alibi", "t5"}, \
        "add a naive reference test for the new positional encoding"


def test_rope_is_a_complex_rotation_of_half_pairs():
    c = cfg(rope_theta=500.0)
    rope = POSITIONAL.get("rope")(c)
    B, H, Tn, dh = 2, 4, 16, c.head_dim
    q, k = torch.randn(B, H, Tn, dh), torch.randn(B, 2, Tn, dh)
    rq, rk = rope.apply_qk(q, k, rope.prepare(Tn, q.device))
    for x, rx in ((q, rq), (k, rk)):
        half = dh // 2
        z = torch.complex(x[..., :half].double(), x[..., half:].double())  # pair (i, i + d/2)
        t = torch.arange(Tn, dtype=torch.float64)[:, None]
        theta = t * 500.0 ** (-2 * torch.arange(half, dtype=torch.float64) / dh)
        zr = z * torch.exp(1j * theta)
        want = torch.cat([zr.real, zr.imag], dim=-1)
        torch.testing.assert_close(rx.double(), want, atol=1e-5, rtol=1e-5)
    # relative: q_m . k_n depends on m - n only
    q1 = torch.randn(dh).expand(1, 1, Tn, dh)
    a, b = rope.apply_qk(q1, q1, rope.prepare(Tn, q.device))
    s = a[0, 0] @ b[0, 0].T
    torch.testing.assert_close(s[5, 3], s[10, 8], atol=1e-5, rtol=1e-5)


def test_sinusoidal_table():
    c = cfg(positional="sinusoidal")
    pe = POSITIONAL.get("sinusoidal")(c).absolute(16, torch.device("cpu"))
    for t in (0, 3, 15):
        for i in range(16):
            assert pe[t, 2 * i].item() == pytest.approx(math.sin(t / 10000 ** (2 * i / 32)), abs=1e-6)
            assert pe[t, 2 * i + 1].item() == pytest.approx(math.cos(t / 10000 ** (2 * i / 32)), abs=1e-6)


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_table_limit_is_input_error(name):
    m = SinkLM(cfg(positional=name))
    m(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(InputError, match="17.*16"):
        m(torch.zeros(1, 17, dtype=torch.long))


def test_learned_positions_are_added_to_embeddings():
    m = SinkLM(cfg(positional="learned"))
    ids = torch.randint(0, 50, (2, 8))
    h0 = m(ids, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(h0, m.embed.weight[ids] + m.positional.table.weight[:8])


def test_alibi_slopes_and_bias():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # H = 6: slopes of 4 heads (2^-2, 2^-4, 2^-6, 2^-8), then every other slope of 8 heads (2^-1, 2^-3)
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0 ** -e for e in (2, 4, 6, 8, 1, 3)]))
    al = POSITIONAL.get("alibi")(cfg(positional="alibi"))
    pos = torch.arange(6)
    b = al.logit_bias(pos, pos)
    for h, m in enumerate([2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]):
        for i in range(6):
            for j in range(6):
                assert b[h, i, j].item() == pytest.approx(-m * abs(i - j))


def test_t5_buckets_match_transformers():
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 301)[None, :]
    for nb, md in ((32, 128), (8, 20)):
        want = T5Attention._relative_position_bucket(rel, bidirectional=True, num_buckets=nb, max_distance=md)
        assert torch.equal(t5_bucket(rel, nb, md), want)
    t5 = POSITIONAL.get("t5")(cfg(positional="t5"))
    pos = torch.arange(5)
    b = t5.logit_bias(pos, pos)
    for i in range(5):
        for j in range(5):
            bucket = T5Attention._relative_position_bucket(torch.tensor(j - i), bidirectional=True,
                                                           num_buckets=32, max_distance=128)
            torch.testing.assert_close(b[:, i, j], t5.bias.weight[bucket])


def test_unknown_positional_lists_names():
    with pytest.raises(UnknownNameError, match="did you mean 'rope'.*valid names: .*alibi"):
        cfg(positional="ropee")


# =================================================================== FFN
def _gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


NAIVE_FFN = {
    "swiglu": lambda g, u: (g / (1 + torch.exp(-g))) * u,
    "geglu": lambda g, u: _gelu(g) * u,
    "reglu": lambda g, u: torch.clamp(g, min=0) * u,
    "gelu": lambda g, u: _gelu(u),
    "relu": lambda g, u: torch.clamp(u, min=0),
    "swish": lambda g, u: u / (1 + torch.exp(-u)),
}


@pytest.mark.parametrize("name", FFN.names())
def test_ffn_matches_naive(name):
    assert name in NAIVE_FFN, f"add a naive formula for FFN {name!r}"
    torch.manual_seed(0)
    f = FFN.get(name)(32, 64)
    x = torch.randn(2, 5, 32)
    xd = x.double()
    u = xd @ f.up_proj.weight.double().T
    g = xd @ f.gate_proj.weight.double().T if hasattr(f, "gate_proj") else None
    want = NAIVE_FFN[name](g, u) @ f.down_proj.weight.double().T
    torch.testing.assert_close(f(x).double(), want, atol=1e-5, rtol=1e-5)


# ================================================================== norms
def test_norms_match_naive():
    torch.manual_seed(0)
    x = torch.randn(3, 7, 32)
    rms = NORM.get("rmsnorm")(32, 1e-5)
    with torch.no_grad():
        rms.weight.normal_()
    xd = x.double()
    want = xd / torch.sqrt((xd ** 2).mean(-1, keepdim=True) + 1e-5) * rms.weight.double()
    torch.testing.assert_close(rms(x).double(), want, atol=1e-5, rtol=1e-5)
    ln = NORM.get("layernorm")(32, 1e-5)
    want = (xd - xd.mean(-1, keepdim=True)) / torch.sqrt(xd.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(ln(x).double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_norm_placement(norm_position):
    """One block computed by hand: pre x + f(n(x)); post n(x + f(x))."""
    torch.manual_seed(0)
    m = SinkLM(cfg(n_layers=1, norm_position=norm_position, positional="nope"))
    ids = torch.randint(0, 50, (1, 6))
    out = m(ids, output_hidden_states=True)
    blk = m.layers[0]
    x = m.embed(ids)
    from sinklab.nn.attention import AttnContext

    ctx = AttnContext(T=6, device=x.device, positional=m.positional)
    if norm_position == "pre":
        h = x + blk.attn(blk.attn_norm(x), ctx)
        h = h + blk.ffn(blk.ffn_norm(h))
        logits = m.lm_head(m.final_norm(h))
    else:
        h = blk.attn_norm(x + blk.attn(x, ctx))
        h = blk.ffn_norm(h + blk.ffn(h))
        logits = m.lm_head(h)
        assert m.final_norm is None
    torch.testing.assert_close(out.hidden_states[1], h)
    torch.testing.assert_close(out.logits, logits)
