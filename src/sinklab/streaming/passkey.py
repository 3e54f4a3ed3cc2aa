"""Pass-key retrieval through a cache: ``sinklab stream passkey``.

A random 5-digit pass key is inserted at a chosen depth of a long stream of real text (one needle, NEEDLE, that states it twice) and asked
for at the end (the pass-key task of Mohtashami & Jaggi 2023, here fed as a stream through the cache under
test, in the spirit of StreamingLLM's streaming evaluation, Xiao et al. 2024: the answer must survive the cache's
evictions; how it departs from the original task: docs/streaming.md, "Departures").
Each sample is ``filler[:at] + NEEDLE + filler[at:] + QUESTION``, all samples of a run the same
length N; the stream is fed through the cache under test (token by token by default, cache
positions for a :class:`~sinklab.streaming.SinkCache`, absolute ones for the full cache), then
``answer_tokens`` tokens are decoded greedily, up to the first EOS (what follows it is not part of the answer, as in
the long-context tasks); the answer is the first run of digits, correct when it is the key
exactly (:func:`sinklab.streaming.tasks.scoring.first_number`, the rule of the long-context tasks' ``passkey``:
``604941`` or ``6049`` for the key ``60494`` is wrong).
Accuracy is the share of samples whose answer is the key, per depth and over all.

Depth d in [0, 1] (0-based token positions): the needle starts at token ``P + round(d (F - P))``
of the filler of F tokens, P its leading special tokens (a BOS): 0 right after the BOS, 1 right
before the question.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor

from sinklab.errors import InputError, param
from sinklab.models import input_device
from sinklab.streaming.tasks.scoring import first_number
from sinklab.progress import progress as show_progress

NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "\n\nWhat is the pass key? The pass key is"
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class PasskeySample:
    """ids (N,) int64; key the 5 digits; depth in [0, 1]; at: 0-based index of the needle's first token."""

    ids: Tensor
    key: str
    depth: float
    at: int


@dataclass
class PasskeyResult:
    """One configuration's retrieval (one object of ``passkey.json``'s ``configs``).

    accuracy: share of samples answered right, in [0, 1]; accuracy_by_depth: {str(depth): share};
    samples: per sample {depth, key, answer (the first run of digits, "" if none), text, correct};
    wall_s: time to feed and answer every sample.
    """

    name: str
    policy: str | None
    budget: int | None
    n_sink: int | None
    kv_bits: int
    kv_group: int
    key_quant: str
    sinks_full_precision: int
    accuracy: float
    accuracy_by_depth: dict[str, float]
    n: int
    wall_s: float
    attn_implementation: str | None = None
    samples: list[dict] = field(default_factory=list)


def passkey_samples(tokenizer, documents: Sequence[str], n_tokens: int, *, keys: int = 20,
                    depths: Sequence[float] = DEFAULT_DEPTHS, seed: int = 0,
                    corpus_name: str = "corpus") -> list[PasskeySample]:
    """``keys`` random distinct 5-digit keys (Python's ``random.Random(seed)``) x ``depths``, each sample
    ``n_tokens`` long (depth-major order).

    The filler is :func:`sinklab.streaming.harness.token_stream` of ``documents`` (the same text for
    every sample, cut to fit the needle, whose length may differ by key).

    Raises:
        InputError: ``keys`` outside 1..90000, a depth outside [0, 1] or given twice, or ``n_tokens`` too short for the
            needle and the question (the message gives the minimum); a corpus shorter than the filler.
    """
    from sinklab.probe.inputs import bos_tokens, tokenize_plain
    from sinklab.streaming.harness import token_stream

    if not 1 <= keys <= 90000:
        raise InputError(f"{param('keys')} must lie in 1..90000, got {keys}")
    bad = [d for d in depths if not 0.0 <= d <= 1.0]
    if bad or not depths:
        raise InputError(f"{param('depths')} must lie in [0, 1], got {list(depths)}")
    if len(set(depths)) != len(depths):
        raise InputError(f"{param('depths')} repeats a depth, {list(depths)}: its samples would be the same "
                         "prompts counted twice; give each once (more keys give more samples)")
    rng = random.Random(seed)
    key_list = [str(k) for k in rng.sample(range(10000, 100000), keys)]
    question = list(tokenize_plain(tokenizer, QUESTION))
    needles = {k: list(tokenize_plain(tokenizer, NEEDLE.format(key=k))) for k in key_list}
    prefix = len(bos_tokens(tokenizer, "auto")[0])
    shortest = min(len(v) for v in needles.values())
    need = max(len(v) for v in needles.values()) + len(question) + prefix + 1
    if n_tokens < need:
        raise InputError(f"{param('tokens', n_tokens)} is too short for the pass key task: the needle and the question need "
                         f"at least {need} tokens")
    filler = token_stream(tokenizer, documents, n_tokens - shortest - len(question), corpus_name=corpus_name).tolist()
    out = []
    for depth in depths:
        for k in key_list:
            nd = needles[k]
            F = n_tokens - len(nd) - len(question)
            at = prefix + round(depth * (F - prefix))
            ids = filler[:at] + nd + filler[at:F] + question
            out.append(PasskeySample(torch.tensor(ids, dtype=torch.long), k, float(depth), at))
    return out


@torch.no_grad()
def evaluate_passkey(model, tokenizer, samples: Sequence[PasskeySample], spec, *, batch: int = 20, chunk: int = 1,
                     answer_tokens: int = 8, max_context: int | None = None,
                     progress: bool = True) -> PasskeyResult:
    """Feed every sample through ``spec``'s cache (rows of equal length batched ``batch`` at a time,
    ``chunk`` tokens per call), decode ``answer_tokens`` greedily (a row's answer ends at its first EOS), score
    the answers.

    Args:
        spec: a :class:`sinklab.streaming.harness.CacheSpec` of kind ``full`` or ``sink``.
        chunk: tokens per call while feeding (1: streaming, one token at a time; larger: the chunk
            attends to the kept tokens and to itself, then the cache is cut).

    Raises:
        InputError: ``recompute`` (not a cache), ``batch`` or ``chunk`` < 1, a full cache on samples
            longer than ``max_context``.
    """
    from sinklab.streaming.harness import _new_cache, attention_for, step_batch

    if spec.kind not in ("full", "sink"):
        raise InputError(f"the pass key task runs through a cache: full or a policy, not {spec.kind}")
    if batch < 1 or chunk < 1:
        raise InputError(f"{param('batch')} and {param('chunk')} must be >= 1, got {batch} and {chunk}")
    n = samples[0].ids.numel()
    if spec.kind == "full" and max_context is not None and n + answer_tokens > max_context:
        raise InputError(f"the full cache needs {n + answer_tokens} positions, more than the model's context of "
                         f"{max_context}")
    device = input_device(model)
    eos = getattr(tokenizer, "eos_token_id", None)
    rows: list[dict] = []
    t_start = time.perf_counter()
    groups = [list(samples[i : i + batch]) for i in range(0, len(samples), batch)]
    bar = show_progress(range(len(groups) * math.ceil(n / chunk)), desc=f"passkey {spec.name}", unit="call",
                        enabled=progress)
    it = iter(bar)
    with attention_for(model, spec) as attn:
        for group in groups:
            if any(s.ids.numel() != n for s in group):
                raise InputError("pass key samples of one run must have the same length")
            x = torch.stack([s.ids for s in group]).to(device)  # (b, n)
            cache = _new_cache(model, spec, max_context)

            def start(t: int) -> int:
                return t if spec.kind == "full" else cache.kept_length()

            logits = None
            for a in range(0, n, chunk):
                b = min(n, a + chunk)
                logits = step_batch(model, x[:, a:b], cache, start(a), last_only=True)  # (b, 1, V)
                next(it, None)
            gen = []
            t = n
            for _ in range(answer_tokens):
                nxt = logits[:, -1].argmax(-1, keepdim=True)  # (b, 1)
                gen.append(nxt)
                logits = step_batch(model, nxt, cache, start(t), last_only=True)
                t += 1
            out = torch.cat(gen, dim=1).tolist()
            for s, toks in zip(group, out):
                if eos is not None and eos in toks:  # the answer ends at EOS (the rows decode on together)
                    toks = toks[: toks.index(eos) + 1]
                text = tokenizer.decode(toks, skip_special_tokens=True)
                ans = first_number(text)
                rows.append({"depth": s.depth, "key": s.key, "answer": ans, "text": text, "correct": ans == s.key})
    by_depth: dict[str, list[bool]] = {}
    for r in rows:
        by_depth.setdefault(str(r["depth"]), []).append(r["correct"])
    return PasskeyResult(
        name=spec.name, policy=spec.policy, budget=spec.budget, n_sink=spec.n_sink, kv_bits=spec.kv_bits,
        kv_group=spec.kv_group, key_quant=spec.key_quant, sinks_full_precision=spec.sinks_full_precision,
        accuracy=sum(r["correct"] for r in rows) / len(rows),
        accuracy_by_depth={d: sum(v) / len(v) for d, v in by_depth.items()}, n=len(rows),
        wall_s=time.perf_counter() - t_start, attn_implementation=attn, samples=rows)


def write_passkey_outputs(out: Path, meta: dict, results: Sequence[PasskeyResult]) -> None:
    """``passkey.json`` (meta + ``configs``), ``passkey.csv`` (one row per configuration and sample),
    ``passkey_accuracy.csv`` (configuration x depth) and ``passkey.png`` (accuracy against depth)."""
    import json
    from dataclasses import asdict

    import pandas as pd

    from sinklab.fileio import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "passkey.json", json.dumps({**meta, "configs": [asdict(r) for r in results]}, indent=2) + "\n")
    cols = ["name", "policy", "budget", "n_sink", "kv_bits", "key_quant", "sinks_full_precision"]
    ints = {"budget": "Int64", "n_sink": "Int64"}
    samples = [{"config": r.name, **{c: getattr(r, c) for c in cols[1:]}, **s} for r in results for s in r.samples]
    pd.DataFrame(samples).astype(ints).to_csv(out / "passkey.csv", index=False)
    acc = [{"config": r.name, **{c: getattr(r, c) for c in cols[1:]}, "depth": float(d), "accuracy": a,
            "n": sum(1 for s in r.samples if str(s["depth"]) == d)} for r in results for d, a in r.accuracy_by_depth.items()]
    pd.DataFrame(acc).astype(ints).to_csv(out / "passkey_accuracy.csv", index=False)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        ds = sorted(r.accuracy_by_depth, key=float)
        ax.plot([float(d) for d in ds], [r.accuracy_by_depth[d] for d in ds], marker="o", ms=4,
                label=f"{r.name} ({r.accuracy:.0%})")
    ax.set_xlabel("depth of the pass key in the stream (0 = start, 1 = just before the question)")
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title(meta.get("title", ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "passkey.png", dpi=120)
    plt.close(fig)


def result_from_dict(d: dict) -> PasskeyResult:
    """Inverse of ``dataclasses.asdict`` for a saved configuration."""
    return PasskeyResult(**d)


__all__ = ["NEEDLE", "QUESTION", "DEFAULT_DEPTHS", "PasskeySample", "PasskeyResult", "passkey_samples",
           "evaluate_passkey", "write_passkey_outputs"]
