"""Attention operations against naive float64 references, identities, masks and paths.

Every registered operation is picked up by the parametrisation; a new operation
fails ``test_every_op_has_a_naive_reference`` until a formula is added to NAIVE.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from sinklab.errors import ConfigError
from sinklab.nn import ATTENTION, ModelConfig, SinkLM
from sinklab.nn.attention import Attention, AttnContext, MaskSpec, build_mask
from sinklab.nn.positional import POSITIONAL

T, D, H, HKV, V = 16, 32, 4, 2, 50
OPS = ATTENTION.names()


def config(attention="softmax", **kw) -> ModelConfig:
    base = dict(vocab_size=V, d_model=D, n_layers=2, n_heads=H, n_kv_heads=HKV, d_ff=64, max_seq_len=T,
                attention=attention)
    base.update(kw)
    return ModelConfig(**base)


def attn_module(cfg: ModelConfig, seed=0) -> tuple[Attention, object]:
    torch.manual_seed(seed)
    m = SinkLM(cfg)
    # Put the op's parameters at a non-trivial value so they matter.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if ".op." in name:
                p.normal_(0.0, 0.5)
    return m.layers[0].attn, m.positional


def run(attn: Attention, positional, x, *, prefix_len=0, window=None, path="fast", raw_weights=False):
    """Call one attention layer on x (B, T, d) through a chosen path."""
    Tn = x.shape[1]
    ctx = AttnContext(T=Tn, device=x.device, positional=positional, mask=MaskSpec(prefix_len=prefix_len, window=window),
                      pos_state=positional.prepare(Tn, x.device))
    if path == "fast":
        return attn(x, ctx)
    if path in ("chunked", "checkpointed"):  # tile autograd where the op has it / checkpointed chunks
        old_fast, old_options = type(attn.op).sdpa, attn.options
        elems = x.shape[0] * attn.n_heads * Tn * 3  # chunks of 3 queries
        attn.options = dataclasses.replace(old_options, chunk_elems=elems, tile_elems=elems,
                                           tile_autograd=path == "chunked")
        try:
            attn.op.sdpa = False
            return attn(x, ctx)
        finally:
            attn.op.sdpa = old_fast
            attn.options = old_options
    seen = {}

    def obs(layer, w, **kw):
        seen.update(w=w, **kw)

    obs.raw_weights = raw_weights
    y = attn(x, ctx, observer=obs)
    return y, seen


# ======================================================= naive references
def _sm_extra(s, extra_logit):
    """softmax over real logits s (n,) plus an optional virtual logit; returns (w, w_extra)."""
    if extra_logit is None:
        e = torch.exp(s - s.max())
        return e / e.sum(), None
    m = max(s.max().item(), float(extra_logit))
    e, e0 = torch.exp(s - m), torch.exp(extra_logit - m)
    z = e.sum() + e0
    return e / z, e0 / z


def _naive_row(name, op, s, qi, ctx):
    """Weights over the visible keys of one query, and the virtual key's (weight, value) or None.

    s: (n,) float64 logits q_i.k_j / sqrt(d_h) over visible keys; qi: (d_h,) query; ctx: dict
    with head h, kv head hk, the float64 projections and the layer input. Written from the
    papers' formulas, independently of sinklab.nn.ops.
    """
    h, hk, dh = ctx["h"], ctx["hk"], ctx["dh"]
    sc = 1.0 / math.sqrt(dh)
    if name in ("softmax", "gated_headwise", "gated_elementwise"):
        return _sm_extra(s, None)[0], None
    if name == "softmax_scaled":
        return op.alpha * _sm_extra(s, None)[0], None
    if name == "softmax_off_by_one":  # exp(s) / (1 + sum exp(s))
        w = torch.exp(s) / (1.0 + torch.exp(s).sum())
        return w, (1.0 / (1.0 + torch.exp(s).sum()), torch.zeros(dh, dtype=torch.float64))
    if name == "sink_logit":
        b = op.sink_logit[h].double()
        z = torch.exp(b) + torch.exp(s).sum()
        return torch.exp(s) / z, (torch.exp(b) / z, torch.zeros(dh, dtype=torch.float64))
    if name in ("sink_token", "kv_bias", "k_bias", "v_bias"):
        if name == "sink_token":
            xs = op.sink_token.double()
            kstar = ctx["knorm"]((ctx["Wk"] @ xs).view(-1, dh)[hk])
            vstar = (ctx["Wv"] @ xs).view(-1, dh)[hk]
        else:
            row = 0 if op.shared else hk
            kstar, vstar = op.k_bias[row].double(), op.v_bias[row].double()
        if name == "k_bias":
            assert torch.equal(vstar, torch.zeros_like(vstar))
        if name == "v_bias":
            assert torch.equal(kstar, torch.zeros_like(kstar))
        s0 = (qi @ kstar) * sc
        z = torch.exp(s0) + torch.exp(s).sum()
        return torch.exp(s) / z, (torch.exp(s0) / z, vstar)
    if name == "softmax_pnorm":
        p = op.p
        return torch.exp(s) / (torch.exp(s) ** p).sum() ** (1 / p), None
    if name == "sigmoid":
        return torch.sigmoid(s + op.bias), None
    if name == "sigmoid_logn":
        return 1.0 / (1.0 + torch.exp(-(s - math.log(T)))), None  # n = max_seq_len = T
    if name == "sigmoid_norm":
        return torch.sigmoid(s) / torch.sigmoid(s).sum(), None
    if name == "sigmoid_pnorm":
        p = op.p
        return torch.sigmoid(s) / (torch.sigmoid(s) ** p).sum() ** (1 / p), None
    if name == "relu":
        return torch.clamp(s, min=0), None
    if name == "elu1_sim":  # the paper's similarity form elu(s) + 1, no normalisation
        return torch.where(s > 0, s + 1.0, torch.exp(s)), None
    if name == "relu_norm":
        r = torch.clamp(s, min=0)
        return r / max(r.sum().item(), 1e-6), None
    if name == "softpick":
        em1 = torch.exp(s) - 1.0
        return torch.clamp(em1, min=0) / (em1.abs().sum() + 1e-6), None
    # feature-map kernels: recompute the similarity from phi(q).phi(k)
    kern = {"elu1": lambda x: torch.where(x > 0, x + 1, torch.exp(x)),
            "elu1_norm": lambda x: torch.where(x > 0, x + 1, torch.exp(x)),
            "linear": lambda x: x, "linear_relu": lambda x: torch.clamp(x, min=0),
            "linear_relu_norm": lambda x: torch.clamp(x, min=0)}
    if name in kern:
        phi = kern[name]
        sim = torch.stack([phi(qi) @ phi(kj) for kj in ctx["keys"]]) * sc
        if name.endswith("_norm"):
            return sim / max(sim.sum().item(), 1e-6), None
        return sim, None
    raise KeyError(name)


NAIVE_NAMES = {"softmax", "gated_headwise", "gated_elementwise", "softmax_scaled", "softmax_off_by_one", "sink_logit",
               "sink_token", "kv_bias", "k_bias", "v_bias", "softmax_pnorm", "sigmoid", "sigmoid_logn", "sigmoid_norm",
               "sigmoid_pnorm", "relu", "relu_norm", "softpick", "elu1_sim", "elu1", "elu1_norm", "linear", "linear_relu",
               "linear_relu_norm", "diff"}


def _naive_differential(attn, x, q, k, v, prefix_len, window):
    """Ye et al. 2024, Eq. 1-3 per row: (softmax(q1.k1/sqrt(d)) - lambda softmax(q2.k2/sqrt(d))) v, then each
    head's RMSNorm (gain, eps 1e-5) times (1 - lambda_init); lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init."""
    op = attn.op
    B, Tn, _ = x.shape
    dh, Hkv = attn.head_dim, attn.n_kv_heads
    d = dh // 2
    lam = (torch.exp(op.lambda_q1.double() @ op.lambda_k1.double()) - torch.exp(op.lambda_q2.double() @ op.lambda_k2.double())
           + op.lambda_init)
    out = torch.zeros(B, Tn, H, dh, dtype=torch.float64)
    weights = torch.zeros(B, H, Tn, Tn, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            hk = h // (H // Hkv)
            for i in range(Tn):
                js = [j for j in range(Tn) if (j <= i or j < prefix_len) and (window is None or abs(i - j) < window)]
                s1 = (k[b, js, hk, :d] @ q[b, i, h, :d]) / math.sqrt(d)
                s2 = (k[b, js, hk, d:] @ q[b, i, h, d:]) / math.sqrt(d)
                w = torch.softmax(s1, 0) - lam * torch.softmax(s2, 0)
                out[b, i, h] = w @ v[b, js, hk]
                weights[b, h, i, js] = w
    rms = torch.sqrt(out.pow(2).mean(dim=-1, keepdim=True) + 1e-5)
    out = out / rms * op.subln.double() * (1.0 - op.lambda_init)
    return out, weights


def naive_attention(attn: Attention, name: str, x: torch.Tensor, *, prefix_len=0, window=None):
    """Float64 layer output (B, T, d) and raw weights (B, H, T, T), loops over rows (NoPE)."""
    x = x.double()
    B, Tn, _ = x.shape
    dh, Hkv = attn.head_dim, attn.n_kv_heads
    Wq, Wk, Wv, Wo = (getattr(attn, n).weight.double() for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
    q = (x @ Wq.T).view(B, Tn, H, dh)
    k = (x @ Wk.T).view(B, Tn, Hkv, dh)
    v = (x @ Wv.T).view(B, Tn, Hkv, dh)
    qnorm = knorm = lambda t: t  # noqa: E731
    if attn.q_norm is not None:  # QK-norm: RMSNorm over each head's d_h (Qwen3)
        def rms(norm):
            return lambda t: t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight.double()
        qnorm, knorm = rms(attn.q_norm), rms(attn.k_norm)
        q, k = qnorm(q), knorm(k)
    out = torch.zeros(B, Tn, H, dh, dtype=torch.float64)
    weights = torch.zeros(B, H, Tn, Tn, dtype=torch.float64)
    extras = torch.zeros(B, H, Tn, dtype=torch.float64)
    if name == "diff":
        out, weights = _naive_differential(attn, x, q, k, v, prefix_len, window)
    for b in range(B if name != "diff" else 0):
        for h in range(H):
            hk = h // (H // Hkv)
            for i in range(Tn):
                js = [j for j in range(Tn) if (j <= i or j < prefix_len) and (window is None or abs(i - j) < window)]
                keys = k[b, js, hk]
                s = (keys @ q[b, i, h]) / math.sqrt(dh)
                ctx = dict(h=h, hk=hk, dh=dh, Wk=Wk, Wv=Wv, keys=keys, knorm=knorm)
                w, extra = _naive_row(name, attn.op, s, q[b, i, h], ctx)
                out[b, i, h] = w @ v[b, js, hk]
                weights[b, h, i, js] = w
                if extra is not None:
                    out[b, i, h] += extra[0] * extra[1]
                    extras[b, h, i] = extra[0]
    gate = attn.op.gate
    if gate is not None:
        g = torch.sigmoid(x @ attn.gate_proj.weight.double().T)  # (B, T, H) or (B, T, H*dh)
        out = out * g.view(B, Tn, H, -1)
    y = out.reshape(B, Tn, H * dh) @ Wo.T
    return y, weights, extras


def test_every_op_has_a_naive_reference():
    missing = set(OPS) - NAIVE_NAMES
    assert not missing, f"add a naive float64 formula to tests/test_nn_attention.py for {sorted(missing)}"


MASKS = [dict(), dict(window=5), dict(prefix_len=6), dict(prefix_len=6, window=4)]
MASK_IDS = ["causal", "window5", "prefix6", "prefix6-window4"]


@pytest.mark.parametrize("mask", MASKS, ids=MASK_IDS)
@pytest.mark.parametrize("name", OPS)
def test_op_matches_naive_float64(name, mask):
    attn, pos = attn_module(config(name, positional="nope"))
    torch.manual_seed(1)
    x = torch.randn(1, T, D)
    ref_y, ref_w, ref_extra = naive_attention(attn, name, x, **mask)
    tol = dict(atol=2e-5, rtol=1e-4)
    for path in ("fast", "chunked"):
        y = run(attn, pos, x, path=path, **mask)
        torch.testing.assert_close(y.double(), ref_y, **tol, msg=lambda m: f"{name} {path}: {m}")
    y, seen = run(attn, pos, x, path="reference", **mask)
    torch.testing.assert_close(y.double(), ref_y, **tol)
    # observer: renormalised iff the op's rows do not sum to 1
    w, extra = ref_w, ref_extra
    if not attn.op.normalised:  # the paper's proxy scores |w| / sum |w| (virtual key included)
        tot = w.abs().sum(-1) + extra.abs()
        tot = torch.where(tot > 0, tot, torch.ones_like(tot))
        w, extra = w.abs() / tot[..., None], extra.abs() / tot
    assert seen["renormalised"] == (not attn.op.normalised)
    torch.testing.assert_close(seen["w"].double(), w, **tol)
    has_virtual = name in ("softmax_off_by_one", "sink_logit", "sink_token", "kv_bias", "k_bias", "v_bias")
    assert (seen["extra"] is not None) == has_virtual
    if has_virtual:
        torch.testing.assert_close(seen["extra"].double(), extra, **tol)
    assert seen["key"].shape == (1, HKV, T, attn.head_dim) and seen["value"].shape == (1, HKV, T, attn.head_dim)


@pytest.mark.parametrize("name", ["softmax", "sink_token", "sink_logit", "sigmoid", "softmax_off_by_one", "diff"])
def test_qk_norm_matches_naive_float64(name):
    """model.qk_norm: RMSNorm over each head's d_h on q and k (and the sink token's key) before the
    logits, against the naive float64 layer with the norms written out; every path."""
    attn, pos = attn_module(config(name, positional="nope", qk_norm=True))
    with torch.no_grad():  # non-trivial norm weights, different for q and k
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(-1.5, 1.5)
    torch.manual_seed(2)
    x = 3.0 * torch.randn(1, T, D)
    ref_y, ref_w, _ = naive_attention(attn, name, x)
    tol = dict(atol=2e-5, rtol=1e-4)
    for path in ("fast", "chunked"):
        torch.testing.assert_close(run(attn, pos, x, path=path).double(), ref_y, **tol,
                                   msg=lambda m: f"{name} {path}: {m}")
    y, seen = run(attn, pos, x, path="reference")
    torch.testing.assert_close(y.double(), ref_y, **tol)
    # the norms change the result (so the check can fail)
    q_norm, k_norm = attn.q_norm, attn.k_norm
    attn.q_norm = attn.k_norm = None
    try:
        assert (run(attn, pos, x, path="fast").double() - ref_y).abs().max() > 1e-3
    finally:
        attn.q_norm, attn.k_norm = q_norm, k_norm


@pytest.mark.parametrize("path", ["fast", "chunked"])
def test_qk_norm_gradients_match_naive_float64(path):
    """The QK-norm weights train: their gradients through the training paths equal autograd through
    the naive float64 layer."""
    attn, pos = attn_module(config("softmax", positional="nope", qk_norm=True))
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 2.0)
        attn.k_norm.weight.uniform_(0.5, 2.0)
    torch.manual_seed(4)
    x, g = torch.randn(1, T, D), torch.randn(1, T, D)
    grads = []
    for fn in (lambda: run(attn, pos, x, path=path), lambda: naive_attention(attn, "softmax", x)[0]):
        attn.zero_grad()
        (fn().double() * g.double()).sum().backward()
        grads.append((attn.q_norm.weight.grad.double().clone(), attn.k_norm.weight.grad.double().clone()))
    for ours, ref in zip(*grads):
        assert ref.abs().max() > 1e-3
        torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_qk_norm_with_rope_equals_transformers_qwen3():
    """A SinkLM with qk_norm and RoPE equals transformers' Qwen3ForCausalLM with the same weights
    (Qwen3 normalises q and k per head before RoPE): logits to float32 noise."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from sinklab.nn.export import llama_state_dict

    cfg = config("softmax", positional="rope", qk_norm=True, n_layers=2)
    torch.manual_seed(3)
    m = SinkLM(cfg).eval()
    with torch.no_grad():
        for blk in m.layers:
            blk.attn.q_norm.weight.uniform_(0.5, 2.0)
            blk.attn.k_norm.weight.uniform_(0.5, 2.0)
    hf_cfg = Qwen3Config(vocab_size=V, hidden_size=D, intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                         num_attention_heads=H, num_key_value_heads=HKV, head_dim=D // H,
                         max_position_embeddings=T, rms_norm_eps=cfg.norm_eps, attention_bias=False,
                         tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
                         use_sliding_window=False)
    hf = Qwen3ForCausalLM(hf_cfg).eval()
    sd = llama_state_dict(m)
    for i, blk in enumerate(m.layers):
        sd[f"model.layers.{i}.self_attn.q_norm.weight"] = blk.attn.q_norm.weight.detach().clone()
        sd[f"model.layers.{i}.self_attn.k_norm.weight"] = blk.attn.k_norm.weight.detach().clone()
    hf.load_state_dict(sd, strict=True)
    ids = torch.randint(0, V, (2, T))
    with torch.no_grad():
        ours, theirs = m(ids).logits, hf(ids).logits
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-4)


def test_qk_norm_config_and_export():
    with pytest.raises(ConfigError, match="qk_norm must be true or false"):
        config("softmax", qk_norm="yes")
    from sinklab.nn.export import unmappable_parts
    assert any("qk_norm" in b for b in unmappable_parts(config("softmax", qk_norm=True)))
    assert config("softmax").qk_norm is False and SinkLM(config("softmax")).layers[0].attn.q_norm is None


@pytest.mark.parametrize("name", OPS)
def test_causality_and_finite_grads(name):
    """Changing token t never changes logits before t (nor before t with a prefix < t)."""
    torch.manual_seed(0)
    m = SinkLM(config(name, positional="rope"))
    ids = torch.randint(0, V, (2, T))
    for prefix_len, t in ((0, 9), (5, 9), (0, 0)):
        ids2 = ids.clone()
        ids2[:, t] = (ids2[:, t] + 1) % V
        a = m(ids, prefix_len=prefix_len).logits
        b = m(ids2, prefix_len=prefix_len).logits
        torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
        assert not torch.allclose(a[:, t:], b[:, t:])
    loss = F.cross_entropy(m(ids).logits.flatten(0, 1), ids.roll(-1, 1).flatten())
    loss.backward()
    assert torch.isfinite(loss)
    for pname, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    for pname, p in m.named_parameters():
        if ".op." in pname and "k_bias" not in pname:  # k_bias alone gets a gradient too, checked below
            assert p.grad.abs().sum() > 0, f"{pname} gets no gradient"


@pytest.mark.parametrize("name", [n for n in OPS if ATTENTION.get(n).accepts_logit_bias])
@pytest.mark.parametrize("positional", ["alibi", "t5"])
def test_paths_agree_with_logit_bias_and_gqa(name, positional):
    attn, pos = attn_module(config(name, positional=positional))
    with torch.no_grad():
        for p in pos.parameters():
            p.normal_(0, 0.5)
    x = torch.randn(1, T, D)
    for mask in MASKS:
        ref, _ = run(attn, pos, x, path="reference", **mask)
        for path in ("fast", "chunked"):
            torch.testing.assert_close(run(attn, pos, x, path=path, **mask), ref, atol=1e-5, rtol=1e-4)


def test_chunked_backward_equals_reference_backward():
    attn, pos = attn_module(config("sigmoid_norm", positional="t5"))
    x = torch.randn(2, T, D, requires_grad=True)
    grads = []
    for path in ("chunked", "reference"):
        out = run(attn, pos, x, path=path, prefix_len=3, window=6)
        y = out[0] if isinstance(out, tuple) else out
        attn.zero_grad()
        pos.zero_grad()
        x.grad = None
        (y ** 2).sum().backward()
        grads.append((x.grad.clone(), attn.q_proj.weight.grad.clone(), pos.bias.weight.grad.clone()))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# ============================================================ identities
def _same_weights(names_opts, **kw):
    """Attention layers of several ops sharing the same projection weights."""
    mods = []
    for name, opts in names_opts:
        attn, pos = attn_module(config(name, attention_options=opts, **kw), seed=0)
        mods.append((attn, pos))
    base = mods[0][0]
    for attn, _ in mods[1:]:
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(attn, n).load_state_dict(getattr(base, n).state_dict())
    return mods


@pytest.mark.parametrize("path", ["fast", "chunked", "reference"])
def test_off_by_one_equals_zero_sink_logit_equals_zero_k_bias(path):
    mods = _same_weights([("softmax_off_by_one", {}), ("sink_logit", {}), ("k_bias", {})])
    with torch.no_grad():
        mods[1][0].op.sink_logit.zero_()
        mods[2][0].op.k_bias.zero_()
    x = torch.randn(2, T, D)
    outs = []
    for attn, pos in mods:
        o = run(attn, pos, x, path=path, prefix_len=4)
        outs.append(o[0] if isinstance(o, tuple) else o)
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], outs[2])


@pytest.mark.parametrize("path", ["fast", "chunked", "reference"])
@pytest.mark.parametrize("name,opts,other", [
    ("softmax_pnorm", {"p": 1.0}, "softmax"),
    ("softmax_scaled", {"alpha": 1.0}, "softmax"),
    ("sigmoid_pnorm", {"p": 1.0}, "sigmoid_norm"),
])
def test_identities_with_softmax(name, opts, other, path):
    (a, pa), (b, pb) = _same_weights([(name, opts), (other, {})], positional="rope")
    x = torch.randn(2, T, D)
    ya, yb = run(a, pa, x, path=path, window=7), run(b, pb, x, path=path, window=7)
    if path == "reference":
        ya, yb = ya[0], yb[0]
    torch.testing.assert_close(ya, yb)


def test_pnorm_is_temperature_then_root():
    """softmax_pnorm weights == softmax(p s)^(1/p) (Gu et al. rebuttal)."""
    attn, pos = attn_module(config("softmax_pnorm", attention_options={"p": 0.5}, positional="nope"))
    x = torch.randn(1, T, D)
    _, seen = run(attn, pos, x, path="reference")
    raw = seen["w"]  # renormalised -> undo by comparing shapes of rows
    q = attn.q_proj(x).view(1, T, H, -1).transpose(1, 2).double()
    k = attn.k_proj(x).view(1, T, HKV, -1).transpose(1, 2).double().repeat_interleave(H // HKV, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = torch.softmax(0.5 * s, -1) ** 2.0
    torch.testing.assert_close(raw.double(), w / w.sum(-1, keepdim=True), atol=1e-6, rtol=1e-5)


# ================================================================ masks
def test_masks_against_hand_built():
    # rows = queries 0..4, cols = keys 0..4
    causal = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    window2 = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    prefix3 = [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    prefix3_window2 = [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    for kw, want in ((dict(), causal), (dict(window=2), window2), (dict(prefix_len=3), prefix3),
                     (dict(prefix_len=3, window=2), prefix3_window2)):
        assert build_mask(5, mask=MaskSpec(**kw)).int().tolist() == want, kw


def test_sliding_window_in_model_hides_far_tokens():
    """1-layer model, window 4: the logit at position 10 ignores tokens 0..6 but not 7."""
    torch.manual_seed(0)
    for name in ("softmax", "sigmoid", "sink_logit"):
        m = SinkLM(config(name, n_layers=1, sliding_window=4))
        ids = torch.randint(0, V, (1, T))
        base = m(ids).logits[0, 10]
        far, near = ids.clone(), ids.clone()
        far[0, :7] = (far[0, :7] + 1) % V
        near[0, 7] = (near[0, 7] + 1) % V
        torch.testing.assert_close(m(far).logits[0, 10], base, rtol=0, atol=0)
        assert not torch.allclose(m(near).logits[0, 10], base)


def test_prefix_lm_is_bidirectional_inside_prefix():
    torch.manual_seed(0)
    m = SinkLM(config("softmax"))
    ids = torch.randint(0, V, (1, T))
    ids2 = ids.clone()
    ids2[0, 4] = (ids2[0, 4] + 1) % V
    a, b = m(ids, prefix_len=6).logits, m(ids2, prefix_len=6).logits
    assert not torch.allclose(a[0, 0], b[0, 0])  # position 0 sees position 4 in the prefix
    a, b = m(ids, prefix_len=4).logits, m(ids2, prefix_len=4).logits
    torch.testing.assert_close(a[0, :4], b[0, :4], rtol=0, atol=0)  # position 4 is past the prefix


# =========================================================== validation
def test_option_validation():
    with pytest.raises(ConfigError, match="alpha"):
        config("softmax_scaled", attention_options={"alpha": 0.0})
    with pytest.raises(ConfigError, match="p"):
        config("softmax_pnorm", attention_options={"p": 0})
    with pytest.raises(ConfigError, match="takes no option 'alpa'.*did you mean 'alpha'"):
        config("softmax_scaled", attention_options={"alpa": 0.5})
    with pytest.raises(ConfigError, match="gate"):
        config("softmax", attention_options={"gate": "rowwise"})
    with pytest.raises(ConfigError, match="alibi.*elu1"):
        config("elu1", positional="alibi")


def test_gate_option_on_any_op_and_shared_kv_bias():
    cfg = config("sigmoid", attention_options={"gate": "headwise"})
    attn, pos = attn_module(cfg)
    assert attn.gate_proj.weight.shape == (H, D)
    attn, pos = attn_module(config("kv_bias", attention_options={"shared": True}, positional="nope"))
    assert attn.op.k_bias.shape == (1, D // H)
    x = torch.randn(1, T, D)
    ref_y, _, _ = naive_attention(attn, "kv_bias", x)
    torch.testing.assert_close(run(attn, pos, x).double(), ref_y, atol=2e-5, rtol=1e-4)


def test_every_positional_builds():
    for name in POSITIONAL:
        SinkLM(config("softmax", positional=name))(torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.parametrize("name", OPS)
def test_training_forward_keeps_no_per_layer_attention_matrix(name):
    """No tensor of B*H*T*T elements is saved for backward, in any layer (memory-frugal paths)."""
    B, Tn = 4, 64
    positional = "t5" if ATTENTION.get(name).accepts_logit_bias else "rope"
    m = SinkLM(config(name, positional=positional, max_seq_len=Tn))
    ids = torch.randint(0, V, (B, Tn))
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m(ids, prefix_len=5).logits.sum()
    assert max(sizes) < B * H * Tn * Tn


@pytest.mark.parametrize("positional", ["alibi", "rope"])
@pytest.mark.parametrize("name", ["sink_logit", "kv_bias", "sink_token", "softmax_scaled", "gated_elementwise"])
def test_fast_backward_equals_reference_backward(name, positional):
    attn, pos = attn_module(config(name, positional=positional))
    x = torch.randn(2, T, D, requires_grad=True)
    grads = []
    for path in ("fast", "reference"):
        out = run(attn, pos, x, path=path, prefix_len=3, window=6)
        y = out[0] if isinstance(out, tuple) else out
        attn.zero_grad()
        x.grad = None
        (y ** 2).sum().backward()
        g = [x.grad.clone()] + [p.grad.clone() for p in attn.parameters()]
        grads.append(g)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_observer_asking_for_raw_weights_gets_unnormalised_weights():
    attn, pos = attn_module(config("sigmoid", positional="nope"))
    x = torch.randn(1, T, D)
    _, ref_w, _ = naive_attention(attn, "sigmoid", x)
    _, seen = run(attn, pos, x, path="reference", raw_weights=True)
    assert seen["renormalised"] is False
    torch.testing.assert_close(seen["w"].double(), ref_w, atol=2e-5, rtol=1e-4)
    _, seen = run(attn, pos, x, path="reference")  # an observer without the attribute: renormalised
    assert seen["renormalised"] is True


TILE_OPS = [n for n in OPS if ATTENTION.get(n).has_tile_grad]


def test_every_non_sdpa_op_has_tile_autograd():
    assert TILE_OPS == [n for n in OPS if not ATTENTION.get(n).sdpa]


@pytest.mark.parametrize("name", TILE_OPS)
@pytest.mark.parametrize("positional", ["rope", "alibi"])
def test_tile_autograd_equals_reference_forward_and_backward(name, positional):
    """The tile path (analytic gradient per chunk) == the reference path, outputs and every gradient,
    for the causal, sliding-window, prefix and prefix + window masks."""
    if positional == "alibi" and not ATTENTION.get(name).accepts_logit_bias:
        pytest.skip("kernels take no logit bias")
    attn, pos = attn_module(config(name, positional=positional))
    x0 = torch.randn(2, T, D)
    for mask in MASKS:
        results = []
        for path in ("chunked", "reference", "checkpointed"):
            x = x0.clone().requires_grad_()
            out = run(attn, pos, x, path=path, **mask)
            y = out[0] if isinstance(out, tuple) else out
            attn.zero_grad()
            (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
            results.append([y.detach(), x.grad] + [p.grad for p in attn.parameters()])
        for ref in results[1:]:
            for a, b in zip(results[0], ref):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name,opts", [("softmax_pnorm", {"p": 1.0}), ("softmax_pnorm", {"p": 0.25}),
                                       ("softmax_pnorm", {"p": 2.0}), ("sigmoid_pnorm", {"p": 1.0}),
                                       ("sigmoid_pnorm", {"p": 3.0}), ("sigmoid", {"bias": -1.5})])
def test_tile_autograd_equals_reference_with_options(name, opts):
    """The tile path's analytic gradient == the reference path's autograd with an operation's options (softmax_pnorm
    with p = 1 once took w / Z for w^p: 27% off)."""
    attn, pos = attn_module(config(name, attention_options=opts))
    x0 = torch.randn(2, T, D)
    results = []
    for path in ("chunked", "reference"):
        x = x0.clone().requires_grad_()
        out = run(attn, pos, x, path=path)
        y = out[0] if isinstance(out, tuple) else out
        attn.zero_grad()
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results.append([y.detach(), x.grad] + [p.grad for p in attn.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("path", ["fast", "chunked", "reference"])
def test_k_bias_in_d_a_dims_equals_full_k_bias_zero_beyond(path):
    """Gu et al. Table 13: a key bias learned in d_a dims is the full key bias with the other dims at 0."""
    d_a = 3
    mods = _same_weights([("k_bias", {"key_dims": d_a}), ("k_bias", {})])
    part, full = mods[0][0].op, mods[1][0].op
    assert part.k_bias.shape == (full.k_bias.shape[0], d_a)
    with torch.no_grad():
        full.k_bias.zero_()
        full.k_bias[:, :d_a] = part.k_bias
    x = torch.randn(2, T, D)
    a, b = (run(attn, pos, x, path=path) for attn, pos in mods)
    a, b = (o[0] if isinstance(o, tuple) else o for o in (a, b))
    torch.testing.assert_close(a, b)
    with pytest.raises(ConfigError, match="key_dims"):
        config("k_bias", attention_options={"key_dims": 0})
    with pytest.raises(ConfigError, match="key_dims"):
        config("v_bias", attention_options={"key_dims": 2})


@pytest.mark.parametrize("name", ["sigmoid_norm", "sigmoid_pnorm"])
def test_sigmoid_normalisers_take_no_floor(name):
    """sigmoid(s) / sum_j sigmoid(s) has no 1e-6 floor (a sum of sigmoids is never 0): the floor made a lone key of
    logit -18 weigh sigmoid(-18) / 1e-6 = 0.015 instead of 1 (query 0, which sees key 0 only). Queries are the keys
    scaled and negated: one input vector at every position (NoPE), so every logit is -18; every path against the
    float64 formula (the naive reference)."""
    attn, pos = attn_module(config(name, positional="nope"))
    x = torch.randn(1, 1, D, generator=torch.Generator().manual_seed(0)).expand(1, T, D).contiguous()
    dh = attn.head_dim
    with torch.no_grad():
        k = (attn.k_proj.weight @ x[0, 0]).view(HKV, dh)  # (H_kv, d_h): the one key of each kv head
        wq = torch.zeros(H, dh, D)
        for h in range(H):
            kh = k[h // (H // HKV)]
            # q_h = -18 sqrt(d_h) k_h / |k_h|^2: a rank-one map of the input x onto it, so q_h . k_h / sqrt(d_h) = -18
            wq[h] = -18.0 * math.sqrt(dh) * torch.outer(kh / kh.dot(kh), x[0, 0] / x[0, 0].dot(x[0, 0]))
        attn.q_proj.weight.copy_(wq.reshape(H * dh, D))
    ref_y, ref_w, _ = naive_attention(attn, name, x)
    expect = [1.0 / (i + 1) ** (1.0 if name == "sigmoid_norm" else 0.5) for i in range(T)]  # equal logits in a row
    assert ref_w[0, 0].diagonal().tolist() == pytest.approx(expect, rel=1e-6)
    for path in ("fast", "chunked"):
        torch.testing.assert_close(run(attn, pos, x, path=path).double(), ref_y, atol=2e-5, rtol=1e-4)
    y, seen = run(attn, pos, x, path="reference", raw_weights=True)
    torch.testing.assert_close(y.double(), ref_y, atol=2e-5, rtol=1e-4)
    assert seen["w"][0, :, 0, 0].tolist() == pytest.approx([1.0] * H, abs=1e-6)


def test_every_operation_is_described_in_one_whole_line():
    """`sinklab list attention` shows a docstring's first line: one that wraps mid-sentence was shown cut."""
    from sinklab.nn.positional import POSITIONAL

    for reg in (ATTENTION, POSITIONAL):
        for name in reg.names():
            assert reg.describe(name).rstrip().endswith((".", ")")), (name, reg.describe(name))


def test_matched_heads_give_differential_attention_the_softmax_models_maps(monkeypatch):
    """Ye et al. 2024 give a differential model half the heads (and kv heads) of the softmax model it is compared
    with: at ``matched_heads`` its training step calls SDPA over as many maps as the softmax model's, each of the
    softmax heads' query/key width (the rest zero padding to the value's width), with the same projections and only
    the lambda vectors (4 x d) and the per-head norm gain (2 d) per layer more, under grouped-query attention too;
    at the softmax model's own head count it calls SDPA over twice the maps, each half as wide. Every other
    operation keeps its heads."""
    import torch.nn.functional as F

    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, *a, **kw):
        calls.append((q.shape[1], int((q[0, :, :, :].abs().sum(dim=(0, 1)) > 0).sum()), v.shape[-1]))
        return sdpa(q, k, v, *a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    d_model, n_layers, T_ = 64, 2, 8
    x = torch.randint(0, V, (1, T_))
    for heads, kv in ((4, None), (8, 2)):
        soft = ModelConfig(vocab_size=V, d_model=d_model, n_layers=n_layers, n_heads=heads, n_kv_heads=kv, d_ff=64,
                           max_seq_len=T_)
        op = ATTENTION.get("diff")
        matched = dataclasses.replace(soft, attention="diff", n_heads=op.matched_heads(heads),
                                      n_kv_heads=None if kv is None else op.matched_heads(kv))
        same = dataclasses.replace(soft, attention="diff")
        seen = {}
        for name, cfg in (("soft", soft), ("matched", matched), ("same", same)):
            calls.clear()
            torch.manual_seed(0)
            SinkLM(cfg)(x).logits.sum().backward()
            seen[name] = calls[0]  # (maps, query channels that are not padding, value width)
        w = d_model // heads
        assert seen["soft"] == (heads, w, w)
        assert seen["matched"] == (heads, w, 2 * w)
        assert seen["same"] == (2 * heads, w // 2, w)
        n_soft, n_diff = (sum(p.numel() for p in SinkLM(c).parameters()) for c in (soft, matched))
        assert n_diff - n_soft == n_layers * (4 * w + 2 * w)
    assert all(ATTENTION.get(n).matched_heads(6) == 6 for n in OPS if n != "diff")
    with pytest.raises(ConfigError, match="even number of heads"):
        ATTENTION.get("diff").matched_heads(3)


def test_the_in_place_similarity_gradients_equal_their_formulas_bit_for_bit():
    """``similarity_grad`` works in place in ``g`` (and softpick's ``tile_grad`` takes the sign of its ``d`` in place);
    each equals its formula computed out of place, bit for bit, on tiles with zeros (masked entries) and values
    on both sides of each function's kink: ReLU's [g > 0] as 0.0 / 1.0, sigmoid's g - g g (as ``addcmul``: the plain
    ``g - g * g`` rounds differently), elu+1's min(g, 1)."""
    from sinklab.nn.ops import ATTENTION, OpContext

    g = torch.Generator().manual_seed(3)
    s = torch.randn(4, 8, 16, generator=g) * 3
    s[:, :, -3:] = float("-inf")  # masked logits (mask as bias)
    mask = torch.ones(8, 16, dtype=torch.bool)
    ctx = OpContext(n_heads=2, n_kv_heads=2, head_dim=4, d_model=8, max_seq_len=16)
    formulas = {
        "relu": lambda w: (w > 0).to(w.dtype),
        "relu_norm": lambda w: (w > 0).to(w.dtype),
        "sigmoid": lambda w: torch.addcmul(w, w, w, value=-1.0),
        "sigmoid_norm": lambda w: torch.addcmul(w, w, w, value=-1.0),
        "elu1_sim": lambda w: w.clamp(max=1.0),
    }
    for name, formula in formulas.items():
        op = ATTENTION.get(name)(ctx)
        w = op.similarity_(s.clone())  # g = sim(s), 0 where masked
        want = formula(w.clone())
        got = op.similarity_grad(w, mask)
        assert torch.equal(got, want), name
        assert got.data_ptr() == w.data_ptr(), name  # in place: no (N, C, Tk) tile allocated
    # softpick's tile_grad takes the sign of its d in place: the same bits as its formula with an out-of-place sign
    sp = ATTENTION.get("softpick")(ctx)
    w, (d, e, a) = sp.tile_weights(s.clone(), mask)
    dw = torch.randn(w.shape, generator=g)
    sgn = torch.sign(d)
    want = (dw * torch.relu(sgn)).sub_((dw * w).sum(dim=-1, keepdim=True)).mul_(sgn.mul(e).div_(a))
    d_before = d.clone()
    got = sp.tile_grad(w, (d, e, a), dw.clone(), mask)
    assert torch.equal(got, want)
    assert not torch.equal(d, d_before)  # d's storage held the sign (then sign e / a): no new tile for it
