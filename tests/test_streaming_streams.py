"""Many streams (issue 35 part 2): one document per stream over several corpora, every configuration on
every stream, each figure with a t-interval over streams, paired comparisons that decide only where the
interval excludes zero. References: the documents tokenized by hand, each stream evaluated alone with
evaluate_stream, the intervals recomputed from the per-stream numbers with sinklab.metrics.intervals
(itself checked against printed t tables in test_metrics_intervals.py)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from helpers import WORDS, run_cli_captured
from sinklab.errors import InputError
from sinklab.metrics.intervals import t_interval
from sinklab.streaming.streams import document_streams, split_counts, summarize_streams


def _corpus(root, name, n, lengths, seed):
    d = root / name
    d.mkdir()
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        idx = torch.randint(0, len(WORDS), (lengths[i],), generator=g).tolist()
        (d / f"doc{i}.txt").write_text(" ".join(WORDS[j] for j in idx))
    return d


@pytest.fixture
def two_corpora(tmp_path):
    a = _corpus(tmp_path, "ca", 4, [60, 10, 60, 60], 1)  # doc1 is too short for 40 tokens
    b = _corpus(tmp_path, "cb", 3, [60, 60, 60], 2)
    return a, b


def test_split_counts():
    assert split_counts(8, 2) == [4, 4] and split_counts(7, 2) == [4, 3] and split_counts(3, 3) == [1, 1, 1]


def test_document_streams_one_document_each_evenly_spaced(two_corpora, tokenizer):
    from sinklab.zoo.corpora import load_corpus

    ca, cb = (load_corpus(str(p)) for p in two_corpora)
    got = document_streams(tokenizer, [ca, cb], 5, 40)
    # ca: eligible documents 0, 2, 3 (doc1 has 10 words); 3 streams of 3 eligible: all of them
    # cb: 2 streams of 3 eligible: floor(0.5 * 3 / 2) = 0, floor(1.5 * 3 / 2) = 2
    assert [(s.corpus, s.document) for s in got] == [(ca.name, 0), (ca.name, 2), (ca.name, 3), (cb.name, 0),
                                                    (cb.name, 2)]
    words = ca.documents[2].split()[:39]
    assert got[1].ids.tolist() == [tokenizer.bos_token_id] + tokenizer.convert_tokens_to_ids(words)
    with pytest.raises(InputError, match="tokens"):
        document_streams(tokenizer, [ca, cb], 8, 40)  # ca has 3 documents of 40 tokens, not 4
    with pytest.raises(InputError, match="streams"):
        document_streams(tokenizer, [ca, cb], 1, 40)


def test_summary_and_paired_comparisons_from_the_per_stream_numbers():
    """Hand-made per-stream results: A's NLL is B's - 0.1 on every stream (decided), C's wanders around
    B's (inconclusive); the summary's numbers are the t-intervals of the per-stream ones."""
    def cfg(name, ppl, kl, top1):
        return {"name": name, "policy": name, "budget": 8, "n_sink": 0, "window": 8, "kv_bits": 16, "ppl": ppl,
                "kl": kl, "top1": top1, "nll_by_chunk": [math.log(ppl)], "kl_by_chunk": [kl], "top1_by_chunk": [top1],
                "latency_ms_per_token": 1.0, "cache_bytes": 10, "evaluated": 5}
    nll_b = [2.0, 2.5, 3.0, 2.2]
    wobble = [0.05, -0.04, 0.03, -0.05]
    streams = [{"info": {"corpus": "c", "document": i, "title": str(i)},
                "configs": [cfg("A", math.exp(x - 0.1), 0.01 * (i + 1), 0.9),
                            cfg("B", math.exp(x), 0.02 * (i + 1), 0.8),
                            cfg("C", math.exp(x + w), 0.02 * (i + 1) + w / 10, 0.8 + w)]}
               for i, (x, w) in enumerate(zip(nll_b, wobble))]
    configs, comps = summarize_streams(streams)
    a = next(c for c in configs if c["name"] == "A")
    iv = t_interval([x - 0.1 for x in nll_b])
    assert a["nll"] == pytest.approx(iv.mean) and a["nll_low"] == pytest.approx(iv.low)
    assert a["ppl"] == pytest.approx(math.exp(iv.mean)) and a["ppl_high"] == pytest.approx(math.exp(iv.high))
    kl = t_interval([0.01, 0.02, 0.03, 0.04])
    assert (a["kl"], a["kl_low"], a["kl_high"]) == pytest.approx((kl.mean, kl.low, kl.high))
    assert a["n_streams"] == 4 and a["top1_low"] == pytest.approx(0.9)  # zero spread: zero width
    verdict = {(c["figure"], c["a"], c["b"]): c["better"] for c in comps}
    assert verdict[("nll", "A", "B")] == "A"  # exactly 0.1 lower on every stream
    assert verdict[("kl", "A", "B")] == "A" and verdict[("top1", "A", "B")] == "A"
    assert verdict[("nll", "B", "C")] == "inconclusive"
    ab = next(c for c in comps if (c["figure"], c["a"], c["b"]) == ("nll", "A", "B"))
    assert ab["diff_mean"] == pytest.approx(-0.1) and ab["ppl_ratio"] == pytest.approx(math.exp(-0.1))


def test_a_full_cache_stopped_at_the_context_is_compared_over_its_own_positions(tmp_path, tokenizer):
    """Streams longer than the model's context (32 positions): the full cache scores positions 0..30 only, the
    window all 39. The paired nll comparison full vs window rests on the positions both scored: window's
    perplexity over them equals its perplexity on the same streams cut to the context (it compared full's 31
    positions with window's 39)."""
    from sinklab.streaming import stream
    from helpers import tiny_llama

    model = tiny_llama(vocab_size=len(tokenizer), max_position_embeddings=32)
    corpus = _corpus(tmp_path, "c", 3, [60, 60, 60], 3)
    kw = dict(tokenizer=tokenizer, corpus=str(corpus), streams=3, window=8, sinks=(0,), recompute=False, progress=False)
    long, cut = stream(model, tokens=40, **kw), stream(model, tokens=32, **kw)
    per = lambda res, name: [{c["name"]: c for c in s["configs"]}[name] for s in res["streams"]]  # noqa: E731
    assert {c["evaluated"] for c in per(long, "full")} == {31} and {c["evaluated"] for c in per(long, "window")} == {39}
    assert {c["evaluated"] for c in per(cut, "window")} == {31}
    ref = [math.log(f["ppl"]) - math.log(w["ppl"]) for f, w in zip(per(long, "full"), per(cut, "window"))]
    for c, w in zip(per(long, "window"), per(cut, "window")):  # its perplexity over the reference positions
        assert c["agreement_positions"] == 31 and c["ppl_agreement"] == pytest.approx(w["ppl"], rel=1e-6)
    before = t_interval([math.log(f["ppl"]) - math.log(w["ppl"]) for f, w in zip(per(long, "full"), per(long, "window"))])
    row = next(c for c in long["comparisons"] if c["figure"] == "nll")
    assert (row["a"], row["b"], row["positions"]) == ("full", "window", "reference")
    assert row["diff_mean"] == pytest.approx(t_interval(ref).mean, rel=1e-6, abs=1e-9)
    assert abs(row["diff_mean"] - before.mean) > 1e-4  # what it was: full's 31 positions against window's 39
    same = next(c for c in cut["comparisons"] if c["figure"] == "nll")
    assert same["positions"] == "scored" and same["diff_mean"] == pytest.approx(row["diff_mean"], rel=1e-6, abs=1e-9)


def test_a_pair_scored_over_different_positions_without_a_reference_is_left_out_with_a_warning():
    """A full cache that stopped at the context (31 positions) against a window that scored 39, with no
    ppl_agreement (agreement off, or an older stream.json): not comparable, so the pair's nll row is left out,
    and a warning says so (it vanished silently)."""
    def cfg(name, n, ppl):
        return {"name": name, "ppl": ppl, "kl": None, "top1": None, "evaluated": n, "positions": [0, n - 1],
                "agreement_positions": 0, "latency_ms_per_token": None, "cache_bytes": 0, "nll_by_chunk": []}
    streams = [{"info": {"corpus": "c", "document": i, "title": str(i)},
                "configs": [cfg("full", 31, 10.0 + i), cfg("window", 39, 11.0 + i)]} for i in range(3)]
    with pytest.warns(UserWarning, match=r"full vs window: 3 stream\(s\) left out"):
        _, comps = summarize_streams(streams)
    assert comps == []


@pytest.mark.integration
def test_multi_stream_run_equals_each_stream_alone_and_writes_intervals(two_corpora, tiny_model_dir, tmp_path,
                                                                       capsys):
    from sinklab.models import load_model
    from sinklab.streaming.harness import evaluate_stream, policy_specs
    from sinklab.zoo.corpora import load_corpus

    ca, cb = two_corpora
    out = tmp_path / "ms"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", f"{ca},{cb}", "--streams", "4", "--tokens", "40",
            "--policy", "window,sinks", "--budget", "12", "--n-sink", "2", "--window", "12", "--no-recompute",
            "--out", str(out)]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = json.loads((out / "stream.json").read_text())
    assert len(data["streams"]) == 4 and data["n_streams"] == 4
    assert [c["name"] for c in data["configs"]] == ["full", "window@12", "sinks@12"]
    # stream 2 (corpus cb, document 0) evaluated alone gives the same per-stream numbers
    loaded = load_model(str(tiny_model_dir))
    tok = loaded.tokenizer
    ids = document_streams(tok, [load_corpus(str(ca)), load_corpus(str(cb))], 4, 40)[2].ids
    alone = {r.name: r for r in evaluate_stream(loaded.model, ids, policy_specs(["window", "sinks"], [12], n_sink=2,
                                                window=12, recompute=False), chunk=12, latency_steps=2,
                                                max_context=loaded.info.max_context, progress=False)}
    st = {c["name"]: c for c in data["streams"][2]["configs"]}
    assert st["sinks@12"]["ppl"] == pytest.approx(alone["sinks@12"].ppl, rel=1e-6)
    assert st["sinks@12"]["kl"] == pytest.approx(alone["sinks@12"].kl, rel=1e-5)
    summary = {c["name"]: c for c in data["configs"]}
    kls = [{c["name"]: c for c in s["configs"]}["window@12"]["kl"] for s in data["streams"]]
    iv = t_interval(kls)
    assert (summary["window@12"]["kl"], summary["window@12"]["kl_low"]) == pytest.approx((iv.mean, iv.low))
    assert summary["full"]["kl"] == 0.0 and summary["full"]["top1"] == 1.0
    comps = pd.read_csv(out / "stream_comparisons.csv")
    assert set(comps["figure"]) == {"nll", "kl", "top1"}
    assert set(comps["better"]) <= {"window@12", "sinks@12", "full", "inconclusive"}
    assert len(pd.read_csv(out / "stream_by_stream.csv")) == 12
    assert "--streams 4" in data["command"] and "95% t-intervals" in stdout
    lines = stdout.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("config"))
    table = lines[head: next(i for i, l in enumerate(lines) if l.startswith("means over"))]
    assert len(table) == 1 + len(data["configs"]) and len({len(l) for l in table}) == 1  # columns aligned
    # resumes: the same call reuses every stream
    code, _, err = run_cli_captured(argv, capsys)
    again = json.loads((out / "stream.json").read_text())
    assert code == 0 and [s["configs"] for s in again["streams"]] == [s["configs"] for s in data["streams"]]
    # a resumed run records the invocations whose streams it reuses (here: resumed once more, one at a time)
    assert "earlier_invocations" not in data
    assert [(e["command"], e["streams_done"]) for e in again["earlier_invocations"]] == [(data["command"], 4)]
    code, _, err = run_cli_captured([*argv, "--stream-batch", "1"], capsys)
    third = json.loads((out / "stream.json").read_text())
    assert code == 0 and "--stream-batch 1" in third["command"] and third["stream_batch"] == 1
    assert [e["command"] for e in third["earlier_invocations"]] == [data["command"], again["command"]]
    assert third["earlier_invocations"][0]["stream_batch"] == data["stream_batch"] == 4
    assert third["earlier_invocations"][0]["code"] == data["code"]
