"""``sinklab.nn.attention.ATTENTION_PATHS``: the registry ``Attention.forward`` dispatches through.

The paths' numerical agreement is tested in ``test_nn_attention.py`` and ``test_nn_backends.py``; here:
the public names and their order, which path each kind of pass takes, and a path registered by a user
(tried before the built-in ones, its output used, removed again)."""

import pytest
import torch

from sinklab.errors import UnknownNameError
from sinklab.nn.attention import ATTENTION_PATHS, AttentionOptions, AttentionPath, paths_taken, reference_attention
from sinklab.registry import Registry
from helpers import tiny_sinklm

PATHS = ["cached", "observed", "flex", "compiled", "sdpa", "tile", "chunked"]


def test_the_path_names_are_public_and_in_priority_order():
    assert ATTENTION_PATHS.names() == PATHS
    assert all(isinstance(p, AttentionPath) and p.doc for _, p in ATTENTION_PATHS.items())


@pytest.mark.parametrize("att,pos,backend,grad,want", [
    ("softmax", "rope", "reference", True, "sdpa"),
    ("kv_bias", "alibi", "reference", False, "sdpa"),
    ("softmax", "t5", "reference", True, "chunked"),    # SDPA gives no gradient to the learned T5 table
    ("softmax", "t5", "reference", False, "sdpa"),
    ("sigmoid", "rope", "reference", True, "tile"),
    ("sigmoid", "t5", "reference", True, "chunked"),    # the tile gradient covers q, k, v only
    ("sigmoid", "rope", "compiled", True, "compiled"),
    ("softmax", "rope", "flex", True, "flex"),
    ("softmax", "rope", "auto", True, "sdpa"),          # auto is FlexAttention on CUDA only
    ("diff", "rope", "reference", True, "sdpa"),        # differential attention's two maps through SDPA
])
def test_each_kind_of_pass_takes_its_path(att, pos, backend, grad, want):
    m = tiny_sinklm(att, pos, backend)
    ids = torch.randint(0, 32, (1, 8))
    with torch.set_grad_enabled(grad):
        assert paths_taken(m, ids) == [want, want]
    assert ATTENTION_PATHS.names() == PATHS  # the probe is gone


def test_an_observer_and_a_kv_cache_take_the_reference_paths():
    from sinklab.streaming import SinkCache

    m = tiny_sinklm("softmax", "rope")
    ids = torch.randint(0, 32, (1, 8))
    with torch.no_grad():
        assert paths_taken(m, ids, observer=lambda *a, **k: None) == ["observed", "observed"]
        assert paths_taken(m, ids, cache=SinkCache(m, 1, 16)) == ["cached", "cached"]
        # differential attention: the observed path returns the two maps combined (the probe's zeros follow it)
        assert paths_taken(tiny_sinklm("diff", "rope"), ids, observer=lambda *a, **k: None) == ["observed", "observed"]
    assert ATTENTION_PATHS.names() == PATHS


def test_tile_autograd_off_sends_tile_operations_to_the_chunked_path():
    m = tiny_sinklm("sigmoid", "rope", options=AttentionOptions(tile_autograd=False))
    assert paths_taken(m, torch.randint(0, 32, (1, 8))) == ["chunked", "chunked"]


def test_a_registered_path_computes_the_attention_and_is_removed_again():
    """A user's path (the reference formula over the full matrix, its inputs cast to float64; the logits and weights
    are float32 in it), registered before ``sdpa``, takes softmax passes without observer: the model's
    logits equal the built-in path's to 1e-5, the path ran once per layer, and a path that returns zeros
    instead changes the logits (so its output is what the model uses)."""
    m = tiny_sinklm("softmax", "rope")
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = m(ids).logits
    calls = []

    def float64(layer, q, k, v, ctx, observer):
        calls.append(layer.layer_idx)
        vk, vv, vlogit = layer.virtual(torch.float64)
        out, _, _ = reference_attention(layer.op, q.double(), k.double(), v.double(), scale=layer.scale,
                                        mask=ctx.mask, bias=ctx.full_bias(), vk=vk, vv=vv, vlogit=vlogit)
        return out.to(q.dtype)  # (B, H, T, d_h)

    takes = lambda layer, ctx, observer, device: observer is None and ctx.kv_cache is None  # noqa: E731
    ATTENTION_PATHS.register("float64", AttentionPath(takes, float64, "float64 reference"), before="sdpa")
    try:
        with torch.no_grad():
            got = m(ids).logits
        assert calls == [0, 1]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
        ATTENTION_PATHS.remove("float64")
        ATTENTION_PATHS.register("zeros", AttentionPath(takes, lambda layer, q, k, v, ctx, obs: torch.zeros_like(q),
                                                        "zeros"), before="sdpa")
        with torch.no_grad():
            assert (m(ids).logits - want).abs().max() > 1e-2
    finally:
        for name in ("float64", "zeros"):
            if name in ATTENTION_PATHS:
                ATTENTION_PATHS.remove(name)
    assert ATTENTION_PATHS.names() == PATHS


def test_registry_order_before_and_remove():
    r = Registry("thing")
    r.register("a", 1)
    r.register("c", 3)
    r.register("b", 2, before="c")
    assert r.names() == ["a", "b", "c"] and r.items() == [("a", 1), ("b", 2), ("c", 3)]
    assert r.remove("b") == 2 and r.names() == ["a", "c"]
    with pytest.raises(UnknownNameError, match="unknown thing 'z'"):
        r.register("d", 4, before="z")
    assert "d" not in r
    with pytest.raises(UnknownNameError):
        r.remove("b")
    with pytest.raises(ValueError, match="already registered"):
        r.register("a", 5, before="c")


def test_the_api_pages_example_runs_and_equals_the_built_in_path():
    """docs/api.md's "Attention paths" block, executed as it stands: its logits equal the same model's through
    the built-in paths to 1e-5, and the registry is as before afterwards."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text(encoding="utf-8")
    section = text.split("### Attention paths", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    torch.manual_seed(0)
    scope: dict = {}
    exec(compile(code, "docs/api.md", "exec"), scope)
    assert ATTENTION_PATHS.names() == PATHS
    model = scope["model"]
    assert model.config.attention == "sigmoid"
    torch.manual_seed(1)
    ids = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        want = model(ids).logits
        calls = []

        def counted(layer, *a):
            calls.append(layer.layer_idx)
            return scope["full_matrix"](layer, *a)

        ATTENTION_PATHS.register("full_matrix", AttentionPath(scope["takes"], counted, "t"), before="sdpa")
        try:
            got = model(ids).logits
        finally:
            ATTENTION_PATHS.remove("full_matrix")
    assert calls == [0, 1]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert scope["logits"].shape == (2, 16, 64)


def test_the_compiled_path_refuses_a_pass_the_tile_path_cannot_take():
    """``attention_backend='compiled'`` with ``tile_autograd=False``: ``paths_taken`` names ``compiled`` (the backend
    asked for), and the forward raises the ConfigError that says why and what to use, before compiling anything."""
    from sinklab.errors import ConfigError

    m = tiny_sinklm("sigmoid", "rope", "compiled", options=AttentionOptions(attention_backend="compiled",
                                                                            tile_autograd=False))
    ids = torch.randint(0, 32, (1, 8))
    assert paths_taken(m, ids) == ["compiled", "compiled"]
    with pytest.raises(ConfigError, match="attention_backend='compiled' needs the tile path.*use attention_backend='reference'"):
        m(ids)
