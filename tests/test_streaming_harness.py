"""sinklab stream: the parallel sinks + window forward, the harness, the CLI.

References: the token-by-token SinkCache (an independent implementation of the same semantics),
a plain forward for the full cache, a from-scratch forward per window for recompute, and token
ids assembled by hand.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from helpers import run_cli_captured, tiny_gpt2, tiny_neox
from sinklab.errors import InputError
from sinklab.streaming import SinkCache, cache_specs, evaluate_stream, token_stream
from sinklab.streaming.harness import CacheSpec, run_recompute, stream_nll, stream_nll_decode
from sinklab.streaming.parallel import sink_window_mode
from test_streaming_cache import llama, stream_logits, tiny_gemma3


def parallel_logits(model, ids, n_sink, window, block=5):
    with torch.no_grad(), sink_window_mode(model, n_sink, window, block=block):
        return model(ids).logits


@pytest.mark.parametrize("n_sink,window", [(2, 8), (0, 6), (4, 3), (1, 60), (3, 1)])
def test_parallel_forward_equals_token_by_token_cache(n_sink, window):
    m = llama(layers=3)
    ids = torch.randint(0, 80, (2, 45), generator=torch.Generator().manual_seed(0))
    ref = stream_logits(m, ids, SinkCache(m, n_sink=n_sink, window=window), cache_positions=True)
    assert torch.allclose(parallel_logits(m, ids, n_sink, window), ref, atol=1e-6)
    assert m.config._attn_implementation == "eager"  # restored


def test_parallel_full_is_plain_causal_attention():
    m = llama(layers=2)
    ids = torch.randint(0, 80, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(parallel_logits(m, ids, 0, None), m(ids).logits, atol=1e-6)


def test_parallel_forward_partial_rotary_and_gemma3():
    neox = tiny_neox().double()
    ids = torch.randint(0, 80, (1, 30), generator=torch.Generator().manual_seed(2))
    ref = stream_logits(neox, ids, SinkCache(neox, n_sink=2, window=5), cache_positions=True)
    assert torch.allclose(parallel_logits(neox, ids, 2, 5), ref, atol=1e-6)

    gemma = tiny_gemma3(sliding_window=4)
    ref = stream_logits(gemma, ids, SinkCache(gemma, n_sink=2, window=6), cache_positions=True)
    assert torch.allclose(parallel_logits(gemma, ids, 2, 6), ref, atol=1e-6)


def test_stream_nll_parallel_decode_and_reference_agree():
    m = llama(layers=2).float()
    ids = torch.randint(0, 80, (40,), generator=torch.Generator().manual_seed(3))
    spec = CacheSpec("sinks_2", "sink", 2, 7)
    par = stream_nll(m, ids, spec, max_context=128, block=8)
    dec = stream_nll_decode(m, ids, spec, max_context=128, progress=False)
    assert sorted(par) == list(range(39)) and sorted(dec) == list(range(39))
    assert max(abs(par[t] - dec[t]) for t in par) < 1e-4
    full = stream_nll(m, ids, CacheSpec("full", "full", None, None), max_context=30, block=8)
    with torch.no_grad():
        logits = m(ids[None, :30]).logits[0, :-1].double()
    ce = torch.nn.functional.cross_entropy(logits, ids[1:30], reduction="none")
    assert sorted(full) == list(range(29))  # the full cache stops at the model's context
    assert torch.allclose(torch.tensor([full[t] for t in range(29)], dtype=torch.float64), ce, atol=1e-5)


def test_recompute_scores_each_window_from_scratch():
    m = llama(layers=2).float()
    ids = torch.randint(0, 80, (30,), generator=torch.Generator().manual_seed(4))
    res = run_recompute(m, ids, CacheSpec("recompute", "recompute", None, 6), chunk=10, every=4, progress=False)
    nll = []
    with torch.no_grad():
        for t in range(0, 29, 4):
            logits = m(ids[None, max(0, t - 6) : t + 1]).logits[0, -1].double()
            nll.append(float(torch.logsumexp(logits, -1) - logits[ids[t + 1]]))
    assert res.evaluated == 8 and res.positions == [0, 28]
    assert math.isclose(res.ppl, math.exp(sum(nll) / len(nll)), rel_tol=1e-5)
    assert math.isclose(res.ppl_matched, res.ppl, rel_tol=1e-12)
    assert res.ppl_by_chunk[0] == pytest.approx(math.exp(sum(nll[:3]) / 3), rel=1e-5)  # positions 0, 4, 8


def test_evaluate_stream_window_larger_than_stream_equals_full():
    m = llama(layers=2).float()
    ids = torch.randint(0, 80, (50,), generator=torch.Generator().manual_seed(5))
    specs = cache_specs(window=64, sinks=[0, 2])
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=16, recompute_every=7, max_context=128,
                                              latency_steps=4, progress=False)}
    assert list(res) == ["full", "window", "sinks_2", "recompute"]
    assert res["window"].ppl == pytest.approx(res["full"].ppl, rel=1e-5)
    assert res["sinks_2"].ppl_by_chunk == pytest.approx(res["full"].ppl_by_chunk, rel=1e-5)
    assert len(res["full"].ppl_by_chunk) == 4 and res["full"].evaluated == 49
    # a window of 64 sees all of a 50-token stream: recompute scores the same predictions as full
    assert res["recompute"].ppl == pytest.approx(res["full"].ppl_matched, rel=1e-4)
    assert res["sinks_2"].cache_bytes == 2 * 2 * (2 * 50 * 8) * 4  # layers x (k, v) x (H_kv T d) x fp32


def test_ppl_matched_is_over_all_of_recomputes_positions_or_none():
    # a 40-token stream past the full cache's 24-token context: full scores positions 0..22 only, so its
    # ppl_matched would rest on a subset of recompute's positions (0, 5, .., 35): it is None; every other
    # configuration's is the mean over all eight of them, read off its per-position (chunk 1) NLLs
    m = llama(layers=2).float()
    ids = torch.randint(0, 80, (40,), generator=torch.Generator().manual_seed(6))
    res = {r.name: r for r in evaluate_stream(m, ids, cache_specs(window=8, sinks=[0, 2]), chunk=1, recompute_every=5,
                                              max_context=24, latency_steps=0, progress=False)}
    assert res["full"].positions == [0, 22] and res["full"].ppl_matched is None
    matched = list(range(0, 39, 5))
    assert res["recompute"].evaluated == len(matched)
    for name in ("window", "sinks_2", "recompute"):
        nll = res[name].nll_by_chunk
        want = math.exp(sum(nll[t] for t in matched) / len(matched))
        assert res[name].ppl_matched == pytest.approx(want, rel=1e-12), name
    assert res["recompute"].ppl_matched == pytest.approx(res["recompute"].ppl, rel=1e-12)


def test_token_stream_joins_documents_in_order(tokenizer):
    docs = ["", "sink", "the token . w1 w2", "a a a"]
    ids = token_stream(tokenizer, docs, 8)
    voc = tokenizer.get_vocab()
    expect = [1] + [voc[w] for w in "sink the token . w1 w2 a".split()]  # BOS, empty doc skipped
    assert ids.tolist() == expect
    with pytest.raises(InputError, match="has 10 tokens in all, fewer than tokens=11"):
        token_stream(tokenizer, docs, 11)


def test_cache_specs_names_and_bad_input():
    assert [s.name for s in cache_specs(8, [0, 1, 4, 1])] == ["full", "window", "sinks_1", "sinks_4", "recompute"]
    with pytest.raises(InputError, match="^window must be >= 1"):
        cache_specs(0, [1])
    with pytest.raises(InputError, match="^sinks must be >= 0"):
        cache_specs(8, [-1])


@pytest.mark.integration
def test_cli_stream_writes_results_and_resumes(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "st"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "100",
            "--window", "16", "--sinks", "0,1,2", "--out", str(out), "--recompute-every", "9"]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = json.loads((out / "stream.json").read_text())
    names = [c["name"] for c in data["configs"]]
    assert names == ["full", "window", "sinks_1", "sinks_2", "recompute"]
    for c in data["configs"]:
        assert {"name", "n_sink", "window", "ppl", "ppl_by_chunk", "latency_ms_per_token", "cache_bytes"} <= set(c)
        assert len(c["ppl_by_chunk"]) == math.ceil(100 / 16) and c["ppl"] > 1
    assert data["command"].startswith("sinklab stream") and data["tokens"] == 100
    table = pd.read_csv(out / "stream.csv")
    assert list(table["name"]) == names
    assert set(pd.read_csv(out / "stream_by_chunk.csv")["config"]) == set(names)
    assert (out / "stream_ppl.png").stat().st_size > 0
    assert "sinks_2" in stdout
    # a second run with the same settings reuses every configuration
    code, stdout2, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    again = json.loads((out / "stream.json").read_text())
    assert [c["ppl"] for c in again["configs"]] == [c["ppl"] for c in data["configs"]]
    assert [c["latency_ms_per_token"] for c in again["configs"]] == [c["latency_ms_per_token"] for c in data["configs"]]


@pytest.mark.slow  # three CLI runs, two of them timed (about 4 s): not in the unit lane
def test_cli_stream_without_latency_gives_the_same_numbers_untimed(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    """--no-latency: the perplexities, chunks and agreement of the timed run, bit for bit; no latency (null,
    "-" in the table), cache bytes 0; recorded in stream.json and the command. An untimed result is not resumed
    by a timed run (its configurations are computed again, with latency), nor a timed one by an untimed run."""
    from sinklab.streaming.run import _same_settings

    timed, untimed = tmp_path / "timed", tmp_path / "untimed"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
            "--window", "8", "--sinks", "0,2", "--recompute-every", "5"]
    assert run_cli_captured([*argv, "--out", str(timed)], capsys)[0] == 0
    code, stdout, err = run_cli_captured([*argv, "--out", str(untimed), "--no-latency"], capsys)
    assert code == 0, err
    a, b = (json.loads((d / "stream.json").read_text()) for d in (timed, untimed))
    assert [c["name"] for c in a["configs"]] == [c["name"] for c in b["configs"]] == \
        ["full", "window", "sinks_2", "recompute"]
    for ca, cb in zip(a["configs"], b["configs"]):
        assert (cb["ppl"], cb["ppl_by_chunk"], cb["kl"], cb["top1"]) == (ca["ppl"], ca["ppl_by_chunk"], ca["kl"], ca["top1"])
        assert ca["latency_ms_per_token"] > 0 and cb["latency_ms_per_token"] is None and cb["cache_bytes"] == 0
    assert b["latency"] is False and "latency" not in a and "--no-latency" in b["command"]
    row = next(ln for ln in stdout.splitlines() if ln.startswith("sinks_2 "))
    assert row.split()[6:8] == ["-", "-"]  # ms/token, cache MiB (after "last chunk (n)": two words)
    # a timed run over the untimed folder computes every configuration again, timed
    assert run_cli_captured([*argv, "--out", str(untimed)], capsys)[0] == 0
    again = json.loads((untimed / "stream.json").read_text())
    assert "latency" not in again and all(c["latency_ms_per_token"] > 0 for c in again["configs"])
    # and an untimed run would not keep the timed configurations (the settings differ both ways)
    key = {k: a[k] for k in ("model", "tokens", "window", "stream_sha")}
    assert _same_settings(a, key) and not _same_settings(a, {**key, "latency": False})
    assert _same_settings(b, {**key, "latency": False}) and not _same_settings(b, key)


def test_cli_stream_table_says_how_many_positions_the_last_chunk_rests_on(tiny_model_dir, text_corpus_dir, tmp_path,
                                                                         capsys):
    """issue 21, item 8: recompute's "last chunk" perplexity rests on the few positions it scores there; the
    table prints that count. 40 tokens, chunks of 8: the caches score positions 0..38 (7 in the last chunk,
    32..38); recompute every 5th (0, 5, ..., 35: 0 5 | 10 15 | 20 | 25 30 | 35)."""
    out = tmp_path / "st"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "40",
            "--window", "8", "--sinks", "0", "--out", str(out), "--recompute-every", "5", "--no-full"]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = {c["name"]: c for c in json.loads((out / "stream.json").read_text())["configs"]}
    want = {"window": [8, 8, 8, 8, 7], "recompute": [2, 2, 1, 2, 1]}
    for name, counts in want.items():
        assert data[name]["count_by_chunk"] == counts
        row = next(ln for ln in stdout.splitlines() if ln.startswith(name + " "))
        assert f"{data[name]['ppl_by_chunk'][-1]:.2f} ({counts[-1]})" in row
    assert "last chunk (n)" in stdout
    by_chunk = pd.read_csv(out / "stream_by_chunk.csv")
    assert by_chunk[by_chunk.config == "recompute"]["positions"].tolist() == want["recompute"]


@pytest.mark.parametrize("extra,msg", [
    (["--window", "0"], "--window must be >= 1"),
    (["--window", "8", "--sinks", "-1"], "--sinks must be >= 0"),
    (["--window", "126", "--sinks", "4"], "n_sink + window = 130 exceeds the model's context of 128 tokens"),
    (["--window", "8", "--tokens", "100000"], "has 801 tokens in all, fewer than --tokens 100000"),
])
def test_cli_stream_bad_input(tiny_model_dir, text_corpus_dir, tmp_path, capsys, extra, msg):
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--out", str(tmp_path / "o"),
            "--tokens", "50", *extra]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1


def test_cli_stream_refuses_model_without_rope(tokenizer, text_corpus_dir, tmp_path, capsys):
    d = tmp_path / "gpt2"
    tiny_gpt2(vocab_size=len(tokenizer)).save_pretrained(d)
    tokenizer.save_pretrained(d)
    code, _, err = run_cli_captured(["stream", "perplexity", "--model", str(d), "--corpus", str(text_corpus_dir), "--tokens", "50",
                                     "--window", "8", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "learned absolute position embeddings" in err


def test_cli_stream_refuses_a_sinklab_model_with_absolute_positions(tokenizer, text_corpus_dir, tmp_path, capsys):
    from sinklab.nn import ModelConfig, SinkLM

    d = tmp_path / "native"
    SinkLM(ModelConfig(vocab_size=len(tokenizer), d_model=32, n_layers=1, n_heads=4, d_ff=64,
                       max_seq_len=64, positional="learned")).save_pretrained(d)
    tokenizer.save_pretrained(d)
    code, _, err = run_cli_captured(["stream", "perplexity", "--model", str(d), "--corpus", str(text_corpus_dir), "--tokens", "50",
                                     "--window", "8", "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and "'learned' absolute positions" in err


# ---------------------------------------------------------------- policies and quantised caches


def test_policy_specs_cross_product_and_names():
    from sinklab.streaming.harness import policy_specs

    specs = policy_specs(["sinks", "h2o"], [8, 16], n_sink=2, kv_bits=[16, 4], key_quant=["token", "channel"],
                         sinks_full_precision=[0, 2], window=6)
    names = [s.name for s in specs]
    assert names[0] == "full" and names[-1] == "recompute" and len(names) == 2 + 2 * 2 * (1 + 2 * 2)
    assert "sinks@8" in names and "h2o@16:kv4-channel-fp2" in names and "sinks@16:kv4-token-fp0" in names
    s = {x.name: x for x in specs}
    assert (s["sinks@8"].n_sink, s["sinks@8"].window, s["h2o@16"].n_sink, s["h2o@16"].window) == (2, 6, 0, 16)
    assert s["sinks@8"].parallel_ok and not s["h2o@16"].parallel_ok and not s["sinks@8:kv4-token-fp0"].parallel_ok
    with pytest.raises(InputError, match="kv_bits must be one of"):
        policy_specs(["sinks"], [8], kv_bits=[5])
    from sinklab.errors import UnknownNameError

    with pytest.raises(UnknownNameError, match="unknown cache policy 'h2'"):
        policy_specs(["h2"], [8])


def test_evaluate_stream_policies_with_room_for_the_whole_stream_equal_full():
    """Budget above the stream: nothing is evicted, so every policy (decoded token by token through the
    real cache, eager attention for the attention-based ones) scores every token as the full cache."""
    from sinklab.streaming.harness import policy_specs

    m = llama(layers=2, attn="sdpa").float()
    ids = torch.randint(0, 80, (40,), generator=torch.Generator().manual_seed(6))
    specs = policy_specs(["window", "h2o", "sinks+tova", "detected-sinks"], [64], n_sink=2, recompute=False)
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=10, max_context=128, latency_steps=4,
                                              progress=False)}
    for name in ("window@64", "h2o@64", "sinks+tova@64", "detected-sinks@64"):
        assert res[name].ppl_by_chunk == pytest.approx(res["full"].ppl_by_chunk, rel=1e-5), name
    assert res["h2o@64"].mode == "decode" and res["h2o@64"].attn_implementation == "eager"
    assert res["window@64"].mode == "parallel" and res["window@64"].attn_implementation == "sdpa"
    assert m.config._attn_implementation == "sdpa"  # restored after the eager runs
    assert res["h2o@64"].state_bytes == 2 * (2 * 39 * 8 + 39 * 8)  # layers x (positions + order + h2o score)


def test_evaluate_stream_quantised_cache_bytes_and_8_bits_close_to_16():
    """4-bit per-token cache of 12 tokens: bytes by hand; an 8-bit cache stays within 1% of the 16-bit
    perplexity (decoded through the real cache vs the parallel forward)."""
    from sinklab.streaming.harness import policy_specs

    m = llama(layers=2).float()
    ids = torch.randint(0, 80, (50,), generator=torch.Generator().manual_seed(7))
    specs = policy_specs(["sinks"], [12], n_sink=2, kv_bits=[16, 8, 4], kv_group=4, full=False, recompute=False)
    res = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=25, max_context=128, latency_steps=3,
                                              progress=False)}
    assert res["sinks@12:kv8-token-fp0"].ppl == pytest.approx(res["sinks@12"].ppl, rel=1e-2)
    assert res["sinks@12:kv4-token-fp0"].ppl != res["sinks@12"].ppl
    # 2 layers x (k, v) x [codes 2 heads x 12 tokens x 8 x 4 / 8 bytes + scale, zero 2 x 12 x 2 groups x 4 bytes]
    assert res["sinks@12:kv4-token-fp0"].cache_bytes == 2 * 2 * (2 * 12 * 4 + 2 * (2 * 12 * 2) * 4)
    assert res["sinks@12"].cache_bytes == 2 * 2 * (2 * 12 * 8) * 4


@pytest.mark.integration
def test_cli_stream_policies_writes_fields_and_resumes(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "pol"
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--tokens", "60",
            "--window", "16", "--policy", "sinks,tova", "--budget", "16", "--n-sink", "2", "--kv-bits", "16,4",
            "--key-quant", "channel", "--sinks-full-precision", "0,2", "--kv-group", "8", "--out", str(out),
            "--recompute-every", "9"]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = json.loads((out / "stream.json").read_text())
    names = [c["name"] for c in data["configs"]]
    assert names == ["full", "sinks@16", "sinks@16:kv4-channel-fp0", "sinks@16:kv4-channel-fp2", "tova@16",
                     "tova@16:kv4-channel-fp0", "tova@16:kv4-channel-fp2", "recompute"]
    c = {x["name"]: x for x in data["configs"]}
    assert (c["tova@16:kv4-channel-fp2"]["policy"], c["tova@16:kv4-channel-fp2"]["budget"],
            c["tova@16:kv4-channel-fp2"]["kv_bits"], c["tova@16:kv4-channel-fp2"]["kv_group"],
            c["tova@16:kv4-channel-fp2"]["key_quant"], c["tova@16:kv4-channel-fp2"]["sinks_full_precision"]) == \
        ("tova", 16, 4, 8, "channel", 2)
    assert c["sinks@16"]["n_sink"] == 2 and c["tova@16"]["n_sink"] == 0
    assert c["sinks@16:kv4-channel-fp0"]["cache_bytes"] < c["sinks@16"]["cache_bytes"]
    assert data["title"].endswith("60 tokens · budget 16 · recompute window 16")  # not the sink caches' window
    table = pd.read_csv(out / "stream.csv")
    assert list(table["name"]) == names and {"policy", "budget", "kv_bits", "key_quant"} <= set(table.columns)
    assert ("--policy sinks,tova --budget 16 --n-sink 2 --kv-bits 16,4 --kv-group 8 --key-quant channel "
            "--sinks-full-precision 0,2") in data["command"]  # the options' declaration order
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    again = json.loads((out / "stream.json").read_text())
    assert [x["latency_ms_per_token"] for x in again["configs"]] == [x["latency_ms_per_token"] for x in data["configs"]]


@pytest.mark.parametrize("argv,msg", [
    (["stream", "retrieval"], "unknown stream task 'retrieval'"),
    (["stream", "--model", "m", "--task", "passkey"], "sinklab stream takes a task first: sinklab stream perplexity"),
    (["stream", "perplexity", "--task", "passkey"], "No such option: --task"),
])
def test_cli_stream_needs_a_task(argv, msg, capsys):
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("extra,msg", [
    (["--kv-bits", "4"], "--kv-bits need --policy"),
    (["--policy", "sinks", "--sinks", "2"], "with --policy give --n-sink"),
    (["--policy", "sinks", "--kv-bits", "5"], "kv_bits must be one of"),
    (["--policy", "h3o"], "unknown cache policy 'h3o'"),
    (["--policy", "h2o", "--budget", "0"], "budget must be an integer >= 1"),
    (["--policy", "sinks", "--budget", "200"], "exceeds the model's context of 128 tokens"),
])
def test_cli_stream_policy_bad_input(tiny_model_dir, text_corpus_dir, tmp_path, capsys, extra, msg):
    argv = ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--out", str(tmp_path / "o"),
            "--tokens", "50", "--window", "8", *extra]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err


def test_stacked_decode_equals_each_cache_alone():
    """Five configurations of one budget as the rows of one batch give each row's NLLs as its cache alone."""
    from sinklab.streaming.harness import decode_stacked, decode_stream, policy_specs

    m = llama(layers=2, attn="sdpa")
    ids = torch.randint(0, 80, (30,), generator=torch.Generator().manual_seed(8))
    specs = policy_specs(["h2o", "tova", "sinks+h2o", "detected-sinks", "sinks"], [8], n_sink=2, kv_bits=[16, 3],
                         key_quant=["channel"], sinks_full_precision=[1], kv_group=4, full=False, recompute=False)
    specs = [s for s in specs if not s.parallel_ok]
    assert len(specs) == 9
    got = decode_stacked(m, ids, specs, progress=False)
    for s in specs:
        alone, _, nbytes, state, _ = decode_stream(m, ids, s, max_context=128, progress=False)
        assert max(abs(got[s.name][0][t] - alone[t]) for t in alone) < 2e-6, s.name  # NLLs in float32
        assert (got[s.name][1], got[s.name][2]) == (nbytes, state)
    assert m.config._attn_implementation == "sdpa"


def test_stacked_cache_needs_one_budget():
    from sinklab.streaming.cache import StackedCache

    m = llama(layers=1)
    with pytest.raises(InputError, match="one budget for all its caches, got \\[8, 9\\]"):
        StackedCache([SinkCache(m, policy="tova", budget=8), SinkCache(m, policy="tova", budget=9)])


def test_a_stopped_stacked_run_keeps_every_finished_budget(monkeypatch):
    """Each batch of token-by-token configurations is handed to ``on_result`` as soon as it is
    decoded, before the next budget starts: a run stopped during budget 10 keeps budget 8's results,
    and they equal those of an uninterrupted run."""
    import sinklab.streaming.harness as H

    m = llama(layers=1, attn="sdpa")
    ids = torch.randint(0, 80, (24,), generator=torch.Generator().manual_seed(3))
    specs = H.policy_specs(["h2o", "tova"], [8, 10], n_sink=2, full=False, recompute=False)
    whole = {r.name: r for r in evaluate_stream(m, ids, specs, chunk=8, progress=False)}
    saved, real = {}, H._decode_stacked_rows  # what evaluate_stream calls per batch of configurations

    def stop_at_second_budget(model, ids_, group, **kw):
        if group[0].budget == 10:
            raise KeyboardInterrupt
        return real(model, ids_, group, **kw)

    monkeypatch.setattr(H, "_decode_stacked_rows", stop_at_second_budget)
    with pytest.raises(KeyboardInterrupt):
        evaluate_stream(m, ids, specs, chunk=8, progress=False, on_result=lambda r: saved.setdefault(r.name, r))
    assert sorted(saved) == sorted(s.name for s in specs if s.budget == 8) and len(saved) == 2
    for name, r in saved.items():
        assert r.ppl == whole[name].ppl and r.ppl_by_chunk == whole[name].ppl_by_chunk
        assert r.cache_bytes == whole[name].cache_bytes


def _mistral(sliding_window: int, layers: int = 2):
    """A random float64 Mistral whose every layer has a sliding window (as Mistral-7B-v0.1: 4096)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=sliding_window,
                        max_position_embeddings=128, attn_implementation="eager")
    return MistralForCausalLM(cfg).eval().double()


def test_a_sliding_window_wider_than_the_budget_keeps_the_sinks():
    """Every layer of Mistral is a sliding layer. With a model window (30) wider than the budget (4 + 5), the
    cache kept the model's 29 recent tokens and no sinks whatever n_sink and window said (the sinks and
    window rows were the full cache's; outside audit, 2026-12-07). The window cannot hide a kept token here,
    so each layer keeps the sinks and the window: a one-layer model's decode equals a fresh forward over
    exactly those tokens at positions 0.. (with more layers the cached keys keep their own past context),
    and the parallel scorer equals the decode of a two-layer model."""
    T, n_sink, window = 40, 4, 5
    ids = torch.randint(0, 80, (1, T), generator=torch.Generator().manual_seed(7))
    one = _mistral(30, layers=1)
    cache = SinkCache(one, n_sink=n_sink, window=window)
    got = stream_logits(one, ids, cache, cache_positions=True)
    with torch.no_grad():
        for t in range(T):
            kept = list(range(t + 1)) if t <= n_sink + window else [*range(n_sink), *range(t - window, t + 1)]
            fresh = one(ids[:, kept]).logits[0, -1]
            torch.testing.assert_close(got[0, t], fresh, rtol=0, atol=1e-6)  # the model's float32 RoPE angles
    assert cache.kept_length() == n_sink + window
    m = _mistral(30)
    got = stream_logits(m, ids, SinkCache(m, n_sink=n_sink, window=window), cache_positions=True)
    torch.testing.assert_close(parallel_logits(m, ids, n_sink, window), got, rtol=0, atol=1e-6)
    # n_sink matters now (it did not)
    assert (stream_logits(m, ids, SinkCache(m, n_sink=0, window=window), cache_positions=True) - got).abs().max() > 1e-3


def _gpt_oss():
    from transformers import AutoModelForCausalLM, GptOssConfig

    torch.manual_seed(0)
    m = AutoModelForCausalLM.from_config(GptOssConfig(
        vocab_size=80, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=6, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128)).eval()
    with torch.no_grad():
        for blk in m.model.layers:
            blk.self_attn.sinks.normal_(0, 2.0)  # trained gpt-oss sink logits are O(1)
    return m


def _granite():
    from transformers import GraniteConfig, GraniteForCausalLM

    torch.manual_seed(0)
    return GraniteForCausalLM(GraniteConfig(
        vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, logits_scaling=4.0, attention_multiplier=0.3,
        embedding_multiplier=3.0, residual_multiplier=0.5)).eval()


@pytest.mark.parametrize("build", [_gpt_oss, _granite])
def test_parallel_scorer_keeps_sink_logits_and_logits_scaling(build):
    """The parallel scorer dropped gpt-oss's sink logits (s_aux) from its softmax and Granite's division of
    the logits by ``logits_scaling`` (outside audit, 2026-12-07: Granite's perplexity 3.4M against 66k).
    Reference: the token-by-token decode, in which the model computes its own attention and logits."""
    m = build()
    ids = torch.randint(0, 80, (40,), generator=torch.Generator().manual_seed(3))
    for spec in (CacheSpec("full", "full", None, None), CacheSpec("sinks_2", "sink", 2, 7)):
        par = stream_nll(m, ids, spec, max_context=128, block=8)
        dec = stream_nll_decode(m, ids, spec, max_context=128, progress=False)
        assert sorted(par) == sorted(dec) == list(range(39))
        assert max(abs(par[t] - dec[t]) for t in par) < 1e-4, spec.name


def test_parallel_scorer_refuses_logits_it_cannot_reproduce(monkeypatch):
    """A model whose own logits are not the output embedding of its hidden states (after the known scalings)
    is refused in one line naming --mode decode, not scored with other numbers."""
    m = llama(layers=1).float()
    ids = torch.randint(0, 80, (20,), generator=torch.Generator().manual_seed(3))
    real = type(m).forward

    def scaled(self, *a, **k):  # a family sinklab does not know: its forward halves the logits
        out = real(self, *a, **k)
        out.logits = out.logits * 0.5
        return out

    monkeypatch.setattr(type(m), "forward", scaled)
    with pytest.raises(InputError, match="differ by .*use mode='decode'"):
        stream_nll(m, ids, CacheSpec("full", "full", None, None), max_context=128, block=8)


def test_the_latency_prefill_stays_inside_the_trained_context():
    """decode_latency chooses its prefill calls: for a sink cache they keep the cache positions (kept + new) inside
    the model's trained context (128 here; 268 tokens in one call went to position 303 and warned, once per
    configuration, about a call the user never made). Its bytes are those of the cache after the same tokens."""
    import warnings

    from sinklab.streaming.harness import decode_latency

    m = llama(layers=1)  # max_position_embeddings 128
    ids = torch.randint(0, 80, (300,), generator=torch.Generator().manual_seed(0))
    spec = cache_specs(32, [4], full=False, recompute=False)[0]  # sinks_4: budget 36
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ms, nbytes = decode_latency(m, ids, spec, at=268, steps=32)
    cache = SinkCache(m, 4, 32)
    with torch.no_grad():
        for t in range(300):
            m(ids[None, t : t + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[cache.kept_length()]]))
    assert ms > 0 and nbytes == cache.nbytes
