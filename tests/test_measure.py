"""`sinklab measure` end to end on a tiny model folder and a text-folder corpus; bad input via the CLI."""

import json

import pandas as pd
import pytest
import torch

from sinklab.cli.main import app
from sinklab.errors import InputError
from sinklab.measure import MeasureConfig, measure
from sinklab.measure.run import load_results
from sinklab.metrics import attention_mass, sink_rate


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as e:
        app(argv)
    return e.value.code, capsys.readouterr()


def plant_bos_sink(model, bos_id: int = 1, strength: float = 12.0):
    """Make every head of a tiny LLaMA (attention_bias=True, rope_theta=1e6) attend to the BOS token.

    Channel 0 of the embeddings is 0 except for BOS; each head's key keeps only that channel, in its
    lowest-frequency rotary dimension (index 3 of 8: RoPE barely turns it over 12 positions), and its
    query is a constant bias there. The logit of BOS is then large and every other key's is 0.
    """
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 0.0
        emb[bos_id, 0] = 3.0
        for layer in model.model.layers:
            a = layer.self_attn
            hd = a.head_dim
            a.k_proj.weight.zero_()
            a.k_proj.bias.zero_()
            a.q_proj.weight.view(-1, hd, a.q_proj.weight.shape[-1])[:, 3].zero_()
            a.q_proj.bias.zero_()
            a.q_proj.bias.view(-1, hd)[:, 3] = strength
            a.k_proj.weight.view(-1, hd, a.k_proj.weight.shape[-1])[:, 3, 0] = strength
    return model


def naive_sink_rate_from_attentions(att, eps=0.3, K=4):
    """Sink rate from (N, H, T, T) per-layer attention tuples with plain Python loops in float64."""
    N, H, T, _ = att[0].shape
    L = len(att)
    rates = []
    for k in range(K):
        per_sample = []
        for n in range(N):
            hits = 0
            for a in att:
                for h in range(H):
                    col = [float(a[n, h, i, k]) for i in range(k, T)]
                    hits += (sum(col) / len(col)) > eps
            per_sample.append(100.0 * hits / (L * H))
        rates.append(sum(per_sample) / N)
    return rates


def test_measure_end_to_end_and_results_round_trip(tokenizer, text_corpus_dir, tmp_path):
    from helpers import tiny_llama

    model_dir = tmp_path / "planted"
    plant_bos_sink(tiny_llama(vocab_size=len(tokenizer), attention_bias=True, rope_theta=1e6)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    r = measure(model=str(model_dir), corpus=str(text_corpus_dir), num_samples=6, seq_len=12,
                positions=4, out=out, progress=False)
    res = load_results(out)
    # the required interface keys
    for key in ("sink_rate", "attention_mass", "input_ids", "model", "corpus", "input", "eps", "command", "versions"):
        assert key in res
    assert len(res["sink_rate"]) == 4
    assert torch.tensor(res["input_ids"]).shape == (6, 12)
    assert all(row[0] == 1 for row in res["input_ids"])  # the tokenizer adds BOS (auto policy)
    assert res["command"].startswith("sinklab measure --model")
    # recompute the sink rate independently from the stored probe ids: transformers' eager attention and
    # plain float64 loops (no sinklab metric code)
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        att = m(torch.tensor(res["input_ids"]), output_attentions=True).attentions
    expected = naive_sink_rate_from_attentions([a.double() for a in att])
    assert expected[0] >= 50.0  # the planted sink is there: the comparison is not zeros against zeros
    assert res["sink_rate"] == pytest.approx(expected, abs=1e-3)
    mass = torch.stack([attention_mass(a.double()) for a in att], dim=1)
    # float32 model vs float64 recomputation, results rounded to 6 decimals
    torch.testing.assert_close(torch.tensor(res["attention_mass"], dtype=torch.float64), mass[..., :4].mean(0), atol=2e-5, rtol=0)
    assert float(mass[..., 0].mean()) > 0.5
    # tidy table readable by pandas, consistent with results.json
    df = pd.read_csv(out / "attention.csv")
    assert len(df) == 2 * 4 * 4  # layers x heads x positions
    row = df[(df["layer"] == 1) & (df["head"] == 3) & (df["position"] == 0)].iloc[0]
    assert row.attention_mass == pytest.approx(res["attention_mass"][1][3][0])
    for png in ("attention_mass_heatmap.png", "sink_rate_positions.png", "hidden_norms.png"):
        assert (out / png).stat().st_size > 1000
    assert r.sink_rate == res["sink_rate"]


def test_same_seed_same_probe_and_numbers(tiny_model_dir, text_corpus_dir):
    kw = dict(model=str(tiny_model_dir), corpus=str(text_corpus_dir), num_samples=4, seq_len=10, progress=False)
    a, b = measure(**kw, seed=5), measure(**kw, seed=5)
    c = measure(**kw, seed=6)
    assert torch.equal(a.probe.input_ids, b.probe.input_ids) and a.summary == b.summary
    assert not torch.equal(a.probe.input_ids, c.probe.input_ids)


@pytest.mark.parametrize("kind", ["random", "repeated"])
def test_other_inputs(tiny_model_dir, kind):
    r = measure(model=str(tiny_model_dir), input=kind, num_samples=3, seq_len=9, bos="never", progress=False)
    assert r.probe.input_ids.shape == (3, 9) and r.corpus is None
    if kind == "repeated":
        assert all(len(set(row)) == 1 for row in r.probe.input_ids.tolist())


def test_text_input_is_one_sample_and_records_one(tiny_model_dir):
    """``input="text"`` measures the text itself, one sample: a sample count other than 1 is refused (it was
    ignored and recorded, 5 or the default 100, in ``config.num_samples``; outside audit, 2026-12-07)."""
    text = " ".join(["alpha beta gamma delta"] * 20)
    with pytest.raises(InputError, match="text itself.*num_samples=5 cannot apply"):
        measure(model=str(tiny_model_dir), input="text", text=text, num_samples=5, seq_len=9, progress=False)
    r = measure(model=str(tiny_model_dir), input="text", text=text, seq_len=9, progress=False)
    assert r.probe.input_ids.shape[0] == 1 and r.to_dict()["config"]["num_samples"] == 1


def test_long_context_stops_at_a_learned_position_table(tokenizer, tmp_path):
    """Past a learned absolute position table no input exists, so ``allow_long_context`` cannot help: a
    one-line error (it ran into the model's own shape error, a traceback; outside audit, 2026-12-07)."""
    from helpers import tiny_gpt2

    d = tmp_path / "gpt2"
    tiny_gpt2(vocab_size=len(tokenizer)).save_pretrained(d)  # n_positions 128
    tokenizer.save_pretrained(d)
    with pytest.raises(InputError, match="learned position table of 128 positions"):
        measure(model=str(d), input="random", num_samples=2, seq_len=140, allow_long_context=True, progress=False)


def test_config_validation():
    with pytest.raises(InputError, match="eps"):
        MeasureConfig(eps=1.2)
    with pytest.raises(InputError, match="dtype"):
        MeasureConfig(dtype="float16x")


def test_cli_bad_inputs(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    base = ["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--out", str(tmp_path / "o")]
    code, io = run_cli(base + ["--eps", "1.5"], capsys)
    assert code == 2 and "eps" in io.err and "Traceback" not in io.err
    code, io = run_cli(base + ["--seq-len", "4096"], capsys)
    assert code == 2 and "context of 128 tokens" in io.err
    code, io = run_cli(base + ["--num-samples", "1000", "--seq-len", "64"], capsys)
    assert code == 2 and "windows" in io.err
    code, io = run_cli(["measure", "--model", "no-such-model"], capsys)
    assert code == 2 and "smollm2-135m" in io.err  # lists the known models
    code, io = run_cli(["measure", "--model", str(tiny_model_dir), "--corpus", "no-such-corpus"], capsys)
    assert code == 2 and "sotu" in io.err
    code, io = run_cli(["measure", "--model", str(tmp_path / "missing" / "folder")], capsys)
    assert code == 2 and "missing" in io.err
    code, io = run_cli(base + ["--input", "poetry"], capsys)
    assert code == 2 and "natural" in io.err


def test_cli_runs_and_writes(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    code, io = run_cli(["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-n", "4",
                        "-t", "10", "--out", str(out)], capsys)
    assert code in (0, None)
    assert "Sink_k" in io.out
    assert json.loads((out / "results.json").read_text())["command"].startswith("sinklab measure")


def test_native_sinklab_model_equals_its_llama_export(tokenizer, text_corpus_dir, tmp_path):
    """Measuring a sinklab-trained folder (observer seam) gives the same statistics as measuring
    its LlamaForCausalLM export (transformers seam): two independent code paths."""
    from sinklab.nn import ModelConfig, SinkLM, export_hf

    torch.manual_seed(0)
    model = SinkLM(ModelConfig(vocab_size=len(tokenizer), d_model=32, n_layers=2, n_heads=4, d_ff=64,
                               max_seq_len=64)).eval()
    native, hf = tmp_path / "native", tmp_path / "hf"
    model.save_pretrained(native)
    tokenizer.save_pretrained(native)
    export_hf(model, hf, tokenizer=tokenizer)
    kw = dict(corpus=str(text_corpus_dir), num_samples=5, seq_len=16, positions=4, progress=False)
    a = measure(model=str(native), **kw)
    b = measure(model=str(hf), **kw)
    assert torch.equal(a.probe.input_ids, b.probe.input_ids)
    torch.testing.assert_close(a.stats.mass, b.stats.mass, atol=1e-5, rtol=0)
    torch.testing.assert_close(a.stats.hidden_norms, b.stats.hidden_norms, atol=1e-4, rtol=1e-5)
    # softmax rows sum to 1: sum_j mass_j * (T - j) == T for every sample, layer and head
    counts = torch.arange(16, 0, -1, dtype=torch.float64)
    torch.testing.assert_close((a.stats.mass * counts).sum(-1), torch.full((5, 2, 4), 16.0, dtype=torch.float64))
    assert a.sink_rate == b.sink_rate
