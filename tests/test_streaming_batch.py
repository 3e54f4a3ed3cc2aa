"""A left-padded batch of streams of different lengths through SinkCache: every row equals the same
stream run alone (its own sinks, positions and evictions), with ``generate`` and a manual forward, for
every policy and quantised storage; inputs that cannot be honoured are refused in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.policies import POLICIES

V = 97
TOL = dict(atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=1024, attn_implementation="eager")
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # sharper attention than the default init, so that evictions change the logits
        for layer in m.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return m


def streams(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, V, (n,), generator=g) for n in lengths]


def left_pad(rows):
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, T - len(r):], mask[b, T - len(r):] = r, 1
    return ids, mask


def run_alone(model, ids, cont, **cache_kw):
    """Logits (D + 1, V) of one stream: the prompt's last position, then each continuation token's."""
    cache = SinkCache(model, **cache_kw)
    with torch.no_grad():
        out = [model(ids[None], past_key_values=cache, use_cache=True).logits[0, -1]]
        for t in cont:
            out.append(model(t.view(1, 1), past_key_values=cache, use_cache=True).logits[0, -1])
    return torch.stack(out)


def run_batched(model, rows, conts, *, position_ids=False, **cache_kw):
    """The same, all rows in one left-padded batch through one cache: (B, D + 1, V)."""
    ids, mask = left_pad(rows)
    cache = SinkCache(model, **cache_kw)
    kw = {}
    if position_ids:  # generate's convention: count real tokens, 0 on padding
        kw["position_ids"] = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        out = [model(ids, attention_mask=mask, past_key_values=cache, use_cache=True, **kw).logits[:, -1]]
        for t in range(conts.shape[1]):
            mask = torch.cat((mask, torch.ones(len(rows), 1, dtype=mask.dtype)), dim=1)
            if position_ids:
                kw["position_ids"] = kw["position_ids"][:, -1:] + 1
            out.append(model(conts[:, t : t + 1], attention_mask=mask, past_key_values=cache, use_cache=True,
                             **kw).logits[:, -1])
    assert cache.padded
    return torch.stack(out, dim=1), cache


@pytest.mark.slow
@pytest.mark.parametrize("position_ids", [False, True], ids=["no-position-ids", "position-ids"])
def test_manual_forward_equals_each_row_alone(model, position_ids):
    """Lengths 5, 40, 300, 4 sinks + a window of 64, 80 decode steps: every row evicts several times."""
    rows = streams([5, 40, 300])
    conts = torch.randint(1, V, (3, 80), generator=torch.Generator().manual_seed(2))
    got, cache = run_batched(model, rows, conts, position_ids=position_ids, n_sink=4, window=64)
    for b, r in enumerate(rows):
        ref = run_alone(model, r, conts[b], n_sink=4, window=64)
        torch.testing.assert_close(got[b], ref, **TOL, msg=lambda m: f"row {b} (length {len(r)}): {m}")
        assert cache.layers[0].rows[b].kept == min(len(r) + 80, 68)
        # the row's sinks are its own first real tokens (arrival index 0-3 of the row, not padding)
        assert cache.layers[0].rows[b].order[:4].tolist() == [0, 1, 2, 3]


def test_generate_equals_each_row_alone(model):
    rows = streams([5, 40, 300], seed=3)
    ids, mask = left_pad(rows)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, past_key_values=SinkCache(model, n_sink=4, window=64),
                             max_new_tokens=75, do_sample=False, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0)
        logits = torch.stack(out.logits, dim=1)  # (B, 75, V)
        for b, r in enumerate(rows):
            alone = model.generate(r[None], past_key_values=SinkCache(model, n_sink=4, window=64), max_new_tokens=75,
                                   do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            torch.testing.assert_close(logits[b], torch.stack(alone.logits, dim=1)[0], **TOL)
            assert torch.equal(out.sequences[b, ids.shape[1]:], alone.sequences[0, len(r):])


CACHES = [dict(policy=p, budget=36, n_sink=4 if POLICIES.get(p).uses_sinks else 0) for p in POLICIES.names()] + [
    dict(n_sink=4, window=32, kv_bits=4),
    dict(n_sink=4, window=32, kv_bits=2, key_quant="channel", kv_group=8, sinks_full_precision=4),
    dict(policy="sinks+h2o", budget=36, n_sink=4, kv_bits=2, sinks_full_precision="detected"),
]


@pytest.mark.slow
@pytest.mark.parametrize("kw", CACHES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_every_policy_and_storage_equals_each_row_alone(model, kw):
    rows = streams([3, 20, 50], seed=4)
    conts = torch.randint(1, V, (3, 45), generator=torch.Generator().manual_seed(5))
    quantised = kw.get("kv_bits", 16) != 16  # quantised codes depend on the absolute position: count from 0
    got, _ = run_batched(model, rows, conts, position_ids=quantised, **kw)
    for b, r in enumerate(rows):
        torch.testing.assert_close(got[b], run_alone(model, r, conts[b], **kw), **TOL,
                                   msg=lambda m: f"row {b}: {m}")
    if quantised:  # without position ids the padded rows' keys sit at shifted positions: refused
        with pytest.raises(InputError, match="count each row's real tokens from 0"):
            run_batched(model, rows, conts[:, :1], **kw)


def test_the_check_can_fail(model):
    """A row compared with another row's stream differs (the comparison above is not vacuous)."""
    rows = streams([5, 40, 300])
    conts = torch.randint(1, V, (3, 80), generator=torch.Generator().manual_seed(2))
    got, _ = run_batched(model, rows, conts, n_sink=4, window=64)
    other = run_alone(model, rows[1], conts[0], n_sink=4, window=64)
    assert (got[0] - other).abs().max() > 1e-2


def test_unpadded_batch_with_a_mask_keeps_the_batched_path(model):
    rows = streams([30, 30], seed=6)
    ids = torch.stack(rows)
    cache = SinkCache(model, n_sink=4, window=16)
    with torch.no_grad():
        model(ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True)
    assert not cache.padded and cache.layers[0].rows is None and cache.kept_length() == 20


def _prefill(model, cache, ids, mask, **kw):
    with torch.no_grad():
        return model(ids, attention_mask=mask, past_key_values=cache, use_cache=True, **kw)


def test_refusals(model):
    ids = torch.randint(1, V, (2, 6))
    hole = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(InputError, match="padding token after a real one"):
        _prefill(model, SinkCache(model, n_sink=2, window=4), ids, hole)
    right = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])
    with pytest.raises(InputError, match="padding token after a real one"):
        _prefill(model, SinkCache(model, n_sink=2, window=4), ids, right)
    left = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    cache = SinkCache(model, n_sink=2, window=4)
    _prefill(model, cache, ids, left)
    with pytest.raises(InputError, match="pass its attention_mask"):
        with torch.no_grad():
            model(ids[:, :1], past_key_values=cache, use_cache=True)
    with pytest.raises(InputError, match="covers 7 tokens; this call needs 8"):
        _prefill(model, cache, ids[:, :2], torch.ones(2, 7, dtype=torch.long))
    with pytest.raises(InputError, match="disagrees with the earlier calls"):
        _prefill(model, cache, ids[:, :1], torch.ones(2, 7, dtype=torch.long))
    with pytest.raises(InputError, match="skip or repeat"):
        _prefill(model, SinkCache(model, n_sink=2, window=4), ids, left,
                 position_ids=torch.tensor([[0, 0, 0, 1, 3, 4], [0, 1, 2, 3, 4, 5]]))
    late = SinkCache(model, n_sink=2, window=4)
    _prefill(model, late, ids, torch.ones(2, 6, dtype=torch.long))
    with pytest.raises(InputError, match="only after the cache's first call"):
        _prefill(model, late, ids[:, :1], torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1] * 7]))
    with pytest.raises(InputError, match="2D attention_mask"):
        _prefill(model, SinkCache(model, n_sink=2, window=4), ids, torch.ones(2, 1, 6, 6))


def test_gemma3_sliding_layers_in_a_padded_batch():
    """Gemma 3's sliding layers keep each row's own last w - 1 real tokens; with the global layers' sinks
    + window every row equals itself alone (a float64 model; transformers itself gives NaN on this padded
    batch without a cache: its float32 softmax of the padding queries' all-masked rows)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"] * 2, max_position_embeddings=256,
                           attn_implementation="eager")
    gemma = Gemma3ForCausalLM(cfg).eval().double()
    rows = streams([4, 15, 40], seed=7)
    conts = torch.randint(1, V, (3, 30), generator=torch.Generator().manual_seed(8))
    got, _ = run_batched(gemma, rows, conts, position_ids=True, n_sink=2, window=10)
    shifted, _ = run_batched(gemma, rows, conts, n_sink=2, window=10)  # positions shifted by the padding
    for b, r in enumerate(rows):
        ref = run_alone(gemma, r, conts[b], n_sink=2, window=10)
        # float32 noise: transformers' eager attention takes the softmax in float32 (a padded row's longer
        # rows sum in another order) and RoPE's cos / sin in float32 (shifted positions round differently)
        torch.testing.assert_close(got[b], ref, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(shifted[b], ref, atol=1e-6, rtol=1e-5)
