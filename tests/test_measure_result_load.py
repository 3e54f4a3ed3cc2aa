"""A :class:`MeasureResult` read back by ``MeasureResult.load`` (no raw ``stats``) has the summary that
``measure`` gave, saves the same files and compares like the result in memory (an audit found that
``load(...).save()``, ``.to_dict()`` and ``compare([loaded, ...])`` raised AttributeError, and that the
loaded summary had no ``eps``)."""

import json

import pytest
import torch

import sinklab
from helpers import make_tokenizer, tiny_llama
from sinklab.measure.report import sink_rate_figure, summary_lines
from sinklab.measure.run import MeasureResult

FILES = ("results.json", "attention.csv", "sink_rate.csv", "attention_mass_heatmap.png", "sink_rate_positions.png",
         "hidden_norms.png")


@pytest.fixture
def measured(tmp_path, text_corpus_dir):
    """A tiny LLaMA measured in memory (with a capture note, as a fallback writes one), saved to tmp_path/a."""
    tok = make_tokenizer()
    r = sinklab.measure(model=tiny_llama(vocab_size=len(tok)), tokenizer=tok, corpus=str(text_corpus_dir),
                        num_samples=3, seq_len=16, positions=3, progress=False)
    r.stats.notes.append("a fallback was taken")
    r.save(tmp_path / "a")
    return r


def test_a_loaded_result_saves_the_same_files_and_compares_alike(measured, tmp_path):
    r = measured
    loaded = MeasureResult.load(tmp_path / "a")
    assert loaded.stats is None
    assert json.dumps(loaded.to_dict()) == json.dumps(r.to_dict())
    loaded.save(tmp_path / "b")
    assert loaded.notes == r.stats.notes == ["a fallback was taken"]
    for name in FILES:
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes(), name
    # the heat map's numbers: the mean over samples of the raw mass on the top sink, kept in results.json
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    top = saved["top_sink_position"]
    want = r.stats.mass[..., top].mean(dim=0)  # (L, H)
    assert torch.tensor(saved["attention_mass_top_sink"], dtype=torch.float64) == pytest.approx(want, abs=1e-6)
    assert saved["notes"] == ["a fallback was taken"]
    # compare takes the loaded result as it takes the one in memory and the folder
    with_loaded = sinklab.compare([loaded, tmp_path / "b"])
    with_memory = sinklab.compare([r, tmp_path / "b"])
    assert with_loaded.models.drop(columns="folder").equals(with_memory.models.drop(columns="folder"))
    assert with_loaded.models.sink_rate_1.tolist() == [saved["sink_rate"][0]] * 2
    assert with_loaded.layers.equals(with_memory.layers)


def test_a_loaded_result_has_the_summary_of_measure(measured, tmp_path):
    r = measured
    loaded = MeasureResult.load(tmp_path / "a")
    assert loaded.summary["eps"] == r.config.eps == 0.3
    assert list(loaded.summary) == list(r.summary)  # the same keys in the same order
    assert json.loads(json.dumps(loaded.summary)) == json.loads(json.dumps(r.summary))
    assert repr(loaded) == repr(r).replace("raw per-sample statistics", "None (not kept in results.json)")
    lines = summary_lines(loaded)
    assert lines == summary_lines(r) and lines[-1] == "note: a fallback was taken"
    ax = sink_rate_figure(loaded.summary).axes[0]
    assert ax.get_ylabel() == "sink rate Sink_k^0.3 (%)"
    assert [p.get_height() for p in ax.patches] == pytest.approx(r.sink_rate)


def test_a_results_json_without_the_heat_map_numbers_draws_it_from_attention_mass(measured, tmp_path):
    """A results.json written before ``attention_mass_top_sink``: the heat map comes from ``attention_mass``
    (L, H, K) at the top sink when it is one of the first K positions, else it is not drawn."""
    r = measured
    data = json.loads((tmp_path / "a" / "results.json").read_text())
    data.pop("attention_mass_top_sink", None)
    top = data["top_sink_position"]
    for pos, drawn in ((top, True), (data["positions"], False)):  # position K: past the first K
        data["top_sink_position"] = pos
        old = MeasureResult.from_dict(data)
        out = old.save(tmp_path / f"old{pos}")
        assert (out / "attention_mass_heatmap.png").exists() is drawn
        assert (out / "sink_rate_positions.png").exists()
        if drawn:
            want = r.stats.mass[..., pos].mean(dim=0)
            got = json.loads((out / "results.json").read_text())["attention_mass_top_sink"]
            assert torch.tensor(got, dtype=torch.float64) == pytest.approx(want, abs=1e-6)
