"""Benchmark: decode latency and KV-cache memory of the StreamingLLM sink cache on a long stream.

SmolLM2-135M (SDPA, float32), one stream of State of the Union text (``sinklab.streaming.token_stream``).
For each window W (default 256 and 1024) and ``n_sink`` = 4:

* ``sinks``     -- :class:`sinklab.streaming.SinkCache`: the cache is filled with the stream in chunks
                   of 512 tokens up to each checkpoint (1k, 4k, 16k tokens), then ``--steps``
                   single-token decode steps are timed there (mean ms per token) and the cache's
                   bytes are read. Flat in the stream position by design: this checks it.
* ``recompute`` -- sliding window with recomputation at the same window: one forward over the
                   W + 1 most recent tokens per generated token (mean of ``--reps`` forwards).
* ``full``      -- transformers' ``DynamicCache`` at the checkpoints within the model's context (8192).

Printed: ms per token, cache MiB, and the speedup of the sink cache over recomputation (ratio of the
two, measured in the same process one after the other). The StreamingLLM paper reports up to 22.2x per
token on a GPU at cache size 4096; this is a CPU. Results: ``benchmarks/results/streaming.json``.

Usage::

    .venv/bin/python benchmarks/streaming.py                         # W = 256, 1024 at 1k, 4k, 16k tokens
    .venv/bin/python benchmarks/streaming.py --windows 256 --at 1024 4096 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpus", default="sotu")
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--at", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed at each checkpoint")
    ap.add_argument("--reps", type=int, default=3, help="recompute forwards timed per window")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "streaming.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import DynamicCache

    from sinklab.provenance import code_version
    from sinklab.streaming import SinkCache, token_stream
    from sinklab.streaming.harness import _cache_nbytes
    from sinklab.zoo.corpora import load_corpus
    from sinklab.models import load_model

    loaded = load_model(args.model, attn_implementation="sdpa")
    model, ctx = loaded.model, loaded.info.max_context
    need = max(max(args.at) + args.steps + 1, max(args.windows) + 1)
    ids = token_stream(loaded.tokenizer, load_corpus(args.corpus).documents, need).view(1, -1)
    rows = []
    t_start = time.perf_counter()

    @torch.no_grad()
    def decode_curve(name: str, make_cache, cache_positions: bool, checkpoints: list[int]) -> None:
        cache, filled = make_cache(), 0
        for at in checkpoints:
            while filled < at:  # fill in chunks of 512
                q = min(512, at - filled)
                start = cache.kept_length() if cache_positions else filled
                model(ids[:, filled : filled + q], cache=cache, use_cache=True, logits_to_keep=1,
                      position_ids=torch.arange(start, start + q)[None])
                filled += q
            t0 = time.perf_counter()
            for t in range(filled, filled + args.steps):
                start = cache.kept_length() if cache_positions else t
                model(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=torch.tensor([[start]]))
            ms = 1000 * (time.perf_counter() - t0) / args.steps
            filled += args.steps
            nbytes = _cache_nbytes(cache)
            rows.append({"cache": name, "at_tokens": at, "ms_per_token": ms, "cache_mib": nbytes / 2**20})
            print(f"{name:<16} at {at:>6} tokens: {ms:7.1f} ms/token, cache {nbytes / 2**20:8.2f} MiB", flush=True)

    @torch.no_grad()
    def recompute(w: int) -> float:
        x = ids[:, -(w + 1):]  # the last W + 1 tokens of the stream
        model(x, logits_to_keep=1)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.reps):
            model(x, use_cache=False, logits_to_keep=1)
        ms = 1000 * (time.perf_counter() - t0) / args.reps
        rows.append({"cache": f"recompute_w{w}", "at_tokens": None, "ms_per_token": ms, "cache_mib": None})
        print(f"recompute_w{w:<6} any position : {ms:7.1f} ms/token (one forward over {w + 1} tokens)", flush=True)
        return ms

    ratios = {}
    for w in args.windows:
        decode_curve(f"sinks{args.sinks}_w{w}", lambda w=w: SinkCache(model, args.sinks, w), True, sorted(args.at))
        rec = recompute(w)
        sink_ms = [r["ms_per_token"] for r in rows if r["cache"] == f"sinks{args.sinks}_w{w}"]
        ratios[w] = rec / (sum(sink_ms) / len(sink_ms))
        print(f"speedup of the sink cache over recomputation at window {w}: {ratios[w]:.1f}x", flush=True)
    full_at = [a for a in sorted(args.at) if ctx is None or a + args.steps <= ctx]
    if full_at:
        decode_curve("full", lambda: DynamicCache(config=model.config), False, full_at)
    load = os.getloadavg()
    out = {
        "command": "python benchmarks/streaming.py " + " ".join(
            f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k != "out" and v is not None),
        "model": args.model, "corpus": args.corpus, "n_sink": args.sinks, "steps": args.steps, "reps": args.reps,
        "rows": rows, "speedup_over_recompute": {str(k): v for k, v in ratios.items()},
        "torch_threads": torch.get_num_threads(), "load_average_at_end": [round(x, 2) for x in load],
        "wall_s": time.perf_counter() - t_start, "machine": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "code": code_version(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
