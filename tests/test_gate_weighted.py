"""Gate-weighted attention (issue 36 part 4; DESIGN "gate-weighted attention"): for heads whose output is
multiplied by a gate after attention, ``measure`` reports ``A[l, h, i, j] * |g[l, h, i]|`` (element-wise
gates: the mean |g| over the head's channels) beside the raw weights, and the sink rate on it.

References are computed another way: a one-layer SinkLM whose gate weights are set by hand (every token the
same vector, NoPE: the attention is uniform over the causal keys, the gates are known sigmoids), a naive
float64 recomputation of a random SinkLM from its own weights, and for the gated ``transformers`` types the
model's own product in float64 (the output projection's input divided by the eager attention output)."""

from __future__ import annotations

import copy
import importlib
import json
import math
import warnings

import pytest
import torch

from helpers import run_cli_captured
from sinklab.capture import collect
from sinklab.capture import families
from sinklab.capture.gates import GATES
from sinklab.errors import InputError
from sinklab.hooks import Hook, hooked
from sinklab.measure import measure
from sinklab.metrics import summarize
from tiny_models import VOCAB, tiny_model


def _sinklm(op: str, n_layers: int = 1, positional: str = "nope", seed: int = 0):
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=16, d_model=8, n_layers=n_layers, n_heads=2, d_ff=16, attention=op,
                      positional=positional, max_seq_len=32)
    return SinkLM(cfg).eval()


def naive_mass(a: torch.Tensor) -> torch.Tensor:
    """Gu et al. Eq. 2, one key at a time: mean over the causal queries i >= j of (B, H, T, T) weights."""
    return torch.stack([a[..., j:, j].mean(dim=-1) for j in range(a.shape[-1])], dim=-1)


def _weights_and_gate(model, ids: torch.Tensor, seen: torch.Tensor, **forward) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0 of a one-layer gated SinkLM (2 heads of 4, NoPE) recomputed in float64 from its own weights: the
    attention (B, H, T, T) under the visibility ``seen`` (T, T) and the gate magnitude (B, H, T)."""
    m64 = copy.deepcopy(model).double().requires_grad_(False)
    inputs = []
    handle = m64.layers[0].register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
    with torch.no_grad():
        m64(ids, **forward)
    handle.remove()
    B, T = ids.shape
    H, dh = 2, 4
    blk = m64.layers[0]
    xn = blk.attn_norm(inputs[0])
    a = blk.attn
    q = (xn @ a.q_proj.weight.T).view(B, T, H, dh).transpose(1, 2)
    k = (xn @ a.k_proj.weight.T).view(B, T, -1, dh).transpose(1, 2).repeat_interleave(H // a.n_kv_heads, dim=1)
    A = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(dh)).masked_fill(~seen, float("-inf")), dim=-1)
    g = torch.sigmoid(xn @ a.gate_proj.weight.T).view(B, T, H, -1).abs().mean(dim=-1).transpose(1, 2)  # (B, H, T)
    return A, g


# ------------------------------------------------------------------ hand-worked
@pytest.mark.parametrize("op", ["gated_headwise", "gated_elementwise"])
def test_hand_worked_one_layer_gate(op):
    """Every token's embedding is 1000 * ones (d = 8), so the attention input after RMSNorm is ones(8) at every
    position: without positions every score is equal and query i spreads 1/(i+1) over keys 0..i; the mass on
    token 1 (T = 4) is (1 + 1/2 + 1/3 + 1/4) / 4 = 25/48. Gate weights set by hand: head 0's gate logit is 0
    (gate 0.5), head 1's is ln 3 (gate 0.75); element-wise, head 0's four channels are 0.5 and head 1's are
    0.9, 0.1, 0.9, 0.1 (logits +-ln 9; mean |g| 0.5), so the gate-weighted mass on token 1 is 25/96 and
    25/64 (head-wise) or 25/96 and 25/96 (element-wise), and at eps = 0.3 the raw Sink_1 is 100% (both heads
    at 0.52) while the gate-weighted one is 50% (head-wise) or 0% (element-wise)."""
    model = _sinklm(op)
    attn = model.layers[0].attn
    with torch.no_grad():
        model.embed.weight.fill_(1000.0)
        w = attn.gate_proj.weight  # (H, d) head-wise, (H * d_h, d) element-wise; the input is ones(8)
        w.zero_()
        if op == "gated_headwise":
            w[1] = math.log(3) / 8
            gates = [0.5, 0.75]
        else:  # rows 0..3 head 0, rows 4..7 head 1
            w[4:8] = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * math.log(9) / 8
            gates = [0.5, 0.5]
    ids = torch.randint(0, 16, (3, 4), generator=torch.Generator().manual_seed(0))
    stats = collect(model, ids)
    harmonic = 25 / 48
    tail = [1 + 1 / 2 + 1 / 3 + 1 / 4, 1 / 2 + 1 / 3 + 1 / 4, 1 / 3 + 1 / 4, 1 / 4]  # sum_{i >= j} 1/(i+1)
    want_raw = torch.tensor(tail, dtype=torch.float64) / torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64)
    assert want_raw[0] == pytest.approx(harmonic)
    for h, g in enumerate(gates):
        torch.testing.assert_close(stats.mass[:, 0, h], want_raw.expand(3, 4), atol=1e-6, rtol=0)
        torch.testing.assert_close(stats.gated_mass[:, 0, h], g * want_raw.expand(3, 4), atol=1e-6, rtol=0)
        torch.testing.assert_close(stats.gate_mean[:, 0, h], torch.full((3,), g, dtype=torch.float64), atol=1e-6,
                                   rtol=0)
    s = summarize(stats, eps=0.3, positions=2, n_boot=10)
    assert s["sink_rate"][0] == 100.0
    assert s["sink_rate_gated"][0] == (50.0 if op == "gated_headwise" else 0.0)
    assert s["attention_mass_first_gated"] == pytest.approx(harmonic * sum(gates) / 2, abs=1e-6)
    assert s["gate_mean"] == [pytest.approx(gates, abs=1e-6)]


def test_no_gate_no_gated_keys():
    """An ungated operation reports no gate-weighted attention (not a copy of the raw one)."""
    stats = collect(_sinklm("softmax"), torch.randint(0, 16, (2, 6)))
    assert stats.gated_mass is None and stats.gate_mean is None
    assert "sink_rate_gated" not in summarize(stats, n_boot=10)


# ------------------------------------------------------------------ naive float64 recomputation
@pytest.mark.parametrize("op", ["gated_headwise", "gated_elementwise"])
def test_random_sinklm_against_naive_float64(op):
    """A random 2-layer gated SinkLM (NoPE, learned-free): each layer's input is read with a plain torch
    pre-hook on a float64 copy, and the attention, the gate and the gate-weighted mass are recomputed by hand
    from the layer's own weights."""
    model = _sinklm(op, n_layers=2, seed=3)
    with torch.no_grad():  # gates away from 0.5 and varying over heads, queries and channels
        for blk in model.layers:
            blk.attn.gate_proj.weight.mul_(8.0)
    ids = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(2))
    stats = collect(model, ids)
    m64 = copy.deepcopy(model).double()
    inputs = []
    handles = [blk.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for blk in m64.layers]
    with torch.no_grad():
        m64(ids)
    for h in handles:
        h.remove()
    B, T = ids.shape
    H, dh = 2, 4
    want, want_gate = [], []
    for blk, x in zip(m64.layers, inputs):
        xn = blk.attn_norm(x)
        a = blk.attn
        q = (xn @ a.q_proj.weight.T).view(B, T, H, dh).transpose(1, 2)
        k = (xn @ a.k_proj.weight.T).view(B, T, -1, dh).transpose(1, 2).repeat_interleave(H // a.n_kv_heads, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(dh)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        A = torch.softmax(s, dim=-1)  # (B, H, T, T)
        g = torch.sigmoid(xn @ a.gate_proj.weight.T).view(B, T, H, -1).abs().mean(dim=-1).transpose(1, 2)  # (B, H, T)
        want.append(naive_mass(A * g[..., None]))
        want_gate.append(g.mean(dim=-1))
    torch.testing.assert_close(stats.gated_mass, torch.stack(want, dim=1), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.gate_mean, torch.stack(want_gate, dim=1), atol=1e-6, rtol=0)
    assert not torch.allclose(stats.gated_mass, stats.mass * 0.5, atol=1e-3)  # the gates are not all 0.5


@pytest.mark.parametrize("op", ["gated_headwise", "gated_elementwise"])
def test_prefix_lm_gate_weighted_mass_counts_the_queries_i_ge_j(op):
    """With a bidirectional prefix of 5 (prefix LM), queries before key j inside the prefix see j, but the
    gate-weighted mass, like the plain one (Gu et al. Eq. 2), is the mean over the queries i >= j: recomputed
    in float64 from the layer's own weights under the prefix mask. (It used to sum every query that saw j and
    divide by T - j: up to 1.65x the plain mass although a gate is at most 1.)"""
    P = 5
    model = _sinklm(op, n_layers=1, seed=4)
    with torch.no_grad():
        model.layers[0].attn.gate_proj.weight.mul_(8.0)
    ids = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(5))
    stats = collect(model, ids, prefix_len=P)
    T = ids.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (j > i) & ~((i < P) & (j < P))  # causal, except inside the prefix
    A, g = _weights_and_gate(model, ids, ~hidden, prefix_len=P)
    assert float(A[..., 0, 1:P].sum()) > 0.1  # the prefix's first query does attend to later prefix keys
    torch.testing.assert_close(stats.mass[:, 0], naive_mass(A), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.gated_mass[:, 0], naive_mass(A * g[..., None]), atol=1e-6, rtol=0)
    assert bool((stats.gated_mass <= stats.mass + 1e-9).all())  # a gate is at most 1
    # the mask-aware gate-weighted mass: every query that sees j (the prefix's earlier ones too), over their number
    seen = ~hidden
    gv = (A * g[..., None] * seen).sum(dim=-2) / seen.sum(dim=0)
    torch.testing.assert_close(stats.gated_mass_visible[:, 0], gv, atol=1e-6, rtol=0)


@pytest.mark.parametrize("op", ["gated_headwise", "gated_elementwise"])
def test_sliding_window_gate_weighted_mass_has_a_mask_aware_variant(op):
    """Under a sliding window of 4 at T = 12 the paper's denominator T - j keeps key 0's mass at most
    W / T = 0.33 whatever the model does; the mask-aware gate-weighted mass divides the gate-weighted column
    sums by the queries the window lets see each key (it had no such variant: only the plain mass did). Reference: float64 from
    the layer's own weights and gate, the window rule written here; and the summary's rate from it."""
    from sinklab.nn import ModelConfig, SinkLM

    W = 4
    torch.manual_seed(4)
    model = SinkLM(ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, d_ff=16, attention=op,
                               positional="nope", max_seq_len=32, sliding_window=W)).eval()
    with torch.no_grad():
        model.layers[0].attn.gate_proj.weight.mul_(8.0)
    ids = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(5))
    stats = collect(model, ids)
    T = ids.shape[1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    seen = (i - j >= 0) & (i - j < W)
    A, g = _weights_and_gate(model, ids, seen)
    gv = (A * g[..., None]).sum(dim=-2) / seen.sum(dim=0)
    torch.testing.assert_close(stats.gated_mass[:, 0], naive_mass(A * g[..., None]), atol=1e-6, rtol=0)
    torch.testing.assert_close(stats.gated_mass_visible[:, 0], gv, atol=1e-6, rtol=0)
    eps = 0.1
    s = summarize(stats, eps=eps, positions=4)
    mine = [100.0 * float((gv[..., p] > eps).double().mean()) for p in range(4)]  # per sample, head; one layer
    assert s["sink_rate_gated_visible"] == pytest.approx(mine, abs=1e-4)
    assert max(mine) > 0  # the window lets a key pass eps
    assert s["attention_mass_first_gated_visible"] == pytest.approx(float(gv[..., 0].mean()), abs=1e-6)


def test_sinklm_gate_site_edit_is_the_models_gate():
    """``attn.gate`` on a SinkLM: a hook that closes head 1's gate changes the output exactly as zeroing
    that head's gate weights to -inf would (head 1 contributes nothing), and the recorder sees the edit."""
    model = _sinklm("gated_headwise", n_layers=1, positional="rope", seed=1)
    ids = torch.randint(0, 16, (2, 8), generator=torch.Generator().manual_seed(0))

    def close_head1(g, ctx):
        g = g.clone()
        g[:, 1] = 0.0
        return g

    with torch.no_grad(), hooked(model, Hook("attn.gate", close_head1)):
        edited = model(ids).logits
    ref = copy.deepcopy(model)
    with torch.no_grad():
        ref.layers[0].attn.o_proj.weight[:, 4:8] = 0.0  # head 1's output columns (d_h = 4)
        want = ref(ids).logits
    torch.testing.assert_close(edited, want, atol=1e-6, rtol=0)
    from sinklab.capture.adapter import adapt

    with hooked(model, Hook("attn.gate", close_head1)):
        stats = adapt(model).capture(ids).finish()
    assert float(stats.gated_mass[:, 0, 1].abs().max()) == 0.0 and float(stats.gate_mean[:, 0, 1].max()) == 0.0


# ------------------------------------------------------------------ transformers' gated types
HF_GATED = sorted(GATES.names())


def test_gate_readers_cover_the_gated_types():
    """Every gated type sinklab measures has a gate reader, and no other type has one."""
    measured = {t for t in families.GATED_TYPES if families.status(t) == "exact"}
    assert set(HF_GATED) == measured
    assert "qwen3_next" in HF_GATED


def _eager_with_outputs(model, ids, monkeypatch):
    """Float64 eager forward of ``model``: per attention layer, the weights (B, H, T, T), the attention output
    before the gate (B, T, H, D_v) and the output projection's input (B, T, H * D_v)."""
    m64 = copy.deepcopy(model).double()
    m64.set_attn_implementation("eager")
    try:
        m64.set_experts_implementation("eager")
    except Exception:  # noqa: BLE001 - no experts
        pass
    mod = importlib.import_module(type(model).__module__)
    orig = mod.eager_attention_forward
    seen, proj_in = [], []

    def spy(*args, **kw):
        out, w = orig(*args, **kw)
        seen.append((w, out))
        return out, w

    monkeypatch.setattr(mod, "eager_attention_forward", spy)
    from sinklab.capture.hf import attention_module, find_layers

    handles = []
    for blk in find_layers(m64):
        attn = attention_module(blk)
        if attn is not None and hasattr(attn, "o_proj"):
            handles.append(attn.o_proj.register_forward_pre_hook(lambda m, args: proj_in.append(args[0])))
    gates = []
    with torch.no_grad(), hooked(m64, Hook("attn.gate", lambda g, ctx: gates.append(g))):
        m64(input_ids=ids, use_cache=False)
    for h in handles:
        h.remove()
    return m64, seen, proj_in, gates


@pytest.mark.parametrize("model_type", HF_GATED)
def test_hf_gated_type_against_its_own_product(model_type, monkeypatch):
    """The gate sinklab reads equals the model's own: the output projection's input divided by the eager
    attention output (float64); the gate-weighted mass sinklab records (float32 model) equals the naive one
    from the eager weights and that gate to 1e-5."""
    warnings.filterwarnings("ignore")
    model = tiny_model(model_type)
    with torch.no_grad():  # a gate bias (Beam) starts at 0: give it values, so a reader that drops it fails
        for name, p in model.named_parameters():
            if name.endswith("gate_bias"):
                p.copy_(torch.linspace(-2.0, 2.0, p.numel()).view_as(p))
    ids = torch.randint(3, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    stats = collect(model, ids, batch_size=2)
    _, seen, proj_in, gates = _eager_with_outputs(model, ids, monkeypatch)
    assert len(seen) == len(proj_in) == len(gates) == stats.num_layers
    want, want_gate = [], []
    for (w, out), y, g in zip(seen, proj_in, gates):
        B, T, H, Dv = out.shape
        ref = (y.view(B, T, H, Dv) / out).transpose(1, 2)  # (B, H, T, D_v): the factor the model applied
        torch.testing.assert_close(g.double().expand_as(ref), ref, atol=1e-8, rtol=1e-8)
        m = ref.abs().mean(dim=-1)  # (B, H, T)
        want.append(naive_mass(w * m[..., None]))
        want_gate.append(m.mean(dim=-1))
    torch.testing.assert_close(stats.gated_mass, torch.stack(want, dim=1), atol=1e-5, rtol=0)
    torch.testing.assert_close(stats.gate_mean, torch.stack(want_gate, dim=1), atol=1e-5, rtol=0)


def test_hf_gate_is_read_only():
    model = tiny_model("qwen3_5_text")
    with pytest.raises(InputError, match="attn.gate.*read-only"), torch.no_grad():
        with hooked(model, Hook("attn.gate", lambda g, ctx: g * 0)):
            model(input_ids=torch.randint(3, VOCAB, (1, 8)), use_cache=False)


def test_measure_folder_reports_gate_weighted(tokenizer, text_corpus_dir, tmp_path, capsys, monkeypatch):
    """``sinklab measure FOLDER`` on a saved tiny Qwen3.5 (Qwen3-Next's gated attention; its tiny model builds
    in 0.1 s where Qwen3-Next's takes 7 s): results.json, attention.csv, sink_rate.csv and the
    console carry the gate-weighted attention, equal to the naive float64 one on the probe ids it wrote."""
    import pandas as pd

    warnings.filterwarnings("ignore")
    model = tiny_model("qwen3_5_text")
    folder = tmp_path / "qwen3.5"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    out = tmp_path / "m"
    code, stdout, stderr = run_cli_captured(["measure", "--model", str(folder), "--corpus", str(text_corpus_dir),
                                             "-n", "3", "-t", "16", "--out", str(out)], capsys)
    assert code == 0, stderr
    s = json.loads((out / "results.json").read_text())
    ids = torch.tensor(s["input_ids"])
    _, seen, proj_in, _ = _eager_with_outputs(model, ids, monkeypatch)
    want = []
    for (w, o), y in zip(seen, proj_in):
        B, T, H, Dv = o.shape
        m = (y.view(B, T, H, Dv) / o).transpose(1, 2).abs().mean(dim=-1)
        want.append(naive_mass(w * m[..., None]))
    want = torch.stack(want, dim=1)  # (N, L, H, T)
    K = s["positions"]
    torch.testing.assert_close(torch.tensor(s["attention_mass_gated"], dtype=torch.float64),
                               want[..., :K].mean(dim=0), atol=2e-6, rtol=0)
    rate = float((want[..., 0] > s["eps"]).double().mean() * 100)
    assert s["sink_rate_gated"][0] == pytest.approx(rate, abs=1e-4)
    assert s["attention_mass_first_gated"] < s["attention_mass_first"]  # gates in (0, 1) shrink the mass
    table = pd.read_csv(out / "attention.csv")
    first = table[(table["position"] == 0)].sort_values(["layer", "head"])
    assert first["attention_mass_gated"].tolist() == pytest.approx(want[..., 0].mean(dim=0).flatten().tolist(),
                                                                   abs=2e-6)
    assert pd.read_csv(out / "sink_rate.csv")["sink_rate_gated"].tolist() == s["sink_rate_gated"]
    assert "gate-weighted" in stdout


def test_measure_run_of_a_gated_operation(tmp_path):
    """``measure`` on a run trained with ``attention = "gated_elementwise"`` (2 steps): results.json holds the
    gate-weighted Sink_k, mass and gate means, equal to the metrics of the raw per-sample statistics."""
    from helpers import synthetic_run_toml
    from sinklab.metrics import sink_rate
    from sinklab.runs.config import load_config
    from sinklab.train import loop

    f = tmp_path / "gated.toml"
    f.write_text(synthetic_run_toml(steps=2).replace("n_heads = 2\n", 'n_heads = 2\nattention = "gated_elementwise"\n'))
    run = tmp_path / "gated"
    loop.train(load_config(f), run, progress=False)
    res = measure(model=str(run), progress=False, out=tmp_path / "m")
    s = json.loads((tmp_path / "m" / "results.json").read_text())
    g = res.stats.gated_mass
    assert g is not None and g.shape == res.stats.mass.shape
    K = s["positions"]
    assert s["sink_rate_gated"] == pytest.approx(sink_rate(g, s["eps"], K).tolist(), abs=1e-4)
    torch.testing.assert_close(torch.tensor(s["attention_mass_gated"], dtype=torch.float64), g[..., :K].mean(dim=0),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.tensor(s["gate_mean"], dtype=torch.float64), res.stats.gate_mean.mean(dim=0),
                               atol=1e-4, rtol=0)
    assert 0 < s["attention_mass_first_gated"] < s["attention_mass_first"]
