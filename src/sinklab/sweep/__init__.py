"""Experiment sweeps: study files, running their grids, summary tables, verdicts and the report.

* :mod:`sinklab.sweep.spec` -- parse ``experiments/NAME.toml`` into points.
* :mod:`sinklab.sweep.run` -- run a study's points (one ``sinklab train`` each, J at once, resumable).
* :mod:`sinklab.sweep.summary` -- per-sweep summary table (CSV, Markdown) and Sink_1 plot.
* :mod:`sinklab.sweep.verdict` -- agrees / disagrees / inconclusive against the paper's direction.
* :mod:`sinklab.sweep.report` -- one Markdown report over every finished sweep.
* :mod:`sinklab.sweep.dynamics` -- Sink_1, first-token mass and validation loss against step.
"""
