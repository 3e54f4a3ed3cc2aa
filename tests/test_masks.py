"""MaskSpec (sinklab.attention_masks): the masks it builds against float64 masks written out by hand,
the key ranges, the mask-aware counts, its errors and its dict form."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sinklab.attention_masks import CAUSAL, MaskSpec, build_mask, key_range, visible
from sinklab.errors import InputError

NEG = -math.inf

# rows = queries 0..5, columns = keys 0..5; 0.0 = may attend, -inf = hidden (additive float64 masks)
_ = NEG
HAND = {
    "causal": (MaskSpec(), [
        [0, _, _, _, _, _],
        [0, 0, _, _, _, _],
        [0, 0, 0, _, _, _],
        [0, 0, 0, 0, _, _],
        [0, 0, 0, 0, 0, _],
        [0, 0, 0, 0, 0, 0]]),
    "prefix3": (MaskSpec(prefix_len=3), [
        [0, 0, 0, _, _, _],
        [0, 0, 0, _, _, _],
        [0, 0, 0, _, _, _],
        [0, 0, 0, 0, _, _],
        [0, 0, 0, 0, 0, _],
        [0, 0, 0, 0, 0, 0]]),
    "window2": (MaskSpec(window=2), [
        [0, _, _, _, _, _],
        [0, 0, _, _, _, _],
        [_, 0, 0, _, _, _],
        [_, _, 0, 0, _, _],
        [_, _, _, 0, 0, _],
        [_, _, _, _, 0, 0]]),
    "prefix3_window2": (MaskSpec(prefix_len=3, window=2), [
        [0, 0, _, _, _, _],
        [0, 0, 0, _, _, _],
        [_, 0, 0, _, _, _],
        [_, _, 0, 0, _, _],
        [_, _, _, 0, 0, _],
        [_, _, _, _, 0, 0]]),
    "bidirectional_window2": (MaskSpec(causal=False, window=2), [
        [0, 0, _, _, _, _],
        [0, 0, 0, _, _, _],
        [_, 0, 0, 0, _, _],
        [_, _, 0, 0, 0, _],
        [_, _, _, 0, 0, 0],
        [_, _, _, _, 0, 0]]),
    "bidirectional": (MaskSpec(causal=False), [[0] * 6 for _ in range(6)]),
}


def as_float(mask: torch.Tensor) -> torch.Tensor:
    """bool (True = may attend) -> float64 additive mask (0 / -inf)."""
    return torch.zeros(mask.shape, dtype=torch.float64).masked_fill(~mask, NEG)


@pytest.mark.parametrize("name", sorted(HAND))
def test_mask_equals_hand_built_float64_mask(name):
    spec, rows = HAND[name]
    want = torch.tensor(rows, dtype=torch.float64)
    got = build_mask(6, mask=spec)
    assert got.dtype == torch.bool and got.shape == (6, 6)
    torch.testing.assert_close(as_float(got), want, rtol=0, atol=0)
    # the same rule position by position, and a softmax under either mask is the same
    torch.testing.assert_close(as_float(visible(torch.arange(6), torch.arange(6), spec)), want, rtol=0, atol=0)
    logits = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(torch.softmax(logits + as_float(got), -1), torch.softmax(logits + want, -1), rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(HAND))
def test_fewer_queries_are_the_last_rows_and_key_ranges_cover_them(name):
    spec, rows = HAND[name]
    want = torch.tensor(rows, dtype=torch.float64)
    torch.testing.assert_close(as_float(build_mask(2, 6, spec)), want[4:], rtol=0, atol=0)
    for q0 in range(6):
        for q1 in range(q0 + 1, 7):
            k0, k1 = key_range(q0, q1, 6, spec)
            seen = [j for i in range(q0, q1) for j in range(6) if rows[i][j] == 0]
            assert all(k0 <= j < k1 for j in seen), (name, q0, q1, k0, k1)


@pytest.mark.parametrize("name", sorted(HAND))
def test_visible_key_counts_are_the_hand_built_column_counts(name):
    from sinklab.metrics import visible_key_counts

    spec, rows = HAND[name]
    want = (np.array(rows, dtype=np.float64) == 0).sum(axis=0).astype(np.float64)
    np.testing.assert_array_equal(visible_key_counts(6, spec).numpy(), want)


def test_sinklm_attention_weights_are_zero_where_the_hand_built_mask_hides():
    """A prefix LM with a sliding window: the model's own weights vanish exactly on the hidden keys."""
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(0)
    m = SinkLM(ModelConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=6, sliding_window=2))
    m.eval()
    seen = {}

    def observer(layer, weights, **kw):
        seen[layer] = weights.detach().double()

    with torch.no_grad():
        m(torch.randint(0, 16, (1, 6)), prefix_len=3, observer=observer)
    hidden = torch.tensor(HAND["prefix3_window2"][1], dtype=torch.float64) == NEG
    w = seen[0][0]  # (H, T, T)
    assert bool((w[:, hidden] == 0).all()) and bool((w[:, ~hidden] > 0).all())


def test_plain_causal_and_dict_form():
    assert CAUSAL == MaskSpec(causal=True, prefix_len=0, window=None)
    assert MaskSpec(prefix_len=1).plain_causal(8) and MaskSpec(window=8).plain_causal(8)
    assert not MaskSpec(window=7).plain_causal(8) and not MaskSpec(prefix_len=2).plain_causal(8)
    assert not MaskSpec(causal=False).plain_causal(8)
    spec = MaskSpec(causal=True, prefix_len=np.int64(4), window=torch.tensor(3))
    assert spec == MaskSpec(prefix_len=4, window=3) and type(spec.prefix_len) is int and type(spec.window) is int
    assert spec.to_dict() == {"causal": True, "prefix_len": 4, "window": 3}
    assert MaskSpec.from_dict(spec.to_dict()) == spec
    assert MaskSpec.from_dict({"prefix_len": None, "window": None}, causal=False) == MaskSpec(causal=False)


@pytest.mark.parametrize("kw,what", [(dict(prefix_len=-1), "prefix_len"), (dict(prefix_len=1.5), "prefix_len"),
                                     (dict(window=0), "window"), (dict(window=True), "window"),
                                     (dict(window=2.0), "window")])
def test_bad_specs_are_refused(kw, what):
    with pytest.raises(InputError, match=f"MaskSpec.{what}"):
        MaskSpec(**kw)


def test_spec_is_frozen():
    with pytest.raises(AttributeError):
        CAUSAL.window = 3  # type: ignore[misc]
