"""Downstream next to the sink (issue 24 item 6): the offline cloze task, its scoring against a naive
float64 computation, the held-out loss, and `measure --cloze` / `compare` end to end."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from helpers import run_cli_captured, synthetic_run_toml
from sinklab.errors import InputError
from sinklab.measure import downstream as ds


class WordTokenizer:
    """Whitespace tokenizer over a fixed vocabulary (what the builders need of a transformers tokenizer)."""

    def __init__(self, words):
        self.vocab = {w: i for i, w in enumerate(words)}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab[w] for w in text.split()]}


class BigramLM(torch.nn.Module):
    """logits[t] = table[ids[t]]: a causal LM whose log-likelihoods are easy to compute by hand."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table.float())

    def forward(self, ids):
        return SimpleNamespace(logits=self.table[ids])


def _docs(n_docs=6, n_sent=5):
    words = [f"w{d}_{k}" for d in range(n_docs) for k in range(10 * n_sent)]
    docs = []
    for d in range(n_docs):
        sents = [" ".join(f"w{d}_{10 * s + k}" for k in range(10)) + "." for s in range(n_sent)]
        docs.append(" ".join(sents))
    return docs, WordTokenizer([w + p for w in words for p in ("", ".")])


def test_split_sentences_hand_worked():
    assert ds.split_sentences('He said "Go." Then he left! Why? ok') == ['He said "Go."', "Then he left!", "Why?", "ok"]


def test_text_items_hold_the_true_ending_and_endings_of_other_documents():
    docs, tok = _docs()
    items = ds.text_cloze_items(docs, tok, 12, seed=3)
    inv = {i: w for w, i in tok.vocab.items()}
    answers = []
    for it in items:
        ctx = [inv[i] for i in it.context]
        doc = ctx[-1].split("_")[0]  # every word names its document
        true = [inv[i] for i in it.endings[it.answer]]
        # the true ending continues the context's last sentence: the next word indices, 10 words in all
        first = int(ctx[-1].split("_")[1].rstrip(".")) + 1
        assert [w.rstrip(".") for w in true] == [f"{doc}_{k}" for k in range(first, first + len(true))]
        assert len(ctx) >= 5 and (first % 10) + len(true) == 10
        others = {inv[e[0]].split("_")[0] for j, e in enumerate(it.endings) if j != it.answer}
        assert doc not in others and len(others) == 3  # three distinct other documents
        answers.append(it.answer)
    assert len(set(answers)) > 1  # the true ending's slot varies
    with pytest.raises(InputError, match="at least 4 documents"):
        ds.text_cloze_items(docs[:3], tok, 2)
    with pytest.raises(InputError, match="usable sentences"):
        ds.text_cloze_items(docs, tok, 1000)


def test_token_items_are_spans_at_the_same_offset():
    docs = [np.arange(100 * d, 100 * d + 40) for d in range(10)]
    items = ds.token_cloze_items(docs, 5, context_len=24, ending_len=8, seed=1)
    for it in items:
        d = it.context[0] // 100
        assert it.context == list(range(100 * d, 100 * d + 24))
        assert it.endings[it.answer] == list(range(100 * d + 24, 100 * d + 32))
        for j, e in enumerate(it.endings):
            if j != it.answer:
                assert e[0] // 100 != d and e == list(range(e[0], e[0] + 8)) and e[0] % 100 == 24
    with pytest.raises(InputError, match="documents of >= 32 tokens"):
        ds.token_cloze_items([np.arange(10)] * 8, 2)


def test_scores_equal_a_naive_float64_computation():
    g = torch.Generator().manual_seed(0)
    V = 7
    table = torch.randn(V, V, generator=g, dtype=torch.float64) * 2
    model = BigramLM(table)
    t = table.float().double()  # the model computes in float32 parameters, upcast before log_softmax
    prefix, context, ending = [6], [1, 2], [3, 0, 5]
    got = ds.ending_logprobs(model, context, ending, prefix)
    ids = prefix + context + ending
    want = []
    for i, tok in enumerate(ending):
        prev = ids[len(prefix) + len(context) + i - 1]
        row = t[prev]
        want.append(float(row[tok] - torch.logsumexp(row, 0)))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)

    # items whose answer is decided by hand: a table that makes i -> i + 1 near-certain
    table = torch.full((V, V), -10.0)
    for i in range(V):
        table[i, (i + 1) % V] = 10.0
    model = BigramLM(table)
    good = ds.ClozeItem([0, 1], [[4, 5], [2, 3], [6, 0]], answer=1)
    bad = ds.ClozeItem([0, 1], [[2, 3], [4, 5], [6, 0]], answer=2)
    r = ds.score_cloze(model, [good, good, bad, good])
    assert r["accuracy"] == 75.0 and r["accuracy_sum"] == 75.0 and r["n_items"] == 4 and r["n_choices"] == 3
    assert r["chance"] == pytest.approx(100 / 3)
    lo, hi = ds.wilson_interval(3, 4)
    assert r["accuracy_ci"] == pytest.approx([100 * lo, 100 * hi])


def test_length_normalisation_differs_from_the_sum():
    """A long ending of likely tokens beats a short one on the mean but not on the sum."""
    V = 5
    table = torch.zeros(V, V)
    table[0, 1] = 3.0  # 0 -> 1 likely
    table[1, 2] = 1.0
    table[2, 2] = 1.0
    model = BigramLM(table)
    it = ds.ClozeItem([0], [[1], [1, 2, 2, 2]], answer=1)
    r = ds.score_cloze(model, [it])
    lp_short = ds.ending_logprobs(model, [0], [1])
    lp_long = ds.ending_logprobs(model, [0], [1, 2, 2, 2])
    assert lp_long.mean() < lp_short.mean() and lp_long.sum() < lp_short.sum()  # the short one wins on both here
    assert r["accuracy"] == 0.0 and r["accuracy_sum"] == 0.0
    table[1, 2] = 6.0
    table[2, 2] = 6.0
    lp_long = ds.ending_logprobs(model, [0], [1, 2, 2, 2])
    lp_short = ds.ending_logprobs(model, [0], [1])
    assert lp_long.mean() > lp_short.mean() and lp_long.sum() < lp_short.sum()
    r = ds.score_cloze(model, [it])
    assert r["accuracy"] == 100.0 and r["accuracy_sum"] == 0.0


def test_wilson_interval_known_values():
    lo, hi = ds.wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    lo, hi = ds.wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-12) and hi == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(v) for v in ds.wilson_interval(0, 0))


def test_heldout_loss_equals_a_loop():
    g = torch.Generator().manual_seed(1)
    table = torch.randn(6, 6, generator=g)
    model = BigramLM(table)
    x = torch.randint(0, 6, (5, 9), generator=g)
    want, n = 0.0, 0
    t = table.double()
    for row in x.tolist():
        for a, b in zip(row[:-1], row[1:]):
            want -= float(t[a, b] - torch.logsumexp(t[a], 0))
            n += 1
    assert ds.heldout_loss(model, x, batch_size=2) == pytest.approx(want / n, rel=1e-9)


def test_heldout_loss_of_a_prefix_lm_is_its_training_loss():
    """A run trained with train.prefix_len = p had its held-out loss computed under the plain causal mask over
    all T - 1 targets. It is the training objective's now: the bidirectional prefix, and only the targets from
    position p - 1 on (CausalObjective on apply_prefix_mask's targets, another route to the same number)."""
    from sinklab.data.packing import apply_prefix_mask
    from sinklab.nn import ModelConfig, SinkLM
    from sinklab.train.objective import CausalObjective

    torch.manual_seed(0)
    model = SinkLM(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=16)).eval()
    x = torch.randint(0, 40, (5, 12), generator=torch.Generator().manual_seed(2))
    p = 4
    sums = CausalObjective(prefix_len=p).eval_sums(model, x[:, :-1], apply_prefix_mask(x[:, 1:].clone(), p), 0)
    got = ds.heldout_loss(model, x, batch_size=2, prefix_len=p)
    assert sums[1] == 5 * (12 - p) and got == pytest.approx(sums[0] / sums[1], rel=1e-6)
    assert abs(got - ds.heldout_loss(model, x, batch_size=2)) > 1e-3  # the causal loss over every target
    with pytest.raises(InputError, match="prefix_len"):
        ds.heldout_loss(model, x, prefix_len=12)


@pytest.mark.integration
def test_measure_cloze_on_a_run_and_compare(tmp_path, capsys, tiny_model_dir):
    """`measure --cloze` on a synthetic training run (token-span items) and on an HF model (sentences),
    then `compare` shows the columns; results.json keeps the numbers."""
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    f = tmp_path / "run.toml"
    f.write_text(synthetic_run_toml(steps=2))
    run = tmp_path / "run"
    loop.train(load_config(f), run, progress=False)
    code, out, err = run_cli_captured(["measure", "--model", str(run), "--cloze", "6", "--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "a" / "results.json").read_text())
    c = res["downstream"]["cloze"]
    assert c["n_items"] == 6 and c["n_choices"] == 4 and "token spans" in c["source"]
    assert 0 <= c["accuracy"] <= 100 and "cloze:" in out
    assert res["downstream"]["heldout_loss"] > 0
    assert "--cloze 6" in res["command"] or res["config"]["cloze"] == 6

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["the", "a", "of", "and", "to", "in", "is", "it"]
    rng = np.random.default_rng(0)
    for d in range(5):
        sents = [" ".join(rng.choice(words, size=10)) + "." for _ in range(6)]
        (corpus / f"d{d}.txt").write_text(" ".join(sents))
    code, out, err = run_cli_captured(["measure", "--model", str(tiny_model_dir), "--corpus", str(corpus), "-n", "2",
                                       "-t", "10", "--cloze", "5", "--out", str(tmp_path / "b")], capsys)
    assert code == 0, err
    code, out, err = run_cli_captured(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")],
                                      capsys)
    assert code == 0, err
    models = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    for folder, row in zip(("a", "b"), models.itertuples()):
        d = json.loads((tmp_path / folder / "results.json").read_text())["downstream"]
        assert row.cloze_accuracy == pytest.approx(d["cloze"]["accuracy"])
        assert row.heldout_loss == pytest.approx(d["heldout_loss"])
    assert "cloze (%)" in out
