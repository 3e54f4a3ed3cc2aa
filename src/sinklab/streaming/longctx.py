"""The long-context tasks as streaming tasks: ``sinklab stream needle | ruler`` and
``sinklab.stream(model, task="needle" | "ruler", options=NeedleOptions(...) | RulerOptions(...))``.

Each draws the items of :mod:`sinklab.streaming.tasks` (:func:`~sinklab.streaming.tasks.make_items`:
``lengths`` x ``depths`` x ``items`` per task, seeded) from the haystack corpus and answers every item
through every configuration (:func:`~sinklab.streaming.tasks.evaluate_items`): the full cache (the
ceiling; ``full``) and the cross product ``policies`` x ``budgets`` x storage (the configurations of
``sinklab stream perplexity --policy``, :func:`sinklab.streaming.harness.policy_specs`). The prompt is
fed in chunks of ``chunk`` tokens (default the cache's window ``budget - n_sink``): multi-token calls, so
the prefill-time policies (snapkv, pyramidkv, knorm) score each chunk, as :func:`sinklab.streaming.prefill.prefill`
feeds a prompt. The result (:class:`TaskResult`) holds one row per configuration and item, the accuracy
per configuration with its Wilson 95% interval, and writes nothing; ``save(out)`` writes ``items.csv``,
``accuracy.csv`` (per configuration, task, length, depth, Wilson intervals), ``heatmap.png`` and
``tasks.json`` (:func:`~sinklab.streaming.tasks.write_task_outputs`).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch

from sinklab.errors import InputError, param
from sinklab.result import DictResult
from sinklab.streaming.options import LongContextOptions, NeedleOptions, RulerOptions
from sinklab.streaming.task_registry import StreamTask, register_task

__all__ = ["TaskResult", "long_context_specs"]


class TaskResult(DictResult):
    """What the ``needle`` and ``ruler`` tasks return: the content of ``tasks.json`` (a dict: the settings,
    ``configs`` (per configuration: ``name``, ``n``, ``correct``, ``accuracy``, ``ci_low``, ``ci_high``,
    ``wall_s`` = the sum of its items' seconds), ``rows`` (one per configuration and item, the columns of
    :func:`~sinklab.streaming.tasks.evaluate_items`), ``command``). ``table()``: the accuracy per
    configuration, task, length and depth with Wilson 95% intervals
    (:func:`~sinklab.streaming.tasks.accuracy_table`); :meth:`items_frame`: the per-item DataFrame."""

    FILE = "tasks.json"
    WHAT = "long-context task results"

    def items_frame(self):
        """pandas DataFrame, one row per configuration and item (``items.csv``)."""
        import pandas as pd

        return pd.DataFrame(self.get("rows", []))

    def table(self):
        from sinklab.streaming.tasks import accuracy_table

        df = self.items_frame()
        return accuracy_table(df) if len(df) else df

    def save(self, out: str | Path) -> Path:
        from sinklab.result import out_folder
        from sinklab.streaming.tasks import write_task_outputs

        out = out_folder(out)
        write_task_outputs(out, self.items_frame(), dict(self))
        return out

    def headline(self) -> list[tuple[str, str]]:
        rows = [(k, str(self[k])) for k in ("model", "corpus", "tasks", "lengths", "depths", "items") if k in self]
        for c in (self.get("configs") or [])[:8]:
            score = "" if c.get("ruler_score") is None else f"; RULER-style score {c['ruler_score']:.3f}"
            rows.append((c["name"], f"accuracy {c['accuracy']:.3f} ({c['correct']}/{c['n']}, Wilson 95% "
                                    f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]){score}"))
        return rows

    def guide(self) -> list[tuple[str, str]]:
        return [(".table()", "DataFrame: accuracy per config, task, length, depth (Wilson 95%)"),
                (".items_frame()", f"DataFrame, one row per configuration and item ({len(self.get('rows') or [])})"),
                (".save(out)", "writes tasks.json, items.csv, accuracy.csv, heatmap.png")]


def long_context_specs(o: LongContextOptions) -> list:
    """The configurations of ``o``: the full cache (``full``) and ``policies`` x ``budgets`` x ``kv_bits`` x
    ``key_quant`` x ``sinks_full_precision`` (:func:`sinklab.streaming.harness.policy_specs`, no recompute).

    Raises:
        InputError: no configuration (``full`` off and no policy); storage options without a policy;
            ``items`` < 1; ``max_new_tokens`` or ``chunk`` < 1. UnknownNameError: an unknown policy.
    """
    from sinklab.streaming.harness import policy_specs

    if o.items < 1:
        raise InputError(f"{param('items')} must be >= 1 per cell, got {o.items}")
    for name in ("max_new_tokens", "chunk"):
        if getattr(o, name) is not None and getattr(o, name) < 1:
            raise InputError(f"{param(name)} must be >= 1, got {getattr(o, name)}")
    if not o.policies:
        given = [param(f) for f in ("budgets", "kv_bits", "key_quant", "sinks_full_precision") if getattr(o, f)]
        if given:
            raise InputError(f"{', '.join(given)} need {param('policies')} (e.g. {param('policies', 'sinks')})")
        if not o.full:
            raise InputError(f"nothing to evaluate: {param('full')} is off and no {param('policies')} given")
    return policy_specs(o.policies or (), o.budgets or (256,), n_sink=o.n_sink, kv_bits=o.kv_bits or (16,),
                        key_quant=o.key_quant or ("token",), sinks_full_precision=o.sinks_full_precision or (0,),
                        kv_group=o.kv_group, full=o.full, recompute=False)


def _run(subject, o: LongContextOptions, *, model, resume: dict | None, on_result, progress: bool,
         command: str) -> TaskResult:
    """The ``needle`` / ``ruler`` task (see the module); configurations of ``resume`` computed on the same
    items (same settings and item ids) are kept."""
    import pandas as pd

    from sinklab.provenance import code_version
    from sinklab.result import versions
    from sinklab.streaming.run import _check_subject, _load, _model_and_cache_key
    from sinklab.streaming.tasks import accuracy_table, evaluate_items, make_items
    from sinklab.streaming.tasks.scoring import task_scores
    from sinklab.zoo.corpora import load_corpus

    specs = long_context_specs(o)
    native, ctx = _check_subject(subject, model, o.corpus, specs, o.TASK)
    if native or o.corpus == "run" or subject.tokenizer is None:
        raise InputError(f"the {o.TASK} task needs a transformers model with its tokenizer and a text corpus "
                         "(the items are stated in words)")
    corp = load_corpus(o.corpus)
    tasks = o.task_names()
    items = make_items(tasks, subject.tokenizer, corp.documents, lengths=o.lengths, depths=o.depths, n=o.items,
                       seed=o.seed, corpus_name=corp.name)
    sha = hashlib.sha256(b"|".join(bytes(str(list(it.ids)), "ascii") for it in items)).hexdigest()[:16]
    key = {"task": o.TASK, "model": subject.info["name"], "corpus": corp.name, "tasks": tasks,
           "lengths": [int(x) for x in o.lengths], "depths": [float(d) for d in o.depths], "items": o.items,
           "seed": o.seed, "query_aware": o.query_aware, "chunk": o.chunk, "max_new_tokens": o.max_new_tokens,
           "items_sha": sha, "dtype": subject.info.get("dtype")}
    key.update(_model_and_cache_key(subject, o))
    done: dict[str, list[dict]] = {}
    if resume and all(resume.get(k) == v for k, v in key.items()):
        for row in resume.get("rows", []):
            done.setdefault(row["config"], []).append(row)
    meta = {"command": command, **key, "max_context": ctx,
            "title": f"{subject.info['name']} · {', '.join(tasks)} in {corp.name} · {o.items} items per cell",
            "model_info": subject.info, "corpus_source": corp.source, "versions": versions(), "code": code_version(),
            "torch_threads": torch.get_num_threads(), "load_average_at_start": _load(),
            "definitions": {
                "accuracy": "share of items answered exactly (score 1: every expected answer found by the task's "
                            "rule); ci_low/ci_high: Wilson 95% interval",
                "depth": "the (first queried) needle starts after this fraction of the haystack (0: right after the "
                         "BOS, 1: right before the question)",
                "feeding": "the prompt in chunks (default a policy cache's window budget - n_sink; the full cache in "
                           "one call) at cache positions, then greedy decoding, one token per call",
                "full": "the full cache: the ceiling, every token kept at its absolute position",
            }}
    frames: dict[str, pd.DataFrame] = {}
    walls: dict[str, float] = {}
    t0 = time.perf_counter()

    def payload() -> TaskResult:
        names = [s.name for s in specs if s.name in frames]
        rows = pd.concat([frames[n] for n in names], ignore_index=True) if names else pd.DataFrame()
        table = accuracy_table(rows, by=("config",)) if names else pd.DataFrame()
        ruler = task_scores(rows) if names else {}
        configs = [{"name": r["config"], "n": int(r["n"]), "correct": int(r["correct"]), "accuracy": float(r["accuracy"]),
                    "ci_low": float(r["ci_low"]), "ci_high": float(r["ci_high"]),
                    "ruler_score": ruler[r["config"]]["score"], "task_scores": ruler[r["config"]]["tasks"],
                    "wall_s": walls[r["config"]]}
                   for _, r in table.iterrows()]
        configs.sort(key=lambda c: names.index(c["name"]))
        records = [{k: (None if _isna(v) else v) for k, v in r.items()} for r in rows.to_dict("records")]
        return TaskResult({**meta, "wall_s": time.perf_counter() - t0, "configs": configs, "rows": records})

    for s in specs:
        if s.name in done:
            frames[s.name] = pd.DataFrame(done[s.name])
            walls[s.name] = float(sum(r["wall_s"] for r in done[s.name]))
            continue
        frames[s.name] = evaluate_items(subject.model, subject.tokenizer, items, None if s.kind == "full" else s,
                                        o.max_new_tokens, query_aware=o.query_aware, chunk=o.chunk, progress=progress)
        walls[s.name] = float(frames[s.name]["wall_s"].sum())
        if on_result is not None:
            on_result(payload())
    return payload()


def _isna(v) -> bool:
    try:
        import pandas as pd

        return v is not None and not isinstance(v, (list, tuple, str)) and bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _summary(res: TaskResult, out) -> list[str]:
    lines = [res["title"], f"{'config':<28} {'accuracy':>8} {'correct':>9}  Wilson 95%          RULER-style score"]
    for c in res["configs"]:
        score = "" if c.get("ruler_score") is None else f"  {c['ruler_score']:.3f}"
        lines.append(f"{c['name']:<28} {c['accuracy']:>8.3f} {c['correct']:>4}/{c['n']:<4}  "
                     f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]{score}")
    lines.append("accuracy: items with every answer found (all items pooled); RULER-style score: each task's mean "
                 "share of answers found, averaged over the tasks")
    lines.append(f"wrote {out}/tasks.json, items.csv, accuracy.csv (per config, task, length, depth), heatmap.png")
    return lines


register_task(StreamTask(
    "needle", NeedleOptions, _run, TaskResult,
    "Needle in a haystack of real text (a 7-digit value for a two-word key hidden at a depth, asked for at the "
    "end): accuracy per length x depth with Wilson 95% intervals and a heat-map, for the full cache (the ceiling) "
    "and every --policy x --budget x storage configuration.", summary=_summary))
register_task(StreamTask(
    "ruler", RulerOptions, _run, TaskResult,
    "RULER-style suite (single / multi-key / multi-value / multi-query needles, variable tracking, common-words "
    "extraction) in a haystack of real text: accuracy per sub-task, length and depth with Wilson 95% intervals "
    "and a heat-map, for the full cache (the ceiling) and every --policy x --budget x storage configuration.",
    summary=_summary))
