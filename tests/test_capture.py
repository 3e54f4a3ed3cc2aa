"""Captured statistics equal those computed from transformers' own eager attention."""

import pytest
import torch

from helpers import tiny_bert, tiny_gpt2, tiny_llama, tiny_neox
from sinklab.capture import collect
from sinklab.capture.collectors import eager_collector
from sinklab.capture.hf import ATTN_NAME
from sinklab.errors import InputError, UnknownNameError
from sinklab.metrics import attention_mass

BUILDERS = {"llama": tiny_llama, "gpt2": tiny_gpt2, "neox": tiny_neox, "bert": tiny_bert}


def reference(model, ids, causal):
    """Attention mass and hidden norms from output_attentions / output_hidden_states (eager)."""
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
    model.set_attn_implementation(prev)
    mass = torch.stack([attention_mass(a.double(), causal=causal) for a in out.attentions], dim=1)
    return mass, out


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_eager_collector_matches_output_attentions(arch):
    model = BUILDERS[arch]()
    causal = arch != "bert"
    ids = torch.randint(4, 80, (3, 12), generator=torch.Generator().manual_seed(0))
    stats = collect(model, ids, batch_size=2, collector="eager")
    mass, out = reference(model, ids, causal)
    torch.testing.assert_close(stats.mass, mass, rtol=0, atol=1e-6)
    assert stats.causal is causal
    L = model.config.num_hidden_layers
    assert stats.hidden_norms.shape == (3, L, 12)
    if arch != "bert":  # BERT's hidden_states tuple is the same per-layer output
        hs = out.hidden_states
        torch.testing.assert_close(stats.hidden_norms[:, 0], hs[1].norm(dim=-1), rtol=1e-5, atol=1e-5)
    # massive-activation statistics agree with the layer outputs of layer 0
    h1 = out.hidden_states[1].abs().reshape(3, -1)
    torch.testing.assert_close(stats.max_abs[:, 0], h1.max(dim=1).values)
    torch.testing.assert_close(stats.median_abs[:, 0], h1.median(dim=1).values)


@pytest.mark.parametrize("multi_query", [True, False])
@pytest.mark.parametrize("collector", ["eager", "blockwise"])
def test_falcon_alibi_bias_in_the_float_mask_is_kept(collector, multi_query):
    """Falcon with ``alibi=True`` (falcon-rw-1b/7b) passes its ALiBi bias inside the float
    ``attention_mask``: every collector must add it, as transformers' eager attention does. The eager
    collector turned the mask into a boolean and dropped the bias (0.3 off in attention mass; found by an
    outside audit, 2026-12-07). Reference: the model's own eager attention in float64; the layer outputs
    (and so the loss) also follow the biased weights."""
    import copy

    import transformers

    torch.manual_seed(0)
    cfg = transformers.FalconConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=96,
                                    new_decoder_architecture=False, multi_query=multi_query, alibi=True,
                                    parallel_attn=True)
    model = transformers.FalconForCausalLM(cfg).eval()
    with torch.no_grad():  # peakier attention than the default init, so that the bias matters
        for n, p in model.named_parameters():
            if "query_key_value" in n and p.dim() == 2:
                p.mul_(20)
    ids = torch.randint(3, 96, (3, 24), generator=torch.Generator().manual_seed(2))
    mass, out = reference(copy.deepcopy(model).double(), ids, causal=True)
    stats = collect(model, ids, collector=collector)
    torch.testing.assert_close(stats.mass, mass, rtol=0, atol=1e-5)


@pytest.mark.parametrize("collector", ["eager", "blockwise"])
def test_chunked_attention_mask_aware_mass_counts_the_queries_in_the_chunk(collector):
    """Llama 4's chunked attention (query i sees key j iff j <= i and i // C == j // C) comes as the layer's
    own mask tensor: the mask-aware mass divides by the queries that chunk rule lets see each key (it
    divided by T - j, as for plain causal attention, and reported no mask; outside audit, 2026-12-07).
    Reference: the model's own float64 eager weights, the counts from the chunk rule written here."""
    import copy

    import transformers

    C, T = 5, 24
    torch.manual_seed(0)
    cfg = transformers.Llama4TextConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, intermediate_size_mlp=64, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, vocab_size=96, max_position_embeddings=128, attention_chunk_size=C,
        num_local_experts=2, num_experts_per_tok=1, interleave_moe_layer_step=1, no_rope_layers=[1, 0],
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.Llama4ForCausalLM(cfg).eval()
    assert model.config.layer_types == ["chunked_attention", "full_attention"]
    ids = torch.randint(3, 96, (3, T), generator=torch.Generator().manual_seed(1))
    mass, out = reference(copy.deepcopy(model).double(), ids, causal=True)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    rules = {"chunked_attention": (j <= i) & (i // C == j // C), "full_attention": j <= i}
    visible = []
    for a, kind in zip(out.attentions, model.config.layer_types):
        seen = rules[kind]
        assert bool(((a != 0) <= seen).all())  # the model's weights lie inside the rule
        visible.append((a * seen).sum(dim=-2) / seen.sum(dim=0))  # (N, H, T)
    stats = collect(model, ids, collector=collector)
    torch.testing.assert_close(stats.mass, mass, rtol=0, atol=1e-5)
    assert stats.mass_visible is not None and stats.mask.get("from_mask_tensor") is True
    torch.testing.assert_close(stats.mass_visible, torch.stack(visible, dim=1), rtol=0, atol=1e-5)


def test_model_restored_and_outputs_unchanged():
    model = tiny_llama()
    ids = torch.randint(4, 80, (2, 10), generator=torch.Generator().manual_seed(1))
    prev = model.config._attn_implementation
    with torch.no_grad():
        before = model(ids).logits
    collect(model, ids, collector="eager")
    assert model.config._attn_implementation == prev != ATTN_NAME
    assert all(not m._forward_hooks for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before)


def test_gqa_key_norms_and_llama_logits_through_capture():
    model = tiny_llama()
    ids = torch.randint(4, 80, (2, 10), generator=torch.Generator().manual_seed(2))
    stats = collect(model, ids, collector="eager")
    assert stats.key_norms.shape == (2, 2, 2, 10)  # (N, L, H_kv, T)
    # keys of layer 0 recomputed by hand: k_proj of the normed embeddings, then RoPE (norm-preserving)
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids))
        k = model.model.layers[0].self_attn.k_proj(x).view(2, 10, 2, 8).transpose(1, 2)
    torch.testing.assert_close(stats.key_norms[:, 0], k.norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_eager_collector_sink_logits_and_softcap():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g) for _ in range(3))
    sinks = torch.tensor([0.5, -1.0])
    out, col = eager_collector(q, k, v, scaling=0.5, attention_mask=None, is_causal=True, softcap=2.0, sinks=sinks)
    # float64 reference
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.5
    s = torch.tanh(s / 2.0) * 2.0
    s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    e = torch.exp(s)
    denom = e.sum(-1, keepdim=True) + torch.exp(sinks.double()).reshape(1, 2, 1, 1)
    p = e / denom
    torch.testing.assert_close(col, p.sum(-2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.double(), (p @ v.double()).transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_bad_inputs():
    model = tiny_llama()
    with pytest.raises(InputError):
        collect(model, torch.zeros(3, dtype=torch.long))
    with pytest.raises(UnknownNameError, match="eager"):
        collect(model, torch.zeros(1, 4, dtype=torch.long), collector="nope")


def test_fallback_when_attention_not_interceptable(monkeypatch):
    """A model whose attention ignores the interface falls back to output_attentions, with a note."""
    import sinklab.capture.hf as hf

    model = tiny_gpt2()
    ids = torch.randint(4, 80, (2, 8), generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(hf, "_active", lambda: None)  # the seam sees nothing: as if never called
    mass, _ = reference(model, ids, True)
    stats = collect(model, ids, collector="eager")
    assert any("fell back" in n for n in stats.notes)
    torch.testing.assert_close(stats.mass, mass, rtol=0, atol=1e-6)


@pytest.mark.parametrize("prefix_len,window", [(0, None), (4, None), (0, 3), (4, 3)])
def test_native_model_probed_with_its_own_mask(prefix_len, window):
    """A SinkLM trained with a prefix or a sliding window is probed under that mask: the paper's mass
    (sum over queries i >= j, / (T - j)) and the mask-aware mass (sum over every query that may see j,
    / that count) recomputed with plain loops from the weights the model hands its observer."""
    from sinklab.nn.config import ModelConfig
    from sinklab.nn.model import SinkLM

    torch.manual_seed(0)
    T = 10
    m = SinkLM(ModelConfig(vocab_size=20, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=T,
                           sliding_window=window)).eval()
    ids = torch.randint(0, 20, (3, T))
    weights = {}
    with torch.no_grad():
        m(ids, prefix_len=prefix_len, observer=lambda layer, w, **kw: weights.__setitem__(layer, w.double()))
    stats = collect(m, ids, prefix_len=prefix_len)
    for layer, w in weights.items():
        for h in range(2):
            for j in range(T):
                seen = [i for i in range(T) if (j <= i or j < prefix_len) and (window is None or abs(i - j) < window)]
                paper = sum(float(w[n, h, i, j]) for n in range(1) for i in range(j, T)) / (T - j)
                vis = sum(float(w[0, h, i, j]) for i in seen) / len(seen)
                assert float(stats.mass[0, layer, h, j]) == pytest.approx(paper, abs=1e-6)
                assert float(stats.visible_mass[0, layer, h, j]) == pytest.approx(vis, abs=1e-6)
    plain = prefix_len == 0 and window is None
    assert (stats.mass_visible is None) == plain
    assert stats.mask == {"causal": True, "prefix_len": prefix_len, "window": window}
    if prefix_len:  # the prefix changes the weights themselves: a causal probe would measure another model
        causal = collect(m, ids)
        assert (causal.mass - stats.mass).abs().max() > 1e-4


def test_prefix_len_rejected_for_transformers_models():
    with pytest.raises(InputError, match="prefix_len"):
        collect(tiny_llama(), torch.randint(0, 80, (1, 8)), prefix_len=2)


@pytest.mark.parametrize("build,causal", [("gpt2_base", True), ("bert", False)])
def test_fallback_reads_causality_from_the_mask(monkeypatch, build, causal):
    """GPT2Model (no 'CausalLM' in its name, config.is_decoder False) is causal; BERT is bidirectional:
    the output_attentions fallback must use the matching attention-mass denominator."""
    import sinklab.capture.hf as hf
    from transformers import GPT2Model

    if build == "gpt2_base":
        torch.manual_seed(0)
        model = GPT2Model(tiny_gpt2().config).eval()
    else:
        model = tiny_bert()
    ids = torch.randint(4, 80, (2, 8), generator=torch.Generator().manual_seed(4))
    monkeypatch.setattr(hf, "_active", lambda: None)
    mass, _ = reference(model, ids, causal)
    stats = collect(model, ids, collector="eager")
    assert stats.causal is causal
    torch.testing.assert_close(stats.mass, mass, rtol=0, atol=1e-6)


def test_median_nonnegative_equals_torch_median():
    """The radix selection of the recorder's median |h| equals torch.median (the lower median) on rows with
    ties, zeros, subnormals, inf, a whole row inside one 16-bit bucket, even and odd lengths, and NaN."""
    from sinklab.capture.recorder import median_nonnegative

    g = torch.Generator().manual_seed(5)
    rows = {
        "normal-odd": torch.randn(3, 1001, generator=g).abs(),
        "normal-even": torch.randn(2, 1000, generator=g).abs() * 1e3,
        "ties-and-zeros": torch.randint(0, 4, (2, 64), generator=g).float(),
        "one-bucket": 1.0 + torch.rand(2, 501, generator=g) * 1e-3,  # all share their top 16 bits
        "subnormal-inf": torch.cat([torch.full((1, 5), 1e-42), torch.full((1, 4), float("inf")), torch.ones(1, 2)], 1),
        "single": torch.tensor([[2.5]]),
        "pair": torch.tensor([[3.0, 1.0]]),
    }
    for name, x in rows.items():
        torch.testing.assert_close(median_nonnegative(x), x.median(dim=1).values, rtol=0, atol=0, msg=name)
    x = torch.rand(3, 11, generator=g)
    x[1, 4] = float("nan")
    got = median_nonnegative(x)
    assert torch.isnan(got[1]) and torch.isnan(x[1].median())
    torch.testing.assert_close(got[[0, 2]], x[[0, 2]].median(dim=1).values, rtol=0, atol=0)
    for bad in (torch.tensor([[1.0, -2.0, 3.0]]), torch.ones(3), torch.ones(2, 3, dtype=torch.float64), torch.ones(2, 0)):
        with pytest.raises(InputError):
            median_nonnegative(bad)


def _tiny_gpt_neo(window: int = 6):
    """GPT-Neo (no AttentionInterface: measured through output_attentions) with a global and a local layer; q/k scaled
    so that attention is peaked and the sink rates are not all 0."""
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    torch.manual_seed(22)
    cfg = GPTNeoConfig(vocab_size=80, hidden_size=32, num_layers=2, num_heads=4, window_size=window,
                       attention_types=[[["global", "local"], 1]], max_position_embeddings=64)
    m = GPTNeoForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "q_proj.weight" in n or "k_proj.weight" in n:
                p.mul_(8.0)
    return m


def test_gpt_neo_local_layers_are_measured_under_their_window(tokenizer, tmp_path):
    """The output_attentions fallback took every layer as plain causal: GPT-Neo's local layers' mask-aware rates
    (sink_rate_visible) divided a key's mass by queries that never saw it (an audit: Sink_1 visible 0.0 where the
    window-aware value is 41.7). Reference: float64 eager weights, each key's mass over the queries its layer's own
    mask lets see it."""
    from sinklab.measure import measure

    m, T, N, w = _tiny_gpt_neo(6), 24, 4, 6
    d = tmp_path / "neo"
    m.save_pretrained(d)
    tokenizer.save_pretrained(d)
    with pytest.warns(UserWarning, match="falling back to eager output_attentions"):
        r = measure(model=str(d), input="random", num_samples=N, seq_len=T, progress=False)
    with torch.no_grad():
        A = torch.stack(m.double()(input_ids=r.probe.input_ids, output_attentions=True).attentions, 1)  # (N, L, H, T, T)
    seen = torch.stack([torch.tensor([float(sum(1 for i in range(j, T) if win is None or i - j < win)) for j in range(T)],
                                     dtype=torch.float64) for win in (None, w)])  # (L, T) queries that see key j
    vis = A.sum(-2) / seen[None, :, None, :]  # (N, L, H, T)
    s = r.summary
    assert s["mask"]["window"] == w and s["mask_aware_differs"]
    want = ((vis[..., :3] > 0.3).double().mean(dim=(0, 1, 2)) * 100).tolist()
    assert s["sink_rate_visible"][:3] == pytest.approx(want, abs=1e-3) and want[0] > 0
    assert s["attention_mass_first_visible"] == pytest.approx(float(vis[..., 0].mean()), abs=1e-5)


def test_a_mask_the_fallback_cannot_read_is_refused(monkeypatch):
    """A model whose weights hide keys its known mask allows (here GPT-Neo with its window withheld) is refused, not
    measured as plain causal."""
    import sinklab.capture.hf as hf
    from sinklab.errors import CaptureError

    m = _tiny_gpt_neo(6)
    monkeypatch.setattr(hf, "fallback_windows", lambda config, n: [None] * n)
    ids = torch.randint(0, 80, (2, 20), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning), pytest.raises(CaptureError, match="layer 1: the last query gives key 0 weight "
                                                                     "exactly 0 in every head"):
        hf.forward_hf(m, ids, "blockwise")


def test_a_half_precision_overflow_is_refused_by_the_eager_collector_too():
    """The eager collector (every analysis, measure --collector eager) turned every NaN of the softmax into 0 to
    zero padded rows: a float16 key past 65504 gave finite, wrong statistics (the audit's model: Sink_1 0% where
    float32 gives 14.6%). Only fully masked rows are zeroed now; the overflow's NaN reaches the metrics, which
    refuse it as the blockwise collector's does."""
    import copy

    from sinklab.capture import collect
    from sinklab.errors import NonFiniteMassError
    from sinklab.metrics import sink_rate
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    with torch.no_grad():
        m.model.embed_tokens.weight[1, 5] = 3e4  # a massive dimension on BOS (id 1)
        w = m.model.layers[1].self_attn.k_proj.weight
        w[:, 5] = 0.0
        w[0, 5] = 1.2e4  # layer 1's key of BOS past float16's range
    x = torch.randint(4, 80, (2, 16), generator=torch.Generator().manual_seed(0))
    x[:, 0] = 1
    half = copy.deepcopy(m).half()
    for collector in ("eager", "blockwise"):
        stats = collect(half, x, collector=collector)
        assert torch.isnan(stats.mass).any()
        with pytest.raises(NonFiniteMassError):
            sink_rate(stats.mass, 0.3)
