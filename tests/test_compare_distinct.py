"""Every measured model its own folder (``measure --model a/tiny,b/tiny,c/tiny``), every compared result its own
label, and a :class:`CompareResult` read back by ``Result.load`` equal to the one that was saved (an audit found
the third same-named model overwriting the second's folder, two of three results of one model labelled alike,
and a loaded comparison warning of "different corpora (... nan ...)")."""

import json

import pandas as pd
import pytest

import sinklab
from helpers import make_tokenizer, tiny_llama
from sinklab.measure.compare import CompareResult, comparison_figure, comparison_warnings
from sinklab.measure.run import MeasureConfig, measure_many
from sinklab.result import Result


def _results(folder, name, *, kind, corpus=None, n=4, sink1=50.0, layers=(50.0, 10.0)):
    """A minimal results.json as `sinklab measure` writes it (the keys compare reads)."""
    folder.mkdir(parents=True)
    probe = {"kind": kind, "num_samples": n, "seq_len": 16, "bos": "auto", **({"corpus": corpus} if corpus else {})}
    (folder / "results.json").write_text(json.dumps({
        "model": {"name": name}, "eps": 0.3, "input": kind, "sink_rate": [sink1, 0.0],
        "sink_rate_ci": [[sink1 - 1, sink1 + 1], [0.0, 0.0]], "sink_rate_per_layer": [[v, 0.0] for v in layers],
        "attention_mass_first": 0.5, "probe": probe, "bos_prefix": [], "config": {"dtype": "float32"}}))
    return folder


def test_measure_many_gives_every_model_its_own_folder(tmp_path, text_corpus_dir):
    tok = make_tokenizer()
    models = []
    for parent, n_layers in (("a", 2), ("b", 3), ("c", 4)):  # three models whose folders are all named tiny
        d = tmp_path / parent / "tiny"
        tiny_llama(vocab_size=len(tok), num_hidden_layers=n_layers).save_pretrained(d)
        tok.save_pretrained(d)
        models.append((str(d), n_layers))
    done = measure_many([m for m, _ in models], tmp_path / "out",
                        MeasureConfig(corpus=str(text_corpus_dir), num_samples=2, seq_len=8, positions=2),
                        progress=False)
    folders = [f for f, _ in done]
    assert len(set(folders)) == 3 and sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f.name for f in folders)
    for (model, n_layers), folder in zip(models, folders):
        saved = json.loads((folder / "results.json").read_text())
        assert saved["config"]["model"] == model and len(saved["sink_rate_per_layer"]) == n_layers


def test_compare_labels_every_result_distinctly(tmp_path, text_corpus_dir):
    # three folders of one model whose last parts are alike too
    folders = [_results(tmp_path / p / "run", "m", kind="natural", corpus="sotu", layers=(v, 0.0))
               for p, v in (("p", 10.0), ("q", 20.0), ("r", 30.0))]
    c = sinklab.compare(folders)
    assert c.models.model.nunique() == 3
    assert [g.sink_rate_1.tolist() for _, g in c.layers.groupby("model", sort=False)] == [[10.0, 0.0], [20.0, 0.0],
                                                                                          [30.0, 0.0]]
    # three measurements of one model held in memory
    tok = make_tokenizer()
    kw = dict(tokenizer=tok, corpus=str(text_corpus_dir), seq_len=16, positions=2, progress=False)
    rs = [sinklab.measure(model=tiny_llama(vocab_size=len(tok)), num_samples=n, **kw) for n in (2, 3, 4)]
    c = sinklab.compare(rs)
    names = c.models.model.tolist()
    assert len(set(names)) == 3 and c.models.num_samples.tolist() == [2, 3, 4]
    for name, r in zip(names, rs):  # each layer's Sink_1: the mean over its heads of the per-head rate at token 1
        want = [sum(h[0] for h in layer) / len(layer) for layer in r.summary["sink_rate_per_head"]]
        assert c.layers[c.layers.model == name].sink_rate_1.tolist() == pytest.approx(want, abs=0.01)
    lines = comparison_figure(c.models, c.layers).axes[1].get_lines()
    assert [ln.get_label() for ln in lines] == names
    c.save(tmp_path / "cmp")
    saved = pd.read_csv(tmp_path / "cmp" / "compare_layers.csv")
    assert saved.groupby("model").size().to_dict() == {n: 2 for n in names}


def test_a_loaded_comparison_equals_the_saved_one(tmp_path):
    a = _results(tmp_path / "a", "alpha", kind="natural", corpus="sotu")
    b = _results(tmp_path / "b", "beta", kind="random")  # no corpus: an empty cell in compare.csv
    c = _results(tmp_path / "c", "gamma", kind="natural", corpus="sotu")
    cmp = sinklab.compare([a, b, c])
    assert comparison_warnings(cmp.models) == [
        "different probe kinds (alpha natural, beta random, gamma natural): the bars are not measured alike",
        "fewer than 20 samples for alpha (N = 4), beta (N = 4), gamma (N = 4): their 95% intervals cover less than "
        "95% (a percentile bootstrap over few samples; docs/concepts.md)"]
    cmp.save(tmp_path / "cmp")
    loaded = Result.load(tmp_path / "cmp")
    assert isinstance(loaded, CompareResult)
    assert comparison_warnings(loaded.models) == comparison_warnings(cmp.models)
    assert loaded.to_dict()["warnings"] == json.loads((tmp_path / "cmp" / "compare.json").read_text())["warnings"]
    assert repr(loaded) == repr(cmp)
    assert loaded.models.corpus.tolist() == ["sotu", "", "sotu"] and loaded.models["mask"].tolist() == [""] * 3
    pd.testing.assert_frame_equal(loaded.models, cmp.models)
    pd.testing.assert_frame_equal(loaded.layers, cmp.layers)


def test_each_models_bars_are_centred_on_its_tick():
    """With a Sink* and a gate-weighted bar beside Sink_1, each model's group of three bars is centred on the model's
    tick, and the interval is drawn on the Sink_1 bar (an audit found the groups drawn to the right of their ticks)."""
    models = pd.DataFrame({
        "model": ["a", "b"], "sink_rate_1": [40.0, 60.0], "ci_low": [35.0, 55.0], "ci_high": [45.0, 65.0],
        "sink_rate_virtual": [10.0, 20.0], "sink_rate_gated_1": [5.0, 7.0], "num_samples": [4, 4], "seq_len": [16, 16],
        "probe": ["natural", "natural"], "eps": [0.3, 0.3]})
    layers = pd.DataFrame({"model": ["a", "b"], "depth": [0.0, 0.0], "sink_rate_1": [40.0, 60.0]})
    ax = comparison_figure(models, layers).axes[0]
    ticks = ax.get_xticks()
    centres = sorted(p.get_x() + p.get_width() / 2 for p in ax.patches)  # 3 bars per model
    assert len(centres) == 6
    for i, tick in enumerate(ticks):
        group = centres[3 * i: 3 * i + 3]
        assert sum(group) / 3 == pytest.approx(tick)
    sink1 = [p for p in ax.containers[0].patches]  # the Sink_1 bars: their heights and the interval's x
    assert [p.get_height() for p in sink1] == [40.0, 60.0]
    err_x = ax.collections[0].get_segments()
    assert [seg[0][0] for seg in err_x] == pytest.approx([p.get_x() + p.get_width() / 2 for p in sink1])


def test_a_model_without_the_extra_bars_has_its_sink_rate_bar_on_its_tick():
    """A softmax model beside a sink-token model (Sink* only for the second) and a gated one (gate-weighted Sink_1
    only for the third): each model's own bars are centred on its tick, with no gap for a bar it does not have."""
    nan = float("nan")
    models = pd.DataFrame({
        "model": ["soft", "sink", "gated"], "sink_rate_1": [40.0, 60.0, 50.0], "ci_low": [35.0, 55.0, 45.0],
        "ci_high": [45.0, 65.0, 55.0], "sink_rate_virtual": [nan, 20.0, nan], "sink_rate_gated_1": [nan, nan, 7.0],
        "num_samples": [4, 4, 4], "seq_len": [16, 16, 16], "probe": ["natural"] * 3, "eps": [0.3] * 3})
    layers = pd.DataFrame({"model": ["soft", "sink", "gated"], "depth": [0.0] * 3, "sink_rate_1": [40.0, 60.0, 50.0]})
    ax = comparison_figure(models, layers).axes[0]
    width = ax.patches[0].get_width()
    by_tick = {}
    for p in ax.patches:
        by_tick.setdefault(round(p.get_x() + p.get_width() / 2), []).append(p)  # nearest tick (0, 1, 2)
    for tick, want in zip(ax.get_xticks(), ([40.0], [60.0, 20.0], [50.0, 7.0])):
        bars = sorted(by_tick[round(tick)], key=lambda p: p.get_x())
        assert [p.get_height() for p in bars] == want
        assert sum(p.get_x() + p.get_width() / 2 for p in bars) / len(bars) == pytest.approx(tick)
        assert all(b2.get_x() - b1.get_x() == pytest.approx(width) for b1, b2 in zip(bars, bars[1:]))
