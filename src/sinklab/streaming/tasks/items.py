"""What every long-context task item is made of: the item itself, the real-text haystack, needles put in
at a depth, and the seeded random source of each item.

Positions are 0-based token indices. An item's prompt is ``context_ids + question_ids``: the context
starts with the tokenizer's own leading special tokens (a BOS where it adds one), the question ends
with the start of the answer (``... The hidden number for X is``), so that the model's greedy
continuation is the answer. Depth d in [0, 1] places a needle at token ``round(d F)`` of a body of F
filler tokens (0: at the start of the body, 1: right before the question), moved to the nearest
sentence end within ``snap`` tokens so that no word is cut; where no sentence end lies that close, it goes in
at that token and may cut a word (Kamradt's needle test walks back to the previous period however far).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Sequence

from sinklab.errors import InputError, param


@dataclass
class TaskItem:
    """One long-context question.

    Attributes:
        task: the task's name (:data:`sinklab.streaming.tasks.TASKS`).
        index: 0-based index of the item among those of one (task, length, depth).
        length: requested prompt length in tokens; ``n_tokens`` is the real one (equal for the tasks
            that cut a haystack at token level, at most ``length`` and within a list entry of it for
            ``common_words``).
        depth: where the (first queried) needle sits, in [0, 1]; None for a task without one.
        context_ids: token ids of the context (leading special tokens included).
        question_ids: token ids of the question and the start of the answer (no special tokens).
        answers: the expected answer strings (all of them are asked for).
        seed: the run's seed the item was drawn under.
        at: 0-based index in ``context_ids`` of the first token of the needle the depth refers to
            (None without one).
        context, question: the decoded text of the two parts (for reading; the ids are what is fed).
        meta: task-specific facts (the key, the other needles' positions, ...).
    """

    task: str
    index: int
    length: int
    depth: float | None
    context_ids: list[int]
    question_ids: list[int]
    answers: list[str]
    seed: int
    at: int | None = None
    context: str = ""
    question: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        """Tokens of the whole prompt (context + question)."""
        return len(self.context_ids) + len(self.question_ids)

    @property
    def ids(self) -> list[int]:
        """The prompt's token ids, context then question."""
        return list(self.context_ids) + list(self.question_ids)


def item_rng(seed: int, task: str, length: int, depth: float | None, index: int) -> random.Random:
    """The random source of one item: Python's ``random.Random`` seeded by the string
    ``"seed:task:length:depth:index"`` (seeded through sha512, the same on every machine and run,
    whatever ``PYTHONHASHSEED``), so an item does not depend on which other items are drawn."""
    return random.Random(f"{seed}:{task}:{length}:{depth}:{index}")


def check_grid(lengths: Sequence[int], depths: Sequence[float] | None, n: int) -> None:
    """Refuse an empty or bad grid.

    Raises:
        InputError: no lengths, a length < 1, a depth outside [0, 1], a length or depth given twice (its items
            would be token-identical copies counted as independent ones), or ``n`` < 1.
    """
    if not lengths or any(not isinstance(t, int) or t < 1 for t in lengths):
        raise InputError(f"{param('lengths')} must be integers >= 1 (tokens), got {list(lengths)}")
    if depths is not None and (not depths or any(not 0.0 <= d <= 1.0 for d in depths)):
        raise InputError(f"{param('depths')} must lie in [0, 1], got {list(depths)}")
    for name, values in (("lengths", lengths), ("depths", depths or ())):
        if len(set(values)) != len(values):
            raise InputError(f"{param(name)} repeats a value, {list(values)}: its items would be the same prompts "
                             "counted twice; give each once (more items per cell give more samples)")
    if n < 1:
        raise InputError(f"{param('n')} (items per length and depth) must be >= 1, got {n}")


def prefix_ids(tokenizer) -> list[int]:
    """The tokenizer's own leading special tokens (a BOS where it adds one)."""
    from sinklab.probe.inputs import bos_tokens

    return list(bos_tokens(tokenizer, "auto")[0])


def plain_ids(tokenizer, text: str) -> list[int]:
    """Token ids of ``text``, no special tokens."""
    from sinklab.probe.inputs import tokenize_plain

    return list(tokenize_plain(tokenizer, text))


class Haystack:
    """Real text to hide needles in: a corpus's documents, tokenized once, read from a chosen document on
    and joined by a blank line (as :func:`sinklab.streaming.harness.token_stream` joins them).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        documents: plain-text documents (at least one with text).
        corpus_name: for messages.

    Raises:
        InputError: no document with text.
    """

    def __init__(self, tokenizer, documents: Sequence[str], *, corpus_name: str = "corpus") -> None:
        from sinklab.probe.cache import tokenize_documents

        docs = [list(map(int, d)) for d in tokenize_documents(tokenizer, list(documents)) if len(d)]
        if not docs:
            raise InputError(f"corpus {corpus_name} has no text for a haystack")
        self.tokenizer, self.docs, self.corpus_name = tokenizer, docs, corpus_name
        self.sep = plain_ids(tokenizer, "\n\n")
        self.total = sum(len(d) for d in docs) + len(self.sep) * (len(docs) - 1)
        self._ends: dict[int, tuple[bool, bool]] = {}

    def tokens(self, n: int, start_doc: int) -> list[int]:
        """The first ``n`` ids of the documents read from ``start_doc`` on (wrapping round to the first).

        Raises:
            InputError: the corpus has fewer than ``n`` tokens (says how many).
        """
        if n > self.total:
            raise InputError(f"corpus {self.corpus_name} has {self.total} tokens in all, fewer than the {n} a haystack "
                             "needs here")
        out: list[int] = []
        k = len(self.docs)
        for j in range(k):
            if len(out) >= n:
                break
            if out:
                out.extend(self.sep)
            out.extend(self.docs[(start_doc + j) % k])
        return out[:n]

    def sentence_ends(self, ids: Sequence[int]) -> list[int]:
        """Positions p in 0..len(ids) before which a sentence or line ends and the next word has not begun:
        token p - 1 ends with ``.``, ``!``, ``?`` (a closing quote or bracket may follow) or holds a line
        break, and token p starts with white space; 0 and len(ids) included. A needle put there (it starts
        with a space) reads as a sentence of its own."""
        out = [0]
        for p in range(1, len(ids)):
            a, b = self._kind(ids[p - 1]), self._kind(ids[p])
            if a[0] and b[1]:
                out.append(p)
        if len(ids):
            out.append(len(ids))
        return out

    def _kind(self, t: int) -> tuple[bool, bool]:
        """(ends a sentence or holds a line break, starts with white space) of token ``t``, cached."""
        if t not in self._ends:
            s = self.tokenizer.decode([t])
            self._ends[t] = ("\n" in s or bool(_SENTENCE_END.search(s)), s[:1].isspace())
        return self._ends[t]


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")


def snap_to(target: int, allowed: Sequence[int], snap: int) -> int:
    """The position of ``allowed`` (sorted) nearest ``target`` if within ``snap`` tokens of it (ties: the
    earlier one), else ``target`` itself."""
    import bisect

    i = bisect.bisect_left(allowed, target)
    best = None
    for j in (i - 1, i):
        if 0 <= j < len(allowed) and abs(allowed[j] - target) <= snap:
            if best is None or abs(allowed[j] - target) < abs(best - target):
                best = allowed[j]
    return target if best is None else best


def depth_position(depth: float, body: int, allowed: Sequence[int] | None = None, snap: int = 0) -> int:
    """Token index in a body of ``body`` filler tokens where a needle at ``depth`` goes: ``round(depth
    body)``, then the nearest of ``allowed`` within ``snap`` tokens (:func:`snap_to`)."""
    target = int(round(depth * body))
    return target if not allowed or snap <= 0 else snap_to(target, allowed, snap)


def insert_needles(body: Sequence[int], needles: Sequence[tuple[int, list[int]]]) -> tuple[list[int], list[int]]:
    """``body`` with each needle's ids put before body token ``pos`` (needles at the same position in the
    order given).

    Args:
        body: filler ids.
        needles: (position in 0..len(body), ids) pairs, in any order.

    Returns:
        (ids, starts): the joined ids and, per needle in the order given, the index of its first token.
    """
    order = sorted(range(len(needles)), key=lambda i: (needles[i][0], i))
    out: list[int] = []
    starts = [0] * len(needles)
    prev = 0
    for i in order:
        pos, ids = needles[i]
        out.extend(body[prev:pos])
        starts[i] = len(out)
        out.extend(ids)
        prev = pos
    out.extend(body[prev:])
    return out, starts


_WORD = re.compile(r"[a-z]{4,10}")


def word_pool(documents: Sequence[str], *, limit: int = 20000) -> list[str]:
    """Distinct lower-case words of 4 to 10 letters of ``documents`` (whole alphabetic runs of the
    lower-cased text), sorted: the vocabulary the synthetic tasks draw keys and list words from, in
    the corpus's own language. At most ``limit`` documents' worth of text is read (all by default)."""
    seen: set[str] = set()
    for d in documents[:limit]:
        for w in re.findall(r"[A-Za-z]+", d):
            w = w.lower()
            if _WORD.fullmatch(w):
                seen.add(w)
    return sorted(seen)


def number(rng: random.Random, digits: int = 7) -> str:
    """A random ``digits``-digit decimal number (no leading zero)."""
    return str(rng.randrange(10 ** (digits - 1), 10**digits))


def distinct(rng: random.Random, n: int, draw) -> list:
    """``n`` distinct values of ``draw()``.

    Raises:
        InputError: ``draw`` cannot give n distinct values in 100 n tries.
    """
    out: list = []
    for _ in range(100 * n + 100):
        if len(out) == n:
            return out
        v = draw()
        if v not in out:
            out.append(v)
    if len(out) == n:
        return out
    raise InputError(f"could not draw {n} distinct values (the word pool is too small)")


def finish(task: str, tokenizer, index: int, length: int, depth: float | None, context_ids: list[int],
           question_ids: list[int], answers: list[str], seed: int, at: int | None, **meta) -> TaskItem:
    """A :class:`TaskItem` with the decoded text of its parts."""
    return TaskItem(task=task, index=index, length=length, depth=depth, context_ids=context_ids,
                    question_ids=question_ids, answers=answers, seed=seed, at=at,
                    context=tokenizer.decode(context_ids), question=tokenizer.decode(question_ids), meta=meta)


def too_short(task: str, length: int, need: int) -> InputError:
    """The refusal of a length that cannot hold the task's fixed parts."""
    return InputError(f"{param('lengths', length)} is too short for task {task}: its needles, instructions and question "
                      f"take {need} tokens; give at least {need + 1}")


__all__ = ["TaskItem", "Haystack", "item_rng", "check_grid", "word_pool", "insert_needles", "depth_position",
           "snap_to"]
