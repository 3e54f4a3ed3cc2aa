"""Chunked linear cross-entropy (sinklab.nn.loss) against F.cross_entropy on full logits."""

import pytest
import torch
import torch.nn.functional as F

from sinklab.errors import InputError
from sinklab.nn import ModelConfig, SinkLM
from sinklab.nn.loss import linear_cross_entropy


def _case(N=37, d=16, V=50, seed=0, ignore=True):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=g, dtype=torch.float64)
    w = torch.randn(V, d, generator=g, dtype=torch.float64) * 0.5
    y = torch.randint(0, V, (N,), generator=g)
    if ignore:
        y[::5] = -100
    return h, w, y


@pytest.mark.parametrize("chunk_elems", [50, 7 * 50, 1 << 20])  # one row per chunk, ragged chunks, one chunk
def test_forward_and_gradients_equal_full_logits(chunk_elems):
    h, w, y = _case()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    ref = F.cross_entropy(h1 @ w1.T, y, ignore_index=-100)
    ref.backward(torch.tensor(2.5, dtype=torch.float64))
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    got = linear_cross_entropy(h2, w2, y, chunk_elems=chunk_elems, min_rows=1)
    got.backward(torch.tensor(2.5, dtype=torch.float64))
    torch.testing.assert_close(got, ref.float(), rtol=1e-6, atol=1e-6)  # logsumexp in float32
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(w2.grad, w1.grad, rtol=1e-5, atol=1e-7)


def test_hand_worked_case():
    # two classes, logits (0, log 3): p = (1/4, 3/4); target 0 -> loss log 4; d/dz = (p - e_0) = (-3/4, 3/4)
    h = torch.tensor([[1.0]], requires_grad=True)
    w = torch.tensor([[0.0], [torch.log(torch.tensor(3.0))]], requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.tensor([0]))
    loss.backward()
    assert loss.item() == pytest.approx(float(torch.log(torch.tensor(4.0))), rel=1e-6)
    assert h.grad.item() == pytest.approx(0.75 * float(torch.log(torch.tensor(3.0))), rel=1e-6)
    torch.testing.assert_close(w.grad, torch.tensor([[-0.75], [0.75]]))


def test_all_ignored_is_nan_like_cross_entropy():
    h, w, y = _case(N=4)
    y[:] = -100
    assert torch.isnan(linear_cross_entropy(h, w, y)) and torch.isnan(F.cross_entropy(h @ w.T, y))


def test_bf16_autocast_matches_unfused_head():
    h, w, y = _case(N=64, d=32, V=40)
    h, w = h.float(), w.float()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = F.linear(h1, w1)  # bf16 logits, as the model's lm_head under autocast
    ref = F.cross_entropy(z.float(), y, ignore_index=-100)
    ref.backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(h2, w2, y, chunk_elems=40 * 10, min_rows=1)
    got.backward()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # bf16 matmuls: the weight gradient is summed over chunks of bf16 products (one rounding per chunk)
    for got_g, ref_g in ((h2.grad, h1.grad), (w2.grad, w1.grad)):
        torch.testing.assert_close(got_g, ref_g, rtol=2e-2, atol=1e-2 * float(ref_g.abs().max()))


def test_model_targets_equal_logits_loss():
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, d_ff=48, max_seq_len=16)
    torch.manual_seed(0)
    m = SinkLM(cfg)
    x = torch.randint(0, 64, (2, 16))
    y = torch.randint(0, 64, (2, 16))
    y[0, :3] = -100
    ref = F.cross_entropy(m(x).logits.flatten(0, 1), y.flatten(), ignore_index=-100)
    ref.backward()
    g_ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    out = m(x, targets=y)
    assert out.logits is None
    out.loss.backward()
    torch.testing.assert_close(out.loss, ref)
    for n, p in m.named_parameters():
        torch.testing.assert_close(p.grad, g_ref[n], rtol=1e-4, atol=1e-6, msg=n)


def test_bad_shapes():
    h, w, y = _case(N=4)
    with pytest.raises(InputError, match="expected hidden"):
        linear_cross_entropy(h, w, y[:3])
    with pytest.raises(InputError, match="expected hidden"):
        linear_cross_entropy(h, w[:, :3], y)
    with pytest.raises(InputError, match="chunk_elems"):
        linear_cross_entropy(h, w, y, chunk_elems=0)
    with pytest.raises(InputError, match="min_rows"):
        linear_cross_entropy(h, w, y, min_rows=0)
