"""Issue 20, items 4, 5 and 7 (analyze): the intervention and analysis registries, each intervention against
a hand-worked case, ``sinklab analyze KIND`` subcommands with only their own options, defaults taken from a
trained run, and one ``Result`` (save / load / table / command) for every feature."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import run_cli_captured, synthetic_run_toml, tiny_llama
from sinklab.analyze import ANALYSES, INTERVENTIONS, Subject, intervene
from sinklab.analyze.common import run_model
from sinklab.analyze.interventions import Intervention, Target
from sinklab.errors import UnknownNameError
from sinklab.nn.config import ModelConfig
from sinklab.nn.model import SinkLM


def _target(**kw) -> Target:
    base = dict(position=0, layers=[0], num_layers=2)
    base.update(kw)
    return Target(**base)


# ------------------------------------------------------------------ the intervention registry
def test_the_nine_interventions_are_registered_in_order_each_with_its_formula():
    assert INTERVENTIONS.names() == ["noop", "remove-sink", "massive-zero", "massive-mean", "massive-samplemean",
                                     "drop-first", "replace-first", "position-replace", "position-swap"]
    for name in INTERVENTIONS:
        cls = INTERVENTIONS.get(name)
        assert issubclass(cls, Intervention) and cls.name == name
        assert INTERVENTIONS.describe(name), name  # the docstring's first line: its formula
    with pytest.raises(UnknownNameError, match="unknown intervention 'remove-snk'.*remove-sink"):
        INTERVENTIONS.get("remove-snk")


def test_noop_returns_the_weights_themselves():
    w = torch.rand(1, 2, 3, 3)
    assert INTERVENTIONS.get("noop")(_target()).attention(0, w) is w


def test_remove_sink_hand_worked():
    """Row [0.5, 0.25, 0.25] without key 0, renormalised to its total 1: [0, 0.5, 0.5]; row [1, 0, 0] (all on
    key 0) and row [0, 0.6, 0.4] (nothing on it) stay; a layer outside ``layers`` gets no edit (None)."""
    w = torch.tensor([[[[1.0, 0.0, 0.0], [0.0, 0.6, 0.4], [0.5, 0.25, 0.25]]]])  # (1, 1, 3, 3)
    iv = INTERVENTIONS.get("remove-sink")(_target(layers=[1]))
    assert iv.attention(0, w) is None
    new = iv.attention(1, w)
    assert torch.equal(new[0, 0], torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.6, 0.4], [0.0, 0.5, 0.5]]))
    assert iv.note() == "attention to position 0 removed and rows renormalised in layers [1]"
    assert INTERVENTIONS.get("remove-sink")(_target(layers=[0, 1])).note().endswith("in layers all")


def test_massive_ablations_hand_worked():
    """h (2 samples, 3 positions, 2 dims), the sink at position 1, dim 1 at layer 0:
    zero -> 0; mean over the sample's other tokens -> (h[n,0,1] + h[n,2,1]) / 2; samplemean -> the given mean."""
    h = torch.tensor([[[1.0, 2.0], [3.0, 40.0], [5.0, 6.0]],
                      [[7.0, 8.0], [9.0, 80.0], [11.0, 12.0]]])
    t = _target(position=1, massive_layer=0, dims=[1], sample_mean=torch.tensor([60.0]))
    zero = INTERVENTIONS.get("massive-zero")(t).hidden(0, h)
    mean = INTERVENTIONS.get("massive-mean")(t).hidden(0, h)
    smean = INTERVENTIONS.get("massive-samplemean")(t).hidden(0, h)
    assert zero[:, 1, 1].tolist() == [0.0, 0.0]
    assert mean[:, 1, 1].tolist() == [4.0, 10.0]  # (2 + 6) / 2, (8 + 12) / 2
    assert smean[:, 1, 1].tolist() == [60.0, 60.0]
    for new in (zero, mean, smean):  # every other cell untouched, the input not modified in place
        keep = torch.ones_like(h, dtype=torch.bool)
        keep[:, 1, 1] = False
        assert torch.equal(new[keep], h[keep])
    assert h[0, 1, 1] == 40.0
    assert INTERVENTIONS.get("massive-zero")(t).hidden(1, h) is None  # another layer: no edit


def test_drop_and_replace_first_hand_worked():
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    drop = INTERVENTIONS.get("drop-first")(_target())
    assert drop.drops_first and drop.needs_lm and drop.inputs(ids).tolist() == [[6, 7], [9, 10]]
    assert INTERVENTIONS.get("replace-first")(_target(token=3)).inputs(ids).tolist() == [[3, 6, 7], [3, 9, 10]]
    rnd = INTERVENTIONS.get("replace-first")(_target(vocab=50, seed=4)).inputs(ids)
    want = torch.randint(0, 50, (2,), generator=torch.Generator().manual_seed(4))
    assert rnd[:, 0].tolist() == want.tolist() and rnd[:, 1:].tolist() == [[6, 7], [9, 10]]
    assert ids[:, 0].tolist() == [5, 8]  # not modified in place


def _learned_sinklm():
    torch.manual_seed(0)
    return SinkLM(ModelConfig(vocab_size=80, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16,
                              positional="learned")).eval()


@pytest.mark.parametrize("name", ["position-replace", "position-swap"])
def test_position_interventions_swap_the_table_rows_and_restore_them(name):
    m = _learned_sinklm()
    before = m.positional.table.weight.detach().clone()
    iv = INTERVENTIONS.get(name)(_target(swap_to=3))
    seen = {}

    def run(ids, *, edit, hidden_edit, first_dropped):
        seen["table"] = m.positional.table.weight.detach().clone()
        return run_model(m, ids, edit=edit, hidden_edit=hidden_edit)

    ids = torch.randint(0, 80, (2, 8), generator=torch.Generator().manual_seed(0))
    res = iv.apply(m, ids, run)
    want = before.clone()
    want[0] = before[3]
    if name == "position-swap":
        want[3] = before[0]
    assert torch.equal(seen["table"], want)
    assert torch.equal(m.positional.table.weight, before)  # restored
    # the row's extra column is the sink rate at t of the edited pass: a naive recomputation from its mass
    mass = res.stats.mass.double()  # (N, L, H, T)
    naive = float((mass[..., 3] > 0.3).double().mean() * 100)
    assert iv.describe(res, 0.3)["sink_rate_swap_to"] == pytest.approx(naive, abs=1e-9)


def test_apply_passes_only_the_overridden_edits():
    calls = []

    def run(ids, *, edit, hidden_edit, first_dropped):
        calls.append((ids.shape, edit is not None, hidden_edit is not None, first_dropped))

    ids = torch.zeros(2, 5, dtype=torch.int64)
    t = _target(massive_layer=0, dims=[0], sample_mean=torch.zeros(1))
    for name in ("noop", "massive-zero", "drop-first"):
        INTERVENTIONS.get(name)(t).apply(None, ids, run)
    assert calls == [((2, 5), True, False, False), ((2, 5), False, True, False), ((2, 4), False, False, True)]


def test_intervene_rows_follow_the_registry_order_and_remove_sink_matches_a_manual_edit():
    """``only`` in reverse order gives rows in registry order; remove-sink's loss equals a pass with the
    hand-written edit ``remove_key`` in every layer (the value computed without the class)."""
    from sinklab.analyze.interventions import remove_key

    m = tiny_llama()
    ids = torch.randint(0, 80, (3, 10), generator=torch.Generator().manual_seed(0))
    res = intervene(Subject(m, ids, model_info={"name": "t"}), eps=0.05, position=0, allow_non_sink=True,
                    only=["remove-sink", "noop"])
    t = res.tables["interventions"]
    assert t["intervention"].tolist() == ["baseline", "noop", "remove-sink"]
    ref = run_model(m, ids, edit=lambda l, w, **_: remove_key(w, 0), nll=True)
    assert float(t.set_index("intervention").loc["remove-sink", "loss"]) == pytest.approx(float(ref.nll[:, 1:].mean()),
                                                                                          abs=1e-9)


# ------------------------------------------------------------------ the analysis registry and its subcommands
def test_every_analysis_is_registered_with_a_help_line_for_each_of_its_own_options():
    import inspect

    assert ANALYSES.names() == ["massive", "keybias", "intervene", "overmix", "repeat", "denoise", "attention", "depth", "frames"]
    common = {"model", "corpus", "num_samples", "seq_len", "seed", "eps", "batch_size", "device", "dtype", "device_map"}
    for name in ANALYSES:
        fn = ANALYSES.get(name)
        own = set(inspect.signature(fn).parameters) - common
        assert own == set(fn.cli_help), (name, own ^ set(fn.cli_help))
        assert inspect.signature(fn).parameters["seq_len"].default is None  # T from a run, else 64


def test_each_subcommand_has_only_its_own_options(capsys):
    from sinklab.cli import analyze_cmd

    flags = {}
    for kind, fn in analyze_cmd.commands().items():
        import inspect

        flags[kind] = set(inspect.signature(fn).parameters)
    common = {"model", "corpus", "num_samples", "seq_len", "seed", "eps", "batch_size", "out", "device", "dtype",
              "device_map", "threads"}
    assert all(common <= f for f in flags.values())
    assert flags["massive"] - common == {"top_k", "massive_ratio"}
    assert flags["denoise"] - common == {"steps", "prompt_len", "temperature", "mask_id", "sink_level"}
    code, out, _ = run_cli_captured(["analyze", "massive", "--help"], capsys)
    assert code == 0 and "--top-k" in out and "--steps" not in out and "--only" not in out


def test_analyze_massive_on_a_16_token_run_takes_its_defaults_from_the_run(tmp_path, monkeypatch, capsys):
    """`sinklab analyze massive --model RUN` with no other flag, on a run trained with data.seq_len = 16:
    T is the run's probe length (16), and the result equals the explicit `-t 16` one; the old fixed
    T = 64 is past that model's context."""
    from sinklab.analyze import massive
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    f = tmp_path / "run.toml"
    f.write_text(synthetic_run_toml(steps=4))
    run = tmp_path / "run"
    loop.train(load_config(f), run, progress=False)
    monkeypatch.chdir(tmp_path)  # the default --out, runs/analyze/massive, lands here
    code, stdout, err = run_cli_captured(["analyze", "massive", "--model", str(run)], capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "runs/analyze/massive/analysis.json").read_text())
    assert data["settings"]["seq_len"] == 16 and data["summary"]["seq_len"] == 16
    assert data["command"] == f"sinklab analyze massive --model {run}"  # as typed
    explicit = massive(str(run), seq_len=16)
    assert data["summary"]["max_ratio"] == pytest.approx(explicit.summary["max_ratio"], abs=1e-6)
    assert data["tables"]["layers"]["median"] == pytest.approx(explicit.tables["layers"]["median"].tolist(), abs=1e-6)
    code, _, err = run_cli_captured(["analyze", "massive", "--model", str(run), "-t", "64", "--out",
                                     str(tmp_path / "m64")], capsys)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------ one Result
def test_analysis_result_saves_and_loads_back(tmp_path):
    from sinklab.analyze import AnalysisResult, attention

    m = tiny_llama()
    ids = torch.randint(0, 80, (1, 8), generator=torch.Generator().manual_seed(0))
    res = attention(Subject(m, ids, model_info={"name": "t"}), layers=[0], heads=[1])
    res.save(tmp_path / "a")
    back = AnalysisResult.load(tmp_path / "a")
    assert back.kind == "attention" and back.command == res.command and back.command.startswith("python: ")
    assert back.summary["lowest_entropy_head"] == pytest.approx(res.summary["lowest_entropy_head"])
    assert back.table()["attention_entropy"].tolist() == res.table()["attention_entropy"].tolist()  # every digit
    assert back.csv_only == ("weights",) and len(back.tables["weights"]) == len(res.tables["weights"])
    assert AnalysisResult.load(tmp_path / "a" / "analysis.json").kind == "attention"  # the file works too


def test_an_analysis_reads_back_small_values_exactly(tmp_path):
    """analysis.json kept 6 decimals: an overmix sensitivity of 1.0834e-5 came back as 1.1e-5, 3e-7 as 0."""
    import pandas as pd

    from sinklab.analyze import AnalysisResult

    vals = [1.0834171234e-05, 3.0e-7, 0.1000145, -2.5e-12, 123456.789012345]
    res = AnalysisResult(kind="overmix", summary={"sensitivity": vals[0], "nan": float("nan")},
                         tables={"t": pd.DataFrame({"layer": range(5), "value": vals})}, settings={}, model="m")
    res.save(tmp_path / "a")
    back = AnalysisResult.load(tmp_path / "a")
    assert back.table()["value"].tolist() == vals and back.summary["sensitivity"] == vals[0]
    assert back.summary["nan"] is None  # NaN is written as JSON null


def test_measure_result_loads_back_with_the_same_table(tiny_model_dir, text_corpus_dir, tmp_path):
    from sinklab.measure import measure
    from sinklab.measure.run import MeasureResult
    from sinklab.result import Result

    r = measure(model=str(tiny_model_dir), corpus=str(text_corpus_dir), num_samples=4, seq_len=10, positions=3,
                out=tmp_path / "m", progress=False)
    back = MeasureResult.load(tmp_path / "m")
    assert isinstance(back, Result) and back.stats is None
    assert back.command == r.command == r.config.command()  # a Python call: the command of its settings
    assert back.sink_rate == pytest.approx(r.sink_rate)
    a, b = r.table(), back.table()
    assert list(a.columns) == list(b.columns) and a["attention_mass"].tolist() == pytest.approx(b["attention_mass"].tolist())


def test_the_cli_records_the_command_as_typed(tiny_model_dir, text_corpus_dir, tmp_path, capsys):
    out = tmp_path / "m"
    argv = ["measure", "--model", str(tiny_model_dir), "--corpus", str(text_corpus_dir), "-n", "3", "-t", "9",
            "--out", str(out)]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    assert json.loads((out / "results.json").read_text())["command"] == "sinklab " + " ".join(argv)
    import shutil

    out2 = tmp_path / "m2"  # (the same folder twice is refused)
    shutil.copytree(out, out2)
    code, _, err = run_cli_captured(["compare", str(out), str(out2), "--out", str(tmp_path / "c")], capsys)
    assert code == 0, err
    from sinklab.measure.compare import CompareResult

    c = CompareResult.load(tmp_path / "c")
    assert c.command == f"sinklab compare {out} {out2} --out {tmp_path / 'c'}"
    assert c.table()["num_samples"].tolist() == [3, 3]


def test_train_result_round_trip(tmp_path):
    from sinklab.train import loop
    from sinklab.runs.config import load_config

    f = tmp_path / "run.toml"
    f.write_text(synthetic_run_toml(steps=2))
    res = loop.train(load_config(f), tmp_path / "run", progress=False)
    res.save(tmp_path / "saved")
    back = loop.TrainResult.load(tmp_path / "saved")
    assert back.losses == res.losses and back.steps == 2 and back.out == res.out
    assert back.table()["loss"].tolist() == [res.losses[1], res.losses[2]]
    # the run folder holds its result too, with the call that made it and the versions
    import sinklab

    in_run = loop.TrainResult.load(tmp_path / "run")
    assert in_run.losses == res.losses and in_run.command == f"python: sinklab.train.train(config, {str(tmp_path / 'run')!r})"
    assert in_run.versions["sinklab"] == sinklab.__version__
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["command"] == in_run.command and summary["versions"] == in_run.versions


def test_stream_result_is_its_json_and_a_result(tiny_model_dir, text_corpus_dir, tmp_path):
    from sinklab.result import Result
    from sinklab.streaming import stream
    from sinklab.streaming.run import StreamResult

    res = stream(str(tiny_model_dir), str(text_corpus_dir), tokens=40, window=8, sinks=[1], progress=False,
                 recompute=False)
    assert not (tmp_path / "s").exists()  # the evaluator writes nothing
    res.save(tmp_path / "s")
    on_disk = json.loads((tmp_path / "s" / "stream.json").read_text())
    assert isinstance(res, Result) and dict(res) == on_disk and res.command == on_disk["command"]
    assert res.table()["name"].tolist() == [c["name"] for c in on_disk["configs"]]
    assert dict(StreamResult.load(tmp_path / "s")) == on_disk
