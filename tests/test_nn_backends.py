"""``model.attention_backend``: FlexAttention for the softmax family and the compiled tile path,
each equal to the reference backend on the CPU (outputs and every parameter's gradient).

On CPU PyTorch has no FlexAttention backward: the flex gradients checked here are those of
PyTorch's dense evaluation of the same score_mod / mask_mod (:class:`sinklab.nn.flex._FlexCPU`),
not FlexAttention's GPU backward kernel.
"""

import math
import warnings

import pytest
import torch

from sinklab.errors import ConfigError
from sinklab.nn import ModelConfig, SinkLM
from sinklab.nn.attention import AttentionOptions
from sinklab.nn.backend import BACKENDS, served_by
from sinklab.nn.flex import flex_operations
from sinklab.nn.ops import ATTENTION
from helpers import tiny_sinklm

FLEX_OPS = ["softmax", "softmax_scaled", "sink_token", "kv_bias", "k_bias", "v_bias", "sink_logit",
            "softmax_off_by_one", "gated_headwise", "gated_elementwise", "diff"]
COMPILED_OPS = ["sigmoid", "sigmoid_logn", "sigmoid_norm", "sigmoid_pnorm", "relu", "relu_norm", "elu1_sim", "elu1", "elu1_norm",
                "linear", "linear_relu", "linear_relu_norm", "softpick", "softmax_pnorm"]
MASKS = {"causal": (None, 0), "prefix": (None, 5), "window": (4, 0), "prefix+window": (4, 5)}  # (sliding_window, prefix_len)


def _model(att, pos, backend, window=None, seed=0, options=None):
    return tiny_sinklm(att, pos, backend, window=window, seed=seed, options=options)


def _run(m, ids, prefix):
    out = m(ids, prefix_len=prefix).logits  # (B, T, V)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * w).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _compare(att, pos, backend, mask, T=13, atol=1e-5, options=None):
    window, prefix = MASKS[mask]
    ids = torch.randint(0, 32, (2, T), generator=torch.Generator().manual_seed(2))
    ref_out, ref_g = _run(_model(att, pos, "reference", window, options=options), ids, prefix)
    out, g = _run(_model(att, pos, backend, window, options=options), ids, prefix)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=atol)
    assert sorted(g) == sorted(ref_g)
    for n in ref_g:
        scale = max(1.0, ref_g[n].abs().max().item())
        torch.testing.assert_close(g[n], ref_g[n], rtol=1e-5, atol=atol * scale, msg=lambda s: f"{n}: {s}")
    return ref_g


def test_backend_sets():
    """The registry splits into exactly the brief's two families (plus diff's softmax maps)."""
    assert sorted(flex_operations()) == sorted(FLEX_OPS)
    assert sorted(n for n in ATTENTION.names() if "compiled" in served_by(ATTENTION.get(n))) == sorted(COMPILED_OPS)
    assert set(FLEX_OPS) | set(COMPILED_OPS) == set(ATTENTION.names())


@pytest.mark.parametrize("att,backend", [("sigmoid", "flex"), ("softpick", "flex"), ("elu1", "flex"),
                                         ("softmax", "compiled"), ("sink_logit", "compiled")])
def test_backend_refuses_operation(att, backend):
    """A forced backend that cannot compute the operation: ConfigError naming both and the choices."""
    with pytest.raises(ConfigError) as e:
        ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8, attention=att,
                    attention_backend=backend)
    msg = str(e.value)
    assert f"attention_backend={backend!r}" in msg and f"attention={att!r}" in msg and "'reference'" in msg


@pytest.mark.compile
def test_backend_unknown_and_t5_compiled():
    with pytest.raises(ConfigError, match="attention_backend must be one of 'auto', 'reference', 'flex', 'compiled', got 'triton' "
                       r"\(attention='softmax': 'auto', 'reference', 'flex' serve it\)"):
        ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8, attention_backend="triton")
    with pytest.raises(ConfigError, match="T5 bias table"):
        ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16, max_seq_len=8, attention="sigmoid",
                    positional="t5", attention_backend="compiled")
    assert BACKENDS[0] == "auto" and ModelConfig(vocab_size=8, d_model=16, n_layers=1, n_heads=2, d_ff=16,
                                                 max_seq_len=8).attention_backend == "auto"


def test_attention_options_carry_the_backend():
    """Each layer's AttentionOptions holds the backend: the config's by default (attention_backend
    None), an explicit one as given (checked against the operation like the config's), and
    ``set_attention_options`` changes it per model (the config is left as it is)."""
    cfg = dict(vocab_size=8, d_model=16, n_layers=2, n_heads=2, d_ff=16, max_seq_len=8, attention="sink_logit")
    m = SinkLM(ModelConfig(**cfg, attention_backend="flex"))
    assert AttentionOptions().attention_backend is None
    assert [b.attn.options.attention_backend for b in m.layers] == ["flex", "flex"]
    m2 = SinkLM(ModelConfig(**cfg), attention_options=AttentionOptions(attention_backend="reference", flex_compiled=False))
    assert all(b.attn.options == AttentionOptions(attention_backend="reference", flex_compiled=False) for b in m2.layers)
    before = m.set_attention_options(attention_backend="reference")
    assert before.attention_backend == "flex" and m.layers[1].attn.options.attention_backend == "reference"
    assert m.config.attention_backend == "flex"
    m.set_attention_options(AttentionOptions())  # None again: the config's
    assert m.layers[0].attn.options.attention_backend == "flex"
    with pytest.raises(ConfigError, match="attention_backend='compiled' cannot compute attention='sink_logit'"):
        m.set_attention_options(attention_backend="compiled")
    with pytest.raises(ConfigError, match="attention_backend='compiled'"):
        SinkLM(ModelConfig(**cfg), attention_options=AttentionOptions(attention_backend="compiled"))


def test_auto_is_reference_on_cpu(monkeypatch):
    """``auto`` never calls FlexAttention on the CPU (it is the GPU default)."""
    import sinklab.nn.flex as flex

    monkeypatch.setattr(flex, "flex_attend", lambda *a, **k: pytest.fail("flex on CPU under auto"))
    m = _model("softmax", "rope", "auto")
    m(torch.randint(0, 32, (1, 8)))


_GRID = [(a, p, mk) for a in FLEX_OPS for p in ("rope", "alibi", "t5") for mk in ("causal", "prefix", "window")
         if not (a == "diff" and p != "rope")]


@pytest.mark.slow
@pytest.mark.parametrize("att,pos,mask", _GRID)
def test_flex_equals_reference(att, pos, mask):
    """Every flex operation x RoPE / ALiBi / T5 x causal / prefix / sliding-window: logits and the
    gradient of every parameter (q/k/v/o projections, sink logit, sink token, k/v biases, gates,
    T5 table, differential lambdas) equal the reference backend's within 1e-5 (rtol 1e-5, atol 1e-5
    times the gradient's largest entry if above 1). FlexAttention eager here (its unfused CPU
    forward); the compiled kernel is checked below."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    g = _compare(att, pos, "flex", mask, options=AttentionOptions(flex_compiled=False))
    if att == "sink_logit":
        assert all(g[f"layers.{l}.attn.op.sink_logit"].abs().max() > 0 for l in range(2))
    if pos == "t5":
        assert g["positional.bias.weight"].abs().max() > 0


@pytest.mark.compile
@pytest.mark.parametrize("att,pos,mask", [("sink_logit", "alibi", "prefix"), ("kv_bias", "t5", "window")])
def test_flex_compiled_kernel_equals_reference(att, pos, mask):
    """``torch.compile(flex_attention)`` (the fused CPU kernel; T = 13 padded to 128 on CPU, see
    :mod:`sinklab.nn.flex`), outputs and gradients against the reference backend (1e-5). About a
    minute of compiling each."""
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    _compare(att, pos, "flex", mask)


@pytest.mark.compile
def test_flex_training_equals_reference(tmp_path):
    """5 AdamW steps of a tiny model (conftest's synthetic run, T 16) with attention_backend='flex'
    (the compiled kernel) give the reference backend's losses within 1e-5."""
    from sinklab.train import loop
    from helpers import synthetic_run_toml
    from sinklab.runs.config import load_config

    losses = {}
    for backend in ("reference", "flex"):
        cfg_file = tmp_path / "cfg.toml"
        cfg_file.write_text(synthetic_run_toml(5))
        cfg = load_config(cfg_file, ['model.attention="sink_logit"', f'model.attention_backend="{backend}"',
                                     'train.precision="fp32"', 'train.device="cpu"', "train.threads=1"])
        losses[backend] = loop.train(cfg, tmp_path / backend, progress=False, _canonical=True).losses
    assert sorted(losses["flex"]) == sorted(losses["reference"]) == [1, 2, 3, 4, 5]
    for s, v in losses["reference"].items():
        assert math.isfinite(losses["flex"][s]) and losses["flex"][s] == pytest.approx(v, abs=1e-5), (s, losses)
    assert losses["reference"][5] != losses["reference"][1]


# The compiled tile path: one compile of each tile function per operation (tens of seconds each on
# a busy 2-core CPU), so one shape per operation and one multi-tile test.
@pytest.mark.compile
@pytest.mark.parametrize("att", COMPILED_OPS)
def test_compiled_tile_equals_eager_tile(att):
    """The compiled tile path (per-tile forward and analytic backward under torch.compile) gives the
    eager tile path's logits and gradients (1e-5) for each operation FlexAttention cannot express
    (ALiBi where the operation has logits, RoPE for the kernels)."""
    pos = "rope" if not ATTENTION.get(att).accepts_logit_bias else "alibi"
    _compare(att, pos, "compiled", "causal", T=8)


@pytest.mark.compile
def test_compiled_tile_several_tiles():
    """Several query tiles (4 queries each, T 13) with a prefix of 5 and a window of 4 (sigmoid_norm,
    ALiBi): still the eager tile path's values (1e-5)."""
    _compare("sigmoid_norm", "alibi", "compiled", "prefix+window",
             options=AttentionOptions(tile_elems=2 * 4 * 13 * 4))  # 4 queries per tile


@pytest.mark.compile
def test_flex_kernel_raises_the_recompile_limit(monkeypatch):
    """``flex_kernel()`` keeps up to RECOMPILE_LIMIT compiled versions, as the compiled tile path does
    (dynamo's default of 8 would fall back to eager silently after a few operations or masks)."""
    import sinklab.nn.flex as flex
    from sinklab.nn.compiled import RECOMPILE_LIMIT

    with torch._dynamo.config.patch(recompile_limit=8):  # dynamo's default; restored on exit
        monkeypatch.setattr(flex, "_COMPILED", {})
        flex.flex_kernel(compiled=True)
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT == 64
    with torch._dynamo.config.patch(recompile_limit=100):
        monkeypatch.setattr(flex, "_COMPILED", {})
        flex.flex_kernel(compiled=True)
        assert torch._dynamo.config.recompile_limit == 100  # never lowered
