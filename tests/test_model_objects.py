"""A model object given to a feature (``measure``, an ``analyze`` entry point, ``stream``) is run in eval mode and
given back in the mode it had (issue 38: "no global state left changed after a call"); ``stream`` takes an
``nn.Module`` with its tokenizer or a Subject as the other features do; ``Result.load`` on the base class reads
any feature's saved result; the parameters ``dtype`` of ``load_model`` and ``threads`` of ``stream`` are checked
and named.

The references are the same model deep-copied into eval mode (dropout off), measured or streamed the same way."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import sinklab
from helpers import make_tokenizer, tiny_gpt2, tiny_llama, tiny_neox
from sinklab.errors import InputError
from sinklab.result import RESULT_FILES, Result
from sinklab.subject import Subject, eval_mode


def _training_gpt2(vocab_size: int):
    """A tiny GPT-2 (dropout 0.1 on embeddings, attention and residuals) in training mode, except its first block,
    which is in eval mode: the flags a call must give back module by module."""
    m = tiny_gpt2(vocab_size=vocab_size).train()
    m.transformer.h[0].eval()
    return m


def _modes(model: torch.nn.Module) -> list[bool]:
    return [mod.training for mod in model.modules()]


def test_eval_mode_restores_every_modules_flag_even_after_an_error():
    m = _training_gpt2(80)
    before = _modes(m)
    assert any(before) and not all(before)
    with pytest.raises(RuntimeError, match="inside"):
        with eval_mode(m) as inner:
            assert inner is m and not any(_modes(m))
            raise RuntimeError("inside")
    assert _modes(m) == before


def test_measure_runs_a_training_mode_model_without_dropout_and_gives_its_mode_back(text_corpus_dir):
    """Two measurements of the training-mode model equal the eval-mode copy's exactly (dropout would change the
    attention masses from call to call), and every module's flag is what it was."""
    tok = make_tokenizer()
    m = _training_gpt2(len(tok))
    ref = copy.deepcopy(m).eval()
    before = _modes(m)
    kw = dict(corpus=str(text_corpus_dir), num_samples=4, seq_len=16, seed=1, progress=False)
    want = sinklab.measure(model=ref, tokenizer=tok, **kw)
    for _ in range(2):
        got = sinklab.measure(model=m, tokenizer=tok, **kw)
        for k in ("sink_rate", "attention_mass"):
            np.testing.assert_array_equal(np.asarray(got.summary[k]), np.asarray(want.summary[k]))
        assert _modes(m) == before
    # through a Subject as well (Subject.load wraps the module without changing its mode)
    got = sinklab.measure(model=Subject.load(m, tokenizer=tok), **kw)
    np.testing.assert_array_equal(np.asarray(got.summary["attention_mass"]), np.asarray(want.summary["attention_mass"]))
    assert _modes(m) == before


def test_an_analysis_runs_a_training_mode_subject_without_dropout_and_gives_its_mode_back():
    m = _training_gpt2(80)
    ref = copy.deepcopy(m).eval()
    before = _modes(m)
    ids = torch.randint(1, 80, (2, 16), generator=torch.Generator().manual_seed(0))
    want = sinklab.analyze.massive(Subject(ref, ids)).table()
    for _ in range(2):
        got = sinklab.analyze.massive(Subject(m, ids)).table()
        assert got.equals(want)
        assert _modes(m) == before
    got = sinklab.analyze.massive(model=Subject(m, ids)).table()  # the model as a keyword
    assert got.equals(want) and _modes(m) == before


def test_stream_takes_a_module_with_its_tokenizer_or_a_subject(tmp_path, text_corpus_dir):
    """A RoPE model in memory (GPT-NeoX with dropout 0.5 after attention and MLP, in training mode but for its
    first layer) streams to the same perplexities as the same model saved to a folder (loaded in eval mode); its
    mode is given back; what stream cannot take is refused by name."""
    tok = make_tokenizer()
    m = tiny_neox(vocab_size=len(tok), hidden_dropout=0.5).train()
    m.gpt_neox.layers[0].eval()
    before = _modes(m)
    folder = tmp_path / "m"
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    kw = dict(tokens=40, window=8, sinks=[1], recompute=False, progress=False)
    want = sinklab.stream(str(folder), str(text_corpus_dir), **kw)
    got = sinklab.stream(m, str(text_corpus_dir), tokenizer=tok, **kw)
    assert [c["ppl"] for c in got["configs"]] == [c["ppl"] for c in want["configs"]]
    assert _modes(m) == before and "sinklab.stream" in got.command
    sub = sinklab.stream(Subject.load(m, tokenizer=tok), str(text_corpus_dir), **kw)
    assert [c["ppl"] for c in sub["configs"]] == [c["ppl"] for c in want["configs"]] and _modes(m) == before
    with pytest.raises(InputError, match="tokenizer goes with a model object"):
        sinklab.stream(str(folder), str(text_corpus_dir), tokenizer=tok, **kw)
    with pytest.raises(InputError, match="already placed"):
        sinklab.stream(Subject.load(m, tokenizer=tok), str(text_corpus_dir), device="cpu", **kw)
    with pytest.raises(InputError, match="must be a name, a path, a Run, a Subject or an nn.Module, not int"):
        sinklab.stream(3, **kw)
    for bad in (0, -1):
        with pytest.raises(InputError, match=f"threads must be >= 1, got {bad}"):
            sinklab.stream(m, str(text_corpus_dir), tokenizer=tok, threads=bad, **kw)


def test_result_load_on_the_base_class_reads_each_features_file(tmp_path, text_corpus_dir):
    tok = make_tokenizer()
    r = sinklab.measure(model=tiny_llama(vocab_size=len(tok)), tokenizer=tok, corpus=str(text_corpus_dir),
                        num_samples=2, seq_len=16, progress=False)
    r.save(tmp_path / "a")
    back = Result.load(tmp_path / "a")
    assert type(back) is type(r) and back.summary["sink_rate"] == pytest.approx(r.summary["sink_rate"], abs=0)
    assert type(Result.load(tmp_path / "a" / "results.json")) is type(r)
    with pytest.raises(InputError, match="no sinklab result file in"):
        Result.load(tmp_path)
    (tmp_path / "a" / "compare.json").write_text("{}")
    with pytest.raises(InputError, match=r"several result files \(results.json, compare.json\)"):
        Result.load(tmp_path / "a")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(InputError, match="is not a sinklab result file"):
        Result.load(tmp_path / "x.json")
    with pytest.raises(InputError, match="no such file or folder"):
        Result.load(tmp_path / "missing")


def test_the_result_file_table_names_each_features_class():
    """Every entry of RESULT_FILES is a Result subclass whose FILE is that name, and every Result subclass of a
    feature (those that write their own file) is in the table."""
    import importlib

    classes = set()
    for name, (module, attr) in RESULT_FILES.items():
        cls = getattr(importlib.import_module(module), attr)
        assert issubclass(cls, Result) and cls.FILE == name, (name, cls)
        classes.add(cls)

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    from sinklab.result import DictResult

    feature = {c for c in subclasses(Result) if c.__module__.startswith("sinklab.") and c is not DictResult}
    assert feature <= classes, feature - classes


def test_load_model_names_a_bad_dtype_before_reading_anything(tmp_path):
    with pytest.raises(InputError, match=r"dtype='float8': give float32 \| bfloat16 \| float16"):
        sinklab.load_model(str(tmp_path / "nothing-here"), dtype="float8")
    with pytest.raises(InputError, match="dtype"):
        sinklab.load_model(str(tmp_path), dtype=torch.int64)
    tok = make_tokenizer()
    folder = tmp_path / "m"
    tiny_llama(vocab_size=len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    assert next(sinklab.load_model(str(folder), dtype="bfloat16").model.parameters()).dtype == torch.bfloat16


def test_an_analysis_takes_a_module_with_its_tokenizer(tmp_path, text_corpus_dir):
    """``analyze.X(module, tokenizer=tok, ...)`` probes the module as ``analyze.X(folder, ...)`` probes the same
    model saved to a folder (same windows, same numbers), runs it in eval mode and gives its mode back."""
    import pandas as pd

    tok = make_tokenizer()
    m = _training_gpt2(len(tok))
    before = _modes(m)
    folder = tmp_path / "m"
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    kw = dict(corpus=str(text_corpus_dir), num_samples=3, seq_len=16, seed=2)
    want = sinklab.analyze.massive(str(folder), **kw)
    got = sinklab.analyze.massive(m, tokenizer=tok, **kw)
    assert _modes(m) == before
    pd.testing.assert_frame_equal(got.table(), want.table(), rtol=1e-5, atol=1e-6)
    assert got.summary["sink_rate"] == pytest.approx(want.summary["sink_rate"], abs=1e-6)
    with pytest.raises(InputError, match="tokenizer goes with a model object"):
        sinklab.analyze.massive(str(folder), tokenizer=tok, **kw)
    with pytest.raises(InputError, match="tokenizer"):  # a natural-text probe needs the module's tokenizer
        sinklab.analyze.massive(m, **kw)


def test_subject_load_returns_a_subject_as_it_is_and_refuses_to_move_it():
    """The one place a Subject given as a model is handled (measure, stream and the analyses pass theirs through
    it): the same object back, and a placement refused by name."""
    tok = make_tokenizer()
    s = Subject.load(tiny_llama(vocab_size=len(tok)), tokenizer=tok)
    assert Subject.load(s) is s
    with pytest.raises(InputError, match="dtype cannot move a Subject: it is already placed"):
        Subject.load(s, dtype="float32")
    with pytest.raises(InputError, match="device / device_map cannot move a Subject"):
        Subject.load(s, device="cpu", device_map="auto")


def test_a_loaded_models_repr_is_one_line(tiny_model_dir):
    """repr(load_model(...)) printed the whole module (every layer); it is one line naming the model, its class,
    its parameter count, dtype and device."""
    from sinklab import load_model

    lm = load_model(str(tiny_model_dir))
    n = sum(p.numel() for p in lm.model.parameters())
    text = repr(lm)
    assert "\n" not in text and "LlamaForCausalLM" in text and f"{n / 1e6:.1f}M parameters" in text
    assert "float32 on cpu" in text
