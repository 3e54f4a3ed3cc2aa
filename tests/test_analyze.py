"""sinklab.analyze: every statistic against a naive float64 computation, interventions that must be no-ops,
a planted sink that moves with a position swap, and bad input through the CLI."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from helpers import run_cli_captured, tiny_llama
from sinklab.analyze import Subject, intervene, keybias, massive, overmix, repeat
from sinklab.analyze.common import run_model
from sinklab.analyze.intervene import remove_key
from sinklab.analyze.keybias import detection, head_statistics
from sinklab.analyze.massive import top_activations
from sinklab.analyze.overmix import sensitivity
from sinklab.analyze.repeat import cosine_to_first
from sinklab.errors import InputError
from sinklab.nn.config import ModelConfig
from sinklab.nn.model import SinkLM


def _ids(n=3, t=10, vocab=80, seed=0):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def _sinklm(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=80, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=16)
    cfg.update(kw)
    return SinkLM(ModelConfig(**cfg)).eval()


# ------------------------------------------------------------------ pure statistics vs naive loops
@pytest.mark.parametrize("causal", [True, False])
def test_head_statistics_match_naive_loops(causal):
    g = torch.Generator().manual_seed(0)
    B, H, T, D, p = 2, 3, 6, 4, 1
    logits = torch.randn(B, H, T, T, generator=g)
    if causal:
        logits = logits.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = logits.softmax(-1)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    got = head_statistics(w, q, k, v, p, causal=causal)
    w, q, k, v = w.double(), q.double(), k.double(), v.double()
    for b in range(B):
        for h in range(H):
            rows = [i for i in range(T) if (i >= p or not causal)]
            att = sum(float(w[b, h, i, p]) for i in rows) / len(rows)
            outs, nshares = [], []
            for i in rows:
                o = sum(w[b, h, i, j] * v[b, h, j] for j in range(T))
                outs.append(float((w[b, h, i, p] * v[b, h, p]).norm() / o.norm()))
                nshares.append(float(w[b, h, i, p] * v[b, h, p].norm()
                                     / sum(w[b, h, i, j] * v[b, h, j].norm() for j in range(T))))
            cos = lambda a, c: float(a @ c / (a.norm() * c.norm()))  # noqa: E731
            cs = [cos(q[b, h, i], k[b, h, p]) for i in rows if i != p]
            co = [cos(q[b, h, i], k[b, h, j]) for i in range(T) for j in range(T)
                  if j != p and (j <= i or not causal)]
            assert got["attention_share"][b, h] == pytest.approx(att, abs=1e-6)
            assert got["output_share"][b, h] == pytest.approx(sum(outs) / len(outs), abs=1e-6)
            assert got["value_norm_share"][b, h] == pytest.approx(sum(nshares) / len(nshares), abs=1e-6)
            assert got["cos_sink"][b, h] == pytest.approx(sum(cs) / len(cs), abs=1e-9)
            assert got["cos_other"][b, h] == pytest.approx(sum(co) / len(co), abs=1e-9)


def test_head_statistics_under_a_sliding_window_count_only_the_visible_pairs():
    """With the layer's own mask (a window of 3 here, as the hook context gives it), the queries that
    "see p" and the "visible pairs" are those of the window: naive loops over the window rule. Before, the
    causal triangle was used whatever the window (cos_other changed sign on a Mistral head; outside audit,
    2026-12-07)."""
    g = torch.Generator().manual_seed(1)
    B, H, T, D, p, W = 2, 3, 9, 4, 1, 3
    seen = torch.tensor([[0 <= i - j < W for j in range(T)] for i in range(T)])
    w = torch.randn(B, H, T, T, generator=g).masked_fill(~seen, float("-inf")).softmax(-1)
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    got = head_statistics(w, q, k, v, p, visible=seen[None, None])
    w, q, k, v = w.double(), q.double(), k.double(), v.double()
    cos = lambda a, c: float(a @ c / (a.norm() * c.norm()))  # noqa: E731
    for b in range(B):
        for h in range(H):
            rows = [i for i in range(T) if seen[i, p]]
            assert rows == [1, 2, 3]
            att = sum(float(w[b, h, i, p]) for i in rows) / len(rows)
            nsh = [float(w[b, h, i, p] * v[b, h, p].norm() / sum(w[b, h, i, j] * v[b, h, j].norm() for j in range(T)))
                   for i in rows]
            cs = [cos(q[b, h, i], k[b, h, p]) for i in rows if i != p]
            co = [cos(q[b, h, i], k[b, h, j]) for i in range(T) for j in range(T) if j != p and seen[i, j]]
            assert got["attention_share"][b, h] == pytest.approx(att, abs=1e-6)
            assert got["value_norm_share"][b, h] == pytest.approx(sum(nsh) / len(nsh), abs=1e-6)
            assert got["cos_sink"][b, h] == pytest.approx(sum(cs) / len(cs), abs=1e-9)
            assert got["cos_other"][b, h] == pytest.approx(sum(co) / len(co), abs=1e-9)


def test_hook_context_mask_is_the_layers_own_mask():
    """At attn.weights the hook context's ``mask`` is what the layer applied: Mistral's sliding window (a
    transformers model; the weights are 0 exactly outside it) and a sinklab model's window and prefix."""
    from transformers import MistralConfig, MistralForCausalLM

    from sinklab.attention_masks import MaskSpec, build_mask
    from sinklab.hooks import Hook, hooked

    torch.manual_seed(0)
    T, W = 12, 4
    hf = MistralForCausalLM(MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, sliding_window=W)).eval()
    seen = []
    with torch.no_grad(), hooked(hf, Hook("attn.weights", lambda w, ctx: seen.append((w, ctx.mask)))):
        hf(_ids(2, T))
    rule = torch.tensor([[0 <= i - j < W for j in range(T)] for i in range(T)])
    assert len(seen) == 2
    for w, mask in seen:
        assert torch.equal(mask.expand(2, 4, T, T), rule.expand(2, 4, T, T))
        assert bool((w[..., ~rule] == 0).all())
    sl = _sinklm(sliding_window=3)
    got = []
    from sinklab.capture.native import native_hooks

    with torch.no_grad(), native_hooks(sl, [Hook("attn.weights", lambda w, ctx: got.append(ctx.mask))]):
        sl(_ids(2, 10), prefix_len=4)
    assert len(got) == 2
    want = build_mask(10, 10, MaskSpec(prefix_len=4, window=3))
    for mask in got:
        assert torch.equal(mask, want)


def test_keybias_on_a_hybrid_numbers_its_attention_blocks():
    """keybias on Jamba (attention in blocks 1 and 3) raised IndexError (block 0 has no attention; outside
    audit, 2026-12-07); its rows carry the block numbers, as measure's tables do."""
    from test_hybrid import tiny_jamba

    res = keybias(Subject(tiny_jamba(), _ids(3, 12), model_info={"name": "tiny"}), eps=0.05, long_seq_len=None,
                  position=0)
    assert sorted(set(res.tables["heads"]["layer"])) == [1, 3]


def test_keybias_shares_of_a_real_llama_layer_match_a_manual_recomputation():
    """Layer 0 of a tiny LLaMA: q, k, v recomputed from the weights (RMSNorm, projections, RoPE), weights from
    eager output_attentions; the seam's per-head statistics must agree."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    m = tiny_llama()
    ids = _ids(2, 9)
    res = keybias(Subject(m, ids, model_info={"name": "tiny"}), eps=0.05, long_seq_len=None)
    heads = res.tables["heads"]
    m.set_attn_implementation("eager")
    with torch.no_grad():
        out = m(ids, output_attentions=True, output_hidden_states=True)
        attn = m.model.layers[0].self_attn
        x = m.model.layers[0].input_layernorm(out.hidden_states[0])
        B, T, _ = x.shape
        q = attn.q_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(B, T, -1, attn.head_dim).transpose(1, 2)
        cos, sin = m.model.rotary_emb(x, torch.arange(T)[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    ref = head_statistics(out.attentions[0], q, k, v, res.summary["sink_position"])
    for h in range(q.shape[1]):
        row = heads[(heads.layer == 0) & (heads["head"] == h)].iloc[0]
        for name in ("attention_share", "output_share", "value_norm_share", "cos_sink", "cos_other"):
            assert row[name] == pytest.approx(float(ref[name][:, h].mean()), abs=1e-5), name


def test_detection_precision_recall_hand_worked():
    scores = torch.tensor([[5.0, 1.0, 4.0, 0.0], [0.0, 3.0, 2.0, 1.0]])
    truth = torch.tensor([[True, False, False, True], [False, False, False, False]])
    # sample 0: top-2 = {0, 2}, one hit of 2 true; sample 1: no true sink (precision 0, not in recall)
    assert detection(scores, truth, 2) == (pytest.approx((0.5 + 0.0) / 2), pytest.approx(0.5))
    assert detection(scores, truth, 1) == (pytest.approx(0.5), pytest.approx(0.5))


def test_top_activations_finds_a_planted_entry_and_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 3, 5, 7, generator=g)
    h[1, 2, 4, 6] = -1000.0
    got = top_activations(h, 3)
    assert int(got["position"][1, 2, 0]) == 4 and int(got["dim"][1, 2, 0]) == 6
    assert float(got["values"][1, 2, 0]) == 1000.0
    for n in range(2):
        for l in range(3):
            cells = sorted(((abs(float(h[n, l, t, d])), t, d) for t in range(5) for d in range(7)), reverse=True)
            for i in range(3):
                assert float(got["values"][n, l, i]) == pytest.approx(cells[i][0])
                assert (int(got["position"][n, l, i]), int(got["dim"][n, l, i])) == cells[i][1:]
            mags = sorted(c[0] for c in cells)
            assert float(got["median"][n, l]) == pytest.approx(mags[(len(mags) - 1) // 2])


def test_massive_finds_a_planted_activation_in_a_model():
    """A token whose embedding holds 500 in dimension 3: the residual stream carries it to every layer."""
    m = _sinklm(positional="nope")
    with torch.no_grad():
        m.embed.weight[7, 3] = 500.0
    ids = _ids(4, 10, vocab=7)  # ids < 7, then token 7 planted at position 5
    ids[:, 5] = 7
    res = massive(Subject(m, ids, model_info={"name": "planted"}), eps=0.05)
    layers = res.tables["layers"]
    assert (layers["top1_dim"] == 3).all() and (layers["top1_position"] == 5).all()
    assert (layers["top1_dim_share"] == 1.0).all()
    assert res.summary["recurring_dims"][0]["dim"] == 3
    assert res.summary["max_ratio"] > 100


def test_sensitivity_and_cosine_match_loops():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 3, 6, 4, generator=g), torch.randn(2, 3, 6, 4, generator=g)
    s = 2
    got = sensitivity(a, b, s)
    cos = cosine_to_first(a, 1)
    for l in range(3):
        for k in range(6 - s):
            ref = sum(float((b[n, l, s + k] - a[n, l, s + k]).double().norm() / a[n, l, s + k].double().norm())
                      for n in range(2)) / 2
            assert float(got[l, k]) == pytest.approx(ref)
        for n in range(2):
            for i in range(5):
                x, y = a[n, l, 1 + i].double(), a[n, l, 0].double()
                assert float(cos[n, l, i]) == pytest.approx(float(x @ y / (x.norm() * y.norm())))


# ------------------------------------------------------------------ interventions
def test_remove_key_matches_a_loop_and_leaves_untouched_rows_bit_identical():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1, 2, 5, 5, generator=g).masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    w[0, 1, 3] = torch.tensor([0.0, 0.5, 0.25, 0.25, 0.0])  # a row that gives key 0 nothing
    new = remove_key(w, 0)
    for h in range(2):
        for i in range(5):
            row = w[0, h, i].double()
            if i == 0 or row[0] == 0:  # all weight on key 0, or none: unchanged, bit for bit
                assert torch.equal(new[0, h, i], w[0, h, i])
                continue
            ref = row.clone()
            ref[0] = 0
            ref = ref / ref.sum() * row.sum()
            assert torch.allclose(new[0, h, i].double(), ref, atol=1e-6)
    # a key nobody attends to: removing it changes nothing at all
    w2 = w.clone()
    w2[..., 2] = 0
    assert torch.equal(remove_key(w2, 2), w2)
    with pytest.raises(InputError):
        remove_key(w, 5)


def test_remove_key_renormalises_rows_that_are_almost_all_sink():
    """A strong sink leaves the rest of a row tiny: ``total - removed`` in float32 cancelled, leaving such rows
    unedited (rest 0) or 10% off (outside audit, 2026-12-07, on a trained prefix model). The rest is summed directly
    now: each row equals the float64 renormalisation of its other weights."""
    g = torch.Generator().manual_seed(1)
    T = 16
    tail = torch.rand(2, 3, T, T - 1, generator=g, dtype=torch.float64) * 1e-6  # the other keys' tiny weights
    w64 = torch.cat([1.0 - tail.sum(-1, keepdim=True), tail], dim=-1)  # rows of 1, key 0 holding nearly all
    w = w64.float()
    new = remove_key(w, 0).double()
    others = w.double().clone()
    others[..., 0] = 0
    ref = others / others.sum(-1, keepdim=True) * w.double().sum(-1, keepdim=True)
    assert bool((new[..., 0] == 0).all())
    torch.testing.assert_close(new, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("which", ["llama", "sinklm"])
def test_noop_intervention_is_bit_identical(which):
    """noop equals baseline exactly; remove-sink, through the same path, does not, and its loss equals one
    computed without the seam (the seam's edit on a naive float64 attention for the one-layer SinkLM, a
    forward without token 0 under RoPE for LLaMA): a path that dropped the edits would fail."""
    m = tiny_llama() if which == "llama" else _sinklm(n_layers=1, positional="learned")
    ids = _ids(3, 10)
    res = intervene(Subject(m, ids, model_info={"name": which}), eps=0.05, position=0, allow_non_sink=True,
                    only=["noop", "remove-sink"] + (["position-replace"] if which == "sinklm" else []), swap_to=3)
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["noop", "loss"] == t.loc["baseline", "loss"]  # exact
    assert t.loc["noop", "sink_rate_pos0"] == t.loc["baseline", "sink_rate_pos0"]
    assert t.loc["remove-sink", "loss"] != t.loc["baseline", "loss"]
    if which == "llama":
        with torch.no_grad():
            logp = m(ids[:, 1:]).logits.double().log_softmax(-1)
        want = float(-logp[:, :-1].gather(-1, ids[:, 2:, None]).squeeze(-1).mean())  # targets 2..T-1
    else:
        want = float(_manual_remove_first_key_nll(m, ids)[:, 1:].mean())
    assert t.loc["remove-sink", "loss"] == pytest.approx(want, abs=1e-5)


def test_noop_edit_gives_identical_hidden_states_and_loss_on_both_seams():
    """The identity edits change nothing, bit for bit; and the same seams do apply a real edit (a seam that
    ignored its edits would pass the first half), checked against computations that bypass the seam:

    * attention edit: removing key 0 in every layer equals, under RoPE, a plain forward without token 0
      (scores depend only on i - j), so the NLL of targets 2..T-1 is that forward's;
    * block-output edit: zeroing the last block's output at position 3 gives the head a zero vector there
      (RMSNorm(0) = 0, no head bias): logits 0, so the NLL of target 4 is log(vocab), and no other changes."""
    for m in (tiny_llama(), _sinklm()):
        ids = _ids(2, 8)
        a = run_model(m, ids, hidden=True, nll=True)
        b = run_model(m, ids, hidden=True, nll=True, edit=lambda l, w, **_: w, hidden_edit=lambda l, h: None)
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.nll, b.nll)

        cut = run_model(m, ids, hidden=True, nll=True, edit=lambda l, w, **_: remove_key(w, 0))
        with torch.no_grad():
            logp = m(ids[:, 1:]).logits.double().log_softmax(-1)  # no seam, no edit: token 0 simply absent
        dropped = -logp[:, :-1].gather(-1, ids[:, 2:, None]).squeeze(-1)  # (N, T-2): targets 2..T-1
        assert not torch.equal(cut.nll, a.nll)
        assert torch.allclose(cut.nll[:, 1:], dropped, atol=1e-5)

        last = a.hidden.shape[1] - 1

        def zero_pos3(layer, h):
            if layer != last:
                return None
            h = h.clone()
            h[:, 3] = 0
            return h

        z = run_model(m, ids, hidden=True, nll=True, hidden_edit=zero_pos3)
        vocab = m.config.vocab_size
        assert torch.allclose(z.nll[:, 3], torch.full((2,), math.log(vocab), dtype=z.nll.dtype), atol=1e-6)
        keep = [t for t in range(z.nll.shape[1]) if t != 3]
        assert torch.equal(z.nll[:, keep], a.nll[:, keep]) and not torch.equal(z.nll, a.nll)


def test_removing_the_first_key_everywhere_equals_dropping_the_first_token_under_rope():
    """With RoPE, scores depend only on relative positions: removing attention to position 0 in every
    layer leaves the other tokens exactly as if token 0 were not there (two independent paths)."""
    res = intervene(Subject(tiny_llama(), _ids(3, 10), model_info={"name": "t"}), eps=0.01,
                    only=["remove-sink", "drop-first"], position=0)
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["remove-sink", "loss"] == pytest.approx(t.loc["drop-first", "loss"], abs=1e-5)
    assert t.loc["remove-sink", "loss"] != t.loc["baseline", "loss"]


def test_drop_first_reports_the_sink_position_of_the_window():
    """drop-first feeds the window without token 0: its sink_rate_sink was read at the shortened sequence's
    position p, the window's p + 1 (for p = 0 the rate of token 1, which is also its sink_rate_pos0). It is the
    window's position p now: NaN for p = 0 (the token dropped), the shortened sequence's p - 1 otherwise, as in
    the variant's own mass table (window positions)."""
    subj = Subject(tiny_llama(), _ids(3, 10), model_info={"name": "t"})
    for p in (0, 5):  # eps 0.15: the window's positions 5 and 6 have rates 12.5% and 0% here
        res = intervene(subj, eps=0.15, only=["drop-first"], position=p, allow_non_sink=True)
        row = res.tables["interventions"].set_index("intervention").loc["drop-first"]
        mass = res.tables["mass"]
        at_p = mass[(mass["intervention"] == "drop-first") & (mass["position"] == p)]["sink_rate"]
        if p == 0:
            assert math.isnan(row["sink_rate_sink"]) and at_p.empty  # position 0 is not in the sequence fed
        else:
            assert row["sink_rate_sink"] == pytest.approx(float(at_p.iloc[0]))
        first = mass[(mass["intervention"] == "drop-first") & (mass["position"] == 1)]["sink_rate"]
        assert row["sink_rate_pos0"] == pytest.approx(float(first.iloc[0]))  # the token fed first: window's 1


def _manual_remove_first_key_nll(m, ids):
    """(N, T-1) next-token NLL of a one-layer SinkLM with learned positions, computed by hand in float64 from
    its weights with attention to key 0 removed (rows renormalised; query 0 keeps its only key)."""
    T = ids.shape[1]
    with torch.no_grad():
        x = m.embed(ids) + m.positional.table.weight[:T]
        blk = m.layers[0]
        a = blk.attn
        h = blk.attn_norm(x)
        B, T, _ = h.shape
        q = a.q_proj(h).view(B, T, 2, 8).transpose(1, 2).double()
        k = a.k_proj(h).view(B, T, 2, 8).transpose(1, 2).double()
        v = a.v_proj(h).view(B, T, 2, 8).transpose(1, 2).double()
        s = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        w = s.softmax(-1)
        w[:, :, 1:, 0] = 0
        w = w / w.sum(-1, keepdim=True)
        y = (w @ v).transpose(1, 2).reshape(B, T, 16).float()
        x = x + a.o_proj(y)
        x = x + blk.ffn(blk.ffn_norm(x))
        logits = m.lm_head(m.final_norm(x)).double()
        return -logits.log_softmax(-1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_remove_sink_through_the_observer_matches_a_manual_forward():
    """SinkLM: the edited pass equals one computed by hand from the same weights (1 layer, so the
    attention input is the embedding)."""
    m = _sinklm(n_layers=1, positional="learned")
    ids = _ids(2, 6)
    res = run_model(m, ids, nll=True, edit=lambda l, w, **_: remove_key(w, 0))
    assert torch.allclose(res.nll, _manual_remove_first_key_nll(m, ids), atol=1e-5)


def _planted_sink_model():
    """1 layer, learned positions, every query aligned with a large key built from position 0's embedding."""
    m = _sinklm(n_layers=1, positional="learned", d_model=16, n_heads=2)
    with torch.no_grad():
        m.embed.weight.normal_(0, 0.02)
        m.embed.weight[:, 1] = 1.0
        m.positional.table.weight.zero_()
        m.positional.table.weight[0, 0] = 10.0
        a = m.layers[0].attn
        a.q_proj.weight.zero_()
        a.k_proj.weight.zero_()
        for h in range(2):
            a.q_proj.weight[h * 8, 1] = 5.0
            a.k_proj.weight[h * 8, 0] = 5.0
    return m


def test_position_swap_moves_a_planted_sink():
    m = _planted_sink_model()
    res = intervene(Subject(m, _ids(3, 10), model_info={"name": "planted"}), only=["position-swap"], swap_to=2)
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["baseline", "sink_rate_pos0"] == 100.0 and t.loc["baseline", "sink_rate_swap_to"] == 0.0
    assert t.loc["position-swap", "sink_rate_pos0"] == 0.0 and t.loc["position-swap", "sink_rate_swap_to"] == 100.0
    assert torch.equal(m.positional.table.weight[0, 0], torch.tensor(10.0))  # restored


def test_massive_ablation_edits_only_the_named_cells():
    """massive-zero at layer 0, dims 3 and 5 of position 0: the edited pass' layer-0 output is the plain
    one with exactly those cells zeroed, and the change reaches layer 1 and the loss."""
    from sinklab.analyze.intervene import _massive_target

    m = _sinklm()
    ids = _ids(2, 8)
    base = run_model(m, ids, hidden=True, nll=True)
    res = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, only=["massive-zero"], dims=[3, 5],
                    massive_layer=0, position=0)
    assert res.summary["massive_dims"] == [3, 5] and res.summary["massive_layer"] == 0

    def zero(layer, h):
        if layer != 0:
            return None
        h = h.clone()
        h[:, 0, [3, 5]] = 0
        return h

    edited = run_model(m, ids, hidden=True, nll=True, hidden_edit=zero)
    want = base.hidden[:, 0].clone()
    want[:, 0, [3, 5]] = 0
    assert torch.equal(edited.hidden[:, 0], want)
    assert not torch.equal(edited.hidden[:, 1], base.hidden[:, 1])
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["massive-zero", "loss"] == pytest.approx(float(edited.nll[:, 1:].mean()), abs=1e-12)
    # samplemean: the sink token's own mean over the samples, at that layer
    res2 = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, only=["massive-samplemean"], dims=[3, 5],
                     massive_layer=0, position=0)

    def to_mean(layer, h):
        if layer != 0:
            return None
        h = h.clone()
        h[:, 0, [3, 5]] = base.hidden[:, 0, 0][:, [3, 5]].mean(dim=0)
        return h

    ref = run_model(m, ids, nll=True, hidden_edit=to_mean)
    t2 = res2.tables["interventions"].set_index("intervention")
    assert t2.loc["massive-samplemean", "loss"] == pytest.approx(float(ref.nll[:, 1:].mean()), abs=1e-12)
    # default target on a planted activation: the layer where it appears, its dimension
    h = torch.rand(3, 4, 6, 8)
    h[:, 2:, 0, 5] = 1000.0
    assert _massive_target(h, 0, None, None, 4) == (2, [5])
    with pytest.raises(InputError, match="out of range"):
        _massive_target(h, 0, 9, None, 4)


# ------------------------------------------------------------------ repeat, overmix
def test_repeat_cosine_is_one_without_positions():
    """NoPE, one token repeated from position 0: every position computes the same thing, cos = 1."""
    m = _sinklm(positional="nope")
    res = repeat(Subject(m, _ids(2, 8), model_info={"name": "t"}), prompt_len=0, counts=[4, 8], eps=0.05)
    cos = res.tables["cosine"]
    assert ((cos["mean_cos_to_first"] - 1).abs() < 1e-5).all()


def test_repeat_cosine_matches_the_models_own_hidden_states():
    m = _sinklm(positional="learned")
    ids = _ids(2, 8)
    res = repeat(Subject(m, ids, model_info={"name": "t"}), prompt_len=3, counts=[5], token=11, eps=0.05)
    seq = torch.cat([ids[:, :3], torch.full((2, 5), 11)], dim=1)
    with torch.no_grad():
        hs = m(seq, output_hidden_states=True).hidden_states[1:]
    for l, h in enumerate(hs):
        h = h.double()
        ref = sum(float(F.cosine_similarity(h[n, 3 + i], h[n, 0], dim=0)) for n in range(2) for i in range(5)) / 10
        row = res.tables["cosine"].query("layer == @l").iloc[0]
        assert row["mean_cos_to_first"] == pytest.approx(ref, abs=1e-6)


def test_overmix_is_causal_and_zero_without_a_perturbation():
    m = _sinklm()
    ids = _ids(2, 10)
    base = run_model(m, ids, hidden=True)
    d = torch.zeros(2, 10, 16)
    assert torch.equal(run_model(m, ids, hidden=True, embed_delta=d).hidden, base.hidden)
    d[:, 4] = 0.1
    pert = run_model(m, ids, hidden=True, embed_delta=d).hidden
    assert torch.equal(pert[:, :, :4], base.hidden[:, :, :4])  # earlier tokens never see token 4
    res = overmix(Subject(m, ids, model_info={"name": "t"}), eps=0.05, sources=[4, 6], directions=2)
    t = res.tables["sensitivity"]
    assert set(t["condition"]) == {"sink intact", "sink removed"}
    assert (t["sensitivity"] > 0).all()


# ------------------------------------------------------------------ bad input
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, text_corpus_dir, capsys):
    base = ["analyze", "intervene", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir),
            "--num-samples", "2", "--seq-len", "8"]
    cases = [
        (base + ["--only", "position-swap"], "RoPE"),
        (base + ["--layers", "7"], "layer 7 is out of range"),
        (base + ["--only", "massive-zero", "--dims", "999"], "dimension 999 is out of range"),
        (base + ["--position", "3", "--eps", "0.9"], "never a sink"),
        (base + ["--sources", "3"], "does not apply"),
        (base + ["--only", "replace-first", "--token", "999999"], "outside the vocabulary"),
        (["analyze", "nonsense"], "unknown analysis"),
    ]
    for argv, words in cases:
        code, out, err = run_cli_captured(argv, capsys)
        assert code == 2, (argv, err)
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_cli_writes_json_csv_png(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    import json

    import pandas as pd

    out = tmp_path / "m"
    code, _, err = run_cli_captured(["analyze", "massive", "--model", str(tiny_model_dir), "--corpus",
                                     str(text_corpus_dir), "-n", "2", "-t", "8", "--out", str(out)], capsys)
    assert code == 0, err
    data = json.loads((out / "analysis.json").read_text())
    assert data["kind"] == "massive" and "versions" in data and data["command"].startswith("sinklab analyze")
    layers = pd.read_csv(out / "layers.csv")
    assert len(layers) == 2 and layers["ratio"].tolist() == pytest.approx(data["tables"]["layers"]["ratio"])
    assert (out / "massive.png").stat().st_size > 0


def test_swap_to_past_the_sequence_is_refused():
    m = _sinklm(positional="learned")
    with pytest.raises(InputError, match="^swap_to=20 is outside the sequence"):
        intervene(Subject(m, _ids(2, 10), model_info={"name": "t"}), eps=0.05, only=["position-swap"], swap_to=20)


def test_cli_prints_the_headlines_and_warnings(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    args = ["--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-n", "2", "-t", "8"]
    code, out, err = run_cli_captured(["analyze", "massive", *args, "--out", str(tmp_path / "m")], capsys)
    assert code == 0, err
    assert "warning: no massive activation" in out and "\nlayers:\n" in out  # random weights: nothing massive
    code, out, err = run_cli_captured(["analyze", "overmix", *args, "--sources", "3", "--directions", "1",
                                       "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    assert "last_layer_mean_sensitivity_distance_ge1: sink intact=" in out and "sink removed=" in out
    assert "last_layer_verdict:" in out


# ------------------------------------------------------------------ review additions
def test_massive_layer_table_matches_a_naive_computation():
    m = _sinklm(positional="learned")
    ids = _ids(3, 10)
    res = massive(Subject(m, ids, model_info={"name": "t"}), eps=0.05)
    hidden = run_model(m, ids, hidden=True).hidden.double()  # (N, L, T, d)
    layers = res.tables["layers"]
    for l in range(hidden.shape[1]):
        tops, meds, ratios = [], [], []
        for n in range(hidden.shape[0]):
            mags = sorted(abs(float(x)) for x in hidden[n, l].flatten())
            tops.append(mags[-1])
            meds.append(mags[(len(mags) - 1) // 2])
            ratios.append(mags[-1] / meds[-1])
        row = layers.iloc[l]
        assert row["top1"] == pytest.approx(sum(tops) / len(tops))
        assert row["median"] == pytest.approx(sum(meds) / len(meds))
        assert row["ratio"] == pytest.approx(sorted(ratios)[(len(ratios) - 1) // 2])  # median of per-sample ratios


def test_massive_mean_ablation_matches_a_loop():
    m = _sinklm()
    ids = _ids(2, 8)
    res = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, only=["massive-mean"], dims=[2, 9],
                    massive_layer=0, position=0)

    def by_loop(layer, h):
        if layer != 0:
            return None
        h = h.clone()
        for n in range(h.shape[0]):
            for d in (2, 9):
                h[n, 0, d] = sum(float(h[n, t, d]) for t in range(1, h.shape[1])) / (h.shape[1] - 1)
        return h

    ref = run_model(m, ids, nll=True, hidden_edit=by_loop)
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["massive-mean", "loss"] == pytest.approx(float(ref.nll[:, 1:].mean()), abs=1e-6)
    assert t.loc["massive-mean", "loss"] != t.loc["baseline", "loss"]


def test_removing_attention_to_a_position_that_receives_none_changes_nothing():
    """Planted model whose key at position 2 scores far below key 0 for every query: its weights underflow to 0,
    so removing it (end to end, through the seam) leaves the loss and every hidden state bit-identical."""
    m = _planted_sink_model()
    with torch.no_grad():
        m.positional.table.weight[2, 0] = -10.0  # key 2 points away from every query ...
        m.positional.table.weight[2, 1] = 10.0  # ... and query 2 keeps a large norm, so it too ignores key 2
    ids = _ids(3, 10)
    captured = []
    base = run_model(m, ids, nll=True, hidden=True, edit=lambda l, w, **_: captured.append(w.clone()))
    assert all(float(w[..., 2].abs().max()) == 0.0 for w in captured)
    cut = run_model(m, ids, nll=True, hidden=True, edit=lambda l, w, **_: remove_key(w, 2))
    assert torch.equal(cut.nll, base.nll) and torch.equal(cut.hidden, base.hidden)
    live = _sinklm(n_layers=1, positional="learned")  # the same edit where key 2 gets weight: the loss moves
    assert not torch.equal(run_model(live, ids, nll=True, edit=lambda l, w, **_: remove_key(w, 2)).nll,
                           run_model(live, ids, nll=True).nll)


def test_intervene_reports_where_the_sink_goes():
    """remove-sink on position 0: the top sink position and rate after the change equal those of a pass
    edited by hand, and the sink has moved off position 0."""
    from sinklab.metrics import sink_rate

    m = tiny_llama()
    ids = _ids(3, 30)
    res = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, only=["remove-sink"], position=0)
    row = res.tables["interventions"].set_index("intervention").loc["remove-sink"]
    r = sink_rate(run_model(m, ids, edit=lambda l, w, **_: remove_key(w, 0)).stats.mass, 0.05)[:27]  # 90% rankable
    assert row["top_sink_position_after"] == int(r.argmax()) != 0
    assert row["top_sink_rate_after"] == pytest.approx(float(r.max())) and row["top_sink_rate_after"] > 0


def test_edit_outside_the_readout_warns_and_changes_nothing():
    m = _sinklm(n_layers=2)
    res = intervene(Subject(m, _ids(2, 8), model_info={"name": "t"}), eps=0.05, only=["massive-zero"],
                    dims=[1], massive_layer=1, position=0)
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["massive-zero", "loss_change"] == 0.0
    text = " ".join(res.summary["warnings"])
    assert "outside the readout" in text and "no massive activation" in text


def test_analysis_json_is_strict_json_and_marks_python_calls(tmp_path):
    import json

    res = intervene(Subject(_sinklm(positional="learned"), _ids(2, 8), model_info={"name": "t"}), eps=0.05,
                    only=["noop", "position-swap"], swap_to=3)
    assert res.tables["interventions"]["sink_rate_swap_to"].isna().any()  # NaN cells exist
    res.save(tmp_path)

    def refuse(c):
        raise AssertionError(f"bare {c} in analysis.json")

    data = json.loads((tmp_path / "analysis.json").read_text(), parse_constant=refuse)
    assert None in data["tables"]["interventions"]["sink_rate_swap_to"]
    assert data["command"].startswith("python: sinklab.analyze.intervene(Subject(<model object 't'")


def test_overmix_is_paired_and_matches_a_manual_pair():
    """One source, one direction: both conditions use the same direction (drawn as overmix draws it)."""
    m = _sinklm()
    ids = _ids(2, 10)
    res = overmix(Subject(m, ids, model_info={"name": "t"}), eps=0.05, sources=[4], directions=1, scale=0.05)
    e = m.embed(ids).detach().float()
    u = torch.randn(2, 16, generator=torch.Generator().manual_seed(0))
    u = u / u.norm(dim=-1, keepdim=True)
    delta = torch.zeros_like(e)
    delta[:, 4] = 0.05 * e[:, 4].norm(dim=-1, keepdim=True) * u
    pos = res.summary["sink_position"]
    per = res.tables["per_layer"]
    for col, edit in (("intact", None), ("removed", lambda l, w, **_: remove_key(w, pos))):
        ref = run_model(m, ids, edit=edit, hidden=True).hidden
        pert = run_model(m, ids, edit=edit, hidden=True, embed_delta=delta).hidden
        want = sensitivity(ref, pert, 4)[:, 1:].mean(dim=1)  # (L,)
        assert per[col].tolist() == pytest.approx(want.tolist(), rel=1e-9)
    assert (per["pairs"] == 1).all()


def test_sign_test_hand_worked():
    from sinklab.analyze.common import sign_test_p

    assert sign_test_p(2, 2) == 0.5 and sign_test_p(0, 2) == 0.5  # two unanimous pairs: p = 2 / 4
    assert sign_test_p(6, 6) == pytest.approx(2 / 64) and sign_test_p(5, 5) == pytest.approx(2 / 32)
    assert sign_test_p(6, 9) == pytest.approx(2 * (1 + 9 + 36 + 84) / 512)  # 0.508
    assert sign_test_p(8, 10) == pytest.approx(2 * (45 + 10 + 1) / 1024)
    assert sign_test_p(5, 10) == 1.0 and sign_test_p(0, 0) == 1.0


def test_overmix_verdict_states_the_count_and_that_two_pairs_are_too_few():
    """issue 21, item 8: 2 pairs used to give "in every (source, direction) pair"; the verdict now gives the
    count, the sign test's p and says that fewer than 6 pairs cannot conclude; 6 unanimous pairs can."""
    res = overmix(Subject(_sinklm(), _ids(2, 10), model_info={"name": "t"}), eps=0.05, sources=[4], directions=2,
                  scale=0.05)
    v = res.summary["last_layer_verdict"]
    over = res.summary["last_layer_relative_change_over_pairs"]
    assert over["pairs"] == 2 and v.startswith("too few pairs to conclude: removing the sink ")
    assert " of 2 (source, direction) pairs" in v and "every" not in v
    assert over["sign_test_p"] == (0.5 if over["pairs_removed_higher"] in (0, 2) else 1.0)
    from sinklab.analyze.overmix import pair_verdict

    assert pair_verdict(6, 6) == ("removing the sink increases sensitivity in all 6 of 6 (source, direction) pairs "
                                  "(two-sided sign test p = 0.0312)")
    assert pair_verdict(0, 7).startswith("removing the sink decreases sensitivity in all 7 of 7")
    assert pair_verdict(6, 9).startswith("inconclusive: removing the sink increases sensitivity in 6 of 9 ")


def test_repeat_natural_control_is_the_sink_rate_of_prefixes():
    from sinklab.metrics import sink_rate

    m = _sinklm(positional="learned")
    ids = _ids(3, 12)
    res = repeat(Subject(m, ids, model_info={"name": "t"}), prompt_len=3, counts=[2, 9, 12], eps=0.05)
    sr = res.tables["sink_rate"].set_index("repeats")
    for n in (2, 9):
        want = float(sink_rate(run_model(m, ids[:, : 3 + n]).stats.mass, 0.05)[0])
        assert sr.loc[n, "sink_rate_pos0_natural_same_len"] == pytest.approx(want)
    assert math.isnan(sr.loc[12, "sink_rate_pos0_natural_same_len"])  # 15 > T = 12, no corpus


# ------------------------------------------------------------------ real models (cached weights)
@pytest.mark.network
def test_smollm2_interventions_and_minilm_swap(real_home):
    """SmolLM2: the no-op edit is bit-identical, removing position 0 everywhere equals dropping the first
    token (RoPE), zeroing the massive dimensions hurts far more than removing the sink. MiniLM (learned
    positions): swapping positions 0 and 4 moves sink rate from position 0 to position 4."""
    res = intervene("smollm2-135m", num_samples=4, seq_len=32,
                    only=["noop", "remove-sink", "drop-first", "massive-zero"])
    t = res.tables["interventions"].set_index("intervention")
    assert t.loc["noop", "loss"] == t.loc["baseline", "loss"]
    assert t.loc["remove-sink", "loss"] == pytest.approx(t.loc["drop-first", "loss"], abs=1e-3)
    assert t.loc["massive-zero", "loss_change"] > 10 * t.loc["remove-sink", "loss_change"] > 0
    enc = intervene("minilm-l6", num_samples=8, seq_len=64, only=["position-swap"], swap_to=4)
    e = enc.tables["interventions"].set_index("intervention")
    assert e.loc["position-swap", "sink_rate_pos0"] < e.loc["baseline", "sink_rate_pos0"] / 2
    assert e.loc["position-swap", "sink_rate_swap_to"] > e.loc["baseline", "sink_rate_swap_to"] + 5


def test_intervene_plot_shows_where_the_sink_and_the_mass_went(monkeypatch):
    """issue 21, item 8: remove-sink used to look as if the sink vanished (only position 0's rate was drawn).
    The ``mass`` table holds each variant's mean attention mass per key position, equal to a pass edited by
    hand; the plot draws the top position after the change (bar height = its rate, labelled pK) and one
    mass-by-position line per variant, read back from the figure."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    m = tiny_llama()
    ids = _ids(3, 30)
    res = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, only=["remove-sink"], position=0)
    t = res.tables["interventions"].set_index("intervention")
    mass = res.tables["mass"]
    cut = run_model(m, ids, edit=lambda l, w, **_: remove_key(w, 0)).stats.mass.mean(dim=(0, 1, 2))  # (T,)
    got = mass[mass.intervention == "remove-sink"].sort_values("position")
    assert got["position"].tolist() == list(range(30))
    assert got["attention_mass"].tolist() == pytest.approx(cut.tolist(), rel=1e-9)
    top = int(t.loc["remove-sink", "top_sink_position_after"])
    assert top != 0

    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    res.plots["intervene"]("unused.png")
    (fig,) = figures
    loss_ax, rate_ax, mass_ax = fig.axes[:3]
    labels = [txt.get_text() for txt in rate_ax.texts]
    assert labels == [f"p{int(t.loc[v, 'top_sink_position_after'])}" for v in ("baseline", "remove-sink")]
    heights = [p.get_height() for p in rate_ax.containers[-1]]
    assert heights == pytest.approx([t.loc["baseline", "top_sink_rate_after"], t.loc["remove-sink", "top_sink_rate_after"]])
    lines = {ln.get_label(): ln for ln in mass_ax.get_lines()}
    assert set(lines) == {"baseline", "remove-sink"}
    assert list(lines["remove-sink"].get_ydata()) == pytest.approx(cut[:16].tolist(), rel=1e-9)


def test_intervene_plot_draws_no_bar_where_the_table_has_no_value(monkeypatch):
    """On a model with learned positions the middle series is "Sink at position {swap_to}", which only the
    baseline and the position edits have (NaN for the other variants): those got 0% bars, so noop, identical to the
    baseline, looked as if it had lost its sink (outside audit, 2026-12-07). Now the bars are exactly the table's
    values and every missing one is marked "n/a"."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from helpers import tiny_gpt2

    ids = torch.randint(0, 80, (3, 10), generator=torch.Generator().manual_seed(0))
    res = intervene(Subject(tiny_gpt2(), ids, model_info={"name": "gpt2"}), eps=0.05, position=0,
                    allow_non_sink=True, swap_to=4)
    t = res.tables["interventions"]
    assert t["sink_rate_swap_to"].isna().any() and t["sink_rate_swap_to"].notna().any()
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    res.plots["intervene"]("unused.png")
    rate_ax = figures[0].axes[1]
    series = {c.get_label(): c for c in rate_ax.containers}
    middle = series["Sink at position 4"]
    want = t["sink_rate_swap_to"].dropna().tolist()
    assert [b.get_height() for b in middle] == pytest.approx(want)
    # every missing value is marked, and drop-first's position 0 (the window's own position 0 is the one dropped)
    assert sum(txt.get_text() == "n/a" for txt in rate_ax.texts) == int(t["sink_rate_swap_to"].isna().sum()) + int(
        (t["intervention"] == "drop-first").sum())


@pytest.mark.parametrize("kind", ["massive", "keybias", "intervene", "overmix", "repeat", "attention", "frames", "depth"])
def test_a_prefix_lm_run_is_refused_by_every_analysis(kind):
    """The analyses run a model plain causal and score every target; a prefix-LM run was trained with a
    bidirectional prefix (and its training loss leaves the prefix's targets out): every analysis gave another
    model's numbers (intervene's baseline was the plain-causal loss; outside audit, 2026-12-07). Refused in one
    line until they apply the prefix."""
    from sinklab import analyze

    subj = Subject(_sinklm(), _ids(2, 12), model_info={"name": "prefix-run", "prefix_len": 4})
    with pytest.raises(InputError, match=r"prefix LM \(train.prefix_len=4\)"):
        getattr(analyze, kind)(subj)


def test_the_sink_position_of_a_window_model_comes_from_the_mask_aware_mass():
    """Under a window the plain mass of key 0 cannot pass w / T: an analysis picked position 28 at 1.6% on a
    window-6 model whose mask-aware Sink_1 was 100% (outside audit, 2026-12-07). Hand-made masses: plain 0.1
    everywhere with 0.35 at position 5 in one head; mask-aware 0.9 at position 0 in every head."""
    from sinklab.analyze.common import sink_position
    from sinklab.capture.stats import ProbeStats

    N, L, H, T = 2, 2, 2, 12
    plain = torch.full((N, L, H, T), 0.1, dtype=torch.float64)
    plain[:, 0, 0, 5] = 0.35
    vis = plain.clone()
    vis[..., 0] = 0.9
    stats = ProbeStats(mass=plain, hidden_norms=torch.ones(N, L, T), max_abs=torch.ones(N, L),
                       median_abs=torch.ones(N, L), max_position=torch.zeros(N, L, dtype=torch.long),
                       max_channel=torch.zeros(N, L, dtype=torch.long), mass_visible=vis,
                       mask={"causal": True, "prefix_len": 0, "window": 3})
    assert sink_position(stats, 0.3) == (0, 100.0)
    assert sink_position(replace(stats, mass_visible=None), 0.3) == (5, 25.0)  # the plain mass, unmasked model


def test_position_swaps_edit_the_rows_an_offset_table_reads():
    """OPT's position p reads row p + 2 of its table (RoBERTa's p + padding_idx + 1): position-replace wrote row 0,
    which no position reads (the loss was exactly the baseline's), and position-swap moved position 1. The edits
    now land on the rows positions 0 and t read. Reference: the model fed its own embeddings with the position
    vectors exchanged by hand (inputs_embeds, OPT adding the table's rows p + 2 itself)."""
    import transformers

    torch.manual_seed(0)
    m = transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, word_embed_proj_dim=32)).double().eval()
    T, t = 12, 3
    x = torch.randint(3, 128, (4, T), generator=torch.Generator().manual_seed(0))
    tab = intervene(Subject(m, x, model_info={"name": "opt"}), eps=0.05, position=0, swap_to=t,
                    only=["noop", "position-replace", "position-swap"]).tables["interventions"].set_index("intervention")
    E, P = m.model.decoder.embed_tokens, m.model.decoder.embed_positions.weight

    def loss(rows):  # position p takes the vector of position rows[p] (table row rows[p] + 2)
        with torch.no_grad():
            lg = m(inputs_embeds=E(x) + (P[rows + 2] - P[torch.arange(T) + 2])[None]).logits
        nll = -torch.log_softmax(lg[:, :-1], -1).gather(-1, x[:, 1:, None])[..., 0]
        return nll[:, 1:].mean().item()  # the readout's targets: 0-based positions 2..T-1

    base = torch.arange(T)
    assert tab.loc["baseline", "loss"] == pytest.approx(loss(base), abs=1e-9)
    assert tab.loc["position-replace", "loss"] == pytest.approx(loss(torch.tensor([t, *range(1, T)])), abs=1e-9)
    swapped = base.clone()
    swapped[0], swapped[t] = t, 0
    assert tab.loc["position-swap", "loss"] == pytest.approx(loss(swapped), abs=1e-9)
    assert abs(tab.loc["position-replace", "loss"] - tab.loc["baseline", "loss"]) > 1e-4


def test_repeat_control_shares_the_prompt_when_it_needs_longer_windows(monkeypatch):
    """When prompt + the largest count exceed T the natural control comes from new, longer windows: the repeated
    sequences then take their prompt from those same windows, so at every n the two arms share their first
    prompt_len tokens (an audit found the control on other text than the repeat arm's prompt)."""
    import importlib

    rep = importlib.import_module("sinklab.analyze.repeat")  # the module (the package exports the function too)

    m = _sinklm(positional="learned")
    ids = _ids(3, 12)
    longer = _ids(3, 20, seed=7)
    subj = Subject(m, ids, model_info={"name": "t"}, documents=["a document"])  # documents: longer windows exist
    monkeypatch.setattr(Subject, "windows", lambda self, n, t, **kw: longer[:n, :t])
    seen = []
    run = rep.run_model

    def spy(model, seq, **kw):
        seen.append(seq.clone())
        return run(model, seq, **kw)

    monkeypatch.setattr(rep, "run_model", spy)
    res = rep.repeat(subj, prompt_len=3, counts=[2, 12], eps=0.05, token=5)
    repeated = [q for q in seen if q.shape[1] in (5, 15) and (q[:, 3:] == 5).all()]
    controls = [q for q in seen if q.shape[1] in (5, 15) and torch.equal(q, longer[:, : q.shape[1]])]
    assert len(repeated) == 2 and len(controls) == 2  # the control: the longer windows' prefixes
    for q in repeated:
        assert torch.equal(q[:, :3], longer[:, :3])  # the same prompt as the control
    sr = res.tables["sink_rate"].set_index("repeats")
    from sinklab.metrics import sink_rate

    for n in (2, 12):  # the control: the longer windows' prefixes of the same length
        want = float(sink_rate(run(m, longer[:, : 3 + n]).stats.mass, 0.05)[0])
        assert sr.loc[n, "sink_rate_pos0_natural_same_len"] == pytest.approx(want)


def test_keybias_summary_medians_are_lower_medians():
    """Every median in sinklab is the lower median (docs/concepts.md); keybias' summary took pandas' median, which
    averages the two middle values of an even count (an audit found 0.546991 where the lower median is 0.546821)."""
    res = keybias(Subject(tiny_llama(), _ids(2, 9), model_info={"name": "tiny"}), eps=0.05, long_seq_len=None)
    heads, s = res.tables["heads"], res.summary
    vals = sorted(heads["output_share"].tolist())
    assert len(vals) % 2 == 0 and vals[len(vals) // 2 - 1] != vals[len(vals) // 2]
    assert s["median_output_share_all_heads"] == pytest.approx(vals[(len(vals) - 1) // 2], rel=1e-12)
    sink = heads[heads["has_sink"]]
    if len(sink):
        v = sorted(sink["attention_share"].tolist())
        assert s["median_attention_share_sink_heads"] == pytest.approx(v[(len(v) - 1) // 2], rel=1e-12)


def test_intervene_plot_marks_drop_firsts_position_0_and_reaches_a_late_sink(monkeypatch):
    """The middle panel's positions are the full window's: drop-first has no window position 0 (its sequence's
    position 0 is the window's 1), so its "Sink at position 0" bar is n/a, not the rate at position 1; the mass
    panel reaches the sink and the top positions after the change when they lie past the first 16 positions (an
    audit found a sink at 21 left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import pandas as pd
    from matplotlib.figure import Figure

    from sinklab.analyze.intervene import _plot

    table = pd.DataFrame({
        "intervention": ["baseline", "remove-sink", "drop-first"], "loss": [3.0, 3.2, 3.1],
        "sink_rate_pos0": [10.0, 5.0, 80.0], "sink_rate_sink": [90.0, 0.0, 85.0],
        "top_sink_position_after": [21, 24, 20], "top_sink_rate_after": [90.0, 40.0, 85.0]})
    mass = pd.DataFrame([{"intervention": v, "position": j + (v == "drop-first"), "attention_mass": 0.01, "sink_rate": 0.0}
                         for v in table["intervention"] for j in range(30 - (v == "drop-first"))])
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figures.append(self))
    _plot("unused.png", table=table, mass_table=mass, lm=True, pos=21, swap_to=4, learned=False, T=30)
    rate_ax, mass_ax = figures[0].axes[1], figures[0].axes[2]
    pos0 = {c.get_label(): c for c in rate_ax.containers}["Sink at position 0"]
    assert [b.get_height() for b in pos0] == [10.0, 5.0]  # baseline and remove-sink only
    assert sum(t.get_text() == "n/a" for t in rate_ax.texts) == 1
    reach = [max(line.get_xdata()) for line in mass_ax.get_lines()]
    assert min(reach) >= 24  # past the sink (21) and remove-sink's new top position (24)


def test_an_identity_edit_keeps_a_negative_virtual_weight_of_a_non_normalised_custom_operation():
    """A custom non-normalised operation (identity similarity q.k / sqrt(d_h), no normaliser) with a learned
    virtual key and value: its virtual weight q.k* / sqrt(d_h) is negative for some queries. The observer sees
    the paper's proxy scores |w| / sum |w|; an edit that returns them unchanged must give back the output the
    model computes without a seam, the virtual value's share with its sign (it came back positive: the edit
    path rebuilt the virtual weight from its absolute value)."""
    from torch import nn

    from sinklab.nn.ops import ATTENTION, AttentionOp, register

    class SignedVirtual(AttentionOp):
        """identity similarity with a virtual key, no normalisation (test operation)"""

        sdpa = False
        normalised = False

        def __init__(self, ctx, *, gate=None):
            super().__init__(ctx, gate=gate)
            g = torch.Generator().manual_seed(1)
            self.k_star = nn.Parameter(torch.randn(ctx.n_kv_heads, ctx.head_dim, generator=g))
            self.v_star = nn.Parameter(torch.randn(ctx.n_kv_heads, ctx.head_dim, generator=g))

        def virtual_kv(self, attn):
            return self.k_star, self.v_star

        def normalise(self, logits, mask, extra):
            return logits.masked_fill(~mask, 0.0), extra  # (B, H, C, Tk), (B, H, C, 1): signed

    register("test_signed_virtual")(SignedVirtual)
    try:
        m = _sinklm(attention="test_signed_virtual", n_layers=1, positional="nope")
        ids = _ids(2, 8)
        a = run_model(m, ids, hidden=True, nll=True)
        b = run_model(m, ids, hidden=True, nll=True, edit=lambda layer, w, **_: w)
        assert torch.allclose(a.hidden, b.hidden, atol=1e-5) and torch.allclose(a.nll, b.nll, atol=1e-5)
    finally:
        ATTENTION.remove("test_signed_virtual")


def test_keybias_lower_median_skips_nan_and_warns_nothing(monkeypatch):
    """The headline medians of keybias are lower medians with NaN skipped (hand-worked: [3, nan, 1, 4, 2] -> 2,
    where pandas' median gives 2.5), computed without handing torch pandas' read-only NumPy view (torch warns about
    that once per process, so the test checks the array torch gets, not the warning)."""
    import numpy as np
    import pandas as pd

    from sinklab.analyze.keybias import _median

    for name in ("tensor", "as_tensor", "from_numpy"):
        real = getattr(torch, name)

        def checked(data, *a, _real=real, **k):
            assert not isinstance(data, np.ndarray) or data.flags.writeable, "torch got a read-only NumPy view"
            return _real(data, *a, **k)

        monkeypatch.setattr(torch, name, checked)
    column = pd.DataFrame({"m": [3.0, float("nan"), 1.0, 4.0, 2.0]})["m"]  # a column: pandas hands a read-only view
    assert not column.to_numpy(dtype="float64").flags.writeable  # the case the fix is for
    assert _median(column) == 2.0
    assert pd.Series([3.0, 1.0, 4.0, 2.0]).median() == 2.5
