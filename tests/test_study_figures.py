"""The study figures read back: ``sink_rate.png`` (:func:`sinklab.sweep.summary.plot_sweep`) names the position a row
rates, and ``dynamics.png`` / ``stability.png`` (:mod:`sinklab.sweep.dynamics`) draw no two rows alike."""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from sinklab.sweep import dynamics  # noqa: E402
from sinklab.sweep.summary import plot_sweep  # noqa: E402


def _figures(monkeypatch) -> list:
    figs: list = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: figs.append(self))
    return figs


def test_sweep_plot_marks_the_rows_that_rate_another_position(monkeypatch, tmp_path):
    """first_token's rows "fixed token at 2 / 3" plot the sink rate at position 2 / 3 (``sink1_mean`` of a row is
    its Sink_k): the axis said "Sink_1 (%)" for all of them (outside audit, 2026-12-07). The points equal the rows'
    means; the ticks name Sink_k where k != 1 and the axis says the rate is the row's position's."""
    pts = [{"label": "bos", "token": 1}, {"label": "fixed token at 2", "token": 2},
           {"label": "fixed token at 3", "token": 3}]
    rows = [{"label": p["label"], "sink_token": p["token"], "sink1_mean": m, "sink1_std": 1.0,
             "sink1_seeds": f"{m - 1};{m + 1}", "paper": None} for p, m in zip(pts, (80.0, 60.0, 40.0))]
    figs = _figures(monkeypatch)
    plot_sweep({"name": "first_token", "points": pts, "sweep_keys": []}, rows, tmp_path / "s.png", 10.0)
    ax = figs[0].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bos", "fixed token at 2 (Sink_2)",
                                                            "fixed token at 3 (Sink_3)"]
    assert "row's position" in ax.get_ylabel() and "Sink_1 (%)" != ax.get_ylabel()
    means = next(c for c in ax.containers if c.get_label().startswith("sinklab"))
    assert list(means.lines[0].get_ydata()) == [80.0, 60.0, 40.0]
    figs.clear()
    plot_sweep({"name": "x", "points": pts[:1], "sweep_keys": []}, rows[:1], tmp_path / "t.png", 10.0)
    assert figs[0].axes[0].get_ylabel() == "Sink_1 (%)"


@pytest.mark.parametrize("figure", ["dynamics", "stability"])
def test_every_row_of_a_study_is_drawn_in_its_own_style(figure, monkeypatch, tmp_path):
    """attention_operation has 21 rows: tab20's colour i mod 20 gave row 0 (softmax) and row 20 (differential
    attention) the same solid blue line (outside audit, 2026-12-07). Every labelled line now differs from every other
    in colour or line style."""
    n = 21
    pts = [{"label": f"op{i}", "slug": f"op{i}"} for i in range(n)]
    recs = [{"step": s, "sink_rate": [10.0 * s], "attention_mass_first": 0.1, "val_loss": 3.0, "loss": 3.0,
             "grad_norm": 1.0} for s in (1, 2)]
    monkeypatch.setattr(dynamics, "seed_runs", lambda folder: [folder / "seed0"])
    monkeypatch.setattr(dynamics, "tracker_records", lambda run: recs)
    if figure == "stability":
        for p in pts:
            d = dynamics.runs_dir(tmp_path) / p["slug"] / "seed0"
            d.mkdir(parents=True)
            (d / "metrics.jsonl").write_text("\n".join(__import__("json").dumps(r) for r in recs))
    figs = _figures(monkeypatch)
    study = {"name": "s", "points": pts}
    (dynamics.study_dynamics if figure == "dynamics" else dynamics.study_stability)(tmp_path, study)
    lines = [ln for ln in figs[0].axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert len(lines) == n
    styles = {(matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle()) for ln in lines}
    assert len(styles) == n


def test_dynamics_of_a_window_run_draws_its_mask_aware_rate(monkeypatch, tmp_path):
    """`sinklab dynamics` drew the plain Sink_1 of every run: a sliding-window run showed 0% where its tracker held a
    mask-aware 100% (outside audit, 2026-12-07; the study figures draw the mask-aware one). A run whose mask hides keys
    is now drawn with its mask-aware rate and mass, marked in the legend; a plain run as before."""
    import json

    def run(name, plain, visible, mass, mass_vis):
        d = tmp_path / name
        d.mkdir()
        lines = [{"step": s, "sink_rate": [p], "sink_rate_visible": [v], "attention_mass_first": m,
                  "attention_mass_first_visible": mv, "val_loss": 3.0}
                 for s, p, v, m, mv in zip((10, 20), plain, visible, mass, mass_vis)]
        (d / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
        return d

    runs = {"full": run("full", [20.0, 30.0], [20.0, 30.0], [0.2, 0.3], [0.2, 0.3]),
            "w 4": run("w4", [0.0, 0.0], [90.0, 100.0], [0.1, 0.13], [0.4, 0.52]),
            # a window run with no sink anywhere: only its masses tell the mask apart (outside review, 2026-12-07)
            "w 2": run("w2", [0.0, 0.0], [0.0, 0.0], [0.02, 0.02], [0.09, 0.09])}
    figs = _figures(monkeypatch)
    dynamics.plot_dynamics(runs, tmp_path / "d.png")
    rate_ax, mass_ax = figs[0].axes[:2]
    got = {ln.get_label(): list(ln.get_ydata()) for ln in rate_ax.get_lines() if not ln.get_label().startswith("_")}
    assert got == {"full": [20.0, 30.0], "w 4 (mask-aware)": [90.0, 100.0], "w 2 (mask-aware)": [0.0, 0.0]}
    masses = {ln.get_label(): list(ln.get_ydata()) for ln in mass_ax.get_lines()}
    assert masses["w 4 (mask-aware)"] == [0.4, 0.52] and masses["full"] == [0.2, 0.3]
    assert masses["w 2 (mask-aware)"] == [0.09, 0.09]
    assert "mask-aware" in rate_ax.get_ylabel()
