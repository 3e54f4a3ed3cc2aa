"""``sinklab measure --model A --model B`` (one folder per model) and ``sinklab compare``."""

import json

import pandas as pd
import pytest

import torch
from conftest import run_cli_captured
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


def test_measure_many_then_compare(two_models, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "many"
    argv = ["measure", "--corpus", str(text_corpus_dir), "-n", "4", "-t", "10", "--out", str(out)]
    for m in two_models:
        argv += ["--model", m]
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
    code, _, err = run_cli_captured(["compare", str(tmp_path), str(tmp_path)], capsys)
    assert code == 2 and "no results.json" in err
    for eps, name in ((0.3, "a"), (0.5, "b")):
        code, _, err = run_cli_captured(["measure", "--model", two_models[0], "--corpus", str(text_corpus_dir), "-n", "2",
                                         "-t", "8", "--eps", str(eps), "--out", str(tmp_path / name)], capsys)
        assert code == 0, err
    with pytest.raises(InputError, match="different eps"):
        comparison_tables([tmp_path / "a", tmp_path / "b"])
    code, _, err = run_cli_captured(["measure", "--model", two_models[0], "--model", two_models[0]], capsys)
    assert code == 2 and "twice" in err
    code, _, err = run_cli_captured(["measure", "--model", two_models[0], "--device", "cuda"], capsys)
    assert code == 2 and ("CUDA is not available" in err or "cuda" in err)
