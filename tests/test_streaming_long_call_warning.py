"""SinkCache warns once when one call brings more new tokens than its budget (issue 35): ``model.generate``
with a long prompt prefills it in one call that attends to all of itself. A prompt within the budget, the
chunked prefill of ``sinklab.streaming.prefill.generate`` and sinklab's own feeders do not warn."""

from __future__ import annotations

import warnings

import pytest
import torch

from sinklab.streaming import SinkCache
from sinklab.streaming.cache import long_calls_expected
from sinklab.streaming.prefill import generate, prefill
from test_streaming_cache import llama

BUDGET = 10  # n_sink 2 + window 8


@pytest.fixture(scope="module")
def model():
    return llama(layers=2, attn="sdpa")


def _long_call_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "more than the budget" in str(w.message)]


def _generate(model, n_prompt: int, **kw):
    ids = torch.randint(1, 80, (1, n_prompt), generator=torch.Generator().manual_seed(n_prompt))
    cache = SinkCache(model, n_sink=2, window=8)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.no_grad():
            model.generate(ids, past_key_values=cache, max_new_tokens=15, do_sample=False, pad_token_id=0, **kw)
    return _long_call_warnings(record), cache


def test_generate_with_a_prompt_above_the_budget_warns_once(model):
    got, cache = _generate(model, 25)
    assert len(got) == 1, got  # once for the cache: not per layer, not per decode step
    msg = got[0]
    assert "25 new tokens" in msg and f"budget of {BUDGET}" in msg and "sinklab.streaming.prefill.generate" in msg
    assert "\n" not in msg
    assert cache.kept_length() == BUDGET
    # a second long call through the same cache does not warn again
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with torch.no_grad():
            model(torch.randint(1, 80, (1, 30)), cache=cache, use_cache=True)
    assert not _long_call_warnings(record)


@pytest.mark.parametrize("n_prompt", [BUDGET, 4])
def test_a_prompt_within_the_budget_does_not_warn(model, n_prompt):
    got, cache = _generate(model, n_prompt)  # then 15 one-token steps: the cache evicts, no call above the budget
    assert got == [] and cache.get_seq_length() == n_prompt + 14


def test_chunked_prefill_and_sinklab_feeders_do_not_warn(model):
    ids = torch.randint(1, 80, (1, 40), generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        generate(model, ids, SinkCache(model, n_sink=2, window=8), max_new_tokens=3, do_sample=False, pad_token_id=0)
        generate(model, ids, SinkCache(model, n_sink=2, window=8), one_call=True, max_new_tokens=3, do_sample=False,
                 pad_token_id=0)  # one call asked for
        prefill(model, ids, SinkCache(model, n_sink=2, window=8), chunk=32)  # a chunk chosen above the budget
        with long_calls_expected(), torch.no_grad():
            model(ids, cache=SinkCache(model, n_sink=2, window=8), use_cache=True)
    assert not _long_call_warnings(record)
    with pytest.warns(UserWarning, match="40 new tokens, more than the budget of 10"):  # restored after the block
        with torch.no_grad():
            model(ids, cache=SinkCache(model, n_sink=2, window=8), use_cache=True)
