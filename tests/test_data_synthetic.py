"""Bigram-Backcopy synthetic source: the rule, the transition statistics, and the trainer hook."""

import numpy as np
import pytest

from sinklab.data.packing import PackedData, PackingContext, make_packer
from sinklab.data.synthetic import (BigramBackcopyConfig, bigram_backcopy, load_synthetic, transition_matrix,
                                    vocab_size)
from sinklab.errors import ConfigError, UnknownNameError


def test_copy_rule_and_no_trigger_copies():
    cfg = BigramBackcopyConfig(vocab=16, n_triggers=3, n_train_docs=10, n_val_docs=1, seed=3)
    x = bigram_backcopy(cfg, 400, 40, 0)
    trig = set(cfg.triggers.tolist())
    assert x.min() >= 0 and x.max() < 16
    assert not np.isin(x[:, 0], cfg.triggers).any()  # first token is never a trigger
    n_copies = 0
    for row in x:
        for t in range(2, len(row)):
            if row[t - 1] in trig:
                assert row[t] == row[t - 2]  # back-copy rule
                assert row[t - 2] not in trig  # the token before a trigger is never a trigger
                n_copies += 1
    assert n_copies > 100  # the rule was actually exercised


def test_non_trigger_transitions_follow_the_matrix():
    cfg = BigramBackcopyConfig(vocab=6, n_triggers=1, alpha=1.0, seed=1)
    P = transition_matrix(cfg)
    np.testing.assert_allclose(P.sum(1), 1.0)
    x = bigram_backcopy(cfg, 4000, 30, 0)
    prev, nxt = x[:, :-1].ravel(), x[:, 1:].ravel()
    counts = np.zeros((6, 6))
    np.add.at(counts, (prev, nxt), 1)
    for a in range(5):  # non-trigger rows: empirical frequencies match P within sampling error
        emp = counts[a] / counts[a].sum()
        se = np.sqrt(P[a] * (1 - P[a]) / counts[a].sum())
        assert np.all(np.abs(emp - P[a]) < 5 * se + 1e-3)


def test_corpus_windows_are_bos_doc_eos():
    tc = load_synthetic("synthetic-bigram-backcopy", {"vocab": 10, "n_train_docs": 20, "n_val_docs": 4}, seq_len=16)
    assert tc.vocab_size == vocab_size("synthetic-bigram-backcopy", {"vocab": 10}) == 12
    assert (tc.eos_id, tc.bos_id) == (10, 11)
    ctx = PackingContext(eos_id=tc.eos_id, bos_id=tc.bos_id, vocab_size=tc.vocab_size)
    data = PackedData(tc.train, make_packer("bos", ctx), 16)
    assert data.n_windows == 20
    ids, _ = data.window(3)
    assert ids[0] == 11 and ids[-1] == 10 and len(ids) == 17
    np.testing.assert_array_equal(ids[1:-1], tc.train.doc(3))


def test_bad_options():
    with pytest.raises(ConfigError, match="n_trigers"):
        load_synthetic("synthetic-bigram-backcopy", {"n_trigers": 2}, seq_len=16)
    with pytest.raises(UnknownNameError):
        load_synthetic("synthetic-nope", {}, seq_len=16)
    with pytest.raises(ConfigError):
        BigramBackcopyConfig(vocab=8, n_triggers=8)


def test_run_config_uses_synthetic_vocabulary():
    from sinklab.runs.config import load_config

    cfg = load_config("emergence-cpu", ["data.synthetic.vocab=32"])
    assert cfg.model.vocab_size == 34
