"""What `sinklab measure` prints and draws (issue 12, items 6 and 7): clean output in a log file,
layer and token numbering said, the tokenizer's long-sequence warning silenced, corpus-too-small
messages that give the corpus size and the fix that helps, one eps convention named clearly."""

import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import WORDS, make_tokenizer, tiny_llama
from sinklab.capture.stats import ProbeStats
from sinklab.cli.main import app
from sinklab.errors import InputError
from sinklab.measure import report
from sinklab.metrics import summarize
from sinklab.probe import make_probe

LONG_WARNING = "longer than the specified maximum"


def run_cli(argv, capsys):
    with pytest.raises(SystemExit) as e:
        app(argv)
    return e.value.code, capsys.readouterr()


@pytest.fixture
def transformers_log():
    """Messages that transformers' loggers emit during the test."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Keep(level=logging.DEBUG)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.fixture
def short_context_model_dir(tmp_path):
    """A tiny LLaMA folder whose tokenizer says its maximum length is 32 tokens (documents are 200)."""
    tok = make_tokenizer()
    tok.model_max_length = 32
    d = tmp_path / "tiny-llama-32"
    tiny_llama(vocab_size=len(tok)).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def test_log_file_output_is_clean_and_says_how_layers_are_numbered(short_context_model_dir, text_corpus_dir,
                                                                    tmp_path, capsys, transformers_log):
    """stdout and stderr are not terminals here (as in `sinklab measure > log 2>&1`): no progress-bar
    carriage returns, the title on a line of its own, no summary line broken at 80 columns; the
    tokenizer's long-sequence warning does not appear although every document is longer than 32 tokens."""
    code, io = run_cli(["measure", "--model", str(short_context_model_dir), "--corpus", str(text_corpus_dir),
                        "-n", "4", "-t", "16", "--out", str(tmp_path / "out")], capsys)
    assert code in (0, None)
    assert "\r" not in io.err and "\r" not in io.out
    probe = [ln for ln in io.err.splitlines() if ln.startswith("probe: ")]  # plain progress lines, no bar
    assert len(probe) == 1 and probe[0].startswith("probe: batch 1/1 (100%), "), io.err
    lines = io.out.splitlines()
    assert lines[0].startswith("sink rate · ") and lines[0].endswith("N=4 T=16 eps=0.3")  # longer than 80 columns
    assert len(lines[0]) > 80
    assert any("token k" in ln for ln in lines[1:5])
    layers = [ln for ln in lines if ln.startswith("strongest sink layers")]
    assert len(layers) == 1 and "(layers numbered 0 to 1)" in layers[0]
    top = [ln for ln in lines if ln.startswith("top sink position: ")]
    has_sink = json.loads((tmp_path / "out" / "results.json").read_text())["has_sink"]
    assert not has_sink  # this random tiny model has none at eps 0.3, and the line says so, whole
    assert len(top) == 1 and top[0].endswith("(no (sample, layer, head) puts mass > eps on any position)")
    assert len(top[0]) > 80
    assert any(ln.startswith("largest norm ratio: ") and ln.endswith("far above 1 marks a sink)") for ln in lines)
    mar = json.loads((tmp_path / "out" / "results.json").read_text())["massive_activation_ratio"]
    top = max(range(len(mar)), key=mar.__getitem__)  # the layer whose ratio the line names, as results.json has it
    assert any(ln.startswith(f"largest massive-activation ratio: {mar[top]:.0f}x in layer {top} (") for ln in lines)
    assert not any(LONG_WARNING in m for m in transformers_log)
    assert LONG_WARNING not in io.err


def test_plot_axes_say_how_layers_and_tokens_are_numbered(tiny_model_dir, text_corpus_dir, tmp_path, monkeypatch):
    import matplotlib.figure

    from sinklab.measure import measure

    labels: dict[str, list[str]] = {}

    def record(fig, path, *a, **k):
        labels[str(path).rsplit("/", 1)[-1]] = [t for ax in fig.axes for t in (ax.get_xlabel(), ax.get_ylabel(),
                                                                               ax.get_title())]

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    measure(model=str(tiny_model_dir), corpus=str(text_corpus_dir), num_samples=4, seq_len=12, progress=False,
            out=tmp_path / "o")
    heat, rates, norms = labels["attention_mass_heatmap.png"], labels["sink_rate_positions.png"], labels["hidden_norms.png"]
    assert "layer (numbered from 0)" in heat and "head (numbered from 0)" in heat
    assert any("1-based" in t for t in heat)  # the title names the token
    assert sum("1-based" in t for t in rates) == 2
    assert any(t.startswith("layer (numbered from 0") for t in norms)


# ---------------------------------------------------------------- tokenizer warning
def test_long_documents_tokenize_without_the_length_warning(transformers_log):
    from sinklab.probe.cache import tokenize_documents

    tok = make_tokenizer()
    tok.model_max_length = 8
    docs = [" ".join(WORDS[:40]), " ".join(WORDS[5:30])]
    make_probe("natural", tok, documents=docs, num_samples=2, seq_len=8, bos="never")
    tokenize_documents(tok, docs)
    make_probe("text", tok, text=docs[0], seq_len=8)
    assert not any(LONG_WARNING in m for m in transformers_log)
    # only sinklab's own calls are quiet: the tokenizer still warns the user's code as before
    tok(docs[0])
    assert sum(LONG_WARNING in m for m in transformers_log) == 1


# ---------------------------------------------------------------- corpus too small
def test_corpus_with_no_window_says_its_size_and_to_lower_seq_len():
    tok = make_tokenizer()
    with pytest.raises(InputError) as e:
        make_probe("natural", tok, documents=[" ".join(WORDS[:10])], num_samples=5, seq_len=64, bos="always")
    msg = str(e.value)
    assert "1 document," in msg and "10 tokens" in msg and "documents" not in msg
    assert "--num-samples" not in msg  # fewer samples cannot help when there is no window at all
    assert "lower seq_len to at most 11" in msg  # 10 tokens + the BOS


def test_corpus_with_too_few_windows_says_how_many_fit():
    tok = make_tokenizer()
    docs = [" ".join(WORDS[:30]), " ".join(WORDS[:20])]
    with pytest.raises(InputError) as e:
        make_probe("natural", tok, documents=docs, num_samples=50, seq_len=10, bos="never")
    msg = str(e.value)
    assert "2 documents, 50 tokens" in msg and "only 5 windows of 10 content tokens" in msg
    assert "lower num_samples to 5" in msg


def test_run_validation_split_too_small_message():
    from sinklab.data.packing import make_packer
    from sinklab.probe.windows import probe_set
    from test_data_packing import CTX, split_of

    split = split_of([list(range(100, 107))])
    with pytest.raises(InputError) as e:
        probe_set(split, make_packer("bos", CTX), n=4, length=16)
    msg = str(e.value)
    assert "1 document, 7 tokens" in msg and "lower track.probe_len to at most 8" in msg and "n_probe" not in msg
    with pytest.raises(InputError) as e:
        probe_set(split, make_packer("concat", CTX), n=40, length=4, settings=("--num-samples", "--seq-len", None))
    msg = str(e.value)
    assert "only 4 possible probe windows" in msg and "lower --num-samples to 4" in msg and "val_fraction" not in msg


# ---------------------------------------------------------------- one eps convention
def _stats(mass: torch.Tensor) -> ProbeStats:
    N, L, H, T = mass.shape
    return ProbeStats(mass=mass, hidden_norms=torch.ones(N, L, T), max_abs=torch.ones(N, L),
                      median_abs=torch.ones(N, L), max_position=torch.zeros(N, L, dtype=torch.long),
                      max_channel=torch.zeros(N, L, dtype=torch.long))


def test_top_sink_line_applies_eps_per_sample_and_names_the_mean_mass_share():
    """Every head puts 0.8 on token 1 in one sample and 0 in the other: per sample (Sink_1, the paper's
    convention) half the triples pass eps = 0.3; on the mean over samples (0.4) every head does."""
    mass = torch.zeros(2, 1, 2, 4, dtype=torch.float64)
    mass[0, :, :, 0] = 0.8
    s = summarize(_stats(mass), 0.3, 4, n_boot=10)
    assert s["top_sink_position"] == 0 and s["top_sink_rate"] == pytest.approx(50.0)
    assert s["top_sink_mean_mass_head_share"] == pytest.approx(1.0)
    assert "top_sink_head_share" not in s  # the old key mixed the two conventions under one name
    lines = report.summary_lines(SimpleNamespace(summary=s, stats=_stats(mass)))
    top = next(ln for ln in lines if ln.startswith("top sink position"))
    assert "sink rate 50.0%" in top and "(sample, layer, head) triples" in top
    assert "100% of (layer, head) pairs have a mean mass over the samples > eps" in top
    assert "heads above eps on average" not in top


def test_a_window_model_gets_its_top_sink_and_strongest_layers_from_the_mask_aware_mass():
    """Under a window the plain mass of a key cannot pass w / T: a model with mask-aware Sink_1 99% read "this
    model has no sink" and "no layer has a sink" (outside audit, 2026-12-07). Hand-made masses: plain 0.1 on
    token 1 everywhere (below eps), mask-aware 0.9 in layer 1 and 0.5 in layer 0 on token 2."""
    mass = torch.full((2, 2, 2, 6), 0.1, dtype=torch.float64)
    vis = torch.full((2, 2, 2, 6), 0.1, dtype=torch.float64)
    vis[:, 1, :, 0] = 0.9
    vis[:, 0, :, 1] = 0.5
    stats = ProbeStats(mass=mass, hidden_norms=torch.ones(2, 2, 6), max_abs=torch.ones(2, 2),
                       median_abs=torch.ones(2, 2), max_position=torch.zeros(2, 2, dtype=torch.long),
                       max_channel=torch.zeros(2, 2, dtype=torch.long), mass_visible=vis,
                       mask={"causal": True, "prefix_len": 0, "window": 2})
    s = summarize(stats, 0.3, 4, n_boot=10)
    assert s["has_sink"] is False and s["top_sink_rate"] == 0.0  # the plain ones, as before
    # Sink_k per position over (sample, layer, head): token 1 50% (layer 1 only), token 2 50% (layer 0 only)
    assert s["has_sink_visible"] is True and s["top_sink_position_visible"] == 0
    assert s["top_sink_rate_visible"] == pytest.approx(50.0)
    assert s["strongest_layers_visible"][0] == 1 and s["top_sink_mean_mass_head_share_visible"] == pytest.approx(0.5)
    lines = report.summary_lines(SimpleNamespace(summary=s, stats=stats))
    assert lines[0].startswith("strongest mask-aware sink layers for token 1") and "layer 1 (100%)" in lines[0]
    assert lines[1].startswith("top mask-aware sink position: token 1 (sink rate 50.0%")
    assert "plain: no sink at any position" in lines[2]


def test_train_progress_bar_stays_out_of_a_log_file(tmp_path, capsys):
    """`sinklab train` without --no-progress, stderr not a terminal: no carriage-return bar lines, but plain
    progress lines (issue 21: a log file used to get nothing for minutes)."""
    from helpers import synthetic_run_toml

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(synthetic_run_toml(steps=3))
    with pytest.raises(SystemExit) as e:
        app(["train", str(cfg), "--out", str(tmp_path / "run")])
    io = capsys.readouterr()
    assert e.value.code in (0, None), io.err
    assert "\r" not in io.err and "\r" not in io.out
    assert "%|" not in io.err  # tqdm's "train: 33%|..." bar
    assert [ln.split(",")[0] for ln in io.err.splitlines() if ln.startswith("train: ")] == [
        "train: step 1/3 (33%)", "train: step 2/3 (67%)", "train: step 3/3 (100%)"]


# ---------------------------------------------------------------- numbers that mislead (issue 21, item 8)
def _printed(stats, eps=0.3, positions=4, name="m"):
    """What print_summary writes for these statistics (a wide console: no table column is cut)."""
    import io

    from rich.console import Console

    s = summarize(stats, eps, positions, n_boot=200)
    buf = io.StringIO()
    result = SimpleNamespace(summary=s, stats=stats, model={"name": name}, config=SimpleNamespace(input="natural"))
    report.print_summary(result, Console(file=buf, width=250, soft_wrap=True, highlight=False))
    return s, buf.getvalue()


def test_no_sink_is_said_not_printed_as_layer_0_at_0_percent():
    """Every mass below eps: the summary says there is no sink; no layer is "strongest" at 0% and no
    "top sink" at 0.0% (the old lines: "layer 0 (0%), layer 1 (0%)" and "top sink ... 0.0%")."""
    mass = torch.full((3, 2, 2, 6), 0.1, dtype=torch.float64)
    s, out = _printed(_stats(mass))
    assert s["has_sink"] is False and s["top_sink_rate"] == 0.0
    layers = next(ln for ln in out.splitlines() if ln.startswith("strongest sink layers"))
    top = next(ln for ln in out.splitlines() if ln.startswith("top sink position"))
    assert "none, no layer has a sink at token 1" in layers and "(0%)" not in layers
    assert top.startswith("top sink position: none, no sink on this input at eps = 0.3") and "0.0%" not in top
    # a sink in one layer only: that layer is listed, the 0% layer is not
    mass[:, 1, :, 0] = 0.9
    s, out = _printed(_stats(mass))
    layers = next(ln for ln in out.splitlines() if ln.startswith("strongest sink layers"))
    assert s["has_sink"] and layers.endswith(": layer 1 (100%)")
    assert "top sink position: token 1 (sink rate 50.0%" in out


def test_one_sample_has_no_interval():
    """N = 1: the bootstrap has nothing to resample; the CI is None (null in results.json), the table says
    "none (N = 1)" and a note says why, instead of [87.4, 87.4]."""
    mass = torch.zeros(1, 2, 2, 6, dtype=torch.float64)
    mass[0, 0, :, 0] = 0.9
    s, out = _printed(_stats(mass))
    assert s["sink_rate_ci"] == [[None, None]] * 4 and s["sink_rate"][0] == 50.0
    assert "none (N = 1)" in out and "[50.0, 50.0]" not in out
    assert "note: N = 1: one sample has no confidence interval" in out
    # two samples: an interval again
    s2, out2 = _printed(_stats(torch.cat([mass, mass])))
    assert s2["sink_rate_ci"][0] == [50.0, 50.0] and "none (N = 1)" not in out2 and "N = 1" not in out2


def test_one_sample_sink_rate_csv_and_plot(tmp_path, monkeypatch):
    """write_outputs with N = 1: sink_rate.csv has empty CI cells, the plot draws no error bars."""
    import pandas as pd

    from sinklab.measure.report import plot_all

    mass = torch.zeros(1, 2, 2, 6, dtype=torch.float64)
    mass[0, 0, :, 0] = 0.9
    stats = _stats(mass)
    stats.hidden_norms = torch.rand(1, 2, 6) + 1
    s = summarize(stats, 0.3, 4, n_boot=50)
    s["massive_activation_ratio"] = [1.0, 1.0]
    result = SimpleNamespace(summary=s, stats=stats, model={"name": "m"}, config=SimpleNamespace(input="natural"),
                             to_dict=lambda: s, table=lambda: pd.DataFrame({"a": [1]}))
    report.write_outputs(result, tmp_path)
    csv = pd.read_csv(tmp_path / "sink_rate.csv")
    assert csv["ci_low"].isna().all() and csv["ci_high"].isna().all()
    assert (tmp_path / "sink_rate_positions.png").stat().st_size > 0


def test_windowed_model_prints_the_mask_aware_rate_first():
    """A Gemma-3-style model (sliding layers of window 4, T = 12): both sink rates are printed, mask-aware
    first, each the number in the summary (results.json); a plain causal model prints one."""
    from test_capture_blockwise import tiny_gemma3

    from sinklab.capture import collect

    ids = torch.randint(0, 80, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        stats = collect(tiny_gemma3(window=4), ids, collector="eager")
    s, out = _printed(stats, eps=0.05)
    assert s["mask_aware_differs"] and s["mask"]["window"] == 4
    assert s["sink_rate_visible"] != s["sink_rate"]  # the two differ here
    header = next(ln for ln in out.splitlines() if "token k" in ln)
    assert header.index("mask-aware Sink_k (%)") < header.index("plain Sink_k (%)")
    row1 = next(ln for ln in out.splitlines() if ln.replace("│", " ").split()[:1] == ["1"])
    cells = [c.strip() for c in row1.split("│") if c.strip()]
    assert cells[1] == f"{s['sink_rate_visible'][0]:.1f}" and cells[3] == f"{s['sink_rate'][0]:.1f}"
    line = next(ln for ln in out.splitlines() if ln.startswith("mask-aware Sink_1"))
    assert line.startswith(f"mask-aware Sink_1 {s['sink_rate_visible'][0]:.1f}%, plain Sink_1 {s['sink_rate'][0]:.1f}%")
    assert "sliding window of 4 tokens" in line
    # plain causal attention: one rate, no mask-aware column
    plain = _stats(torch.rand(2, 1, 2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    s, out = _printed(plain)
    assert not s["mask_aware_differs"] and "mask-aware" not in out and "Sink_k (%)" in out


def test_rate_figure_of_a_window_model_draws_its_mask_aware_rate():
    """The figure drew only the plain Sink_k, which a window caps at w/T, while the console led with the mask-aware
    rate (outside audit, 2026-12-07). For a summary whose mask hides keys it now draws both, labelled; a plain
    causal summary keeps one series."""
    from sinklab.measure.report import sink_rate_figure

    s = {"sink_rate": [0.0, 5.0], "sink_rate_ci": [[0.0, 1.0], [2.0, 8.0]], "sink_rate_curve": [0.0, 5.0, 1.0],
         "eps": 0.3, "num_samples": 4, "seq_len": 3, "mask_aware_differs": True, "sink_rate_visible": [95.0, 6.0]}
    fig = sink_rate_figure(s)
    bars = {c.get_label(): [b.get_height() for b in c] for c in fig.axes[0].containers if hasattr(c, "patches")}
    assert bars["mask-aware Sink_k"] == [95.0, 6.0] and bars["Sink_k (paper's formula)"] == [0.0, 5.0]
    plain = sink_rate_figure({**s, "mask_aware_differs": False})
    assert [c.get_label() for c in plain.axes[0].containers if hasattr(c, "patches")] == ["Sink_k"]


def test_few_samples_get_a_note_that_the_interval_undercovers():
    """2 <= N < 20: the percentile bootstrap interval covers less than its 95% (benchmarks/results/ci_coverage.json) and
    is [x, x] when every sample has the same rate; the console says so, from N = 20 on it does not."""
    from sinklab.measure.report import SMALL_N

    mass = torch.zeros(1, 2, 2, 6, dtype=torch.float64)
    mass[0, 0, :, 0] = 0.9
    s, out = _printed(_stats(mass.expand(2, -1, -1, -1).clone()))
    assert s["sink_rate_ci"][0] == [50.0, 50.0]
    assert f"note: N = 2 < {SMALL_N}: the percentile bootstrap interval covers less than its 95%" in out
    _, out20 = _printed(_stats(mass.expand(SMALL_N, -1, -1, -1).clone()))
    assert "percentile bootstrap interval covers less" not in out20
