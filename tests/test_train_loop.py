"""Training loop: exact resume, non-finite loss, full disk, resume with a changed config, decay groups."""

import errno
import json
import random

import pytest
import torch

from sinklab.train import checkpoint as ckmod
from sinklab.train import loop
from sinklab.train import objective as objective_mod
from sinklab.errors import ConfigError, InputError
from sinklab.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from sinklab.runs.config import apply_overrides, from_dict

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    texts = root / "texts"
    texts.mkdir()
    rng = random.Random(0)
    for i in range(24):
        paras = [" ".join(rng.choice(WORDS) for _ in range(50)).capitalize() + "." for _ in range(6)]
        (texts / f"doc{i:02d}.txt").write_text("\n\n".join(paras))
    return {"texts": str(texts), "cache": str(root / "tokens")}


def make_cfg(corpus, *overrides):
    raw = {
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32},
        "data": {"corpus": corpus["texts"], "vocab_size": 280, "seq_len": 16, "val_fraction": 0.2,
                 "cache_dir": corpus["cache"]},
        "optim": {"warmup_steps": 2, "lr": 3e-3},
        "train": {"steps": 6, "batch_size": 4, "log_every": 1, "checkpoint_every": 3, "tensorboard": False},
        "track": {"every": 0, "n_probe": 4, "probe_len": 16, "positions": 2, "val_windows": 4},
    }
    return from_dict(apply_overrides(raw, list(overrides)))


def read_metrics(d):
    return [json.loads(ln) for ln in (d / "metrics.jsonl").read_text().splitlines()]


def test_resume_gives_identical_losses(corpus, tmp_path):
    cfg = make_cfg(corpus)
    straight = loop.train(cfg, tmp_path / "a", progress=False)
    assert sorted(straight.losses) == [1, 2, 3, 4, 5, 6]
    part = loop.train(cfg, tmp_path / "b", progress=False, stop_after=3)
    assert sorted(part.losses) == [1, 2, 3]
    assert not (tmp_path / "b" / "final").exists()
    rest = loop.train(cfg, tmp_path / "b", resume=True, progress=False)
    assert rest.losses == straight.losses  # every step, the first start's too; exactly equal, not approximately
    # the metrics files agree too (the resumed one has no duplicated steps)
    a = [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "a")]
    b = [(r["step"], r["loss"]) for r in read_metrics(tmp_path / "b")]
    assert a == b
    # and so do the final weights
    wa = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["model"]
    wb = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_resume_with_changed_config_names_keys(corpus, tmp_path):
    loop.train(make_cfg(corpus), tmp_path, progress=False, stop_after=3)
    with pytest.raises(ConfigError) as e:
        loop.train(make_cfg(corpus, "optim.lr=0.01", "optim.weight_decay=0.5"), tmp_path, resume=True, progress=False)
    assert "optim.lr" in str(e.value) and "optim.weight_decay" in str(e.value)
    with pytest.raises(ConfigError, match="train.steps"):  # cosine schedule depends on the step count
        loop.train(make_cfg(corpus, "train.steps=9"), tmp_path, resume=True, progress=False)
    # a fresh run may not silently overwrite it
    with pytest.raises(InputError, match="pass resume=True to continue it or choose a new out$"):
        loop.train(make_cfg(corpus), tmp_path, progress=False)


def test_resume_without_checkpoint(corpus, tmp_path):
    with pytest.raises(InputError, match="no checkpoint"):
        loop.train(make_cfg(corpus), tmp_path, resume=True, progress=False)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    # the failure is injected by call count (train runs no canonical training of a fingerprint)
    real = objective_mod.CausalObjective.loss
    calls = {"n": 0}

    def flaky(*args):
        calls["n"] += 1
        out = real(*args)
        return out * float("nan") if calls["n"] == 5 else out

    monkeypatch.setattr(objective_mod.CausalObjective, "loss", flaky)
    with pytest.raises(loop.TrainingDiverged) as e:
        loop.train(make_cfg(corpus), tmp_path, progress=False)
    msg = str(e.value)
    assert "step 5" in msg and "nan" in msg and "step 3" in msg
    ck = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ck["step"] == 3
    assert all(torch.isfinite(v).all() for v in ck["model"].values())
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_a_nan_attention_mass_on_the_probe_stops_training_as_a_divergence(corpus, tmp_path, monkeypatch):
    """A probe whose attention mass is NaN (the loss still finite) stops the run at that tracker step like a NaN loss,
    instead of logging a sink rate that counted the NaN as no sink."""
    import json

    import sinklab.metrics.summary as summary_mod

    real = summary_mod.sink_rate
    calls = {"n": 0}

    def nan_once(mass, *a, **kw):
        calls["n"] += 1
        return real(mass * float("nan") if calls["n"] == 3 else mass, *a, **kw)  # 2 calls per evaluation

    monkeypatch.setattr(summary_mod, "sink_rate", nan_once)
    with pytest.raises(loop.TrainingDiverged) as e:
        loop.train(make_cfg(corpus, "track.every=2"), tmp_path, progress=False)
    rec = json.loads((tmp_path / loop.DIVERGED_NAME).read_text())
    evaluated = [r["step"] for r in read_metrics(tmp_path) if "sink_rate" in r]
    assert rec["what"] == "attention mass on the probe" and rec["value"] == "nan" and rec["last_checkpoint"] == 3
    assert evaluated == [2] and rec["step"] == 4 and "at step 4" in str(e.value)


def test_full_disk_keeps_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"step": 1, "w": torch.ones(3)})

    def full(state, p):
        p.write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckmod, "_write", full)
    with pytest.raises(CheckpointError, match="No space left.*intact"):
        save_checkpoint(path, {"step": 2, "w": torch.zeros(3)})
    monkeypatch.undo()
    ck = load_checkpoint(path)
    assert ck["step"] == 1 and torch.equal(ck["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temp file left


def test_full_disk_during_training(corpus, tmp_path, monkeypatch):
    # the failure is injected by call count (train runs no canonical training of a fingerprint)
    real = ckmod._write
    n = {"calls": 0}

    def fail_second(state, p):
        n["calls"] += 1
        if n["calls"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(state, p)

    monkeypatch.setattr(ckmod, "_write", fail_second)
    with pytest.raises(CheckpointError, match="step 6"):
        loop.train(make_cfg(corpus), tmp_path, progress=False)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 3


def test_corpus_too_small_for_one_batch(corpus, tmp_path):
    with pytest.raises(InputError, match="fewer than one batch"):
        loop.train(make_cfg(corpus, "data.max_train_tokens=40"), tmp_path, progress=False)


def test_weight_decay_groups():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    groups = loop.param_groups(m, 0.1, "matrices")
    assert groups[0]["names"] == ["0.weight"] and groups[0]["weight_decay"] == 0.1
    assert groups[1]["names"] == ["0.bias", "1.weight", "1.bias"] and groups[1]["weight_decay"] == 0.0
    (all_,) = loop.param_groups(m, 0.1, "all")
    assert len(all_["params"]) == 4 and all_["weight_decay"] == 0.1


def test_prefix_lm_trains_and_masks(corpus, tmp_path):
    p = 5
    cfg = make_cfg(corpus, f"train.prefix_len={p}", "train.steps=2", "train.checkpoint_every=0", "track.every=2")
    res = loop.train(cfg, tmp_path, progress=False)
    assert all(torch.isfinite(torch.tensor(v)) for v in res.losses.values())
    saved = from_dict(__import__("tomllib").loads((tmp_path / "config.toml").read_text()))
    assert saved == cfg
    # the trained model's mask: inside the prefix a position sees later prefix tokens, after it nothing ahead
    from sinklab.nn.model import SinkLM

    m = SinkLM.from_pretrained(tmp_path / "final").eval()
    x = torch.randint(4, 200, (1, 16))
    y = x.clone()
    y[0, 3] = (y[0, 3] + 7) % 200  # change a prefix token (position 3 < p)
    with torch.no_grad():
        a, b = m(x, prefix_len=p).logits, m(y, prefix_len=p).logits
        c, d = m(x).logits, m(y).logits
    assert (a[0, :3] - b[0, :3]).abs().max() > 1e-6  # earlier prefix positions see position 3
    assert (c[0, :3] - d[0, :3]).abs().max() == 0  # a plain causal mask would not
    z = x.clone()
    z[0, 10] = (z[0, 10] + 7) % 200  # change a token after the prefix
    with torch.no_grad():
        e = m(z, prefix_len=p).logits
    assert (a[0, :10] - e[0, :10]).abs().max() == 0  # causal after the prefix
    # the loss covers only the targets after the prefix
    from sinklab.data.packing import IGNORE_INDEX, apply_prefix_mask

    t = apply_prefix_mask(torch.arange(16).reshape(1, 16), p)
    assert (t[0, : p - 1] == IGNORE_INDEX).all() and (t[0, p - 1 :] != IGNORE_INDEX).all()
    # the tracker probed with the prefix mask and recorded the mask-aware metric
    fin = json.loads((tmp_path / "summary.json").read_text())["final"]
    assert "sink_rate_visible" in fin and "attention_mass_first_visible" in fin

def test_ngram_source_trains_on_sampled_text_and_probes_real_text(corpus, tmp_path):
    """data.source = "ngram": the training stream is sampled (not the corpus), the validation split is
    the corpus's real held-out text, and every sampled bigram occurs in the real training text."""
    import numpy as np

    from sinklab.data.ngram import make_config

    cfg = make_cfg(corpus, 'data.source="ngram"', "data.ngram={order = 2, backoff = 0.0, n_train_docs = 40, doc_len = 30}")
    from sinklab.runs.run import prepare_data

    real = prepare_data(make_cfg(corpus), tmp_path)
    tc = prepare_data(cfg, tmp_path)
    assert tc.train.n_docs == 40 and tc.train.n_tokens == 40 * 30
    assert np.array_equal(np.asarray(tc.val.tokens), np.asarray(real.val.tokens))
    seen = set()
    for d in range(real.train.n_docs):
        doc = real.train.doc(d).tolist()
        seen.update(zip(doc, doc[1:]))
    sampled = [(a, b) for d in range(tc.train.n_docs) for a, b in zip(tc.train.doc(d).tolist(), tc.train.doc(d).tolist()[1:])]
    assert sampled and all(p in seen for p in sampled)  # order 2 without backoff: only bigrams of the text
    res = loop.train(cfg, tmp_path / "run", progress=False)
    assert sorted(res.losses) == [1, 2, 3, 4, 5, 6]
    assert make_config({"order": 2, "n_train_docs": 40, "doc_len": 30}).backoff == 0.1
