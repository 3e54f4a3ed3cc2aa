"""sinklab.subject: one Subject (model, tokenizer, adapter, device, dtype) and one ProbeSpec for every feature;
every analysis and every stream task in bfloat16 against float32 on the CPU (the tolerances docs/analyze.md and
docs/streaming.md state); --device cuda without CUDA is one line, exit 2."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from helpers import run_cli_captured, tiny_llama
from sinklab.errors import InputError, UnknownNameError
from sinklab.subject import DTYPES, ProbeSpec, Subject, load_model, resolve_device

#: the documented tolerances of bfloat16 against float32 (docs/analyze.md, docs/streaming.md)
RATE_POINTS = 100 / 6 + 1e-9  # sink rates: equal, or one sample of N = 6 on the other side of eps
REL = 0.02  # masses, shares, norms, ratios, entropies, cosines: within 2% relative (or 0.005 absolute)
ABS = 0.005
PPL_REL = 0.02  # stream perplexities within 2%


def close(a: float, b: float, rel: float = REL, abs_: float = ABS) -> bool:
    return abs(a - b) <= max(abs_, rel * abs(a))


# ------------------------------------------------------------------ loading
def test_subject_loads_a_folder_in_each_dtype_with_its_tokenizer_adapter_and_probe(tiny_model_dir):
    f32 = Subject.load(str(tiny_model_dir))
    assert f32.device == torch.device("cpu") and f32.dtype == torch.float32
    assert f32.tokenizer is not None and f32.adapter.n_layers == 2 and f32.num_layers == 2
    assert f32.info["dtype"] == "float32" and f32.info["device"] == "cpu" and f32.info["is_encoder"] is False
    assert f32.input_ids.shape == (0, 0) and f32.probe is None
    bf = Subject.load(str(tiny_model_dir), dtype="bfloat16")
    assert bf.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in bf.model.parameters())
    # the same weights, rounded: bfloat16 is float32 with the low 16 mantissa bits dropped
    for p32, p16 in zip(f32.model.parameters(), bf.model.parameters()):
        torch.testing.assert_close(p32.to(torch.bfloat16), p16, rtol=0, atol=0)
    probed = bf.with_probe(ProbeSpec(input="random", num_samples=3, seq_len=12, seed=4))
    assert probed.input_ids.shape == (3, 12) and probed.probe.kind == "random" and probed.seed == 4
    assert bf.input_ids.shape == (0, 0)  # with_probe returns a copy
    again = f32.with_probe(ProbeSpec(input="random", num_samples=3, seq_len=12, seed=4))
    assert torch.equal(again.input_ids, probed.input_ids)  # the probe does not depend on the dtype
    # load_model is importable from the Subject layer and is the one of sinklab.models
    import sinklab.models

    assert load_model is sinklab.models.load_model
    lm = load_model(str(tiny_model_dir))
    assert lm.info.name == str(tiny_model_dir) and lm.tokenizer is not None


def test_subject_wraps_a_model_object_and_refuses_what_it_cannot_do():
    m = tiny_llama()
    s = Subject.load(m, dtype="bfloat16")
    assert s.model is m and s.dtype == torch.bfloat16 and s.device == torch.device("cpu")
    assert s.info["name"] == "LlamaForCausalLM" and s.source is None
    kept = Subject.load(tiny_llama())
    assert kept.dtype == torch.float32  # a model object keeps its dtype unless one is given
    with pytest.raises(InputError, match="^device_map places a model"):
        Subject.load(tiny_llama(), device_map="auto")
    with pytest.raises(InputError, match="^dtype must be one of float32, bfloat16, float16"):
        Subject.load(tiny_llama(), dtype="float8")
    with pytest.raises(InputError, match="needs the model's tokenizer"):
        s.with_probe(ProbeSpec(input="random", num_samples=2, seq_len=8))


def test_probe_spec_checks_and_resolves_without_a_run():
    assert ProbeSpec().resolve(None) == ProbeSpec(input="natural", corpus="sotu", num_samples=100, seq_len=64, seed=0)
    assert ProbeSpec(input="random", seq_len=9).resolve(None, num_samples=7).num_samples == 7
    with pytest.raises(InputError, match="^input='run' needs a model trained"):
        ProbeSpec(input="run").resolve(None)
    for bad, msg in [(dict(num_samples=0), "^num_samples must"), (dict(seq_len=1), "^seq_len must"),
                     (dict(seed=-1), "^seed must"), (dict(bos="sometimes"), "^bos must"), (dict(token=-2), "^token must")]:
        with pytest.raises(InputError, match=msg):
            ProbeSpec(**bad)
    with pytest.raises(UnknownNameError):
        ProbeSpec(input="poetry")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_without_cuda_is_one_line_exit_2(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    with pytest.raises(InputError, match="CUDA is not available here"):
        resolve_device("cuda", None, None)
    assert resolve_device("auto", None, None) == {"device": "cpu", "dtype": "float32"}
    assert set(DTYPES) == {"float32", "bfloat16", "float16", "float64"}
    for argv in (["analyze", "massive", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir),
                  "--device", "cuda", "--out", str(tmp_path / "a")],
                 ["stream", "perplexity", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--device", "cuda:1",
                  "--out", str(tmp_path / "s")],
                 ["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "--device", "cuda",
                  "--out", str(tmp_path / "m")]):
        code, out, err = run_cli_captured(argv, capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and "CUDA is not available here" in lines[0], (argv, err)
        assert "CPU only" not in err and "float32 only" not in err


# ------------------------------------------------------------------ bfloat16 against float32: analyses
def _pair(model, ids, **info):
    """The same model and probe as float32 and as bfloat16 subjects."""
    out = []
    for dt in ("float32", "bfloat16"):
        m = Subject.load(copy.deepcopy(model), dtype=dt).model
        out.append(Subject(m, ids, model_info={"name": "t", **info}))
    return out


def _ids(n=6, t=16, vocab=80, seed=0):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


def _agree(a: dict, b: dict, keys, rates=()):
    for k in keys:
        assert close(float(a[k]), float(b[k])), (k, a[k], b[k])
    for k in rates:
        assert abs(float(a[k]) - float(b[k])) <= RATE_POINTS, (k, a[k], b[k])


KWARGS = {
    "massive": dict(eps=0.05),
    "keybias": dict(eps=0.05, long_seq_len=None, position=0, min_rate=1.0),
    "intervene": dict(eps=0.05, position=0, allow_non_sink=True),
    "repeat": dict(eps=0.05, prompt_len=3, counts=[4], token=11),
    "attention": dict(layers=[0, 1], heads=[1]),
    "depth": dict(eps=0.05),
    "frames": dict(),
}


@pytest.mark.parametrize("kind", list(KWARGS))
def test_every_analysis_in_bfloat16_agrees_with_float32(kind):
    from sinklab.analyze import ANALYSES

    f32, bf = _pair(tiny_llama(), _ids())
    a = ANALYSES.get(kind)(f32, **KWARGS[kind])
    b = ANALYSES.get(kind)(bf, **KWARGS[kind])
    sa, sb = a.summary, b.summary
    if kind in ("massive", "keybias", "intervene"):
        assert sa["sink_position"] == sb["sink_position"]
        _agree(sa, sb, [], ["sink_rate"])
    if kind == "massive":
        assert sa["max_ratio_layer"] == sb["max_ratio_layer"] and sa["max_ratio_dim"] == sb["max_ratio_dim"]
        _agree(sa, sb, ["max_ratio", "max_ratio_top1", "max_ratio_median", "top1_on_sink_share_all_layers"])
    elif kind == "keybias":
        assert sa["heads_with_sink"] == sb["heads_with_sink"]
        _agree(sa, sb, ["median_attention_share_sink_heads", "median_output_share_sink_heads",
                        "median_value_norm_share_sink_heads", "median_key_norm_ratio_sink_heads",
                        "median_value_norm_ratio_sink_heads", "median_cos_sink_sink_heads"])
    elif kind == "intervene":
        ra = {r["intervention"]: r for r in sa["results"]}
        rb = {r["intervention"]: r for r in sb["results"]}
        assert ra.keys() == rb.keys()
        for name in ra:
            for k, v in ra[name].items():
                if isinstance(v, float) and v != v:  # NaN in both (drop-first's sink_rate_sink: the token dropped)
                    assert rb[name][k] != rb[name][k], (name, k)
                elif isinstance(v, float) and "sink_rate" in k:
                    assert abs(v - rb[name][k]) <= RATE_POINTS, (name, k)
                elif isinstance(v, float) and v == v:
                    assert close(v, rb[name][k]), (name, k, v, rb[name][k])
    elif kind == "repeat":
        assert sa["attend_to_others_heads"] == sb["attend_to_others_heads"]
        for k in ("first_layer_self_share_by_head", "first_layer_qk_cos_self_by_head",
                  "mean_cos_to_first_at_max_repeats_by_layer"):
            assert all(close(x, y) for x, y in zip(sa[k], sb[k])), k
        assert sa["sink_rate_pos0_by_repeats"] == sb["sink_rate_pos0_by_repeats"]
    elif kind == "attention":
        assert sa["lowest_entropy_head"]["layer"] == sb["lowest_entropy_head"]["layer"]
        assert sa["top_mass_position_shown"] == sb["top_mass_position_shown"]
        for k, v in sa["attention_entropy_per_layer"].items():
            assert close(v, sb["attention_entropy_per_layer"][k])
        wa, wb = a.tables["mass"]["attention_mass"], b.tables["mass"]["attention_mass"]
        assert (wa - wb).abs().max() <= ABS
    elif kind == "frames":
        assert sa["kind"] == sb["kind"] and sa["layers_by_kind"] == sb["layers_by_kind"]
        _agree(sa, sb, ["top1_share_mean", "kl_relative_reduction_mean"])
        assert abs(sa["kl_reduction_mean"] - sb["kl_reduction_mean"]) <= ABS
    elif kind == "depth":
        assert sa["min_entropy_layer"] == sb["min_entropy_layer"] and sa["max_norm_ratio_layer"] == sb["max_norm_ratio_layer"]
        assert all(abs(x - y) <= RATE_POINTS for x, y in zip(sa["sink_rate_first_by_layer"], sb["sink_rate_first_by_layer"]))
        for k in ("norm_ratio_first_by_layer", "matrix_entropy_by_layer"):
            assert all(close(x, y) for x, y in zip(sa[k], sb[k])), k


def test_overmix_refuses_bfloat16_and_runs_in_float32():
    """Its relative changes (1e-3 to 1e-2) are below bfloat16's resolution: refused in one line, never approximated."""
    from sinklab.analyze import overmix

    f32, bf = _pair(tiny_llama(), _ids())
    with pytest.raises(InputError, match="with dtype='float32'"):
        overmix(bf, eps=0.05, sources=[4], directions=1)
    assert overmix(f32, eps=0.05, sources=[4], directions=1).summary["sink_position"] == 0


def test_denoise_in_bfloat16_finds_the_same_planted_sink():
    from sinklab.analyze import denoise
    from test_diffusion import BOS, MASK, planted_sink_model

    ids = torch.randint(0, 10, (4, 16), generator=torch.Generator().manual_seed(0))
    ids[:, 3] = BOS
    f32, bf = _pair(planted_sink_model(), ids)
    a = denoise(f32, steps=4, prompt_len=6, mask_id=MASK).tables["steps"]
    b = denoise(bf, steps=4, prompt_len=6, mask_id=MASK).tables["steps"]
    assert (a["top_sink_position"] == 3).all() and (b["top_sink_position"] == 3).all()
    assert list(a["top_sink_rate"]) == list(b["top_sink_rate"]) and list(a["has_sink"]) == list(b["has_sink"])
    assert ((a["mass_top"] - b["mass_top"]).abs() <= ABS).all()


def test_analyze_cli_takes_dtype_and_records_it(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    res = {}
    for dt in ("float32", "bfloat16"):
        out = tmp_path / dt
        code, _, err = run_cli_captured(["analyze", "massive", "--model", str(tiny_model_dir), "--corpus",
                                         str(text_corpus_dir), "-n", "4", "-t", "16", "--dtype", dt, "--out", str(out)],
                                        capsys)
        assert code == 0, err
        res[dt] = json.loads((out / "analysis.json").read_text())
        assert res[dt]["model"]["dtype"] == dt and f"--dtype {dt}" in res[dt]["command"]
    a, b = res["float32"]["summary"], res["bfloat16"]["summary"]
    assert a["sink_position"] == b["sink_position"] and close(a["max_ratio"], b["max_ratio"])


# ------------------------------------------------------------------ bfloat16 against float32: stream tasks
@pytest.mark.slow
@pytest.mark.parametrize("task", ["ppl", "policies", "passkey"])
def test_every_stream_task_in_bfloat16_agrees_with_float32(task, tiny_model_dir, text_corpus_dir, tmp_path):
    from sinklab.streaming import stream

    kw = dict(tokens=60, window=16, progress=False)
    if task == "ppl":
        kw.update(sinks=[0, 2], recompute_every=9)
    elif task == "policies":
        kw.update(policies=["sinks", "tova"], budgets=[16], n_sink=2, kv_bits=[16, 4], kv_group=8, recompute=False)
    else:
        kw.update(task="passkey", tokens=48, keys=2, depths=(0.0, 1.0), batch=2, sinks=[2], window=24)
    res = {dt: stream(str(tiny_model_dir), str(text_corpus_dir), dtype=dt, **kw)
           for dt in ("float32", "bfloat16")}
    a, b = ({c["name"]: c for c in res[dt]["configs"]} for dt in ("float32", "bfloat16"))
    assert a.keys() == b.keys() and res["bfloat16"]["model_info"]["dtype"] == "bfloat16"
    assert res["bfloat16"]["dtype"] == "bfloat16" and res["float32"]["dtype"] == "float32"
    for name in a:
        if task == "passkey":
            assert a[name]["accuracy"] == b[name]["accuracy"], name
        else:
            assert close(a[name]["ppl"], b[name]["ppl"], PPL_REL, 0), (name, a[name]["ppl"], b[name]["ppl"])


@pytest.mark.network
def test_smollm2_massive_and_stream_in_bfloat16_agree_with_float32(real_home, tmp_path):
    """The real SmolLM2-135M on State of the Union text (cached): analyze massive finds the same sink position,
    massive dimension and layer in bfloat16 as in float32, Sink_1 within one sample, max ratio within 5%;
    stream perplexities (128 tokens, window 32) within 2% (latency not timed: 32 decode steps per configuration
    were most of this test's time in bfloat16 on a CPU)."""
    from sinklab.analyze import massive
    from sinklab.streaming import stream

    loaded = {dt: Subject.load("smollm2-135m", dtype=dt) for dt in ("float32", "bfloat16")}  # each loaded once
    res = {dt: massive(loaded[dt], num_samples=8, seq_len=64).summary for dt in ("float32", "bfloat16")}
    a, b = res["float32"], res["bfloat16"]
    assert a["sink_position"] == b["sink_position"] == 0
    assert abs(a["sink_rate"] - b["sink_rate"]) <= 100 / 8
    assert a["max_ratio_dim"] == b["max_ratio_dim"] and a["max_ratio_layer"] == b["max_ratio_layer"]
    assert close(a["max_ratio"], b["max_ratio"], 0.05, 0)
    st = {dt: {c["name"]: c["ppl"] for c in stream(loaded[dt], "sotu", tokens=128, window=32, sinks=[0, 4],
                                                   recompute=False, latency=False, progress=False)["configs"]}
          for dt in ("float32", "bfloat16")}
    assert next(loaded["bfloat16"].model.parameters()).dtype == torch.bfloat16
    assert st["float32"].keys() == st["bfloat16"].keys()
    for k, v in st["float32"].items():
        assert close(v, st["bfloat16"][k], PPL_REL, 0), (k, v, st["bfloat16"][k])


def test_a_model_object_is_held_to_its_context_as_its_folder_is(tmp_path, text_corpus_dir):
    """stream() on a model in memory recorded no context, so its full cache ran past max_position_embeddings where the
    same model from its folder stopped: other perplexities, KL and top-1. Both now give the same numbers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from helpers import make_tokenizer
    from sinklab.streaming import stream

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    tok = make_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    kw = dict(corpus=str(text_corpus_dir), tokens=80, window=8, sinks=(0,), recompute=False, latency=False,
              progress=False)
    a, b = stream(model, tokenizer=tok, **kw), stream(str(tmp_path / "m"), **kw)
    assert a["max_context"] == b["max_context"] == 64
    assert [(c["name"], c["ppl"], c["kl"], c["evaluated"]) for c in a["configs"]] == \
        [(c["name"], c["ppl"], c["kl"], c["evaluated"]) for c in b["configs"]]


def test_a_stream_of_one_model_in_memory_is_not_resumed_for_another(text_corpus_dir):
    """stream(resume=) kept the configurations of a saved result whose settings match. For a model in memory the
    key held only its class name and no dtype, so model B resumed from model A's result reported A's perplexities,
    and a bfloat16 copy reported its float32 original's. The key now holds the weights' digest and the dtype."""
    from helpers import make_tokenizer, tiny_llama
    from sinklab.streaming import stream

    tok = make_tokenizer()
    a = tiny_llama(vocab_size=len(tok))
    torch.manual_seed(1)
    b = tiny_llama(vocab_size=len(tok), initializer_range=0.1)
    kw = dict(tokenizer=tok, corpus=str(text_corpus_dir), tokens=48, window=8, sinks=(0,), recompute=False,
              latency=False, progress=False)
    ppl = lambda r: [c["ppl"] for c in r["configs"]]  # noqa: E731
    ra, rb = stream(a, **kw), stream(b, **kw)
    assert ppl(ra) != ppl(rb)
    assert ppl(stream(b, resume=ra.to_dict(), **kw)) == ppl(rb)  # B's own numbers, not A's
    assert ppl(stream(a, resume=ra.to_dict(), **kw)) == ppl(ra)  # the same model still resumes
    half = copy.deepcopy(a).to(torch.bfloat16)
    rh = stream(half, resume=ra.to_dict(), **kw)
    assert rh["dtype"] == "bfloat16" and ppl(rh) == ppl(stream(half, **kw)) != ppl(ra)
    many = dict(kw, corpus=f"{text_corpus_dir},{text_corpus_dir}", streams=2)  # the many-stream key too
    ma, mb = stream(a, **many), stream(b, **many)
    assert ppl(ma) != ppl(mb) and ppl(stream(b, resume=ma.to_dict(), **many)) == ppl(mb)


def test_a_float64_model_in_memory_is_measured_in_float64():
    """measure() copied a model object's dtype into its config, whose check knew float32 / bfloat16 / float16
    only: a float64 model (the usual exact reference) raised 'dtype must be one of ...'. Its sink rates and
    masses now come out, equal to the float32 model's within float32 rounding, and the config says float64."""
    from helpers import make_tokenizer, tiny_llama
    import sinklab

    tok = make_tokenizer()
    m32 = tiny_llama(vocab_size=len(tok), initializer_range=0.3)
    m64 = copy.deepcopy(m32).double()
    kw = dict(tokenizer=tok, input="random", num_samples=4, seq_len=16, progress=False)
    r64, r32 = sinklab.measure(model=m64, **kw), sinklab.measure(model=m32, **kw)
    assert r64.config.dtype == "float64" and next(m64.parameters()).dtype == torch.float64
    t64, t32 = r64.table(), r32.table()
    assert len(t64) == len(t32) > 0
    assert (t64["attention_mass"] - t32["attention_mass"]).abs().max() < 1e-5


def test_a_recompute_window_holding_the_whole_stream_is_named(text_corpus_dir):
    """recompute's window is `window`, not a policy's budget: with budgets of 8 and the default window of 256 over a
    stream of 40 tokens it recomputed the full cache (KL 1e-11 against it), which read as the quality reference.
    A warning now says so; a window inside the stream warns nothing."""
    import warnings

    from helpers import make_tokenizer, tiny_llama
    from sinklab.streaming import stream

    tok = make_tokenizer()
    kw = dict(tokenizer=tok, corpus=str(text_corpus_dir), tokens=40, policies=("sinks",), budgets=(8,), latency=False,
              progress=False)
    with pytest.warns(UserWarning, match=r"recompute's window \(256 tokens.*holds the whole stream of 40"):
        res = stream(tiny_llama(vocab_size=len(tok), max_position_embeddings=512), **kw)
    rec = next(c for c in res["configs"] if c["name"] == "recompute")
    assert rec["kl"] < 1e-6  # what it computed: the full cache
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        stream(tiny_llama(vocab_size=len(tok), max_position_embeddings=512), window=8, **kw)


def test_a_model_cast_to_bfloat16_keeps_its_rope_frequencies_in_float32(tmp_path):
    """Subject.load(model_object, dtype='bfloat16') cast RoPE's inv_freq to bfloat16 (up to 3.7e-3 relative off), so
    the model in memory was not the model its folder loads in bfloat16 (from_pretrained keeps them float32); a
    sinklab model from its folder had the same cast. Both keep them float32 now, and the two routes agree exactly."""
    from helpers import make_tokenizer
    from sinklab.nn import ModelConfig, SinkLM

    tok = make_tokenizer()
    m = tiny_llama(vocab_size=len(tok), hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                   max_position_embeddings=256)
    m.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    folder = Subject.load(str(tmp_path / "hf"), dtype="bfloat16").model
    held = Subject.load(copy.deepcopy(m), dtype="bfloat16").model
    assert held.model.rotary_emb.inv_freq.dtype == folder.model.rotary_emb.inv_freq.dtype == torch.float32
    assert next(held.parameters()).dtype == torch.bfloat16
    x = torch.randint(4, len(tok), (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(held(input_ids=x).logits, folder(input_ids=x).logits)
    torch.manual_seed(0)
    SinkLM(ModelConfig(vocab_size=len(tok), d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=64)).save_pretrained(
        tmp_path / "sl")
    tok.save_pretrained(tmp_path / "sl")
    sl = Subject.load(str(tmp_path / "sl"), dtype="bfloat16").model
    assert sl.positional.inv_freq.dtype == torch.float32 and next(sl.parameters()).dtype == torch.bfloat16


def test_an_encoder_in_memory_is_an_encoder_as_from_its_folder(tmp_path, text_corpus_dir):
    """A BERT model passed as an object was taken for a causal LM: BertModel raised 'no language-modelling head'
    where the docs promise encoders the sink rates only, and BertForMaskedLM got a 'next-token loss' it can
    cheat on (the bidirectional model sees the target). It is an encoder now, as the same model from its folder."""
    import transformers

    from helpers import make_tokenizer, tiny_bert
    from sinklab import analyze

    tok = make_tokenizer(add_bos=False)
    mlm = transformers.BertForMaskedLM(tiny_bert().config).eval()
    assert Subject.load(mlm, tokenizer=tok).is_encoder and Subject.load(tiny_bert(), tokenizer=tok).is_encoder
    assert not Subject.load(tiny_llama(), tokenizer=tok).is_encoder
    mlm.save_pretrained(tmp_path / "bert")
    tok.save_pretrained(tmp_path / "bert")
    kw = dict(num_samples=2, seq_len=12, corpus=str(text_corpus_dir), eps=0.05, only=["noop", "remove-sink"],
              position=0, allow_non_sink=True)
    held = analyze.intervene(mlm, tokenizer=tok, **kw).tables["interventions"]
    folder = analyze.intervene(str(tmp_path / "bert"), **kw).tables["interventions"]
    assert "loss" not in held.columns and list(held.columns) == list(folder.columns)
    assert held["sink_rate_pos0"].tolist() == pytest.approx(folder["sink_rate_pos0"].tolist())


def test_an_analysis_draws_the_probe_of_a_subject_that_has_none(text_corpus_dir):
    """Subject.load returns a Subject without a probe; an analysis given one ran on its empty (0, 0) input and
    raised IndexError. It draws the probe as for a name or a model object: the same numbers as the module."""
    from helpers import make_tokenizer
    from sinklab.analyze import massive

    tok = make_tokenizer()
    kw = dict(num_samples=2, seq_len=12, corpus=str(text_corpus_dir))
    subj = Subject.load(tiny_llama(vocab_size=len(tok)), tokenizer=tok)
    assert subj.input_ids.numel() == 0
    a = massive(subj, **kw)
    b = massive(tiny_llama(vocab_size=len(tok)), tokenizer=tok, **kw)
    assert a.summary["max_ratio"] == b.summary["max_ratio"] and a.tables["layers"].equals(b.tables["layers"])
