"""What `sinklab measure` prints and draws (issue 12, items 6 and 7): clean output in a log file,
layer and token numbering said, the tokenizer's long-sequence warning silenced, corpus-too-small
messages that give the corpus size and the fix that helps, one eps convention named clearly."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import WORDS, make_tokenizer, tiny_llama
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
    top = [ln for ln in lines if ln.startswith("top sink position: token ")]
    assert len(top) == 1 and top[0].endswith("mean mass over the samples > eps)") and len(top[0]) > 80
    assert any(ln.startswith("largest norm ratio: ") and ln.endswith(tuple("0123456789")) for ln in lines)
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
    assert "lower --seq-len to at most 11" in msg  # 10 tokens + the BOS


def test_corpus_with_too_few_windows_says_how_many_fit():
    tok = make_tokenizer()
    docs = [" ".join(WORDS[:30]), " ".join(WORDS[:20])]
    with pytest.raises(InputError) as e:
        make_probe("natural", tok, documents=docs, num_samples=50, seq_len=10, bos="never")
    msg = str(e.value)
    assert "2 documents, 50 tokens" in msg and "only 5 windows of 10 content tokens" in msg
    assert "lower --num-samples to 5" in msg


def test_run_validation_split_too_small_message():
    from sinklab.data.packing import make_packer
    from sinklab.data.probe import probe_set
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


def test_train_progress_bar_stays_out_of_a_log_file(tmp_path, capsys):
    """`sinklab train` without --no-progress, stderr not a terminal: no carriage-return bar lines, but plain
    progress lines (issue 21: a log file used to get nothing for minutes)."""
    from conftest import synthetic_run_toml

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
