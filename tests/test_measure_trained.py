"""`sinklab measure --model RUN` for models trained by `sinklab train` (issue 12, item 2): the default
probe is the run's own held-out data in its packing; inputs that mean nothing to the model are refused
in one line."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import run_cli_captured, synthetic_run_toml, text_run_toml, train_run, word_texts
from sinklab.cli.main import app
from sinklab.errors import InputError
from sinklab.measure import measure
from sinklab.runs.config import load_config


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    texts = word_texts(tmp / "texts")
    return {
        "synthetic": train_run(tmp, "synthetic", synthetic_run_toml(steps=4)),
        "text": train_run(tmp, "text", text_run_toml(texts, packing="concat")),
        "prefix": train_run(tmp, "prefix", synthetic_run_toml(steps=2, extra="prefix_len = 4")),
        "unfinished": train_run(tmp, "unfinished", synthetic_run_toml(steps=4), stop_after=2),
        "texts": texts,
    }


_cli = run_cli_captured


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["synthetic", "text"])
def test_run_folder_is_measured_on_its_own_probe_by_default(runs, kind, tmp_path):
    run = runs[kind]
    r = measure(model=str(run), progress=False, out=tmp_path / "m")
    cfg = load_config(run / "config.toml")
    assert r.config.input == "run"
    assert (r.config.num_samples, r.config.seq_len) == (cfg.track.n_probe, cfg.track.probe_len)
    # the same probe as the run's tracker, so the same Sink_k as its last tracker record
    final = json.loads((run / "summary.json").read_text())["final"]
    assert r.sink_rate[: cfg.track.positions] == pytest.approx(final["sink_rate"], abs=1e-6)
    if cfg.data.packing == "bos":
        assert (r.probe.input_ids[:, 0] == r.probe.prefix[0]).all()
    res = json.loads((tmp_path / "m" / "results.json").read_text())
    assert res["probe"]["kind"] == "run" and res["probe"]["tracker_probe"] is True
    assert res["probe"]["packing"] == cfg.data.packing and res["probe"]["split"] == "validation"
    assert res["model"]["run"] == str(run.resolve())
    # final/ is the same model and the same probe
    r2 = measure(model=str(run / "final"), progress=False)
    assert torch.equal(r2.probe.input_ids, r.probe.input_ids) and r2.sink_rate == r.sink_rate


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--bos", "never"], ["--input", "random"], ["--input", "repeated"],
                                   ["--bos", "always", "--input", "random"]])
def test_cli_measures_a_synthetic_run_with_no_or_common_flags(runs, extra, tmp_path, capsys):
    code, out, err = _cli(["measure", "--model", str(runs["synthetic"] / "final"), "--out", str(tmp_path), *extra], capsys)
    assert code == 0, err
    assert "Traceback" not in err and (tmp_path / "results.json").exists()


def test_bos_never_keeps_the_trackers_text_without_bos(runs):
    with_bos = measure(model=str(runs["synthetic"]), progress=False)
    without = measure(model=str(runs["synthetic"]), bos="never", progress=False)
    assert torch.equal(with_bos.probe.input_ids[:, 1:], without.probe.input_ids)


@pytest.mark.parametrize("extra, expect", [
    (["--input", "natural"], "synthetic task"),
    (["--corpus", "sotu"], "synthetic task"),
    (["--input", "text", "--text", "hello world"], "cannot encode"),
    (["--num-samples", "100000"], "lower --num-samples"),
])
def test_inputs_that_make_no_sense_exit_2_in_one_line(runs, extra, expect, tmp_path, capsys):
    code, out, err = _cli(["measure", "--model", str(runs["synthetic"]), "--out", str(tmp_path), *extra], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], err


def test_text_run_takes_natural_text_from_a_corpus(runs):
    r = measure(model=str(runs["text"]), corpus=str(runs["texts"]), num_samples=4, seq_len=12, progress=False)
    assert r.config.input == "natural" and r.config.bos == "never"  # concat packing: no BOS
    assert r.probe_description()["kind"] == "natural"


def test_run_folder_without_final_says_where_final_is_expected(runs, capsys):
    run = runs["unfinished"]
    with pytest.raises(InputError) as e:
        measure(model=str(run), progress=False)
    assert str(run / "final") in str(e.value) and "--resume" in str(e.value)
    code, _, err = _cli(["measure", "--model", str(run)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "final" in err


def test_prefix_lm_run_is_measured_with_its_prefix(runs):
    from sinklab.capture import collect
    from sinklab.models import load_model

    r = measure(model=str(runs["prefix"]), progress=False)
    assert r.model["prefix_len"] == 4
    model = load_model(str(runs["prefix"] / "final")).model
    with_prefix = collect(model, r.probe.input_ids, prefix_len=4)
    causal = collect(model, r.probe.input_ids)
    assert torch.allclose(r.stats.mass, with_prefix.mass)
    assert not torch.allclose(r.stats.mass, causal.mass)
    # the results record the mask and carry the mask-aware metric beside the paper's
    assert r.summary["mask"] == {"causal": True, "prefix_len": 4, "window": None}
    assert len(r.summary["sink_rate_visible"]) == len(r.summary["sink_rate"])


def test_input_run_needs_a_training_run(tiny_model_dir):
    with pytest.raises(InputError, match="^input='run' needs a model trained by"):
        measure(model=str(tiny_model_dir), input="run", progress=False)


@pytest.mark.parametrize("packing, overrides", [
    ("concat", ["data.synthetic.doc_len=40"]),
    ("random_first", []),
    ("fixed_token", ["data.packing_position=3"]),
])
def test_every_packing_is_measurable_under_every_bos_policy(packing, overrides, tmp_path):
    run = train_run(tmp_path, packing, synthetic_run_toml(steps=2, packing=packing), *overrides)
    default = measure(model=str(run), progress=False)
    assert default.probe_description()["tracker_probe"] is True
    for bos in ("never", "always"):
        r = measure(model=str(run), bos=bos, progress=False)
        assert r.probe.input_ids.shape[1] <= 16  # never past the model's context
        bos_id = 16 + 1  # synthetic vocabulary of 16 tokens, then <|endoftext|>, <|bos|>
        assert ((r.probe.input_ids[:, 0] == bos_id).all().item()) == (bos == "always")
    for inp in ("random", "repeated"):
        assert measure(model=str(run), input=inp, progress=False).config.bos == "never"


@pytest.mark.parametrize("position, prefixed", [(0, True), (3, False)])
def test_a_fixed_first_token_is_the_prefix_the_cloze_items_are_scored_after(position, prefixed, tmp_path, monkeypatch):
    """A run trained with a fixed token (BOS) at position 0 saw it first in every window: the cloze items are scored
    after it, as a bos-packed run's are (they were scored without it); at position 3 it is inside the windows."""
    import importlib

    downstream = importlib.import_module("sinklab.measure.downstream")

    real, seen = downstream.score_cloze, []

    def spy(model, items, *, prefix=(), **kw):
        seen.append(list(prefix))
        return real(model, items, prefix=prefix, **kw)

    monkeypatch.setattr(downstream, "score_cloze", spy)
    run = train_run(tmp_path, "fixed_token", synthetic_run_toml(steps=2, packing="fixed_token"),
                 f"data.packing_position={position}")
    r = measure(model=str(run), cloze=12, progress=False)
    bos_id = 16 + 1  # synthetic vocabulary of 16 tokens, then <|endoftext|>, <|bos|>
    assert bool((r.probe.input_ids[:, position] == bos_id).all())
    assert r.probe.prefix == seen[0] == ([bos_id] if prefixed else [])


def test_a_prefix_lm_probe_with_no_target_after_the_prefix_has_no_held_out_loss(runs):
    """measure --cloze on a prefix-LM run (prefix 4) with windows of 4 tokens: the held-out loss has no target
    after the prefix. It raised after the whole measurement was done; now the loss is None and says why, and the
    sink statistics and cloze scores stand."""
    r = measure(model=str(runs["prefix"]), num_samples=4, seq_len=4, cloze=8, progress=False)
    assert r.downstream["heldout_loss"] is None
    assert r.downstream["heldout_loss_on"].startswith("not computed: windows of 4 tokens leave no target")
    assert r.downstream["cloze"]["n_items"] == 8 and len(r.sink_rate) > 0
