"""sinklab.analyze attention (one window's pattern and per-head entropy), repeat's first-layer mechanism and
sink injection, depth (per-layer sinks, norm ratio, matrix entropy, checkpoints of a run): each against an
independent computation from the model's own eager weights / hidden states."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import run_cli_captured, tiny_llama
from sinklab.analyze import Subject, attention
from sinklab.errors import InputError
from sinklab.metrics import attention_mass


def _ids(n=3, t=10, vocab=80, seed=0):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def _eager(model, ids):
    """output_attentions and hidden states of the model's own eager attention."""
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(input_ids=ids, output_attentions=True, output_hidden_states=True, use_cache=False)
    finally:
        model.set_attn_implementation(prev)


def _entropy_loop(p: torch.Tensor) -> float:
    """Mean over query rows of -sum p log p, plain Python on float64."""
    rows = p.double().tolist()
    return sum(-sum(x * math.log(x) for x in r if x > 0) for r in rows) / len(rows)


# ------------------------------------------------------------------ attention view
def test_attention_view_matches_eager_weights_mass_and_entropy():
    m = tiny_llama()
    ids = _ids(3, 10)
    res = attention(Subject(m, ids, model_info={"name": "tiny"}), num_samples=3, sample=1, layers=[1, 0], heads=[2, 0])
    out = _eager(m, ids[1:2])
    assert res.summary["view"] == "matrix" and res.summary["layers"] == [0, 1] and res.summary["heads"] == [0, 2]
    w = res.tables["weights"]
    for l in (0, 1):
        a = out.attentions[l][0].double()  # (H, T, T)
        for h in (0, 2):
            sub = w[(w["layer"] == l) & (w["head"] == h)]
            assert len(sub) == 10 * 11 // 2  # the visible (causal) pairs
            qi, kj = (torch.as_tensor(sub[c].to_numpy().copy()) for c in ("query", "key"))
            np.testing.assert_allclose(sub["weight"].to_numpy(), a[h][qi, kj].numpy(), atol=1e-6)
            mass = res.tables["mass"].query("layer == @l and head == @h")["attention_mass"].to_numpy()
            np.testing.assert_allclose(mass, attention_mass(a[h]).numpy(), atol=1e-6)
        ent = res.tables["entropy"].query("layer == @l")
        for h in range(4):  # every head, shown or not
            assert float(ent[ent["head"] == h]["attention_entropy"].iloc[0]) == pytest.approx(_entropy_loop(a[h]), abs=1e-5)
    assert res.summary["attention_entropy_uniform"] == pytest.approx(sum(math.log(i + 1) for i in range(10)) / 10)


def test_attention_view_past_max_matrix_len_shows_blockwise_mass_per_key():
    m = tiny_llama()
    ids = _ids(1, 12)
    res = attention(Subject(m, ids, model_info={"name": "tiny"}), layers=[1], heads=[3], max_matrix_len=8)
    assert res.summary["view"] == "mass_per_key" and "weights" not in res.tables
    a = _eager(m, ids).attentions[1][0, 3].double()
    np.testing.assert_allclose(res.tables["mass"]["attention_mass"].to_numpy(), attention_mass(a).numpy(), atol=1e-6)
    assert res.summary["attention_entropy_shown"]["1.3"] == pytest.approx(_entropy_loop(a), abs=1e-5)


def test_attention_view_bad_input():
    m = tiny_llama()
    s = Subject(m, _ids(2, 8), model_info={"name": "tiny"})
    with pytest.raises(InputError, match="head 4 is out of range"):
        attention(s, num_samples=2, heads=[4])
    with pytest.raises(InputError, match="layer 2 is out of range"):
        attention(s, num_samples=2, layers=[2])
    with pytest.raises(InputError, match="--sample 2 is outside"):
        attention(s, num_samples=2, sample=2)


def test_attention_cli_writes_plot_and_keeps_weights_out_of_analysis_json(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    import pandas as pd

    out = tmp_path / "a"
    base = ["analyze", "attention", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-t", "8"]
    code, stdout, err = run_cli_captured(base + ["--layers", "0", "--heads", "1,2", "--out", str(out)], capsys)
    assert code == 0, err
    data = json.loads((out / "analysis.json").read_text())
    assert "weights" not in data["tables"] and data["csv_only_tables"] == ["weights.csv"]
    assert data["command"].startswith("sinklab analyze attention") and "--heads 1,2" in data["command"]
    assert len(pd.read_csv(out / "weights.csv")) == 2 * 36 and (out / "attention.png").stat().st_size > 0
    assert "attention_entropy_uniform:" in stdout
    code, _, err = run_cli_captured(base + ["--heads", "9", "--out", str(tmp_path / "b")], capsys)
    assert code == 2 and "head 9 is out of range" in err and len(err.strip().splitlines()) == 1
