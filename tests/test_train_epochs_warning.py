"""``sinklab train`` warns when a run passes over its distinct training tokens more than a few times, and when
it is shorter than its learning-rate warm-up."""

import pytest

from sinklab.nn.config import ModelConfig
from sinklab.runs.config import DataConfig, RunConfig, TrainConfig
from sinklab.train.loop import EPOCHS_WARN, epochs_warning


def cfg(steps):
    # tokens per step = batch 4 x grad_accum 2 x seq_len 16 = 128
    return RunConfig(model=ModelConfig(vocab_size=300, d_model=8, n_layers=1, n_heads=1, d_ff=8, max_seq_len=64),
                     data=DataConfig(seq_len=16, vocab_size=300), train=TrainConfig(steps=steps, batch_size=4, grad_accum=2))


def test_warns_past_the_threshold_with_the_hand_worked_epoch_count():
    assert EPOCHS_WARN == 4.0
    # 25 steps x 8 windows (batch 4 x grad_accum 2) = 200 windows over 50 distinct (850 tokens of 17): 4.0 passes
    assert epochs_warning(cfg(25), 50, 850) == ""
    # 50 steps x 8 windows = 400 windows over 50: 8.0 passes
    msg = epochs_warning(cfg(50), 50, 850)
    assert "50 steps x 8 windows pass over the 50 distinct training windows (850 tokens) 8.0 times" in msg


def test_the_pass_count_is_windows_read_over_windows_available(tmp_path):
    """A window of T = 16 inputs reads T + 1 - n_inserted stream tokens: the count was tokens per step (B A T) over
    the stream tokens available, 16/17 of the passes under concat or bos packing and 16/15 under random_first2.
    ``epochs`` in summary.json is the passes over the distinct training windows, read off a real run's data."""
    import json
    import tomllib

    from helpers import synthetic_run_toml
    from sinklab.data.packing import PackedData
    from sinklab.runs import Run
    from sinklab.runs.config import apply_overrides, from_dict
    from sinklab.train import loop
    from sinklab.train.loop import passes

    for packing in ("bos", "random_first2"):
        c = from_dict(apply_overrides(tomllib.loads(synthetic_run_toml(6)), [f"data.packing={packing}"]))
        out = tmp_path / packing
        loop.train(c, out, progress=False)
        run = Run(c, out)
        data = PackedData(run.corpus.train, run.packer(), c.data.seq_len, max_tokens=c.data.max_train_tokens,
                          seed=c.train.seed)
        read = c.train.steps * c.train.batch_size * c.train.grad_accum  # windows the steps read
        assert passes(c, data.n_windows) == read / data.n_windows
        assert json.loads((out / "summary.json").read_text())["epochs"] == round(read / data.n_windows, 3)


def test_train_reports_the_warning_before_training(tmp_path):
    """The warning reaches ``notify`` (the CLI's stderr echo) with the run's real token count."""
    import random

    from sinklab.train import loop
    from sinklab.runs.config import from_dict

    texts = tmp_path / "t"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(6):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice("a b c the of and".split()) for _ in range(40)))
    cfg = from_dict({
        "model": {"d_model": 8, "n_layers": 1, "n_heads": 1, "d_ff": 8},
        "data": {"corpus": str(texts), "vocab_size": 280, "seq_len": 16, "val_fraction": 0.34, "cache_dir": "run"},
        "optim": {"warmup_steps": 2},  # the warm-up fits: only the epochs warning
        "train": {"steps": 20, "batch_size": 4, "tensorboard": False, "device": "cpu"},
        "track": {"n_probe": 2, "probe_len": 16, "positions": 2, "val_windows": 2},
    })
    said: list[str] = []
    loop.train(cfg, tmp_path / "run", progress=False, stop_after=1, notify=said.append)
    assert len(said) == 1
    assert said[0].startswith("warning: 20 steps x 4 windows pass over the") and "memorise" in said[0]
    assert_names_the_large_corpora_section(said[0])


def assert_names_the_large_corpora_section(msg: str) -> None:
    """The message points to docs/scaling.md's 'Large corpora' section, which exists (not to the README's
    former 'Scaling out' section)."""
    from pathlib import Path

    assert "see docs/scaling.md, 'Large corpora'" in msg and "README" not in msg, msg
    doc = (Path(__file__).resolve().parents[1] / "docs" / "scaling.md").read_text()
    assert "\n## Large corpora\n" in doc


def test_warmup_warning_hand_worked():
    """issue 21, item 9: `train tiny-cpu --steps 20` peaks at lr 2e-4 = 1e-3 * 20 / 100 (warm-up 100 steps),
    silently. The warning names the setting, the peak and a fix; a run at least as long as its warm-up gets none."""
    from sinklab.runs.config import load_config
    from sinklab.cli.common import cli_text
    from sinklab.errors import render
    from sinklab.train.loop import warmup_warning

    cfg = load_config("tiny-cpu", ["train.steps=20"])
    assert (cfg.optim.lr, cfg.optim.warmup_steps) == (1e-3, 100)
    msg = cli_text(warmup_warning(cfg))  # as the CLI prints it; Python's warning says optim.warmup_steps=2
    assert render(warmup_warning(cfg)).endswith("lower it, e.g. optim.warmup_steps=2")
    assert msg == ("warning: train.steps = 20 is shorter than the warm-up optim.warmup_steps = 100: the learning rate "
                   "peaks at 0.0002 (20/100 of optim.lr = 0.001) and never decays; lower it, e.g. "
                   "--set optim.warmup_steps=2")
    assert warmup_warning(load_config("tiny-cpu", ["train.steps=100"])) == ""
    assert warmup_warning(load_config("tiny-cpu")) == ""


def test_train_cli_prints_the_warmup_warning_once(tmp_path, capsys):
    from helpers import run_cli_captured, synthetic_run_toml

    cfg = tmp_path / "t.toml"
    cfg.write_text(synthetic_run_toml(steps=3))  # lr 3e-3
    code, _, err = run_cli_captured(["train", str(cfg), "--out", str(tmp_path / "run"), "--no-progress",
                                     "--set", "optim.warmup_steps=10"], capsys)
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if "warm-up" in ln]
    assert lines == ["warning: train.steps = 3 is shorter than the warm-up optim.warmup_steps = 10: the learning rate "
                     "peaks at 0.0009 (3/10 of optim.lr = 0.003) and never decays; lower it, e.g. "
                     "--set optim.warmup_steps=1"]


# ----------------------------------------------------------------------------- data.max_epochs


def test_max_epochs_refuses_past_the_limit_with_the_hand_worked_count():
    from sinklab.errors import InputError
    from sinklab.train.loop import check_epochs, passes

    c = cfg(50)  # 50 steps x 8 windows over 50 distinct: 8.0 passes
    assert passes(c, 50) == 8.0
    check_epochs(c, 50, 850)  # no limit: only the warning
    c.data.max_epochs = 8.0
    check_epochs(c, 50, 850)  # exactly at the limit
    c.data.max_epochs = 4.0
    with pytest.raises(InputError) as e:
        check_epochs(c, 50, 850)
    msg = str(e.value)
    assert "\n" not in msg and "8.0 times" in msg and "data.max_epochs=4" in msg and "50 distinct training windows" in msg
    assert 'data.corpus = "hf:NAME"' in msg and "allow the repetition with data.max_epochs=8" in msg
    assert_names_the_large_corpora_section(msg)
    with pytest.raises(InputError, match="with data.max_epochs=9$"):
        check_epochs(c, 49, 833)  # 8.16 passes: the suggested limit is rounded up


def test_paper_presets_limit_the_passes_and_the_cpu_presets_do_not():
    from sinklab.runs.config import ConfigError, load_config

    for name in ("paper-60m", "paper-1b"):
        assert load_config(name).data.max_epochs == 4.0
        assert load_config(name, ["data.max_epochs=200"]).data.max_epochs == 200.0
    for name in ("tiny-cpu", "emergence-cpu"):
        assert load_config(name).data.max_epochs is None
    with pytest.raises(ConfigError, match="data.max_epochs must be > 0"):
        load_config("tiny-cpu", ["data.max_epochs=0"])


def _small_texts(root):
    import random

    root.mkdir()
    rng = random.Random(0)
    for i in range(6):
        (root / f"d{i}.txt").write_text(" ".join(rng.choice("a b c the of and".split()) for _ in range(300)))
    return root


def test_paper_preset_on_a_small_corpus_exits_2_before_training(tmp_path, capsys):
    """``sinklab train paper-60m`` on a corpus its 10000 steps would repeat: exit 2, one line naming
    the fixes, no checkpoint; ``data.max_epochs`` raised lifts the refusal (the run trains)."""
    from helpers import run_cli_captured

    from sinklab.train import loop
    from sinklab.runs.config import load_config

    texts = _small_texts(tmp_path / "t")
    small = [f'data.corpus="{texts}"', "data.vocab_size=300", 'data.cache_dir="run"', "data.seq_len=16",
             "data.val_fraction=0.34", "train.batch_size=2", "train.grad_accum=1", 'train.device="cpu"',
             "track.probe_len=16", "track.n_probe=2", "track.val_windows=1", "track.positions=2"]
    code, _, err = run_cli_captured(["train", "paper-60m", *[a for o in small for a in ("--set", o)],
                                     "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "more than data.max_epochs=4" in last and "--set data.max_epochs=" in last, err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    tiny = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "model.d_ff=32", 'train.precision="fp32"',
            "train.compile=false", "data.max_epochs=1e9"]
    said: list[str] = []
    res = loop.train(load_config("paper-60m", [*small, *tiny]), tmp_path / "allowed", progress=False, stop_after=1,
                     notify=said.append)
    assert sorted(res.losses) == [1] and "memorise" in said[0]  # allowed, and still warned


@pytest.mark.network
def test_paper_60m_on_the_offline_corpora_exits_2_with_the_epochs_message(tmp_path, capsys):
    """The preset as a user copies it from docs/scaling.md: the offline corpus zoo is far too small."""
    from helpers import run_cli_captured

    code, _, err = run_cli_captured(["train", "paper-60m", "--out", str(tmp_path / "run"), "--no-progress"], capsys)
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "10000 steps x 64 windows would pass over" in last and "more than data.max_epochs=4" in last, err


def test_a_refused_run_leaves_no_folder_it_created(tmp_path, capsys):
    """The epochs refusal before training: an --out the command created (with its missing parents) is
    removed again when nothing was written into it; an --out that existed before stays, empty."""
    from helpers import run_cli_captured

    texts = _small_texts(tmp_path / "t")
    small = [f'data.corpus="{texts}"', "data.vocab_size=300", f'data.cache_dir="{tmp_path / "cache"}"',
             "data.seq_len=16", "data.val_fraction=0.34", "train.batch_size=2", "train.grad_accum=1",
             'train.device="cpu"', "track.probe_len=16", "track.n_probe=2", "track.val_windows=1", "track.positions=2"]
    sets = [a for o in small for a in ("--set", o)]
    code, _, err = run_cli_captured(["train", "paper-60m", *sets, "--out", str(tmp_path / "new" / "run"),
                                     "--no-progress"], capsys)
    assert code == 2 and "more than data.max_epochs=4" in err.strip().splitlines()[-1], err
    assert (tmp_path / "cache").is_dir()  # the refusal came after tokenizing, outside the run folder
    assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()
    code, _, err = run_cli_captured(["train", "paper-60m", *sets, "--out", str(tmp_path / "mine"), "--no-progress"],
                                    capsys)
    assert code == 2 and "more than data.max_epochs=4" in err, err
    assert (tmp_path / "mine").is_dir() and not any((tmp_path / "mine").iterdir())
