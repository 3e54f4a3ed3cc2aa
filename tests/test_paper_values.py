"""experiments/paper_values.toml is the one place the paper's values live: every paper value of a study
file is listed there under "study/label" with the same number and a source, every entry is used, and no
study file points outside the repository for its values."""

from pathlib import Path

import pytest

from sinklab.fileio import read_toml
from sinklab.sweep.spec import load_study

EXP = Path(__file__).resolve().parent.parent / "experiments"


def _values():
    return read_toml(EXP / "paper_values.toml", "paper values")["value"]


def test_every_study_paper_value_is_listed_with_its_source():
    listed = {}
    for v in _values():
        assert v["source"].strip() and v["what"].strip(), v["id"]
        for use in v["used_by"]:
            assert use not in listed, f"{use} listed twice"
            listed[use] = v
    used = set()
    for f in sorted(EXP.glob("*.toml")):
        if f.name == "paper_values.toml":
            continue
        study = load_study(f)
        assert "shared/" not in study.paper_source and "shared/" not in study.note, f.name
        for p in study.points:
            if p.paper is None:
                continue
            key = f"{study.name}/{p.label}"
            assert key in listed, f"{key}: paper value {p.paper} not in experiments/paper_values.toml"
            assert p.paper == pytest.approx(listed[key]["value"], abs=1e-9), key
            used.add(key)
    assert set(listed) == used, f"entries no study uses: {sorted(set(listed) - used)}"


def test_the_elu_row_is_the_similarity_form():
    """The paper's 0.80* is elu(q.k/sqrt(d))+1 without normalisation (its similarity model); the kernel
    form elu1 without normalisation failed to train in the paper and carries no paper value."""
    study = load_study(EXP / "attention_operation.toml")
    by = {p.label: p for p in study.points}
    assert by["elu+1 similarity (no norm)"].overrides["model.attention"] == "elu1_sim"
    assert by["elu+1 similarity (no norm)"].paper == 0.80
    kernel = by["elu+1 kernel (no norm)"]
    assert kernel.overrides["model.attention"] == "elu1" and kernel.paper is None and kernel.expect_by == "ours"
    assert kernel.slug == "elu_1_no_norm"  # keeps the runs trained under its old label
