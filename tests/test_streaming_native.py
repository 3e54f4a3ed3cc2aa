"""SinkCache on models trained with sinklab train (SinkLM): incremental decoding through the same
cache layers, the learned sinks (sink token, key/value bias, sink logit) attended at every step.

References: the model's own full forward (nothing evicted), and a from-scratch forward over exactly
the kept tokens (one layer, after eviction), in float64.
"""

from __future__ import annotations

import pytest
import torch

from sinklab.errors import InputError
from sinklab.nn import ModelConfig, SinkLM
from sinklab.streaming import SinkCache
from test_streaming_cache import kept_positions


def sinklm(attention="softmax", positional="rope", layers=2, **kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=layers, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=64,
                      attention=attention, positional=positional, **kw)
    return SinkLM(cfg).eval().double()


from sinklab.nn.ops import ATTENTION

SOME_OPS = ["softmax", "sink_token", "sink_logit", "kv_bias", "softmax_off_by_one", "sigmoid", "relu_norm",
            "gated_headwise"]
CASES = [(op, "rope") for op in ATTENTION.names()] + [(op, p) for p in ("alibi", "t5", "nope") for op in SOME_OPS]


@pytest.mark.parametrize("attention,positional", CASES)
def test_decode_with_cache_equals_full_forward(attention, positional):
    m = sinklm(attention, positional)
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    cache = SinkCache(m, n_sink=4, window=30)
    if ATTENTION.get(attention).differential:  # no KV-cache path yet: refused, not silently wrong
        with torch.no_grad(), pytest.raises(NotImplementedError, match="diff"):
            m(ids[:, :5], cache=cache)
        return
    with torch.no_grad():
        ref = m(ids).logits
        pre = m(ids[:, :5], cache=cache).logits  # a prefill chunk, then one token at a time
        steps = [m(ids[:, t : t + 1], cache=cache).logits for t in range(5, 24)]
    assert torch.allclose(torch.cat([pre, *steps], dim=1), ref, atol=1e-6)
    assert cache.kept_length() == 24 and cache.get_seq_length() == 24


@pytest.mark.parametrize("positional", ["rope", "alibi"])
@pytest.mark.parametrize("attention,n_sink", [("softmax", 2), ("sink_token", 0), ("sink_logit", 0), ("sink_token", 1)])
def test_after_eviction_equals_forward_over_kept_tokens(attention, n_sink, positional):
    """One layer: a decode step equals a fresh forward over the kept tokens at positions 0..K; the
    learned sink is part of every step, so with n_sink = 0 it is the only sink left."""
    m = sinklm(attention, positional, layers=1)
    window = 5
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(2))
    cache = SinkCache(m, n_sink=n_sink, window=window)
    with torch.no_grad():
        for t in range(30):
            got = m(ids[:, t : t + 1], cache=cache).logits[:, -1]
            ref = m(ids[:, kept_positions(t, n_sink, window) + [t]]).logits[:, -1]
            assert torch.allclose(got, ref, atol=1e-6), t
    assert cache.kept_length() == n_sink + window


def test_refused_sinklab_models():
    with pytest.raises(InputError, match="'learned' absolute"):
        SinkCache(sinklm(positional="learned"), n_sink=1, window=4)
    with pytest.raises(InputError, match="sliding window"):
        SinkCache(sinklm(sliding_window=8), n_sink=1, window=4)
    with pytest.raises(InputError, match="exceeds the model's context of 64"):
        SinkCache(sinklm(), n_sink=4, window=61)
    m = sinklm(positional="learned")
    cache = SinkCache(sinklm(), n_sink=1, window=4)
    with pytest.raises(InputError, match="relative positions"):
        m(torch.zeros(1, 2, dtype=torch.long), cache=cache)


@pytest.mark.integration
def test_cli_stream_on_a_sinklab_run_and_its_own_data(tmp_path, capsys):
    """`sinklab stream --model RUN --corpus run`: the run's validation documents after one BOS, decoded
    through the native SinkCache; with a window that keeps the whole stream, `window` equals `full`."""
    import json

    from helpers import run_cli_captured, synthetic_run_toml
    from sinklab.streaming.harness import run_stream
    from sinklab.train import loop
    from sinklab.runs import Run
    from sinklab.runs.config import load_config

    cfg = tmp_path / "run.toml"
    cfg.write_text(synthetic_run_toml(steps=2).replace("[model]\n", "[model]\nmax_seq_len = 64\n"))
    run = tmp_path / "run"
    loop.train(load_config(cfg, []), run, progress=False)
    ids = run_stream(run, 40)
    tc = Run(load_config(cfg, []), run).corpus
    docs = Run(load_config(cfg, []), run).validation_documents()
    want = [int(tc.bos_id)] + [t for d in docs for t in [*map(int, d), int(tc.eos_id)]]
    assert ids.tolist() == want[:40]  # each document followed by EOS, as in training
    out = tmp_path / "st"
    code, stdout, err = run_cli_captured(["stream", "perplexity", "--model", str(run), "--corpus", "run", "--tokens", "40",
                                          "--window", "60", "--sinks", "0,2", "--chunk", "8", "--out", str(out)], capsys)
    assert code == 0, err
    res = {c["name"]: c for c in json.loads((out / "stream.json").read_text())["configs"]}
    assert list(res) == ["full", "window", "sinks_2", "recompute"]
    assert res["window"]["ppl"] == pytest.approx(res["full"]["ppl"], rel=1e-5)
    assert res["recompute"]["ppl"] == pytest.approx(res["full"]["ppl_matched"], rel=1e-4)
    code, _, err = run_cli_captured(["stream", "perplexity", "--model", str(run), "--corpus", "run", "--tokens", "100000",
                                     "--window", "8", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "fewer than --tokens 100000" in err
