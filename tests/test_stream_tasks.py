"""The long-context tasks as streaming tasks (sinklab.streaming.longctx): ``sinklab stream needle | ruler``
and ``sinklab.stream(..., task="needle")``.

References: the Python call against :func:`sinklab.streaming.tasks.evaluate_items` called directly on the
same items (same outputs, scores); the accuracy files against counts of the per-item rows. The options
against the command line they record, parsed back by the CLI: tests/test_cli_grammar.py.
"""

from __future__ import annotations

import json
import shlex

import pandas as pd
import pytest

from helpers import char_tokenizer, run_cli_captured
from sinklab.errors import InputError
from sinklab.metrics import wilson_interval

DOCS = ["The sink token is the first one. It takes the attention of many heads! Why? Nobody knows for sure.",
        "A second document, with more words in it than the first. Words like apple, river, window and garden.",
        "And a third one to fill the stream up to its length. It ends here."] * 6


@pytest.fixture
def char_model(tmp_path):
    """(folder of a random LLaMA over the character tokenizer, context 2048, saved with it; a corpus folder)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import torch

    tok = char_tokenizer()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2)
    d = tmp_path / "char-llama"
    LlamaForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    corpus = tmp_path / "docs"
    corpus.mkdir()
    for i, text in enumerate(DOCS):
        (corpus / f"doc{i:02d}.txt").write_text(text)
    return d, corpus


def test_python_call_equals_evaluate_items_on_the_same_items(char_model):
    from sinklab.models import load_model
    from sinklab.streaming import NeedleOptions, stream
    from sinklab.streaming.harness import policy_specs
    from sinklab.streaming.tasks import evaluate_items, make_items
    from sinklab.zoo.corpora import load_corpus

    d, corpus = char_model
    opts = NeedleOptions(corpus=str(corpus), lengths=(200,), depths=(0.0, 1.0), items=2, policies=("sinks", "snapkv"),
                         budgets=(64,), n_sink=2, max_new_tokens=4)
    res = stream(str(d), task="needle", options=opts, progress=False)
    assert [c["name"] for c in res["configs"]] == ["full", "sinks@64", "snapkv@64"]
    got = res.items_frame()
    assert len(got) == 3 * 4 and res["command"] == opts.command_line(str(d))

    loaded = load_model(str(d))
    items = make_items(["needle"], loaded.tokenizer, load_corpus(str(corpus)).documents, lengths=[200],
                       depths=[0.0, 1.0], n=2, seed=0, corpus_name=load_corpus(str(corpus)).name)
    specs = policy_specs(["sinks", "snapkv"], [64], n_sink=2, full=True, recompute=False)
    for s in specs:
        ref = evaluate_items(loaded.model, loaded.tokenizer, items, None if s.kind == "full" else s, 4)
        mine = got[got["config"] == s.name].reset_index(drop=True)
        assert list(mine["output"]) == list(ref["output"]), s.name
        assert list(mine["answers"]) == list(ref["answers"]) and list(mine["score"]) == list(ref["score"])
        assert list(mine["chunk"]) == list(ref["chunk"]) == [200 if s.kind == "full" else s.budget - s.n_sink] * 4
    # headline: accuracy per configuration, with the Wilson interval of its counts
    for c in res["configs"]:
        k = int(got.loc[got["config"] == c["name"], "correct"].sum())
        assert (c["correct"], c["n"]) == (k, 4)
        assert (c["ci_low"], c["ci_high"]) == pytest.approx(wilson_interval(k, 4))
    assert "snapkv@64" in repr(res) and "accuracy" in repr(res)
    table = res.table()
    assert set(table["config"]) == {"full", "sinks@64", "snapkv@64"} and table["n"].tolist() == [2] * 6


def test_cli_needle_writes_the_files_and_resumes(char_model, tmp_path, capsys):
    d, corpus = char_model
    out = tmp_path / "needle"
    argv = ["stream", "needle", "--model", str(d), "--corpus", str(corpus), "--lengths", "180", "--depths", "0.0,1.0",
            "--items", "2", "--max-new-tokens", "3", "--policy", "sinks", "--budget", "48", "--n-sink", "2",
            "--out", str(out)]
    code, stdout, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    data = json.loads((out / "tasks.json").read_text())
    assert data["command"] == shlex.join(["sinklab", "stream", "needle", "--model", str(d)] + argv[4:-2]
                                         + ["--out", str(out)])
    rows = pd.read_csv(out / "items.csv", dtype={"answers": str, "output": str})
    assert len(rows) == 2 * 2 * 2 and set(rows["config"]) == {"full", "sinks@48"}
    acc = pd.read_csv(out / "accuracy.csv")
    assert len(acc) == 2 * 2
    for (cfg, depth), g in rows.groupby(["config", "depth"]):
        a = acc[(acc["config"] == cfg) & (acc["depth"] == depth)].iloc[0]
        k = int(g["correct"].sum())
        assert (a["correct"], a["n"]) == (k, 2)
        assert (a["ci_low"], a["ci_high"]) == pytest.approx(wilson_interval(k, 2))
    assert (out / "heatmap.png").stat().st_size > 0 and "sinks@48" in stdout
    code, _, err = run_cli_captured(argv, capsys)  # again: every configuration kept, not computed again
    assert code == 0, err
    again = json.loads((out / "tasks.json").read_text())
    assert [c["wall_s"] for c in again["configs"]] == [c["wall_s"] for c in data["configs"]]


def test_needle_resume_reruns_under_another_n_sink(char_model, tmp_path, capsys):
    """The long-context tasks' resume key left out the policies' n_sink and kv group (their configuration names do
    too) and a model in memory's weights: a rerun with --n-sink 4 into the same folder returned the --n-sink 2 rows
    under the new command (outside audit of the pass key task, 2026-12-07; the same key here). Now it recomputes."""
    d, corpus = char_model
    out = tmp_path / "needle"
    argv = ["stream", "needle", "--model", str(d), "--corpus", str(corpus), "--lengths", "180", "--depths", "0.0",
            "--items", "1", "--max-new-tokens", "2", "--no-full", "--policy", "sinks", "--budget", "48",
            "--out", str(out)]
    assert run_cli_captured([*argv, "--n-sink", "2"], capsys)[0] == 0
    first = json.loads((out / "tasks.json").read_text())
    assert run_cli_captured([*argv, "--n-sink", "4"], capsys)[0] == 0
    second = json.loads((out / "tasks.json").read_text())
    assert [c["wall_s"] for c in second["configs"]] != [c["wall_s"] for c in first["configs"]]  # computed again
    assert second["n_sink_policies"] == 4 and "--n-sink" not in second["command"]  # 4 is the default


def test_cli_ruler_runs_its_subtasks(char_model, tmp_path, capsys):
    d, corpus = char_model
    out = tmp_path / "ruler"
    argv = ["stream", "ruler", "--model", str(d), "--corpus", str(corpus), "--lengths", "400", "--depths", "0.5",
            "--items", "1", "--tasks", "niah_single,niah_multikey", "--no-full", "--policy", "window",
            "--budget", "64", "--max-new-tokens", "2", "--out", str(out)]
    code, _, err = run_cli_captured(argv, capsys)
    assert code == 0, err
    rows = pd.read_csv(out / "items.csv")
    assert list(rows["task"]) == ["niah_single", "niah_multikey"] and set(rows["config"]) == {"window@64"}
    (cfg,) = json.loads((out / "tasks.json").read_text())["configs"]
    assert cfg["task_scores"] == {t: pytest.approx(float(rows[rows.task == t]["score"].mean()))
                                  for t in ("niah_multikey", "niah_single")}
    assert cfg["ruler_score"] == pytest.approx(sum(cfg["task_scores"].values()) / 2)


def test_ruler_style_score_is_the_mean_over_tasks_of_partial_credit():
    """RULER scores an item by the share of its answers found and averages per task, then over tasks; sinklab's
    accuracy is all-or-nothing over pooled items (outside audit, 2026-12-07: the two differ, e.g. 0.323 against
    0.407 for the full cache of the committed ruler study). Hand-worked: a 4-value item with 3 found scores 0.75
    (incorrect), a task with 3 items weighs as much as one with 1."""
    from sinklab.streaming.tasks.scoring import accuracy_table, task_scores

    rows = pd.DataFrame({"config": ["full"] * 4, "task": ["niah_multivalue", "niah_single", "niah_single",
                                                          "niah_single"],
                         "score": [0.75, 1.0, 0.0, 1.0], "correct": [False, True, False, True]})
    got = task_scores(rows)["full"]
    assert got["tasks"] == {"niah_multivalue": 0.75, "niah_single": pytest.approx(2 / 3)}
    assert got["score"] == pytest.approx((0.75 + 2 / 3) / 2)
    assert accuracy_table(rows, by=("config",))["accuracy"].item() == 0.5  # 2 of 4 items fully right


def test_ruler_default_subtasks_are_the_suites():
    from sinklab.streaming.options import RULER_SUBTASKS, RulerOptions
    from sinklab.streaming.tasks import RULER_TASKS

    assert RULER_SUBTASKS == tuple(RULER_TASKS) and RulerOptions().tasks == tuple(RULER_TASKS)


def test_refusals_name_the_option(char_model):
    from sinklab.streaming import NeedleOptions, stream

    d, corpus = char_model
    with pytest.raises(InputError, match="budgets.*need.*policies"):
        stream(str(d), task="needle", options=NeedleOptions(corpus=str(corpus), budgets=(64,)), progress=False)
    with pytest.raises(InputError, match="nothing to evaluate"):
        stream(str(d), task="needle", options=NeedleOptions(corpus=str(corpus), full=False), progress=False)
    with pytest.raises(InputError, match="items"):
        stream(str(d), task="needle", corpus=str(corpus), items=0, progress=False)
    with pytest.raises(InputError, match="tokens.*not an option of the needle task"):
        stream(str(d), task="needle", tokens=64, progress=False)
