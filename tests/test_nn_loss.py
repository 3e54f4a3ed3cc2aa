"""Chunked linear cross-entropy (sinklab.nn.loss) against F.cross_entropy on full logits."""

import math

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


def _per_chunk_reference(h, w, y, rows, cdtype):
    """The chunked loss written plainly: fresh tensors per chunk (the code before its buffers were reused), in
    the same operations and order. Returns (loss, grad_h, grad_w) for d loss = 1."""
    log2e = 1.0 / math.log(2.0)
    N, V = h.shape[0], w.shape[0]
    valid = y != -100
    inv_n = 1.0 / valid.sum().clamp_min(1).to(torch.float32)
    hc, wc = h.to(cdtype), w.to(cdtype)
    grad_h = torch.empty(N, h.shape[1], dtype=h.dtype)
    grad_w = torch.zeros(V, h.shape[1], dtype=torch.float32)
    total = torch.zeros((), dtype=torch.float32)
    for i0 in range(0, N, rows):
        i1 = min(N, i0 + rows)
        z = (hc[i0:i1] @ wc.T).float()
        ok = valid[i0:i1]
        yc = torch.where(ok, y[i0:i1], 0)
        zy = z.gather(1, yc[:, None])
        m = z.amax(dim=-1, keepdim=True)
        e = z.sub_(m).mul_(log2e).exp2_()
        s = e.sum(dim=-1, keepdim=True)
        okf = ok.to(torch.float32)[:, None]
        total += ((m + s.log() - zy) * okf).sum()
        wr = okf * inv_n
        p = e.mul_(wr / s)
        p[torch.arange(i1 - i0), yc] -= wr[:, 0]
        pc = p.to(cdtype)
        grad_h[i0:i1] = (pc @ wc).to(h.dtype)
        grad_w.add_(pc.T @ hc[i0:i1])
    return total / valid.sum().to(torch.float32), grad_h, grad_w.to(w.dtype)


@pytest.mark.parametrize("dtype,autocast", [(torch.float32, False), (torch.float32, True), (torch.float64, False)])
def test_chunks_equal_the_plain_per_chunk_formula_bit_for_bit(dtype, autocast):
    """The loss reuses one buffer per intermediate across chunks: the loss and both gradients are those of the
    plain per-chunk formula bit for bit (float32, bf16 autocast, float64), ragged last chunk included. The
    studies' training fingerprints rest on this."""
    g = torch.Generator().manual_seed(3)
    N, V, d, rows = 300, 500, 24, 64  # chunks of 64 rows: 4 full and one of 44
    h = torch.randn(N, d, generator=g, dtype=dtype)
    w = torch.randn(V, d, generator=g, dtype=dtype) * 0.3
    y = torch.randint(0, V, (N,), generator=g)
    y[::7] = -100
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = linear_cross_entropy(h1, w1, y, chunk_elems=rows * V, min_rows=1)
    loss.backward()
    ref_loss, ref_gh, ref_gw = _per_chunk_reference(h, w, y, rows, torch.bfloat16 if autocast else dtype)
    assert torch.equal(loss.detach(), ref_loss)
    assert torch.equal(h1.grad, ref_gh) and torch.equal(w1.grad, ref_gw)
