"""Agreement with the full cache (KL and top-1) against hand-worked cases and a naive loop."""

import math

import pytest
import torch

from sinklab.errors import InputError
from sinklab.metrics import kl_to_full, top1_agreement


def test_kl_hand_worked():
    # p_full = (1/2, 1/2), p = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3)
    full = torch.log(torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    other = torch.log(torch.tensor([[0.25, 0.75]], dtype=torch.float64))
    assert kl_to_full(full, other).item() == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-12)
    assert kl_to_full(full, full).item() == 0.0
    # invariant to a constant added to a row of logits
    assert kl_to_full(full + 3.0, other - 7.0).item() == pytest.approx(kl_to_full(full, other).item(), abs=1e-12)


def test_kl_and_top1_against_naive_loop():
    torch.manual_seed(0)
    full, other = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    kl, agree = kl_to_full(full, other), top1_agreement(full, other)
    assert kl.shape == (3, 5) and kl.dtype == torch.float64 and agree.dtype == torch.bool
    for b in range(3):
        for t in range(5):
            p = [math.exp(x) for x in full[b, t].tolist()]
            q = [math.exp(x) for x in other[b, t].tolist()]
            zp, zq = sum(p), sum(q)
            ref = sum(pi / zp * math.log((pi / zp) / (qi / zq)) for pi, qi in zip(p, q))
            assert kl[b, t].item() == pytest.approx(ref, rel=1e-9, abs=1e-12)
            assert bool(agree[b, t]) == (max(range(11), key=lambda v: p[v]) == max(range(11), key=lambda v: q[v]))


def test_bfloat16_logits_are_upcast():
    torch.manual_seed(1)
    full, other = torch.randn(4, 32), torch.randn(4, 32)
    f16, o16 = full.bfloat16(), other.bfloat16()
    torch.testing.assert_close(kl_to_full(f16, o16), kl_to_full(f16.float(), o16.float()), rtol=0, atol=1e-12)


def test_bad_shapes():
    with pytest.raises(InputError, match="different shapes"):
        kl_to_full(torch.zeros(2, 5), torch.zeros(2, 6))
    with pytest.raises(InputError, match="vocabulary axis"):
        top1_agreement(torch.zeros(3, 1), torch.zeros(3, 1))


def test_stream_scores_in_row_blocks_equal_one_block_and_a_float64_reference(monkeypatch):
    """The streaming scorer splits its rows into blocks of at most SCORE_BLOCK_ELEMS elements (at a 262k
    vocabulary, 1024 rows at once took 14 GB): the blocks change no value, and NLL / KL / top-1 equal a naive
    float64 computation row by row; rows past the reference get NaN KL and agreement."""
    import math

    import torch

    from sinklab.streaming import harness

    g = torch.Generator().manual_seed(5)
    q, V, k = 11, 37, 7
    logits = torch.randn(q, V, generator=g) * 3
    ref = torch.randn(k, V, generator=g) * 3
    targets = torch.randint(0, V, (q,), generator=g)
    whole = harness._score_rows(logits, targets, ref)
    monkeypatch.setattr(harness, "SCORE_BLOCK_ELEMS", 3 * V)  # blocks of 3 rows: 3 + 3 + 1 with a reference, then none
    blocked = harness._score_rows(logits, targets, ref)
    for a, b in zip(whole, blocked):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    nll, kl, agree = blocked
    for t in range(q):
        x = [float(v) for v in logits[t].double()]
        lse = math.log(sum(math.exp(v) for v in x))
        assert nll[t].item() == pytest.approx(lse - x[targets[t]], rel=1e-6)
        if t < k:
            r = [float(v) for v in ref[t].double()]
            lr = math.log(sum(math.exp(v) for v in r))
            ref_kl = sum(math.exp(a - lr) * ((a - lr) - (b - lse)) for a, b in zip(r, x))
            assert kl[t].item() == pytest.approx(ref_kl, rel=1e-9, abs=1e-12)
            assert agree[t].item() == float(max(range(V), key=r.__getitem__) == max(range(V), key=x.__getitem__))
        else:
            assert math.isnan(kl[t].item()) and math.isnan(agree[t].item())
