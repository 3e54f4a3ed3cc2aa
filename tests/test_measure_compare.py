"""``sinklab measure --model A --model B`` (one folder per model) and ``sinklab compare``."""

import json

import pandas as pd
import pytest

import torch
from helpers import run_cli_captured
from sinklab.errors import InputError
from sinklab.measure.compare import comparison_tables
from sinklab.measure.run import model_slug


@pytest.fixture
def two_models(tmp_path, tokenizer, tiny_model_dir):
    """The 2-layer tiny LLaMA and a 3-layer one with a planted BOS sink (different depth and Sink_1)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from test_measure import plant_bos_sink

    torch.manual_seed(0)
    deep = tmp_path / "deep-llama"
    m = plant_bos_sink(LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attention_bias=True, rope_theta=1e6)).eval())
    m.save_pretrained(deep)
    tokenizer.save_pretrained(deep)
    return [str(tiny_model_dir), str(deep)]


@pytest.mark.integration
def test_measure_many_then_compare(two_models, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "many"
    argv = ["measure", "--corpus", str(text_corpus_dir), "-n", "4", "-t", "10", "--out", str(out),
            "--model", ",".join(two_models)]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    folders = [out / model_slug(m) for m in two_models]
    assert [f.name for f in folders] == ["tiny-llama", "deep-llama"]
    # each folder holds what measuring that model alone gives
    code, _, err = run_cli_captured(["measure", "--model", two_models[1], "--corpus", str(text_corpus_dir), "-n", "4",
                                     "-t", "10", "--out", str(tmp_path / "alone")], capsys)
    assert code == 0, err
    alone = json.loads((tmp_path / "alone" / "results.json").read_text())
    deep = json.loads((folders[1] / "results.json").read_text())
    assert deep["sink_rate"] == alone["sink_rate"] and deep["sink_rate"][0] > 90  # the planted sink

    code, stdout, err = run_cli_captured(["compare", *map(str, folders), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    models = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    layers = pd.read_csv(tmp_path / "cmp" / "compare_layers.csv")
    assert (tmp_path / "cmp" / "compare.png").stat().st_size > 0
    for f, row in zip(folders, models.itertuples()):
        res = json.loads((f / "results.json").read_text())
        assert row.sink_rate_1 == res["sink_rate"][0] and f"{row.sink_rate_1:.2f}" in stdout
        per_head = res["sink_rate_per_head"]  # (L, H, K): the layer's rate is the mean over its heads
        L = len(per_head)
        g = layers[layers.model == row.model]
        assert list(g.depth) == pytest.approx([l / (L - 1) for l in range(L)])
        assert list(g.sink_rate_1) == pytest.approx([sum(h[0] for h in lay) / len(lay) for lay in per_head], abs=0.01)
    assert list(models.n_layers) == [2, 3]


def test_compare_bad_input(two_models, text_corpus_dir, tmp_path, capsys):
    code, _, err = run_cli_captured(["compare", str(tmp_path)], capsys)
    assert code == 2 and "at least two" in err
    code, _, err = run_cli_captured(["compare", str(tmp_path), str(tmp_path / "other")], capsys)
    assert code == 2 and "no results.json" in err
    for eps, name in ((0.3, "a"), (0.5, "b")):
        code, _, err = run_cli_captured(["measure", "--model", two_models[0], "--corpus", str(text_corpus_dir), "-n", "2",
                                         "-t", "8", "--eps", str(eps), "--out", str(tmp_path / name)], capsys)
        assert code == 0, err
    with pytest.raises(InputError, match="different eps"):
        comparison_tables([tmp_path / "a", tmp_path / "b"])
    code, _, err = run_cli_captured(["measure", "--model", f"{two_models[0]},{two_models[0]}"], capsys)
    assert code == 2 and "twice" in err
    code, _, err = run_cli_captured(["measure", "--model", two_models[0], "--device", "cuda"], capsys)
    assert code == 2 and ("CUDA is not available" in err or "cuda" in err)


def _results(folder, name, *, n, kind, sink1, ci, T=64):
    """A minimal results.json as `sinklab measure` writes it (the keys compare reads)."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "model": {"name": name}, "eps": 0.3, "input": kind, "sink_rate": [sink1, 0.0], "sink_rate_ci": [ci, ci],
        "sink_rate_per_layer": [[sink1, 0.0], [sink1, 0.0]], "attention_mass_first": 0.5,
        "probe": {"kind": kind, "num_samples": n, "seq_len": T}}))
    return folder


def test_compare_shows_intervals_and_warns_when_probes_differ(tmp_path, capsys, monkeypatch):
    """issue 21, item 8: bars from N = 100 natural text and N = 1 repeated tokens used to stand side by side
    with no interval and no warning. Now: each row's 95% CI (from results.json; none for N = 1), one warning
    per difference (N, probe kind) in the console and compare.json, error bars on the bars that have one."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    a = _results(tmp_path / "a", "alpha", n=100, kind="natural", sink1=71.0, ci=[69.5, 72.6])
    b = _results(tmp_path / "b", "beta", n=1, kind="repeated", sink1=87.4, ci=[None, None])
    figures = []
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *x, **k: (figures.append(self), real_savefig(self, *x, **k)))
    code, stdout, err = run_cli_captured(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    rows = {ln.split()[0]: ln for ln in stdout.splitlines() if ln.startswith(("alpha", "beta"))}
    assert "[69.5, 72.6]" in rows["alpha"] and "natural N=100" in rows["alpha"]
    assert "none (N = 1)" in rows["beta"] and "repeated N=1" in rows["beta"]
    warnings = [ln for ln in stdout.splitlines() if ln.startswith("warning: ")]
    assert warnings == ["warning: different sample sizes N (alpha 100, beta 1): the bars are not measured alike",
                        "warning: different probe kinds (alpha natural, beta repeated): the bars are not measured alike",
                        "warning: no confidence interval for beta (N = 1, or none in the file)"]
    saved = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert saved["warnings"] == [w[len("warning: "):] for w in warnings]
    models = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert models.ci_low.tolist()[0] == 69.5 and pd.isna(models.ci_low.tolist()[1])
    bars_ax = figures[0].axes[0]
    (bars,) = bars_ax.containers[:1]
    assert [p.get_height() for p in bars] == [71.0, 87.4]
    caps = [c for c in bars_ax.containers[1:]]  # the error bar container: alpha only
    (segments,) = [c.lines[2][0].get_segments() for c in caps]
    assert len(segments) == 1 and segments[0][:, 1].tolist() == pytest.approx([69.5, 72.6])
    assert "warning" in bars_ax.get_title()
    # alike probes with intervals: no warning
    c = _results(tmp_path / "c", "gamma", n=100, kind="natural", sink1=50.0, ci=[48.0, 52.0])
    code, stdout, err = run_cli_captured(["compare", str(a), str(c), "--out", str(tmp_path / "cmp2")], capsys)
    assert code == 0 and "warning" not in stdout


def test_compare_gives_the_mask_aware_sink_rate_of_a_window_model(tmp_path, capsys):
    """A window run's plain Sink_1 is capped at w / T: compare showed 0.00 for a run whose mask-aware Sink_1 was 99%
    and said nothing (outside audit, 2026-12-07). Now the mask-aware Sink_1 (and per layer) stands beside it, in
    the console, compare.csv and compare_layers.csv, with a warning naming the mask."""
    a = _results(tmp_path / "a", "causal", n=100, kind="run", sink1=6.88, ci=[5.6, 8.1])
    b = _results(tmp_path / "b", "window", n=100, kind="run", sink1=0.0, ci=[0.0, 0.0])
    r = json.loads((b / "results.json").read_text())
    r.update(mask={"causal": True, "prefix_len": 0, "window": 8}, mask_aware_differs=True,
             sink_rate_visible=[99.125, 0.0], sink_rate_visible_ci=[[98.4, 99.8], [0.0, 0.0]],
             sink_rate_visible_per_layer=[[98.25, 0.0], [100.0, 0.0]], attention_mass_first_visible=0.9)
    (b / "results.json").write_text(json.dumps(r))
    code, stdout, err = run_cli_captured(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    row = next(ln for ln in stdout.splitlines() if ln.startswith("window"))
    assert "99.12" in row
    assert any(ln.startswith("warning: a model's own mask hides keys in window (window 8: mask-aware Sink_1 99.1%)")
               for ln in stdout.splitlines())
    models = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert models.sink_rate_visible_1.tolist()[1] == 99.125 and pd.isna(models.sink_rate_visible_1.tolist()[0])
    assert models["mask"].tolist()[1] == "window 8"
    layers = pd.read_csv(tmp_path / "cmp" / "compare_layers.csv")
    assert layers[layers.model == "window"].sink_rate_visible_1.tolist() == [98.25, 100.0]


def test_compare_warns_when_corpus_dtype_or_first_token_differ_and_refuses_a_folder_twice(tmp_path, capsys):
    """An outside audit (2026-12-07): probes that differed in BOS, corpus and dtype stood side by side with
    no warning (Sink_1 80.5 / 76.5 / 83.0, all "natural N=6 T=32"), and one folder given twice gave two
    rows. Now each difference is a warning and a column of compare.csv; a repeated folder is refused."""
    def write(name, *, corpus, bos, prefix, dtype):
        f = _results(tmp_path / name, name, n=6, kind="natural", sink1=80.0, ci=[70.0, 90.0], T=32)
        r = json.loads((f / "results.json").read_text())
        r["probe"].update(corpus=corpus, bos=bos)
        r.update(bos_prefix=prefix, config={"dtype": dtype})
        (f / "results.json").write_text(json.dumps(r))
        return f

    a = write("auto", corpus="sotu", bos="auto", prefix=[], dtype="float32")
    b = write("always", corpus="sotu", bos="always", prefix=[1], dtype="float32")
    c = write("shak", corpus="shakespeare", bos="auto", prefix=[], dtype="bfloat16")
    models, _ = comparison_tables([a, b, c])
    assert models.corpus.tolist() == ["sotu", "sotu", "shakespeare"] and models.special_first.tolist() == [False, True, False]
    assert models.dtype.tolist() == ["float32", "float32", "bfloat16"] and models.bos.tolist() == ["auto", "always", "auto"]
    from sinklab.measure.compare import comparison_warnings

    w = comparison_warnings(models)
    assert w == ["different corpora (auto sotu, always sotu, shak shakespeare): the bars are not measured alike",
                 "different dtypes (auto float32, always float32, shak bfloat16): the bars are not measured alike",
                 "a token before the text (BOS / CLS / a run's fixed first token) starts the windows of always but not of "
                 "the others (bos settings: auto "
                 "auto, always always, shak auto): Sink_1 is the mass on a different kind of first token",
                 "fewer than 20 samples for auto (N = 6), always (N = 6), shak (N = 6): their 95% intervals cover less "
                 "than 95% (a percentile bootstrap over few samples; docs/concepts.md)"]
    assert comparison_warnings(comparison_tables([a, write("a2", corpus="sotu", bos="auto", prefix=[],
                                                             dtype="float32")])[0]) == [
        "fewer than 20 samples for auto (N = 6), a2 (N = 6): their 95% intervals cover less than 95% (a percentile "
        "bootstrap over few samples; docs/concepts.md)"]
    with pytest.raises(InputError, match="given twice"):
        comparison_tables([a, tmp_path / "auto" / ".." / "auto"])
    code, _, err = run_cli_captured(["compare", str(a), str(a)], capsys)
    assert code == 2 and "given twice" in err
