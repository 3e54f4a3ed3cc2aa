"""Masked diffusion LM (issue 14): the loss against a naive computation, the bidirectional mask in
training and capture, the sampler's schedule, a planted sink across denoising steps, configs, and
a tiny end-to-end run (train -> measure -> analyze denoise / intervene)."""

import math
import tomllib

import pytest
import torch
import torch.nn.functional as F

from sinklab.data.packing import IGNORE_INDEX
from sinklab.diffusion.masking import corrupt, diffusion_targets, mask_ratio_and_mask
from sinklab.diffusion.sampler import sample, unmask_schedule
from sinklab.errors import ConfigError, InputError
from sinklab.nn import ModelConfig
from sinklab.nn.loss import linear_cross_entropy
from sinklab.nn.model import SinkLM
from sinklab.runs.config import apply_overrides, diff_keys, from_dict, load_config
from sinklab.train.objective import MaskedDiffusionObjective

from helpers import synthetic_run_toml

BOS, MASK = 10, 11


def tiny(causal=False, **kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=12, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=32, causal=causal)
    cfg.update(kw)
    return SinkLM(ModelConfig(**cfg)).double().eval()


def batch(B=3, T=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 10, (B, T), generator=g)
    x[:, 0] = BOS
    return x


# ----------------------------------------------------------------------------- the loss


def test_mask_draws_are_per_sample_and_respect_maskable():
    x = batch(B=6, T=40)
    maskable = x != BOS
    t, masked = mask_ratio_and_mask(7, 100, maskable, 1e-3)
    assert t.shape == (6,) and masked.shape == x.shape
    assert ((t >= 1e-3) & (t < 1)).all()
    assert not masked[:, 0].any()  # BOS never masked
    # a row's draw depends only on (seed, global sample index): the second half of the batch drawn alone is equal
    t2, m2 = mask_ratio_and_mask(7, 103, maskable[3:], 1e-3)
    assert torch.equal(t[3:], t2) and torch.equal(masked[3:], m2)
    t3, m3 = mask_ratio_and_mask(8, 100, maskable, 1e-3)
    assert not torch.equal(m3, masked)  # another seed, other masks
    # the mask ratio is the masking probability: over many samples the share masked tracks t
    tt, mm = mask_ratio_and_mask(0, 0, torch.ones(400, 200, dtype=torch.bool), 1e-3)
    assert (mm.double().mean(1) - tt.double()).abs().max() < 0.12
    with pytest.raises(InputError, match="eps"):
        mask_ratio_and_mask(0, 0, maskable, 0.0)


def test_masked_diffusion_loss_equals_naive_float64():
    """LLaDA Eq. 3 by hand: -1/(B T) sum over masked positions of log p(x0_i | x_t) / t_b."""
    m = tiny()
    x = batch(B=4, T=10, seed=1)
    obj = MaskedDiffusionObjective(mask_id=MASK, eps=1e-3, seed=3, eval_seed=4, keep_ids=(BOS,))
    with torch.no_grad():
        loss = obj.loss(m, x, None, 5)
    t, masked = mask_ratio_and_mask(3, 5, x != BOS, 1e-3)
    xt = x.clone()
    xt[masked] = MASK
    with torch.no_grad():
        logp = torch.log_softmax(m(xt).logits, -1)
    naive = 0.0
    for b in range(4):
        for i in range(10):
            if masked[b, i]:
                naive -= float(logp[b, i, x[b, i]]) / float(t[b])
    naive /= x.numel()
    assert masked.sum() > 0
    assert float(loss) == pytest.approx(naive, rel=1e-6)
    # the input the model saw: mask tokens exactly where masked, clean tokens elsewhere
    xt2, targets, w = obj.batch(x, 5, 3)
    assert torch.equal(xt2, xt)
    assert torch.equal(targets != IGNORE_INDEX, masked)


def test_diffusion_targets_weights_and_empty_mask():
    x = batch(B=2, T=5)
    masked = torch.zeros_like(x, dtype=torch.bool)
    masked[0, 2] = masked[1, 1] = masked[1, 3] = True
    t = torch.tensor([0.5, 0.25])
    targets, w = diffusion_targets(x, masked, t)
    # mean over the 3 counted positions of w * ce = sum ce / t / (B T)  ->  w = (1 / t) * 3 / 10
    assert w[0, 2] == pytest.approx(2 * 3 / 10) and w[1, 1] == pytest.approx(4 * 3 / 10) and w[0, 0] == 0
    assert targets[0, 2] == x[0, 2] and targets[0, 0] == IGNORE_INDEX
    # nothing masked: loss exactly 0 with zero gradient, never NaN
    m = tiny()
    tg, w0 = diffusion_targets(x, torch.zeros_like(masked), t)
    out = m(corrupt(x, torch.zeros_like(masked), MASK), targets=tg, target_weights=w0)
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and all(float(p.grad.abs().sum()) == 0 for p in m.parameters() if p.grad is not None)


def test_weighted_linear_cross_entropy_and_gradients():
    torch.manual_seed(0)
    h = torch.randn(2, 6, 8, dtype=torch.float64, requires_grad=True)
    W = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 11, (2, 6))
    y[0, 1] = IGNORE_INDEX
    wt = torch.rand(2, 6, dtype=torch.float64)
    got = linear_cross_entropy(h, W, y, weights=wt, min_rows=3)  # several chunks; log-sum-exp in float32
    ce = F.cross_entropy((h @ W.T).flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX, reduction="none")
    ok = y.flatten() != IGNORE_INDEX
    ref = (ce * wt.flatten())[ok].sum() / ok.sum()
    assert float(got) == pytest.approx(float(ref), rel=1e-6)
    g1 = torch.autograd.grad(got, (h, W))
    g2 = torch.autograd.grad(ref, (h, W))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    with pytest.raises(InputError, match="weights"):
        linear_cross_entropy(h, W, y, weights=wt[:, :3])


def test_half_batches_give_the_full_batch_loss():
    """Draws per global sample index: two halves (as two data-parallel ranks, or a resumed run) average to the
    whole batch's loss."""
    m = tiny()
    x = batch(B=4, T=12, seed=2)
    obj = MaskedDiffusionObjective(mask_id=MASK, eps=1e-3, seed=0, eval_seed=0, keep_ids=(BOS,))
    full = float(obj.loss(m, x, None, 40))
    halves = (float(obj.loss(m, x[:2], None, 40)) + float(obj.loss(m, x[2:], None, 42))) / 2
    assert full == pytest.approx(halves, rel=1e-6)  # float32 accumulation


# ----------------------------------------------------------------------------- bidirectional mask


def test_bidirectional_model_sees_later_tokens_and_capture_records_it():
    from sinklab.capture import collect
    from sinklab.capture.native import forward_native

    m = tiny(causal=False)
    x = batch(B=2, T=8)
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 10
    with torch.no_grad():
        assert not torch.allclose(m(x).logits[:, 0], m(y).logits[:, 0])  # position 0 depends on position 7
        c = tiny(causal=True)
        assert torch.allclose(c(x).logits[:, 0], c(y).logits[:, 0])  # a causal model's does not
    # capture: the observer's full weights averaged over all T queries (bidirectional mass)
    weights = []
    with torch.no_grad():
        m(x, observer=lambda l, w, **_: weights.append(w.double()))
    stats = collect(m, x)
    assert stats.causal is False
    ref = torch.stack([w.mean(dim=-2) for w in weights], dim=1)  # (N, L, H, T)
    torch.testing.assert_close(stats.mass, ref, rtol=1e-9, atol=1e-12)
    assert float(stats.mass[:, :, :, -1].sum()) > 0  # the last key gets attention from every query
    assert forward_native(m, x, prefix_len=3).finish().mask.get("prefix_len", 0) == 0


def test_kv_cache_refused_for_bidirectional_model():
    from sinklab.streaming import SinkCache

    m = tiny(causal=False).float()
    with pytest.raises(InputError, match="causal"):
        m(batch(1, 4), cache=SinkCache(m, 1, 4))


# ----------------------------------------------------------------------------- sampler


@pytest.mark.parametrize("G,S", [(12, 4), (10, 3), (7, 7), (5, 1)])
def test_sampler_follows_the_schedule_and_keeps_the_prompt(G, S):
    m = tiny()
    prompt = batch(B=3, T=4, seed=5)
    tr = sample(m, prompt, gen_len=G, steps=S, mask_id=MASK)
    assert tr.schedule == unmask_schedule(G, S) and sum(tr.schedule) == G
    assert len(tr.states) == S + 1 and len(tr.unmasked) == S
    assert (tr.states[0][:, 4:] == MASK).all()
    for s in range(S):
        before, after = tr.states[s], tr.states[s + 1]
        changed = (before != after)
        n_masked_before = (before == MASK).sum(1)
        n_masked_after = (after == MASK).sum(1)
        assert torch.equal(n_masked_before - n_masked_after, torch.full((3,), tr.schedule[s]))  # exactly k_s per row
        assert (changed.sum(1) == tr.schedule[s]).all()
        assert (before[changed] == MASK).all()  # only masked positions change
        assert torch.equal(after[:, :4], prompt)  # the prompt never changes
        pos = tr.unmasked[s]
        assert (pos >= 4).all()
    assert not (tr.tokens == MASK).any()  # nothing masked at the end, and the mask token is never predicted
    assert torch.equal(tr.tokens, tr.states[-1])


def test_sampler_low_confidence_order():
    """Step 1 keeps the k most confident predictions of the fully masked input (computed here directly)."""
    m = tiny()
    prompt = batch(B=2, T=3, seed=6)
    tr = sample(m, prompt, gen_len=6, steps=3, mask_id=MASK)
    with torch.no_grad():
        logits = m(tr.states[0]).logits
    logits[..., MASK] = float("-inf")
    p = torch.softmax(logits, -1)
    conf, pred = p.max(-1)
    conf[:, :3] = -1
    for b in range(2):
        want = set(conf[b].topk(2).indices.tolist())
        assert set(tr.unmasked[0][b].tolist()) == want
        for j in want:
            assert tr.states[1][b, j] == pred[b, j]


def test_sampler_bad_input():
    with pytest.raises(InputError, match="bidirectional"):
        sample(tiny(causal=True), batch(1, 3), gen_len=4, steps=2, mask_id=MASK)
    with pytest.raises(InputError, match="at most gen_len"):
        sample(tiny(), batch(1, 3), gen_len=4, steps=5, mask_id=MASK)
    with pytest.raises(InputError, match="vocabulary"):
        sample(tiny(), batch(1, 3), gen_len=4, steps=2, mask_id=99)


def planted_sink_model(position_token=BOS):
    """Every head of every layer attends almost only to the token ``position_token`` (wherever it sits):
    NoPE, q = a constant bias, k = a large multiple of the embedding's channel 0, which only that token has;
    attention and FFN outputs zeroed, so every layer sees the embeddings."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=12, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=32, causal=False,
                      positional="nope", qkv_bias=True)
    m = SinkLM(cfg).double().eval()
    with torch.no_grad():
        m.embed.weight[:, 0] = 0.0
        m.embed.weight[position_token] = 0.0
        m.embed.weight[position_token, 0] = 4.0
        m.embed.weight[:, 1] = 1.0  # a channel every token has, which the head turns into a very low BOS logit,
        m.lm_head.weight[position_token, 1] = -100.0  # so the sampler never writes a second sink token
        for blk in m.layers:
            a = blk.attn
            a.q_proj.weight.zero_()
            a.q_proj.bias.fill_(1.0)
            a.k_proj.weight.zero_()
            a.k_proj.weight[:, 0] = 10.0
            a.o_proj.weight.zero_()
            blk.ffn.down_proj.weight.zero_()
    return m


def test_planted_sink_is_found_at_every_denoising_step():
    from sinklab.subject import Subject
    from sinklab.analyze.denoise import denoise

    m = planted_sink_model()
    ids = torch.randint(0, 10, (4, 16), generator=torch.Generator().manual_seed(0))
    ids[:, 3] = BOS  # the planted sink sits at position 3, inside the prompt
    subj = Subject(m, ids, seed=0)
    res = denoise(subj, steps=4, prompt_len=6, mask_id=MASK)
    steps = res.tables["steps"]
    assert len(steps) == 5
    assert (steps["top_sink_position"] == 3).all()
    assert (steps["top_sink_rate"] == 100.0).all() and steps["has_sink"].all()
    assert (steps["mass_top"] > 0.95).all()
    # the mask keys get almost nothing although they start as 10 of 16 keys
    assert steps["mask_key_share"].iloc[0] == pytest.approx(10 / 16)
    assert steps["mass_mask"].iloc[0] < 0.05 and steps["mass_mask"].iloc[-1] == 0
    mass = res.tables["mass"]
    assert mass.groupby("step")["mass"].sum().sub(1).abs().max() < 1e-9  # the mass over keys sums to 1 (bidirectional)
    with pytest.raises(InputError, match="^prompt_len=16 must be in"):
        denoise(subj, steps=4, prompt_len=16, mask_id=MASK)
    with pytest.raises(InputError, match="masked diffusion"):
        denoise(Subject(tiny(causal=True), ids), steps=2, mask_id=MASK)


# ----------------------------------------------------------------------------- configs


def diffusion_cfg(*over, extra='objective = "masked_diffusion"'):
    return from_dict(apply_overrides(tomllib.loads(synthetic_run_toml(4, extra=extra)), list(over)))


def test_config_objective():
    cfg = diffusion_cfg()
    causal = diffusion_cfg(extra="")
    assert cfg.diffusion and not causal.diffusion
    assert cfg.model.causal is False and causal.model.causal is True
    assert cfg.model.vocab_size == causal.model.vocab_size + 1  # the mask token's row
    with pytest.raises(ConfigError, match="did you mean 'masked_diffusion'"):
        diffusion_cfg(extra='objective = "masked_difusion"')
    with pytest.raises(ConfigError, match="bidirectional"):
        diffusion_cfg("model.causal=true")
    with pytest.raises(ConfigError, match="would see the token"):
        diffusion_cfg("model.causal=false", extra="")
    with pytest.raises(ConfigError, match="prefix_len"):
        diffusion_cfg("train.prefix_len=4")
    with pytest.raises(ConfigError, match="mask token"):
        diffusion_cfg(f"model.vocab_size={causal.model.vocab_size}")
    with pytest.raises(ConfigError, match="mask_eps"):
        diffusion_cfg("train.mask_eps=1.5")
    # the diffusion presets differ from their causal base only in the objective (and what it implies)
    for name in ("emergence-cpu", "tiny-cpu"):
        a, b = load_config(name).to_dict(), load_config(f"{name}-diffusion").to_dict()
        assert diff_keys(a, b) == ["model.causal", "model.vocab_size", "train.objective"]


def test_old_configs_without_the_new_keys_still_match():
    cfg = diffusion_cfg(extra="").to_dict()
    old = {**cfg, "model": {k: v for k, v in cfg["model"].items() if k != "causal"},
           "train": {k: v for k, v in cfg["train"].items() if k not in ("objective", "mask_eps")}}
    assert diff_keys(old, cfg) == []
    assert diff_keys(old, diffusion_cfg().to_dict()) == ["model.causal", "model.vocab_size", "train.objective"]


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def diffusion_run(tmp_path_factory):
    from sinklab.train.loop import train

    out = tmp_path_factory.mktemp("drun") / "run"
    res = train(diffusion_cfg("train.steps=6"), out, progress=False)
    return out, res


def test_diffusion_training_run_files(diffusion_run):
    import json

    from tokenizers import Tokenizer

    out, res = diffusion_run
    s = json.loads((out / "summary.json").read_text())
    assert s["objective"] == "masked_diffusion" and math.isfinite(s["final_loss"])
    tok = Tokenizer.from_file(str(out / "final" / "tokenizer.json"))
    assert tok.token_to_id("<|mask|>") == s["mask_token_id"] == 18  # 16 tokens + EOS + BOS, then the mask
    m = SinkLM.from_pretrained(out / "final")
    assert m.config.causal is False and m.config.vocab_size == 19
    assert all(math.isfinite(r["val_loss"]) for r in res.history)


def test_diffusion_resume_is_exact(tmp_path):
    from sinklab.train.loop import train

    cfg = diffusion_cfg("train.steps=4")
    straight = train(cfg, tmp_path / "a", progress=False)
    train(cfg, tmp_path / "b", progress=False, stop_after=2)
    rest = train(cfg, tmp_path / "b", resume=True, progress=False)
    # the resumed run's result holds every step's loss, the first start's too (it held steps 3-4 only; outside
    # audit, 2026-12-07), and its train_result.json as well
    assert rest.losses == straight.losses
    from sinklab.train.loop import TrainResult

    assert TrainResult.load(tmp_path / "b").losses == straight.losses
    # a checkpoint written before the losses were kept in it: the first start's come from metrics.jsonl (6 decimals)
    train(cfg, tmp_path / "c", progress=False, stop_after=2)
    ck = torch.load(tmp_path / "c" / "checkpoint.pt", weights_only=False)
    del ck["losses"]
    torch.save(ck, tmp_path / "c" / "checkpoint.pt")
    old = train(cfg, tmp_path / "c", resume=True, progress=False)
    assert sorted(old.losses) == [1, 2, 3, 4]
    assert all(abs(old.losses[k] - straight.losses[k]) < 1e-6 for k in (1, 2, 3, 4))


def test_measure_denoise_intervene_on_a_diffusion_run(diffusion_run):
    from sinklab.analyze import denoise, intervene
    from sinklab.measure.run import measure

    out, _ = diffusion_run
    r = measure(model=str(out), num_samples=4, progress=False)
    assert r.stats.causal is False  # measured bidirectionally, as the model was trained
    d = denoise(str(out), num_samples=4, seq_len=16, steps=3, prompt_len=4)
    assert len(d.tables["steps"]) == 4 and d.summary["mask_id"] == 18
    assert d.tables["steps"]["masked_share"].tolist() == pytest.approx([1.0, 8 / 12, 4 / 12, 0.0])
    iv = intervene(str(out), num_samples=4, seq_len=16, only=["noop", "remove-sink"])
    t = iv.tables["interventions"].set_index("intervention")
    assert t.loc["noop", "loss_change"] == 0.0
    assert "masked diffusion loss" in iv.summary["readout"]


def test_denoise_cli_writes_its_files(diffusion_run, tmp_path, capsys):
    import json

    import pandas as pd

    from helpers import run_cli_captured

    out, _ = diffusion_run
    code, stdout, err = run_cli_captured(["analyze", "denoise", "--model", str(out), "-n", "4", "-t", "16", "--steps", "2",
                                          "--prompt-len", "8", "--out", str(tmp_path / "d")], capsys)
    assert code == 0, err
    d = json.loads((tmp_path / "d" / "analysis.json").read_text())
    assert d["kind"] == "denoise" and d["summary"]["schedule"] == [4, 4]  # T 16 = 8 prompt + 8 generated
    steps = pd.read_csv(tmp_path / "d" / "steps.csv")
    assert steps["step"].tolist() == [0, 1, 2] and steps["masked_share"].tolist() == [1.0, 0.5, 0.0]
    assert (tmp_path / "d" / "denoise.png").stat().st_size > 0 and "top_sink_positions" in stdout


def test_position_norm_ratio_hand_case():
    from sinklab.analyze.common import position_norm_ratio

    norms = torch.tensor([[[4.0, 1.0, 3.0], [2.0, 2.0, 2.0]]])  # (N 1, L 2, T 3)
    # layer 0: 4 / mean(1, 3) = 2; layer 1: 1; mean 1.5.  Position 1: (1 / 3.5 + 1) / 2
    assert position_norm_ratio(norms, 0) == pytest.approx(1.5)
    assert position_norm_ratio(norms, 1) == pytest.approx((1 / 3.5 + 1) / 2)
    with pytest.raises(InputError):
        position_norm_ratio(norms, 3)


def test_intervene_warns_without_a_sink_and_allows_bos(diffusion_run):
    from sinklab.analyze import intervene

    out, _ = diffusion_run
    iv = intervene(str(out), num_samples=4, seq_len=16, only=["noop", "remove-sink"], position=0, allow_non_sink=True)
    assert iv.summary["sink_position"] == 0
    assert any("no sink" in w for w in iv.summary["warnings"])  # a 6-step model has no sink at BOS
    assert "--allow-non-sink" in iv.command or "allow_non_sink=True" in iv.command


def test_remove_attention_to_bos_loss_equals_a_naive_float64_computation():
    """issue 21, item 10: `analyze intervene` on a masked diffusion model, remove-sink at BOS (position 0):
    its loss equals the masked diffusion loss (LLaDA Eq. 3, positions 1..T-1: sum of w * nll / (N T), w = 1/t
    on the masked positions) of a one-layer bidirectional forward written out here in float64 from the
    model's weights, with every query's attention to key 0 set to 0 and the row renormalised. The probe is
    masked as intervene masks it (diffusion_probe: BOS never masked); baseline and noop are checked the same
    way without the edit."""
    from types import SimpleNamespace

    from sinklab.analyze import Subject, intervene
    from sinklab.analyze.intervene import diffusion_probe

    torch.manual_seed(0)
    m = SinkLM(ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32, causal=False,
                           positional="learned")).eval()
    with torch.no_grad():  # BOS's key points along every query (a sink at position 0), so removing it matters
        m.embed.weight[BOS] = 0
        m.embed.weight[BOS, 0] = 1.0
        m.embed.weight[:, 1] += 1.0
        m.layers[0].attn.k_proj.weight[:, 0] += 0.5
        m.layers[0].attn.q_proj.weight[:, 1] += 0.5
        m.layers[0].attn.o_proj.weight.mul_(10.0)  # and the attention output weighs in the prediction
    tok = SimpleNamespace(mask_token_id=MASK, bos_token_id=BOS, eos_token_id=None, vocab_size=12)
    clean = batch(B=4, T=12, seed=3)
    subj = Subject(m, clean, tokenizer=tok, model_info={"name": "tiny-mdlm"}, seed=5)
    res = intervene(subj, eps=0.05, only=["noop", "remove-sink"], position=0, allow_non_sink=True, seed=5)
    t = res.tables["interventions"].set_index("intervention")
    x, w = diffusion_probe(subj, 5)  # (N, T) masked input, (N, T) 1/t on masked positions
    assert (x[:, 0] == BOS).all() and (x == MASK).any() and torch.equal(w > 0, x == MASK)

    def loss(remove_bos: bool) -> float:
        N, T = x.shape
        with torch.no_grad():
            h0 = (m.embed.weight[x] + m.positional.table.weight[:T]).double()  # (N, T, d)
            blk = m.layers[0]
            a = blk.attn
            lin = lambda layer, v: v @ layer.weight.double().T  # noqa: E731  (no biases in this config)
            def rms(norm, v):
                return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
            hn = rms(blk.attn_norm, h0)
            q, k, v = (lin(p, hn).view(N, T, 2, 8).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
            att = (q @ k.transpose(-1, -2) / math.sqrt(8)).softmax(-1)  # (N, H, T, T), no mask: bidirectional
            if remove_bos:
                att[..., 0] = 0
                att = att / att.sum(-1, keepdim=True)
            h1 = h0 + lin(a.o_proj, (att @ v).transpose(1, 2).reshape(N, T, 16))
            f = blk.ffn
            g = rms(blk.ffn_norm, h1)
            h2 = h1 + lin(f.down_proj, F.silu(lin(f.gate_proj, g)) * lin(f.up_proj, g))
            logp = (rms(m.final_norm, h2) @ m.lm_head.weight.double().T).log_softmax(-1)  # (N, T, V)
            nll = -logp.gather(-1, clean[..., None]).squeeze(-1)  # same-position readout of the clean token
        return float((nll[:, 1:] * w[:, 1:].double()).sum() / (N * T))

    assert t.loc["baseline", "loss"] == pytest.approx(loss(False), abs=1e-6)  # float32 model: ~1e-8 off
    assert t.loc["noop", "loss"] == t.loc["baseline", "loss"]
    assert t.loc["remove-sink", "loss"] == pytest.approx(loss(True), abs=1e-6)
    assert abs(loss(True) - loss(False)) > 1e-4  # the edit moves the loss 100x the tolerance (4.9e-4 here)
    assert "masked diffusion loss" in res.summary["readout"]


def test_denoise_top3_agrees_with_the_top_sink_and_is_empty_without_one():
    """``top3_positions`` starts with ``top_sink_position`` (ties by position) and lists only positions whose
    sink rate is above 0: an outside audit found "42;43;44" beside a top sink of 0 at a step where no position
    passed eps."""
    from types import SimpleNamespace

    from sinklab.analyze.denoise import step_row

    N, L, H, T = 2, 1, 2, 16
    kinds = torch.zeros(N, T, dtype=torch.long)
    norms = torch.ones(N, L, T)

    def stats(mass):
        return SimpleNamespace(visible_mass=mass, hidden_norms=norms, key_norms=None)

    flat = stats(torch.full((N, L, H, T), 1.0 / T, dtype=torch.float64))
    row, _ = step_row(flat, kinds, eps=0.3, prompt_len=4, sink_level=50.0)
    assert row["top_sink_position"] == 0 and row["top_sink_rate"] == 0 and row["top3_positions"] == ""
    assert not row["has_sink"]
    mass = torch.full((N, L, H, T), 0.01, dtype=torch.float64)
    mass[:, :, :, 5] = 0.5  # every (sample, head): 100%
    mass[0, :, :, 2] = 0.5  # half of them: 50% each at 2 and 7, tied
    mass[0, :, :, 7] = 0.5
    row, _ = step_row(stats(mass), kinds, eps=0.3, prompt_len=4, sink_level=50.0)
    assert row["top_sink_position"] == 5 and row["top3_positions"] == "5;2;7" and row["has_sink"]


@pytest.mark.parametrize("packing,kept", [("bos", ()), ("random_first", (0,)), ("random_first2", (0, 1))])
def test_the_tokens_the_packing_inserts_are_never_masked_or_scored(packing, kept):
    """random_first2 inserts two random tokens; masked diffusion masked and scored the second (55% of rows in the
    audit's run). Every inserted position stays clean and out of the loss, whatever the draw."""
    from types import SimpleNamespace

    from sinklab.data.packing import PackingContext, make_packer
    from sinklab.train.objective import make_objective

    cfg = diffusion_cfg(f"data.packing={packing}")
    tc = SimpleNamespace(vocab_size=cfg.model.vocab_size - 1, bos_id=BOS)
    packer = make_packer(packing, PackingContext(eos_id=2, bos_id=BOS, vocab_size=tc.vocab_size))
    obj = make_objective(cfg, tc, packer)
    assert obj.keep_positions == kept
    x = torch.randint(BOS + 1, obj.mask_id, (256, 8), generator=torch.Generator().manual_seed(0))  # text ids
    xt, targets, w = obj.batch(x, 0, seed=1)
    for p in range(8):
        masked = (xt[:, p] == obj.mask_id).float().mean().item()
        if p in kept:
            assert masked == 0.0 and (targets[:, p] == IGNORE_INDEX).all() and (w[:, p] == 0).all()
        else:
            assert masked > 0.3  # t ~ U(eps, 1): about half the rows mask a text position


def test_the_unigram_baseline_of_a_diffusion_run_is_its_masked_diffusion_loss():
    """summary.json's ``unigram_loss`` (the sweep's ``degenerate`` line) was the next-token cross-entropy of the unigram
    distribution, while a diffusion run's val_loss is the masked diffusion loss on the tracker's fixed masks: two
    different quantities (an audit found 4.176 beside a val_loss whose own unigram value was 3.977). The baseline is now
    the validation loss, through the model's own loss function, of a 'model' whose logits are the unigram
    log-probabilities at every position; for the causal objective it stays the plain unigram cross-entropy."""
    import types

    import numpy as np

    from sinklab.data.baseline import unigram_logprobs, unigram_loss
    from sinklab.nn.loss import linear_cross_entropy
    from sinklab.runs.config import TrackConfig
    from sinklab.train.objective import CausalObjective
    from sinklab.train.tracker import SinkTracker

    V = MASK + 1
    g = torch.Generator().manual_seed(0)
    stream = np.random.default_rng(0).integers(0, MASK, 5000)
    x = torch.randint(0, MASK, (10, 12), generator=g)
    x[:, 0] = BOS
    y = torch.roll(x, -1, dims=1)
    y[:, -1] = -100
    logp = unigram_logprobs(stream, V)

    class Unigram(torch.nn.Module):  # logits = logp at every position, through the model's loss function
        def forward(self, xt, targets=None, target_weights=None, **kw):
            h = torch.ones(*xt.shape, 1)
            w = torch.as_tensor(logp, dtype=torch.float32)[:, None]  # (V, 1): logits h w^T = logp
            loss = None if targets is None else linear_cross_entropy(h, w, targets, weights=target_weights)
            return types.SimpleNamespace(loss=loss, logits=(h @ w.T))

    obj = MaskedDiffusionObjective(mask_id=MASK, eps=1e-3, seed=0, eval_seed=5, keep_ids=(BOS,))
    tr = SinkTracker(x[:2], x, y, TrackConfig(batch_size=4), objective=obj)
    want = tr.validation_loss(Unigram(), torch.device("cpu"))
    assert tr.baseline_loss(logp) == pytest.approx(want, rel=1e-5)
    causal = SinkTracker(x[:2], x, y, TrackConfig(batch_size=4), objective=CausalObjective())
    assert causal.baseline_loss(logp) == pytest.approx(unigram_loss(stream, y, V), rel=1e-12)
    assert causal.baseline_loss(logp) == pytest.approx(causal.validation_loss(Unigram(), torch.device("cpu")), rel=1e-5)
    assert abs(tr.baseline_loss(logp) - unigram_loss(stream, y, V)) > 0.1  # not the same quantity
