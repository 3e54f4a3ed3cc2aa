"""`sinklab.nn.export_hf` of models trained by `sinklab train`: the exported LlamaForCausalLM folder declares the
run's own special tokens, is fed what the run was trained on (BOS first exactly when its packing put BOS first),
and a run trained with a mask LLaMA cannot express (prefix LM) is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import make_tokenizer, synthetic_run_toml, text_run_toml, train_run, word_texts
from sinklab.errors import InputError
from sinklab.measure import measure
from sinklab.nn import ModelConfig, SinkLM, export_hf
from sinklab.runs import Run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export_runs")
    texts = word_texts(tmp / "texts")
    return {
        "bos": train_run(tmp, "bos", synthetic_run_toml(steps=4)),
        "text_bos": train_run(tmp, "text_bos", text_run_toml(texts, "bos")),
        "text_concat": train_run(tmp, "text_concat", text_run_toml(texts, "concat")),
        "text_fixed_first": train_run(tmp, "text_fixed_first", text_run_toml(texts, "fixed_token")),
        "text_fixed_third": train_run(tmp, "text_fixed_third", text_run_toml(texts, "fixed_token"),
                                      "data.packing_position=3"),
        "prefix": train_run(tmp, "prefix", synthetic_run_toml(steps=2, extra="prefix_len = 4")),
        "texts": texts,
    }


# ================================================================ E3: the tokenizer's own special ids
@pytest.mark.parametrize("kind", ["bos", "text_bos"])
def test_export_declares_the_tokenizers_own_special_ids(runs, kind, tmp_path):
    """config.json and generation_config.json name the run tokenizer's BOS / EOS (not LLaMA's defaults 1 / 2),
    so generate stops at the tokenizer's EOS; no pad token -> None."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    run = Run.open(runs[kind])
    tok = AutoTokenizer.from_pretrained(str(run.final))
    assert tok.eos_token_id is not None and tok.bos_token_id is not None and tok.pad_token_id is None
    for how, args in (("model and tokenizer", (run.model, tmp_path / "a", run.tokenizer)),
                      ("run", (run, tmp_path / "b"))):
        out = export_hf(*args)
        cfg = json.loads((out / "config.json").read_text())
        gen = json.loads((out / "generation_config.json").read_text())
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id), how
        assert cfg.get("pad_token_id") is None, how
        assert (gen.get("bos_token_id"), gen.get("eos_token_id")) == (tok.bos_token_id, tok.eos_token_id), how
        hf = LlamaForCausalLM.from_pretrained(out)
        assert hf.generation_config.eos_token_id == AutoTokenizer.from_pretrained(str(out)).eos_token_id, how


def test_export_declares_no_special_id_the_tokenizer_lacks(tmp_path):
    """Without a tokenizer, or for a token it lacks, the config says None instead of a wrong id; a pad token it
    has is declared."""
    tok = make_tokenizer(add_bos=False)
    tok.bos_token = None
    assert tok.bos_token_id is None and tok.eos_token_id is not None
    model = SinkLM(ModelConfig(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32))
    cfg = json.loads((export_hf(model, tmp_path / "none") / "config.json").read_text())
    assert [cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")] == [None, None, None]
    cfg = json.loads((export_hf(model, tmp_path / "tok", tokenizer=tok) / "config.json").read_text())
    assert [cfg.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")] == \
        [None, tok.eos_token_id, tok.pad_token_id]


# ================================================================ E4: the run's BOS handling
@pytest.mark.parametrize("kind, bos_first", [("text_bos", True), ("text_fixed_first", True), ("text_concat", False),
                                             ("text_fixed_third", False), ("bos", True)])
def test_export_of_a_run_is_measured_like_the_run(runs, kind, bos_first, tmp_path):
    """`measure` with default options feeds the exported folder what it feeds the run: BOS first exactly when
    the run's packing put BOS first, so the statistics agree."""
    run = Run.open(runs[kind])
    out = export_hf(run, tmp_path / "hf")
    bos_id = run.tokenizer.bos_token_id
    natural = [] if run.synthetic else [dict(input="natural", corpus=str(runs["texts"]), num_samples=4, seq_len=16)]
    for kw in [dict(input="random", num_samples=8, seq_len=16)] + natural:
        a = measure(model=str(runs[kind]), progress=False, **kw)
        b = measure(model=str(out), progress=False, **kw)
        assert bool((a.probe.input_ids[:, 0] == bos_id).all()) is bos_first
        assert torch.equal(a.probe.input_ids, b.probe.input_ids)
        torch.testing.assert_close(a.stats.mass, b.stats.mass, atol=1e-5, rtol=0)
        assert a.sink_rate == b.sink_rate
        assert a.summary["attention_mass_first"] == pytest.approx(b.summary["attention_mass_first"], abs=1e-5)


def test_export_of_a_bos_text_run_encodes_text_with_bos_first(runs, tmp_path):
    """Natural text through the exported tokenizer starts with the run's BOS, as the run's probe windows do;
    the run's own tokenizer (final/) is unchanged."""
    from transformers import AutoTokenizer

    run = Run.open(runs["text_bos"])
    out = export_hf(run, tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(str(out))
    text = (runs["texts"] / "d0.txt").read_text()[:200]
    plain = run.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tok(text)["input_ids"] == [run.tokenizer.bos_token_id] + plain
    assert run.probe(4, 16, 0).input_ids[:, 0].tolist() == [run.tokenizer.bos_token_id] * 4
    assert AutoTokenizer.from_pretrained(str(run.final))(text)["input_ids"] == plain


def test_add_bos_sets_what_the_exported_tokenizer_puts_first(runs, tmp_path):
    """A SinkLM alone carries no packing: ``add_bos`` says it (True: BOS first, as the run's packing did; False: no
    special token even from a tokenizer that added BOS); the caller's tokenizer object is unchanged."""
    from transformers import AutoTokenizer

    from sinklab.probe.inputs import bos_tokens

    run = Run.open(runs["text_bos"])
    out = export_hf(run.model, tmp_path / "a", tokenizer=run.tokenizer, add_bos=True)
    assert bos_tokens(AutoTokenizer.from_pretrained(str(out)), "auto") == ([run.tokenizer.bos_token_id], [])
    assert bos_tokens(run.tokenizer, "auto") == ([], [])
    kw = dict(input="natural", corpus=str(runs["texts"]), num_samples=4, seq_len=16, progress=False)
    assert torch.equal(measure(model=str(run.folder), **kw).probe.input_ids, measure(model=str(out), **kw).probe.input_ids)
    tok = make_tokenizer(add_bos=True)
    model = SinkLM(ModelConfig(vocab_size=len(tok), d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32))
    out = export_hf(model, tmp_path / "b", tokenizer=tok, add_bos=False)
    assert bos_tokens(AutoTokenizer.from_pretrained(str(out)), "auto") == ([], [])
    assert bos_tokens(tok, "auto") == ([tok.bos_token_id], [])


# ================================================================ E6: a mask LLaMA cannot express
def test_export_of_a_prefix_lm_run_is_refused_in_one_line(runs, tmp_path):
    run = Run.open(runs["prefix"])
    assert run.prefix_len == 4
    out = tmp_path / "hf"
    with pytest.raises(InputError) as e:
        export_hf(run, out)
    msg = str(e.value)
    assert "train.prefix_len=4" in msg and "\n" not in msg
    assert not out.exists()
