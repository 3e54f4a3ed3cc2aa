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

from helpers import run_cli_captured, tiny_llama
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
    with pytest.raises(InputError, match="^sample=2 is outside"):
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


# ------------------------------------------------------------------ repeat: first-layer mechanism and sink injection
def test_self_attention_statistics_match_loops():
    from sinklab.analyze.repeat import self_attention_statistics

    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 7, 4
    logits = torch.randn(B, H, T, T, generator=g).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = logits.softmax(-1)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    got = self_attention_statistics(w, q, k, start=2)
    cos = lambda a, c: float(a.double() @ c.double() / (a.double().norm() * c.double().norm()))  # noqa: E731
    for b in range(B):
        for h in range(H):
            rows = range(2, T)
            assert float(got["self_share"][b, h]) == pytest.approx(sum(float(w[b, h, i, i]) for i in rows) / 5, abs=1e-7)
            assert float(got["uniform_share"][b, h]) == pytest.approx(sum(1 / (i + 1) for i in rows) / 5, abs=1e-12)
            assert float(got["qk_cos_self"][b, h]) == pytest.approx(sum(cos(q[b, h, i], k[b, h, i]) for i in rows) / 5,
                                                                    abs=1e-9)
            other = [cos(q[b, h, i], k[b, h, j]) for i in rows for j in range(i)]
            assert float(got["qk_cos_other"][b, h]) == pytest.approx(sum(other) / len(other), abs=1e-9)


def test_self_attention_statistics_under_a_window_count_the_windows_keys():
    """With the layer's own mask (a window of 3), a head spreading evenly gives 1 / (keys in the window) and
    the other visible keys are the window's: naive loops."""
    from sinklab.analyze.repeat import self_attention_statistics

    g = torch.Generator().manual_seed(2)
    B, H, T, D, W = 2, 3, 8, 4, 3
    seen = torch.tensor([[0 <= i - j < W for j in range(T)] for i in range(T)])
    w = torch.randn(B, H, T, T, generator=g).masked_fill(~seen, float("-inf")).softmax(-1)
    q, k = torch.randn(B, H, T, D, generator=g), torch.randn(B, H, T, D, generator=g)
    got = self_attention_statistics(w, q, k, start=2, visible=seen)
    cos = lambda a, c: float(a.double() @ c.double() / (a.double().norm() * c.double().norm()))  # noqa: E731
    rows = range(2, T)
    for b in range(B):
        for h in range(H):
            assert float(got["uniform_share"][b, h]) == pytest.approx(
                sum(1 / min(i + 1, W) for i in rows) / len(rows), abs=1e-12)
            other = [cos(q[b, h, i], k[b, h, j]) for i in rows for j in range(T) if j != i and seen[i, j]]
            assert float(got["qk_cos_other"][b, h]) == pytest.approx(sum(other) / len(other), abs=1e-9)


def test_forcing_every_first_layer_head_to_self_attend_makes_the_position_a_first_token():
    """With every head of layer 0 attending only to itself, position p's layer-0 output is what token x_p
    gives as the first token of a sequence (the value has no RoPE; RMSNorm and the MLP act per position);
    positions before p are unchanged."""
    from sinklab.analyze.common import run_model
    from sinklab.analyze.repeat import force_self_attention

    m = tiny_llama()
    ids = _ids(2, 10)
    p = 6
    edited = run_model(m, ids, edit=force_self_attention(p, {0: [0, 1, 2, 3]}), hidden=True).hidden
    plain = run_model(m, ids, hidden=True).hidden
    with torch.no_grad():
        alone = m(input_ids=ids[:, p : p + 1], output_hidden_states=True).hidden_states[1][:, 0]  # layer 0's output
    torch.testing.assert_close(edited[:, 0, p], alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain[:, 0, p], alone, atol=1e-3)
    torch.testing.assert_close(edited[:, :, :p], plain[:, :, :p], rtol=0, atol=0)
    with pytest.raises(InputError, match="outside the sequence"):
        run_model(m, ids, edit=force_self_attention(10, {0: [0]}))


def test_repeat_mechanism_and_injection_tables_match_eager_and_recomputed_projections():
    from sinklab.analyze import repeat

    m = tiny_llama()
    ids = _ids(3, 12)
    res = repeat(Subject(m, ids, model_info={"name": "tiny"}), prompt_len=3, counts=[2], eps=0.05, position=7)
    out = _eager(m, ids)
    mech = res.tables["self_attention"]
    a0 = out.attentions[0].double()  # (N, H, T, T)
    with torch.no_grad():
        emb = m.model.layers[0].input_layernorm(m.model.embed_tokens(ids))
        attn = m.model.layers[0].self_attn
        q = attn.q_proj(emb).view(3, 12, 4, 8).double()  # (N, T, H, D), before RoPE: cos(q_i, k_i) is the same after
        k = attn.k_proj(emb).view(3, 12, 2, 8).double()
    for h in range(4):
        row = mech[(mech["layer"] == 0) & (mech["head"] == h)].iloc[0]
        share = float(sum(a0[n, h, i, i] for n in range(3) for i in range(2, 12)) / 30)
        cs = float(sum(F.cosine_similarity(q[n, i, h], k[n, i, h // 2], dim=0) for n in range(3) for i in range(2, 12)) / 30)
        assert row["self_share"] == pytest.approx(share, abs=1e-6)
        assert row["qk_cos_self"] == pytest.approx(cs, abs=1e-5)
    inj = res.tables["inject"]
    none = inj[inj["variant"] == "none"].sort_values("layer")
    for l in range(2):
        a = out.attentions[l].double()
        mass = attention_mass(a)[..., 7]  # (N, H)
        assert none.iloc[l]["mass_on_position"] == pytest.approx(float(mass.mean()), abs=1e-6)
        assert none.iloc[l]["sink_rate_position"] == pytest.approx(float((mass > 0.05).double().mean() * 100))
        h = out.hidden_states[l + 1].double()
        assert none.iloc[l]["cos_position_to_first"] == pytest.approx(
            float(F.cosine_similarity(h[:, 7], h[:, 0], dim=-1).mean()), abs=1e-5)
    s = res.summary
    lowest = mech[mech["layer"] == 0].sort_values(["self_share", "head"])["head"].tolist()
    assert s["inject_heads"] == sorted(lowest[:2]) and s["control_heads"] == sorted(lowest[2:])
    assert set(inj["variant"]) == {"none", "self_heads", "self_all", "control_heads"}
    assert set(s["inject_after_last_edited_layer"]) == {"none", "self_heads", "self_all", "control_heads"}
    # the edit changes layer 1's attention on position 7 (layer 0's row 7 only feeds later layers)
    edited = inj[(inj["variant"] == "self_all") & (inj["layer"] == 1)].iloc[0]
    assert edited["mass_on_position"] != pytest.approx(none.iloc[1]["mass_on_position"], abs=1e-6)
    with pytest.raises(InputError, match="must lie in"):
        repeat(Subject(m, ids, model_info={"name": "tiny"}), prompt_len=3, counts=[2], eps=0.05, position=0)


# ------------------------------------------------------------------ depth
def test_depth_layer_statistics_match_eager_weights_and_numpy_entropy():
    from sinklab.analyze import depth

    m = tiny_llama()
    ids = _ids(4, 20)
    res = depth(Subject(m, ids, model_info={"name": "tiny"}), eps=0.1, top_k=2)
    out = _eager(m, ids)
    layers = res.tables["layers"]
    assert layers["step"].tolist() == [-1, -1]
    for l in range(2):
        row = layers[layers["layer"] == l].iloc[0]
        mass = attention_mass(out.attentions[l].double())  # (N, H, T)
        curve = (mass > 0.1).double().mean(dim=(0, 1)) * 100  # (T,)
        assert row["sink_rate_first"] == pytest.approx(float(curve[0]))
        ranked = sorted(range(1, 19), key=lambda j: (-float(curve[j]), j))  # positions seen by >= 10% of the queries
        assert [row["sink2_position"], row["sink3_position"]] == ranked[:2]
        assert row["sink2_rate"] == pytest.approx(float(curve[ranked[0]]))
        per_sample = (mass > 0.1).double().mean(dim=1) * 100  # (N, T)
        assert row["secondary_sink_rate"] == pytest.approx(float(per_sample[:, 1:19].max(dim=1).values.mean()))
        h = out.hidden_states[l + 1].double()  # layer l's block output (the last one is after the final norm in HF)
        if l == 1:
            h = torch.stack(_last_block_output(m, ids))
        norms = h.norm(dim=-1)  # (N, T)
        assert row["norm_ratio_first"] == pytest.approx(float((norms[:, 0] / norms.mean(dim=1)).mean()), rel=1e-5)
        ents = []
        for n in range(4):
            x = h[n].numpy()
            lam = np.clip(np.linalg.eigvalsh(x @ x.T / np.trace(x @ x.T)), 0, None)
            lam = lam[lam > 0]
            ents.append(float(-(lam * np.log(lam)).sum()))
        assert row["matrix_entropy"] == pytest.approx(sum(ents) / 4, abs=1e-5)
        assert row["matrix_entropy_normalised"] == pytest.approx(sum(ents) / 4 / math.log(20), abs=1e-5)
    none = depth(Subject(m, ids, model_info={"name": "tiny"}), eps=0.99, top_k=1).tables["layers"]
    assert (none["sink2_position"] == -1).all() and (none["sink2_rate"] == 0).all()  # no sink anywhere


def _last_block_output(m, ids):
    """The last block's output before the final norm (what the capture seam records), per sample."""
    seen = []
    handle = m.model.layers[-1].register_forward_hook(lambda _m, _i, o: seen.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        m(input_ids=ids)
    handle.remove()
    return [x.double() for x in seen[0]]


def _kept_checkpoint_run(tmp_path):
    """A 2-layer synthetic run trained to step 4 with the step-2 checkpoint kept in checkpoints/ (train to 2,
    copy checkpoint.pt, resume: resume is exact, so this is the uninterrupted run)."""
    import shutil

    from helpers import synthetic_run_toml
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    f = tmp_path / "run.toml"
    f.write_text(synthetic_run_toml(steps=4))
    cfg = load_config(f, ["model.n_layers=2"])
    out = tmp_path / "run"
    loop.train(cfg, out, progress=False, stop_after=2)
    (out / "checkpoints").mkdir()
    shutil.copy(out / "checkpoint.pt", out / "checkpoints" / "step_000002.pt")
    loop.train(cfg, out, progress=False, resume=True)
    return out


def test_depth_on_every_checkpoint_of_a_run(tmp_path):
    from sinklab.analyze import depth
    from sinklab.analyze.depth import run_checkpoints
    from sinklab.capture.native import forward_native
    from sinklab.runs import Run
    from sinklab.train.checkpoint import load_run_checkpoint

    out = _kept_checkpoint_run(tmp_path)
    found = run_checkpoints(out)
    assert [(c.step, c.source) for c in found] == [(2, "checkpoints/step_000002.pt"), (4, "final")]  # checkpoint.pt = step 4
    res = depth(str(out), num_samples=4, seq_len=16, eps=0.1)
    assert res.summary["steps"] == [2, 4] and "note" not in res.summary
    layers = res.tables["layers"]
    assert len(layers) == 4 and set(layers["source"]) == {"checkpoints/step_000002.pt", "final"}
    # step 2 from the kept file, recomputed through the model's own observer weights
    ids = Run.open(out).probe(4, 16, 0, "auto").input_ids
    model = found[0].load()
    state = load_run_checkpoint(out / "checkpoints" / "step_000002.pt")
    for k, v in model.state_dict().items():
        assert torch.equal(v, state["model"][k])
    seen = {}
    with torch.no_grad():
        model(ids, observer=lambda l, w, **_: seen.__setitem__(l, w.double()))
    for l in range(2):
        rate = float((attention_mass(seen[l])[..., 0] > 0.1).double().mean() * 100)
        row = layers[(layers["step"] == 2) & (layers["layer"] == l)].iloc[0]
        assert row["sink_rate_first"] == pytest.approx(rate)
    assert res.tables["steps"]["step"].tolist() == [2, 4]
    res.save(tmp_path / "d")
    assert (tmp_path / "d" / "depth.png").stat().st_size > 0


def test_depth_run_without_any_model_state_and_with_one(tmp_path, capsys):
    import shutil

    from sinklab.analyze import depth

    out = _kept_checkpoint_run(tmp_path)
    shutil.rmtree(out / "checkpoints")
    one = depth(str(out), num_samples=2, seq_len=16)
    assert one.summary["steps"] == [4] and "keeps one model state" in one.summary["note"]
    shutil.rmtree(out / "final")
    (out / "checkpoint.pt").unlink()
    with pytest.raises(InputError, match="keeps no model state"):
        depth(str(out), num_samples=2, seq_len=16)
    code, _, err = run_cli_captured(["analyze", "depth", "--model", str(out), "-n", "2", "-t", "16",
                                     "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "keeps no model state" in err and len(err.strip().splitlines()) == 1


def test_attention_takes_each_layers_own_mask_on_a_model_mixing_windows():
    """Gemma 2 mixes sliding (window 8) and full layers: analyze attention gave every layer the last windowed
    layer's uniform reference (1.7025 nats for the full layer, whose keys give 1.9170) and cut the full layer's
    weight table to the window. Each layer has its own now: the uniform reference computed by hand, and the full
    layer's table holds every causal pair."""
    import math

    from helpers import tiny_gemma2_mixed
    from sinklab.analyze import Subject, attention

    m = tiny_gemma2_mixed()
    T = 16
    x = torch.randint(3, 128, (1, T), generator=torch.Generator().manual_seed(0))
    res = attention(Subject(m, x, model_info={"name": "gemma2"}), num_samples=1, layers=[0, 1], heads=[0])
    e = res.tables["entropy"]
    want = {0: sum(math.log(min(i + 1, 8)) for i in range(T)) / T, 1: sum(math.log(i + 1) for i in range(T)) / T}
    for layer, u in want.items():
        assert e[e.layer == layer].uniform_entropy.iloc[0] == pytest.approx(u, abs=1e-12)
    assert res.summary["attention_entropy_uniform"] is None
    assert res.summary["attention_entropy_uniform_per_layer"] == pytest.approx({"0": want[0], "1": want[1]})
    w = res.tables["weights"]
    assert len(w[w.layer == 1]) == T * (T + 1) // 2  # every causal pair of the full layer
    assert len(w[w.layer == 0]) == sum(min(i + 1, 8) for i in range(T))  # the window's pairs
    rows = w[(w.layer == 1)].groupby("query")["weight"].sum()
    assert np.allclose(rows.to_numpy(), 1.0, atol=1e-5)  # each query's weights over the keys it sees sum to 1
