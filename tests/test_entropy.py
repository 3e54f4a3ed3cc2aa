"""Entropies: attention-row entropy (every collector and seam against a naive float64 computation from the
model's own eager attention weights) and the matrix-based entropy of hidden states (hand-worked cases)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers import tiny_bert, tiny_gpt2, tiny_llama
from sinklab.attention_masks import MaskSpec
from sinklab.capture import collect
from sinklab.capture.blockwise import blockwise_options
from sinklab.errors import InputError
from sinklab.metrics import attention_entropy, matrix_entropy
from sinklab.metrics.entropy import uniform_attention_entropy
from test_capture_blockwise import tiny_gemma2, tiny_gemma3, tiny_gpt_oss


# ------------------------------------------------------------------ matrix-based entropy, hand-worked
def test_matrix_entropy_hand_worked_cases():
    """K = X X^T / tr: two orthonormal tokens -> eigenvalues (1/2, 1/2), S = log 2; two equal tokens -> (1, 0),
    S = 0; tokens (3, 0) and (0, 1) -> (0.9, 0.1): S_1 = -(0.9 log 0.9 + 0.1 log 0.1), S_2 = -log(0.81 + 0.01)."""
    eye = torch.eye(2, dtype=torch.float64)
    assert float(matrix_entropy(eye)) == pytest.approx(math.log(2), abs=1e-12)
    same = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    assert float(matrix_entropy(same)) == pytest.approx(0.0, abs=1e-12)
    x = torch.tensor([[3.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert float(matrix_entropy(x)) == pytest.approx(-(0.9 * math.log(0.9) + 0.1 * math.log(0.1)), abs=1e-12)
    assert float(matrix_entropy(x, alpha=2.0)) == pytest.approx(-math.log(0.82), abs=1e-12)
    assert float(matrix_entropy(x, alpha=0.5)) == pytest.approx(2 * math.log(math.sqrt(0.9) + math.sqrt(0.1)), abs=1e-12)
    # four tokens: one of norm 10 along e1, three of norm 1 along e2, e3, e4 -> (100, 1, 1, 1) / 103
    y = torch.diag(torch.tensor([10.0, 1.0, 1.0, 1.0], dtype=torch.float64))
    lam = np.array([100, 1, 1, 1]) / 103
    assert float(matrix_entropy(y)) == pytest.approx(float(-(lam * np.log(lam)).sum()), abs=1e-12)


def test_matrix_entropy_matches_numpy_on_both_gram_sides_and_is_continuous_in_alpha():
    g = torch.Generator().manual_seed(0)
    for T, d in ((7, 3), (3, 7)):  # X^T X and X X^T branches
        x = torch.randn(2, 5, T, d, generator=g, dtype=torch.float64)
        got = matrix_entropy(x)
        for idx in np.ndindex(2, 5):
            xx = x[idx].numpy()
            k = xx @ xx.T  # always the T x T Gram matrix here
            lam = np.clip(np.linalg.eigvalsh(k / np.trace(k)), 0, None)
            lam = lam[lam > 0]
            assert float(got[idx]) == pytest.approx(float(-(lam * np.log(lam)).sum()), abs=1e-10)
            ren = float(np.log((lam ** 3).sum()) / (1 - 3))
            assert float(matrix_entropy(x[idx], alpha=3.0)) == pytest.approx(ren, abs=1e-10)
    assert float(matrix_entropy(x[0, 0], alpha=1 + 1e-7)) == pytest.approx(float(matrix_entropy(x[0, 0])), abs=1e-5)
    # the scale of the tokens does not matter, rotating them does not matter
    q, _ = torch.linalg.qr(torch.randn(7, 7, generator=g, dtype=torch.float64))
    torch.testing.assert_close(matrix_entropy(3.0 * x @ q), matrix_entropy(x))
    assert math.isnan(float(matrix_entropy(torch.zeros(3, 4))))
    with pytest.raises(InputError):
        matrix_entropy(torch.ones(3))
    with pytest.raises(InputError):
        matrix_entropy(torch.ones(3, 3), alpha=0.0)


# ------------------------------------------------------------------ attention entropy, pure
def test_attention_entropy_matches_a_loop_with_and_without_a_virtual_key():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, 5, 6, generator=g, dtype=torch.float64)
    logits[..., 4:] = float("-inf")  # masked keys: 0 log 0 = 0
    w = logits.softmax(-1) * 0.8  # rows sum to 0.8: the other 0.2 goes to a virtual key
    extra = torch.full((2, 3, 5), 0.2, dtype=torch.float64)
    got, got_x = attention_entropy(w / 0.8), attention_entropy(w, extra)
    for idx in np.ndindex(2, 3, 5):
        row = [float(p) for p in w[idx]]
        ref = -sum(p / 0.8 * math.log(p / 0.8) for p in row if p > 0)
        ref_x = -sum(p * math.log(p) for p in row + [0.2] if p > 0)
        assert float(got[idx]) == pytest.approx(ref, abs=1e-12)
        assert float(got_x[idx]) == pytest.approx(ref_x, abs=1e-12)
    assert float(attention_entropy(torch.zeros(1, 3))[0]) == 0.0  # a fully masked row
    assert float(attention_entropy(torch.full((1, 4), 0.25))[0]) == pytest.approx(math.log(4))


def test_uniform_attention_entropy_hand_worked():
    assert uniform_attention_entropy(3) == pytest.approx((math.log(1) + math.log(2) + math.log(3)) / 3)
    assert uniform_attention_entropy(3, MaskSpec(causal=False)) == pytest.approx(math.log(3))
    assert uniform_attention_entropy(4, MaskSpec(window=2)) == pytest.approx((0 + 3 * math.log(2)) / 4)
    assert uniform_attention_entropy(4, MaskSpec(prefix_len=3)) == pytest.approx((3 * math.log(3) + math.log(4)) / 4)
    with pytest.raises(InputError):
        uniform_attention_entropy(0)


# ------------------------------------------------------------------ every collector vs the model's own eager weights
BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "bert": tiny_bert, "gemma3": tiny_gemma3, "gemma2": tiny_gemma2,
            "gpt-oss": tiny_gpt_oss}
T = 13


def _naive_entropy(model, ids) -> torch.Tensor:
    """(N, L, H): -sum p log p in float64 from ``output_attentions`` of the model's own eager attention, the
    sink logit's share 1 - sum_j A[i, j] (gpt-oss) as one more entry, mean over queries."""
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attns = model(input_ids=ids, output_attentions=True, use_cache=False).attentions
    finally:
        model.set_attn_implementation(prev)
    per_layer = []
    for a in attns:
        p = a.double()
        terms = -(p * torch.log(torch.where(p > 0, p, torch.ones_like(p)))).sum(-1)  # (N, H, T)
        rest = (1.0 - p.sum(-1)).clamp_min(0.0)
        terms = terms - rest * torch.log(torch.where(rest > 1e-12, rest, torch.ones_like(rest)))
        per_layer.append(terms.mean(-1))
    return torch.stack(per_layer, dim=1)


@pytest.mark.parametrize("arch", list(BUILDERS))
@pytest.mark.parametrize("how", ["eager", "tiles", "fused", "sdpa"])
def test_every_collector_records_the_entropy_of_the_eager_weights(arch, how):
    model = BUILDERS[arch]()
    ids = torch.randint(4, 80, (3, T), generator=torch.Generator().manual_seed(0))
    ref = _naive_entropy(model, ids)
    if how == "eager":
        stats = collect(model, ids, batch_size=2, collector="eager", entropy=True)
    else:
        with blockwise_options(block_size=5, output=how):
            stats = collect(model, ids, batch_size=2, collector="blockwise", entropy=True)
    torch.testing.assert_close(stats.attention_entropy, ref, rtol=1e-5, atol=2e-5)
    assert collect(model, ids, collector="eager").attention_entropy is None  # only when asked for


def test_padding_mask_entropy_through_the_log_sum_exp_path():
    """A padding mask sends the fused kernel's output through the LSE tiles; entropies still match eager."""
    model = tiny_llama()
    ids = torch.randint(4, 80, (2, T), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    from sinklab.capture.hf import capturing
    from sinklab.capture.recorder import BatchRecorder

    got = {}
    for name, opts in (("eager", None), ("fused", "fused"), ("tiles", "tiles")):
        rec = BatchRecorder(2, "eager" if opts is None else "blockwise", entropy=True)
        ctx = blockwise_options(block_size=4, output=opts) if opts else blockwise_options()
        with ctx, capturing(model, rec, "eager" if opts is None else "blockwise"), torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=False)
        got[name] = torch.stack(rec.entropy, dim=1)
    torch.testing.assert_close(got["fused"], got["eager"], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got["tiles"], got["eager"], rtol=1e-5, atol=2e-5)


def test_native_model_entropy_counts_the_virtual_key():
    """A sinklab model with a learned sink token: the observer's weights on real keys plus the sink's share."""
    from sinklab.nn.config import ModelConfig
    from sinklab.nn.model import SinkLM

    torch.manual_seed(0)
    model = SinkLM(ModelConfig(vocab_size=80, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16,
                               attention="sink_token")).eval()
    ids = torch.randint(0, 80, (2, 9), generator=torch.Generator().manual_seed(0))
    seen = []
    with torch.no_grad():
        model(ids, observer=lambda l, w, *, renormalised, extra=None, **_: seen.append((w.double(), extra)))
    ref = []
    for w, extra in seen:
        assert extra is not None
        x = extra.double()
        h = -(torch.special.xlogy(w, w).sum(-1) + torch.special.xlogy(x, x))
        ref.append(h.mean(-1))
    stats = collect(model, ids, entropy=True)
    torch.testing.assert_close(stats.attention_entropy, torch.stack(ref, dim=1), rtol=1e-6, atol=1e-6)


@pytest.mark.integration
def test_measure_writes_per_head_entropy_to_results_json(tiny_model_dir, text_corpus_dir, tmp_path):
    """``sinklab measure``'s results.json and attention.csv: per-head entropy = the naive one of the probe it measured."""
    import json

    import pandas as pd

    from sinklab.measure import measure
    from sinklab.models import load_model

    res = measure(model=str(tiny_model_dir), corpus=str(text_corpus_dir), num_samples=4, seq_len=12, progress=False,
                  out=tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "results.json").read_text())
    model = load_model(str(tiny_model_dir), dtype=torch.float32).model
    ref = _naive_entropy(model, res.probe.input_ids).mean(dim=0)  # (L, H)
    torch.testing.assert_close(torch.tensor(saved["attention_entropy"], dtype=torch.float64), ref, atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(saved["attention_entropy_per_layer"], dtype=torch.float64), ref.mean(1),
                               atol=1e-4, rtol=0)
    assert saved["attention_entropy_uniform"] == pytest.approx(sum(math.log(i + 1) for i in range(12)) / 12, abs=1e-4)
    table = pd.read_csv(tmp_path / "m" / "attention.csv")
    first = table[table["position"] == 0].sort_values(["layer", "head"])
    np.testing.assert_allclose(first["attention_entropy"].to_numpy(), ref.flatten().numpy(), atol=1e-4)


def test_uniform_entropy_counts_the_keys_each_query_sees_under_any_mask():
    """Hand-counted keys per query at T = 6: a bidirectional window of 2 sees [2, 3, 3, 3, 3, 2] (it was log T
    whatever the window; outside audit, 2026-12-07), a causal window of 2 [1, 2, 2, 2, 2, 2], a prefix of 3
    [3, 3, 3, 4, 5, 6]."""
    import math

    from sinklab.attention_masks import MaskSpec
    from sinklab.metrics.entropy import uniform_attention_entropy

    for mask, n in ((MaskSpec(causal=False, window=2), [2, 3, 3, 3, 3, 2]), (MaskSpec(window=2), [1, 2, 2, 2, 2, 2]),
                    (MaskSpec(prefix_len=3), [3, 3, 3, 4, 5, 6]), (MaskSpec(), [1, 2, 3, 4, 5, 6]),
                    (MaskSpec(causal=False), [6] * 6)):
        assert uniform_attention_entropy(6, mask) == pytest.approx(sum(map(math.log, n)) / 6, abs=1e-12), mask


def test_measure_summary_gives_each_layer_of_a_mixed_window_model_its_own_uniform_entropy():
    """Gemma 2 mixes sliding (window 8) and full layers: measure's summary gave the whole model the windowed
    layers' uniform entropy, below the full layers' measured entropy (an audit found 1.891 beside full layers at
    2.525). Each layer now has its own, computed by hand; the single value is None when they differ."""
    from helpers import tiny_gemma2_mixed
    from sinklab.metrics.summary import summarize

    m = tiny_gemma2_mixed()
    T = 16
    x = torch.randint(3, 128, (2, T), generator=torch.Generator().manual_seed(0))
    s = summarize(collect(m, x, collector="blockwise", entropy=True), n_boot=10)
    want = [sum(math.log(min(i + 1, 8)) for i in range(T)) / T, sum(math.log(i + 1) for i in range(T)) / T]
    assert s["attention_entropy_uniform_per_layer"] == pytest.approx(want, abs=1e-4)
    assert s["attention_entropy_uniform"] is None
    assert s["attention_entropy_per_layer"][1] <= want[1] + 1e-4  # no layer above its own uniform entropy
    plain = summarize(collect(tiny_llama(), x % 50, collector="blockwise", entropy=True), n_boot=10)
    assert plain["attention_entropy_uniform"] == pytest.approx(sum(math.log(i + 1) for i in range(T)) / T, abs=1e-4)
    assert plain["attention_entropy_uniform_per_layer"] == [plain["attention_entropy_uniform"]] * len(
        plain["attention_entropy_per_layer"])
