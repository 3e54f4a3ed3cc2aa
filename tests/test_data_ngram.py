"""The n-gram source (sinklab.data.ngram) against hand-worked corpora."""

import numpy as np
import pytest

from sinklab.data.ngram import NGramModel, make_config
from sinklab.data.tokens import TokenSplit
from sinklab.errors import ConfigError


def split_of(docs):
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(d) for d in docs])
    return TokenSplit(tokens=np.array([t for d in docs for t in d], dtype=np.uint16), offsets=offsets)


def test_deterministic_chain_is_reproduced():
    # every document cycles 3 -> 4 -> 5 -> 3: an order-2 model must follow the cycle after the first token
    docs = [[3, 4, 5, 3, 4, 5, 3], [5, 3, 4, 5]]
    out = NGramModel(split_of(docs), 2).sample(200, 12, backoff=0.0, seed=1)
    nxt = {3: 4, 4: 5, 5: 3}
    assert all(out[d, t + 1] == nxt[out[d, t]] for d in range(200) for t in range(11))
    assert set(np.unique(out[:, 0])) <= {3, 4, 5}


def test_conditional_frequencies_are_the_maximum_likelihood_estimate():
    # after context (1, 2): next is 7 twice, 8 once -> P(7) = 2/3 at order 3
    docs = [[1, 2, 7], [1, 2, 7], [1, 2, 8], [1, 2, 7, 1, 2, 8, 1, 2, 7]]
    m = NGramModel(split_of(docs), 3)
    out = m.sample(30000, 3, backoff=0.0, seed=0)
    rows = out[(out[:, 0] == 1) & (out[:, 1] == 2)]
    # occurrences of (1, 2) -> next: 7, 7, 8, 7, 8, 7: P(7) = 4/6
    assert len(rows) > 1000
    assert np.mean(rows[:, 2] == 7) == pytest.approx(4 / 6, abs=0.03)
    # documents start from the unigram: P(first = 1) = count(1) / n_tokens = 6 / 18
    assert np.mean(out[:, 0] == 1) == pytest.approx(6 / 18, abs=0.02)


def test_context_across_documents_is_not_counted():
    # inside documents 9 is always followed by 2; "9 then 1" only happens across a boundary
    docs = [[5, 9], [1, 5], [9, 2]]
    out = NGramModel(split_of(docs), 2).sample(2000, 6, backoff=0.0, seed=3)
    pairs = set(zip(out[:, :-1].ravel().tolist(), out[:, 1:].ravel().tolist()))
    assert all(b == 2 for a, b in pairs if a == 9) and (9, 2) in pairs


def test_backoff_mixes_the_lower_order():
    docs = [[1, 2, 3, 1, 2, 3, 1, 2, 3]]
    out = NGramModel(split_of(docs), 2).sample(5000, 4, backoff=0.5, seed=2)
    # with backoff the unigram is used half of the time: bigram-impossible pairs (1 -> 1) appear
    pairs = list(zip(out[:, :-1].ravel().tolist(), out[:, 1:].ravel().tolist()))
    p_11 = np.mean([p == (1, 1) for p in pairs if p[0] == 1])
    assert p_11 == pytest.approx(0.5 / 3, abs=0.03)  # backoff 0.5 x unigram P(1) = 1/3


def test_options_are_validated():
    with pytest.raises(ConfigError, match="ordr.*did you mean 'order'"):
        make_config({"ordr": 3})
    with pytest.raises(ConfigError, match="order"):
        make_config({"order": 7})
    with pytest.raises(ConfigError, match="backoff"):
        make_config({"backoff": 1.0})
