"""``sinklab train`` warns when a run passes over its distinct training tokens more than a few times."""

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


def test_cli_prints_the_warning(tmp_path, capsys):
    import random

    from conftest import run_cli_captured

    texts = tmp_path / "t"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(6):
        (texts / f"d{i}.txt").write_text(" ".join(rng.choice("a b c the of and".split()) for _ in range(40)))
    sets = [f"data.corpus={str(texts)!r}".replace("'", '"'), "data.vocab_size=280", "data.seq_len=16", "data.val_fraction=0.34",
            "model.d_model=8", "model.n_layers=1", "model.n_heads=1", "model.d_ff=8", "train.batch_size=4",
            "train.tensorboard=false", "train.device=\"cpu\"", "track.n_probe=2", "track.probe_len=16", "track.positions=2",
            "track.val_windows=2"]
    argv = ["train", "tiny-cpu", "--out", str(tmp_path / "run"), "--steps", "20", "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    assert "warning: 20 steps x 64 tokens pass over the" in err and "memorise" in err
