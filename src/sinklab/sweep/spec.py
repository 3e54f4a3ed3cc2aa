"""Study files (``experiments/NAME.toml``): a base config plus the settings to sweep.

A study file::

    name = "weight_decay"                  # folder name under results/
    title = "Weight decay"
    section = "loss"                       # the paper's section (optimisation, data, loss, architecture)
    base = "emergence-cpu"                 # a preset name or a config path (relative to the study file)
    set = { "train.steps" = 1500 }         # overrides applied to every point (optional)
    seeds = 5                              # training seeds per point; CLI --seeds wins
    first_seed = 100                       # train.seed = first_seed .. first_seed + S - 1 (default 0);
                                           # keep them disjoint from the seeds a regime was chosen on
    metric = "paper"                       # Sink_1 the verdicts use: "paper" or "visible" (mask-aware)
    paper_source = "Gu et al. 2025, Table 3 (60M LLaMA, 5B tokens)"
    note = "..."

    # either a grid: the cartesian product of the listed keys
    [sweep]
    "optim.weight_decay" = [0.0, 0.1, 0.5, 1.0, 2.0]

    # paper values and expectations per setting (label -> table), optional
    [paper."0.1"]
    sink = 18.18                           # the paper's Sink_1 (percent) for this setting
    expect = "reference"                   # reference | sink | no_sink | higher | lower | similar
    table = "Table 2"                      # where in the paper (experiments/paper_values.toml)

    # or explicit points (several keys changed at once)
    [[points]]
    label = "k_bias (v = 0)"
    folder = "k_bias_v_0"                  # run folder (optional; default: the label made file-safe),
                                           # so a point can be relabelled without losing its runs
    set = { "model.attention" = "k_bias" }
    paper = 0.04
    expect = "no_sink"
    table = "Table 4"

An ``expect`` on a point without a paper value is *our hypothesis* (``Point.expect_by`` = "ours"),
reported as such, never as the paper's direction.

Every point gets a label (grid points: ``key=value`` joined by commas, or the bare value when
one key is swept) and a folder name (the label made file-safe). ``expect`` is the direction the
paper reports relative to the point marked ``reference`` (see :mod:`sinklab.sweep.verdict`).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sinklab.errors import ConfigError
from sinklab.fileio import read_toml
from sinklab.registry import nearest

EXPECTATIONS = ("reference", "sink", "no_sink", "higher", "lower", "similar", "")
TOP_KEYS = ("name", "title", "section", "base", "set", "sweep", "points", "paper", "paper_source", "note", "x_log",
            "seeds", "first_seed", "metric")
#: the Sink_1 variant a study's verdicts use: the paper's formula, or the mask-aware one
#: (mean over the queries the model's own mask lets see the key; see sinklab.metrics.visible_key_counts)
METRICS = ("paper", "visible")
#: the placeholder a string override may use for the training seed (see :meth:`Point.set_args`)
SEED_PLACEHOLDER = "{seed}"


@dataclass
class Point:
    """One run of a study: its label, folder name, overrides and the paper's value/expectation."""

    label: str
    slug: str
    overrides: dict[str, Any]
    x: Any = None  # the swept value (grid with one key), for the plot's x axis
    paper: float | None = None
    expect: str = ""
    table: str = ""  # where the paper value comes from (e.g. "Table 6"; experiments/paper_values.toml)
    by: str = ""  # "paper" for a direction the paper states without a number (needs ``table``)
    token: int = 1  # the 1-based token k whose Sink_k the row reports and tests (position k - 1; a fixed token at p: p)

    @property
    def expect_by(self) -> str:
        """Whose expectation ``expect`` is: "paper" when the point carries a paper value (or says
        ``by = "paper"`` with the ``table``/figure that states the direction), else "ours" (our
        hypothesis, never presented as the paper's direction); "" without an expectation."""
        if not self.expect:
            return ""
        return "paper" if self.paper is not None or self.by == "paper" else "ours"

    def set_args(self, seed: int | None = None) -> list[str]:
        """The overrides as ``--set key=value`` strings (values written as TOML).

        A string value may name the training seed as ``{seed}`` (e.g. a fine-tuning study's
        ``"train.init_from" = "results/finetune_base/runs/softmax/seed{seed}"``: each seed starts
        from its own parent run); it is replaced by ``seed`` when one is given and left as written
        otherwise (for validation of the rest of the config).
        """
        from sinklab.runs.config import toml_value

        def value(v):
            return v.replace(SEED_PLACEHOLDER, str(seed)) if isinstance(v, str) and seed is not None else v

        return [f"{k}={toml_value(value(v))}" for k, v in self.overrides.items()]


@dataclass
class Study:
    """A parsed study file."""

    name: str
    title: str
    section: str
    base: str
    points: list[Point]
    path: Path | None = None
    sweep_keys: list[str] = field(default_factory=list)
    paper_source: str = ""
    note: str = ""
    x_log: bool = False
    seeds: int = 3
    metric: str = "paper"
    first_seed: int = 0

    @property
    def seed_list(self) -> list[int]:
        """The training seeds of every point: ``first_seed .. first_seed + seeds - 1``."""
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @property
    def x_key(self) -> str | None:
        """The swept key when exactly one key is swept on a grid (numeric plot axis), else None."""
        return self.sweep_keys[0] if len(self.sweep_keys) == 1 else None


def slugify(label: str) -> str:
    """A file-safe folder name for a label: letters, digits, ``.``, ``-`` and ``_``; every run of other
    characters (``=`` included, which ``sinklab dynamics LABEL=RUN`` would read as a label) becomes ``_``."""
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")
    return s or "run"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ",".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v)


def _paper_entry(raw: Any, where: str) -> tuple[float | None, str, str]:
    """(paper Sink_1, expect, table) of a paper entry."""
    if raw is None:
        return None, "", ""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw), "", ""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: paper entry must be a number or a table with sink/expect/table, got {raw!r}")
    for k in raw:
        if k not in ("sink", "expect", "table"):
            raise ConfigError(f"{where}: unknown key {k!r} in paper entry (valid: sink, expect, table)")
    sink = raw.get("sink")
    expect = raw.get("expect", "")
    if expect not in EXPECTATIONS:
        raise ConfigError(f"{where}: expect={expect!r} is not one of {', '.join(e for e in EXPECTATIONS if e)}")
    return (None if sink is None else float(sink)), expect, str(raw.get("table") or "")


def parse_study(raw: dict[str, Any], path: Path | None = None) -> Study:
    """Build a :class:`Study` from a parsed TOML dict.

    Raises:
        ConfigError: unknown top-level key (names the nearest), no base, neither ``sweep`` nor
            ``points``, duplicate labels, a paper entry for an unknown label, a bad ``expect``.
    """
    where = str(path) if path else "study"
    for k in raw:
        if k not in TOP_KEYS:
            hint = nearest(k, list(TOP_KEYS))
            raise ConfigError(f"{where}: unknown key {k!r}" + (f" (did you mean {hint!r}?)" if hint else ""))
    if "base" not in raw:
        raise ConfigError(f"{where}: no 'base' (a preset name or a config path)")
    name = raw.get("name") or (path.stem if path else "study")
    common = dict(raw.get("set", {}))
    points: list[Point] = []
    sweep_keys: list[str] = []
    if "sweep" in raw:
        grid = raw["sweep"]
        if not isinstance(grid, dict) or not grid:
            raise ConfigError(f"{where}: [sweep] must map keys to lists of values")
        sweep_keys = list(grid)
        for k, vals in grid.items():
            if not isinstance(vals, list) or not vals:
                raise ConfigError(f"{where}: sweep key {k!r} needs a non-empty list of values")
        paper = raw.get("paper", {})
        for combo in itertools.product(*grid.values()):
            over = dict(zip(sweep_keys, combo))
            label = _fmt(combo[0]) if len(combo) == 1 else ", ".join(f"{k}={_fmt(v)}" for k, v in over.items())
            pv, ex, tb = _paper_entry(paper.get(label), f"{where}: paper.{label}")
            points.append(Point(label=label, slug=slugify(label), overrides={**common, **over},
                                x=combo[0] if len(combo) == 1 else None, paper=pv, expect=ex, table=tb))
        labels = {p.label for p in points}
        for lab in paper:
            if lab not in labels:
                raise ConfigError(f"{where}: paper entry for {lab!r} matches no grid point (labels: {', '.join(sorted(labels))})")
    for i, pr in enumerate(raw.get("points", [])):
        for k in pr:
            if k == "position":  # renamed: a position is 0-based everywhere in sinklab, this number is 1-based
                raise ConfigError(f"{where}: points[{i}]: 'position' is now 'token', the 1-based token k whose Sink_k "
                                  f"the row reports: write token = {pr[k]!r} for the same row (sinklab's positions "
                                  "are 0-based)")
            if k not in ("label", "set", "paper", "expect", "x", "table", "by", "token", "folder"):
                raise ConfigError(f"{where}: points[{i}] has unknown key {k!r} (valid: label, set, paper, expect, x, "
                                  "table, by, token, folder)")
        tok = pr.get("token", 1)
        if isinstance(tok, bool) or not isinstance(tok, int) or tok < 1:
            raise ConfigError(f"{where}: points[{i}]: token (the 1-based token k whose Sink_k the row tests) must be an "
                              f"integer >= 1, got {tok!r}")
        if pr.get("by", "paper") != "paper" or (pr.get("by") and not pr.get("table")):
            raise ConfigError(f"{where}: points[{i}]: by must be \"paper\" and needs the table or figure that says so")
        if "label" not in pr:
            raise ConfigError(f"{where}: points[{i}] has no label")
        pv, ex, tb = _paper_entry({"sink": pr.get("paper"), "expect": pr.get("expect", ""), "table": pr.get("table")},
                                  f"{where}: points[{i}]")
        folder = pr.get("folder", slugify(pr["label"]))
        if not isinstance(folder, str) or not folder or slugify(folder) != folder:
            raise ConfigError(f"{where}: points[{i}]: folder must be a file-safe name (letters, digits, '.', '-', '_'), "
                              f"got {folder!r}")
        points.append(Point(label=pr["label"], slug=folder, overrides={**common, **pr.get("set", {})},
                            x=pr.get("x"), paper=pv, expect=ex, table=tb, by=pr.get("by", ""),
                            token=tok))
    if not points:
        raise ConfigError(f"{where}: no [sweep] grid and no [[points]]")
    seen: dict[str, str] = {}
    for p in points:
        if p.slug in seen:
            raise ConfigError(f"{where}: two points share the folder name {p.slug!r} ({seen[p.slug]!r}, {p.label!r})")
        seen[p.slug] = p.label
    seeds = raw.get("seeds", 3)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ConfigError(f"{where}: seeds must be an integer >= 1, got {seeds!r}")
    first_seed = raw.get("first_seed", 0)
    if not isinstance(first_seed, int) or isinstance(first_seed, bool) or first_seed < 0:
        raise ConfigError(f"{where}: first_seed must be an integer >= 0, got {first_seed!r}")
    metric = raw.get("metric", "paper")
    if metric not in METRICS:
        raise ConfigError(f"{where}: metric={metric!r} is not one of {', '.join(METRICS)}")
    base = raw["base"]
    if path is not None and (base.endswith(".toml") or "/" in base):
        base = str((path.parent / base).resolve())
    return Study(name=name, title=raw.get("title", name), section=raw.get("section", ""), base=base, points=points,
                 path=path, sweep_keys=sweep_keys, paper_source=raw.get("paper_source", ""), note=raw.get("note", ""),
                 x_log=bool(raw.get("x_log", False)), seeds=seeds, metric=metric,
                 first_seed=first_seed)



def point_token(point: dict[str, Any]) -> int:
    """The 1-based token k whose Sink_k a point of ``study.json`` reports (:attr:`Point.token`; a ``study.json``
    written before the key was renamed holds the same number as ``position``); 1 when it has none."""
    return int(point.get("token") or point.get("position") or 1)


def load_study(path: str | Path) -> Study:
    """Read and parse ``experiments/NAME.toml``. Raises ConfigError (missing file, bad TOML, bad study)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"study file {path} does not exist")
    return parse_study(read_toml(path, "study file"), path)


def point_config(study: Study, point: Point, seed: int | None = None):
    """The resolved :class:`~sinklab.runs.config.RunConfig` of one point (validates it); with
    ``seed``, that seed's config (``train.seed`` and ``{seed}`` placeholders set)."""
    from sinklab.runs.config import load_config

    extra = [] if seed is None else [f"train.seed={seed}"]
    return load_config(study.base, point.set_args(seed) + extra)
