"""Scoring rules of the long-context tasks, and accuracy with Wilson intervals.

Every rule reads the model's greedy continuation (the decoded new tokens, special tokens dropped) and
returns a score in [0, 1]; an item is **correct** when its score is 1.

* ``first_number`` (``needle``, ``passkey``): the first run of decimal digits of the continuation equals
  the expected value exactly (``1234567`` against ``12345678`` or ``123456`` is wrong: a prefix or an
  extension is not the value).
* ``all_words`` (the RULER-style tasks): the share of the expected answers that occur in the
  continuation as whole words, case-insensitively (the item score of RULER's ``string_match_all``, Hsieh et al.
  2024, with word boundaries so that ``12`` is not found inside ``123``); correct only when all are there.

Two aggregates: the **accuracy** (share of items with score 1, all-or-nothing, with a Wilson interval; pooled over
every item of a configuration in ``tasks.json``'s ``configs``) is sinklab's; the **RULER-style score**
(:func:`task_scores`: each task's mean item score, partial credit included, then the unweighted mean over the
tasks) is how RULER aggregates (``scripts/eval/synthetic/constants.py``: ``string_match_all`` averages the found
share over items, one score per task, tasks averaged). A multi-answer task scores higher there, and a task
without depths (common words) weighs as much as one with three.
"""

from __future__ import annotations

import re
from typing import Sequence

from sinklab.metrics.proportion import wilson_interval

_DIGITS = re.compile(r"\d+")


def first_number(text: str) -> str:
    """The first run of decimal digits in ``text`` ("" if none)."""
    m = _DIGITS.search(text)
    return m.group(0) if m else ""


def score_first_number(output: str, answers: Sequence[str]) -> float:
    """1.0 when the first run of digits of ``output`` is ``answers[0]`` exactly, else 0.0."""
    return float(first_number(output) == answers[0])


def found(output: str, answer: str) -> bool:
    """True when ``answer`` occurs in ``output`` as a whole word (not inside a longer run of letters or
    digits), case-insensitively."""
    pattern = r"(?<![0-9A-Za-z])" + re.escape(answer) + r"(?![0-9A-Za-z])"
    return re.search(pattern, output, flags=re.IGNORECASE) is not None


def score_all_words(output: str, answers: Sequence[str]) -> float:
    """The share of ``answers`` found in ``output`` as whole words (:func:`found`), in [0, 1]."""
    return sum(found(output, a) for a in answers) / len(answers)


#: scoring rules by name
SCORERS = {"first_number": score_first_number, "all_words": score_all_words}


def accuracy_table(results, by: Sequence[str] = ("config", "task", "length", "depth")):
    """Accuracy per group of the per-item results, with its Wilson 95% interval.

    Args:
        results: the DataFrame of :func:`sinklab.streaming.tasks.evaluate_items` (columns ``correct``
            and ``score`` and those of ``by``).
        by: the grouping columns; a missing depth (a task without one) forms its own group.

    Returns:
        pandas DataFrame: the ``by`` columns, ``n`` (items), ``correct`` (items with score 1),
        ``accuracy`` (correct / n), ``ci_low`` / ``ci_high`` (Wilson 95%, :func:`sinklab.metrics.wilson_interval`),
        ``mean_score`` (mean of the scores: partial credit of the multi-answer tasks).
    """
    import pandas as pd

    rows = []
    for key, g in results.groupby(list(by), dropna=False, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        k, n = int(g["correct"].sum()), len(g)
        lo, hi = wilson_interval(k, n)
        rows.append({**dict(zip(by, key)), "n": n, "correct": k, "accuracy": k / n, "ci_low": lo, "ci_high": hi,
                     "mean_score": float(g["score"].mean())})
    return pd.DataFrame(rows, columns=[*by, "n", "correct", "accuracy", "ci_low", "ci_high", "mean_score"])


def task_scores(results) -> dict[str, dict]:
    """RULER's aggregation of the per-item results, per configuration: ``{config: {"tasks": {task: mean item score},
    "score": mean of the task scores}}`` (partial credit of the multi-answer tasks counted, every task weighted
    alike whatever its number of items; :func:`accuracy_table` is the all-or-nothing accuracy).

    Args:
        results: the DataFrame of :func:`sinklab.streaming.tasks.evaluate_items` (columns ``config``, ``task``,
            ``score``)."""
    out: dict[str, dict] = {}
    for cfg, g in results.groupby("config", sort=False):
        per = {str(t): float(h["score"].mean()) for t, h in g.groupby("task", sort=True)}
        out[str(cfg)] = {"tasks": per, "score": sum(per.values()) / len(per)}
    return out


__all__ = ["first_number", "score_first_number", "found", "score_all_words", "SCORERS", "accuracy_table",
           "task_scores"]
