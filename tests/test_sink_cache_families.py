"""SinkCache on every model type it re-rotates (issue 36 part 2): a tiny random one-layer model of each type
whose SinkCache status is exact (``sinklab.capture.families.sink_cache_types``: the rotate-half RoPE types of
``ROTATE_HALF_MODEL_TYPES`` and the multimodal wrappers around one, the exact rows of ``docs/models.md``), decoded token by token past several evictions, equals
a fresh forward over exactly the kept tokens at positions 0..K (one layer: a kept token's key and value depend
only on the token and its position), with cache positions and with the stream's own positions, and under
``generate``; a control cache that does not move the keys differs, so the check can fail. Variants the
configs allow: layers without RoPE (SmolLM3's ``no_rope_layers``), partial rotary (phi, stablelm,
gpt_neox, by default), a config with a sliding window (every layer then keeps its own window). Every other
registered type is refused by SinkCache with the one-line message ``docs/models.md`` shows, or is not
applicable (no attention, an encoder)."""

from __future__ import annotations

import pytest
import torch

from sinklab.capture import families
from sinklab.errors import InputError
from sinklab.streaming import SinkCache
from sinklab.streaming.rope import INTERLEAVED_MODEL_TYPES, ROTATE_HALF_MODEL_TYPES, KeyRotation
from tiny_models import shrink_kwargs

N_SINK, WINDOW, STEPS = 2, 5, 20
#: mixture-of-experts types: their expert kernels (grouped matmul) take no float64; compared in float32
FLOAT32_ONLY = {"mixtral", "qwen2_moe", "qwen3_moe"}


def tol(model_type):
    return dict(atol=2e-5, rtol=1e-4) if model_type in FLOAT32_ONLY else dict(atol=1e-6, rtol=1e-6)


def one_layer(model_type: str, **over):
    """A tiny random float64 one-layer model of ``model_type`` with eager attention (full attention unless
    ``over`` sets a sliding window)."""
    import transformers
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    cls = CONFIG_MAPPING[model_type]
    kw = shrink_kwargs(cls, cls())
    kw.update(num_hidden_layers=1, max_position_embeddings=256)
    if "layer_types" in kw:
        kw["layer_types"] = ["full_attention"]
    elif "sliding_window" in kw:  # (a model with layer_types keeps its window value for its sliding layers)
        kw["sliding_window"] = None
    text = kw.get("text_config")
    if text is not None:  # a multimodal wrapper (gemma3): one full-attention layer in its language model
        text.num_hidden_layers, text.max_position_embeddings = 1, 256
        if getattr(text, "layer_types", None):
            text.layer_types = ["full_attention"]
    kw.update(over)
    cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    if model_type == "gpt_oss":  # float64: its default grouped-matmul expert kernel takes none
        cfg._experts_implementation = "eager"
    torch.manual_seed(0)
    m = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])(cfg).eval()
    if model_type not in FLOAT32_ONLY:
        m = m.double()
    with torch.no_grad():  # sharper attention, so that a wrong key position shows in the logits
        for name, p in m.named_parameters():
            if any(s in name for s in ("q_proj", "k_proj", "query_key_value", "qkv_proj", "Wqkv")):
                p.mul_(4.0)
    return m


def kept(t: int) -> list[int]:
    return sorted(set(range(min(N_SINK, t))) | set(range(max(N_SINK, t - WINDOW), t)))


def decode(m, ids, cache, *, cache_positions: bool):
    out = []
    with torch.no_grad():
        for t in range(ids.shape[1]):
            kw = {"position_ids": torch.tensor([[cache.kept_length()]])} if cache_positions else {}
            out.append(m(ids[:, t : t + 1], cache=cache, use_cache=True, **kw).logits[0, -1])
    return torch.stack(out)


def fresh(m, ids):
    with torch.no_grad():
        return torch.stack([m(ids[:, kept(t) + [t]]).logits[0, -1] for t in range(ids.shape[1])])


TYPES = sorted(families.sink_cache_types())


@pytest.mark.parametrize("model_type", TYPES)
def test_decode_past_evictions_equals_fresh_forward_over_kept_tokens(model_type, monkeypatch):
    m = one_layer(model_type)
    V = m.config.get_text_config().vocab_size
    ids = torch.randint(3, V, (1, STEPS), generator=torch.Generator().manual_seed(1))
    ref = fresh(m, ids)
    for cache_positions in (True, False):
        got = decode(m, ids, SinkCache(m, n_sink=N_SINK, window=WINDOW), cache_positions=cache_positions)
        torch.testing.assert_close(got, ref, **tol(model_type), msg=lambda s: f"{model_type}: {s}")
    # control: a cache that never moves the kept keys is wrong after the first eviction
    monkeypatch.setattr(KeyRotation, "rotate", lambda self, keys, delta: keys)
    monkeypatch.setattr(KeyRotation, "rotate_by", lambda self, keys, delta: keys)
    bad = decode(m, ids, SinkCache(m, n_sink=N_SINK, window=WINDOW), cache_positions=True)
    assert (bad - ref).abs().max() > 1e-4, model_type


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text", "phi", "gpt_neox"])
def test_generate_equals_fresh_forward_over_kept_tokens(model_type):
    m = one_layer(model_type)
    V = m.config.get_text_config().vocab_size
    P, new = 4, 14
    prompt = torch.randint(3, V, (1, P), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = m.generate(prompt, cache=SinkCache(m, n_sink=N_SINK, window=WINDOW), max_new_tokens=new,
                         do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        for step in range(1, new):
            t = P - 1 + step
            ref = m(out.sequences[:, kept(t) + [t]]).logits[0, -1].float()
            torch.testing.assert_close(out.logits[step][0], ref, atol=1e-5, rtol=1e-5)


def test_layers_without_rope_are_not_rotated():
    """SmolLM3 skips RoPE in some layers (``no_rope_layers``): their keys carry no position, so the cache
    must not move them. One NoPE layer: exact against the fresh forward."""
    m = one_layer("smollm3", no_rope_layers=[0])
    assert m.model.layers[0].self_attn.use_rope == 0
    ids = torch.randint(3, m.config.vocab_size, (1, STEPS), generator=torch.Generator().manual_seed(3))
    cache = SinkCache(m, n_sink=N_SINK, window=WINDOW)
    assert cache.layers[0].rotation is None
    torch.testing.assert_close(decode(m, ids, cache, cache_positions=True), fresh(m, ids), atol=1e-6, rtol=1e-6)


def test_a_config_with_a_sliding_window_keeps_the_models_window():
    """Mistral with ``sliding_window`` 4: every layer is sliding, keeps its own last 3 tokens and no sinks,
    as trained: equal to a fresh forward over the last 4 tokens."""
    m = one_layer("mistral", sliding_window=4)
    ids = torch.randint(3, m.config.vocab_size, (1, STEPS), generator=torch.Generator().manual_seed(4))
    got = decode(m, ids, SinkCache(m, n_sink=N_SINK, window=WINDOW), cache_positions=False)
    with torch.no_grad():
        ref = torch.stack([m(ids[:, max(0, t - 3) : t + 1]).logits[0, -1] for t in range(STEPS)])
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_length_dependent_rope_scaling_is_refused():
    """LongRoPE (Phi-3 128k, Phi-3.5, Phi-4-mini) and dynamic NTK switch their frequencies with the length:
    once the cache holds more than original_max_position_embeddings tokens, keys re-rotated with the
    frequencies they were made with no longer match (a fresh review measured max |dlogit| 0.12 with
    original_max_position_embeddings 4). Refused in one line, not silently wrong."""
    half = 8 // 2  # the tiny phi3's head_dim is 8: LongRoPE takes one factor per frequency
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * half, "long_factor": [4.0] * half,
                "original_max_position_embeddings": 4, "rope_theta": 10000.0}
    m = one_layer("phi3", rope_parameters=longrope, original_max_position_embeddings=4)
    assert m.model.rotary_emb.rope_type == "longrope"
    with pytest.raises(InputError, match="LongRoPE"):
        SinkCache(m, n_sink=N_SINK, window=WINDOW)
    dyn = one_layer("llama", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(InputError, match="dynamic RoPE"):
        SinkCache(dyn, n_sink=N_SINK, window=WINDOW)


@pytest.mark.parametrize("model_type", sorted(INTERLEAVED_MODEL_TYPES))
def test_interleaved_rope_is_refused(model_type):
    with pytest.raises(InputError, match="interleaves"):
        SinkCache(one_layer(model_type), n_sink=N_SINK, window=WINDOW)


def test_the_exact_types_are_the_rotate_half_ones_and_their_wrappers():
    """The exact rows of docs/models.md are the types tested above: every rotate-half type transformers
    registers, and wrappers only where their text config is one (their text type is what SinkCache reads)."""
    registered = set(families.registered_types())
    assert ROTATE_HALF_MODEL_TYPES <= registered
    wrappers = set(TYPES) - ROTATE_HALF_MODEL_TYPES
    assert wrappers == {"got_ocr2", "moss_transcribe_diarize"}
    for t in wrappers:
        from transformers import CONFIG_MAPPING

        assert CONFIG_MAPPING[t]().get_text_config(decoder=True).model_type in ROTATE_HALF_MODEL_TYPES


@pytest.mark.parametrize("model_type, kind", [("gpt2", "refused: learned positions"), ("bloom", "refused: ALiBi"),
                                              ("glm4", "refused: interleaved RoPE"),
                                              ("falcon", "refused: positions not checked"),
                                              ("qwen3_next", "refused: positions not checked"),
                                              ("mamba", "not applicable")])
def test_other_types_are_refused_with_the_pages_message(model_type, kind):
    """A tiny model of a type that is not exact: SinkCache raises exactly the message docs/models.md shows."""
    import warnings

    from tiny_models import tiny_model

    warnings.filterwarnings("ignore")
    status = families.registered_sink_cache_status(model_type)
    assert families.sink_cache_kind(status) == kind
    with pytest.raises(InputError) as err:
        SinkCache(tiny_model(model_type), n_sink=N_SINK, window=WINDOW)
    assert str(err.value) == status[1]
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text(encoding="utf-8")  # = render()
    assert f"| `{model_type}` |" in page and f"| {status[0]}: {status[1]} |" in page
