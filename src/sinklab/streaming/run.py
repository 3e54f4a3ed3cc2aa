"""``sinklab stream`` from Python: load a model and a corpus, evaluate the caches, write the files."""

from __future__ import annotations

import math
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import torch

from sinklab.errors import CorruptFileError, InputError
from sinklab.fileio import check_writable, read_json
from sinklab.streaming.cache import SinkCache
from sinklab.streaming.harness import (StreamConfigResult, cache_specs, evaluate_stream, result_from_dict,
                                      token_stream, write_outputs)

DEFAULT_SINKS = (0, 1, 2, 4, 8)


def stream(
    model: str = "smollm2-135m",
    corpus: str = "sotu",
    *,
    tokens: int = 4096,
    window: int = 256,
    sinks: Sequence[int] = DEFAULT_SINKS,
    out: str | Path = "runs/stream",
    chunk: int | None = None,
    recompute_every: int | None = None,
    full: bool = True,
    recompute: bool = True,
    mode: str = "parallel",
    threads: int | None = None,
    progress: bool = True,
) -> dict:
    """Evaluate full / window / sinks_k / recompute caches of ``model`` on one stream of ``corpus``.

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

    Returns:
        The ``stream.json`` payload (dict with ``configs``).

    Raises:
        InputError: ``tokens < 2``, ``window < 1``, negative sinks, ``n_sink + window`` past the
            model's context, a corpus with fewer than ``tokens`` tokens, a model without RoPE, an
            ``out`` that cannot be written.
        UnknownNameError / FetchError: as :func:`sinklab.zoo.models.load_model`.
    """
    from sinklab.measure.run import versions
    from sinklab.provenance import code_version
    from sinklab.zoo.corpora import load_corpus
    from sinklab.zoo.models import load_model

    if tokens < 2:
        raise InputError(f"--tokens must be >= 2, got {tokens}")
    check_writable(out, "--out")  # before the model is loaded
    if mode not in ("parallel", "decode"):
        raise InputError(f"unknown mode {mode!r}: parallel | decode")
    specs = cache_specs(window, sinks, full=full, recompute=recompute)
    chunk = chunk or window
    every = recompute_every or max(1, math.ceil(tokens / 128))
    if threads:
        torch.set_num_threads(threads)
    loaded = load_model(model, attn_implementation="sdpa")
    native = loaded.info.architecture.startswith("sinklab:")
    if loaded.info.is_encoder or not (native or hasattr(loaded.model, "set_attn_implementation")):
        raise InputError(f"sinklab stream needs a causal LM with relative positions; {model} is "
                         + ("an encoder" if loaded.info.is_encoder else f"a {loaded.info.architecture} model"))
    if corpus == "run" and not native:
        raise InputError("--corpus run needs a model trained with sinklab train (its held-out data)")
    SinkCache(loaded.model, 0, 1, max_context=None)  # refuses a model without supported positions, naming why
    ctx = loaded.info.max_context
    for s in specs:  # check every configuration before the first long run
        if s.kind == "sink" and ctx is not None and s.n_sink + s.window > ctx:
            raise InputError(f"n_sink + window = {s.n_sink + s.window} exceeds the model's context of {ctx} tokens")
    if corpus == "run":
        from sinklab.streaming.harness import run_stream

        ids = run_stream(model, tokens)
        corp = type("RunCorpus", (), {"name": "run", "source": {"run": str(model), "split": "validation"}})()
    else:
        corp = load_corpus(corpus)
        ids = token_stream(loaded.tokenizer, corp.documents, tokens, corpus_name=corp.name)
    out = Path(out)
    key = {"model": loaded.info.name, "corpus": corp.name, "tokens": tokens, "window": window, "chunk": chunk,
           "recompute_every": every, "stream_sha": _sha(ids)}
    done, prev_meta = _resumable(out, key)
    argv = " ".join(shlex.quote(a) for a in ["sinklab", *sys.argv[1:]]) if Path(sys.argv[0]).name == "sinklab" else None
    cmd = ["sinklab", "stream", "--model", model, "--corpus", corpus, "--tokens", str(tokens), "--window", str(window),
           "--sinks", *map(str, sinks), "--out", str(out)]
    if chunk != window:
        cmd += ["--chunk", str(chunk)]
    if recompute_every:
        cmd += ["--recompute-every", str(recompute_every)]
    if mode != "parallel":
        cmd += ["--mode", mode]
    meta = {
        "command": argv or " ".join(shlex.quote(c) for c in cmd), **key, "max_context": ctx,
        "title": f"{loaded.info.name} · {corp.name} · {tokens} tokens · window {window}",
        "model_info": loaded.info.to_dict(), "corpus_source": corp.source, "versions": versions(),
        "mode": "decode" if native else mode, "code": code_version(), "torch_threads": torch.get_num_threads(),
        "load_average_at_start": _load(),
        "definitions": {
            "ppl": "exp(mean next-token NLL in nats); position t predicts token t+1 (0-based)",
            "latency_ms_per_token": "mean wall time of one decode step (recompute: one forward over window+1 tokens)",
            "cache_bytes": "bytes of kept keys+values at the end of the stream (recompute: one window's)",
            "recompute": f"scored at every {every}-th position",
            "mode": "parallel: one forward per configuration computing exactly the token-by-token cache's "
                    "attention (sinklab.streaming.parallel); decode: token by token through the cache",
            "latency": "mean of 32 single-token decode steps through the real cache at the end of the stream, "
                       "after filling it in chunks",
        },
    }
    results: dict[str, StreamConfigResult] = dict(done)
    t0 = time.perf_counter()

    def save(res: StreamConfigResult) -> None:
        results[res.name] = res
        write_outputs(out, {**meta, "wall_s": time.perf_counter() - t0}, [results[s.name] for s in specs if s.name in results], chunk)

    evaluate_stream(loaded.model, ids, specs, chunk=chunk, recompute_every=every, max_context=ctx, mode=mode,
                    progress=progress, done=done, on_result=save)
    if done and all(s.name in done for s in specs):  # everything was already there: redraw from the file
        write_outputs(out, prev_meta, [results[s.name] for s in specs], chunk)
    return read_json(out / "stream.json", "stream results")


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
