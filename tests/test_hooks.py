"""Named hooks (sinklab.hooks): the site names, edits against a naive float64 recomputation of the layer,
reads against output_hidden_states, composition against edits applied by hand, removal (bit for bit),
layer selection and refusals; on a tiny transformers LLaMA and on a tiny SinkLM with the same weights."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sinklab.errors import CaptureError, InputError
from sinklab.hooks import SITES, Hook, active_hooks, hooked


def test_the_site_names_are_public_api_and_documented():
    """A rename of a site fails here (and must be announced): the names and their order, and the table of
    docs/api.md's Hooks section lists every one."""
    assert list(SITES) == ["resid.pre", "attn.query", "attn.key", "attn.value", "attn.weights", "attn.gate",
                           "attn.out", "block.out"]
    docs = _hooks_section()
    for name in SITES:
        assert f"`{name}`" in docs, name
    import sinklab.hooks

    assert dir(sinklab.hooks) == sorted(sinklab.hooks.__all__)  # no imported helper shows as API (nn, adapt, ...)


# ------------------------------------------------------------------ models
def tiny_llama(num_hidden_layers: int = 3):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=num_hidden_layers, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=128)).eval()


def _sinklm():
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(1)
    return SinkLM(ModelConfig(vocab_size=80, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                              max_seq_len=64)).eval()


def _twin(model):
    """The LlamaForCausalLM with the same weights as a SinkLM (sinklab.nn.export), float64."""
    from transformers import LlamaForCausalLM

    from sinklab.nn.export import llama_config, llama_state_dict

    twin = LlamaForCausalLM(llama_config(model.config)).eval()
    twin.load_state_dict(llama_state_dict(model), strict=False)
    return twin.double()


def _model(kind):
    return tiny_llama(num_hidden_layers=3) if kind == "hf" else _sinklm()


def _llama_blocks(model, kind):
    """The LLaMA decoder layers holding the weights (the HF model's own, or the SinkLM's twin's) and the
    RoPE inverse frequencies."""
    hf = model if kind == "hf" else _twin(model)
    return hf.model.layers, hf.model.rotary_emb.inv_freq.double()


def _naive_block(block, inv_freq, x, edit=None):
    """One LLaMA decoder layer in float64 by hand: (attn_out, out, q, k, weights) for the (B, T, d) input ``x``
    (``edit`` maps the (B, H, T, T) softmax weights to new ones)."""
    a = block.self_attn
    x = x.double()
    B, T, _ = x.shape

    def rms(norm, h):
        return norm.weight.double() * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)

    def heads(lin, h):
        return (h @ lin.weight.double().T).view(B, T, -1, a.head_dim).transpose(1, 2)

    h = rms(block.input_layernorm, x)
    q, k, v = heads(a.q_proj, h), heads(a.k_proj, h), heads(a.v_proj, h)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    q, k = rope(q), rope(k)
    rep = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ kr.transpose(-1, -2) / a.head_dim ** 0.5
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    w = torch.softmax(s, -1)
    if edit is not None:
        w = edit(w)
    attn = (w @ vr).transpose(1, 2).reshape(B, T, -1) @ a.o_proj.weight.double().T
    x = x + attn
    h2 = rms(block.post_attention_layernorm, x)
    m = block.mlp
    ffn = (F.silu(h2 @ m.gate_proj.weight.double().T) * (h2 @ m.up_proj.weight.double().T)) @ m.down_proj.weight.double().T
    return attn, x + ffn, q, k, w


def _zero_first_key(w):
    """Weight on key 0 set to 0 and each row renormalised (rows with nothing else left as they were)."""
    new = w.clone()
    new[..., 0] = 0
    total = new.sum(-1, keepdim=True)
    return torch.where(total > 0, new / torch.where(total > 0, total, torch.ones_like(total)), w)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


IDS = torch.randint(0, 80, (2, 12), generator=torch.Generator().manual_seed(3))


# ------------------------------------------------------------------ edits and reads against naive float64
@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_an_attention_weights_edit_equals_a_naive_float64_recomputation_of_the_layer(kind):
    """Zero the first key's weight and renormalise in layer 1: the layer's attention output and block output
    equal the layer computed by hand in float64 from the same input (read at resid.pre in the same pass);
    layer 0 is untouched (bit for bit), the hook saw the unedited softmax."""
    model = _model(kind)
    blocks, inv_freq = _llama_blocks(model, kind)
    seen = {}

    def read(name):
        return lambda x, ctx: seen.__setitem__((name, ctx.layer), x.detach().clone())

    def edit(w, ctx):
        seen[("w", ctx.layer)] = w.clone()
        return _zero_first_key(w)

    plain = {}
    with hooked(model, Hook("block.out", lambda x, ctx: plain.__setitem__(ctx.layer, x.clone()))):
        _logits(model, IDS)
    with hooked(model, [Hook("resid.pre", read("pre")), Hook("attn.weights", edit, layers=[1]),
                        Hook("attn.out", read("attn")), Hook("block.out", read("out"))]):
        _logits(model, IDS)
    attn, out, _, _, _ = _naive_block(blocks[1], inv_freq, seen[("pre", 1)], edit=_zero_first_key)
    _, _, _, _, w_plain = _naive_block(blocks[1], inv_freq, seen[("pre", 1)])
    assert torch.allclose(seen[("w", 1)].double(), w_plain, atol=1e-6)  # the hook got the softmax itself
    assert torch.allclose(seen[("attn", 1)].double(), attn, atol=1e-5)
    assert torch.allclose(seen[("out", 1)].double(), out, atol=1e-5)
    assert not torch.allclose(seen[("out", 1)], plain[1], atol=1e-4)  # the edit changed something
    assert torch.equal(seen[("out", 0)], plain[0])  # layer 0 not selected: exactly the unhooked values
    assert ("w", 0) not in seen and ("w", 2) not in seen


@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_reads_equal_output_hidden_states_and_the_naive_layer(kind):
    """resid.pre[l] = output_hidden_states[l], block.out[l] = output_hidden_states[l + 1] (l < L - 1; the last
    HF state has the final norm); attn.query / attn.key equal the naive layer's (after RoPE), in float32
    noise; reading changes nothing (logits bit for bit)."""
    model = _model(kind)
    blocks, inv_freq = _llama_blocks(model, kind)
    got = {}

    def read(name):
        return lambda x, ctx: got.__setitem__((name, ctx.layer), x.clone())

    with torch.no_grad():
        ref = model(IDS, output_hidden_states=True)
    with hooked(model, [Hook(s, read(s)) for s in ("resid.pre", "block.out")]):
        logits = _logits(model, IDS)
    assert torch.equal(logits, ref.logits)
    for layer in range(3):
        assert torch.equal(got[("resid.pre", layer)], ref.hidden_states[layer])
    for layer in range(2):
        assert torch.equal(got[("block.out", layer)], ref.hidden_states[layer + 1])
    with hooked(model, [Hook(s, read(s), layers=2) for s in ("resid.pre", "attn.query", "attn.key")]):
        _logits(model, IDS)
    _, _, q, k, _ = _naive_block(blocks[2], inv_freq, got[("resid.pre", 2)])
    assert got[("attn.query", 2)].shape == (2, 4, 12, 8) and got[("attn.key", 2)].shape == (2, 2, 12, 8)
    assert torch.allclose(got[("attn.query", 2)].double(), q, atol=1e-5)
    assert torch.allclose(got[("attn.key", 2)].double(), k, atol=1e-5)


# ------------------------------------------------------------------ composition
@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_two_edits_on_one_site_run_in_order_and_equal_both_applied_by_hand(kind):
    """Two attn.weights hooks (halve key 0 and renormalise, then add 0.1 to key 0 and renormalise: they do
    not commute), registered in two nested blocks, equal one hook doing both in that order; in the other
    order the result differs."""
    model = _model(kind)

    def halve(w, ctx):
        w = w.clone()
        w[..., 0] *= 0.5
        return w / w.sum(-1, keepdim=True)

    def boost0(w, ctx):
        w = w.clone()
        w[..., 0] += 0.1
        return w / w.sum(-1, keepdim=True)

    with hooked(model, Hook("attn.weights", halve)), hooked(model, Hook("attn.weights", boost0)):
        composed = _logits(model, IDS)
    with hooked(model, Hook("attn.weights", lambda w, ctx: boost0(halve(w, ctx), ctx))):
        by_hand = _logits(model, IDS)
    with hooked(model, Hook("attn.weights", boost0), Hook("attn.weights", halve)):
        reversed_ = _logits(model, IDS)
    assert torch.equal(composed, by_hand)
    assert not torch.allclose(composed, reversed_, atol=1e-6)


def test_edits_at_different_sites_compose_and_equal_the_edit_by_hand():
    """resid.pre + c at layer 0 (every position) and block.out * 2 at the last layer at once equal feeding
    embeddings + c and doubling the last hidden state by hand (HF: inputs_embeds; final norm and head)."""
    model = tiny_llama(num_hidden_layers=3)
    c = torch.randn(32, generator=torch.Generator().manual_seed(5)) * 0.1
    with hooked(model, Hook("resid.pre", lambda x, ctx: x + c, layers=0),
                Hook("block.out", lambda x, ctx: 2 * x, layers=lambda l: l == 2)):
        got = _logits(model, IDS)
    with torch.no_grad():
        # the last block's output before the final norm (hidden_states[-1] has the norm applied): the
        # output of the backbone without its final norm, fed the shifted embeddings
        norm, model.model.norm = model.model.norm, torch.nn.Identity()
        try:
            last = model.model(inputs_embeds=model.model.embed_tokens(IDS) + c).last_hidden_state
        finally:
            model.model.norm = norm
        want = model.lm_head(norm(2 * last))
    assert torch.allclose(got, want, atol=1e-6, rtol=0)


# ------------------------------------------------------------------ removal and layer selection
@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_hooks_are_gone_after_the_block_also_after_an_exception(kind):
    model = _model(kind)
    before = _logits(model, IDS)
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)

    def boom(w, ctx):
        raise RuntimeError("inside a hook")

    with pytest.raises(RuntimeError, match="inside a hook"):
        with hooked(model, Hook("attn.weights", boom), Hook("resid.pre", lambda x, ctx: x * 3)):
            _logits(model, IDS)
    with pytest.raises(ValueError, match="inside the block"):
        with hooked(model, Hook("block.out", lambda x, ctx: x + 1)):
            raise ValueError("inside the block")
    assert active_hooks(model) == []
    assert torch.equal(_logits(model, IDS), before)  # bit for bit
    assert getattr(getattr(model, "config", None), "_attn_implementation", None) == impl
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_layer_selection_all_a_list_an_int_and_a_predicate(kind):
    model = _model(kind)
    fired = []
    sel = {"all": None, "list": [0, 2], "int": 1, "pred": lambda l: l % 2 == 1}
    with hooked(model, [Hook("attn.out", lambda x, ctx, n=n: fired.append((n, ctx.layer)), layers=v)
                        for n, v in sel.items()]):
        _logits(model, IDS)
    assert sorted(fired) == sorted([("all", 0), ("all", 1), ("all", 2), ("list", 0), ("list", 2), ("int", 1),
                                    ("pred", 1)])


def test_bad_hooks_are_refused_in_one_line():
    model = tiny_llama(2)
    with pytest.raises(InputError, match="unknown hook site 'attn.weight'; the sites are: resid.pre"):
        Hook("attn.weight", lambda x, ctx: None)
    with pytest.raises(InputError, match="layers \\[5\\] outside the model's 2 layers"):
        with hooked(model, Hook("block.out", lambda x, ctx: None, layers=[0, 5])):
            pass
    with pytest.raises(InputError, match="must be a tensor of the site's shape"):
        with hooked(model, Hook("attn.weights", lambda w, ctx: w[..., :1])):
            _logits(model, IDS)
    with pytest.raises(InputError, match="non-negative"):
        Hook("block.out", lambda x, ctx: None, layers=[-1])
    assert active_hooks(model) == []
    m = _sinklm()
    with pytest.raises(InputError, match="'attn.key' of a sinklab model: that site is read-only"):
        with hooked(m, Hook("attn.key", lambda k, ctx: k * 2)):
            _logits(m, IDS)


def test_a_model_that_bypasses_the_attention_interface_is_refused_for_attention_sites(monkeypatch):
    import sinklab.capture.hf as hf

    model = tiny_llama(2)
    monkeypatch.setattr(hf, "_active", lambda: None)  # the seam sees nothing: as if never called
    with pytest.raises(CaptureError, match="does not route attention"):
        with hooked(model, Hook("attn.weights", lambda w, ctx: None)):
            _logits(model, IDS)


# ------------------------------------------------------------------ the docs' example
def _hooks_section() -> str:
    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    return text.split("\n## Hooks", 1)[1].split("\n## ", 1)[0]


def test_the_docs_own_intervention_runs_and_changes_the_loss_as_by_hand():
    """The code block of docs/api.md's Hooks section, executed as it is: the loss changes, and equals the
    same edit written by hand as a plain attn.weights hook."""
    code = re.search(r"```python\n(.*?)```", _hooks_section(), re.S).group(1)
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 10  # the "ten-line" intervention
    from sinklab.nn import ModelConfig, SinkLM

    torch.manual_seed(1)
    sinklm = SinkLM(ModelConfig(vocab_size=80, d_model=32, n_layers=5, n_heads=4, n_kv_heads=2, d_ff=64,
                                max_seq_len=64)).eval()
    for model in (tiny_llama(num_hidden_layers=5), sinklm):  # a transformers model and a SinkLM, as the docs say
        scope = {"model": model, "ids": IDS}
        exec(compile(code, "docs/api.md", "exec"), scope)
        assert scope["edited"] != scope["base"]

        def by_hand(w, ctx):
            w = w.clone()
            w[..., 0] *= 0.5
            return w / w.sum(-1, keepdim=True)

        with hooked(model, Hook("attn.weights", by_hand, layers=[2, 3, 4])), torch.no_grad():
            logits = model(IDS).logits[:, :-1].flatten(0, 1).float()
            want = F.cross_entropy(logits, IDS[:, 1:].flatten()).item()
        assert scope["edited"] == pytest.approx(want, rel=1e-6)


def test_a_hybrid_models_attention_sites_fire_on_its_attention_blocks_only():
    """Jamba (Mamba, attention, Mamba, attention): an all-layer attn.weights read fires at blocks 1 and 3 and
    its weights are each query's softmax (rows sum to 1, nothing above the diagonal); naming a Mamba block
    is refused; resid.pre fires everywhere."""
    from test_hybrid import tiny_jamba

    model = tiny_jamba()
    fired = {}
    with hooked(model, Hook("attn.weights", lambda w, ctx: fired.__setitem__(("w", ctx.layer), w.clone())),
                Hook("resid.pre", lambda x, ctx: fired.__setitem__(("pre", ctx.layer), None))):
        _logits(model, IDS)
    assert sorted(k for k in fired) == [("pre", 0), ("pre", 1), ("pre", 2), ("pre", 3), ("w", 1), ("w", 3)]
    for layer in (1, 3):
        w = fired[("w", layer)].double()
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)), atol=1e-6)
        assert float(w.triu(diagonal=1).abs().max()) == 0.0
    with pytest.raises(InputError, match="blocks \\[0, 2\\] of JambaForCausalLM have no attention"):
        with hooked(model, Hook("attn.out", lambda x, ctx: None, layers=[0, 1, 2])):
            pass
    assert active_hooks(model) == []


@pytest.mark.parametrize("kind", ["hf", "sinklab"])
def test_capture_statistics_describe_the_edited_pass(kind):
    """collect() inside a hooked block records the edited pass: its attention mass equals the naive mass
    (column sums over the T - j queries that see key j) of the weights a later read hook sees, key 0
    zeroed by the edit (query 0 keeps its only key)."""
    from sinklab.capture import collect

    model = _model(kind)
    seen = {}
    with hooked(model, Hook("attn.weights", lambda w, ctx: _zero_first_key(w)),
                Hook("attn.weights", lambda w, ctx: seen.__setitem__(ctx.layer, w.double().clone()))):
        stats = collect(model, IDS, batch_size=2)
    T = IDS.shape[1]
    naive = torch.stack([seen[l].sum(-2) for l in range(3)], 1) / (T - torch.arange(T, dtype=torch.float64))
    assert torch.allclose(stats.mass.double(), naive, atol=1e-6)
    assert torch.allclose(naive[..., 0], torch.full_like(naive[..., 0], 1.0 / T))  # only query 0 left on key 0


def test_an_intervention_with_hooks_at_other_sites_runs_them_around_the_pass():
    """An Intervention subclass whose hooks() edits resid.pre: its pass through the analyses' runner equals
    run_model inside hooked() with the same hook, and differs from the plain pass."""
    from sinklab.analyze.common import run_model
    from sinklab.analyze.interventions import Intervention, Target

    model = tiny_llama()

    def halve(x, ctx):
        return x * 0.5

    class HalveResid(Intervention):
        def hooks(self):
            return [Hook("resid.pre", halve, layers=1)]

    def run(ids, *, edit, hidden_edit, first_dropped):
        return run_model(model, ids, edit=edit, hidden_edit=hidden_edit, nll=True)

    got = HalveResid(Target(position=0)).apply(model, IDS, run)
    with hooked(model, Hook("resid.pre", halve, layers=1)):
        want = run_model(model, IDS, nll=True)
    plain = run_model(model, IDS, nll=True)
    assert torch.equal(got.nll, want.nll) and torch.equal(got.stats.mass, want.stats.mass)
    assert not torch.allclose(got.nll, plain.nll)


def _gpt_oss_and_gemma2():
    """A tiny gpt-oss (sink logits s_aux, made O(1) as in trained models) and a tiny Gemma 2 (soft-capping),
    both eager-only types whose attention SDPA cannot compute."""
    import transformers

    torch.manual_seed(0)
    oss = transformers.AutoModelForCausalLM.from_config(transformers.GptOssConfig(
        vocab_size=97, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=5, num_local_experts=4, num_experts_per_tok=2,
        layer_types=["sliding_attention", "full_attention"])).eval()
    with torch.no_grad():
        for blk in oss.model.layers:
            blk.self_attn.sinks.normal_(0, 2.0)
    gemma2 = transformers.AutoModelForCausalLM.from_config(transformers.Gemma2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=5)).eval()
    return {"gpt_oss": oss, "gemma2": gemma2}


@pytest.mark.parametrize("kind", ["gpt_oss", "gemma2"])
def test_layers_not_hooked_at_the_weights_keep_sink_logits_and_softcapping(kind):
    """A read-only hook at attn.query, and a weights edit on one layer, leave the other layers exactly as the
    model computes them. The layers not hooked at attn.weights went to transformers' SDPA, which drops
    gpt-oss's sink logits silently (0.15 in the logits) and refuses Gemma 2's soft-capping (outside audit,
    2026-12-07). References: the unhooked model; the edit applied on top of a no-op weights hook on the
    other layer (which always took the eager path)."""
    model = _gpt_oss_and_gemma2()[kind]
    x = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(1))

    def halve0(w, ctx):
        w = w.clone()
        w[..., 0] *= 0.5
        return w / w.sum(-1, keepdim=True)

    with torch.no_grad():
        base = model(x).logits
        with hooked(model, Hook("attn.query", lambda q, ctx: None)):
            read = model(x).logits
        with hooked(model, Hook("attn.weights", halve0, layers=[1])):
            one = model(x).logits
        with hooked(model, Hook("attn.weights", halve0, layers=[1]), Hook("attn.weights", lambda w, c: None, layers=[0])):
            one_ref = model(x).logits
    torch.testing.assert_close(read, base, rtol=0, atol=1e-5)
    torch.testing.assert_close(one, one_ref, rtol=0, atol=1e-5)
    assert (one - base).abs().max() > 1e-3  # the edit itself changes the output


@pytest.mark.parametrize("kind", ["hf", "sinklm"])
def test_the_same_hook_object_attached_in_a_nested_block_stays_for_the_outer_one(kind):
    """One Hook object attached in an outer and again in an inner block: inside the inner block it applies twice, and
    when the inner block exits the outer block's registration stays (an audit found the inner exit removing both,
    the outer block then running the plain model)."""
    model = _model(kind)
    add = Hook("block.out", lambda x, ctx: x + 1.0, layers=0)
    base = _logits(model, IDS)
    with hooked(model, add):
        once = _logits(model, IDS)
        with hooked(model, add):
            twice = _logits(model, IDS)
        after = _logits(model, IDS)
    with hooked(model, Hook("block.out", lambda x, ctx: x + 2.0, layers=0)):
        want_twice = _logits(model, IDS)
    assert torch.equal(after, once) and not torch.equal(once, base)
    assert torch.allclose(twice, want_twice, atol=1e-6)
    assert torch.equal(_logits(model, IDS), base)


def test_an_attention_weights_edit_on_a_sinklm_keeps_the_gradient_of_queries_and_keys():
    """An attn.weights edit on a SinkLM gave the right loss but no gradient to the queries and keys (the weights reached
    the hook detached; an audit found q_proj's gradient 0.0 where the same edit by hand gives 4.81). The gradients of
    a SinkLM and of its transformers twin (same weights, float64) under the same edit now agree."""
    model = _sinklm()
    twin = _twin(model)

    def halve0(w, ctx):
        w = w.clone()
        w[..., 0] *= 0.5
        return w / w.sum(-1, keepdim=True)

    for m in (model, twin):
        with hooked(m, Hook("attn.weights", halve0, layers=[0, 1, 2])):
            m(IDS).logits.float().sum().backward()
    for i in range(3):
        got = model.layers[i].attn.q_proj.weight.grad.double()
        want = twin.model.layers[i].self_attn.q_proj.weight.grad
        assert got.abs().sum() > 0
        assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item()), i
        gk = model.layers[i].attn.k_proj.weight.grad.double()
        assert torch.allclose(gk, twin.model.layers[i].self_attn.k_proj.weight.grad, atol=1e-4 * gk.abs().max().item())
