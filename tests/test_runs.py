"""sinklab.runs.Run (a trained run rebuilt one way), the model adapter, and the one window cutter."""

import numpy as np
import pytest
import torch

from sinklab.errors import InputError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step synthetic run (T 16, tracker every 2 steps) and its folder."""
    from helpers import synthetic_run_toml
    from sinklab.runs import load_config
    from sinklab.train.loop import train

    tmp = tmp_path_factory.mktemp("run")
    cfg_file = tmp / "run.toml"
    cfg_file.write_text(synthetic_run_toml(steps=4))
    out = tmp / "run"
    res = train(load_config(cfg_file), out, progress=False)
    return out, res


def test_run_open_reads_the_resolved_config_from_the_folder_or_final(trained):
    from sinklab.runs import Run, load_config

    out, _ = trained
    run = Run.open(out)
    assert run.folder == out.resolve() and run.final == out.resolve() / "final"
    assert run.config.to_dict() == load_config(out / "config.toml").to_dict()
    assert Run.open(out / "final").folder == run.folder
    assert run.seq_len == 16 and run.prefix_len == 0 and run.synthetic and run.bos_policy == "always"
    assert Run.find("smollm2-135m") is None  # a zoo name is not a run
    with pytest.raises(InputError, match="not a `sinklab train` run folder"):
        Run.open(out / "tokens" if (out / "tokens").is_dir() else out.parent)


def test_the_tracker_probe_rebuilt_by_run_gives_the_trackers_last_record(trained):
    """Run rebuilds the tracker's probe and model: measuring the final model on it reproduces the
    sink rate the training loop's tracker recorded at the last step."""
    from sinklab.capture import collect
    from sinklab.metrics import summarize
    from sinklab.runs import Run

    out, res = trained
    run = Run.open(out)
    probe = run.tracker_probe()
    assert probe.shape == (run.config.track.n_probe, run.config.track.probe_len)
    assert (probe[:, 0] == run.corpus.bos_id).all()  # bos packing: BOS first
    stats = collect(run.model, probe, batch_size=run.config.track.batch_size, prefix_len=run.prefix_len)
    s = summarize(stats, eps=run.config.track.eps, positions=run.config.track.positions, n_boot=200)
    last = res.history[-1]
    assert last["step"] == 4
    assert s["sink_rate"] == last["sink_rate"] and s["attention_mass_first"] == last["attention_mass_first"]


def test_run_probe_is_the_tracker_probe_with_the_trackers_settings(trained):
    from sinklab.runs import Run

    run = Run.open(trained[0])
    t = run.config.track
    p = run.probe(t.n_probe, t.probe_len, t.seed, "auto")
    assert p.details["tracker_probe"] and torch.equal(p.input_ids, run.tracker_probe())
    docs = run.validation_documents()
    assert sum(len(d) for d in docs) == run.corpus.val.n_tokens
    # BOS, then each validation document followed by EOS, as training joins them (they ran into each other)
    want = [int(run.corpus.bos_id)] + [t for d in docs for t in [*map(int, d), int(run.corpus.eos_id)]]
    n = min(len(want), int(docs[0].shape[0]) + 12)  # past the first document's EOS
    stream = run.validation_stream(n)
    assert stream.tolist() == want[:n] and int(run.corpus.eos_id) in stream.tolist()
    with pytest.raises(InputError, match="fewer than tokens=1000000000"):
        run.validation_stream(10**9)


def test_analyze_takes_the_sequence_length_from_the_run(trained):
    """``sinklab analyze`` on a run trained with 16-token windows: T defaults to the run's, not 64."""
    from sinklab.analyze.common import resolve_subject
    from sinklab.runs import Run

    out, _ = trained
    subj = resolve_subject(str(out), num_samples=8)
    want = Run.open(out).probe(8, 16, 0, "auto").input_ids
    assert subj.input_ids.shape == (8, 16) and torch.equal(subj.input_ids, want)


def test_adapter_tells_the_two_kinds_apart_and_reads_their_structure(trained):
    from helpers import tiny_llama
    from sinklab.capture import HFAdapter, SinkLMAdapter, adapt
    from sinklab.nn import SinkLM
    from sinklab.runs import Run

    m = Run.open(trained[0]).model
    a = adapt(m)
    assert isinstance(a, SinkLMAdapter) and a.kind == "sinklab" and adapt(a) is a
    assert (a.n_layers, a.n_heads, a.max_context) == (m.config.n_layers, m.config.n_heads, m.config.max_seq_len)
    assert a.embeddings is m.embed and a.has_lm_head and a.accepts_prefix and not a.masked_diffusion
    assert a.dynamic_cache() is None and not a.parallel_stream and a.attn_implementation is None
    # FSDP2's fully_shard swaps in a generated subclass: still a SinkLM
    wrapped = SinkLM(m.config)
    wrapped.__class__ = type("FSDPSinkLM", (SinkLM,), {})
    assert isinstance(adapt(wrapped), SinkLMAdapter)

    hf = tiny_llama().eval()
    h = adapt(hf)
    assert isinstance(h, HFAdapter) and h.kind == "hf"
    assert (h.n_layers, h.n_heads) == (hf.config.num_hidden_layers, hf.config.num_attention_heads)
    assert h.embeddings is hf.get_input_embeddings() and h.has_lm_head and not h.accepts_prefix
    with h.attention("eager") as name:
        assert name == "eager" and hf.config._attn_implementation == "eager"


def test_adapter_capture_matches_the_models_own_attention(trained):
    """The SinkLM adapter's capture records column sums of the model's own attention weights."""
    from sinklab.capture import adapt
    from sinklab.runs import Run

    run = Run.open(trained[0])
    ids = run.tracker_probe()[:2]
    rec = adapt(run.model).capture(ids).finish()
    seen = []

    def observer(layer, weights, **_):
        seen.append(weights.sum(dim=-2, dtype=torch.float64))

    with torch.no_grad():
        run.model(ids, observer=observer)
    T = ids.shape[1]
    count = torch.arange(T, 0, -1, dtype=torch.float64)  # queries i >= j that see key j
    torch.testing.assert_close(rec.mass[:, 0], seen[0] / count, rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- the one window cutter
def _old_natural(lengths, n, content, seed):
    """sinklab measure's natural-text windows as they were drawn before the cutter was shared."""
    windows = [(d, o) for d, L in enumerate(lengths) for o in range(0, L - content + 1, content)]
    gen = torch.Generator().manual_seed(seed)
    pick = sorted(torch.randperm(len(windows), generator=gen)[:n].tolist())
    return [windows[i] for i in pick]


def _old_tracker(lengths, n, chunk, seed):
    """The tracker's probe starts as they were drawn before (sinklab.data.probe)."""
    lengths = np.asarray(lengths)
    starts = np.maximum(0, lengths - chunk + 1)
    rng = np.random.default_rng([seed, 0x9B0BE])
    picks = np.sort(rng.choice(int(starts.sum()), size=n, replace=False))
    out = []
    for g in picks:
        d, g = 0, int(g)
        while g >= starts[d]:
            g -= starts[d]
            d += 1
        out.append((d, g))
    return out


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_cut_windows_draws_exactly_what_both_old_pipelines_drew(seed):
    from sinklab.probe.windows import cut_windows

    lengths = np.random.default_rng(seed).integers(0, 60, size=25).tolist()
    w = cut_windows(lengths, 12, 9, stride=9, draw="permutation", seed=seed)
    assert list(zip(w.doc.tolist(), w.offset.tolist())) == _old_natural(lengths, 12, 9, seed)
    w = cut_windows(lengths, 30, 7, stride=1, draw="choice", seed=seed)
    assert list(zip(w.doc.tolist(), w.offset.tolist())) == _old_tracker(lengths, 30, 7, seed)
    assert w.available == sum(max(0, L - 6) for L in lengths)


def test_one_message_for_too_few_windows_in_both_wordings():
    from sinklab.errors import render
    from sinklab.probe.windows import CORPUS_WORDING, TRACKER_WORDING, cut_windows, too_few_windows

    with pytest.raises(InputError) as e:
        cut_windows([5, 8], 10, 4, stride=4, draw="permutation", seed=0, wording=CORPUS_WORDING)
    assert str(e.value) == render(too_few_windows(3, 10, 4, [5, 8], 0, CORPUS_WORDING))
    assert "only 3 windows of 4 content tokens" in str(e.value) and "lower num_samples to 3" in str(e.value)
    msg = too_few_windows(0, 4, 20, [5, 8], 1, TRACKER_WORDING)
    assert "no probe window of 20 text tokens" in msg and "lower track.probe_len to at most 9" in msg
    assert msg.endswith("or raise data.val_fraction")
    assert too_few_windows(0, 4, 20, [0], 0, CORPUS_WORDING).endswith("holds no text to cut windows from; use another corpus")
