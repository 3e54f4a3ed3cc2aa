"""Every Result has a short repr and an HTML repr: the headline figures and where the tables are
(issue 38 part 1), not a dump of its fields."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest


def _lines(r) -> dict[str, str]:
    return {k: v for k, v in r._repr_lines()}


def test_measure_result_repr_is_short_and_says_the_figures(tiny_model_dir):
    import sinklab

    r = sinklab.measure(model=str(tiny_model_dir), input="random", num_samples=4, seq_len=16, progress=False)
    text = repr(r)
    assert len(text) < 1000, len(text)
    assert "tensor(" not in text and "input_ids" not in text
    first = text.splitlines()[0]
    assert first == f"MeasureResult: {tiny_model_dir}, input random, N=4 windows of T=16 tokens"
    rates = r.sink_rate
    assert len(rates) == 8 and _lines(r)["Sink_1..8"].startswith(", ".join(f"{v:.1f}%" for v in rates[:4]) + " (+4 more)")
    L, H = len(r.summary["attention_mass"]), len(r.summary["attention_mass"][0])
    assert _lines(r)[".table()"] == f"DataFrame per (layer, head, position): {L * H * 8} rows" == \
        f"DataFrame per (layer, head, position): {len(r.table())} rows"
    page = r._repr_html_()
    assert page.startswith("<div><strong>MeasureResult: ") and page.count("<tr>") == len(text.splitlines()) - 1
    assert "Sink_1..8" in page and "&lt;" not in first
    loaded = type(r).load(r.save(tiny_model_dir.parent / "out"))
    assert _lines(loaded)[".stats"].startswith("None") and len(repr(loaded)) < 1000


def test_every_result_kind_has_its_own_short_repr(tmp_path):
    from sinklab.analyze.common import AnalysisResult
    from sinklab.measure.compare import CompareResult
    from sinklab.result import Result
    from sinklab.streaming.run import StreamResult
    from sinklab.train.loop import TrainResult

    big = pd.DataFrame({"x": range(10_000)})
    results = [
        TrainResult(out=tmp_path, steps=3, losses={1: 4.0, 2: 3.5, 3: 3.25}, history=[{"step": 2}] * 50,
                    command="sinklab train x"),
        AnalysisResult("keybias", {"sink_share": 0.123456, "heads": list(range(500)), "note": "n" * 300},
                       {"heads": big, "layers": big.head(3)}, model={"name": "tiny"}),
        CompareResult(pd.DataFrame({"model": ["a", "b"], "num_samples": [4, 8], "seq_len": [16, 16],
                                    "probe": ["random"] * 2, "ci_low": [0.1, 0.2]}),
                      pd.DataFrame({"model": ["a"] * 4}), ["f1", "f2"], "c"),
        StreamResult({"model": "tiny", "tokens": 4096, "command": "sinklab stream",
                      "configs": [{"name": f"c{i}", "ppl": [1.0] * 1000} for i in range(3)]}),
    ]
    expect = [
        ("TrainResult: ", {"loss": "3.2500 nats at step 3", ".table()": "DataFrame of the loss by step (3 rows)",
                           ".history": "the sink tracker's records (50)"}),
        ("AnalysisResult: keybias of tiny", {"sink_share": "0.1235", ".tables[name]": "heads (10000 rows), layers (3 rows)"}),
        ("CompareResult: 2 measured models", {"models": "a, b", ".layers": "DataFrame per (model, layer) (4 rows)",
                                                "warnings": "different sample sizes N (a 4, b 8): the bars are not "
                                                            "measured alike; fewer than 20 samples for a (…"}),
        ("StreamResult", {"tokens": "4096", "configs": "3: c0, c1, c2"}),
    ]
    classes, todo = [], [Result]
    while todo:  # every subclass: Result's short repr (no dataclass repr), its own headline
        classes += todo[0].__subclasses__()
        todo = todo[1:] + todo[0].__subclasses__()
    assert {c.__name__ for c in classes} >= {"MeasureResult", "TrainResult", "AnalysisResult", "CompareResult",
                                             "DictResult", "StreamResult", "PasskeyResult"}
    for c in classes:
        assert c.__repr__ is Result.__repr__ and c._repr_html_ is Result._repr_html_, c
        assert c.headline is not Result.headline and c.guide is not Result.guide, c
    for r, (title, rows) in zip(results, expect):
        text = repr(r)
        assert text.startswith(title) and len(text) < 1000, (type(r), len(text))
        got = _lines(r)
        for k, v in rows.items():
            assert got[k] == v, (type(r), k, got[k])
        assert all(len(v) <= 100 for v in got.values())
        assert "<strong>" in r._repr_html_()
    assert isinstance(results[0].table(), pd.DataFrame)  # .table() stays
