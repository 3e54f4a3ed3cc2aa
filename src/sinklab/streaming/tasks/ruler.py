"""A RULER-style synthetic suite (after Hsieh et al. 2024, "RULER: What's the Real Context Size of Your
Long-Context Language Models?", sec. 3 and Table 1), written for sinklab: seeded, deterministic,
offline, exact in length. Wording, vocabulary and sizes are sinklab's own.

Needle tasks over a real-text haystack (a corpus's documents, read from a seeded document on), each
needle a sentence giving a 7-digit value for a two-word key; an instruction line first, the question
last, ending with the start of the answer. The needle the depth refers to (the first value of the
first queried key) sits at the depth; every other needle at a seeded uniform depth; all moved to the
nearest sentence end within ``snap`` tokens. Items are exactly ``length`` tokens.

* ``niah_single`` -- one key, one value; asked for the value.
* ``niah_multikey`` -- four keys, one value each (three distractors); asked for one key's value.
* ``niah_multivalue`` -- one key with four values; asked for all four.
* ``niah_multiquery`` -- four keys, one value each; asked for the values of all four.

Tasks without real text:

* ``variable_tracking`` -- a chain of 5 variables (5 capital letters each): ``VAR A = 12345.``, then
  ``VAR B = VAR A.`` ... (4 hops), hidden in a repeated noise sentence, the first assignment at the
  depth (moved to the nearest noise-sentence end within ``snap`` tokens, as a needle to a sentence end) and
  each later one at a seeded noise-sentence boundary after it; asked for every variable that
  holds the value. Exactly ``length`` tokens.
* ``common_words`` -- a numbered list of words from the corpus's word pool: 10 common words repeated
  ``6`` times each (``30`` from 4096 tokens on) and as many other words as fit, ``1`` time each (``3``);
  shuffled; asked for the 10 most common. No depth. At most ``length`` tokens, as many words as fit.

Scoring (all six): ``all_words``, the share of the expected answers found in the continuation as
whole words (RULER's ``string_match_all``); an item is correct when all are found.
"""

from __future__ import annotations

import math
import random
import string
from typing import Sequence

from sinklab.errors import InputError
from sinklab.streaming.tasks.items import (
    TaskItem, depth_position, distinct, finish, insert_needles, item_rng, number, plain_ids, prefix_ids,
    too_short,
)
from sinklab.streaming.tasks.registry import TaskSource, TaskSpec, make_items, register

NIAH_PREFACE = "Some hidden numbers are written in the text below. Remember them: you will be asked for them afterwards.\n\n"
NEEDLE_ONE = " The hidden number for {key} is {value}."
NEEDLE_MANY = " One of the hidden numbers for {key} is {value}."
QUESTION_ONE = "\n\nQuestion: What is the hidden number for {keys}?\nAnswer: The hidden number for {keys} is"
QUESTION_MANY = "\n\nQuestion: What are all the hidden numbers for {keys}?\nAnswer: The hidden numbers for {keys} are"

VT_PREFACE = "Follow the chain of variable assignments hidden in the text below.\n\n"
VT_NOISE = "The hills are far away. The road is long and dry. The wind is cold. We walk on. Then we rest.\n"
VT_ASSIGN = "VAR {name} = {value}.\n"
VT_COPY = "VAR {name} = VAR {src}.\n"
VT_QUESTION = ("\nQuestion: Which variables are assigned the value {value} in the text above?\n"
               "Answer: The variables assigned the value {value} are")

CWE_PREFACE = ("Below is a numbered list of words. Some words occur more often than the others: remember the ones "
               "that occur most often.\n")
CWE_QUESTION = ("\nQuestion: What are the 10 most common words in the list above?\n"
                "Answer: The 10 words that occur most often in the list are:")

#: the RULER-style tasks, in the order of the paper's Table 1
RULER_TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking",
               "common_words")


def _join(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + " and " + keys[-1]


def _niah(name: str, n_keys: int, n_values: int, n_queries: int):
    def build(src: TaskSource, length: int, depth: float, index: int, seed: int) -> TaskItem:
        tok = src.tokenizer
        rng = item_rng(seed, name, length, depth, index)
        keys = distinct(rng, n_keys, lambda: "-".join(rng.sample(src.words, 2)))
        values = distinct(rng, n_keys * n_values, lambda: number(rng, 7))
        values = [values[k * n_values : (k + 1) * n_values] for k in range(n_keys)]
        queried = rng.sample(range(n_keys), n_queries)  # the first one's first value sits at the depth
        start_doc = rng.randrange(len(src.documents))
        template = NEEDLE_MANY if n_values > 1 else NEEDLE_ONE
        needles = [(k, v) for k in [queried[0]] + [k for k in range(n_keys) if k != queried[0]] for v in range(n_values)]
        needle_ids = [plain_ids(tok, template.format(key=keys[k], value=values[k][v])) for k, v in needles]
        depths = [depth] + [rng.random() for _ in needles[1:]]
        qkeys = [keys[k] for k in queried]
        many = n_queries * n_values > 1
        question = plain_ids(tok, (QUESTION_MANY if many else QUESTION_ONE).format(keys=_join(qkeys)))
        prefix = prefix_ids(tok) + plain_ids(tok, NIAH_PREFACE)
        body_n = length - len(prefix) - sum(map(len, needle_ids)) - len(question)
        if body_n < 1:
            raise too_short(name, length, length - body_n)
        body = src.haystack.tokens(body_n, start_doc)
        ends = src.haystack.sentence_ends(body) if src.snap else None
        positions = [depth_position(d, body_n, ends, src.snap) for d in depths]
        ids, starts = insert_needles(body, list(zip(positions, needle_ids)))
        answers = [values[k][v] for k in queried for v in range(n_values)]
        return finish(name, tok, index, length, depth, prefix + ids, question, answers, seed, len(prefix) + starts[0],
                      keys=qkeys, distractor_keys=[keys[k] for k in range(n_keys) if k not in queried],
                      needle_starts=[len(prefix) + s for s in starts], body_tokens=body_n, body_position=positions[0])

    return build


def build_variable_tracking(src: TaskSource, length: int, depth: float, index: int, seed: int, *,
                            hops: int = 4) -> TaskItem:
    """One ``variable_tracking`` item (see the module); meta: ``value``, ``chain`` (the statements in order),
    ``statement_starts`` (0-based index of each statement's first token)."""
    tok = src.tokenizer
    name = "variable_tracking"
    rng = item_rng(seed, name, length, depth, index)
    names = distinct(rng, hops + 1, lambda: "".join(rng.choice(string.ascii_uppercase) for _ in range(5)))
    value = number(rng, 5)
    chain = [VT_ASSIGN.format(name=names[0], value=value)] + [VT_COPY.format(name=names[j + 1], src=names[j])
                                                               for j in range(hops)]
    chain_ids = [plain_ids(tok, s) for s in chain]
    noise = plain_ids(tok, VT_NOISE)
    question = plain_ids(tok, VT_QUESTION.format(value=value))
    prefix = prefix_ids(tok) + plain_ids(tok, VT_PREFACE)
    body_n = length - len(prefix) - sum(map(len, chain_ids)) - len(question)
    if body_n < 1:
        raise too_short(name, length, length - body_n)
    body = (noise * math.ceil(body_n / len(noise)))[:body_n]
    bounds = list(range(0, body_n + 1, len(noise)))  # whole noise sentences before each statement
    # the first assignment at the depth's token, moved to a noise-sentence end within ``snap`` tokens as every
    # needle is (snap 0: exactly at the token; it then cuts a noise sentence)
    first = depth_position(depth, body_n, bounds, src.snap)
    # the later statements at noise-sentence ends after it; where none is left (a first assignment past the last
    # sentence end: snap 0 or a snap shorter than half a noise sentence near depth 1), right after it, in order
    after = [b for b in bounds if b >= first] or [first]
    later = sorted(rng.choice(after) for _ in range(hops))
    ids, starts = insert_needles(body, list(zip([first] + later, chain_ids)))
    return finish(name, tok, index, length, depth, prefix + ids, question, names, seed, len(prefix) + starts[0],
                  value=value, chain=[s.strip() for s in chain], statement_starts=[len(prefix) + s for s in starts],
                  body_tokens=body_n, body_position=first)


def build_common_words(src: TaskSource, length: int, depth: None, index: int, seed: int, *,
                       n_common: int = 10) -> TaskItem:
    """One ``common_words`` item (see the module); meta: ``repeats`` (common, other), ``n_other`` (other words).

    Raises:
        InputError: ``length`` too short for the common words alone; a word pool too small to fill
            90% of ``length``.
    """
    tok = src.tokenizer
    name = "common_words"
    rng = item_rng(seed, name, length, depth, index)
    if len(src.words) < n_common + 1:
        raise InputError(f"common_words needs a word pool of more than {n_common} words, got {len(src.words)}")
    words = rng.sample(src.words, len(src.words))
    common, others = words[:n_common], words[n_common:]
    rc, ro = (6, 1) if length < 4096 else (30, 3)
    shuffle_seed = rng.random()
    prefix, question = prefix_ids(tok), plain_ids(tok, CWE_QUESTION)

    def context(u: int) -> list[int]:
        lst = common * rc + others[:u] * ro
        random.Random(shuffle_seed).shuffle(lst)
        text = CWE_PREFACE + " ".join(f"{i + 1}. {w}" for i, w in enumerate(lst))
        return prefix + plain_ids(tok, text)

    def fits(u: int) -> bool:
        return len(context(u)) + len(question) <= length

    if not fits(0):
        raise too_short(name, length, len(context(0)) + len(question) - 1)
    lo, hi = 0, len(others)  # the largest u that fits: fits(lo) holds
    if fits(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    ctx = context(lo)
    if len(ctx) + len(question) < 0.9 * length:
        raise InputError(f"common_words: the word pool ({len(src.words)} words) fills only {len(ctx) + len(question)} "
                         f"of the {length} tokens asked for; give more text or words")
    return finish(name, tok, index, length, None, ctx, question, common, seed, None, repeats=[rc, ro], n_other=lo)


for _name, _k, _v, _q, _tokens, _desc in (
        ("niah_single", 1, 1, 1, 12, "RULER single needle: one key, one value, asked for it"),
        ("niah_multikey", 4, 1, 1, 12, "RULER multi-key needle: four keys (three distractors), asked for one"),
        ("niah_multivalue", 1, 4, 1, 48, "RULER multi-value needle: one key with four values, asked for all"),
        ("niah_multiquery", 4, 1, 4, 48, "RULER multi-query needle: four keys, asked for all four values")):
    register(TaskSpec(_name, _niah(_name, _k, _v, _q), "all_words", _tokens, True, _desc))
register(TaskSpec("variable_tracking", build_variable_tracking, "all_words", 30, True,
                  "RULER variable tracking: a 4-hop chain of assignments in noise, asked for every variable of the value"))
register(TaskSpec("common_words", build_common_words, "all_words", 80, False,
                  "RULER common-words extraction: the 10 most frequent words of a numbered list"))


def ruler_items(tokenizer, documents: Sequence[str], *, tasks: Sequence[str] = RULER_TASKS, lengths: Sequence[int],
                depths: Sequence[float] = (0.0, 0.5, 1.0), n: int = 3, seed: int = 0, snap: int = 32,
                words: Sequence[str] | None = None, corpus_name: str = "corpus") -> list[TaskItem]:
    """Items of the RULER-style ``tasks`` (default all six) at every length (x depth where the task has
    one), ``n`` of each (:func:`sinklab.streaming.tasks.make_items`).

    Raises:
        InputError: as :func:`sinklab.streaming.tasks.make_items`.
    """
    return make_items(list(tasks), tokenizer, documents, lengths=lengths, depths=depths, n=n, seed=seed, snap=snap,
                      words=words, corpus_name=corpus_name)


__all__ = ["RULER_TASKS", "ruler_items", "build_variable_tracking", "build_common_words"]
