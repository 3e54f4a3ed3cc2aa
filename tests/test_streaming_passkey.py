"""The pass-key task (sinklab.streaming.passkey, `sinklab stream passkey`).

References: samples assembled by hand from the tokenizer's own ids of the filler, needle and
question; the answers against transformers' greedy `generate` on the same ids (full cache, and a
sink cache whose budget holds everything); accuracies recounted from the per-sample rows.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from helpers import char_tokenizer, run_cli_captured
from sinklab.errors import InputError
from sinklab.streaming.harness import CacheSpec, policy_specs, token_stream
from sinklab.streaming.passkey import NEEDLE, QUESTION, evaluate_passkey, passkey_samples
from sinklab.streaming.tasks.scoring import first_number
from test_streaming_cache import llama


DOCS = ["the sink token is the first one.", "a second document, with more words in it than the first.",
        "and a third one to fill the stream up to its length."] * 4


def test_samples_are_filler_needle_question():
    tok = char_tokenizer()
    samples = passkey_samples(tok, DOCS, 160, keys=3, depths=[0.0, 0.5, 1.0], seed=7)
    assert len(samples) == 9 and all(s.ids.numel() == 160 for s in samples)
    keys = [s.key for s in samples[:3]]
    assert len(set(keys)) == 3 and all(len(k) == 5 and k.isdigit() for k in keys)
    assert [s.key for s in passkey_samples(tok, DOCS, 160, keys=3, depths=[0.0], seed=7)] == keys  # the seed fixes them
    filler = token_stream(tok, DOCS, 200).tolist()
    q = tok(QUESTION, add_special_tokens=False)["input_ids"]
    for s in samples:
        nd = tok(NEEDLE.format(key=s.key), add_special_tokens=False)["input_ids"]
        F = 160 - len(nd) - len(q)
        assert s.at == 1 + round(s.depth * (F - 1))  # after the BOS
        assert s.ids.tolist() == filler[: s.at] + nd + filler[s.at : F] + q
    assert samples[0].at == 1 and samples[-1].ids.tolist()[samples[-1].at - 1] == filler[F - 1]
    assert tok.decode(samples[-1].ids[-len(q):]) == QUESTION


def test_samples_bad_input():
    tok = char_tokenizer()
    with pytest.raises(InputError, match="too short for the pass key task"):
        passkey_samples(tok, DOCS, 60, keys=2)
    with pytest.raises(InputError, match="depths must lie in"):
        passkey_samples(tok, DOCS, 160, depths=[1.5])
    with pytest.raises(InputError, match="keys must lie in"):
        passkey_samples(tok, DOCS, 160, keys=0)
    with pytest.raises(InputError, match=r"repeats a depth, \[0.0, 1.0, 1.0\]"):  # copies counted twice
        passkey_samples(tok, DOCS, 160, keys=2, depths=[0.0, 1.0, 1.0])


@pytest.mark.parametrize("reply,right", [("{key}. Remember", True), (" {key}1.", False), (" 1234 or {key}", False),
                                         ("{key}{key}", False), ("no digits", False)])
def test_the_answer_is_the_first_number_and_must_be_the_key_exactly(monkeypatch, reply, right):
    """The pass key's rule is the long-context tasks' first_number: the first run of digits, the key exactly (the
    earlier rule took the first 5 digits anywhere and scored "604941" right for the key 60494). The model's
    decoded reply is set by hand (the tokenizer's decode), so the rule alone decides."""
    tok = char_tokenizer()
    m = llama(layers=1, attn="sdpa").float()
    m.resize_token_embeddings(len(tok))
    samples = passkey_samples(tok, DOCS, 100, keys=2, depths=[0.0], seed=1)
    replies = iter([reply.format(key=s.key) for s in samples])
    monkeypatch.setattr(tok, "decode", lambda ids, **kw: next(replies))
    res = evaluate_passkey(m, tok, samples, CacheSpec("full", "full", None, None, policy="full"), batch=2,
                           max_context=128, progress=False)
    assert [r["correct"] for r in res.samples] == [right, right] and res.accuracy == float(right)
    assert [r["answer"] for r in res.samples] == [first_number(reply.format(key=s.key)) for s in samples]


@pytest.mark.parametrize("chunk", [1, 16])
def test_answers_equal_greedy_generate(chunk):
    """A full cache and a sink cache with room for everything answer as transformers' greedy generate;
    the accuracies are the share of rows whose answer is the key."""
    tok = char_tokenizer()
    m = llama(layers=2, attn="sdpa").float()
    m.resize_token_embeddings(len(tok))
    samples = passkey_samples(tok, DOCS, 100, keys=2, depths=[0.0, 1.0], seed=1)
    x = torch.stack([s.ids for s in samples])
    with torch.no_grad():
        gen = m.generate(x, max_new_tokens=8, do_sample=False, pad_token_id=0)[:, 100:]
    want = [tok.decode(g) for g in gen.tolist()]
    specs = [CacheSpec("full", "full", None, None, policy="full")] + policy_specs(["sinks+h2o"], [120], n_sink=2,
                                                                                   full=False, recompute=False)
    for spec in specs:
        res = evaluate_passkey(m, tok, samples, spec, batch=3, chunk=chunk, max_context=128, progress=False)
        texts = [r["text"] for r in res.samples]
        assert texts == want, spec.name
        correct = [r["answer"] == s.key for r, s in zip(res.samples, samples)]
        assert res.accuracy == sum(correct) / 4 and res.n == 4
        assert res.accuracy_by_depth == {"0.0": sum(correct[:2]) / 2, "1.0": sum(correct[2:]) / 2}


def test_evaluate_refuses_recompute_and_a_full_cache_past_the_context():
    tok = char_tokenizer()
    m = llama(layers=1)
    m.resize_token_embeddings(len(tok))
    samples = passkey_samples(tok, DOCS, 125, keys=1, depths=[0.5])
    with pytest.raises(InputError, match="not recompute"):
        evaluate_passkey(m, tok, samples, CacheSpec("recompute", "recompute", None, 8), progress=False)
    with pytest.raises(InputError, match="more than the model's context of 128"):
        evaluate_passkey(m, tok, samples, CacheSpec("full", "full", None, None), max_context=128, progress=False)


@pytest.mark.slow
def test_cli_passkey_writes_results_and_resumes(text_corpus_dir, tmp_path, capsys):
    tok = char_tokenizer()
    d = tmp_path / "char-llama"
    from helpers import tiny_llama

    tiny_llama(vocab_size=len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    out = tmp_path / "pk"
    argv = ["stream", "passkey", "--model", str(d), "--corpus", str(text_corpus_dir), "--tokens", "110",
            "--policy", "sinks,tova", "--budget", "32", "--n-sink", "2", "--keys", "2", "--depths",
            "0,0.5,1", "--batch", "4", "--chunk", "8", "--out", str(out)]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = json.loads((out / "passkey.json").read_text())
    assert [c["name"] for c in data["configs"]] == ["full", "sinks@32", "tova@32"]  # no recompute in this task
    assert data["keys"] == 2 and data["depths"] == [0.0, 0.5, 1.0] and data["command"].startswith("sinklab stream passkey")
    rows = pd.read_csv(out / "passkey.csv", dtype={"key": str, "answer": str})
    assert len(rows) == 3 * 6 and set(rows["config"]) == {"full", "sinks@32", "tova@32"}
    acc = pd.read_csv(out / "passkey_accuracy.csv")
    for (cfg, depth), g in rows.groupby(["config", "depth"]):
        a = acc[(acc["config"] == cfg) & (acc["depth"] == depth)]["accuracy"].item()
        assert a == pytest.approx(g["correct"].mean())
    assert (out / "passkey.png").stat().st_size > 0 and "tova@32" in stdout
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    again = json.loads((out / "passkey.json").read_text())
    assert [c["wall_s"] for c in again["configs"]] == [c["wall_s"] for c in data["configs"]]  # reused, not rerun


def test_an_answer_ends_at_eos_as_in_the_long_context_tasks():
    """A reply of EOS then the key is wrong (empty answer) in `sinklab stream passkey` as in the long-context tasks'
    evaluate_items: digits decoded after EOS used to count. The model is built by hand so that each next token
    depends on the current one only (attention and MLP outputs zeroed): ... 's' -> EOS -> the key's digits -> '.'."""
    from sinklab.streaming.tasks import evaluate_items
    from sinklab.streaming.tasks.items import TaskItem

    tok = char_tokenizer()
    m = llama(layers=1, attn="sdpa").float()
    m.resize_token_embeddings(len(tok))
    s = next(s for seed in range(100) for s in passkey_samples(tok, DOCS, 100, keys=1, depths=[0.5], seed=seed)
             if len(set(s.key)) == 5)
    with torch.no_grad():
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = m.model.embed_tokens.weight
        m.lm_head.weight.zero_()
        chain = [tok.convert_tokens_to_ids("s"), tok.eos_token_id] + tok.convert_tokens_to_ids(list(s.key + "."))
        for a, b in zip(chain, chain[1:]):
            m.lm_head.weight[b] = 20 * emb[a] / emb[a].norm()
    full = CacheSpec("full", "full", None, None, policy="full")
    with torch.no_grad():
        first = m(s.ids[None]).logits[0, -1].argmax().item()
    assert first == tok.eos_token_id  # the reply starts with EOS
    res = evaluate_passkey(m, tok, [s], full, batch=1, max_context=128, progress=False)
    assert res.samples[0]["text"] == "" and res.samples[0]["answer"] == "" and res.accuracy == 0.0
    q = len(tok(QUESTION, add_special_tokens=False)["input_ids"])
    ids = s.ids.tolist()
    item = TaskItem("passkey", 0, 100, 0.5, ids[:-q], ids[-q:], [s.key], 0, s.at)
    df = evaluate_items(m, tok, [item], None, 8, progress=False)
    assert df["output"].tolist() == [""] and df["score"].tolist() == [0.0]


def test_resume_reuses_only_the_same_model_and_sink_settings(text_corpus_dir):
    """The pass key resume key held the model's name only (a class name for a model in memory) and not the policies'
    n_sink or kv group, which their configuration names leave out: another model's answers, or those under another
    n_sink, were returned as this run's (outside audit, 2026-12-07). Each now reruns; the same settings still reuse."""
    from helpers import tiny_llama
    from sinklab.streaming.run import stream

    tok = char_tokenizer()
    a, b = tiny_llama(vocab_size=len(tok)), tiny_llama(vocab_size=len(tok))  # the same class, other weights:
    with torch.no_grad():
        for p in b.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    kw = dict(task="passkey", tokenizer=tok, progress=False, tokens=110, policies=["sinks"], budgets=[32], keys=2,
              depths=[0.0, 1.0], batch=4, chunk=8)

    def walls(r):
        return [c["wall_s"] for c in r["configs"]]

    ra = stream(a, str(text_corpus_dir), n_sink=2, **kw)
    again = stream(a, str(text_corpus_dir), n_sink=2, resume=dict(ra), **kw)
    assert walls(again) == walls(ra)  # same model, same settings: reused
    other_model = stream(b, str(text_corpus_dir), n_sink=2, resume=dict(ra), **kw)
    assert not set(walls(other_model)) & set(walls(ra)) and other_model["weights_sha"] != ra["weights_sha"]
    other_sinks = stream(a, str(text_corpus_dir), n_sink=4, resume=dict(ra), **kw)
    assert not set(walls(other_sinks)) & set(walls(ra))
    assert [c["n_sink"] for c in other_sinks["configs"] if c["name"] != "full"] == [4]


def test_resume_reruns_the_sink_caches_under_another_window(text_corpus_dir):
    """The sinks / window caches' names leave their window out, and the resume key did too: a run at window 64 resumed
    from one at window 8 returned the window-8 answers (outside review, 2026-12-07)."""
    from helpers import tiny_llama
    from sinklab.streaming.run import stream

    tok = char_tokenizer()
    m = tiny_llama(vocab_size=len(tok))
    kw = dict(task="passkey", tokenizer=tok, progress=False, tokens=110, sinks=[2], keys=2, depths=[0.0], batch=4,
              chunk=8, full=False)
    small = stream(m, str(text_corpus_dir), window=8, **kw)
    assert [c["wall_s"] for c in stream(m, str(text_corpus_dir), window=8, resume=dict(small), **kw)["configs"]] == \
        [c["wall_s"] for c in small["configs"]]  # same window: reused
    big = stream(m, str(text_corpus_dir), window=64, resume=dict(small), **kw)
    assert not {c["wall_s"] for c in big["configs"]} & {c["wall_s"] for c in small["configs"]}
