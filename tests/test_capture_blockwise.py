"""The ``blockwise`` collector equals the ``eager`` one (and a float64 reference) without T x T tensors."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import tiny_bert, tiny_gpt2, tiny_llama, tiny_neox
from sinklab.capture import collect
from sinklab.capture.blockwise import blockwise_attention, blockwise_options, choose_block_size, column_sums_from_lse
from sinklab.capture.collectors import COLLECTORS
from sinklab.capture.hf import capturing
from sinklab.capture.recorder import BatchRecorder
from sinklab.errors import InputError
from sinklab.metrics import attention_mass


def tiny_gemma3(window: int = 5):
    """Gemma-3-style: sliding layers (window < T) mixed with a full layer, query_pre_attn_scalar scaling."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=window, query_pre_attn_scalar=10,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], max_position_embeddings=4096,
    )
    return Gemma3ForCausalLM(cfg).eval()


def tiny_gemma2():
    """Gemma-2-style: attention-logit soft-capping (small, so that it bites) and a sliding window."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    cfg = Gemma2Config(
        vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=6, attn_logit_softcapping=1.5,
        final_logit_softcapping=None, max_position_embeddings=128,
    )
    return Gemma2ForCausalLM(cfg).eval()


def tiny_gpt_oss():
    """gpt-oss-style: learned per-head sink logits, sliding/full layers, grouped-query attention."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    cfg = GptOssConfig(
        vocab_size=80, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=4, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128,
    )
    model = GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # non-zero sink logits
    return model


BUILDERS = {
    "llama": tiny_llama, "gpt2": tiny_gpt2, "neox": tiny_neox, "gemma3": tiny_gemma3,
    "gemma2": tiny_gemma2, "gpt-oss": tiny_gpt_oss, "bert": tiny_bert,
}
#: architectures whose plain SDPA forward is exact (SDPA cannot soft-cap, and ignores gpt-oss sinks)
SDPA_EXACT = {"llama", "gpt2", "neox", "gemma3", "bert"}
T = 13  # longer than every window above, and not a multiple of the block size 5


def _ids(n=3, t=T, seed=0):
    return torch.randint(4, 80, (n, t), generator=torch.Generator().manual_seed(seed))


def _assert_stats_equal(a, b):
    for name in ("mass", "hidden_norms", "max_abs", "median_abs", "key_norms", "value_norms"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            torch.testing.assert_close(x, y.to(x.dtype), rtol=1e-5, atol=1e-5, msg=name)
    assert a.causal == b.causal


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_blockwise_equals_eager_per_layer_head_position(arch):
    model = BUILDERS[arch]()
    ids = _ids()
    eager = collect(model, ids, batch_size=2, collector="eager")
    with blockwise_options(block_size=5):
        block = collect(model, ids, batch_size=2, collector="blockwise")
    assert block.collector == "blockwise" and not block.notes
    _assert_stats_equal(block, eager)
    # the window really matters: a sliding layer puts no mass on keys older than the window
    # for the last query, so the mass differs from a full-attention layer's
    if arch == "gemma3":
        assert not torch.allclose(eager.mass[:, 0], eager.mass[:, 1])


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_outputs_through_blockwise_equal_plain_forward(arch):
    """Logits with the blockwise collector equal the plain SDPA forward (eager where SDPA is inexact)."""
    model = BUILDERS[arch]()
    ids = _ids(2)
    prev = model.config._attn_implementation
    model.set_attn_implementation("sdpa" if arch in SDPA_EXACT else "eager")
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False)[0]
    model.set_attn_implementation(prev)
    recorder = BatchRecorder(model.config.num_hidden_layers, "blockwise")
    with blockwise_options(block_size=4), capturing(model, recorder, "blockwise"), torch.no_grad():
        captured = model(input_ids=ids, use_cache=False)[0]
    assert recorder.attn_calls == model.config.num_hidden_layers
    torch.testing.assert_close(captured, plain, rtol=1e-5, atol=1e-5)


def test_auto_resolves_to_blockwise():
    model = tiny_llama()
    stats = collect(model, _ids(2), collector="auto")
    assert stats.collector == "blockwise"


def test_eager_matches_transformers_output_attentions_with_sliding_window():
    """The eager collector (now applying the window itself) equals transformers' eager attention."""
    model = tiny_gemma3(window=4)
    ids = _ids(2, t=11)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(input_ids=ids, output_attentions=True)
    model.set_attn_implementation("sdpa")
    want = torch.stack([attention_mass(a.double()) for a in out.attentions], dim=1)
    for name in ("eager", "blockwise"):
        got = collect(model, ids, collector=name).mass
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)


def test_padding_batch():
    """Left padding (decoder): blockwise column sums equal eager ones, padded keys get no attention, and the outputs
    at real tokens equal the plain forward."""
    model = tiny_llama()
    ids = _ids(3, t=10, seed=5)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, :4] = 0
    mask[2, :1] = 0
    results = {}
    for name in ("eager", "blockwise"):
        rec = BatchRecorder(model.config.num_hidden_layers, name)
        with blockwise_options(block_size=3), capturing(model, rec, name), torch.no_grad():
            results[name] = (model(input_ids=ids, attention_mask=mask)[0], rec)
    (out_e, rec_e), (out_b, rec_b) = results["eager"], results["blockwise"]
    for layer in range(model.config.num_hidden_layers):
        torch.testing.assert_close(rec_b.mass[layer], rec_e.mass[layer], rtol=1e-5, atol=1e-6)
        assert rec_b.mass[layer][mask.bool().logical_not()[:, None, :].expand_as(rec_b.mass[layer])].abs().max() == 0
    real = mask.bool()
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask)[0]
    torch.testing.assert_close(out_b[real], plain[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["eager", "blockwise"])
def test_left_padded_rows_give_each_row_its_own_entropy(name):
    """A left-padded row's pad queries see no key; the mean attention entropy over queries counted them (as 0: a row
    of 6 tokens in 25 read 0.2194 where alone it reads 0.9141, x 6/25; outside audit, 2026-12-07). Each row's entropy
    and mass now equal the row alone."""
    model = tiny_llama()
    lengths, T = (4, 10), 10
    ids = _ids(2, t=T, seed=7)
    mask = torch.zeros(2, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, T - n:] = 1

    def run(x, m):
        rec = BatchRecorder(model.config.num_hidden_layers, name, entropy=True)
        with blockwise_options(block_size=3), capturing(model, rec, name), torch.no_grad():
            model(input_ids=x, attention_mask=m)
        return rec.finish()

    both = run(ids, mask)
    for b, n in enumerate(lengths):
        alone = run(ids[b : b + 1, T - n:], None)
        torch.testing.assert_close(both.attention_entropy[b], alone.attention_entropy[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(both.mass[b, ..., T - n:], alone.mass[0], rtol=0, atol=1e-6)


def test_left_padded_rows_give_each_row_its_own_gate_mean_and_massive_activations():
    """A left-padded row's gate magnitude was averaged over its pad queries, and its largest and median |h| taken
    over its pad positions too (a 4-token row in 10: gate_mean off by 5.2e-3, median |h| by 0.156; outside review,
    2026-12-07). Each now equals the row alone (Beam: gated heads); the largest |h| sits at the same token."""
    from tiny_models import VOCAB, tiny_model

    model = tiny_model("beam")
    with torch.no_grad():
        for n, prm in model.named_parameters():
            if n.endswith("gate_bias"):
                prm.copy_(torch.linspace(-2.0, 2.0, prm.numel()).view_as(prm))
    T, n = 10, 4
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, T, dtype=torch.long)
    mask[0, : T - n] = 0
    rec = BatchRecorder(model.config.num_hidden_layers, "eager")
    with capturing(model, rec, "eager"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    both = rec.finish()
    rec = BatchRecorder(model.config.num_hidden_layers, "eager")
    with capturing(model, rec, "eager"), torch.no_grad():
        model(input_ids=ids[:1, T - n:])
    alone = rec.finish()
    torch.testing.assert_close(both.gate_mean[0], alone.gate_mean[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(both.max_abs[0], alone.max_abs[0], rtol=1e-4, atol=1e-5)  # float32, another batch
    torch.testing.assert_close(both.median_abs[0], alone.median_abs[0], rtol=1e-4, atol=1e-5)
    assert (both.max_position[0] - (T - n)).tolist() == alone.max_position[0].tolist()


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_pad_queries_that_see_tokens_are_refused(arch):
    """Right padding (causal) and any padding of a bidirectional encoder: the pad queries see real keys, and their
    attention went into every column sum (a right-padded LLaMA row read mass 0.178 on key 0 where alone it reads
    0.318; outside audit, 2026-12-07). Refused in one line, whatever the collector."""
    model = tiny_llama() if arch == "llama" else tiny_bert()
    ids = _ids(2, t=10, seed=5)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, 6:] = 0
    for name in ("eager", "blockwise"):
        rec = BatchRecorder(model.config.num_hidden_layers, name)
        with pytest.raises(InputError, match="pad positions see other tokens"), capturing(model, rec, name), \
                torch.no_grad():
            model(input_ids=ids, attention_mask=mask)


def _reference(q, k, v, scale, mask, causal, softcap, sinks, window):
    """float64 softmax attention (probs, output) written out naively."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(n_rep, dim=1)
    v = v.double().repeat_interleave(n_rep, dim=1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    Tq, Tk = s.shape[-2:]
    if mask is not None:
        s = s + mask.double()
    elif causal:
        i = torch.arange(Tq)[:, None] + Tk - Tq
        j = torch.arange(Tk)[None, :]
        allowed = j <= i
        if window is not None:
            allowed &= j > i - window
        s = s.masked_fill(~allowed, float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e300).nan_to_num(neginf=0.0))
    e = e.nan_to_num()
    denom = e.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks.double().reshape(1, -1, 1, 1) - s.amax(-1, keepdim=True).nan_to_num(neginf=0.0))
    p = torch.where(denom > 0, e / denom, torch.zeros_like(e))
    return p, (p @ v).transpose(1, 2)


CASES = {
    "causal-gqa": dict(causal=True),
    "bidirectional": dict(causal=False),
    "window": dict(causal=True, window=3),
    "softcap+sinks+window": dict(causal=True, softcap=1.0, sinks=True, window=4),
    "padding-float-mask": dict(causal=True, padding=True),
    "prefix-query": dict(causal=True, t_q=5),
}


@pytest.mark.parametrize("output", ["tiles", "fused", "sdpa"])
@pytest.mark.parametrize("block", [1, 3, 7, 64])
@pytest.mark.parametrize("case", list(CASES))
def test_blockwise_attention_against_float64(case, block, output):
    opts = CASES[case]
    g = torch.Generator().manual_seed(7)
    B, Hq, Hkv, Tk, D = 2, 6, 2, 11, 8
    Tq = opts.get("t_q", Tk)
    q = torch.randn(B, Hq, Tq, D, generator=g)
    k = torch.randn(B, Hkv, Tk, D, generator=g)
    v = torch.randn(B, Hkv, Tk, D, generator=g)
    sinks = torch.randn(Hq, generator=g) if opts.get("sinks") else None
    mask = None
    if opts.get("padding"):  # additive float mask, as eager masks come: causal + left padding of 3 in sample 0
        allowed = torch.ones(Tq, Tk, dtype=torch.bool).tril().expand(B, 1, Tq, Tk).clone()
        allowed[0, :, :, :3] = False
        mask = torch.zeros(B, 1, Tq, Tk).masked_fill(~allowed, torch.finfo(torch.float32).min)
    scale = 0.3
    out, col = blockwise_attention(
        q, k, v, scaling=scale, attention_mask=mask, is_causal=opts["causal"], softcap=opts.get("softcap"),
        sinks=sinks, sliding_window=opts.get("window"), block_size=block, output=output,
    )
    ref_mask = None if mask is None else mask.masked_fill(mask < -1e30, float("-inf"))
    p, ref_out = _reference(q, k, v, scale, ref_mask, opts["causal"], opts.get("softcap"), sinks, opts.get("window"))
    torch.testing.assert_close(col, p.sum(-2), rtol=1e-5, atol=1e-5)
    if mask is not None:  # fully masked padding queries: outputs are undefined, compare the rest
        keep = mask.amax(-1)[:, 0] > -1e30  # (B, Tq)
        torch.testing.assert_close(out[keep].double(), ref_out[keep], rtol=1e-5, atol=1e-5)
    else:
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    # and the eager collector agrees (it is the reference of the model-level tests)
    out_e, col_e = COLLECTORS.get("eager")(
        q, k, v, scaling=scale, attention_mask=mask, is_causal=opts["causal"], softcap=opts.get("softcap"),
        sinks=sinks, sliding_window=opts.get("window"),
    )
    torch.testing.assert_close(col, col_e, rtol=1e-5, atol=1e-5)


class _LargestTensor(TorchDispatchMode):
    """Records the largest storage (in elements) of any tensor an aten op produces
    (a stride-0 broadcast view of a row counts as the row)."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.shape = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                size = t.untyped_storage().nbytes() // t.element_size()
                if size > self.largest:
                    self.largest, self.shape = size, tuple(t.shape)
        return out


@pytest.mark.parametrize("arch,T_long", [("llama", 4096), ("gemma3", 2048)])
def test_no_t_by_t_tensor_at_long_context(arch, T_long):
    """At long T no op in the whole capture (mask building included) yields a T x T tensor:
    the mask stays None for causal and sliding-window layers and tiles are block x T."""
    block = 128
    model = tiny_llama() if arch == "llama" else tiny_gemma3(window=64)
    ids = _ids(1, t=T_long)
    seen_masks = []
    blockwise = COLLECTORS.get("blockwise")

    def spy(query, key, value, **kw):
        seen_masks.append(kw["attention_mask"])
        return blockwise(query, key, value, **kw)

    COLLECTORS.register("test-spy", spy)
    try:
        with blockwise_options(block_size=block), _LargestTensor() as mode:
            collect(model, ids, collector="test-spy")
    finally:
        COLLECTORS._entries.pop("test-spy", None)
    assert len(seen_masks) == model.config.num_hidden_layers and all(m is None for m in seen_masks)
    heads = model.config.num_attention_heads
    assert mode.largest <= heads * block * T_long, mode.shape
    assert mode.largest <= T_long * T_long // 4, mode.shape  # the column-sum tile (4 heads x 128 x 2048) is T^2 / 4 here


def test_block_size_choice_and_bad_values():
    assert choose_block_size(1, 9, 4096, 4096, budget_bytes=64 * 2**20, max_block=None) == 448
    assert choose_block_size(1, 9, 4096, 4096) == 32  # MAX_BLOCK
    assert choose_block_size(1, 9, 20, 20) == 20
    assert choose_block_size(1, 9, 100, 100, max_block=None) == 100
    assert choose_block_size(1, 9, 100, 100) == 32
    assert choose_block_size(8, 32, 32768, 32768, budget_bytes=2**20) == 16  # floor
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(InputError):
        blockwise_attention(q, q, q, scaling=None, attention_mask=None, is_causal=True, block_size=0)
    with pytest.raises(InputError):
        blockwise_attention(q, torch.randn(1, 3, 4, 8), torch.randn(1, 3, 4, 8), scaling=None,
                            attention_mask=None, is_causal=True)
    with pytest.raises(InputError):
        with blockwise_options(block_size=-1):
            pass
    with pytest.raises(InputError, match="output must be one of"):
        with blockwise_options(output="flash"):
            pass
    with pytest.raises(InputError, match="output must be one of"):
        blockwise_attention(q, q, q, scaling=None, attention_mask=None, is_causal=True, output="flash")


def test_unknown_model_falls_back_with_warning(monkeypatch):
    """A model whose attention never reaches the seam falls back to output_attentions with a warning."""
    import sinklab.capture.hf as hf

    model = tiny_gpt2()
    ids = _ids(2, t=8)
    monkeypatch.setattr(hf, "_active", lambda: None)
    with pytest.warns(UserWarning, match="falling back to eager"):
        stats = collect(model, ids, collector="auto")
    assert any("fell back" in n for n in stats.notes)


@pytest.mark.network
def test_smollm2_blockwise_equals_eager_at_512(real_home):
    """The issue's exactness check on the real model: SmolLM2-135M, SOTU text, T = 512."""
    from sinklab.zoo.corpora import load_corpus
    from sinklab.models import load_model

    loaded = load_model("smollm2-135m", attn_implementation="sdpa")
    text = "\n\n".join(load_corpus("sotu").documents[:3])
    ids = torch.tensor([loaded.tokenizer(text)["input_ids"][:512]])
    eager = collect(loaded.model, ids, batch_size=1, collector="eager")
    block = collect(loaded.model, ids, batch_size=1, collector="blockwise")
    _assert_stats_equal(block, eager)
    assert (eager.mass[0, :, :, 0] > 0.3).any()  # a real sink is present on token 0


@pytest.mark.parametrize("output", ["tiles", "fused", "sdpa"])
def test_bfloat16_inputs_match_float32_statistics(output):
    """bf16 q/k/v: the statistics are those of the float32 scores of the bf16 values (as eager computes)."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 37, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    out, col = blockwise_attention(q, k[:, :2], v[:, :2], scaling=0.25, attention_mask=None, is_causal=True,
                                   block_size=8, output=output)
    out_e, col_e = COLLECTORS.get("eager")(q, k[:, :2], v[:, :2], scaling=0.25, attention_mask=None, is_causal=True)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(col, col_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.float(), out_e.float(), rtol=2e-2, atol=2e-2)


def test_gpt_oss_sink_logits_give_virtual_mass_and_sliding_layers_visible_mass():
    """gpt-oss: the mean weight on the learned sink per (layer, head) equals 1 - row sum of transformers'
    eager attention (which drops the sink column), and the sliding layer's mask-aware mass divides by the
    queries inside the window (T = 12, w = 4)."""
    from sinklab.metrics import sink_rate_virtual

    model = tiny_gpt_oss()
    ids = torch.randint(0, 80, (2, 12), generator=torch.Generator().manual_seed(0))
    stats = collect(model, ids)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        att = model(ids, output_attentions=True).attentions
    for layer, a in enumerate(att):
        a = a.double()
        sink = (1.0 - a.sum(-1)).mean(-1)  # (B, H): mean over queries of the weight on the sink
        torch.testing.assert_close(stats.extra_mass[:, layer], sink, atol=1e-5, rtol=0)
        T = a.shape[-1]
        window = 4 if layer == 0 else None
        for j in range(T):
            seen = [i for i in range(j, T) if window is None or i - j < window]
            vis = a[..., seen, j].sum(-1) / len(seen)
            torch.testing.assert_close(stats.visible_mass[:, layer, :, j], vis, atol=1e-5, rtol=0)
    assert stats.extra_mass.max() > 0.05  # the sinks carry weight: the comparison is not zeros
    want = float((stats.extra_mass > 0.3).double().mean() * 100)
    assert sink_rate_virtual(stats.extra_mass, 0.3) == pytest.approx(want)


@pytest.mark.parametrize("tiles", [dict(tile_bytes=1024), dict(block_size=4, key_block=8), dict(block_size=3, key_block=7),
                                   dict(block_size=5, key_block=2), dict(block_size=64)])
@pytest.mark.parametrize("causal", [True, False])
def test_column_sums_from_lse_against_float64(causal, tiles):
    """The fused path's column sums (one more Q K^T with -LSE folded into the GEMM, base-2 exp) against
    float64 softmax, with grouped-query heads and tiles of several shapes: the automatic size, several key
    blocks (a multiple of the query block, rounded down to one: 7 -> 6, or raised to it: 2 -> 5), a ragged
    last block, one block larger than T."""
    g = torch.Generator().manual_seed(3)
    B, Hq, Hkv, T, D = 2, 6, 3, 37, 8
    q, k = torch.randn(B, Hq, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g)
    p, _ = _reference(q, k, k, 0.4, None, causal, None, None, None)
    lse = torch.logsumexp((q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2) * 0.4).masked_fill(
        ~torch.ones(T, T, dtype=torch.bool).tril() if causal else torch.zeros(T, T, dtype=torch.bool), float("-inf")), -1)
    col = column_sums_from_lse(q, k, lse.float(), scaling=0.4, is_causal=causal, **tiles)
    torch.testing.assert_close(col, p.sum(-2), rtol=1e-5, atol=1e-5)


def test_column_sums_from_lse_bad_input():
    q, k = torch.randn(1, 2, 6, 4), torch.randn(1, 1, 6, 4)
    lse = torch.zeros(1, 2, 6)
    with pytest.raises(InputError, match="as many queries as keys"):
        column_sums_from_lse(q[:, :, :5], k, lse[..., :5], scaling=0.4, is_causal=True)
    for bad in (dict(block_size=0), dict(key_block=0)):
        with pytest.raises(InputError, match="must be positive"):
            column_sums_from_lse(q, k, lse, scaling=0.4, is_causal=True, **bad)


def test_block_size_from_the_environment_is_validated_and_read_once(monkeypatch):
    from sinklab.capture import blockwise as bw
    from sinklab.errors import InputError

    assert bw.BlockwiseOptions.from_env({"SINKLAB_BLOCK_SIZE": "7"}) == bw.BlockwiseOptions(block_size=7)
    assert bw.BlockwiseOptions.from_env({}) == bw.BlockwiseOptions()
    for bad in ("0", "-3", "x"):
        with pytest.raises(InputError, match="SINKLAB_BLOCK_SIZE"):
            bw.BlockwiseOptions.from_env({"SINKLAB_BLOCK_SIZE": bad})
    bw._env_options.cache_clear()
    monkeypatch.setenv("SINKLAB_BLOCK_SIZE", "5")
    try:
        assert bw.current_options().block_size == 5
        monkeypatch.setenv("SINKLAB_BLOCK_SIZE", "9")  # not read again on the hot path
        assert bw.current_options().block_size == 5
        with bw.blockwise_options(block_size=3):
            assert bw.current_options().block_size == 3
    finally:
        bw._env_options.cache_clear()
