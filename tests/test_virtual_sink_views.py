"""``sinklab compare`` and the measure plots show the virtual sink beside Sink_1 (issue 36 part 3) and the
gate-weighted Sink_1 (part 4): a tiny gpt-oss (learned sink logits), a tiny gated Qwen3.5 and a tiny LLaMA
(neither) measured from saved folders; every column, bar and line equals the value measured, read back from
results.json or recomputed from the raw per-sample statistics, and is absent for the models without one."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch

from helpers import run_cli_captured
from sinklab.measure import measure
from tiny_models import tiny_model


def _figures(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figures = []
    real = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (figures.append(self), real(self, *a, **k)))
    return figures


def _bars(ax, label):
    """Heights of the bar series ``label`` of ``ax`` (None when there is none)."""
    for c in ax.containers:
        if c.get_label() == label:
            return [p.get_height() for p in c]
    return None


@pytest.fixture
def measured(tmp_path, tokenizer, tiny_model_dir, text_corpus_dir):
    """gpt-oss (its sink logits set so some heads pass eps and some do not), Qwen3.5 and LLaMA, measured with
    N = 3, T = 16 through :func:`sinklab.measure.measure` into ``tmp_path / name``."""
    warnings.filterwarnings("ignore")
    oss = tiny_model("gpt_oss")
    H = oss.config.num_attention_heads
    with torch.no_grad():
        for i, layer in enumerate(oss.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 3.0, H) + i)
    folders = {"gpt-oss": tmp_path / "gpt-oss-model", "qwen3.5": tmp_path / "qwen-model", "llama": tiny_model_dir}
    for name, model in (("gpt-oss", oss), ("qwen3.5", tiny_model("qwen3_5_text"))):
        model.save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    return {name: (tmp_path / name, measure(model=str(f), corpus=str(text_corpus_dir), num_samples=3, seq_len=16,
                                           progress=False, out=tmp_path / name))
            for name, f in folders.items()}


@pytest.mark.slow
def test_compare_and_plots_show_the_virtual_sink_and_the_gate_weighted_rate(measured, tmp_path, capsys, monkeypatch):
    oss = measured["gpt-oss"][1]
    eps = oss.config.eps
    extra = oss.stats.extra_mass  # (N, L, H) raw per-sample mass on the virtual sink
    per_layer = [float((extra[:, l] > eps).double().mean() * 100) for l in range(extra.shape[1])]
    assert 0 < oss.summary["sink_rate_virtual"] < 100 and len(set(per_layer)) > 1  # the checks can fail
    assert oss.summary["sink_rate_virtual_per_layer"] == pytest.approx(per_layer, abs=1e-4)

    figures = _figures(monkeypatch)
    folders = [str(f) for f, _ in measured.values()]
    code, stdout, err = run_cli_captured(["compare", *folders, "--out", str(tmp_path / "cmp")], capsys)
    assert code == 0, err
    models = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    layers = pd.read_csv(tmp_path / "cmp" / "compare_layers.csv")
    for (folder, res), row in zip(measured.values(), models.itertuples()):
        s = json.loads((folder / "results.json").read_text())
        name = row.model
        if res is oss:
            assert row.sink_rate_virtual == s["sink_rate_virtual"]
            assert row.virtual_mass == pytest.approx(float(extra.mean()), abs=1e-6)
            assert layers[layers.model == name].sink_rate_virtual.tolist() == s["sink_rate_virtual_per_layer"]
        else:
            assert pd.isna(row.sink_rate_virtual) and layers[layers.model == name].sink_rate_virtual.isna().all()
        # layers keep their block numbers (a hybrid's attention blocks: Qwen3.5's are not 0..L-1)
        blocks = len(s["layer_ids"]) + len(s.get("other_layers") or {})
        assert layers[layers.model == name].layer.tolist() == s["layer_ids"]
        assert layers[layers.model == name].depth.tolist() == pytest.approx([b / (blocks - 1) for b in s["layer_ids"]])
        if "sink_rate_gated" in s:  # Qwen3.5
            assert s["layer_ids"] != list(range(len(s["layer_ids"])))  # the hybrid case is exercised
            assert row.sink_rate_gated_1 == s["sink_rate_gated"][0]
            assert row.attention_mass_first_gated == s["attention_mass_first_gated"]
            assert layers[layers.model == name].sink_rate_gated_1.tolist() == [
                r[0] for r in s["sink_rate_gated_per_layer"]]
        else:
            assert pd.isna(row.sink_rate_gated_1)
    header = stdout.splitlines()[0]
    assert "Sink* (%)" in header and "gated Sink_1 (%)" in header
    oss_line = next(ln for ln in stdout.splitlines() if ln.startswith(models.model[0]))
    assert f"{oss.summary['sink_rate_virtual']:.2f}" in oss_line

    # compare.png: the Sink* bar of gpt-oss only, beside its Sink_1; the gate-weighted bar of Qwen3.5 only
    bars_ax = figures[-1].axes[0]
    assert _bars(bars_ax, "Sink_1") == pytest.approx(models.sink_rate_1.tolist())
    assert _bars(bars_ax, "Sink* (virtual sink)") == pytest.approx([oss.summary["sink_rate_virtual"]])
    qwen = measured["qwen3.5"][1]
    assert _bars(bars_ax, "gate-weighted Sink_1") == pytest.approx([qwen.summary["sink_rate_gated"][0]])
    lines = {ln.get_label(): ln for ln in figures[-1].axes[1].get_lines()}
    assert list(lines[f"{models.model[0]}: Sink*"].get_ydata()) == pytest.approx(per_layer, abs=1e-4)

    # the measure plot: the virtual sink at x = 0 (labelled "*") beside Sink_1..K; Qwen3.5's gate-weighted bars
    from sinklab.measure.report import sink_rate_figure

    ax = sink_rate_figure(oss.summary).axes[0]
    assert _bars(ax, "Sink* (virtual sink)") == pytest.approx([oss.summary["sink_rate_virtual"]])
    # gpt-oss's sliding-window layers hide keys: its plain Sink_k (the paper's formula) beside the mask-aware one
    assert oss.summary["mask_aware_differs"]
    assert _bars(ax, "Sink_k (paper's formula)") == pytest.approx(oss.summary["sink_rate"])
    assert _bars(ax, "mask-aware Sink_k") == pytest.approx(oss.summary["sink_rate_visible"])
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["*", "1"]
    ax = sink_rate_figure(qwen.summary).axes[0]
    assert _bars(ax, "gate-weighted Sink_k") == pytest.approx(qwen.summary["sink_rate_gated"])
    assert _bars(ax, "Sink* (virtual sink)") is None
    llama = measured["llama"][1]
    ax = sink_rate_figure(llama.summary).axes[0]
    assert _bars(ax, "Sink* (virtual sink)") is None and _bars(ax, "gate-weighted Sink_k") is None
