"""``sinklab.measure`` takes a model already in memory (an ``nn.Module`` with its tokenizer, or a Subject), as
every other feature does (issues 34 and 38): the same numbers as measuring the same model saved to a folder,
nothing written, and a one-line error for what it cannot take."""

from __future__ import annotations

import numpy as np
import pytest

import sinklab
from helpers import make_tokenizer, tiny_llama
from sinklab.errors import InputError
from sinklab.subject import Subject


def test_in_memory_model_equals_saved_folder(tmp_path, text_corpus_dir):
    tok = make_tokenizer()
    model = tiny_llama(vocab_size=len(tok))
    folder = tmp_path / "m"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    kw = dict(corpus=str(text_corpus_dir), num_samples=4, seq_len=16, seed=3, progress=False)
    a = sinklab.measure(model=model, tokenizer=tok, **kw)
    b = sinklab.measure(model=str(folder), **kw)
    assert np.array_equal(a.probe.input_ids.numpy(), b.probe.input_ids.numpy())
    for k in ("sink_rate", "attention_mass"):
        np.testing.assert_allclose(np.asarray(a.summary[k]), np.asarray(b.summary[k]), rtol=0, atol=1e-6)
    assert a.config.model == "<LlamaForCausalLM in memory>" and "in memory" in a.command
    assert not any(tmp_path.glob("**/results.json"))  # nothing written without out=
    # a Subject works too, and is not moved
    c = sinklab.measure(model=Subject.load(model, tokenizer=tok), **kw)
    np.testing.assert_allclose(np.asarray(c.summary["sink_rate"]), np.asarray(a.summary["sink_rate"]), atol=0)


def test_in_memory_model_refusals():
    tok = make_tokenizer()
    model = tiny_llama(vocab_size=len(tok))
    with pytest.raises(InputError, match="must be a name, a path, a Run, a Subject or an nn.Module"):
        sinklab.measure(model=3, progress=False)
    with pytest.raises(InputError, match="already placed"):
        sinklab.measure(model=Subject.load(model, tokenizer=tok), device="cpu", progress=False)
    with pytest.raises(InputError, match="tokenizer"):
        sinklab.measure(model=model, input="random", num_samples=2, seq_len=8, progress=False)


def test_compare_takes_results_in_memory(tmp_path, text_corpus_dir):
    """compare([measure(...), measure(...)]) equals compare over the saved folders and writes nothing."""
    tok = make_tokenizer()
    kw = dict(corpus=str(text_corpus_dir), num_samples=4, seq_len=16, seed=0, progress=False)
    a = sinklab.measure(model=tiny_llama(vocab_size=len(tok)), tokenizer=tok, **kw)
    b = sinklab.measure(model=tiny_llama(vocab_size=len(tok), rope_theta=100.0), tokenizer=tok, **kw)
    mem = sinklab.compare([a, b])
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    disk = sinklab.compare([tmp_path / "a", tmp_path / "b"])
    cols = ["sink_rate_1", "attention_mass_first", "n_layers", "num_samples", "seq_len", "eps"]
    assert mem.models[cols].equals(disk.models[cols])
    assert list(mem.models["folder"]) == ["<in memory: LlamaForCausalLM>"] * 2
