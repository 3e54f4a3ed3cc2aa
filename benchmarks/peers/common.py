"""Shared by the peer scripts (benchmarks/peers/*_peer.py): imported from each peer's own virtual
environment, so it needs nothing but the standard library, torch and transformers (any version).

The protocol (issue 23, item 6): the same token ids for everyone (``ids.json``, written once by
``make_ids.py`` with the model's own tokenizer), the same float32 SmolLM2-135M weights (the zoo's
``smollm2-135m`` folder), one token per forward call from token 0, NLL of every next token
(2047 predictions of 2048 tokens), perplexity overall and by chunk of 256 positions; the cache's
keys/values bytes at the end; wall time per decode step. ``--latency`` instead fills the cache with
a 1024-token prefill, runs 16 warm-up steps and times 64 single-token steps (what ``run.sh``
interleaves across peers).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "peers"
CHUNK = 256
N_SINK, WINDOW = 4, 256
BUDGET = N_SINK + WINDOW
LAT_PREFILL, LAT_WARM, LAT_STEPS = 1024, 16, 64


def args(extra=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True, help="HF folder of SmolLM2-135M (float32 safetensors)")
    ap.add_argument("--ids", default=str(RESULTS / "ids.json"))
    ap.add_argument("--out", help="JSON file to write (not with --serve)")
    ap.add_argument("--latency", action="store_true", help="time decode steps after a 1024-token prefill")
    ap.add_argument("--serve", action="store_true",
                    help="after the prefill and warm-up, time blocks of steps on request (latency_interleaved.py)")
    ap.add_argument("--threads", type=int, default=1)
    if extra:
        extra(ap)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    return a


def load_ids(path) -> torch.Tensor:
    d = json.loads(Path(path).read_text())
    return torch.tensor(d["ids"], dtype=torch.long)[None]  # (1, N)


def config(model_dir):
    """The model's config, with RoPE's theta set where an old transformers does not read
    ``rope_parameters`` (transformers 5's field): 4.x would silently use theta 10000."""
    import transformers
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    raw = json.loads((Path(model_dir) / "config.json").read_text())
    theta = (raw.get("rope_parameters") or {}).get("rope_theta", raw.get("rope_theta"))
    if theta is not None and int(transformers.__version__.split(".")[0]) < 5:
        cfg.rope_theta = float(theta)
        cfg.rope_scaling = None
    return cfg


def nll_of(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(..., V) float logits, (...) ids -> (...) float64 NLL (nats)."""
    return -torch.log_softmax(logits.double(), dim=-1).gather(-1, target[..., None])[..., 0]


def kv_bytes(pairs) -> int:
    """Bytes of an iterable of (keys, values) tensors."""
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in pairs)


def summarise(nll: list[float], n_tokens: int) -> dict:
    by_chunk = []
    for c in range(math.ceil((n_tokens - 1) / CHUNK)):
        xs = nll[c * CHUNK : (c + 1) * CHUNK]
        by_chunk.append(math.exp(sum(xs) / len(xs)) if xs else None)
    return {"ppl": math.exp(sum(nll) / len(nll)), "ppl_by_chunk": by_chunk, "predictions": len(nll),
            "chunk": CHUNK}


def env() -> dict:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "loadavg": list(os.getloadavg()), "machine": platform.machine(),
            "executable": sys.executable}


def write(out, peer: str, config_name: str, payload: dict) -> None:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    payload = {"peer": peer, "config": config_name, **payload, "peak_rss_mib": ru.ru_maxrss / 1024, "env": env()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(payload, indent=1) + "\n")
    print(json.dumps({k: v for k, v in payload.items() if k not in ("nll", "env", "ppl_by_chunk")}))


def stream(step, ids: torch.Tensor, *, timed_last: int = 256) -> tuple[list[float], float]:
    """Feed ``ids`` (1, N) one token per call through ``step(t, ids_t) -> logits (1, 1, V)``.

    Returns:
        (NLL of token t + 1 for t = 0 .. N-2, ms per step over the last ``timed_last`` steps)."""
    n = ids.shape[1]
    out, elapsed = [], 0.0
    with torch.no_grad():
        for t in range(n - 1):
            t0 = time.perf_counter()
            logits = step(t, ids[:, t : t + 1])
            if t >= n - 1 - timed_last:
                elapsed += time.perf_counter() - t0
            out.append(float(nll_of(logits[0, -1], ids[0, t + 1])))
    return out, 1000.0 * elapsed / timed_last


def latency(prefill, step, ids: torch.Tensor) -> dict:
    """``prefill(ids (1, P))`` then ``step(t, ids_t)`` for the next tokens; ms per timed step."""
    with torch.no_grad():
        prefill(ids[:, :LAT_PREFILL])
        for t in range(LAT_PREFILL, LAT_PREFILL + LAT_WARM):
            step(t, ids[:, t : t + 1])
        times = []
        for t in range(LAT_PREFILL + LAT_WARM, LAT_PREFILL + LAT_WARM + LAT_STEPS):
            t0 = time.perf_counter()
            step(t, ids[:, t : t + 1])
            times.append(1000.0 * (time.perf_counter() - t0))
    times.sort()
    return {"ms_per_token_mean": sum(times) / len(times), "ms_per_token_median": times[len(times) // 2],
            "steps": LAT_STEPS, "prefill": LAT_PREFILL, "warmup": LAT_WARM}


def serve(prefill, step, ids: torch.Tensor) -> None:
    """Worker of ``latency_interleaved.py``: ``prefill`` the first LAT_PREFILL ids, LAT_WARM warm-up steps,
    print ``ready``; then for every line ``n`` read from stdin, time the next n single-token steps and
    print their wall times and this process's CPU times (ms, ``{"wall": [...], "cpu": [...]}``), one line;
    ``quit`` (or the end of the ids) stops. On a loaded machine the CPU time is the steadier measure:
    the wall time also counts the time the scheduler gave to other processes."""
    with torch.no_grad():
        prefill(ids[:, :LAT_PREFILL])
        t = LAT_PREFILL
        for t in range(LAT_PREFILL, LAT_PREFILL + LAT_WARM):
            step(t, ids[:, t : t + 1])
        t = LAT_PREFILL + LAT_WARM
        print(json.dumps({"ready": True, **env()}), flush=True)
        for line in sys.stdin:
            if line.strip() == "quit" or t + int(line) >= ids.shape[1]:
                break
            wall, cpu = [], []
            for _ in range(int(line)):
                t0, c0 = time.perf_counter(), time.process_time()
                step(t, ids[:, t : t + 1])
                wall.append(1000.0 * (time.perf_counter() - t0))
                cpu.append(1000.0 * (time.process_time() - c0))
                t += 1
            print(json.dumps({"wall": wall, "cpu": cpu}), flush=True)


def check_reference(nll: list[float], ids_path) -> float:
    """Largest |NLL - the full cache's NLL| over the first BUDGET predictions (where every cache holds
    every token, so all must equal sinklab's full forward, written by make_ids.py): same model, same ids."""
    ref = json.loads(Path(ids_path).read_text())["full_nll_first"]
    return max(abs(a - b) for a, b in zip(nll, ref))
