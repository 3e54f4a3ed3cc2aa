"""The streaming tasks from Python: ``stream(model, task=..., options)`` evaluates, returns a Result and
writes nothing (:meth:`~sinklab.result.Result.save` and the CLI write).

The tasks are registered in :data:`sinklab.streaming.task_registry.TASKS` (here: ``perplexity`` and
``passkey``; ``needle`` and ``ruler`` in :mod:`sinklab.streaming.longctx`, which the package imports); their
options are :mod:`sinklab.streaming.options` dataclasses.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from sinklab.errors import InputError, param
from sinklab.result import DictResult, out_folder
from sinklab.streaming.cache import SinkCache
from sinklab.streaming.harness import (StreamConfigResult, cache_specs, evaluate_stream, evaluate_streams,
                                      policy_specs, result_from_dict, token_stream, write_outputs)
from sinklab.streaming.options import PasskeyOptions, PerplexityOptions, StreamOptions
from sinklab.streaming.task_registry import TASKS, StreamTask, register_task
from sinklab.zoo.models import DEFAULT_MODEL

DEFAULT_SINKS = (0, 1, 2, 4, 8)
#: the default ``stream_batch`` keeps the batch's full-cache reference logits ((B, tokens - 1, V)) within this
REFERENCE_BYTES = 2 * 2**30
#: decode steps timed per configuration at the end of the stream (``latency_ms_per_token``; the first stream's
#: with several); none with ``latency=False`` (``--no-latency``)
LATENCY_STEPS = 32


class StreamResult(DictResult):
    """What the ``perplexity`` task returns: the content of ``stream.json`` (a dict: ``configs``, ``command``,
    and for a multi-stream run ``streams`` and ``comparisons``) and a :class:`~sinklab.result.Result`
    (``save(out)`` writes ``stream.json`` with its CSVs and plot; ``table()``: one row per configuration)."""

    FILE = "stream.json"
    WHAT = "stream results"

    def save(self, out: str | Path) -> Path:
        from sinklab.streaming.streams import write_stream_set

        out = out_folder(out)
        if "streams" in self:
            write_stream_set(out, dict(self))
        else:
            meta = {k: v for k, v in self.items() if k != "configs"}
            write_outputs(out, meta, [result_from_dict(c) for c in self["configs"]], self["chunk"])
        return out

    def headline(self) -> list[tuple[str, str]]:
        rows = [(k, str(self[k])) for k in ("model", "corpus", "tokens", "n_streams") if k in self]
        configs = self.get("configs") or []
        if configs and all(isinstance(c.get("ppl"), (int, float)) for c in configs):
            for c in configs[:6]:
                kl = "" if c.get("kl") is None else f", KL {c['kl']:.4g}, top-1 {c['top1']:.3f}"
                rows.append((c["name"], f"ppl {c['ppl']:.4g}{kl}"))
            return rows
        return rows + ([("configs", f"{len(configs)}: {', '.join(str(c.get('name')) for c in configs)}")]
                       if configs else [])


class PasskeyResult(DictResult):
    """What the ``passkey`` task returns: the content of ``passkey.json`` (``save(out)`` writes it with
    ``passkey.csv``, ``passkey_accuracy.csv`` and ``passkey.png``)."""

    FILE = "passkey.json"
    WHAT = "pass key results"

    def save(self, out: str | Path) -> Path:
        from sinklab.streaming.passkey import result_from_dict as passkey_result, write_passkey_outputs

        out = out_folder(out)
        meta = {k: v for k, v in self.items() if k != "configs"}
        write_passkey_outputs(out, meta, [passkey_result(c) for c in self["configs"]])
        return out


@contextmanager
def torch_threads(threads: int | None):
    """Within the block torch uses ``threads`` CPU threads (None: unchanged); the setting before is restored."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def stream(model: Any = DEFAULT_MODEL, corpus: str | None = None, options: StreamOptions | None = None, *,
           task: str = "perplexity", tokenizer: Any = None, resume: dict | None = None,
           on_result: Callable | None = None, progress: bool = True, command: str | None = None,
           **overrides) -> DictResult:
    """Run one streaming task on ``model``: caches compared on long streams (StreamingLLM, Xiao et al. 2024).

    Args:
        model: zoo name or Hugging Face folder of a RoPE causal LM (``sinklab list models``), a ``sinklab
            train`` run (or its ``final/``) with relative positions, a :class:`~sinklab.runs.Run`, an
            ``nn.Module`` in memory (with ``tokenizer``; it stays on its device and in its dtype unless the
            options ``device`` / ``dtype`` are given) or a :class:`~sinklab.subject.Subject`. A model object
            runs in eval mode and is given back in the mode it had (:func:`sinklab.subject.eval_mode`).
        corpus: shorthand for ``corpus=`` among the options.
        options: the task's options (:class:`~sinklab.streaming.options.PerplexityOptions`,
            :class:`~sinklab.streaming.options.PasskeyOptions`, ``NeedleOptions``, ``RulerOptions``, or a
            registered task's); None: its defaults.
        task: a name of :data:`~sinklab.streaming.task_registry.TASKS` (``perplexity``, ``passkey``, ...).
        tokenizer: the tokenizer of an ``nn.Module`` given as ``model`` (a model loaded from disk reads its own).
        resume: the content of an earlier result of the same task (e.g. ``StreamResult.load(out)``): its
            configurations (and streams) computed with the same settings are kept, not computed again.
        on_result: called with the partial result after each finished configuration (the CLI saves it there,
            so a stopped run resumes).
        progress: progress bars on stderr.
        command: the command to record (the CLI passes the one it ran); None: the ``sinklab stream TASK``
            command of these options (:meth:`~sinklab.streaming.options.StreamOptions.command_line`), or the
            Python call for a model in memory.
        overrides: options by name (``tokens=512, policies=["sinks"]``), replacing those of ``options``.

    Returns:
        The task's :class:`~sinklab.result.Result` (a :class:`StreamResult` for ``perplexity``, a
        :class:`PasskeyResult` for ``passkey``, a :class:`~sinklab.streaming.longctx.TaskResult` for ``needle``
        and ``ruler``). Nothing is written; torch's thread setting is restored.

    Raises:
        UnknownNameError: an unknown task (lists them) or policy; as :func:`sinklab.models.load_model`.
        InputError: an option of another task; the task's own refusals (bad lengths, a model without RoPE,
            budgets past the context, ...); a bad device or dtype.
    """
    from sinklab.result import python_call
    from sinklab.runs import Run
    from sinklab.subject import Subject, eval_mode

    t: StreamTask = TASKS.get(task)
    if corpus is not None:
        overrides["corpus"] = corpus
    opts = t.options.build(options, **overrides)
    held = isinstance(model, (nn.Module, Subject))
    if not held and not isinstance(model, (str, Path, Run)):
        raise InputError(f"{param('model')} must be a name, a path, a Run, a Subject or an nn.Module, "
                         f"not {type(model).__name__}")
    if tokenizer is not None and not isinstance(model, nn.Module):
        raise InputError(f"{param('tokenizer')} goes with a model object; a model loaded from disk (or a Subject) "
                         "has its own")
    if opts.threads is not None and opts.threads < 1:
        raise InputError(f"{param('threads')} must be >= 1, got {opts.threads}")
    if command is None:
        command = (opts.command_line(model.folder if isinstance(model, Run) else model) if not held
                   else python_call("sinklab.stream", type(model).__name__, task=task, options=opts))
    # the placement options the caller gave (a model object stays on its device and in its dtype otherwise)
    defaults = {f.name: f.default for f in fields(t.options)}
    placed = {f: getattr(opts, f) for f in ("device", "dtype", "device_map")
              if f in overrides or (options is not None and getattr(options, f) != defaults[f])}
    with torch_threads(opts.threads):
        if held:  # a Subject is used as it is (a placement is refused), a module stays where it is unless placed
            subject = Subject.load(model, tokenizer=tokenizer, **placed)
        else:
            subject = Subject.load(model, device=opts.device, dtype=opts.dtype, device_map=opts.device_map)
        # the model as messages name it, and the run whose held-out stream corpus "run" reads
        label = (str(model) if isinstance(model, (str, Path)) else str(model.folder) if isinstance(model, Run)
                 else str(subject.run.folder) if subject.run is not None
                 else f"<{type(subject.model).__name__} in memory>")
        with eval_mode(subject.model):
            return t.run(subject, opts, model=label, resume=resume, on_result=on_result, progress=progress,
                         command=command)


def _specs(o: StreamOptions, task: str) -> list:
    """The configurations of ``o`` (checked before any long work)."""
    if o.tokens < 2:
        raise InputError(f"{param('tokens')} must be >= 2, got {o.tokens}")
    recompute = getattr(o, "recompute", False) and task == "perplexity"
    if getattr(o, "mode", "parallel") not in ("parallel", "decode"):
        raise InputError(f"unknown mode {o.mode!r}: parallel | decode")
    if getattr(o, "streams", 1) < 1:
        raise InputError(f"{param('streams')} must be >= 1, got {o.streams}")
    if getattr(o, "stream_batch", None) is not None and o.stream_batch < 1:
        raise InputError(f"{param('stream_batch')} must be >= 1, got {o.stream_batch}")
    if o.policies:
        if o.sinks is not None:
            raise InputError(f"{param('sinks')} sets the sink caches of the default run; with {param('policies')} give "
                             f"{param('n_sink')}")
        return policy_specs(o.policies, o.budgets or (256,), n_sink=o.n_sink, kv_bits=o.kv_bits or (16,),
                            key_quant=o.key_quant or ("token",), sinks_full_precision=o.sinks_full_precision or (0,),
                            kv_group=o.kv_group, window=o.window, full=o.full, recompute=recompute)
    given = [param(f) for f in ("budgets", "kv_bits", "key_quant", "sinks_full_precision") if getattr(o, f)]
    if given:
        raise InputError(f"{', '.join(given)} need {param('policies')} (e.g. {param('policies', 'sinks')})")
    return cache_specs(o.window, DEFAULT_SINKS if o.sinks is None else o.sinks, full=o.full, recompute=recompute)


def _perplexity(subject, o: PerplexityOptions, *, model, resume: dict | None, on_result, progress: bool,
                command: str) -> StreamResult:
    """The ``perplexity`` task: perplexity, agreement with the full cache, latency and memory of every
    configuration, on one stream (``streams=1``: the corpus's documents in order) or on many (one
    document each, with intervals over streams: :mod:`sinklab.streaming.streams`)."""
    for name in ("chunk", "recompute_every"):  # (0 is not "the default": None is)
        if getattr(o, name) is not None and getattr(o, name) < 1:
            raise InputError(f"{param(name)} must be >= 1, got {getattr(o, name)}")
    specs = _specs(o, "perplexity")
    if any(s.kind == "recompute" for s in specs) and o.window >= o.tokens - 1:
        import warnings

        warnings.warn(f"recompute's window ({o.window} tokens; {param('window')}, not a policy's budget) holds the whole "
                      f"stream of {o.tokens}: it computes what the full cache computes. Give a smaller {param('window')} "
                      f"or {param('recompute', False)}", stacklevel=3)
    native, ctx = _check_subject(subject, model, o.corpus, specs, "perplexity")
    chunk = o.chunk if o.chunk is not None else o.window
    every = o.recompute_every if o.recompute_every is not None else max(1, math.ceil(o.tokens / 128))
    if o.streams > 1:
        return _stream_set(subject, o, specs, chunk=chunk, every=every, ctx=ctx, native=native, resume=resume,
                           on_result=on_result, progress=progress, command=command)
    ids, corp = _stream_tokens(subject, model, o.corpus, o.tokens)
    key = _key(subject, corp, ids, o, chunk=chunk, every=every)
    done = _resumable(resume, key)
    meta = _meta(command, key, subject, corp, ctx=ctx, native=native, mode=o.mode, every=every, tokens=o.tokens,
                 window=o.window, policies=o.policies, budgets=o.budgets or (256,),
                 recompute=any(s.kind == "recompute" for s in specs))
    results: dict[str, StreamConfigResult] = dict(done)
    t0 = time.perf_counter()

    def payload() -> StreamResult:
        return StreamResult({**meta, "wall_s": time.perf_counter() - t0,
                             "configs": [asdict(results[s.name]) for s in specs if s.name in results]})

    def save(res: StreamConfigResult) -> None:
        results[res.name] = res if o.latency else _untimed(res)  # untimed: recompute's own forwards' time too
        if on_result is not None:
            on_result(payload())

    evaluate_stream(subject.model, ids, specs, chunk=chunk, recompute_every=every, max_context=ctx, mode=o.mode,
                    progress=progress, done=done, on_result=save, agreement=o.agreement,
                    latency_steps=LATENCY_STEPS if o.latency else 0)
    if done and all(s.name in done for s in specs):  # everything was already there
        return StreamResult(dict(resume))
    return payload()


def stream_batch_size(model, o: PerplexityOptions, n_streams: int) -> int:
    """Streams per batch of a multi-stream run: ``o.stream_batch`` (at most ``n_streams``), or by default
    all of them, capped so that the batch's full-cache reference logits, (B, tokens - 1, V) in the model's
    dtype, stay within :data:`REFERENCE_BYTES` (at least 1)."""
    if o.stream_batch is not None:
        return max(1, min(o.stream_batch, n_streams))
    head = model.get_output_embeddings()
    vocab = head.weight.shape[0] if head is not None else model.config.get_text_config(decoder=True).vocab_size
    per_stream = max(1, (o.tokens - 1) * vocab * next(model.parameters()).element_size())
    return max(1, min(n_streams, REFERENCE_BYTES // per_stream))


#: what ``stream.json`` keeps of each earlier invocation of a resumed stream set
_INVOCATION_FIELDS = ("command", "code", "stream_batch", "torch_threads", "wall_s", "load_average_at_start")


def _untimed(res: StreamConfigResult) -> StreamConfigResult:
    """A result of a stream after the first, or of a run with ``latency`` off: no latency, no bytes (only the
    first stream is timed)."""
    return replace(res, latency_ms_per_token=None, cache_bytes=0, state_bytes=0)


def _stream_set(subject, o: PerplexityOptions, specs, *, chunk: int, every: int, ctx, native: bool,
                resume: dict | None, on_result, progress: bool, command: str) -> StreamResult:
    """``streams`` > 1: every configuration on each of ``streams`` documents of the corpora ``o.corpus``
    (comma-separated), with intervals over streams (:mod:`sinklab.streaming.streams`); streams of ``resume``
    with the same settings are kept. The streams (all ``tokens`` long) run ``stream_batch`` at a time as
    the rows of one batch (:func:`~sinklab.streaming.harness.evaluate_streams`: the numbers of each stream
    alone; :func:`stream_batch_size`); the first stream alone is timed (latency, cache bytes), the others
    get None and 0 whatever the batching."""
    from sinklab.provenance import code_version
    from sinklab.result import versions
    from sinklab.streaming.streams import document_streams, stream_set_payload
    from sinklab.zoo.corpora import load_corpus

    if o.corpus == "run" or native:
        raise InputError(f"{param('streams')} > 1 needs a transformers model and text corpora")
    corpora = [load_corpus(c) for c in o.corpus.split(",")]
    sources = document_streams(subject.tokenizer, corpora, o.streams, o.tokens)
    key = {"model": subject.info["name"], "corpus": ",".join(c.name for c in corpora), "tokens": o.tokens,
           "window": o.window, "chunk": chunk, "recompute_every": every, "dtype": subject.info.get("dtype"),
           "n_streams": o.streams, "stream_shas": [s.info()["stream_sha"] for s in sources]}
    if not o.latency:
        key["latency"] = False
    key.update(_model_and_cache_key(subject, o))
    prev_streams = resume.get("streams", []) if _same_settings(resume, key) else []
    size = stream_batch_size(subject.model, o, len(sources)) if len({s.ids.numel() for s in sources}) == 1 else 1
    # a resumed run keeps the record of the invocations whose streams it reuses (their commands, code, batching)
    earlier = [*resume.get("earlier_invocations", []),
               {**{k: resume.get(k) for k in _INVOCATION_FIELDS}, "streams_done": len(prev_streams)}] \
        if prev_streams else []
    meta = {"command": command, **key, "max_context": ctx,
            "title": f"{subject.info['name']} · {key['corpus']} · {o.streams} streams x {o.tokens} tokens",
            "model_info": subject.info, "corpus_sources": [c.source for c in corpora], "versions": versions(),
            "mode": o.mode, "code": code_version(), "torch_threads": torch.get_num_threads(),
            "load_average_at_start": _load(), "stream_batch": size,
            "definitions": {**_meta_definitions(every, o.policies),
                            "streams": "one document each: its first `tokens` tokens after the tokenizer's BOS; "
                                       "per corpus, the documents long enough taken evenly spaced",
                            "batching": ("streams evaluated one at a time" if size == 1 else
                                         f"streams evaluated {size} at a time as the rows of one batch, each "
                                         "configuration once over the batch (the numbers of each stream alone, to "
                                         "float rounding; sinklab.streaming.harness.evaluate_streams)"),
                            "latency_ms_per_token": "timed on the first stream only, alone (the others: null, "
                                                    "cache_bytes and state_bytes 0); the summary's latency and "
                                                    "cache_bytes are the first stream's",
                            **({"earlier_invocations": "the invocations of an interrupted or repeated run whose "
                                "streams this one reuses, oldest first: their command, code, stream_batch, wall "
                                "time, load, and how many streams were finished; command, code and stream_batch "
                                "above are this invocation's"} if earlier else {})},
            **({"earlier_invocations": earlier} if earlier else {})}
    finished: list[dict] = []
    t0 = time.perf_counter()
    for first in range(0, len(sources), size):
        rows = list(range(first, min(first + size, len(sources))))
        dones = [{c["name"]: result_from_dict(c) for c in (prev_streams[i] if i < len(prev_streams) else {"configs": []})["configs"]}
                 for i in rows]
        currents = [{"info": sources[i].info(), "configs": []} for i in rows]
        results = [dict(d) for d in dones]

        def save(row: int, res: StreamConfigResult, rows=rows, currents=currents, results=results) -> None:
            results[row][res.name] = res if rows[row] == 0 and o.latency else _untimed(res)
            currents[row]["configs"] = [asdict(results[row][s.name]) for s in specs if s.name in results[row]]
            if on_result is not None:
                on_result(StreamResult(stream_set_payload({**meta, "wall_s": time.perf_counter() - t0},
                                                          finished + currents)))

        if progress:
            import sys

            for i in rows:
                print(f"stream {i + 1}/{len(sources)}: {sources[i].corpus} #{sources[i].document} {sources[i].title}",
                      file=sys.stderr, flush=True)
        evaluate_streams(subject.model, torch.stack([sources[i].ids for i in rows]), specs, chunk=chunk,
                         recompute_every=every, max_context=ctx, mode=o.mode, progress=progress, done=dones,
                         on_result=save, agreement=o.agreement,
                         latency_steps=LATENCY_STEPS if first == 0 and o.latency else 0)  # the first stream's
        for cur, res in zip(currents, results):
            cur["configs"] = [asdict(res[s.name]) for s in specs]
        finished.extend(currents)
    return StreamResult(stream_set_payload({**meta, "wall_s": time.perf_counter() - t0}, finished))


def _passkey(subject, o: PasskeyOptions, *, model, resume: dict | None, on_result, progress: bool,
             command: str) -> PasskeyResult:
    """The ``passkey`` task: every configuration (no recompute) on the same samples; the configurations of
    ``resume`` for the same samples are kept."""
    import hashlib

    from sinklab.provenance import code_version
    from sinklab.result import versions
    from sinklab.streaming.passkey import (NEEDLE, QUESTION, evaluate_passkey, passkey_samples,
                                           result_from_dict as passkey_result)
    from sinklab.zoo.corpora import load_corpus

    specs = _specs(o, "passkey")
    _, ctx = _check_subject(subject, model, o.corpus, specs, "passkey")
    corp = load_corpus(o.corpus)
    samples = passkey_samples(subject.tokenizer, corp.documents, o.tokens, keys=o.keys, depths=o.depths, seed=o.seed,
                              corpus_name=corp.name)
    sha = hashlib.sha256(torch.stack([s.ids for s in samples]).numpy().tobytes()).hexdigest()[:16]
    key = {"task": "passkey", "model": subject.info["name"], "corpus": corp.name, "tokens": o.tokens, "keys": o.keys,
           "depths": [float(d) for d in o.depths], "seed": o.seed, "chunk_tokens": o.chunk, "samples_sha": sha,
           "dtype": subject.info.get("dtype")}
    key["window"] = o.window  # the sinks / window caches' names leave it out
    key.update(_model_and_cache_key(subject, o))
    done = {}
    if resume and all(resume.get(k) == v for k, v in key.items()):
        done = {c["name"]: passkey_result(c) for c in resume.get("configs", [])}
    meta = {"command": command, **key, "max_context": ctx,
            "title": f"{subject.info['name']} · pass key in {corp.name} · {o.tokens} tokens · {o.keys} keys x "
                     f"{len(o.depths)} depths",
            "needle": NEEDLE, "question": QUESTION, "model_info": subject.info, "corpus_source": corp.source,
            "versions": versions(), "code": code_version(), "torch_threads": torch.get_num_threads(),
            "load_average_at_start": _load(),
            "definitions": {
                "depth": "the needle starts after this fraction of the filler (0: right after the BOS, 1: right "
                         "before the question)",
                "accuracy": "share of samples whose greedy answer's first run of digits is the key exactly "
                            "(first_number)",
                "feeding": f"{o.chunk} token(s) per call through the cache (cache positions for sink caches, "
                           "absolute for the full cache), then 8 greedy tokens",
            }}
    if done and all(s.name in done for s in specs):
        return PasskeyResult(dict(resume))
    results = dict(done)
    t0 = time.perf_counter()

    def payload() -> PasskeyResult:
        return PasskeyResult({**meta, "wall_s": time.perf_counter() - t0,
                              "configs": [asdict(results[x.name]) for x in specs if x.name in results]})

    for s in specs:
        if s.name in results:
            continue
        results[s.name] = evaluate_passkey(subject.model, subject.tokenizer, samples, s, batch=o.batch, chunk=o.chunk,
                                           max_context=ctx, progress=progress)
        if on_result is not None:
            on_result(payload())
    return payload()


def _check_subject(loaded, model, corpus: str, specs, task: str) -> tuple:
    """(whether the :class:`~sinklab.subject.Subject` is a sinklab model, its context or None), refused as
    :func:`stream` says."""
    native = loaded.adapter.kind == "sinklab"
    if loaded.is_encoder or not (native or hasattr(loaded.model, "set_attn_implementation")):
        raise InputError(f"sinklab stream needs a causal LM with relative positions; {model} is "
                         + ("an encoder" if loaded.is_encoder else f"a {loaded.info['architecture']} model"))
    if corpus == "run" and not native:
        raise InputError(f"{param('corpus', 'run')} needs a model trained with sinklab train (its held-out data)")
    SinkCache(loaded.model, 0, 1, max_context=None)  # refuses a model without supported positions, naming why
    ctx = loaded.info.get("max_context")
    for s in specs:  # check every configuration before the first long run
        if s.kind == "sink" and ctx is not None and s.n_sink + s.window > ctx:
            raise InputError(f"n_sink + window = {s.n_sink + s.window} exceeds the model's context of {ctx} tokens")
    if task == "passkey" and (native or corpus == "run"):
        raise InputError("the passkey task needs a transformers model and a text corpus (it states the key in words)")
    return native, ctx


def _stream_tokens(loaded, model: str, corpus: str, tokens: int) -> tuple[torch.Tensor, object]:
    """(the stream's (N,) ids, the corpus: ``name`` and ``source``)."""
    from sinklab.zoo.corpora import load_corpus

    if corpus == "run":
        from sinklab.streaming.harness import run_stream

        ids = run_stream(model, tokens)
        corp = type("RunCorpus", (), {"name": "run", "source": {"run": str(model), "split": "validation"}})()
    else:
        corp = load_corpus(corpus)
        ids = token_stream(loaded.tokenizer, corp.documents, tokens, corpus_name=corp.name)
    return ids, corp


def _key(loaded, corp, ids: torch.Tensor, o, *, chunk: int, every: int) -> dict:
    """The settings a resumed ``stream.json`` must share (:func:`_resumable`); ``latency`` only where it is off
    (``"latency": false``), so that the results of earlier versions, all timed, stay resumable."""
    key = {"model": loaded.info["name"], "corpus": corp.name, "tokens": o.tokens, "window": o.window, "chunk": chunk,
           "recompute_every": every, "stream_sha": _sha(ids), "dtype": loaded.info.get("dtype")}
    key.update(_model_and_cache_key(loaded, o))
    if not o.latency:
        key["latency"] = False
    return key


def _model_and_cache_key(subject, o) -> dict:
    """The resume-key entries every streaming task shares (perplexity, one and many streams, pass key, needle,
    ruler): a model in memory's weights digest (its class name says nothing of them; nothing for a model loaded by
    name or folder) and, with ``o.policies``, their ``n_sink`` and ``kv_group``, which a policy configuration's
    name leaves out."""
    key = {}
    if subject.info.get("source") == "python object":
        from sinklab.subject.core import weights_digest

        key["weights_sha"] = weights_digest(subject.model)
    if getattr(o, "policies", None):
        key["n_sink_policies"], key["kv_group"] = o.n_sink, o.kv_group
    return key


def _same_settings(resume: dict | None, key: dict) -> bool:
    """Whether ``resume`` was computed with the settings ``key`` (:func:`_key`); a result without ``latency``
    was timed, so it is resumed by a timed run only (and a timed one by an untimed run only where asked)."""
    return bool(resume) and all(resume.get(k) == v for k, v in key.items()) and \
        resume.get("latency", True) == key.get("latency", True)


def _meta(command: str, key: dict, loaded, corp, *, ctx, native: bool, mode: str, every: int, tokens: int, window: int,
          policies, budgets=(), recompute: bool = False) -> dict:
    """The fields of ``stream.json`` besides the configurations. The title names the window of the default sink
    caches, or with ``policies`` their budgets (and the window only where the recompute baseline uses it)."""
    from sinklab.provenance import code_version
    from sinklab.result import versions

    caches = (f"budget {','.join(map(str, budgets))}" + (f" · recompute window {window}" if recompute else "")
              if policies else f"window {window}")
    return {
        "command": command, **key, "max_context": ctx,
        "title": f"{loaded.info['name']} · {corp.name} · {tokens} tokens · {caches}",
        "model_info": loaded.info, "corpus_source": corp.source, "versions": versions(),
        "mode": "decode" if native else mode, "code": code_version(), "torch_threads": torch.get_num_threads(),
        "load_average_at_start": _load(),
        "definitions": _meta_definitions(every, policies),
    }


def _meta_definitions(every: int, policies) -> dict:
    """The ``definitions`` of a perplexity run's ``stream.json``."""
    return {
        "ppl": "exp(mean next-token NLL in nats); position t predicts token t+1 (0-based)",
        "kl": "agreement with the full cache: mean over positions t of KL(p_full || p_config) of the "
              "distribution of token t+1, nats (float64 from the logits as the model gave them); the full "
              "cache's logits computed once per stream; positions past the model's context have none",
        "top1": "share of positions whose argmax next token equals the full cache's",
        "latency_ms_per_token": "mean wall time of one decode step (recompute: one forward over window+1 tokens)",
        "cache_bytes": "bytes of kept keys+values at the end of the stream (recompute: one window's)",
        "recompute": f"scored at every {every}-th position",
        "mode": "parallel: one forward per configuration computing exactly the token-by-token cache's "
                "attention (sinklab.streaming.parallel); decode: token by token through the cache",
        "latency": f"mean of {LATENCY_STEPS} single-token decode steps through the real cache at the end of the stream, "
                   "after filling it in chunks (with stacking off, the configurations decoded token by token: "
                   f"their own last {LATENCY_STEPS} steps; --no-latency: not timed, null, and cache bytes 0)",
        **(_POLICY_DEFINITIONS if policies else {}),
    }


_POLICY_DEFINITIONS = {
    "policy": "sinklab.streaming.policies: which tokens each layer keeps at the budget; window and sinks at 16 "
              "bits run in parallel mode, every other configuration token by token (attention-based policies with "
              "eager attention)",
    "budget": "tokens kept per layer between decode steps (a step attends to budget + 1 keys)",
    "kv_bits": "16: keys/values stored as the model gives them; 8/4/3/2: asymmetric min-max codes "
               "(sinklab.streaming.quant), dequantised on read",
    "key_quant": "token: keys in groups of kv_group channels per token; channel: each channel over blocks of "
                 "kv_group tokens (KIVI), the open block in full precision; values always per token",
    "sinks_full_precision": "the first N tokens of the stream also kept lossless",
    "cache_bytes_quantised": "packed codes + scales and zeros (key/value dtype) + residual and lossless copies",
    "state_bytes": "positions, arrival indices and policy scores besides the keys and values",
}


def _load() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _sha(ids: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]


def _resumable(resume: dict | None, key: dict) -> dict[str, StreamConfigResult]:
    """The configurations of ``resume`` (an earlier ``stream.json``'s content) computed with the same settings
    ``key`` (else none)."""
    if not _same_settings(resume, key) or "streams" in resume:
        return {}
    return {c["name"]: result_from_dict(c) for c in resume.get("configs", [])}


register_task(StreamTask(
    "perplexity", PerplexityOptions, _perplexity, StreamResult,
    "Perplexity, agreement with the full cache (KL, top-1), decode latency and cache memory of the full cache, "
    "window only, sinks + window and sliding window with recomputation, or with --policy any cache policy at a "
    "fixed budget, stored as given or quantised; on one stream, or with --streams N on N documents with 95% "
    "t-intervals over streams and paired comparisons."))
register_task(StreamTask(
    "passkey", PasskeyOptions, _passkey, PasskeyResult,
    "Pass-key retrieval: a 5-digit key, in one needle that states it twice, at a depth of a stream of filler text, asked for at the end; accuracy "
    "per depth for every cache configuration."))

__all__ = ["stream", "StreamResult", "PasskeyResult", "torch_threads", "DEFAULT_SINKS"]
