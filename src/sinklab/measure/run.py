"""Orchestration of one measurement: load model and corpus, build the probe, capture
statistics, summarise them (:func:`sinklab.metrics.summarize`)."""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from sinklab.capture import collect
from sinklab.capture.stats import ProbeStats
from sinklab.errors import InputError, param
from sinklab.fileio import check_writable, read_json
from sinklab.measure.report import top_sink_mass, write_outputs
from sinklab.metrics import sink_rate_per_sample, summarize
from sinklab.metrics.summary import rankable_positions
from sinklab.probe import INPUTS, Probe
from sinklab.result import Result, percents, versions
from sinklab.subject import ProbeSpec, Subject, check_device, eval_mode, resolve_device
from sinklab.subject.core import DEFAULT_CORPUS, DEFAULT_NUM_SAMPLES, DEFAULT_SEQ_LEN
from sinklab.zoo.models import DEFAULT_MODEL


@dataclass
class MeasureConfig:
    """Everything that defines a measurement (the paper's probe by default: N=100, T=64, eps=0.3).

    ``None`` and ``auto`` are resolved by :func:`measure` (the result holds the resolved values):
    for a model trained by ``sinklab train`` (``model`` is its run folder or ``final/``),
    ``input="auto"`` is ``run`` (the run's own held-out data in its packing, see
    :meth:`sinklab.subject.ProbeSpec.resolve` and :meth:`sinklab.runs.Run.probe`), ``num_samples``/``seq_len``/``seed`` default to the run
    tracker's probe and ``bos="auto"`` to the run's packing; for any other model ``input="auto"``
    is ``natural`` on ``corpus`` (default ``sotu``), N = 100, T = 64, seed 0.

    ``device`` ("cpu", "cuda", "cuda:N", "auto" = CUDA when available) places the model on one
    device; ``device_map="auto"`` spreads it over the available devices with ``accelerate`` (GPUs,
    then CPU, then disk) for models that do not fit one. ``dtype`` None = bfloat16 on CUDA (with a
    device map that can use a GPU), float32 otherwise.
    """

    model: str = DEFAULT_MODEL
    corpus: str | None = None
    input: str = "auto"
    num_samples: int | None = None
    seq_len: int | None = None
    eps: float = 0.3
    positions: int = 8
    bos: str = "auto"
    seed: int | None = None
    dtype: str | None = None
    batch_size: int = 16
    collector: str = "auto"
    token: int | None = None
    text: str | None = None
    accept_license: bool = False
    allow_long_context: bool = False
    device: str = "cpu"
    device_map: str | None = None
    cloze: int = 0

    def __post_init__(self) -> None:
        from sinklab.capture import COLLECTORS

        if not 0.0 < self.eps < 1.0:
            raise InputError(f"{param('eps')} must lie in (0, 1), got {self.eps}")
        self.probe_spec()  # the probe's settings: N, T, seed, token, BOS policy, input kind
        if self.positions < 1:
            raise InputError(f"{param('positions')} must be >= 1, got {self.positions}")
        if self.batch_size < 1:
            raise InputError(f"{param('batch_size')} must be >= 1, got {self.batch_size}")
        if self.cloze < 0:
            raise InputError(f"{param('cloze')} must be >= 0 (items of the cloze task; 0 = off), got {self.cloze}")
        check_device(self.device, self.device_map, self.dtype)
        if self.collector != "auto" and self.collector not in COLLECTORS:
            raise InputError(f"{param('collector')} must be auto or one of {', '.join(COLLECTORS)}, got {self.collector!r}")

    def probe_spec(self) -> ProbeSpec:
        """The probe settings as a :class:`~sinklab.subject.ProbeSpec` (checked there)."""
        return ProbeSpec(input=self.input, corpus=self.corpus, num_samples=self.num_samples, seq_len=self.seq_len,
                         bos=self.bos, seed=self.seed, token=self.token, text=self.text)

    def command(self) -> str:
        """The ``sinklab measure`` command line that reproduces this measurement."""
        parts = ["sinklab", "measure"]
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    parts.append(flag)
            elif value is not None and not (f.name == "cloze" and value == 0):
                parts += [flag, str(value)]
        return " ".join(shlex.quote(p) for p in parts)


@dataclass(repr=False)  # Result's short repr
class MeasureResult(Result):
    """The outcome of :func:`measure` (a :class:`~sinklab.result.Result`; :meth:`load` gives one without
    the raw ``stats``, which ``results.json`` does not keep: it has the same ``summary``, saves the same files
    and compares alike).

    Attributes:
        config: the measurement's settings.
        summary: :func:`sinklab.metrics.summarize` output (sink rate, attention mass, norms...).
        probe: the probe set actually fed to the model.
        stats: the raw per-sample statistics (None for a result read back by :meth:`load`).
        model: model provenance (name, source, sha256, licence, architecture...).
        corpus: corpus provenance for natural inputs, else None.
        top_sinks: per sample, the 3 positions with the highest per-sample sink rate
            (0-based position, rate in percent, token string), among the positions seen
            by at least 10% of the queries.
        command: the command line that reproduces the result.
        wall_time_s: seconds spent in the forward passes and metrics.
        downstream: the ``--cloze`` task's scores and the held-out loss, or None.
        saved: for a result read back by :meth:`load` (``stats`` None), what ``results.json`` keeps of the raw
            statistics: ``notes`` and ``attention_mass_top_sink`` (see :attr:`notes`,
            :func:`sinklab.measure.report.top_sink_mass`); None for a result of :func:`measure`.
    """

    FILE: ClassVar[str] = "results.json"
    WHAT: ClassVar[str] = "measurement results"

    config: MeasureConfig
    summary: dict[str, Any]
    probe: Probe
    stats: ProbeStats | None
    model: dict[str, Any]
    corpus: dict[str, Any] | None
    top_sinks: list[list[dict[str, Any]]]
    command: str
    wall_time_s: float
    versions: dict[str, str] = field(default_factory=versions)
    downstream: dict[str, Any] | None = None
    saved: dict[str, Any] | None = None

    @property
    def sink_rate(self) -> list[float]:
        """Sink rate in percent at the first K positions (index 0 = the paper's Sink_1)."""
        return self.summary["sink_rate"]

    @property
    def notes(self) -> list[str]:
        """The capture's remarks (a fallback taken, ...): ``stats.notes``, or for a result read back by
        :meth:`load` the ``notes`` of its ``results.json``."""
        if self.stats is not None:
            return list(self.stats.notes)
        return list((self.saved or {}).get("notes") or [])

    def to_dict(self) -> dict[str, Any]:
        """The content of ``results.json``."""
        d = {
            "sink_rate": self.summary["sink_rate"],
            "attention_mass": self.summary["attention_mass"],
            "input_ids": self.probe.input_ids.tolist(),
            "model": self.model,
            "corpus": self.corpus,
            "input": self.config.input,
            "probe": self.probe_description(),
            "eps": self.config.eps,
            "command": self.command,
            "versions": self.versions,
            "config": asdict(self.config),
            "bos_prefix": self.probe.prefix,
            "bos_suffix": self.probe.suffix,
            "probe_details": self.probe.details,
            "top_sinks": self.top_sinks,
            "notes": self.notes,
            "wall_time_s": self.wall_time_s,  # unrounded: a loaded result shows what the measured one showed
            "positions_are": "0-based indices; index 0 is the paper's token 1 (Sink_1)",
            "downstream": self.downstream,
        }
        top_mass = top_sink_mass(self)  # (L, H): the heat map's numbers, so that a loaded result can draw it
        if top_mass is not None:
            d["attention_mass_top_sink"] = top_mass
        for k, v in self.summary.items():
            d.setdefault(k, v)
        return d

    def title(self) -> str:
        n, t = (int(x) for x in self.probe.input_ids.shape)
        return f"MeasureResult: {self.model.get('name')}, input {self.config.input}, N={n} windows of T={t} tokens"

    def headline(self) -> list[tuple[str, str]]:
        """Sink_1.. (percent of (sample, layer, head) triples whose attention mass on the token exceeds eps;
        Sink_1 is position 0), the top sinks of the first sample (0-based positions, per-sample sink rate),
        the forward passes' wall time."""
        rows = [(f"Sink_1..{len(self.sink_rate)}", f"{percents(self.sink_rate)} at eps={self.config.eps:g} "
                                                    "(token 1 = position 0)")]
        if self.top_sinks and self.top_sinks[0]:
            rows.append(("top sinks, sample 0", ", ".join(f"position {d['position']} {d['token']!r} ({d['sink_rate']:.0f}%)"
                                                          for d in self.top_sinks[0])))
        if self.downstream:
            rows.append(("downstream", ", ".join(f"{k}={v}" for k, v in self.downstream.items()
                                                 if isinstance(v, (int, float)))))
        return rows + [("wall time", f"{self.wall_time_s:.2f} s")]

    def guide(self) -> list[tuple[str, str]]:
        mass = self.summary.get("attention_mass") or [[[]]]
        rows = len(mass) * len(mass[0]) * len(mass[0][0])
        return [(".table()", f"DataFrame per (layer, head, position): {rows} rows"),
                (".summary", "every figure by name: " + ", ".join(self.summary)),
                (".stats", "raw per-sample statistics" if self.stats is not None else "None (not kept in results.json)"),
                (".save(out)", "writes results.json, attention.csv, sink_rate.csv, plots")]

    def probe_description(self) -> dict[str, Any]:
        """Which probe was measured: ``kind`` (``run`` = the training run's own held-out data, ``natural``,
        ``random``, ``repeated``, ``text``), its size, BOS policy, seed and data source."""
        c, pr = self.config, self.probe
        d: dict[str, Any] = {"kind": pr.kind, "num_samples": int(pr.input_ids.shape[0]),
                             "seq_len": int(pr.input_ids.shape[1]), "bos": c.bos, "seed": c.seed}
        if pr.kind == "run":
            d.update({k: pr.details[k] for k in ("run", "data", "split", "packing", "tracker_probe")})
            d["description"] = (f"held-out {pr.details['split']} data of the training run ({pr.details['data']}), "
                                f"packing {pr.details['packing']}"
                                + (", the run tracker's probe set" if pr.details["tracker_probe"] else ""))
        elif pr.kind == "natural" and self.corpus is not None:
            d["corpus"] = self.corpus.get("name")
            d["description"] = f"windows of natural text from {self.corpus.get('name')}, one document per window"
        else:
            d["description"] = INPUTS.describe(pr.kind)
        return d

    def table(self):
        """Tidy per-(layer, head, position) table (pandas DataFrame).

        Columns: ``layer`` (0-based block index: in a hybrid model only its attention blocks appear),
        ``head``, ``kv_head``, ``position`` (0-based), ``token_position``
        (1-based, the paper's k), ``attention_mass`` (mean over samples), ``sink_rate``
        (percent of samples with mass > eps), ``key_norm`` and ``value_norm`` (mean over
        samples, of the head's KV head), ``attention_entropy`` (the head's mean attention entropy in
        nats over samples and queries, the same on every position's row), for models whose heads are gated
        after attention (NaN otherwise; DESIGN "gate-weighted attention") ``attention_mass_gated`` and
        ``sink_rate_gated`` (the same on the head's weights times its gate's magnitude per query) and
        ``gate_mean`` (the head's mean gate magnitude, the same on every position's row), ``model``, ``input``.
        """
        import pandas as pd

        s = self.summary
        mass = s["attention_mass"]
        rate = s["sink_rate_per_head"]
        kn, vn = s.get("key_norm"), s.get("value_norm")
        ent = s.get("attention_entropy")
        gmass, grate, gmean = s.get("attention_mass_gated"), s.get("sink_rate_gated_per_head"), s.get("gate_mean")
        nan = float("nan")
        L, H, K = len(mass), len(mass[0]), len(mass[0][0])
        ids = s.get("layer_ids") or list(range(L))  # block index of each layer (a hybrid's attention blocks)
        H_kv = len(kn[0]) if kn else H
        rows = []
        for l in range(L):
            for h in range(H):
                g = h // (H // H_kv)
                for k in range(K):
                    rows.append({
                        "layer": ids[l], "head": h, "kv_head": g, "position": k, "token_position": k + 1,
                        "attention_mass": mass[l][h][k], "sink_rate": rate[l][h][k],
                        "key_norm": kn[l][g][k] if kn else float("nan"),
                        "value_norm": vn[l][g][k] if vn else float("nan"),
                        "attention_entropy": ent[l][h] if ent else float("nan"),
                        "attention_mass_gated": gmass[l][h][k] if gmass else nan,
                        "sink_rate_gated": grate[l][h][k] if grate else nan,
                        "gate_mean": gmean[l][h] if gmean else nan,
                        "model": self.model.get("name"), "input": self.config.input,
                    })
        return pd.DataFrame(rows)

    def save(self, out: str | Path) -> Path:
        """Write ``results.json``, ``attention.csv`` (tidy table), ``sink_rate.csv`` and PNG plots to ``out``.

        A result read back by :meth:`load` writes the same files as the one it was saved from (the heat map
        from ``results.json``'s ``attention_mass_top_sink``; a file written before that key draws it only when
        the top sink is one of the first K positions, from ``attention_mass``)."""
        return write_outputs(self, Path(out))

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path | None = None) -> "MeasureResult":
        """The result of a ``results.json`` (``stats`` None: the raw per-sample statistics are not kept; their
        ``notes`` and the heat map's masses are, in :attr:`saved`). Its ``summary`` is the one :func:`measure`
        gave, keys in the same order, ``eps`` included (``results.json`` keeps it at the top level)."""
        p = data.get("probe", {})
        probe = Probe(torch.tensor(data["input_ids"]), p.get("kind", data.get("input")), p.get("bos"),
                      data.get("bos_prefix", []), data.get("bos_suffix", []), data.get("probe_details", {}))
        own = {"input_ids", "model", "corpus", "input", "probe", "eps", "command", "versions", "config", "bos_prefix",
               "bos_suffix", "probe_details", "top_sinks", "notes", "wall_time_s", "positions_are", "downstream",
               "attention_mass_top_sink"}
        config = MeasureConfig(**data["config"])
        rest = {k: v for k, v in data.items() if k not in own}
        # to_dict() writes sink_rate and attention_mass first: put them back where summarize() has them
        # (before sink_rate_ci and attention_mass_first), and summarize()'s first key, eps, first
        before = {nxt: key for key, nxt in (("sink_rate", "sink_rate_ci"), ("attention_mass", "attention_mass_first"))
                  if key in rest and nxt in rest}
        summary: dict[str, Any] = {"eps": data.get("eps", config.eps)}
        for k, v in rest.items():
            if k in before:
                summary[before[k]] = rest[before[k]]
            if k not in before.values():
                summary[k] = v
        saved = {"notes": list(data.get("notes") or []), "attention_mass_top_sink": data.get("attention_mass_top_sink")}
        return cls(config, summary, probe, None, data["model"], data.get("corpus"),
                   data.get("top_sinks", []), data.get("command", ""), data.get("wall_time_s", 0.0),
                   data.get("versions", {}), data.get("downstream"), saved)


def _top_sinks(stats: ProbeStats, probe: Probe, tokenizer, eps: float, k: int = 3) -> list[list[dict[str, Any]]]:
    rates = sink_rate_per_sample(stats.mass, eps)  # (N, T)
    rates = rates[:, : rankable_positions(stats.seq_len, stats.causal)]
    out = []
    for n in range(rates.shape[0]):
        vals, pos = rates[n].sort(descending=True, stable=True)
        row = []
        for v, p in zip(vals[:k].tolist(), pos[:k].tolist()):
            if v <= 0:
                break
            tok = tokenizer.convert_ids_to_tokens(int(probe.input_ids[n, p]))
            row.append({"position": p, "sink_rate": round(v, 3), "token": tok})
        out.append(row)
    return out


def measure(config: MeasureConfig | None = None, *, progress: bool = True, out: str | Path | None = None,
            command: str | None = None, **overrides) -> MeasureResult:
    """Measure attention sinks of a model on a probe set.

    ``measure()`` runs the default: SmolLM2-135M on 100 windows of 64 tokens of the
    State of the Union corpus, eps = 0.3 (Gu et al. 2025's probe). Keyword overrides
    set :class:`MeasureConfig` fields, e.g. ``measure(model="minilm-l6", input="random")``.

    Args:
        config: the settings (default :class:`MeasureConfig()`), updated by ``overrides``.
        progress: show progress bars.
        out: if given, save the outputs there (see :meth:`MeasureResult.save`).
        command: the command that made it, recorded as :attr:`MeasureResult.command` (the CLI gives the
            command as typed); None: the ``sinklab measure`` command of the settings (:meth:`MeasureConfig.command`).

    Returns:
        :class:`MeasureResult`.

    Raises:
        InputError: bad settings, T past the model's context, too few windows in the corpus, an
            ``out`` that cannot be written (checked first).
        UnknownNameError: unknown model, corpus, input kind or collector.
        FetchError / ChecksumError: a package could not be fetched or verified.
        CaptureError: the model exposes no attention weights.
    """
    from sinklab.models import check_model_spec
    from sinklab.runs import Run
    from sinklab.zoo.corpora import load_corpus

    cfg = config or MeasureConfig()
    tokenizer = overrides.pop("tokenizer", None)
    held = overrides.pop("model", None)
    if isinstance(held, Run):
        held = str(held.folder)
    if isinstance(held, (str, Path)):
        overrides["model"], held = str(held), None
    elif held is not None and not isinstance(held, (nn.Module, Subject)):
        raise InputError(f"{param('model')} must be a name, a path, a Run, a Subject or an nn.Module, "
                         f"not {type(held).__name__}")
    placed = {}
    if held is not None:  # a model object or a Subject: it stays where it is unless told otherwise
        placed = {k: overrides.pop(k) for k in ("device", "dtype", "device_map") if k in overrides}
        if isinstance(held, Subject):
            held = Subject.load(held, **placed)  # refuses a placement before any work
        overrides["model"] = f"<{type(held.model if isinstance(held, Subject) else held).__name__} in memory>"
    if overrides:
        from dataclasses import fields

        from sinklab.registry import first_unknown

        bad = first_unknown(overrides, [f.name for f in fields(MeasureConfig)], "measure() got an unknown option")
        if bad:
            raise InputError(bad)
        cfg = MeasureConfig(**{**asdict(cfg), **overrides})
    if out is not None:  # before any model or corpus work
        check_writable(out, param("out"))
    if held is not None:
        subj = Subject.load(held, tokenizer=tokenizer, **placed)
        run = subj.run
        dev = str(subj.device)
        cfg = replace(cfg, device="cpu", dtype=str(subj.dtype).removeprefix("torch."), device_map=None)
        cfg = replace(resolve_config(cfg, run), device=dev)
        if command is None:
            command = (f"sinklab.measure(model=<{type(subj.model).__name__} object>, ...) in Python: no CLI command "
                       "reproduces a model held in memory (save it, then sinklab measure FOLDER)")
    else:
        run = Run.find(cfg.model)
        if run is None:
            check_model_spec(cfg.model)  # a bad --model fails before any corpus or weights are fetched
        cfg = resolve_config(cfg, run)
    corpus = load_corpus(cfg.corpus) if cfg.input == "natural" else None  # corpus problems before the model loads
    if held is None:
        subj = Subject.load(run if run is not None else cfg.model, device=cfg.device, dtype=cfg.dtype,
                            device_map=cfg.device_map, accept_license=cfg.accept_license)
    subj = subj.with_probe(cfg.probe_spec(), allow_long_context=cfg.allow_long_context)
    probe = subj.probe
    t0 = time.perf_counter()
    extra = {"prefix_len": run.config.train.prefix_len} if run is not None and run.config.train.prefix_len else {}
    with eval_mode(subj.model):  # a model object in training mode: no dropout, and its mode is given back
        stats = collect(subj.model, probe.input_ids, batch_size=cfg.batch_size, collector=cfg.collector,
                        progress=progress, entropy=True, **extra)
        summary = summarize(stats, cfg.eps, cfg.positions, seed=cfg.seed)
        top = _top_sinks(stats, probe, subj.tokenizer, cfg.eps)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        downstream = (_downstream(cfg, subj, probe, run, corpus, progress) if cfg.cloze else None)
    if downstream is not None:
        downstream["wall_time_s"] = round(time.perf_counter() - t1, 3)  # not part of wall_time_s (the probe)
    result = MeasureResult(
        config=cfg,
        summary=summary,
        probe=probe,
        stats=stats,
        model=dict(subj.model_info),
        corpus=subj.corpus_info if probe.kind == "natural" else None,
        top_sinks=top,
        command=command or cfg.command(),
        wall_time_s=wall,
        downstream=downstream,
    )
    if out is not None:
        result.save(out)
    return result


def _downstream(cfg: MeasureConfig, loaded: Subject, probe: Probe, run, corpus, progress: bool) -> dict[str, Any]:
    """``--cloze N``: the cloze task (:mod:`sinklab.measure.downstream`) on held-out text, and the
    held-out loss on the probe windows (natural text or the run's own data only)."""
    from sinklab.measure.downstream import heldout_loss, score_cloze, text_cloze_items, token_cloze_items

    device = loaded.device
    if run is not None:
        docs = run.validation_documents()
        if run.synthetic:
            n = int(np.median([len(d) for d in docs])) if docs else 0  # spans that fit the documents
            end = max(2, min(8, n // 4))
            items = token_cloze_items(docs, cfg.cloze, seed=cfg.seed, ending_len=end,
                                         context_len=max(1, min(24, n - end)))
            source = f"token spans of the run's held-out {run.data_name} documents"
        else:
            texts = [loaded.tokenizer.decode(d.tolist()) for d in docs]
            items = text_cloze_items(texts, loaded.tokenizer, cfg.cloze, seed=cfg.seed)
            source = f"sentences of the run's held-out {run.data_name} documents"
    else:
        from sinklab.zoo.corpora import load_corpus

        c = corpus if corpus is not None else load_corpus(cfg.corpus or DEFAULT_CORPUS)
        items = text_cloze_items(c.documents, loaded.tokenizer, cfg.cloze, seed=cfg.seed)
        source = f"sentences of {c.name}"
    out: dict[str, Any] = {"cloze": {**score_cloze(loaded.model, items, prefix=probe.prefix, device=device,
                                                      progress=progress), "source": source, "seed": cfg.seed}}
    if probe.kind in ("natural", "run", "text"):
        p = run.config.train.prefix_len if run is not None else 0  # a prefix LM: scored as it was trained
        N, T = probe.input_ids.shape
        if T <= max(p, 1):  # no target after the prefix: no loss, said so (the cloze scores stand)
            out["heldout_loss"] = None
            out["heldout_loss_on"] = (f"not computed: windows of {T} tokens leave no target after the run's "
                                      f"bidirectional prefix of {p}")
        else:
            out["heldout_loss"] = heldout_loss(loaded.model, probe.input_ids, batch_size=cfg.batch_size, device=device,
                                               prefix_len=p)
            out["heldout_loss_on"] = (f"the {probe.kind} probe windows ({N} x {T})"
                                      + (f", targets after the bidirectional prefix of {p} (as in training)" if p else ""))
    return out


def resolve_config(cfg: MeasureConfig, run) -> MeasureConfig:
    """Fill the ``None``/``auto`` fields of ``cfg`` (see :class:`MeasureConfig`; the probe's by
    :meth:`sinklab.subject.ProbeSpec.resolve`, the device's by :func:`sinklab.subject.resolve_device`);
    ``run`` is the :class:`~sinklab.runs.Run` behind ``cfg.model``, or None.

    Raises:
        InputError: CUDA asked for but not available; ``--input run`` without a run; natural text for a run
            trained on a synthetic task.
    """
    cfg = replace(cfg, **resolve_device(cfg.device, cfg.device_map, cfg.dtype))
    if run is None and cfg.input == "run":
        raise InputError(f"{param('input', 'run')} needs a model trained by `sinklab train` (its run folder or final/), not {cfg.model!r}")
    p = cfg.probe_spec().resolve(run, num_samples=DEFAULT_NUM_SAMPLES, seq_len=DEFAULT_SEQ_LEN)
    return replace(cfg, input=p.input, corpus=p.corpus, num_samples=p.num_samples, seq_len=p.seq_len, seed=p.seed,
                   bos=p.bos)


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json`` written by :meth:`MeasureResult.save` (file or its folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise InputError(f"no results.json at {p}")
    return read_json(p, "measurement results")


def model_slug(model: str) -> str:
    """A folder name for a model spec: a path's last part (its run folder's for ``.../final``), a
    hub id ``org/name`` as ``org--name``, a zoo name as is."""
    p = Path(model).expanduser()
    if p.exists():
        p = p.resolve()
        return p.parent.name if p.name == "final" else p.name
    return model.replace("/", "--")


def measure_many(models: list[str], out: str | Path, config: MeasureConfig | None = None, *, progress: bool = True,
                 on_result=None, command: str | None = None) -> list[tuple[Path, MeasureResult]]:
    """Measure several models with the same settings, one after the other, each into ``out/<slug>``
    (:func:`model_slug`; ``-2``, ``-3``... appended to repeated slugs). ``on_result(folder, result)``
    is called after each. Compare them with ``sinklab compare out/*`` (:mod:`sinklab.measure.compare`).
    ``command``: recorded in every result (as :func:`measure`'s).

    Raises:
        InputError: no models, or a model given twice; anything :func:`measure` raises (the models
            measured before it keep their folders).
    """
    if not models:
        raise InputError(f"give at least one {param('model')}")
    dupes = sorted({m for m in models if models.count(m) > 1})
    if dupes:
        raise InputError(f"{param('model')} given twice: {', '.join(dupes)}")
    cfg = config or MeasureConfig()
    slugs: list[str] = []
    for m in models:
        s = slug = model_slug(m)
        n = 2
        while slug in slugs:  # every model its own folder, whatever names the others got (a/tiny, b/tiny-2, c/tiny)
            slug, n = f"{s}-{n}", n + 1
        slugs.append(slug)
    done = []
    for m, s in zip(models, slugs):
        folder = Path(out) / s
        res = measure(replace(cfg, model=m), progress=progress, out=folder, command=command)
        done.append((folder, res))
        if on_result is not None:
            on_result(folder, res)
    return done
