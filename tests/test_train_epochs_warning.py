"""``sinklab train`` warns when a run passes over its distinct training tokens more than a few times, and when
it is shorter than its learning-rate warm-up."""

from sinklab.nn.config import ModelConfig
from sinklab.train.config import DataConfig, RunConfig, TrainConfig
from sinklab.train.loop import EPOCHS_WARN, epochs_warning


def cfg(steps):
    # tokens per step = batch 4 x grad_accum 2 x seq_len 16 = 128
    return RunConfig(model=ModelConfig(vocab_size=300, d_model=8, n_layers=1, n_heads=1, d_ff=8, max_seq_len=64),
                     data=DataConfig(seq_len=16, vocab_size=300), train=TrainConfig(steps=steps, batch_size=4, grad_accum=2))


def test_warns_past_the_threshold_with_the_hand_worked_epoch_count():
    assert EPOCHS_WARN == 4.0
    # 25 steps x 128 tokens = 3200 tokens over 800 distinct: exactly 4.0 passes -> no warning
    assert epochs_warning(cfg(25), 800) == ""
    # 50 steps x 128 = 6400 tokens over 800: 8.0 passes
    msg = epochs_warning(cfg(50), 800)
    assert "8.0 times" in msg and "800 distinct" in msg and "6,400" not in msg and "128" in msg


def test_train_reports_the_warning_before_training(tmp_path):
    """The warning reaches ``notify`` (the CLI's stderr echo) with the run's real token count."""
    import random

    import sinklab.train.loop as loop
    from sinklab.train.config import from_dict

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
    assert said[0].startswith("warning: 20 steps x 64 tokens pass over the") and "memorise" in said[0]


def test_warmup_warning_hand_worked():
    """issue 21, item 9: `train tiny-cpu --steps 20` peaks at lr 2e-4 = 1e-3 * 20 / 100 (warm-up 100 steps),
    silently. The warning names the setting, the peak and a fix; a run at least as long as its warm-up gets none."""
    from sinklab.train.config import load_config
    from sinklab.train.loop import warmup_warning

    cfg = load_config("tiny-cpu", ["train.steps=20"])
    assert (cfg.optim.lr, cfg.optim.warmup_steps) == (1e-3, 100)
    msg = warmup_warning(cfg)
    assert msg == ("warning: train.steps = 20 is shorter than the warm-up optim.warmup_steps = 100: the learning rate "
                   "peaks at 0.0002 (20/100 of optim.lr = 0.001) and never decays; lower it, e.g. "
                   "--set optim.warmup_steps=2")
    assert warmup_warning(load_config("tiny-cpu", ["train.steps=100"])) == ""
    assert warmup_warning(load_config("tiny-cpu")) == ""


def test_train_cli_prints_the_warmup_warning_once(tmp_path, capsys):
    from conftest import run_cli_captured, synthetic_run_toml

    cfg = tmp_path / "t.toml"
    cfg.write_text(synthetic_run_toml(steps=3))  # lr 3e-3
    code, _, err = run_cli_captured(["train", str(cfg), "--out", str(tmp_path / "run"), "--no-progress",
                                     "--set", "optim.warmup_steps=10"], capsys)
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if "warm-up" in ln]
    assert lines == ["warning: train.steps = 3 is shorter than the warm-up optim.warmup_steps = 10: the learning rate "
                     "peaks at 0.0009 (3/10 of optim.lr = 0.003) and never decays; lower it, e.g. "
                     "--set optim.warmup_steps=1"]
