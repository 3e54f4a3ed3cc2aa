"""``sinklab stream`` from Python: load a model and a corpus, evaluate the caches, write the files."""

from __future__ import annotations

import math
import shlex
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from sinklab.errors import CorruptFileError, InputError, param
from sinklab.fileio import check_writable, read_json
from sinklab.result import DictResult
from sinklab.streaming.cache import SinkCache
from sinklab.streaming.harness import (StreamConfigResult, cache_specs, evaluate_stream, policy_specs,
                                      result_from_dict, token_stream, write_outputs)
from sinklab.zoo.models import DEFAULT_MODEL

DEFAULT_SINKS = (0, 1, 2, 4, 8)


class StreamResult(DictResult):
    """What :func:`stream` returns: the content of ``stream.json`` (a dict: ``configs``, ``command``, ...)
    and a :class:`~sinklab.result.Result` (``save`` writes ``stream.json``; ``table()``: one row per
    configuration)."""

    FILE = "stream.json"
    WHAT = "stream results"


class PasskeyResult(DictResult):
    """What :func:`stream` returns for ``task="passkey"``: the content of ``passkey.json``."""

    FILE = "passkey.json"
    WHAT = "pass key results"


def stream(
    model: str = DEFAULT_MODEL,
    corpus: str = "sotu",
    *,
    tokens: int = 4096,
    window: int = 256,
    sinks: Sequence[int] | None = None,
    out: str | Path = "runs/stream",
    chunk: int | None = None,
    recompute_every: int | None = None,
    full: bool = True,
    recompute: bool = True,
    mode: str = "parallel",
    threads: int | None = None,
    progress: bool = True,
    policies: Sequence[str] | None = None,
    budgets: Sequence[int] | None = None,
    n_sink: int = 4,
    kv_bits: Sequence[int] | None = None,
    kv_group: int = 32,
    key_quant: Sequence[str] | None = None,
    sinks_full_precision: Sequence[int | str] | None = None,
    task: str = "ppl",
    passkey_keys: int = 20,
    passkey_depths: Sequence[float] = (0.0, 0.25, 0.5, 0.75, 1.0),
    passkey_batch: int = 20,
    passkey_chunk: int = 1,
    passkey_seed: int = 0,
    streams: int = 1,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    command: str | None = None,
) -> "StreamResult":
    """Evaluate full / window / sinks_k / recompute caches of ``model`` on one stream of ``corpus``,
    or with ``policies`` the cross product policies x budgets x kv_bits x key_quant x
    sinks_full_precision (:func:`sinklab.streaming.harness.policy_specs`) between full and recompute.

    Args:
        model: zoo name or Hugging Face folder of a RoPE causal LM (``sinklab list models``), or a
            ``sinklab train`` run (or its ``final/``) with relative positions, decoded token by token.
        corpus: zoo corpus name, a ``.txt`` file / folder (documents in order), or ``run``: a
            sinklab run's own validation documents after one BOS.
        tokens: stream length N (the first N tokens).
        window: recent tokens kept by the sink caches and seen by ``recompute``.
        sinks: numbers of sink tokens; 0 is the window-only cache.
        out: output folder; configurations already in ``out/stream.json`` for the same model, corpus,
            tokens, window and chunk are kept (a stopped run resumes where it stopped).
        chunk: positions per ``ppl_by_chunk`` entry (default ``window``).
        recompute_every: score every k-th position under ``recompute`` (default: N / 128 rounded up).
        full, recompute: include those two configurations.
        mode: ``parallel`` (one exact forward per configuration) or ``decode`` (token by token
            through the real cache; same numbers, N decode steps per configuration).
        threads: torch CPU threads (default: torch's).
        policies: cache policy names (:data:`sinklab.streaming.policies.POLICIES`); None: the
            configurations above. budgets: tokens kept (default 256). n_sink: sinks of the policies
            with sinks. kv_bits (default 16), kv_group, key_quant (default token),
            sinks_full_precision (default 0; N or "detected"): :class:`~sinklab.streaming.SinkCache`'s options.
        task: ``ppl`` (perplexity, latency, memory: ``stream.json``) or ``passkey``
            (:mod:`sinklab.streaming.passkey`: ``passkey_keys`` keys x ``passkey_depths`` on a stream
            of ``tokens`` tokens, ``passkey_batch`` streams at a time fed ``passkey_chunk`` tokens per
            call; ``passkey.json``; no recompute).

        device, dtype, device_map: where and in which dtype the model runs (:meth:`sinklab.subject.Subject.load`:
            ``cpu`` | ``cuda`` | ``cuda:N`` | ``auto``; ``float32`` | ``bfloat16`` | ``float16``, default bfloat16
            on CUDA and float32 otherwise; ``device_map="auto"`` spreads a transformers model with accelerate).
            Caches and quantised codes live on the model's device; NLLs are reduced in float64.
        command: the command recorded (the CLI gives the command as typed); None: a ``sinklab stream``
            command line of these arguments.

    Returns:
        The ``stream.json`` (a :class:`StreamResult`) or ``passkey.json`` (a :class:`PasskeyResult`)
        payload: a dict with ``configs``, and a :class:`~sinklab.result.Result`.

    Raises:
        InputError: ``tokens < 2``, ``window < 1``, negative sinks, ``n_sink + window`` past the
            model's context, a corpus with fewer than ``tokens`` tokens, a model without RoPE, an
            ``out`` that cannot be written, budget or quantisation options without ``policies``,
            ``sinks`` with ``policies``, bad policy or quantisation options, an unknown task.
        InputError: a bad device or dtype, or CUDA asked for but not available here.
        UnknownNameError / FetchError: as :func:`sinklab.models.load_model`; an unknown policy.
    """
    specs = _specs(tokens=tokens, out=out, mode=mode, task=task, policies=policies, sinks=sinks, budgets=budgets,
                   n_sink=n_sink, kv_bits=kv_bits, key_quant=key_quant, sinks_full_precision=sinks_full_precision,
                   kv_group=kv_group, window=window, full=full, recompute=recompute)
    chunk = chunk or window
    every = recompute_every or max(1, math.ceil(tokens / 128))
    if threads:
        torch.set_num_threads(threads)
    loaded, native, ctx = _load_checked(model, corpus, specs, task, device=device, dtype=dtype, device_map=device_map)
    cmd = dict(model=model, corpus=corpus, tokens=tokens, window=window, sinks=sinks, out=out, chunk=chunk,
               recompute_every=recompute_every, mode=mode, policies=policies, budgets=budgets, n_sink=n_sink,
               kv_bits=kv_bits, kv_group=kv_group, key_quant=key_quant, sinks_full_precision=sinks_full_precision,
               task=task, passkey_keys=passkey_keys, passkey_depths=passkey_depths, passkey_batch=passkey_batch,
               passkey_chunk=passkey_chunk, passkey_seed=passkey_seed, full=full, device=device, dtype=dtype,
               device_map=device_map)
    if task == "passkey":
        return _passkey(loaded, corpus, specs, tokens=tokens, out=Path(out), ctx=ctx, keys=passkey_keys,
                        depths=passkey_depths, batch=passkey_batch, chunk=passkey_chunk, seed=passkey_seed,
                        progress=progress, command=command or _command(**cmd))
    if streams > 1:
        return _stream_set(loaded, corpus, specs, streams=streams, tokens=tokens, window=window, chunk=chunk,
                           every=every, n_sink=n_sink, kv_group=kv_group, policies=policies, out=Path(out), ctx=ctx,
                           native=native, mode=mode, progress=progress,
                           command=command or _command(**{**cmd, "out": out}, recompute=recompute, streams=streams))
    ids, corp = _stream_tokens(loaded, model, corpus, tokens)
    out = Path(out)
    key = _key(loaded, corp, ids, tokens=tokens, window=window, chunk=chunk, every=every, n_sink=n_sink, kv_group=kv_group,
               policies=policies)
    done, prev_meta = _resumable(out, key)
    meta = _meta(command or _command(**{**cmd, "out": out}, recompute=recompute), key, loaded, corp, ctx=ctx,
                 native=native, mode=mode, every=every, tokens=tokens, window=window, policies=policies)
    _evaluate(loaded.model, ids, specs, out=out, meta=meta, done=done, prev_meta=prev_meta, chunk=chunk, every=every,
              ctx=ctx, mode=mode, progress=progress)
    return StreamResult(read_json(out / "stream.json", "stream results"))


def _stream_set(loaded, corpus: str, specs, *, streams: int, tokens: int, window: int, chunk: int, every: int,
                n_sink: int, kv_group: int, policies, out: Path, ctx, native: bool, mode: str, progress: bool,
                command: str) -> "StreamResult":
    """``streams`` > 1: every configuration on each of ``streams`` documents of the corpora ``corpus``
    (comma-separated), one stream at a time, with intervals over streams (:mod:`sinklab.streaming.streams`);
    streams already in ``out/stream.json`` with the same settings are kept (a stopped run resumes)."""
    from dataclasses import asdict

    from sinklab.streaming.streams import document_streams, write_stream_set_outputs
    from sinklab.zoo.corpora import load_corpus

    if corpus == "run" or native:
        raise InputError(f"{param('streams')} > 1 needs a transformers model and text corpora")
    corpora = [load_corpus(c) for c in corpus.split(",")]
    sources = document_streams(loaded.tokenizer, corpora, streams, tokens)
    key = {"model": loaded.info["name"], "corpus": ",".join(c.name for c in corpora), "tokens": tokens,
           "window": window, "chunk": chunk, "recompute_every": every, "dtype": loaded.info.get("dtype"),
           "n_streams": streams, "stream_shas": [s.info()["stream_sha"] for s in sources]}
    if policies:
        key["n_sink_policies"], key["kv_group"] = n_sink, kv_group
    prev_streams: list = []
    path = out / "stream.json"
    if path.exists():
        try:
            prev = read_json(path, "stream results")
            if all(prev.get(k) == v for k, v in key.items()):
                prev_streams = prev.get("streams", [])
        except CorruptFileError:
            pass
    from sinklab.provenance import code_version
    from sinklab.result import versions

    meta = {"command": command, **key, "max_context": ctx,
            "title": f"{loaded.info['name']} · {key['corpus']} · {streams} streams x {tokens} tokens",
            "model_info": loaded.info, "corpus_sources": [c.source for c in corpora], "versions": versions(),
            "mode": mode, "code": code_version(), "torch_threads": torch.get_num_threads(),
            "load_average_at_start": _load(),
            "definitions": {**_meta_definitions(every, policies),
                            "streams": "one document each: its first `tokens` tokens after the tokenizer's BOS; "
                                       "per corpus, documents long enough taken evenly spaced"}}
    done_streams: list[dict] = []
    t0 = time.perf_counter()
    for i, src in enumerate(sources):
        old = prev_streams[i] if i < len(prev_streams) else {"configs": []}
        done = {c["name"]: result_from_dict(c) for c in old["configs"]}
        current = {"info": src.info(), "configs": []}
        results = dict(done)

        def save(res, current=current, results=results) -> None:
            results[res.name] = res
            current["configs"] = [asdict(results[s.name]) for s in specs if s.name in results]
            write_stream_set_outputs(out, {**meta, "wall_s": time.perf_counter() - t0}, done_streams + [current], chunk)

        if progress:
            print(f"stream {i + 1}/{len(sources)}: {src.corpus} #{src.document} {src.title}", flush=True)
        evaluate_stream(loaded.model, src.ids, specs, chunk=chunk, recompute_every=every, max_context=ctx, mode=mode,
                        progress=progress, done=done, on_result=save)
        current["configs"] = [asdict(results[s.name]) for s in specs]
        done_streams.append(current)
    payload = write_stream_set_outputs(out, {**meta, "wall_s": time.perf_counter() - t0}, done_streams, chunk)
    return StreamResult(payload)


def _evaluate(model, ids, specs, *, out: Path, meta: dict, done: dict, prev_meta: dict, chunk: int, every: int, ctx,
              mode: str, progress: bool) -> None:
    """Evaluate the configurations not in ``done``, rewriting ``out/stream.json`` after each."""
    results: dict[str, StreamConfigResult] = dict(done)
    t0 = time.perf_counter()

    def save(res: StreamConfigResult) -> None:
        results[res.name] = res
        write_outputs(out, {**meta, "wall_s": time.perf_counter() - t0}, [results[s.name] for s in specs if s.name in results], chunk)

    evaluate_stream(model, ids, specs, chunk=chunk, recompute_every=every, max_context=ctx, mode=mode,
                    progress=progress, done=done, on_result=save)
    if done and all(s.name in done for s in specs):  # everything was already there: redraw from the file
        write_outputs(out, prev_meta, [results[s.name] for s in specs], chunk)


def _specs(*, tokens, out, mode, task, policies, sinks, budgets, n_sink, kv_bits, key_quant, sinks_full_precision,
           kv_group, window, full, recompute) -> list:
    """:func:`stream`'s argument checks (before the model is loaded) and its configurations."""
    if tokens < 2:
        raise InputError(f"{param('tokens')} must be >= 2, got {tokens}")
    check_writable(out, param("out"))  # before the model is loaded
    if mode not in ("parallel", "decode"):
        raise InputError(f"unknown mode {mode!r}: parallel | decode")
    if task not in ("ppl", "passkey"):
        raise InputError(f"unknown task {task!r}: ppl | passkey")
    if policies:
        if sinks is not None:
            raise InputError(f"{param('sinks')} sets the sink caches of the default run; with {param('policies')} give {param('n_sink')}")
        return policy_specs(policies, budgets or (256,), n_sink=n_sink, kv_bits=kv_bits or (16,),
                            key_quant=key_quant or ("token",), sinks_full_precision=sinks_full_precision or (0,),
                            kv_group=kv_group, window=window, full=full, recompute=recompute and task == "ppl")
    given = [param(f) for f, v in (("budgets", budgets), ("kv_bits", kv_bits), ("key_quant", key_quant),
                                   ("sinks_full_precision", sinks_full_precision)) if v]
    if given:
        raise InputError(f"{', '.join(given)} need {param('policies')} (e.g. {param('policies', 'sinks')})")
    return cache_specs(window, DEFAULT_SINKS if sinks is None else sinks, full=full,
                       recompute=recompute and task == "ppl")


def _load_checked(model: str, corpus: str, specs, task: str, *, device: str = "cpu", dtype: str | None = None,
                  device_map: str | None = None) -> tuple:
    """(the loaded :class:`~sinklab.subject.Subject`, whether it is a sinklab model, its context or None),
    refused as :func:`stream` says."""
    from sinklab.subject import Subject

    loaded = Subject.load(model, device=device, dtype=dtype, device_map=device_map)
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
        raise InputError(f"{param('task', 'passkey')} needs a transformers model and a text corpus (it states the key in words)")
    return loaded, native, ctx


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


def _key(loaded, corp, ids: torch.Tensor, *, tokens: int, window: int, chunk: int, every: int, n_sink: int, kv_group: int,
         policies) -> dict:
    """The settings a resumed ``stream.json`` must share (:func:`_resumable`)."""
    key = {"model": loaded.info["name"], "corpus": corp.name, "tokens": tokens, "window": window, "chunk": chunk,
           "recompute_every": every, "stream_sha": _sha(ids), "dtype": loaded.info.get("dtype")}
    if policies:
        key["n_sink_policies"], key["kv_group"] = n_sink, kv_group
    return key


def _meta(command: str, key: dict, loaded, corp, *, ctx, native: bool, mode: str, every: int, tokens: int, window: int,
          policies) -> dict:
    """The fields of ``stream.json`` besides the configurations."""
    from sinklab.provenance import code_version
    from sinklab.result import versions

    return {
        "command": command, **key, "max_context": ctx,
        "title": f"{loaded.info['name']} · {corp.name} · {tokens} tokens · window {window}",
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
        "latency": "mean of 32 single-token decode steps through the real cache at the end of the stream, "
                   "after filling it in chunks (configurations decoded token by token: their own last 32 steps)",
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


def _comma(values) -> str:
    """A list option's value as the CLI takes it: ``[0, 1, 4]`` -> ``"0,1,4"``."""
    return ",".join(map(str, values))


def _command(model, corpus, tokens, window, sinks, out, chunk, recompute_every, mode, policies, budgets, n_sink,
             kv_bits, kv_group, key_quant, sinks_full_precision, task, passkey_keys, passkey_depths, passkey_batch,
             passkey_chunk, passkey_seed, full, recompute=True, device="cpu", dtype=None, device_map=None,
             streams=1) -> str:
    """A ``sinklab stream`` command line that reproduces the call (lists comma-separated, as the CLI takes them)."""
    cmd = ["sinklab", "stream", "--model", model, "--corpus", corpus, "--tokens", str(tokens), "--window", str(window)]
    if policies:
        cmd += ["--policy", _comma(policies), "--budget", _comma(budgets or (256,))]
        if n_sink != 4:
            cmd += ["--n-sink", str(n_sink)]
        for flag, vals in (("--kv-bits", kv_bits), ("--key-quant", key_quant),
                           ("--sinks-full-precision", sinks_full_precision)):
            if vals:
                cmd += [flag, _comma(vals)]
        if kv_group != 32:
            cmd += ["--kv-group", str(kv_group)]
    else:
        cmd += ["--sinks", _comma(DEFAULT_SINKS if sinks is None else sinks)]
    cmd += ["--out", str(out)]
    if chunk != window:
        cmd += ["--chunk", str(chunk)]
    if recompute_every:
        cmd += ["--recompute-every", str(recompute_every)]
    if mode != "parallel":
        cmd += ["--mode", mode]
    if not full:
        cmd += ["--no-full"]
    if not recompute:
        cmd += ["--no-recompute"]
    if task != "ppl":
        cmd += ["--task", task, "--passkey-keys", str(passkey_keys), "--passkey-depths", _comma(passkey_depths),
                "--passkey-batch", str(passkey_batch), "--passkey-chunk", str(passkey_chunk)]
        if passkey_seed:
            cmd += ["--passkey-seed", str(passkey_seed)]
    if streams != 1:
        cmd += ["--streams", str(streams)]
    if device != "cpu":
        cmd += ["--device", device]
    if dtype is not None:
        cmd += ["--dtype", dtype]
    if device_map is not None:
        cmd += ["--device-map", device_map]
    return " ".join(shlex.quote(c) for c in cmd)


def _passkey(loaded, corpus: str, specs, *, tokens: int, out: Path, ctx, keys: int, depths, batch: int, chunk: int,
             seed: int, progress: bool, command: str) -> dict:
    """``--task passkey``: every configuration of ``specs`` (no recompute) on the same samples; the
    configurations already in ``out/passkey.json`` for the same samples are kept (a stopped run resumes)."""
    from sinklab.provenance import code_version
    from sinklab.result import versions
    from sinklab.streaming.passkey import (NEEDLE, QUESTION, evaluate_passkey, passkey_samples, result_from_dict,
                                           write_passkey_outputs)
    from sinklab.zoo.corpora import load_corpus

    corp = load_corpus(corpus)
    samples = passkey_samples(loaded.tokenizer, corp.documents, tokens, keys=keys, depths=depths, seed=seed,
                              corpus_name=corp.name)
    import hashlib

    sha = hashlib.sha256(torch.stack([s.ids for s in samples]).numpy().tobytes()).hexdigest()[:16]
    key = {"task": "passkey", "model": loaded.info["name"], "corpus": corp.name, "tokens": tokens, "keys": keys,
           "depths": [float(d) for d in depths], "seed": seed, "chunk_tokens": chunk, "samples_sha": sha,
           "dtype": loaded.info.get("dtype")}
    done, prev = {}, {}
    path = out / "passkey.json"
    if path.exists():
        try:
            prev = read_json(path, "pass key results")
        except CorruptFileError:
            prev = {}
        if all(prev.get(k) == v for k, v in key.items()):
            done = {c["name"]: result_from_dict(c) for c in prev.pop("configs", [])}
        else:
            prev = {}
    meta = {"command": command, **key, "max_context": ctx,
            "title": f"{loaded.info['name']} · pass key in {corp.name} · {tokens} tokens · {keys} keys x {len(depths)} depths",
            "needle": NEEDLE, "question": QUESTION, "model_info": loaded.info, "corpus_source": corp.source,
            "versions": versions(), "code": code_version(), "torch_threads": torch.get_num_threads(),
            "load_average_at_start": _load(),
            "definitions": {
                "depth": "the needle starts after this fraction of the filler (0: right after the BOS, 1: right "
                         "before the question)",
                "accuracy": "share of samples whose first 5-digit run in the greedy answer is the key",
                "feeding": f"{chunk} token(s) per call through the cache (cache positions for sink caches, absolute "
                           "for the full cache), then 8 greedy tokens",
            }}
    results = dict(done)
    t0 = time.perf_counter()
    for s in specs:
        if s.name in results:
            continue
        results[s.name] = evaluate_passkey(loaded.model, loaded.tokenizer, samples, s, batch=batch, chunk=chunk,
                                           max_context=ctx, progress=progress)
        write_passkey_outputs(out, {**meta, "wall_s": time.perf_counter() - t0},
                              [results[x.name] for x in specs if x.name in results])
    if done and all(s.name in done for s in specs):
        write_passkey_outputs(out, prev, [results[s.name] for s in specs])
    return PasskeyResult(read_json(path, "pass key results"))


def _load() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _sha(ids: torch.Tensor) -> str:
    import hashlib

    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]


def _resumable(out: Path, key: dict) -> tuple[dict[str, StreamConfigResult], dict]:
    """Configurations in ``out/stream.json`` computed with the same settings (else none), and that
    file's other fields (command, versions, wall time...)."""
    path = out / "stream.json"
    if not path.exists():
        return {}, {}
    try:
        prev = read_json(path, "stream results")
    except CorruptFileError:  # computed again and rewritten
        return {}, {}
    if any(prev.get(k) != v for k, v in key.items()):
        return {}, {}
    configs = prev.pop("configs", [])
    return {c["name"]: result_from_dict(c) for c in configs}, prev


__all__ = ["stream", "DEFAULT_SINKS"]
