"""Many streams: the perplexity / agreement task over a set of documents, with intervals over streams.

One stream of one corpus cannot tell a 1% difference from the text's own variation. Here every stream
is one document (the first ``tokens`` tokens of it, after the tokenizer's BOS), drawn from one or more
corpora, every configuration is evaluated on every stream (:func:`sinklab.streaming.harness.evaluate_stream`),
and each figure is reported as a mean over streams with a 95% **t-interval over streams**
(:func:`sinklab.metrics.intervals.t_interval`; the streams are the units, so n = number of streams and
the interval needs no seed). Configurations are compared **paired by stream**
(:func:`sinklab.metrics.intervals.paired_comparison`): "A better than B" only where the interval of
the mean per-stream difference excludes zero, else "inconclusive".

Figures per stream: ``nll`` (mean next-token NLL in nats over the scored positions; the stream's
perplexity is exp(nll)), ``kl`` (mean KL(p_full || p_config), nats) and ``top1`` (share of positions whose
argmax agrees with the full cache's). Over streams: ``ppl`` = exp(mean nll over streams) (the geometric
mean of the streams' perplexities) with exp of the nll interval; ``kl`` and ``top1`` their means with
their t-intervals. Paired ``nll`` differences are also given as perplexity ratios exp(diff).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

import numpy as np
from torch import Tensor

from sinklab.errors import InputError, param
from sinklab.metrics.intervals import paired_comparison, t_interval

#: figure -> whether lower is better (the direction of a paired verdict)
FIGURES = {"nll": True, "kl": True, "top1": False}


@dataclass
class StreamSource:
    """One stream of a set: ``ids`` (N,) int64, the first N tokens of document ``document`` (0-based index in
    the corpus) of ``corpus``."""

    corpus: str
    document: int
    title: str
    ids: Tensor

    def info(self) -> dict:
        """The stream's identity as recorded in ``stream.json`` (no ids; their sha256, first 16 hex digits)."""
        return {"corpus": self.corpus, "document": self.document, "title": self.title, "tokens": int(self.ids.numel()),
                "stream_sha": hashlib.sha256(self.ids.numpy().tobytes()).hexdigest()[:16]}


def split_counts(n_streams: int, n_corpora: int) -> list[int]:
    """Streams per corpus: ``n_streams`` split as evenly as possible, the first corpora taking one more
    where it does not divide (8 over 2: [4, 4]; 7 over 2: [4, 3])."""
    base, extra = divmod(n_streams, n_corpora)
    return [base + (i < extra) for i in range(n_corpora)]


def document_streams(tokenizer, corpora: Sequence, n_streams: int, tokens: int) -> list[StreamSource]:
    """``n_streams`` streams of ``tokens`` tokens, one document each, split evenly between ``corpora``
    (:func:`split_counts`). Within a corpus the documents with at least ``tokens`` tokens (the BOS
    included) are eligible, and k of the M eligible ones are taken evenly spaced, index
    floor((i + 1/2) M / k) for i = 0..k-1 (deterministic: no seed).

    Args:
        tokenizer: a Hugging Face tokenizer.
        corpora: :class:`sinklab.zoo.corpora.Corpus` objects (``name``, ``documents``, ``titles``).
        n_streams: >= 1. tokens: stream length N >= 2.

    Returns:
        The streams, corpus by corpus, documents in corpus order.

    Raises:
        InputError: ``n_streams`` < number of corpora, or a corpus with fewer eligible documents than its
            share (says how many it has).
    """
    from sinklab.probe.cache import tokenize_documents
    from sinklab.probe.inputs import bos_tokens
    from sinklab.streaming.harness import token_stream

    if n_streams < len(corpora):
        raise InputError(f"{param('streams', n_streams)} must be at least the number of corpora ({len(corpora)})")
    prefix, _ = bos_tokens(tokenizer, "auto")
    out: list[StreamSource] = []
    for corp, k in zip(corpora, split_counts(n_streams, len(corpora))):
        lengths = [len(d) for d in tokenize_documents(tokenizer, list(corp.documents))]
        eligible = [i for i, n in enumerate(lengths) if len(prefix) + n >= tokens]
        if len(eligible) < k:
            raise InputError(f"corpus {corp.name} has {len(eligible)} documents of at least {param('tokens', tokens)} "
                             f"tokens, fewer than the {k} streams asked of it")
        for i in range(k):
            d = eligible[int((i + 0.5) * len(eligible) / k)]
            ids = token_stream(tokenizer, [corp.documents[d]], tokens, corpus_name=corp.name)
            out.append(StreamSource(corp.name, d, corp.titles[d] if d < len(corp.titles) else str(d), ids))
    return out


def _figures(r) -> dict[str, float | None]:
    """One configuration's figures on one stream (a ``stream.json`` config dict)."""
    nll = math.log(r["ppl"]) if r.get("ppl") else None  # ppl = exp(mean NLL over the scored positions)
    return {"nll": nll, "kl": r.get("kl"), "top1": r.get("top1")}


def _paired_figures(a: dict, b: dict) -> tuple[dict, dict, str] | None:
    """Two configurations' figures on one stream over the same positions, and which positions: every scored
    position when both scored the same ones; else (the full cache stopped at the model's context) the positions
    with a full-cache reference, where both have them (``ppl_agreement``); else None (not comparable)."""
    if a.get("positions") == b.get("positions") and a.get("evaluated") == b.get("evaluated"):
        return _figures(a), _figures(b), "scored"
    if a.get("ppl_agreement") and b.get("ppl_agreement") and a.get("agreement_positions") == b.get("agreement_positions"):
        fa, fb = _figures(a), _figures(b)
        fa["nll"], fb["nll"] = math.log(a["ppl_agreement"]), math.log(b["ppl_agreement"])
        return fa, fb, "reference"
    return None


def summarize_streams(streams: Sequence[dict], level: float = 0.95) -> tuple[list[dict], list[dict]]:
    """The summary over streams of a multi-stream run, and the paired comparisons.

    Args:
        streams: ``stream.json``'s ``streams``: dicts with ``configs`` (each a config dict as
            :class:`~sinklab.streaming.harness.StreamConfigResult` writes it).
        level: interval coverage.

    Returns:
        (configs, comparisons): one dict per configuration (in first-seen order) with ``n_streams``, each
        figure's mean / ``_low`` / ``_high`` (``ppl`` = exp of the nll ones), the mean per-chunk
        ``ppl_by_chunk`` / ``kl_by_chunk`` / ``top1_by_chunk`` (ppl: exp of the mean chunk NLL), the mean
        latency and cache bytes; one dict per (pair, figure) with the interval of mean(A - B) over the
        streams both have, ``better`` (A's name, B's, or ``inconclusive``) and for nll the perplexity
        ratio. Recompute (scored at other positions) and the full cache's trivial kl / top1 are left out of
        the comparisons. A pair is compared on each stream over the same positions: every position both
        scored, or, where the full cache stopped at the model's context and the other did not, the positions
        with a full-cache reference (``ppl_agreement``); the row's ``positions`` says which (``scored``,
        ``reference``, ``mixed``).
    """
    by_name: dict[str, list[tuple[int, dict]]] = {}
    for s, st in enumerate(streams):
        for c in st["configs"]:
            by_name.setdefault(c["name"], []).append((s, c))
    configs = []
    for name, rows in by_name.items():
        first = rows[0][1]
        row = {k: first.get(k) for k in ("name", "policy", "budget", "n_sink", "window", "kv_bits", "key_quant",
                                        "sinks_full_precision")}
        row["n_streams"] = len(rows)
        figs = [_figures(c) for _, c in rows]
        for f in FIGURES:
            xs = [x[f] for x in figs if x[f] is not None]
            iv = t_interval(xs, level) if xs else None
            row[f] = None if iv is None else iv.mean
            row[f"{f}_low"] = None if iv is None else iv.low
            row[f"{f}_high"] = None if iv is None else iv.high
        row["ppl"] = None if row["nll"] is None else math.exp(row["nll"])
        row["ppl_low"] = None if row["nll_low"] is None else math.exp(row["nll_low"])
        row["ppl_high"] = None if row["nll_high"] is None else math.exp(row["nll_high"])
        for key, tr in (("nll_by_chunk", math.exp), ("kl_by_chunk", None), ("top1_by_chunk", None)):
            chunks = [c.get(key) or [] for _, c in rows]
            width = max((len(x) for x in chunks), default=0)
            means = []
            for j in range(width):
                xs = [x[j] for x in chunks if j < len(x) and x[j] is not None]
                means.append(None if not xs else (tr(float(np.mean(xs))) if tr else float(np.mean(xs))))
            row["ppl_by_chunk" if key == "nll_by_chunk" else key] = means
        timed = [c for _, c in rows if c["latency_ms_per_token"] is not None
                 and math.isfinite(c["latency_ms_per_token"])]  # the streams whose decode steps were timed
        row["latency_ms_per_token"] = float(np.mean([c["latency_ms_per_token"] for c in timed])) if timed else None
        row["cache_bytes"] = float(np.mean([c["cache_bytes"] for c in timed])) if timed else None
        row["timed_streams"] = len(timed)
        row["evaluated"] = int(sum(c["evaluated"] for _, c in rows))
        configs.append(row)
    comparisons = []
    names = [n for n in by_name if n != "recompute"]
    for a, b in combinations(names, 2):
        ca, cb = dict(by_name[a]), dict(by_name[b])
        paired = {s: _paired_figures(ca[s], cb[s]) for s in ca if s in cb}
        if any(p is None for p in paired.values()):
            import warnings

            warnings.warn(f"{a} vs {b}: {sum(p is None for p in paired.values())} stream(s) left out of their paired "
                          "comparison: the two scored different positions (the full cache stopped at the model's "
                          "context) and no perplexity over the full cache's positions was recorded (agreement off, "
                          "or a stream.json written before it)", stacklevel=2)
        paired = {s: p for s, p in paired.items() if p is not None}
        for f, lower in FIGURES.items():
            if f != "nll" and "full" in (a, b):
                continue
            use = [s for s, (fa, fb, _) in paired.items() if fa[f] is not None and fb[f] is not None]
            if not use:
                continue
            c = paired_comparison([paired[s][0][f] for s in use], [paired[s][1][f] for s in use], names=(a, b),
                                  lower_is_better=lower, level=level)
            over = {paired[s][2] for s in use}
            row = {"figure": f, **c.to_dict(),
                   # nll: every position both scored, or (the full cache stopped at the model's context) the
                   # positions the full cache scored; kl and top-1 always rest on those
                   "positions": "reference" if f != "nll" else ("scored" if over == {"scored"} else
                                                                 "reference" if over == {"reference"} else "mixed")}
            if f == "nll":
                row.update({"ppl_ratio": math.exp(c.difference.mean),
                            "ppl_ratio_low": None if c.difference.low is None else math.exp(c.difference.low),
                            "ppl_ratio_high": None if c.difference.high is None else math.exp(c.difference.high)})
            comparisons.append(row)
    return configs, comparisons


def per_stream_table(streams: Sequence[dict]) -> list[dict]:
    """Tidy rows: one per (stream, configuration) with the stream's identity and its figures
    (``nll``, ``ppl`` = exp(nll), ``kl``, ``top1``)."""
    rows = []
    for s, st in enumerate(streams):
        for c in st["configs"]:
            f = _figures(c)
            rows.append({"stream": s, **{k: st["info"][k] for k in ("corpus", "document", "title")},
                         "config": c["name"], "policy": c.get("policy"), "budget": c.get("budget"),
                         "kv_bits": c.get("kv_bits"), "nll": f["nll"],
                         "ppl": None if f["nll"] is None else math.exp(f["nll"]), "kl": f["kl"], "top1": f["top1"]})
    return rows





def stream_set_payload(meta: dict, streams: Sequence[dict], level: float = 0.95) -> dict:
    """The ``stream.json`` content of a multi-stream run: ``meta``, ``interval``, ``streams`` (each stream's
    ``info`` and ``configs``), ``configs`` (the summary over streams) and ``comparisons``
    (:func:`summarize_streams`)."""
    configs, comparisons = summarize_streams(streams, level)
    return {**meta, "level": level,
            "interval": f"{level:.0%} t-interval over streams (n = streams; no resampling, no seed)",
            "streams": list(streams), "configs": configs, "comparisons": comparisons}


def write_stream_set(out, payload: dict) -> None:
    """Write a multi-stream run's :func:`stream_set_payload`: ``stream.json``, ``stream.csv`` (the summary, one
    row per configuration), ``stream_by_stream.csv`` (:func:`per_stream_table`), ``stream_comparisons.csv``,
    ``stream_by_chunk.csv`` (mean per chunk over streams) and ``stream_ppl.png``."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    import pandas as pd

    from sinklab.fileio import atomic_write_text
    from sinklab.streaming.harness import plot_ppl

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    configs, streams, chunk = payload["configs"], payload["streams"], payload["chunk"]
    atomic_write_text(out / "stream.json", json.dumps(payload, indent=2) + "\n")
    ints = {"n_sink": "Int64", "window": "Int64", "budget": "Int64"}
    pd.DataFrame([{k: v for k, v in c.items() if not k.endswith("by_chunk")} for c in configs]).astype(ints).to_csv(
        out / "stream.csv", index=False)
    pd.DataFrame(per_stream_table(streams)).astype({"budget": "Int64"}).to_csv(out / "stream_by_stream.csv", index=False)
    pd.DataFrame(payload["comparisons"]).to_csv(out / "stream_comparisons.csv", index=False)
    rows = [{"config": c["name"], "chunk": j, "start": j * chunk, "end": min((j + 1) * chunk, payload["tokens"] - 1), "ppl": p,
             "kl": (c["kl_by_chunk"][j] if j < len(c["kl_by_chunk"]) else None),
             "top1": (c["top1_by_chunk"][j] if j < len(c["top1_by_chunk"]) else None)}
            for c in configs for j, p in enumerate(c["ppl_by_chunk"])]
    pd.DataFrame(rows).to_csv(out / "stream_by_chunk.csv", index=False)
    plot_ppl([SimpleNamespace(name=c["name"], ppl_by_chunk=c["ppl_by_chunk"], ppl=c["ppl"], window=c["window"],
                              evaluated=c["evaluated"]) for c in configs], chunk, out / "stream_ppl.png",
             title=payload.get("title", "") + f" · mean over {len(streams)} streams")


__all__ = ["StreamSource", "document_streams", "split_counts", "summarize_streams", "per_stream_table", "FIGURES",
           "stream_set_payload", "write_stream_set"]
