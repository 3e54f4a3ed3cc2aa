"""The architecture matrix: every causal-LM model type ``transformers`` registers (and the encoders sinklab
supports) is either measured exactly or refused in one line (``sinklab/capture/families.py``).

For each type a tiny random model is built from the type's own config class (a generic shrinker over the
config's fields: 2 layers, hidden size 32, 4 heads, vocabulary 128, one layer of each kind its
``layer_types`` lists, shrunken sub-configs; :data:`tiny_models.OVERRIDES` only where a type needs it; nothing is
downloaded or cached) and :func:`sinklab.capture.collect` runs on 2 sequences of T = 16 tokens. The
reference is computed another way: the model's own eager attention (``output_attentions=True``) in float64,
with the attention mass (Gu et al. 2025, Eq. 2) taken naively per key position. Exact types must agree to
1e-5 on every layer, head and key position, with hybrid models' attention blocks numbered as in the full
stack; refused types must be refused by ``collect`` with their reason. Slow constructions (``--durations``
on the 2-core machine): gemma4_text ~6 s, afmoe ~5 s (imports), gemma4 ~4 s; blt (refused) ~12 s, not built.
"""

from __future__ import annotations

import copy
import json
import warnings

import pytest
import torch

from sinklab.capture import collect
from sinklab.capture import families
from sinklab.capture.gates import GATES
from sinklab.errors import InputError
from tiny_models import VOCAB, tiny_model

from helpers import run_cli_captured

T = 16

#: types whose eager attention returns the softmax *without* their sink logit (applied to the output as an
#: LSE scale instead): the reference then runs gpt-oss's eager attention, which keeps the sink in the
#: denominator (the same output; sinklab reports the weights with the sink counted, DESIGN "virtual sink")
SINK_AS_OUTPUT_SCALE = {"granite_swa": "granite_swa", "granitemoe_swa": "granitemoe_swa"}


def naive_mass(a: torch.Tensor, causal: bool) -> torch.Tensor:
    """Gu et al. Eq. 2 from (B, H, T, T) weights, one key at a time: mean over queries i >= j (causal) or all."""
    a = a.double()
    if not causal:
        return a.mean(dim=-2)
    return torch.stack([a[..., j:, j].mean(dim=-1) for j in range(a.shape[-1])], dim=-1)


#: types whose eager forward cannot run in float64: their reference runs in float32
FLOAT32_REFERENCE = {"xglm": "its sinusoidal positions overflow when cast to float64"}


def eager_reference(model, ids: torch.Tensor, model_type: str, monkeypatch) -> list[torch.Tensor]:
    """Each attention layer's (B, H, T, T) weights from the model's own eager attention, in float64 (float32
    for :data:`FLOAT32_REFERENCE`)."""
    m64 = copy.deepcopy(model).to(torch.float32 if model_type in FLOAT32_REFERENCE else torch.float64)
    m64.set_attn_implementation("eager")
    try:
        m64.set_experts_implementation("eager")  # grouped GEMMs take no float64
    except Exception:  # noqa: BLE001 - a model without experts
        pass
    if model_type in SINK_AS_OUTPUT_SCALE:
        import importlib

        from transformers.models.gpt_oss import modeling_gpt_oss

        mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        monkeypatch.setattr(mod, "eager_attention_forward", modeling_gpt_oss.eager_attention_forward)
    with torch.no_grad():
        out = m64(input_ids=ids, output_attentions=True, use_cache=False)
    return [a for a in (out.attentions or ()) if a is not None]


def attention_blocks(model) -> list[int]:
    from sinklab.capture.hf import find_layers, has_attention

    return [i for i, b in enumerate(find_layers(model)) if has_attention(b)]


TYPES = families.registered_types()
#: refused types whose tiny model takes seconds to build (sub-models the shrinker does not reach): not built
SLOW_TO_BUILD = {"blt"}


@pytest.mark.parametrize("model_type", TYPES)
def test_type_is_exact_or_refused(model_type, monkeypatch):
    warnings.filterwarnings("ignore")
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    if families.status(model_type) == "refused":
        reason = families.REFUSED[model_type]
        assert reason and "\n" not in reason
        if model_type in SLOW_TO_BUILD:
            return
        try:
            model = tiny_model(model_type)
        except Exception:  # noqa: BLE001 - refused as unbuildable (or a wrapper that needs more)
            return
        with pytest.raises(InputError, match="sinklab does not measure"):
            collect(model, ids)
        return
    model = tiny_model(model_type)
    stats = collect(model, ids, batch_size=2)
    ref = eager_reference(model, ids, model_type, monkeypatch)
    assert len(ref) == stats.num_layers, (len(ref), stats.block_ids)
    if stats.other_layers:  # a hybrid: its attention blocks, numbered as in the full stack
        assert stats.block_ids == attention_blocks(model)
        assert set(stats.block_ids).isdisjoint(stats.other_layers)
    for layer, a in enumerate(ref):
        want = naive_mass(a, stats.causal)
        torch.testing.assert_close(stats.mass[:, layer], want, atol=1e-5, rtol=0)
    # the gate-weighted attention is reported exactly for the gated types (tests/test_gate_weighted.py checks it)
    assert (stats.gated_mass is not None) == (model_type in GATES)
    # a virtual sink (sink logits) is reported exactly when the type has one, and equals 1 - row sums
    assert (stats.extra_mass is not None) == (model_type in families.SINK_LOGIT_TYPES)
    if stats.extra_mass is not None:
        want = torch.stack([1 - a.sum(dim=-1).mean(dim=-1) for a in ref], dim=1)  # (B, L, H)
        torch.testing.assert_close(stats.extra_mass, want, atol=1e-5, rtol=0)


def test_every_registered_type_has_a_status():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        assert families.status(t) in ("exact", "refused")
    assert set(families.REFUSED) <= set(TYPES), set(families.REFUSED) - set(TYPES)
    assert families.status("no-such-type") == "unchecked"


def test_refusal_is_one_line_through_the_adapter():
    from transformers import MambaConfig, MambaForCausalLM

    m = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, state_size=4)).eval()
    with pytest.raises(InputError) as e:
        collect(m, torch.zeros(1, 4, dtype=torch.long))
    assert str(e.value) == f"sinklab does not measure 'mamba' models: {families._NO_ATTENTION}"


def test_features_read_from_the_config():
    assert families.attention_features("llama") == []
    assert "sliding window" in families.attention_features("gemma3_text")
    assert "softcap" in families.attention_features("gemma2")
    assert "sink logits" in families.attention_features("gpt_oss")
    assert "MLA" in families.attention_features("deepseek_v3")
    assert "chunked" in families.attention_features("llama4_text")
    assert "ALiBi" in families.attention_features("bloom")
    assert "gate" in families.attention_features("qwen3_next")
    assert "QK-norm" in families.attention_features("qwen3")
    from transformers import LlamaConfig

    assert families.attention_features("llama", LlamaConfig(num_attention_heads=8, num_key_value_heads=2)) == ["GQA"]


def _saved(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "gpt2", "gemma3_text", "qwen3_next", "bert"])
def test_measure_folder_matches_eager(model_type, tokenizer, text_corpus_dir, tmp_path, capsys, monkeypatch):
    """``sinklab measure FOLDER`` on a saved tiny model: its attention mass (first positions) equals the
    float64 eager reference on the probe ids it wrote."""
    folder = _saved(tiny_model(model_type), tokenizer, tmp_path / model_type)
    out = tmp_path / "m"
    code, _, stderr = run_cli_captured(["measure", "--model", str(folder), "--corpus", str(text_corpus_dir), "-n", "3",
                                        "-t", str(T), "--out", str(out)], capsys)
    assert code == 0, stderr
    res = json.loads((out / "results.json").read_text())
    s = res.get("summary", res)
    from transformers import AutoModel, AutoModelForCausalLM

    loader = AutoModel if model_type in families.ENCODERS else AutoModelForCausalLM
    model = loader.from_pretrained(folder).eval()
    ids = torch.tensor(res["input_ids"])
    ref = eager_reference(model, ids, model_type, monkeypatch)
    got = torch.tensor(s["attention_mass"], dtype=torch.float64)  # (L, H, K)
    K = got.shape[-1]
    want = torch.stack([naive_mass(a, s["causal"])[..., :K].mean(dim=0) for a in ref])
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_measure_folder_reports_gpt_oss_virtual_sink(tokenizer, text_corpus_dir, tmp_path, capsys):
    """Issue 36 part 3: a saved tiny gpt-oss model's virtual sink (its learned sink logits) through the CLI,
    against a naive float64 softmax over [scores, sink logit] computed from its own queries and keys."""
    model = tiny_model("gpt_oss")
    H = model.config.num_attention_heads
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            layer.self_attn.sinks.copy_(torch.linspace(-1.0, 3.0, H) + i)  # some heads above eps, some below
    folder = _saved(model, tokenizer, tmp_path / "gpt-oss")
    out = tmp_path / "m"
    code, stdout, stderr = run_cli_captured(["measure", "--model", str(folder), "--corpus", str(text_corpus_dir),
                                             "-n", "3", "-t", str(T), "--out", str(out)], capsys)
    assert code == 0, stderr
    res = json.loads((out / "results.json").read_text())
    s = res.get("summary", res)
    ids = torch.tensor(res["input_ids"])

    # naive reference: capture each layer's float64 queries and keys (after RoPE) and softmax by hand
    from transformers import AutoModelForCausalLM
    from transformers.models.gpt_oss import modeling_gpt_oss

    m64 = AutoModelForCausalLM.from_pretrained(folder).double().eval()
    m64.set_attn_implementation("eager")
    m64.set_experts_implementation("eager")
    seen = []
    orig = modeling_gpt_oss.eager_attention_forward

    def spy(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
        seen.append((query, key, module.sinks.detach().double(), scaling, kw.get("sliding_window")))
        return orig(module, query, key, value, attention_mask, scaling, dropout, **kw)

    modeling_gpt_oss.eager_attention_forward = spy
    try:
        with torch.no_grad():
            m64(input_ids=ids, use_cache=False)
    finally:
        modeling_gpt_oss.eager_attention_forward = orig
    virtual = []
    for q, k, sink, scaling, window in seen:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s_ij = q @ k.transpose(-1, -2) * scaling  # (N, H, T, T)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        hidden = (j > i) | ((j <= i - window) if window else torch.zeros_like(j > i))
        e = torch.exp(s_ij.masked_fill(hidden, float("-inf")))
        share = torch.exp(sink)[None, :, None] / (torch.exp(sink)[None, :, None] + e.sum(dim=-1))  # (N, H, T)
        virtual.append(share.mean(dim=-1))  # (N, H): mean over queries
    virtual = torch.stack(virtual, dim=1)  # (N, L, H)
    assert sorted(x[-1] or 0 for x in seen) == [0, 8]  # one sliding layer, one full layer: both checked
    torch.testing.assert_close(torch.tensor(s["extra_mass"], dtype=torch.float64), virtual.mean(dim=0), atol=2e-6,
                               rtol=0)
    rate = float((virtual > s["eps"]).double().mean() * 100)
    assert 0 < rate < 100  # the check can tell heads apart
    assert s["sink_rate_virtual"] == pytest.approx(rate, abs=1e-4)
    assert "virtual sink" in stdout
