"""The options of the streaming tasks, declared once.

Every option is a field of a frozen dataclass: :class:`StreamOptions` holds what every task shares (the
corpus, the stream length, the caches compared, where the model runs), each task's subclass adds its own
(:class:`PerplexityOptions`, :class:`PasskeyOptions`). The field's metadata (:func:`option`) is all the CLI
needs: ``sinklab stream TASK`` makes one flag per field (``--`` + the name in kebab case, or the
``flag`` given; a tuple field is a comma list; a bool field that defaults to True is ``--no-NAME``), and
:meth:`StreamOptions.command_line` writes the command that reproduces a call from the same fields. So a
new option is one field; the CLI, its docs and the recorded command follow.
"""

from __future__ import annotations

import dataclasses
import shlex
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from sinklab.errors import InputError, param

__all__ = ["option", "OptionsBase", "StreamOptions", "PerplexityOptions", "PasskeyOptions", "LongContextOptions",
           "NeedleOptions", "RulerOptions", "Flag"]


def option(default: Any, help: str, *, flag: str | None = None, short: str | None = None) -> Any:
    """A field of an options dataclass with its CLI help (``flag``: when not ``--`` + the name in kebab
    case; ``short``: a one-letter alias such as ``-w``)."""
    return field(default=default, metadata={"help": help, "flag": flag, "short": short})


@dataclass(frozen=True)
class Flag:
    """How one options field appears on the command line (:meth:`StreamOptions.flags`).

    Attributes:
        name: the field. flag: ``--name`` (``--no-name`` for a bool that defaults to True). short: alias or
        None. kind: ``bool`` | ``list`` | ``scalar``. item: the type of a list's items or of a scalar
        (int, float, str). default: the field's default. help: the help text.
    """

    name: str
    flag: str
    short: str | None
    kind: str
    item: type
    default: Any
    help: str


def int_or_word(text: str) -> int | str:
    """A list item that is a count or a word (``--sinks-full-precision 0,detected``): ``"4"`` -> 4, else the text."""
    t = text.strip()
    return int(t) if t.lstrip("-").isdigit() else t


def _item_type(hint) -> tuple[str, type]:
    """(kind, item type) of a field's type hint: ``tuple[int, ...] | None`` -> ("list", int)."""
    union = typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union))
    base = [a for a in typing.get_args(hint) if a is not type(None)][0] if union else hint
    if typing.get_origin(base) is tuple:
        item = typing.get_args(base)[0]
        return "list", (item if isinstance(item, type) else int_or_word)
    if base is bool:
        return "bool", bool
    return "scalar", base


@dataclass(frozen=True)
class OptionsBase:
    """What every options dataclass of a ``sinklab stream`` task shares: :meth:`build`, :meth:`flags` and
    :meth:`command_line` (no fields; the fields come from the classes below)."""

    TASK: ClassVar[str] = ""

    @classmethod
    def build(cls, options: "OptionsBase | None" = None, **overrides) -> "OptionsBase":
        """``options`` (or the defaults) with ``overrides`` replaced; lists become tuples.

        Raises:
            InputError: an override that is not an option of this task (names it and the task), or options
                of another task's class.
        """
        if options is not None and not isinstance(options, cls):
            raise InputError(f"{param('options')} is a {type(options).__name__}; the {cls.TASK} task takes "
                             f"{cls.__name__}")
        names = {f.name for f in fields(cls)}
        bad = [k for k in overrides if k not in names]
        if bad:
            others = sorted(n for n in bad)
            raise InputError(f"{', '.join(param(k) for k in others)} is not an option of the {cls.TASK} task "
                             f"({cls.__name__}: {', '.join(sorted(names))})")
        given = {k: (tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()}
        return dataclasses.replace(options or cls(), **given)

    @classmethod
    def flags(cls) -> list[Flag]:
        """One :class:`Flag` per field, in declaration order (what ``sinklab stream TASK`` offers)."""
        hints = typing.get_type_hints(cls)
        out = []
        for f in fields(cls):
            kind, item = _item_type(hints[f.name])
            flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            if kind == "bool" and f.default is True:
                flag = "--no-" + flag[2:]
            out.append(Flag(f.name, flag, f.metadata.get("short"), kind, item, f.default, f.metadata.get("help", "")))
        return out

    def command_line(self, model: str, out: str | None = None) -> str:
        """The ``sinklab stream TASK`` command that reproduces these options on ``model`` (only the fields that
        differ from their defaults; lists comma-separated, as the CLI takes them), with ``--out`` when given."""
        cmd = ["sinklab", "stream", self.TASK, "--model", str(model)]
        for fl in self.flags():
            v = getattr(self, fl.name)
            if v == fl.default:
                continue
            if fl.kind == "bool":
                cmd.append(fl.flag)
            elif fl.kind == "list":
                cmd += [fl.flag, ",".join(map(str, v))]
            else:
                cmd += [fl.flag, str(v)]
        if out is not None:
            cmd += ["--out", str(out)]
        return " ".join(shlex.quote(c) for c in cmd)


@dataclass(frozen=True)
class _StreamFields:
    """The stream of the perplexity and pass-key tasks: corpus, length, the default sink caches."""

    corpus: str = option("sotu", "corpus zoo name, a .txt file / folder (documents in order), or run (a sinklab "
                         "run's own validation documents); several comma-separated with --streams > 1")
    tokens: int = option(4096, "stream length N: the first N tokens")
    window: int = option(256, "recent tokens kept by the sink caches (and seen by recompute)", short="-w")
    sinks: tuple[int, ...] | None = option(None, "numbers of sink tokens of the default caches, e.g. 0,1,2,4,8 "
                                           "(0 = window only; default 0,1,2,4,8; not with --policy)")

@dataclass(frozen=True)
class _CacheFields:
    """The caches compared: the full cache and the policies x budgets x storage options."""

    full: bool = option(True, "the full cache (the reference of the agreement and the ceiling)")
    policies: tuple[str, ...] | None = option(None, "cache policies to compare at equal budget, from window, sinks, "
                                              "h2o, tova, sinks+h2o, sinks+tova, detected-sinks and the prefill-time "
                                              "snapkv, pyramidkv, knorm (which score the calls of more than one "
                                              "token: under token-by-token decoding they keep the latest tokens as "
                                              "window does) (replaces --sinks; the cross product with --budget and "
                                              "the --kv-* options)",
                                              flag="--policy")
    budgets: tuple[int, ...] | None = option(None, "tokens each layer keeps, e.g. 64,128,256 (default 256; with "
                                             "--policy)", flag="--budget")
    n_sink: int = option(4, "sink tokens of the policies with sinks (sinks, sinks+h2o, sinks+tova; at most this "
                         "many detected ones for detected-sinks)")
    kv_bits: tuple[int, ...] | None = option(None, "key/value storage: 16 (as given) or 8, 4, 3, 2 bits (min-max "
                                             "codes in groups; e.g. 16,4; default 16; with --policy)")
    kv_group: int = option(32, "channels per quantisation group (per token) or tokens per block (per-channel keys)")
    key_quant: tuple[str, ...] | None = option(None, "keys quantised per token and/or per channel (KIVI): "
                                               "token,channel (default token)")
    sinks_full_precision: tuple[int | str, ...] | None = option(None, "keep the first N tokens lossless in a quantised "
                                                          "cache, e.g. 0,1,4, or 'detected': the sinks the metric "
                                                          "flags (default 0)")

@dataclass(frozen=True)
class _DeviceFields:
    """Where the model runs."""

    device: str = option("cpu", "cpu | cuda | cuda:N | auto (CUDA when available)")
    dtype: str | None = option(None, "float32 | bfloat16 | float16 | float64 (default: bfloat16 on CUDA, float32 otherwise)")
    device_map: str | None = option(None, "auto: spread the model over the GPUs, CPU and disk with accelerate "
                                    "(models that do not fit one device)")
    threads: int | None = option(None, "torch CPU threads during the call (restored after; default: torch's)")


@dataclass(frozen=True)
class StreamOptions(_DeviceFields, _CacheFields, _StreamFields, OptionsBase):
    """What the perplexity and pass-key tasks take (``sinklab stream TASK``; :func:`sinklab.streaming.stream`).

    Positions are 0-based; token counts include the tokenizer's BOS. Lists are tuples.
    """


@dataclass(frozen=True)
class PerplexityOptions(StreamOptions):
    """``sinklab stream perplexity``: perplexity, agreement with the full cache, latency and memory per cache,
    on one stream or many (:mod:`sinklab.streaming.streams`)."""

    TASK: ClassVar[str] = "perplexity"

    chunk: int | None = option(None, "positions per perplexity / agreement chunk (default: the window)")
    recompute: bool = option(True, "sliding window with recomputation (scored every k-th position)")
    recompute_every: int | None = option(None, "score every k-th position with recomputation (default: N/128 "
                                         "rounded up)")
    mode: str = option("parallel", "parallel (one exact forward per cache configuration) | decode (token by token "
                       "through the real cache: same numbers, much slower)")
    streams: int = option(1, "1: one stream, the corpus's documents in order; more: one document per stream, split "
                          "evenly over the comma-separated corpora, each figure with a 95% t-interval over streams "
                          "and paired comparisons")
    agreement: bool = option(True, "every configuration's agreement with the full cache (KL, top-1)")
    latency: bool = option(True, "every configuration's decode latency and cache bytes (32 decode steps timed at the "
                           "end of the stream; off: latency null and bytes 0, the perplexities and agreement as with "
                           "it)")
    stream_batch: int | None = option(None, "with --streams > 1: streams evaluated together as the rows of one batch, "
                                      "each configuration run once over the batch (the same numbers as one at a "
                                      "time, to float rounding); default: all streams, at most as many as keep the "
                                      "full cache's reference logits within 2 GiB; 1: one at a time")


@dataclass(frozen=True)
class PasskeyOptions(StreamOptions):
    """``sinklab stream passkey``: retrieve a 5-digit key (one needle stating it twice) at a depth of the stream (accuracy per depth;
    :mod:`sinklab.streaming.passkey`)."""

    TASK: ClassVar[str] = "passkey"

    keys: int = option(20, "pass keys per depth")
    depths: tuple[float, ...] = option((0.0, 0.25, 0.5, 0.75, 1.0), "depths of the key in [0, 1]")
    batch: int = option(20, "streams fed together (equal length)")
    chunk: int = option(1, "tokens per call while feeding a stream (1 = streaming; more: the chunk attends to the "
                        "cache and itself, then it is cut)")
    seed: int = option(0, "seed of the random keys")


@dataclass(frozen=True)
class _LongContextFields:
    """The items of a long-context task (:mod:`sinklab.streaming.tasks`) and how they are answered."""

    corpus: str = option("pg-essays", "corpus of the haystacks: zoo name or a .txt file / folder (documents in order)")
    lengths: tuple[int, ...] = option((1024, 2048), "prompt lengths in tokens (BOS, haystack, needles and question)")
    depths: tuple[float, ...] = option((0.0, 0.5, 1.0), "needle depths in [0, 1] (0: right after the BOS, 1: right "
                                       "before the question)")
    items: int = option(3, "items per (task, length, depth) cell")
    seed: int = option(0, "seed of the items (each item drawn from its own source: the same items whatever else is "
                          "asked)")
    max_new_tokens: int | None = option(None, "greedy tokens per answer (default: each task's answer length)")
    query_aware: bool = option(True, "the question fed with the context, so evictions while reading the prompt may "
                                     "depend on it (kvpress's query_aware; off: context first, then the question in "
                                     "its own calls)")
    chunk: int | None = option(None, "prompt tokens per call (default: a policy cache's window budget - n_sink, so the "
                                     "prefill-time policies snapkv, pyramidkv, knorm score every chunk; the full cache "
                                     "takes the prompt in one call)")


@dataclass(frozen=True)
class LongContextOptions(_DeviceFields, _CacheFields, _LongContextFields, OptionsBase):
    """What the long-context tasks take (``sinklab stream needle | ruler``): the items, and the caches compared
    on them (the full cache, the ceiling, and ``policies`` x ``budgets`` x storage; no policy: the full cache
    only)."""

    def task_names(self) -> list[str]:
        """The :data:`sinklab.streaming.tasks.TASKS` names whose items this task draws."""
        raise NotImplementedError


@dataclass(frozen=True)
class NeedleOptions(LongContextOptions):
    """``sinklab stream needle``: needle in a haystack of real text (:mod:`sinklab.streaming.tasks.needle`)."""

    TASK: ClassVar[str] = "needle"

    def task_names(self) -> list[str]:
        return ["needle"]


#: RULER-style sub-tasks (as :data:`sinklab.streaming.tasks.ruler.RULER_TASKS`; tests/test_stream_tasks.py checks)
RULER_SUBTASKS = ("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking",
                  "common_words")


@dataclass(frozen=True)
class RulerOptions(LongContextOptions):
    """``sinklab stream ruler``: the RULER-style suite (:mod:`sinklab.streaming.tasks.ruler`)."""

    TASK: ClassVar[str] = "ruler"

    tasks: tuple[str, ...] = option(RULER_SUBTASKS, "sub-tasks, from niah_single, niah_multikey, niah_multivalue, "
                                                    "niah_multiquery, variable_tracking, common_words (and needle, "
                                                    "passkey)")

    def task_names(self) -> list[str]:
        return list(self.tasks)
