"""Needle in a haystack over real text, and the pass key as a task item.

``needle`` (Kamradt's needle-in-a-haystack test, 2023, with a key so that the question names what
to find, as RULER's single needle does, Hsieh et al. 2024): one sentence ``NEEDLE`` stating a
7-digit value for a two-word key is hidden at a depth of a haystack of real text (a corpus's
documents, read from a seeded document on), and the question asks for the key's value. The prompt
is ``BOS + body[:p] + needle + body[p:] + question``, exactly ``length`` tokens, the body F filler
tokens, p = round(depth F) moved to the nearest sentence end within ``snap`` tokens.
Scoring: ``first_number`` (the first run of digits of the continuation is the value exactly).

``passkey``: the items of :func:`sinklab.streaming.passkey.passkey_samples` (Mohtashami & Jaggi
2023; a 5-digit key stated twice at a depth of the real-text stream), one key per item, scored by
``first_number``, as ``sinklab stream passkey`` is.
"""

from __future__ import annotations

from typing import Sequence

from sinklab.streaming.tasks.items import (
    TaskItem, depth_position, finish, insert_needles, item_rng, number, plain_ids, prefix_ids, too_short,
)
from sinklab.streaming.tasks.registry import TaskSource, TaskSpec, make_items, register

NEEDLE = " The hidden number for {key} is {value}."
QUESTION = "\n\nQuestion: What is the hidden number for {key}?\nAnswer: The hidden number for {key} is"


def build_needle(src: TaskSource, length: int, depth: float, index: int, seed: int) -> TaskItem:
    """One ``needle`` item (see the module); meta: ``key``, ``body_tokens`` F, ``body_position`` p.

    Raises:
        InputError: ``length`` too short for the needle and the question; a corpus shorter than the body.
    """
    tok = src.tokenizer
    rng = item_rng(seed, "needle", length, depth, index)
    key = "-".join(rng.sample(src.words, 2))
    value = number(rng, 7)
    start_doc = rng.randrange(len(src.documents))
    prefix = prefix_ids(tok)
    needle = plain_ids(tok, NEEDLE.format(key=key, value=value))
    question = plain_ids(tok, QUESTION.format(key=key))
    body_n = length - len(prefix) - len(needle) - len(question)
    if body_n < 1:
        raise too_short("needle", length, length - body_n)
    body = src.haystack.tokens(body_n, start_doc)
    pos = depth_position(depth, body_n, src.haystack.sentence_ends(body) if src.snap else None, src.snap)
    ids, starts = insert_needles(body, [(pos, needle)])
    return finish("needle", tok, index, length, depth, prefix + ids, question, [value], seed, len(prefix) + starts[0],
                  key=key, body_tokens=body_n, body_position=pos)


def build_passkey(src: TaskSource, length: int, depth: float, index: int, seed: int) -> TaskItem:
    """One ``passkey`` item: :func:`sinklab.streaming.passkey.passkey_samples` with one key, its seed drawn
    from the item's random source; meta: ``body_position`` (the needle's index, as ``at``)."""
    from sinklab.streaming.passkey import QUESTION as PK_QUESTION
    from sinklab.streaming.passkey import passkey_samples

    rng = item_rng(seed, "passkey", length, depth, index)
    s = passkey_samples(src.tokenizer, src.documents, length, keys=1, depths=[depth], seed=rng.randrange(2**31),
                        corpus_name=src.corpus_name)[0]
    ids = s.ids.tolist()
    q = len(plain_ids(src.tokenizer, PK_QUESTION))
    return finish("passkey", src.tokenizer, index, length, depth, ids[:-q], ids[-q:], [s.key], seed, s.at,
                  body_position=s.at)


register(TaskSpec("needle", build_needle, "first_number", 12, True,
                  "needle in a haystack of real text: a 7-digit value for a two-word key at a depth"))
register(TaskSpec("passkey", build_passkey, "first_number", 8, True,
                  "pass key: a 5-digit key stated at a depth of real text (sinklab stream --task passkey's items)"))


def needle_items(tokenizer, documents: Sequence[str], *, lengths: Sequence[int], depths: Sequence[float] = (0.0, 0.5, 1.0),
                 n: int = 3, seed: int = 0, snap: int = 32, words: Sequence[str] | None = None,
                 corpus_name: str = "corpus") -> list[TaskItem]:
    """``needle`` items at every length x depth, ``n`` of each (:func:`sinklab.streaming.tasks.make_items`).

    Args:
        tokenizer: a ``transformers`` tokenizer.
        documents: the haystack's real text (e.g. ``load_corpus("pg-essays").documents``).
        lengths: prompt lengths in tokens (each item exactly that long).
        depths: in [0, 1]; 0 right after the BOS, 1 right before the question.

    Raises:
        InputError: as :func:`sinklab.streaming.tasks.make_items`.
    """
    return make_items(["needle"], tokenizer, documents, lengths=lengths, depths=depths, n=n, seed=seed, snap=snap,
                      words=words, corpus_name=corpus_name)


__all__ = ["NEEDLE", "QUESTION", "needle_items", "build_needle", "build_passkey"]
