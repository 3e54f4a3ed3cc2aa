"""Long-context tasks (sinklab.streaming.tasks): needle, pass key and the RULER-style suite.

References: items taken apart by hand with a one-token-per-character tokenizer (a needle's token index
is its character index in the prompt text, the haystack a substring of the documents' text); scores on
hand-written continuations; the Wilson interval worked by hand; the runner's answers against
transformers' greedy ``generate`` on the same ids.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from helpers import char_tokenizer
from sinklab.errors import InputError, UnknownNameError
from sinklab.metrics import wilson_interval
from sinklab.streaming.tasks import (
    RULER_TASKS, TASKS, CacheFactory, accuracy_table, evaluate_items, make_items, needle_items, ruler_items,
    score_all_words, score_first_number, write_task_outputs,
)
from sinklab.streaming.tasks.needle import NEEDLE, QUESTION
from sinklab.streaming.tasks.ruler import VT_NOISE

DOCS = ["The sink token is the first one. It takes the attention of many heads! Why? Nobody knows for sure.",
        "A second document, with more words in it than the first. Words like apple, river, window and garden.",
        "And a third one to fill the stream up to its length. It ends here."] * 6
WORDS = [a + b for a in ("sun", "moon", "star", "tree", "rock", "leaf", "bird", "fish")
         for b in ("light", "stone", "fall", "song", "wood", "gate", "path", "hill")]
TEXT = "\n\n".join(DOCS * 2)  # every haystack body is a substring of this (documents read from any one on)


def tiny_llama():
    """A random float64 LLaMA (eager attention) over the character tokenizer's 100 ids, context 2048."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=2048, attn_implementation="eager",
                      bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).eval().double()


def test_registry_lists_every_task():
    assert TASKS.names() == ["needle", "passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
                             "variable_tracking", "common_words"]
    assert set(RULER_TASKS) <= set(TASKS.names())
    assert [TASKS.get(n).scorer for n in ("needle", "passkey")] == ["first_number"] * 2
    assert {TASKS.get(n).scorer for n in RULER_TASKS} == {"all_words"}
    assert not TASKS.get("common_words").has_depth and TASKS.get("variable_tracking").has_depth
    with pytest.raises(UnknownNameError, match="valid names: .*needle"):
        make_items(["neddle"], char_tokenizer(), DOCS, lengths=[300])


def test_items_are_seeded_and_deterministic():
    tok = char_tokenizer()
    kw = dict(lengths=[300], depths=[0.0, 0.5], n=2, words=WORDS)
    a = make_items(["needle", "niah_multikey", "variable_tracking"], tok, DOCS, **{**kw, "lengths": [520]}, seed=5)
    b = make_items(["needle", "niah_multikey", "variable_tracking"], tok, DOCS, **{**kw, "lengths": [520]}, seed=5)
    assert [(i.ids, i.answers, i.at) for i in a] == [(i.ids, i.answers, i.at) for i in b]
    c = make_items(["needle", "niah_multikey", "variable_tracking"], tok, DOCS, **{**kw, "lengths": [520]}, seed=6)
    assert all(x.answers != y.answers for x, y in zip(a, c))
    # an item does not depend on the other items asked for
    one = needle_items(tok, DOCS, lengths=[300], depths=[0.5], n=1, seed=5, words=WORDS)[0]
    grid = needle_items(tok, DOCS, lengths=[260, 300], depths=[0.0, 0.5], n=2, seed=5, words=WORDS)
    same = [i for i in grid if i.length == 300 and i.depth == 0.5 and i.index == 0]
    assert len(same) == 1 and same[0].ids == one.ids
    assert [(i.length, i.depth, i.index) for i in grid] == [(t, d, k) for t in (260, 300) for d in (0.0, 0.5)
                                                            for k in (0, 1)]


def test_needle_items_exact_length_and_depth():
    """Every needle item is exactly the length asked; with snap=0 the needle sits at token round(depth F)
    of the body, the body is a run of the documents' text, and the prompt is BOS + body[:p] + needle +
    body[p:] + question, character for character."""
    tok = char_tokenizer()
    for snap in (0, 32):
        items = needle_items(tok, DOCS, lengths=[240, 333], depths=[0.0, 0.3, 0.5, 1.0], n=2, seed=1, snap=snap,
                             words=WORDS)
        for it in items:
            assert it.n_tokens == it.length and it.ids[0] == 1  # <s>
            key, value = it.meta["key"], it.answers[0]
            needle = NEEDLE.format(key=key, value=value)
            text = tok.decode(it.ids[1:])
            assert text.count(needle) == 1 and it.at == 1 + text.index(needle)
            assert it.question == QUESTION.format(key=key) and len(value) == 7 and value.isdigit()
            body = text[: text.index(needle)] + text[text.index(needle) + len(needle) : -len(it.question)]
            F = it.meta["body_tokens"]
            assert len(body) == F and body in TEXT
            p = it.at - 1
            if snap == 0:
                assert p == round(it.depth * F)
            else:
                assert abs(p - it.depth * F) <= snap + 0.5
                assert p in (0, F) or (body[p - 1] in ".!?\n" and body[p].isspace())  # a sentence end
    assert {it.at for it in items if it.depth == 0.0} == {1}
    assert all(it.at == it.n_tokens - len(it.question_ids) - len(tok.encode(NEEDLE.format(key=it.meta["key"],
               value=it.answers[0]), add_special_tokens=False)) for it in items if it.depth == 1.0)


def test_ruler_items_hold_their_needles():
    tok = char_tokenizer()
    items = ruler_items(tok, DOCS, tasks=["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery"],
                        lengths=[700], depths=[0.0, 0.6], n=2, seed=2, snap=0, words=WORDS)
    for it in items:
        assert it.n_tokens == 700
        text = tok.decode(it.ids)
        n_answers = {"niah_single": 1, "niah_multikey": 1, "niah_multivalue": 4, "niah_multiquery": 4}[it.task]
        assert len(it.answers) == n_answers and len(set(it.answers)) == n_answers
        for v in it.answers:
            assert text.count(f" is {v}.") == 1
        starts = it.meta["needle_starts"]
        assert len(starts) == {"niah_multikey": 4, "niah_multiquery": 4}.get(it.task, n_answers)
        first = tok.decode(it.ids[starts[0]:])
        assert first.startswith(f" {'One of the hidden numbers' if it.task == 'niah_multivalue' else 'The hidden number'}"
                                f" for {it.meta['keys'][0]} is {it.answers[0]}.")
        assert all(k in it.question for k in it.meta["keys"])
        assert not any(k in it.question for k in it.meta["distractor_keys"])
        if it.task == "niah_multikey":
            assert len(it.meta["distractor_keys"]) == 3
            assert all(f"The hidden number for {k} is " in text for k in it.meta["distractor_keys"])
        assert it.meta["body_position"] == round(it.depth * it.meta["body_tokens"])


def test_variable_tracking_chain_in_order():
    tok = char_tokenizer()
    items = ruler_items(tok, DOCS, tasks=["variable_tracking"], lengths=[600], depths=[0.0, 0.5, 1.0], n=2, seed=4)
    noise = len(VT_NOISE)
    for it in items:
        assert it.n_tokens == 600 and len(it.answers) == 5 and all(len(a) == 5 and a.isupper() for a in it.answers)
        value = it.meta["value"]
        chain = [f"VAR {it.answers[0]} = {value}."] + [f"VAR {it.answers[j + 1]} = VAR {it.answers[j]}."
                                                       for j in range(4)]
        assert it.meta["chain"] == chain
        text = tok.decode(it.ids[1:])  # after <s>: character i is token i + 1
        places = [1 + text.index(s + "\n") for s in chain]
        assert places == sorted(places) and places == it.meta["statement_starts"]
        target = round(it.depth * it.meta["body_tokens"])
        snapped = it.meta["body_position"] % noise == 0 and abs(it.meta["body_position"] - target) <= 32
        assert it.meta["body_position"] == target or snapped  # the default snap, 32 tokens
        assert value in it.question
        assert it.context.count(VT_NOISE) == it.meta["body_tokens"] // noise - (it.meta["body_position"] % noise != 0)


def test_variable_tracking_starts_at_the_depths_token_without_snap():
    """snap 0: the first assignment at body token round(depth F), as every needle (it used to move to a noise
    sentence end whatever snap said: depth 0.5 of F 215 landed at 94, not 108)."""
    tok = char_tokenizer()
    items = ruler_items(tok, DOCS, tasks=["variable_tracking"], lengths=[520], depths=[0.25, 0.5, 0.75], n=1,
                        seed=0, snap=0)
    for it in items:
        assert it.meta["body_position"] == round(it.depth * it.meta["body_tokens"])
        assert it.at == it.meta["statement_starts"][0]
    assert any(it.meta["body_position"] % len(VT_NOISE) for it in items)  # not a sentence end: the snap was off


def test_common_words_counts_and_length():
    tok = char_tokenizer()
    for it in ruler_items(tok, DOCS, tasks=["common_words"], lengths=[1300, 1500], n=2, seed=3, words=WORDS):
        assert it.depth is None and it.at is None and len(it.answers) == 10
        listed = [w.split(". ", 1)[1] for w in __import__("re").findall(r"\d+\. [a-z]+", it.context)]
        counts = pd.Series(listed).value_counts()
        assert set(counts[counts == 6].index) == set(it.answers) and (counts.drop(it.answers) == 1).all()
        assert len(listed) == 60 + it.meta["n_other"]
        assert it.length - 20 <= it.n_tokens <= it.length  # one more list entry (<= 20 characters) would not fit
    with pytest.raises(InputError, match="too short for task common_words"):
        ruler_items(tok, DOCS, tasks=["common_words"], lengths=[700], words=WORDS)


def test_bad_grids_are_refused():
    tok = char_tokenizer()
    with pytest.raises(InputError, match="too short for task needle"):
        needle_items(tok, DOCS, lengths=[100], words=WORDS)
    with pytest.raises(InputError, match=r"depths must lie in \[0, 1\]"):
        needle_items(tok, DOCS, lengths=[300], depths=[1.5], words=WORDS)
    with pytest.raises(InputError, match="n \\(items per length and depth\\) must be >= 1"):
        needle_items(tok, DOCS, lengths=[300], n=0, words=WORDS)
    with pytest.raises(InputError, match="fewer than"):
        needle_items(tok, DOCS[:1], lengths=[400], words=WORDS)
    # a repeated length or depth gives token-identical items that the tables would count as independent ones
    # (n 4 for one item; outside audit, 2026-12-07): refused
    same = needle_items(tok, DOCS, lengths=[300], depths=[0.5], n=1, words=WORDS)
    assert len(same) == 1
    with pytest.raises(InputError, match=r"lengths repeats a value, \[300, 300\]"):
        needle_items(tok, DOCS, lengths=[300, 300], depths=[0.5], n=1, words=WORDS)
    with pytest.raises(InputError, match=r"depths repeats a value, \[0.5, 0.5\]"):
        needle_items(tok, DOCS, lengths=[300], depths=[0.5, 0.5], n=1, words=WORDS)


@pytest.mark.parametrize("output, answers, score", [
    (" 1234567.", ["1234567"], 1.0),
    (" 1234567 and 7654321", ["1234567"], 1.0),
    ("is: 1234567", ["1234567"], 1.0),
    (" 12345678", ["1234567"], 0.0),  # an extension is not the value
    (" 123456", ["1234567"], 0.0),  # nor a prefix
    (" 7654321 then 1234567", ["1234567"], 0.0),  # the first number counts
    (" no digits", ["1234567"], 0.0),
])
def test_first_number_scoring(output, answers, score):
    assert score_first_number(output, answers) == score


@pytest.mark.parametrize("output, answers, score", [
    (" ABCDE, FGHIJ and KLMNO.", ["ABCDE", "FGHIJ", "KLMNO"], 1.0),
    (" abcde, fghij", ["ABCDE", "FGHIJ", "KLMNO"], 2 / 3),  # case-insensitive
    (" ABCDEF and XKLMNO", ["ABCDE", "KLMNO"], 0.0),  # whole words only
    (" 1234567, 2345678", ["1234567", "345678"], 0.5),
    ("", ["apple"], 0.0),
])
def test_all_words_scoring(output, answers, score):
    assert score_all_words(output, answers) == pytest.approx(score, abs=1e-15)


def test_wilson_interval_hand_worked():
    """k = 1 of n = 4, z = 1.959964 (z^2 = 3.841459): centre (0.25 + 3.841459 / 8) / (1 + 3.841459 / 4)
    = 0.730182 / 1.960365 = 0.372473; half width 1.959964 sqrt(0.046875 + 3.841459 / 64) / 1.960365
    = 1.959964 x 0.326953 / 1.960365 = 0.326886; so (0.045587, 0.699359)."""
    lo, hi = wilson_interval(1, 4)
    assert (lo, hi) == pytest.approx((0.045587, 0.699359), abs=2e-6)
    assert wilson_interval(0, 3)[0] == 0.0 and wilson_interval(3, 3)[1] == 1.0  # exactly, not 5.6e-17 away
    assert wilson_interval(3, 3)[0] == pytest.approx(1 / (1 + 1.959964**2 / 3), abs=1e-6)  # n / (n + z^2) at k = n
    rows = pd.DataFrame({"config": ["full"] * 5, "task": ["needle"] * 5, "length": [100] * 4 + [200],
                         "depth": [0.5] * 4 + [float("nan")], "correct": [True, False, False, False, True],
                         "score": [1.0, 0.0, 0.5, 0.0, 1.0]})
    t = accuracy_table(rows)
    assert t[["length", "n", "correct"]].values.tolist() == [[100, 4, 1], [200, 1, 1]]
    assert t.loc[0, ["ci_low", "ci_high"]].tolist() == pytest.approx([0.045587, 0.699359], abs=2e-6)
    assert t.loc[0, "mean_score"] == pytest.approx(0.375) and math.isnan(t.loc[1, "depth"])


def test_full_cache_answers_equal_greedy_generate():
    """The full cache (cache_factory None) answers as transformers' greedy generate on the same ids, and so
    does a SinkCache that never evicts, fed in chunks of its window at cache positions; the question fed
    after the context (query_aware=False) changes nothing when nothing is evicted."""
    tok, model = char_tokenizer(), tiny_llama()
    items = needle_items(tok, DOCS, lengths=[200], depths=[0.0, 1.0], n=1, seed=3, words=WORDS)
    df = evaluate_items(model, tok, items, None, 4)
    for it, out in zip(items, df["output"]):
        g = model.generate(torch.tensor([it.ids]), max_new_tokens=4, do_sample=False, eos_token_id=2, pad_token_id=0)
        assert out == tok.decode(g[0, it.n_tokens:].tolist(), skip_special_tokens=True)
    assert df["config"].unique().tolist() == ["full"] and (df["chunk"] == df["n_tokens"]).all()
    roomy = evaluate_items(model, tok, items, CacheFactory("sinks", budget=210, n_sink=4), 4, query_aware=False)
    assert roomy["output"].tolist() == df["output"].tolist() and (roomy["chunk"] == 206).all()
    chunked = evaluate_items(model, tok, items, None, 4, chunk=120)
    assert chunked["output"].tolist() == df["output"].tolist()
    assert df["score"].tolist() == [score_first_number(o, [it.answers[0]]) for o, it in zip(df["output"], items)]
    assert (df["correct"] == (df["score"] == 1.0)).all() and df["length"].tolist() == [200, 200]


@pytest.mark.parametrize("factory", [
    CacheFactory("sinks", budget=40), CacheFactory("window", budget=40), CacheFactory("h2o", budget=40),
    CacheFactory("tova", budget=40), CacheFactory("detected-sinks", budget=40, n_sink=2),
    CacheFactory("sinks", budget=40, kv_bits=2, key_quant="channel", sinks_full_precision=4),
])
def test_every_policy_and_storage_runs(factory):
    """Every policy and storage runs under the runner (the attention-based ones switch a sdpa model to
    eager for the run); the rows name the configuration."""
    tok, model = char_tokenizer(), tiny_llama()
    model.set_attn_implementation("sdpa")
    items = needle_items(tok, DOCS, lengths=[200], depths=[0.5], n=1, seed=0, words=WORDS)
    df = evaluate_items(model, tok, items, factory, 3)
    assert df.loc[0, "config"] == factory.name and df.loc[0, "policy"] == factory.policy
    assert df.loc[0, "budget"] == 40 and df.loc[0, "kv_bits"] == factory.kv_bits
    assert df.loc[0, "chunk"] == 40 - (factory.n_sink if factory.n_sink is not None else
                                       (4 if factory.policy in ("sinks", "detected-sinks") else 0))
    assert 1 <= df.loc[0, "new_tokens"] <= 3 and model.config._attn_implementation == "sdpa"


def test_runner_refuses_and_writes(tmp_path):
    tok, model = char_tokenizer(), tiny_llama()
    long = needle_items(tok, DOCS * 4, lengths=[2040], depths=[0.5], n=1, words=WORDS)
    with pytest.raises(InputError, match="full cache needs 2052 positions"):
        evaluate_items(model, tok, long, None)  # 2040 + the needle's 12 answer tokens > 2048
    with pytest.raises(InputError, match="max_new_tokens must be >= 1"):
        evaluate_items(model, tok, long, None, 0)
    items = (needle_items(tok, DOCS, lengths=[300], depths=[0.0, 1.0], n=1, words=WORDS)
             + ruler_items(tok, DOCS, tasks=["common_words"], lengths=[1300], n=1, words=WORDS))
    df = pd.concat([evaluate_items(model, tok, items, f, 2) for f in (None, CacheFactory("sinks", budget=260))])
    write_task_outputs(tmp_path, df, {"title": "t", "seed": 0})
    acc = pd.read_csv(tmp_path / "accuracy.csv")
    assert acc["n"].sum() == 6 and set(acc["config"]) == {"full", "sinks@260"}
    assert acc["depth"].isna().sum() == 2  # common_words: no depth
    assert len(pd.read_csv(tmp_path / "items.csv")) == 6 and (tmp_path / "heatmap.png").stat().st_size > 1000
    assert json.loads((tmp_path / "tasks.json").read_text())["seed"] == 0


def test_variable_tracking_past_the_last_sentence_end_puts_the_chain_after_its_first_statement():
    """With snap 0 near depth 1 the first assignment can land after the last noise-sentence end: choosing the later
    statements' places among none raised IndexError (outside audit, 2026-12-07). They now follow it, in order."""
    tok = char_tokenizer()
    items = ruler_items(tok, DOCS, tasks=["variable_tracking"], lengths=[520], depths=[0.99, 1.0], n=2, seed=0,
                        snap=0)
    noise = len(VT_NOISE)
    assert any(it.meta["body_position"] > it.meta["body_tokens"] // noise * noise for it in items)  # the case
    for it in items:
        text = tok.decode(it.ids[1:])  # after <s>: character i is token i + 1
        places = [1 + text.index(s + "\n") for s in it.meta["chain"]]
        assert places == sorted(places) and places == it.meta["statement_starts"]
