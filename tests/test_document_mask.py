"""Intra-document masking (``data.attention_mask = "document"``, ``SinkLM.forward(document_ids=)``).

Every backend and path with a document mask equals a naive float64 forward written here from the
model's parameters with an explicit block-diagonal causal mask built from the document lengths (not
from EOS positions, as :func:`sinklab.attention_masks.document_ids` does), outputs and gradients;
each document of a packed window gives the logits it gives alone; configs that cannot be honoured
are refused.
"""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from sinklab.attention_masks import document_ids
from sinklab.errors import ConfigError, InputError
from sinklab.nn import ModelConfig, SinkLM
from sinklab.nn.attention import AttentionOptions
from helpers import tiny_sinklm

V, EOS = 32, 31
#: two packed windows of T = 16, three documents each of different lengths (the last token of each
#: document is EOS, as the concat / bos packings end documents)
LENGTHS = [(5, 7, 4), (3, 9, 4)]
T = 16


def _packed() -> tuple[torch.Tensor, list[tuple[int, ...]]]:
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, EOS, (len(LENGTHS), T), generator=g)  # no EOS inside a document
    for b, lens in enumerate(LENGTHS):
        assert sum(lens) == T
        for end in torch.tensor(lens).cumsum(0):
            ids[b, int(end) - 1] = EOS
    return ids, LENGTHS


def _block_diagonal(lengths, T, window=None) -> torch.Tensor:
    """(B, 1, T, T) bool: causal inside each document, False across documents (and outside a window)."""
    m = torch.zeros(len(lengths), 1, T, T, dtype=torch.bool)
    for b, lens in enumerate(lengths):
        s = 0
        for n in lens:
            m[b, 0, s:s + n, s:s + n] = torch.ones(n, n, dtype=torch.bool).tril()
            s += n
    if window is not None:
        i = torch.arange(T)
        m &= ((i[:, None] - i[None, :]).abs() < window)
    return m


def _model(att, pos, backend="reference", window=None, options=None, seed=0):
    return tiny_sinklm(att, pos, backend, window=window, seed=seed, options=options, vocab_size=V)


def _naive(model: SinkLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of ``model`` (already float64) with attention computed here: q k^T * scale
    (+ the positional bias), the operation's weights over ``mask`` (B, 1, T, T), W V (+ the virtual
    key's share), head gate, o_proj; positions 0..T-1 of the window."""
    B, T = ids.shape
    x = model.embed(ids)
    absolute = model.positional.absolute(T, ids.device)
    if absolute is not None:
        x = x + absolute.double()
    state = model.positional.prepare(T, ids.device)
    pos = torch.arange(T)
    bias = model.positional.logit_bias(pos, pos) if model.positional.logit_bias_kind else None
    for blk in model.layers:
        a = blk.attn
        h = blk.attn_norm(x)
        H, Hkv, dh = a.n_heads, a.n_kv_heads, a.head_dim
        q = a.q_proj(h).view(B, T, H, dh).transpose(1, 2)
        k = a.k_proj(h).view(B, T, Hkv, dh).transpose(1, 2)
        v = a.v_proj(h).view(B, T, Hkv, dh).transpose(1, 2)
        q, k = model.positional.apply_qk(q, k, state)
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        logits = (a.op.feature_map(q) @ a.op.feature_map(k).transpose(-1, -2)) * a.scale  # (B, H, T, T)
        if bias is not None:
            logits = logits + bias.double()
        kv, vlogit = a.op.virtual_kv(a), a.op.virtual_logit()
        extra = vv = None
        if kv is not None:
            vk, vv = kv[0].repeat_interleave(H // Hkv, dim=0), kv[1].repeat_interleave(H // Hkv, dim=0)  # (H, d_h)
            extra = torch.einsum("bhtd,hd->bht", q, vk)[..., None] * a.scale
        elif vlogit is not None:
            extra = vlogit.double().view(1, H, 1, 1).expand(B, H, T, 1)
        w, w_extra = a.op.normalise(logits, mask, extra)
        y = w @ v
        if w_extra is not None and vv is not None:
            y = y + w_extra * vv[None, :, None, :]
        if a.gate_proj is not None:
            y = y * torch.sigmoid(a.gate_proj(h)).view(B, T, H, -1).transpose(1, 2)
        x = x + a.o_proj(y.transpose(1, 2).reshape(B, T, H * dh))
        x = x + blk.ffn(blk.ffn_norm(x))
    return model.lm_head(model.final_norm(x))


def _grads(model, out):
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    (out * w).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check(att, pos, backend, *, window=None, options=None, atol=1e-5, restart=False):
    ids, lengths = _packed()
    docs = document_ids(ids, EOS)
    assert docs.tolist()[0] == [0] * 5 + [1] * 7 + [2] * 4  # the EOS rule: a document ends with its EOS
    model = _model(att, pos, backend, window, options)
    out = model(ids, document_ids=docs, restart_positions=restart).logits
    g = _grads(model, out)
    ref_model = _model(att, pos, "reference", window).double()
    ref = _naive(ref_model, ids, _block_diagonal(lengths, T, window))
    ref_g = _grads(ref_model, ref)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=atol)
    assert sorted(g) == sorted(ref_g)
    for n in ref_g:
        scale = max(1.0, ref_g[n].abs().max().item())
        torch.testing.assert_close(g[n].double(), ref_g[n], rtol=1e-5, atol=atol * scale, msg=lambda s: f"{n}: {s}")
    # the mask matters: without it the logits of the second and third documents differ
    plain = _model(att, pos, backend, window, options)(ids).logits.detach()
    assert (plain[:, 5:] - out.detach()[:, 5:]).abs().max() > 1e-3
    torch.testing.assert_close(plain[0, :5], out.detach()[0, :5], rtol=1e-5, atol=atol)  # document 0 sees nothing else


# (operation, positional, backend, window, options): every path of every backend
_SMALL_TILES = AttentionOptions(tile_elems=2 * 4 * T * 4, chunk_elems=2 * 4 * T * 4)  # 4 queries per tile / chunk
CASES = {
    "sdpa softmax rope": ("softmax", "rope", "reference", None, None),
    "sdpa sink_logit (virtual logit)": ("sink_logit", "rope", "reference", None, None),
    "sdpa kv_bias alibi (bias + virtual key)": ("kv_bias", "alibi", "reference", None, None),
    "sdpa gated_headwise learned positions, window": ("gated_headwise", "learned", "reference", 6, None),
    "chunked t5 (learned bias), 4 chunks": ("softmax", "t5", "reference", None, _SMALL_TILES),
    "chunked sink_token without checkpoints": ("sink_token", "t5", "reference", None,
                                               AttentionOptions(checkpoint_chunks=False)),
    "tile sigmoid alibi, 4 tiles": ("sigmoid", "alibi", "reference", None, _SMALL_TILES),
    "tile elu1 kernel (mask not as bias)": ("elu1", "rope", "reference", None, None),
    # (softpick is left out: on a document's first rows, with one or two visible keys, its weight
    # relu(u) / (|u| + 1e-6), u = exp(s) - 1, is ill-conditioned; its float32 gradient differs from
    # float64 by 3e-4 on the autograd path as much as on the tile path)
    "tile sigmoid_pnorm window": ("sigmoid_pnorm", "rope", "reference", 6, _SMALL_TILES),
    "tile softmax_pnorm": ("softmax_pnorm", "nope", "reference", None, None),
    "flex softmax rope": ("softmax", "rope", "flex", None, AttentionOptions(flex_compiled=False)),
    "flex sink_logit alibi": ("sink_logit", "alibi", "flex", None, AttentionOptions(flex_compiled=False)),
    "flex kv_bias t5 window": ("kv_bias", "t5", "flex", 6, AttentionOptions(flex_compiled=False)),
}
#: with restarted positions (RoPE: the same attention as window positions, so the same naive values)
RESTART = {"sdpa softmax rope", "tile sigmoid alibi, 4 tiles", "flex softmax rope"}


@pytest.mark.parametrize("case", list(CASES))
def test_document_mask_equals_naive_float64(case):
    """A packed batch (2 windows of 16 tokens, 3 documents each of lengths 5/7/4 and 3/9/4): logits
    and every parameter's gradient of each backend and path equal the naive float64 forward with an
    explicit block-diagonal causal mask (1e-5)."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    att, pos, backend, window, options = CASES[case]
    _check(att, pos, backend, window=window, options=options)
    if case in RESTART:
        _check(att, pos, backend, window=window, options=options, restart=True)


@pytest.mark.compile
@pytest.mark.timeout(900)
@pytest.mark.parametrize("att,pos,backend", [("sigmoid_norm", "alibi", "compiled"), ("sink_logit", "rope", "flex")])
def test_document_mask_compiled_backends(att, pos, backend):
    """The compiled tile path (one tile: each tile shape is another compile) and the compiled
    FlexAttention kernel (T 16 padded to 128 on CPU) with a document mask: the naive float64 values
    (1e-5). Minutes of compiling on a busy 2-core CPU."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    _check(att, pos, backend)


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("pos", ["rope", "alibi", "t5", "learned", "sinusoidal"])
def test_each_document_as_if_alone(pos, restart):
    """Two documents packed in one window (lengths 6 and 10): the first gives its logits alone
    (it sees nothing else, same positions); the second, run alone at positions 0..9, gives the
    window's logits at 6..15 within float rounding (1e-5) for relative positions (RoPE, ALiBi, T5:
    they depend on j - i only) with or without restarted positions, and for absolute positions
    (learned, sinusoidal) only with ``restart_positions`` (without it, its tokens keep window
    positions 6..15 and its logits differ)."""
    torch.manual_seed(0)
    ids = torch.randint(0, EOS, (1, 16))
    ids[0, 5] = ids[0, 15] = EOS
    model = _model("softmax", pos)
    with torch.no_grad():
        packed = model(ids, document_ids=document_ids(ids, EOS), restart_positions=restart).logits[0]
        first, second = model(ids[:, :6]).logits[0], model(ids[:, 6:]).logits[0]
    torch.testing.assert_close(packed[:6], first, rtol=1e-5, atol=1e-5)
    if pos in ("learned", "sinusoidal") and not restart:
        assert (packed[6:] - second).abs().max() > 1e-2
    else:
        torch.testing.assert_close(packed[6:], second, rtol=1e-5, atol=1e-5)


def test_document_positions():
    from sinklab.attention_masks import document_positions

    docs = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 2, 2, 2, 2, 2, 2]])
    assert document_positions(docs).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 0, 0, 1, 2, 3, 4, 5]]


def test_document_ids_rule():
    """EOS closes its document; a window starting mid-document starts with document 0; a BOS after an
    EOS starts the next document (the bos packing's ``BOS doc EOS``)."""
    BOS = 30
    ids = torch.tensor([[4, 5, EOS, BOS, 7, EOS, BOS, 8], [EOS, EOS, 1, 2, 3, 4, 5, 6]])
    assert document_ids(ids, EOS).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2], [0, 1, 2, 2, 2, 2, 2, 2]]


def test_forward_refuses_bad_document_ids():
    model = _model("softmax", "rope")
    ids = torch.zeros(1, 8, dtype=torch.long)
    with pytest.raises(InputError, match="document_ids must be an integer tensor of the shape of input_ids"):
        model(ids, document_ids=torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(InputError, match="document_ids must be an integer tensor"):
        model(ids, document_ids=torch.zeros(1, 8))
    with pytest.raises(InputError, match="restart_positions=True needs document_ids"):
        model(ids, restart_positions=True)


def _cfg(*overrides):
    from helpers import synthetic_run_toml  # noqa: F401  (the tests' shared helpers are importable)
    from sinklab.runs.config import load_config

    return load_config("emergence-cpu", list(overrides))


@pytest.mark.parametrize("overrides,match", [
    (['data.attention_mask="document"', "train.prefix_len=4"],
     "data.attention_mask='document' cannot be combined with train.prefix_len=4"),
    (['data.attention_mask="document"', 'data.packing="fixed_token"'],
     "data.attention_mask='document' cannot be combined with data.packing='fixed_token'"),
    (['data.attention_mask="document"', 'data.packing="random_first"'],
     "data.attention_mask='document' cannot be combined with data.packing='random_first'"),
    (['data.attention_mask="documents"'], "data.attention_mask must be one of 'causal', 'document'"),
    (["data.restart_positions=true"], "data.restart_positions=true needs data.attention_mask='document'"),
])
def test_config_refuses_what_cannot_be_honoured(overrides, match):
    """One line naming both keys: a bidirectional prefix across documents, and packings whose inserted
    token belongs to no document, cannot be given an exact document mask."""
    with pytest.raises(ConfigError, match=match) as e:
        _cfg(*overrides)
    assert "\n" not in str(e.value)


def test_config_refuses_masked_diffusion():
    from sinklab.runs.config import load_config

    with pytest.raises(ConfigError, match="data.attention_mask='document' cannot be combined with "
                                          "train.objective='masked_diffusion'"):
        load_config("emergence-cpu-diffusion", ['data.attention_mask="document"'])


def test_config_default_not_written():
    """The default (causal across documents) is not written to config.toml, so the configs of every run
    made before the option existed read back byte-identical; "document" is written and read back."""
    from sinklab.runs.config import load_config, to_toml

    assert "attention_mask" not in to_toml(_cfg())
    cfg = _cfg('data.attention_mask="document"', 'data.packing="concat"')
    assert 'attention_mask = "document"' in to_toml(cfg) and "restart_positions" not in to_toml(cfg)
    assert cfg.data.document_mask
    assert "attention_mask" not in to_toml(_cfg('data.attention_mask="causal"', "data.restart_positions=false"))
    text = to_toml(_cfg('data.attention_mask="document"', "data.restart_positions=true"))
    assert "restart_positions = true" in text


def test_training_feeds_document_ids(monkeypatch):
    """The causal objective gives the model the packer's document ids when data.attention_mask =
    "document" (and none otherwise)."""
    from sinklab.train.objective import CausalObjective

    seen, restarts = [], []

    class M(torch.nn.Module):
        def forward(self, x, prefix_len=0, targets=None, document_ids=None, restart_positions=False):
            seen.append(document_ids)
            restarts.append(restart_positions)
            return type("O", (), {"loss": torch.tensor(0.0), "logits": torch.zeros(*x.shape, V)})()

    ids, _ = _packed()
    cfg = _cfg('data.attention_mask="document"')
    from sinklab.data.packing import PackingContext, make_packer
    from sinklab.train.objective import make_objective

    packer = make_packer("bos", PackingContext(eos_id=EOS, bos_id=30, vocab_size=V))
    objective = make_objective(cfg, None, packer)
    objective.loss(M(), ids, ids, 0)
    objective.eval_sums(M(), ids, ids, 0)
    CausalObjective().loss(M(), ids, ids, 0)
    assert torch.equal(seen[0], document_ids(ids, EOS)) and torch.equal(seen[1], seen[0]) and seen[2] is None
    assert restarts == [False, False, False]
    make_objective(_cfg('data.attention_mask="document"', "data.restart_positions=true"), None, packer).loss(M(), ids, ids, 0)
    assert restarts[-1] is True and torch.equal(seen[-1], seen[0])
