"""What every analysis shares: the subject (model + probe: :class:`sinklab.subject.Subject`), batched
forward passes through the capture seam, the sink position, the result object and its files.

Positions are 0-based everywhere (position 0 is the paper's token 1); layers and heads 0-based.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch
from torch import Tensor, nn

from sinklab.capture.adapter import adapt
from sinklab.capture.stats import ProbeStats
from sinklab.errors import InputError, param
from sinklab.metrics import sink_rate
from sinklab.metrics.summary import rankable_positions
from sinklab.models import input_device
from sinklab.registry import Registry
from sinklab.result import Result
from sinklab.subject import ProbeSpec, Subject, eval_mode

#: every analysis by name (``sinklab analyze KIND``): its one entry point, ``fn(model, **settings) ->
#: AnalysisResult``; the CLI makes one subcommand per entry, with one option per keyword of ``fn``
ANALYSES: Registry[Callable[..., "AnalysisResult"]] = Registry("analysis")

#: probe length T of an analysis when the model is not a ``sinklab train`` run (a run: its tracker's)
DEFAULT_SEQ_LEN = 64


def analysis(name: str, *, help: dict[str, str] | None = None):
    """Function decorator: register an analysis entry point under ``name`` (description = the docstring's
    first line). ``help``: one line per keyword of the entry point that is the analysis' own (not the
    probe's), shown by ``sinklab analyze NAME --help``; kept on the function as ``cli_help``.

    The registered function also takes a model object: an ``nn.Module`` with ``tokenizer=`` (probed as a name is,
    with the entry point's probe settings; it stays on its device and in its dtype unless ``device`` / ``dtype``
    / ``device_map`` are given) or a :class:`Subject` (used as it is). A model object runs in eval mode and is
    given back in the mode it had (:func:`sinklab.subject.eval_mode`); a model loaded from a name is in eval
    mode already.

    Raises (besides the entry point's own):
        InputError: ``tokenizer`` given with anything but an ``nn.Module``."""
    def add(fn):
        defaults = {n: p.default for n, p in inspect.signature(fn).parameters.items()
                    if p.default is not inspect.Parameter.empty}

        @functools.wraps(fn)
        def entry(model=_NO_MODEL, *args, tokenizer=None, **kwargs):
            if tokenizer is not None and not isinstance(model, nn.Module):
                raise InputError(f"{param('tokenizer')} goes with a model object (an nn.Module); a model loaded from "
                                 "disk, or a Subject, has its own")
            if model is _NO_MODEL:
                return fn(*args, **kwargs)
            if isinstance(model, nn.Module):  # probed as resolve_subject probes a name, left where it is unless placed
                placed = {k: kwargs[k] for k in ("device", "dtype", "device_map") if k in kwargs}
                module = model
                model = _probe(lambda: Subject.load(module, tokenizer=tokenizer, **placed), **{**defaults, **kwargs})
            elif isinstance(model, Subject) and not model.input_ids.numel():  # Subject.load's: no probe drawn yet
                held = model
                model = _probe(lambda: held, **{**defaults, **kwargs})
            if not isinstance(model, Subject):
                return fn(model, *args, **kwargs)
            with eval_mode(model.model):
                return fn(model, *args, **kwargs)

        entry.cli_help = dict(help or {})
        return ANALYSES.register(name)(entry)

    return add


_NO_MODEL = object()  # an entry point called without a model: its own default


@dataclass
class Pass:
    """The outcome of :func:`run_model` on N sequences of T tokens.

    stats: :class:`ProbeStats` of the (possibly edited) pass. hidden: (N, L, T, d) float32 block
    outputs, or None. nll: (N, T - 1) float64, ``nll[n, t] = -log p(x[t + 1] | x[:t + 1])``, or None.
    All on the CPU and in float32 / float64 whatever the model's device and dtype (the capture seam reduces
    each batch on the model's device, upcast first, and keeps only these).
    """

    stats: ProbeStats
    hidden: Tensor | None = None
    nll: Tensor | None = None


def run_model(
    model: nn.Module,
    input_ids: Tensor,
    *,
    edit: Callable | None = None,
    hidden_edit: Callable | None = None,
    hidden: bool = False,
    nll: bool = False,
    batch_size: int = 16,
    embed_delta: Tensor | None = None,
    targets: Tensor | None = None,
    entropy: bool = False,
) -> Pass:
    """Forward passes through the capture seam (:mod:`sinklab.capture.hf` for ``transformers`` models,
    the observer of :mod:`sinklab.capture.native` for sinklab models), with optional interventions.

    ``transformers`` models always use the eager collector here, so a pass with a no-op ``edit``
    is bit-identical to one without. ``input_ids`` (on any device) are moved to the model's embedding device;
    the log-softmax of the loss readout is taken in float64.

    Args:
        model: the model. input_ids: (N, T) int64.
        edit: attention intervention :data:`sinklab.capture.hf.AttentionEdit` or None.
        hidden_edit: block-output intervention :data:`sinklab.capture.hf.HiddenEdit` or None.
        hidden: keep every block's output (N, L, T, d).
        nll: compute the next-token negative log-likelihood (needs an LM head).
        embed_delta: (N, T, d) added to the input token embeddings (over-mixing probe), or None.
        targets: (N, T) int64: with ``nll``, ``nll[n, t] = -log p(targets[n, t] | input_ids[n])`` at every
            position t (the masked diffusion readout: the clean token behind each position) instead
            of the next-token NLL; ``Pass.nll`` is then (N, T).
        entropy: record each head's attention entropy (:attr:`ProbeStats.attention_entropy`).

    Raises:
        InputError: ``nll`` for a model without an LM head.
        CaptureError: the model's attention does not go through the seam.
    """
    adapter = adapt(model)
    if nll and not adapter.has_lm_head:
        raise InputError(f"{type(model).__name__} has no language-modelling head: no loss readout")
    parts, hids, nlls = [], [], []
    emb = adapter.embeddings
    device = input_device(model)  # where the embeddings run (with a device map: their hook's execution device)
    for s in range(0, input_ids.shape[0], batch_size):
        ids = input_ids[s : s + batch_size].to(device)
        handle = None
        if embed_delta is not None:
            delta = embed_delta[s : s + batch_size]
            handle = emb.register_forward_hook(lambda _m, _i, o, d=delta: o + d.to(o.device, o.dtype))
        try:
            kw = dict(edit=edit, hidden_edit=hidden_edit, logits=nll, keep_hidden=hidden, entropy=entropy)
            rec = adapter.capture(ids, collector="eager", **kw)
        finally:
            if handle is not None:
                handle.remove()
        parts.append(rec.finish())
        if hidden:
            hids.append(torch.stack(rec.full_hidden, dim=1))  # (B, L, T, d)
        if nll and targets is not None:  # same-position readout (masked diffusion)
            logp = torch.log_softmax(rec.logits.double(), dim=-1)  # (B, T, V)
            nlls.append(-logp.gather(-1, targets[s : s + batch_size, :, None].to(logp.device)).squeeze(-1).cpu())  # (B, T)
        elif nll:
            logp = torch.log_softmax(rec.logits[:, :-1].double(), dim=-1)  # (B, T-1, V)
            nlls.append(-logp.gather(-1, ids[:, 1:, None]).squeeze(-1).cpu())  # (B, T-1)
    return Pass(ProbeStats.concat(parts), torch.cat(hids) if hidden else None, torch.cat(nlls) if nll else None)


def sink_position(stats: ProbeStats, eps: float = 0.3, requested: int | None = None, *,
                  require_sink: bool = True) -> tuple[int, float]:
    """The sink position to analyse (0-based) and its sink rate Sink^eps (percent), on the mask-aware mass
    (``stats.visible_mass``: the plain mass when the model's own mask hides no key).

    Default: the position with the highest sink rate among those seen by at least 10% of the
    queries (:func:`~sinklab.metrics.summary.rankable_positions`). ``requested`` is checked; with
    ``require_sink=False`` it may be a position that is never a sink (to compare models at the same
    position, e.g. BOS, whether or not they put a sink there).

    Raises:
        InputError: ``requested`` outside [0, T) or a position the model never uses as a sink
            (sink rate 0: the message names the top sink position and its rate).
    """
    rates = sink_rate(stats.visible_mass, eps)  # (T,) percent
    T = rates.shape[0]
    k = rankable_positions(T, stats.causal)
    top = int(rates[:k].argmax())
    if requested is None:
        return top, float(rates[top])
    if not 0 <= requested < T:
        raise InputError(f"{param('position', requested)} is outside the sequence (0-based, T={T})")
    if require_sink and float(rates[requested]) == 0.0:
        raise InputError(f"position {requested} is never a sink: its sink rate (eps={eps}) is 0%; "
                         f"the top sink position is {top} ({float(rates[top]):.1f}%)")
    return requested, float(rates[requested])


def position_norm_ratio(norms: Tensor, position: int) -> float:
    """How much larger position ``position``'s norm is than the other positions': the mean over every
    leading axis (samples, layers, heads) of ``norms[..., p] / mean_{j != p} norms[..., j]``.

    Args:
        norms: (..., T) l2 norms, e.g. :attr:`ProbeStats.hidden_norms` (N, L, T) or ``key_norms``
            (N, L, H_kv, T). position: 0-based p, 0 <= p < T.

    Returns:
        The ratio (1.0: as large as the others; the sink token: hidden norm above 1, key norm often below 1).

    Raises:
        InputError: ``position`` outside [0, T) or T < 2.
    """
    T = norms.shape[-1]
    if T < 2 or not 0 <= position < T:
        raise InputError(f"position {position} is outside [0, {T}) or there are no other positions")
    others = torch.cat([norms[..., :position], norms[..., position + 1:]], dim=-1).double().mean(dim=-1)
    return float((norms[..., position].double() / others.clamp_min(1e-30)).mean())


def sign_test_p(k: int, n: int) -> float:
    """Two-sided exact sign test: the probability, under a fair coin, of a split of ``n`` paired
    differences at least as uneven as ``k`` positive of ``n`` (``min(1, 2 P(X <= min(k, n - k)))``,
    X ~ Binomial(n, 1/2)). ``n = 0`` gives 1. With all ``n`` one way it is ``2 / 2**n``: below 0.05 only
    from n = 6 on.

    Raises:
        InputError: ``k`` outside [0, n].
    """
    if not 0 <= k <= n:
        raise InputError(f"sign test: {k} of {n} is not a count")
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2 * tail)


#: fewest unanimous pairs whose two-sided sign test reaches p < 0.05 (2 / 2**6 = 0.031)
MIN_SIGN_TEST_PAIRS = 6


def _check_indices(values: list[int] | None, n: int, what: str, owner: str) -> list[int]:
    if values is None:
        return list(range(n))
    bad = [v for v in values if not 0 <= v < n]
    if bad:
        raise InputError(f"{what} {bad[0]} is out of range: {owner} {n} {what}s (0 to {n - 1})")
    return sorted(set(values))


def check_layers(layers: list[int] | None, num_layers: int, model: nn.Module | None = None) -> list[int]:
    """The 0-based layers to act on (None = all).

    Raises:
        InputError: an index out of range; with ``model``, a layer given by the caller that holds no
            attention (an SSM / Mamba block of a hybrid: an attention edit there would change nothing).
    """
    chosen = _check_indices(layers, num_layers, "layer", "the model has")
    if layers is not None and model is not None:
        attn = adapt(model).attention_layers
        bad = [i for i in chosen if i not in attn]
        if bad:
            raise InputError(f"layer {bad[0]} of {type(model).__name__} has no attention (an SSM / Mamba block of a "
                             f"hybrid model): its attention layers are {attn}")
    return chosen


def check_heads(heads: list[int] | None, num_heads: int) -> list[int]:
    """The 0-based heads to act on (None = all). Raises InputError for an index out of range."""
    return _check_indices(heads, num_heads, "head", "the layers have")


def num_heads(model: nn.Module) -> int:
    """Query heads per attention layer of a ``transformers`` model or a :class:`~sinklab.nn.SinkLM`."""
    return adapt(model).n_heads


def _versions() -> dict[str, str]:
    from sinklab.provenance import code_version
    from sinklab.result import versions

    return {**versions(), "code": code_version()}


def _jsonable(x: Any) -> Any:
    """``x`` with tensors as lists and NaN / infinity as None (JSON null). Floats keep every digit (JSON writes a
    float's shortest exact repr), so :meth:`AnalysisResult.load` reads back exactly the numbers computed: rounded
    to 6 decimals, an intervention's 1.08e-5 came back as 1.1e-5 and anything below 5e-7 as 0."""
    if isinstance(x, Tensor):
        return _jsonable(x.tolist())
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", None) == 0:  # numpy scalar
        x = x.item()
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


@dataclass(repr=False)  # Result's short repr
class AnalysisResult(Result):
    """The outcome of one ``sinklab analyze`` kind (a :class:`~sinklab.result.Result`: ``save``, ``load``,
    ``table``, ``to_dict``).

    Attributes:
        kind: the analysis' name in :data:`ANALYSES` (``massive``, ``keybias``, ``intervene``, ...).
        summary: the headline numbers (JSON-serialisable).
        tables: tidy tables by name (pandas DataFrames), written as ``NAME.csv``; the first is :meth:`table`.
        plots: plot makers by name, ``fn(path)`` writes ``NAME.png`` (none on a loaded result).
        settings: the analysis' settings. model, corpus: provenance.
        command: the command that made it (the CLI's, or the Python call: :func:`command_line`).
        csv_only: names of tables too large to repeat in ``analysis.json`` (written as CSV only;
            ``analysis.json`` lists them under ``csv_only_tables``).
    """

    FILE: ClassVar[str] = "analysis.json"
    WHAT: ClassVar[str] = "sinklab analyze results"

    kind: str
    summary: dict
    tables: dict = field(default_factory=dict)
    plots: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    corpus: dict | None = None
    command: str = ""
    csv_only: tuple = ()

    def title(self) -> str:
        return f"AnalysisResult: {self.kind} of {self.model.get('name', 'a model')}"

    def headline(self) -> list[tuple[str, str]]:
        """The summary's scalar and text entries (the first six)."""
        rows = [(k, f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in self.summary.items()
                if isinstance(v, (str, int, float, bool)) or v is None]
        return rows[:6] + ([("summary", f"{len(rows) - 6} more in .summary")] if len(rows) > 6 else [])

    def guide(self) -> list[tuple[str, str]]:
        shapes = ", ".join(f"{n} ({len(t)} rows)" for n, t in self.tables.items())
        return [(".table()", f"the first table, {next(iter(self.tables), 'none')}"), (".tables[name]", shapes or "none"),
                (".save(out)", "writes analysis.json, one CSV per table, PNG plots")]

    def table(self):
        """The analysis' first table (``massive``: ``layers``; ``intervene``: ``interventions``; ...)."""
        return next(iter(self.tables.values()))

    @classmethod
    def from_dict(cls, data: dict, folder: Path | None = None) -> "AnalysisResult":
        """The result of an ``analysis.json`` (tables from it; CSV-only tables from ``folder``; no plots)."""
        import pandas as pd

        tables = {name: pd.DataFrame(t) for name, t in data.get("tables", {}).items()}
        csv_only = tuple(n[: -len(".csv")] for n in data.get("csv_only_tables", []))
        for name in csv_only:
            if folder is not None and (folder / f"{name}.csv").exists():
                tables[name] = pd.read_csv(folder / f"{name}.csv")
        return cls(data["kind"], data["summary"], tables, {}, data.get("settings", {}), data.get("model", {}),
                   data.get("corpus"), data.get("command", ""), csv_only)

    def to_dict(self) -> dict:
        """The content of ``analysis.json``: every number, the command, versions, provenance, settings."""
        return _jsonable({
            "kind": self.kind, "summary": self.summary, "settings": self.settings, "model": self.model,
            "corpus": self.corpus, "command": self.command, "versions": _versions(),
            "tables": {name: df.to_dict(orient="list") for name, df in self.tables.items() if name not in self.csv_only},
            **({"csv_only_tables": [f"{n}.csv" for n in self.csv_only]} if self.csv_only else {}),
            "positions_are": "0-based indices; index 0 is the paper's token 1",
        })

    def save(self, out: str | Path) -> Path:
        """Write ``analysis.json``, one CSV per table and one PNG per plot into ``out``.

        Raises:
            InputError: ``out`` is a file.
        """
        import matplotlib

        matplotlib.use("Agg")
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise InputError(f"{param('out', str(out))} is a file; give a folder")
        out.mkdir(parents=True, exist_ok=True)
        (out / "analysis.json").write_text(json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")
        for name, df in self.tables.items():
            df.to_csv(out / f"{name}.csv", index=False)
        for name, fn in self.plots.items():
            fn(out / f"{name}.png")
        return out


def command_line(kind: str, settings: dict, subj: Subject | None = None) -> str:
    """How a result was made in Python: the call, marked as such (``python: sinklab.analyze.KIND(...)``); a
    model object given as a :class:`Subject` (not reproducible from the command line) is written
    ``Subject(<name>)``. The CLI replaces it with the command as typed
    (:func:`sinklab.cli.common.invoked_command`)."""
    if subj is not None and subj.source is None:
        model = f"Subject(<model object {settings.get('model')!r}, input_ids {tuple(subj.input_ids.shape)}>)"
    else:
        model = repr(subj.source if subj is not None else settings.get("model"))
    from sinklab.result import python_call

    return python_call(f"sinklab.analyze.{kind}", model, **{k: v for k, v in settings.items() if k != "model"})


def resolve_subject(model: "str | Subject", *, corpus: str | None = None, num_samples: int = 32,
                    seq_len: int | None = None, seed: int = 0, bos: str = "auto", device: str = "cpu",
                    dtype: str | None = None, device_map: str | None = None) -> Subject:
    """``model`` as a :class:`Subject` with its probe: a given Subject is used as is; a name, folder or run is
    loaded by :meth:`Subject.load` (on ``device`` in ``dtype``, or spread by ``device_map``) and probed with
    ``num_samples`` windows of ``seq_len`` tokens (:meth:`Subject.with_probe`): natural text from ``corpus``
    (default ``sotu``), or for a ``sinklab train`` run folder and ``corpus=None`` the run's own held-out data
    in its packing (:meth:`sinklab.runs.Run.probe`). ``seq_len`` None: a run's probe length, else
    :data:`DEFAULT_SEQ_LEN` (64).

    Raises:
        InputError: ``num_samples < 1``, ``seq_len < 4``, a prefix-LM run (the analyses do not apply its prefix),
            and as :meth:`Subject.load` / :meth:`Subject.with_probe` (a bad device or dtype, CUDA asked for but not
            available, T past the model's context...).
        UnknownNameError / FetchError: as :func:`sinklab.models.load_model`.
    """
    subj = model if isinstance(model, Subject) else _probe(
        lambda: Subject.load(model, device=device, dtype=dtype, device_map=device_map), corpus=corpus,
        num_samples=num_samples, seq_len=seq_len, seed=seed, bos=bos)
    prefix = int(subj.model_info.get("prefix_len") or 0)
    if prefix > 1:  # the analyses run the model plain causal and score every target: not what it was trained as
        raise InputError(f"{subj.model_info.get('name') or 'this run'} is a prefix LM (train.prefix_len={prefix}): the "
                         "analyses do not apply its bidirectional prefix (nor leave the prefix's targets out of the "
                         "loss) yet, so they would study another model; `sinklab measure` applies it")
    return subj


def _probe(load: Callable[[], Subject], *, corpus: str | None = None, num_samples: int = 32,
           seq_len: int | None = None, seed: int = 0, bos: str = "auto", **_settings) -> Subject:
    """The Subject of ``load()`` with the probe :func:`resolve_subject` describes (the probe settings are checked
    before ``load`` runs); other keywords of an entry point's settings are ignored."""
    if num_samples < 1:
        raise InputError(f"{param('num_samples')} must be >= 1, got {num_samples}")
    if seq_len is not None and seq_len < 4:
        raise InputError(f"{param('seq_len')} must be >= 4, got {seq_len}")
    spec = ProbeSpec(input="auto", corpus=corpus, num_samples=num_samples, seq_len=seq_len, bos=bos, seed=seed)
    return load().with_probe(spec, seq_len=DEFAULT_SEQ_LEN)
