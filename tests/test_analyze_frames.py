"""analyze frames: reference frames and the KL reduction, against hand-worked cases and a naive
recomputation from transformers' own attention weights."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sinklab.analyze import Subject, frames
from sinklab.analyze.frames import (classify_layer, kl_reduction, kl_to_uniform, model_kind, reference_points,
                                    uniform_mass)
from sinklab.errors import InputError


def test_uniform_mass_hand_worked():
    torch.testing.assert_close(uniform_mass(3, True), torch.tensor([11 / 18, 5 / 12, 1 / 3], dtype=torch.float64))
    torch.testing.assert_close(uniform_mass(4, False), torch.full((4,), 0.25, dtype=torch.float64))


def test_kl_to_uniform_and_reduction_hand_worked():
    vis = torch.ones(3, 3, dtype=torch.bool).tril()
    w = torch.tensor([[1.0, 0, 0], [0.5, 0.5, 0], [0.5, 0.25, 0.25]], dtype=torch.float64)[None, None]
    kl, ok = kl_to_uniform(w, vis)
    # row 0: one visible key, KL 0; row 1: uniform, KL 0; row 2: 0.5 ln 1.5 + 2 * 0.25 ln 0.75
    assert ok.all()
    torch.testing.assert_close(kl[0, 0], torch.tensor([0.0, 0.0, 0.5 * math.log(1.5) + 0.5 * math.log(0.75)],
                                                      dtype=torch.float64))
    kl2, ok2 = kl_to_uniform(w, vis, [0])
    # without key 0: row 0 has no key left; row 1 -> (1), KL 0; row 2 -> (0.5, 0.5), KL 0
    assert ok2[0, 0].tolist() == [False, True, True]
    r = kl_reduction(w, vis, [0])
    assert r["rows"] == 2
    assert r["kl"] == pytest.approx((0.5 * math.log(1.5) + 0.5 * math.log(0.75)) / 2)
    assert r["kl_without_sinks"] == pytest.approx(0.0) and r["kl_reduction"] == pytest.approx(r["kl"])


def test_reference_points_and_kinds():
    T = 8
    u = uniform_mass(T, True)
    central = u.clone()
    central[0] = 0.9
    refs = reference_points(central, True)
    assert refs == [0] and classify_layer(refs, central, True) == "centralized"
    # (a[j] - u[j]) / (1 - u[j]): 0 at uniform, 1 at all attention
    from sinklab.analyze.frames import reference_strength
    torch.testing.assert_close(reference_strength(u, True), torch.zeros(T, dtype=torch.float64))
    assert float(reference_strength(torch.ones(T), True)[0]) == pytest.approx(1.0)
    spread = u.clone()
    spread[2], spread[4] = 0.4, 0.5
    refs = reference_points(spread, True)
    assert refs == [2, 4] and classify_layer(refs, spread, True) == "distributed"
    both = torch.full((T,), 0.1, dtype=torch.float64)
    both[0], both[-1] = 0.5, 0.4
    refs = reference_points(both, False)
    assert refs == [0, T - 1] and classify_layer(refs, both, False) == "bidirectional"
    assert classify_layer([], u, True) == "none" and reference_points(u, True) == []
    assert model_kind(["none", "distributed", "centralized", "centralized"]) == "centralized"
    assert model_kind(["distributed", "centralized"]) == "centralized"  # tie: the order of KINDS
    assert model_kind(["none", "none"]) == "none"


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(6.0)
            layer.self_attn.k_proj.weight.mul_(6.0)
    return m


def test_frames_equals_naive_recomputation(llama):
    ids = torch.randint(0, 60, (3, 12), generator=torch.Generator().manual_seed(1))
    r = frames(Subject(llama, ids), excess=0.05)
    with torch.no_grad():
        att = llama(ids, output_attentions=True).attentions  # L x (N, H, T, T)
    T = 12
    df = r.tables["layers"]
    assert df["layer"].tolist() == [0, 1, 2]
    for layer, A in enumerate(att):
        A = A.double()
        # attention mass per key: mean over the queries i >= j, then over samples and heads
        mass = torch.stack([A[..., j:, j].mean(-1) for j in range(T)], -1).mean(dim=(0, 1))
        row = df[df["layer"] == layer].iloc[0]
        assert row["mass_first"] == pytest.approx(float(mass[0]), abs=1e-6)
        refs = json.loads(row["reference_points"])
        sinks = refs or [0]
        # naive KL to uniform, row by row, with and without the sinks
        kl, kl2 = [], []
        for n in range(3):
            for h in range(4):
                for i in range(T):
                    keep = [j for j in range(i + 1) if j not in sinks]
                    rest = sum(float(A[n, h, i, j]) for j in keep)
                    if not keep or rest <= 0:
                        continue
                    kl.append(sum(float(A[n, h, i, j]) * math.log(float(A[n, h, i, j]) * (i + 1))
                                  for j in range(i + 1) if A[n, h, i, j] > 0))
                    kl2.append(sum((float(A[n, h, i, j]) / rest) * math.log(float(A[n, h, i, j]) / rest * len(keep))
                                   for j in keep if A[n, h, i, j] > 0))
        assert row["rows"] == len(kl)
        assert row["kl_to_uniform"] == pytest.approx(sum(kl) / len(kl), abs=1e-6)
        assert row["kl_reduction"] == pytest.approx(sum(kl) / len(kl) - sum(kl2) / len(kl2), abs=1e-6)
    assert r.summary["kind"] in ("centralized", "distributed", "none")
    assert len(repr(r.summary)) > 0 and set(r.plots) == {"frames"}


def test_bad_rules(llama):
    ids = torch.randint(0, 60, (1, 8))
    with pytest.raises(InputError, match="excess must lie in"):
        frames(Subject(llama, ids), excess=1.5)
    with pytest.raises(InputError, match="dominance must lie in"):
        frames(Subject(llama, ids), dominance=0.0)


def test_a_window_shorter_than_the_probe_is_refused():
    """frames' uniform reference and visible keys are those of plain causal attention: a sliding window
    shorter than T would compare the weights with a uniform spread over keys the layer cannot see (outside
    audit, 2026-12-07). Refused in one line; at T within the window it runs."""
    from transformers import MistralConfig, MistralForCausalLM

    from sinklab import analyze
    from sinklab.errors import InputError

    torch.manual_seed(0)
    m = MistralForCausalLM(MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, sliding_window=6)).eval()
    ids = torch.randint(0, 80, (2, 12), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match="mask of layer 0 hides keys that causal attention shows at T = 12"):
        analyze.frames(analyze.Subject(m, ids))
    assert len(analyze.frames(analyze.Subject(m, ids[:, :6])).tables["layers"]) == 2
