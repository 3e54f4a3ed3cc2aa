"""Integration: the sink cache on the real SmolLM2-135M and State of the Union text (fetched and cached)."""

import pytest
import torch

from sinklab.streaming import SinkCache, token_stream
from sinklab.streaming.harness import CacheSpec, stream_nll, stream_nll_decode

pytestmark = pytest.mark.network


def test_smollm2_parallel_stream_equals_token_by_token_cache(real_home):
    from sinklab.zoo.corpora import load_corpus
    from sinklab.models import load_model

    loaded = load_model("smollm2-135m", attn_implementation="sdpa")
    # 64 tokens (120 before; the token-by-token decode is most of this test's time): past the 2 + 24 kept
    # tokens 38 are evicted, and the parallel pass runs 2 blocks of 32
    ids = token_stream(loaded.tokenizer, load_corpus("sotu").documents, 64)
    spec = CacheSpec("sinks_2", "sink", 2, 24)
    par = stream_nll(loaded.model, ids, spec, max_context=loaded.info.max_context, block=32)
    dec = stream_nll_decode(loaded.model, ids, spec, max_context=loaded.info.max_context, progress=False)
    assert len(par) == len(dec) == 63
    diff = max(abs(par[t] - dec[t]) for t in range(63))
    assert diff < 2e-3  # float32, 30 layers, two different kernels
    # the window cache without sinks loses the first token and gets worse than with it
    win = stream_nll(loaded.model, ids, CacheSpec("window", "sink", 0, 24), max_context=None, block=32)
    assert sum(win.values()) > sum(par.values())
    cache = SinkCache(loaded.model, n_sink=2, window=24)
    with torch.no_grad():
        loaded.model(ids[None, :60], cache=cache, use_cache=True)
    assert cache.kept_length() == 26 and cache.get_seq_length() == 60
