"""Compare the sink rates of several measured models side by side (``sinklab compare``).

Reads the ``results.json`` that ``sinklab measure`` wrote into each folder (nothing is recomputed)
and puts, per model, Sink_1 (the sink rate at token 1, 0-based position 0, percent) next to the
sink rate per layer at token 1 against the layer's relative depth ``l / (L - 1)`` in [0, 1]
(0-based layer l of L; 0 for a one-layer model), so models of different depths share one axis --
the comparison of model families and sizes in Gu et al. 2025 (Sec. 3 and Fig. 2). Beside Sink_1, a model
with a virtual sink (learned sink logits, DESIGN "virtual sink") gets its Sink*, and a model whose heads are
gated after attention its gate-weighted Sink_1 (DESIGN "gate-weighted attention").

Outputs (:func:`write_comparison`): ``compare.csv`` (one row per model), ``compare_layers.csv``
(one row per model and layer), ``compare.png`` (Sink_1 bars with their 95% intervals, Sink* and
gate-weighted Sink_1 bars beside them where a model has them; per-layer curves over depth) and ``compare.json`` (the folders, the command, versions, and the warnings of
:func:`comparison_warnings`: sample sizes, lengths, probe kinds, corpora, dtypes or first tokens that differ).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

from sinklab.errors import InputError, param
from sinklab.fileio import atomic_write_text, read_json
from sinklab.measure.report import SMALL_N
from sinklab.result import Result, versions


def _load(folder: "str | Path | Any") -> dict[str, Any]:
    if hasattr(folder, "to_dict") and hasattr(folder, "summary"):  # a MeasureResult in memory
        return json.loads(json.dumps(folder.to_dict()))  # exactly what its results.json holds
    p = Path(folder)
    f = p / "results.json" if p.is_dir() else p
    if not f.exists():
        raise InputError(f"{folder}: no results.json (give folders written by `sinklab measure --out` or MeasureResult.save)")
    return read_json(f, "measurement results")


def comparison_tables(folders: Sequence[str | Path]):
    """(models, layers): two pandas DataFrames built from the folders' ``results.json``.

    ``models`` columns: ``model`` (the model's name, distinct per result: a name met before gets the folder's last
    part in brackets or a number, ``tiny (b)``, ``tiny (2)``), ``folder``, ``sink_rate_1`` (percent), ``ci_low`` / ``ci_high`` (its
    95% bootstrap interval from ``sink_rate_ci``; empty for N = 1 or a file without one),
    ``attention_mass_first``, ``n_layers``, ``num_samples``, ``seq_len``, ``eps``, ``input``, ``probe``
    (the probe kind measured: natural, run, random, repeated, text), ``corpus`` (a natural probe's corpus; empty
    otherwise), ``bos`` (the ``bos`` setting: auto, always, never), ``special_first`` (whether a token other than text,
    BOS, CLS or a run's fixed first token, was put before every window), ``dtype`` (the measurement's), for a model with a virtual sink (learned
    sink logits as in gpt-oss, sinklab's sink token / key bias / sink logit / softmax-off-by-one; empty
    otherwise) ``sink_rate_virtual`` (Sink*: percent of (sample, layer, head) triples whose attention on the
    virtual key exceeds eps) and ``virtual_mass`` (its mean attention mass), for a model whose heads are gated
    after attention (empty otherwise) ``sink_rate_gated_1`` (the gate-weighted Sink_1, percent) and
    ``attention_mass_first_gated``, for a model whose own mask hides keys (a window shorter than T, a prefix,
    chunks; empty otherwise) ``mask`` (in words), ``sink_rate_visible_1`` with ``visible_ci_low`` /
    ``visible_ci_high`` and ``attention_mass_first_visible`` (the mask-aware ones), and from ``measure --cloze``
    (empty otherwise): ``cloze_accuracy`` (percent, length-normalised), ``cloze_ci_lo`` /
    ``cloze_ci_hi`` (Wilson 95%), ``cloze_items``, ``cloze_source``, ``heldout_loss`` (nats/token on
    the probe windows). An empty number is NaN, an empty ``mask``, ``corpus``, ``bos`` or ``dtype`` is "".
    ``layers`` columns: ``model``, ``layer`` (0-based block of the full stack: a hybrid model's attention blocks
    keep their numbers, as in ``attention.csv``), ``depth`` (block / (blocks - 1)), ``sink_rate_1``
    (percent of heads x samples of that layer with mass on token 1 above eps), ``sink_rate_virtual`` (the
    layer's Sink*; empty without a virtual sink or in a results.json written before it was kept per layer),
    ``sink_rate_visible_1`` (the layer's mask-aware Sink_1; empty when the mask hides nothing) and
    ``sink_rate_gated_1`` (the layer's gate-weighted Sink_1; empty for an ungated model).

    Raises:
        InputError: fewer than two folders, a folder without results.json, the same folder (or result) given
            twice, or results measured with different eps (their sink rates are not comparable).
    """
    import pandas as pd

    if len(folders) < 2:
        raise InputError(f"compare needs at least two results (folders or measure results), got {len(folders)}")
    seen: dict[Any, Any] = {}
    for f in folders:
        key = id(f) if hasattr(f, "to_dict") else Path(f).resolve()
        if key in seen:
            raise InputError(f"the same results were given twice ({seen[key]} and {f}): compare each measurement once")
        seen[key] = f
    results = [(_load(f), _label(f)) for f in folders]
    eps = sorted({r["eps"] for r, _ in results})
    if len(eps) > 1:
        raise InputError(f"the results were measured with different eps ({', '.join(map(str, eps))}); "
                         f"their sink rates are not comparable: measure them with the same {param('eps')}")
    names = _distinct_names([(str(r["model"].get("name") or Path(f).name), f) for r, f in results])
    models, layers = [], []
    for name, (r, f) in zip(names, results):
        per_layer = [row[0] for row in r["sink_rate_per_layer"]]  # (L,) token 1
        L = len(per_layer)
        ci = (r.get("sink_rate_ci") or [[None, None]])[0]
        virtual = r.get("extra_mass")  # (L, H) mean mass on the virtual sink, DESIGN "virtual sink"
        virtual_layers = r.get("sink_rate_virtual_per_layer") or [None] * L
        gated = r.get("sink_rate_gated")
        gated_layers = [row[0] for row in r["sink_rate_gated_per_layer"]] if gated is not None else [None] * L
        masked = bool(r.get("mask_aware_differs")) and r.get("sink_rate_visible") is not None
        vci = (r.get("sink_rate_visible_ci") or [[None, None]])[0] if masked else [None, None]
        vis_layers = [row[0] for row in r["sink_rate_visible_per_layer"]] if masked else [None] * L
        models.append({"model": name, "folder": f, "sink_rate_1": r["sink_rate"][0],
                       "ci_low": ci[0], "ci_high": ci[1],
                       "mask": _mask_text(r.get("mask")) if masked else "",
                       "sink_rate_visible_1": r["sink_rate_visible"][0] if masked else None,
                       "visible_ci_low": vci[0], "visible_ci_high": vci[1],
                       "attention_mass_first_visible": r.get("attention_mass_first_visible") if masked else None,
                       "sink_rate_virtual": r.get("sink_rate_virtual"),
                       "virtual_mass": (None if virtual is None
                                        else round(sum(v for row in virtual for v in row) / sum(map(len, virtual)), 6)),
                       "sink_rate_gated_1": None if gated is None else gated[0],
                       "attention_mass_first_gated": r.get("attention_mass_first_gated"),
                       "attention_mass_first": r.get("attention_mass_first"), "n_layers": L,
                       "num_samples": r["probe"]["num_samples"], "seq_len": r["probe"]["seq_len"],
                       "eps": r["eps"], "input": r.get("input"), "probe": r["probe"].get("kind", r.get("input")),
                       "corpus": r["probe"].get("corpus") or "", "bos": r["probe"].get("bos") or "",
                       "special_first": bool(r.get("bos_prefix")), "dtype": (r.get("config") or {}).get("dtype") or "",
                       **_downstream_columns(r.get("downstream"))})
        ids = r.get("layer_ids") or list(range(L))  # block index of each measured layer (a hybrid's attention blocks)
        blocks = len(ids) + len(r.get("other_layers") or {})  # the full stack, blocks without attention included
        for l, v in enumerate(per_layer):
            b = ids[l]
            layers.append({"model": name, "layer": b, "depth": b / (blocks - 1) if blocks > 1 else 0.0, "sink_rate_1": v,
                           "sink_rate_visible_1": vis_layers[l],
                           "sink_rate_virtual": virtual_layers[l], "sink_rate_gated_1": gated_layers[l]})
    return _numbers_as_float(pd.DataFrame(models)), _numbers_as_float(pd.DataFrame(layers))


def _numbers_as_float(df):
    """``df`` with its columns of numbers and None (no value: no virtual sink, no cloze...) as float columns, None
    as NaN: what the CSV gives back, so a loaded :class:`CompareResult` has the same tables."""
    for col in df.columns:
        vals = df[col]
        if col not in _TEXT and vals.dtype == object and all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                                        for v in vals):
            df[col] = vals.astype(float)
    return df


def _distinct_names(items: Sequence[tuple[str, str]]) -> list[str]:
    """One distinct label per compared result, from (model name, folder label) pairs: the model's name; a name
    already taken gets its folder's last part in brackets (``tiny (b)``) and, when that is taken too or the
    result is held in memory (no folder), a number (``tiny (2)``, ``tiny (3)``...)."""
    names: list[str] = []
    for name, f in items:
        label = name
        if label in names and not f.startswith("<in memory"):
            label = f"{name} ({Path(f).name})"
        n = 2
        while label in names:
            label, n = f"{name} ({n})", n + 1
        names.append(label)
    return names


def _mask_text(mask: dict[str, Any] | None) -> str:
    """A results.json ``mask`` in words: ``window 8``, ``prefix 4``, ``layer masks`` (chunked attention)."""
    m = mask or {}
    parts = ([f"window {m['window']}"] if m.get("window") is not None else []) + \
            ([f"prefix {m['prefix_len']}"] if m.get("prefix_len") else []) + \
            (["layer masks"] if m.get("from_mask_tensor") else [])
    return ", ".join(parts) or "masked"


def _downstream_columns(d: dict[str, Any] | None) -> dict[str, Any]:
    c = (d or {}).get("cloze") or {}
    ci = c.get("accuracy_ci") or [None, None]
    return {"cloze_accuracy": c.get("accuracy"), "cloze_ci_lo": ci[0], "cloze_ci_hi": ci[1],
            "cloze_items": c.get("n_items"), "cloze_source": c.get("source"),
            "heldout_loss": (d or {}).get("heldout_loss")}


def comparison_warnings(models) -> list[str]:
    """Why the bars of :func:`comparison_tables`' ``models`` may not be comparable: different sample sizes
    N (their intervals differ in width), sequence lengths T (the mass on token 1 is a mean over T - 1
    queries), probe kinds (natural text, repeated tokens, ... give different sink rates), corpora or dtypes,
    a special first token (BOS / CLS) before some models' windows and not others', models
    with no interval (N = 1), and models whose own mask hides keys (their plain Sink_1 is capped). Each a one-line message naming the values per model; [] when none applies."""
    out = []

    def per_model(col: str) -> str:
        return ", ".join(f"{m} {v}" for m, v in zip(models["model"], models[col]))

    for col, what in (("num_samples", "sample sizes N"), ("seq_len", "sequence lengths T"), ("probe", "probe kinds"),
                      ("corpus", "corpora"), ("dtype", "dtypes")):
        # (a table built before a column was kept has none; only natural-text probes have a corpus, and a
        # probe kind that differs is its own warning)
        if col in models and len({v for v in models[col] if not _empty(v)}) > 1:
            out.append(f"different {what} ({per_model(col)}): the bars are not measured alike")
    if "special_first" in models and models["special_first"].nunique() > 1:
        first = [m for m, v in zip(models["model"], models["special_first"]) if v]
        out.append(f"a token before the text (BOS / CLS / a run's fixed first token) starts the windows of "
                   f"{', '.join(first)} but not of the others "
                   f"(bos settings: {per_model('bos')}): Sink_1 is the mass on a different kind of first token")
    none = [m for m, lo in zip(models["model"], models["ci_low"]) if lo is None or lo != lo]
    if none:
        out.append(f"no confidence interval for {', '.join(none)} (N = 1, or none in the file)")
    few = [f"{m} (N = {n})" for m, n, lo in zip(models["model"], models["num_samples"], models["ci_low"])
           if 1 < n < SMALL_N and not (lo is None or lo != lo)]
    if few:
        out.append(f"fewer than {SMALL_N} samples for {', '.join(few)}: their 95% intervals cover less than 95% "
                   "(a percentile bootstrap over few samples; docs/concepts.md)")
    masked = [] if "mask" not in models else [  # (a table written before the mask columns has none)
        f"{m} ({mask}: mask-aware Sink_1 {v:.1f}%)" for m, mask, v in
        zip(models["model"], models["mask"], models["sink_rate_visible_1"]) if isinstance(mask, str) and mask]
    if masked:
        out.append(f"a model's own mask hides keys in {', '.join(masked)}: its plain Sink_1 (the bars) counts the hidden "
                   "queries as 0 (under a window of w a key's plain mass cannot pass w / T); compare the mask-aware "
                   "column sink_rate_visible_1")
    return out


def _empty(v: Any) -> bool:
    """An empty cell: "" (no corpus, no mask...), None, or NaN (how a CSV reader gives an empty cell back)."""
    return v is None or (isinstance(v, str) and v == "") or (isinstance(v, float) and v != v)


def plot_comparison(models, layers, path: Path) -> Path:
    """Save :func:`comparison_figure` to ``path`` (PNG); returns ``path``."""
    import matplotlib.pyplot as plt

    fig = comparison_figure(models, layers)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def comparison_figure(models, layers):
    """The figure of ``compare.png`` (a matplotlib Figure). Two panels: Sink_1 per model (bars labelled
    ``Sink_1``, with the 95% interval where there is one; each bar labelled with its N, T and probe kind, and
    the title says when they differ) and beside it, for the models that have one, Sink* of the virtual sink
    (bars labelled ``Sink* (virtual sink)``, learned sink logits) and the gate-weighted Sink_1 (bars labelled
    ``gate-weighted Sink_1``, gated heads); sink rate at token 1 per layer over relative depth (lines, with
    dashed ``Sink*`` lines for models with a virtual sink); a third, cloze accuracy against Sink_1 (Gu et al.
    2025 Fig. 10's HellaSwag view, with 95% intervals), when two or more models were measured with ``--cloze``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    cloze = models.dropna(subset=["cloze_accuracy"]) if "cloze_accuracy" in models else models.iloc[0:0]
    if len(cloze) >= 2:
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(16, 4))
        err = [cloze["cloze_accuracy"] - cloze["cloze_ci_lo"], cloze["cloze_ci_hi"] - cloze["cloze_accuracy"]]
        c.errorbar(cloze["sink_rate_1"], cloze["cloze_accuracy"], yerr=err, fmt="o", capsize=3)
        for r in cloze.itertuples():
            c.annotate(r.model, (r.sink_rate_1, r.cloze_accuracy), fontsize=7, xytext=(3, 3), textcoords="offset points")
        c.set_xlabel("Sink_1 (%)")
        c.set_ylabel("cloze accuracy (%), 95% interval")
        c.set_title(f"cloze ({int(cloze['cloze_items'].min())}-{int(cloze['cloze_items'].max())} items) vs sink")
    else:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    xs = np.arange(len(models))
    rate = models["sink_rate_1"].to_numpy(dtype=float)
    lo, hi = models["ci_low"].to_numpy(dtype=float), models["ci_high"].to_numpy(dtype=float)  # None -> nan
    extra = [(col, label, hatch) for col, label, hatch in
             (("sink_rate_virtual", "Sink* (virtual sink)", "//"), ("sink_rate_gated_1", "gate-weighted Sink_1", ".."))
             if col in models and models[col].notna().any()]
    width = 0.8 / (1 + len(extra))
    vals = [models[col].to_numpy(dtype=float) for col, _, _ in extra]  # nan (no bar) for models without one
    # each model's bars (Sink_1, then the extras it has) side by side, the group centred on its tick
    n_bars = 1 + sum((~np.isnan(v)).astype(int) for v in vals) if vals else np.ones(len(xs), dtype=int)
    x0 = xs - (n_bars - 1) * width / 2
    a.bar(x0, rate, width=width, label="Sink_1")
    has = ~np.isnan(lo)
    if has.any():
        a.errorbar(x0[has], rate[has], yerr=[rate[has] - lo[has], hi[has] - rate[has]], fmt="none", ecolor="k", capsize=3)
    slot = np.ones(len(xs))  # the next free slot of each model's group
    for n, ((col, label, hatch), v) in enumerate(zip(extra, vals), start=1):
        ok = ~np.isnan(v)
        a.bar(x0[ok] + slot[ok] * width, v[ok], width=width, label=label, hatch=hatch, color=f"C{n}")
        slot[ok] += 1
    if extra:
        a.legend(fontsize=7)
    a.set_xticks(xs, [f"{m}\nN={n} T={t} {k}" + ("" if h else " (no CI)") for m, n, t, k, h in
                      zip(models["model"], models["num_samples"], models["seq_len"], models["probe"], has)],
                 rotation=30, ha="right", fontsize=8)
    a.set_ylabel("Sink_1 (%) with 95% CI" + (" and " + ", ".join(lbl for _, lbl, _ in extra) if extra else ""))
    unlike = [w.split(" (")[0] for w in comparison_warnings(models) if w.startswith("different")]
    a.set_title(f"sink rate at token 1 (eps = {models['eps'].iloc[0]})"
                + (f"\nwarning: {'; '.join(unlike)}" if unlike else ""), fontsize=9, color="C3" if unlike else "k")
    for i, (name, g) in enumerate(layers.groupby("model", sort=False)):
        b.plot(g["depth"], g["sink_rate_1"], marker="o", label=name, color=f"C{i}")
        if "sink_rate_virtual" in g and g["sink_rate_virtual"].notna().all():
            b.plot(g["depth"], g["sink_rate_virtual"], marker="x", ls="--", color=f"C{i}", label=f"{name}: Sink*")
    b.set_xlabel("relative layer depth l / (L - 1)")
    b.set_ylabel("sink rate at token 1 (%)")
    b.set_xlim(-0.02, 1.02)
    b.legend(fontsize=8)
    b.set_title("per layer (dashed: Sink* of the virtual sink)" if "Sink*" in " ".join(
        b.get_legend_handles_labels()[1]) else "per layer")
    fig.tight_layout()
    return fig


@dataclass(repr=False)  # Result's short repr
class CompareResult(Result):
    """What :func:`compare` returns (a :class:`~sinklab.result.Result`): the ``models`` and ``layers`` tables
    of :func:`comparison_tables`, the folders compared and the command. ``save(out)`` writes
    ``compare.csv``, ``compare_layers.csv``, ``compare.png`` and ``compare.json``; ``table()`` is ``models``."""

    FILE: ClassVar[str] = "compare.json"
    WHAT: ClassVar[str] = "sinklab compare results"

    models: Any
    layers: Any
    folders: list[str] = field(default_factory=list)
    command: str | None = None

    def table(self):
        return self.models

    def title(self) -> str:
        n = len(self.models) if hasattr(self.models, "__len__") else len(self.folders)
        return f"CompareResult: {n} measured models"

    def headline(self) -> list[tuple[str, str]]:
        """The models compared and comparison warnings."""
        names = [str(m) for m in self.models["model"]] if "model" in getattr(self.models, "columns", ()) else []
        warn = comparison_warnings(self.models)
        return [("models", ", ".join(names) or str(len(self.models)))] + ([("warnings", "; ".join(warn))] if warn else [])

    def guide(self) -> list[tuple[str, str]]:
        return [(".table() / .models", f"DataFrame, one row per model ({len(self.models)} rows)"),
                (".layers", f"DataFrame per (model, layer) ({len(self.layers)} rows)"),
                (".save(out)", "writes compare.csv, compare_layers.csv, compare.png, compare.json")]

    def to_dict(self) -> dict[str, Any]:
        """The content of ``compare.json``: the folders, the command, the warnings, versions and code."""
        from sinklab.provenance import code_version

        return {"folders": self.folders, "command": self.command, "warnings": comparison_warnings(self.models),
                "versions": versions(), "code": code_version()}

    def save(self, out: str | Path) -> Path:
        """Write ``compare.csv``, ``compare_layers.csv``, ``compare.png`` and ``compare.json`` into ``out``.

        Raises:
            InputError: ``out`` is a file.
        """
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise InputError(f"{param('out', str(out))} is a file; give a folder")
        out.mkdir(parents=True, exist_ok=True)
        self.models.to_csv(out / "compare.csv", index=False)
        self.layers.to_csv(out / "compare_layers.csv", index=False)
        plot_comparison(self.models, self.layers, out / "compare.png")
        atomic_write_text(out / "compare.json", json.dumps(self.to_dict(), indent=1))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any], folder: Path | None = None) -> "CompareResult":
        """The result of a ``compare.json`` and the two CSVs beside it: the text columns as :func:`compare`
        gives them (an empty ``corpus``, ``mask``, ``bos`` or ``dtype`` cell is "", not NaN; a model named
        ``1`` stays text), so its warnings and repr are the ones of the result that was saved."""
        import pandas as pd

        models = pd.read_csv(folder / "compare.csv", dtype=dict.fromkeys(_TEXT, str))
        for col in _TEXT:
            if col in _EMPTY_TEXT and col in models:
                models[col] = models[col].fillna("")
            elif col in models and models[col].isna().all():  # no value for any model (no cloze): None, as compare gives
                models[col] = pd.Series([None] * len(models), index=models.index, dtype=object)
        layers = pd.read_csv(folder / "compare_layers.csv", dtype={"model": str})
        return cls(models, layers, list(data.get("folders", [])), data.get("command"))


#: the text columns of comparison_tables' tables, and those whose empty value is "" (not None)
_TEXT = ("model", "folder", "mask", "input", "probe", "corpus", "bos", "dtype", "cloze_source")
_EMPTY_TEXT = ("mask", "corpus", "bos", "dtype")


def compare(folders: "Sequence[str | Path | MeasureResult]", command: str | None = None) -> CompareResult:
    """The sink rates of the measured ``folders`` side by side (:func:`comparison_tables`); ``command``:
    the command recorded (the CLI gives the command as typed). An item may also be a
    :class:`~sinklab.measure.run.MeasureResult` held in memory (its ``folder`` column: ``<in memory: MODEL>``),
    so ``compare([measure(model=a), measure(model=b)])`` writes nothing.

    Raises:
        InputError: as :func:`comparison_tables`.
    """
    models, layers = comparison_tables(folders)
    return CompareResult(models, layers, [_label(f) for f in folders], command)


def _label(item: Any) -> str:
    if hasattr(item, "to_dict") and hasattr(item, "summary"):
        return f"<in memory: {item.model.get('name', '?')}>"
    return str(item)


def write_comparison(folders: Sequence[str | Path], out: str | Path, command: str | None = None):
    """Write ``compare.csv``, ``compare_layers.csv``, ``compare.png`` and ``compare.json`` into ``out``
    (:func:`compare` then :meth:`CompareResult.save`).

    Returns:
        The ``models`` DataFrame of :func:`comparison_tables`.

    Raises:
        InputError: as :func:`comparison_tables`; ``out`` is a file.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{param('out', str(out))} is a file; give a folder")
    result = compare(folders, command)
    result.save(out)
    return result.models
