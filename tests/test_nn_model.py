"""SinkLM: config validation, forward contract, save/load, export to LlamaForCausalLM."""

from __future__ import annotations

import json

import pytest
import torch

from sinklab.errors import ConfigError, InputError, UnknownNameError
from sinklab.nn import ModelConfig, SinkLM, export_hf
from sinklab.nn.model import CONFIG_FILE, WEIGHTS_FILE

V = 64


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=V, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


# ================================================================ config
@pytest.mark.parametrize("kw,field", [
    (dict(d_model=30), "d_model"),
    (dict(n_kv_heads=3), "n_kv_heads"),
    (dict(n_layers=0), "n_layers"),
    (dict(vocab_size=1.5), "vocab_size"),
    (dict(norm_position="middle"), "norm_position"),
    (dict(sliding_window=0), "sliding_window"),
    (dict(init_std=-1.0), "init_std"),
    (dict(tie_embeddings="yes"), "tie_embeddings"),
    (dict(attention_options=[1]), "attention_options"),
    (dict(positional="t5", t5_num_buckets=6, t5_max_distance=1), "t5_max_distance"),
    (dict(positional="t5", t5_num_buckets=5), "t5_num_buckets"),
    (dict(d_model=36, n_heads=4, n_kv_heads=None, positional="rope", attention="softmax"), None),  # dh 9 odd
])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError) as e:
        cfg(**kw)
    assert (field or "head dimension") in str(e.value)


@pytest.mark.parametrize("field,value", [("attention", "softmaxx"), ("ffn", "swigl"), ("norm", "batchnorm")])
def test_unknown_names_list_valid_ones(field, value):
    with pytest.raises(UnknownNameError, match="valid names"):
        cfg(**{field: value})


def test_from_dict_rejects_unknown_keys_and_round_trips():
    c = cfg(attention="softmax_scaled", attention_options={"alpha": 0.5}, positional="alibi", ffn="geglu")
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    d = c.to_dict()
    d["n_head"] = 4
    with pytest.raises(ConfigError, match="'n_head'.*did you mean 'n_heads'"):
        ModelConfig.from_dict(d)
    d = c.to_dict()
    del d["d_ff"]
    with pytest.raises(ConfigError, match="d_ff"):
        ModelConfig.from_dict(d)


# =============================================================== forward
def test_forward_contract_and_hidden_states():
    torch.manual_seed(0)
    m = SinkLM(cfg())
    ids = torch.randint(0, V, (3, 10))
    out = m(ids, output_hidden_states=True)
    assert out.logits.shape == (3, 10, V)
    assert len(out.hidden_states) == 3 and all(h.shape == (3, 10, 32) for h in out.hidden_states)
    torch.testing.assert_close(out.hidden_states[0], m.embed(ids))
    assert m(ids).hidden_states is None


def test_observer_called_once_per_layer_and_matches_forward():
    torch.manual_seed(0)
    m = SinkLM(cfg(attention="sigmoid"))
    ids = torch.randint(0, V, (2, 12))
    calls = []

    def obs(layer, w, *, renormalised, extra, key, value):
        calls.append((layer, w.shape, renormalised, extra, key.shape, value.shape))
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))  # renormalised rows
        assert torch.all(w.triu(1) == 0)  # causal

    a = m(ids, observer=obs).logits
    assert [c[0] for c in calls] == [0, 1]
    assert calls[0][1:] == ((2, 4, 12, 12), True, None, (2, 2, 12, 8), (2, 2, 12, 8))
    torch.testing.assert_close(a, m(ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bad,match", [
    (lambda: torch.zeros(2, 4), "integer"),
    (lambda: torch.zeros(4, dtype=torch.long), "integer"),
    (lambda: torch.zeros(1, 0, dtype=torch.long), "non-empty"),
])
def test_bad_input_ids(bad, match):
    with pytest.raises(InputError, match=match):
        SinkLM(cfg())(bad())


def test_bad_prefix_len():
    with pytest.raises(InputError, match="prefix_len"):
        SinkLM(cfg())(torch.zeros(1, 4, dtype=torch.long), prefix_len=5)


def test_bf16_autocast_runs_every_path():
    torch.manual_seed(0)
    for att in ("softmax", "sink_logit", "sigmoid", "kv_bias"):
        m = SinkLM(cfg(attention=att))
        ids = torch.randint(0, V, (2, 16))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lo = m(ids).logits
        assert torch.isfinite(lo).all()
        torch.testing.assert_close(lo.float(), m(ids).logits, atol=0.05, rtol=0.05)


# ============================================================ save / load
@pytest.mark.parametrize("kw", [
    dict(),
    dict(tie_embeddings=True, attention="sink_token", positional="t5"),
    dict(attention="sink_logit", positional="learned", norm_position="post", ffn="relu", norm="layernorm"),
])
def test_save_and_load_round_trip(tmp_path, kw):
    torch.manual_seed(0)
    m = SinkLM(cfg(**kw))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.01 * torch.randn_like(p))
    m.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])
    m2 = SinkLM.from_pretrained(tmp_path / "m")
    assert m2.config == m.config
    ids = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(m2(ids).logits, m(ids).logits, rtol=0, atol=0)
    if m.config.tie_embeddings:
        assert m2.lm_head.weight is m2.embed.weight


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(InputError, match="not a sinklab model folder"):
        SinkLM.from_pretrained(tmp_path)
    SinkLM(cfg()).save_pretrained(tmp_path)
    data = json.loads((tmp_path / CONFIG_FILE).read_text())
    data["config"]["n_layers"] = 3
    (tmp_path / CONFIG_FILE).write_text(json.dumps(data))
    with pytest.raises(InputError, match="does not match"):
        SinkLM.from_pretrained(tmp_path)


def test_failed_save_keeps_previous_files(tmp_path, monkeypatch):
    m = SinkLM(cfg())
    m.save_pretrained(tmp_path)
    before = (tmp_path / WEIGHTS_FILE).read_bytes()
    import safetensors.torch

    def boom(*a, **k):
        raise OSError("No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError):
        SinkLM(cfg()).save_pretrained(tmp_path)
    assert (tmp_path / WEIGHTS_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CONFIG_FILE, WEIGHTS_FILE])


# ================================================================ export
@pytest.mark.parametrize("kw", [dict(), dict(n_kv_heads=4, tie_embeddings=True, rope_theta=500.0, norm_eps=1e-6)])
def test_export_hf_logits_match_llama(tmp_path, kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    m = SinkLM(cfg(**kw))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    export_hf(m, tmp_path / "hf")
    hf = LlamaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager")
    ids = torch.randint(0, V, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, m(ids).logits, atol=1e-5, rtol=1e-4)
        hs = hf(ids, output_hidden_states=True).hidden_states
        ours = m(ids, output_hidden_states=True).hidden_states
    for a, b in zip(hs[:-1], ours[:-1]):  # HF's last entry is after the final norm
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_export_hf_refuses_unmappable_parts(tmp_path):
    m = SinkLM(cfg(attention="sigmoid", positional="alibi", sliding_window=4))
    with pytest.raises(ConfigError) as e:
        export_hf(m, tmp_path)
    msg = str(e.value)
    assert "attention='sigmoid'" in msg and "positional='alibi'" in msg and "sliding_window=4" in msg
    assert not any(tmp_path.iterdir())
