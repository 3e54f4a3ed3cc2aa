"""The registry of long-context tasks and the one function that draws items of any of them.

Each task is a :class:`TaskSpec`: how one item is built at a length and depth, the scoring rule
(:mod:`sinklab.streaming.tasks.scoring`), how many tokens an answer needs, and whether it has a depth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from sinklab.errors import InputError, param
from sinklab.registry import Registry
from sinklab.streaming.tasks.items import Haystack, TaskItem, check_grid, word_pool


@dataclass
class TaskSource:
    """What the builders draw from, prepared once per call of :func:`make_items`.

    Attributes:
        tokenizer: a ``transformers`` tokenizer.
        documents: the real text (a corpus's documents).
        words: the word pool keys and list words are drawn from (:func:`word_pool` of the documents
            unless given).
        snap: a needle moves to the nearest sentence end within this many tokens (0: never).
        corpus_name: for messages.
    """

    tokenizer: object
    documents: Sequence[str]
    words: list[str]
    snap: int = 32
    corpus_name: str = "corpus"
    _haystack: Haystack | None = None

    @property
    def haystack(self) -> Haystack:
        """The documents as a :class:`Haystack` (tokenized on first use)."""
        if self._haystack is None:
            self._haystack = Haystack(self.tokenizer, self.documents, corpus_name=self.corpus_name)
        return self._haystack


@dataclass(frozen=True)
class TaskSpec:
    """One long-context task.

    Attributes:
        name: registry name.
        build: ``build(source, length, depth, index, seed) -> TaskItem`` (depth None where ``has_depth``
            is False).
        scorer: name of the scoring rule in :data:`sinklab.streaming.tasks.scoring.SCORERS`.
        answer_tokens: greedy tokens decoded by default for an answer.
        has_depth: the task places its (first queried) needle at a depth.
        description: one line.
    """

    name: str
    build: Callable[..., TaskItem]
    scorer: str
    answer_tokens: int
    has_depth: bool
    description: str


#: long-context tasks by name: ``needle``, ``passkey`` and the RULER-style suite
TASKS: Registry[TaskSpec] = Registry("long-context task")


def register(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to :data:`TASKS`."""
    TASKS.register(spec.name, spec, description=spec.description)
    return spec


def score_item(item: TaskItem, output: str) -> float:
    """The score in [0, 1] of ``output`` (the decoded greedy continuation) on ``item``, by its task's rule."""
    from sinklab.streaming.tasks.scoring import SCORERS

    return SCORERS[TASKS.get(item.task).scorer](output, item.answers)


def make_items(tasks: Sequence[str], tokenizer, documents: Sequence[str], *, lengths: Sequence[int],
               depths: Sequence[float] = (0.0, 0.5, 1.0), n: int = 3, seed: int = 0,
               words: Sequence[str] | None = None, snap: int = 32, corpus_name: str = "corpus") -> list[TaskItem]:
    """Items of every task of ``tasks`` at every length x depth (tasks without a depth: every length
    once, depth None), ``n`` of each, in the order task, length, depth, index.

    Every item is drawn from its own random source (:func:`sinklab.streaming.tasks.items.item_rng`),
    so the same arguments give the same items, token for token, and an item does not change when
    other lengths or depths are asked for.

    Args:
        tasks: names from :data:`TASKS`.
        tokenizer: a ``transformers`` tokenizer.
        documents: the real text of the haystacks (and of the word pool unless ``words`` is given).
        lengths: prompt lengths in tokens.
        depths: needle depths in [0, 1] (0 = right after the instructions, 1 = right before the question).
        n: items per (task, length, depth).
        seed: the run's seed.
        words: the word pool for keys and word lists (default: :func:`word_pool` of ``documents``).
        snap: tokens a needle may move to sit at a sentence end (0: exactly at the depth's token).

    Raises:
        UnknownNameError: an unknown task (the valid names listed).
        InputError: an empty or bad grid, a length too short for a task's fixed parts (the message
            gives the minimum), a corpus too short for the longest haystack.
    """
    if not tasks:
        raise InputError(f"{param('tasks')} must name at least one task: {', '.join(TASKS.names())}")
    specs = [TASKS.get(t) for t in tasks]
    check_grid(lengths, depths, n)
    if snap < 0:
        raise InputError(f"{param('snap')} must be >= 0 tokens, got {snap}")
    pool = list(words) if words is not None else word_pool(documents)
    source = TaskSource(tokenizer, documents, pool, snap, corpus_name)
    out = []
    for spec in specs:
        for length in lengths:
            for depth in (depths if spec.has_depth else [None]):
                for i in range(n):
                    out.append(spec.build(source, int(length), None if depth is None else float(depth), i, seed))
    return out


__all__ = ["TASKS", "TaskSpec", "TaskSource", "register", "make_items", "score_item"]
