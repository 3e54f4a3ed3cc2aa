"""Benchmark: stream decode through a SinkCache on the CPU, float32 vs bfloat16, batch 1 vs 8.

A random-weight LLaMA model of LLaMA-3.2-1B's shape (hidden 2048, 16 layers, 32 query / 8 KV heads of
64, intermediate 8192, vocabulary 128256, tied embeddings: 1.24 B parameters; ``--layers`` fewer to fit
the time), built directly in the dtype measured (so that float32 weights never exist in a bfloat16
run). Each cell (dtype x batch x cache) runs in its own Python process, so that its peak memory is
its own. Besides the four SinkCache cells, four reference cells run the same decode with transformers'
``DynamicCache`` (no eviction: the model's own forward), so the JSON separates how the model's
forward scales with the batch on this CPU from what the sink cache adds (``--no-reference`` skips them):

* a batch of ``B`` streams: B = 1 one prompt of ``--prompt`` tokens; B = 8 eight prompts of different
  lengths (``--prompt`` / 2 .. ``--prompt``), left-padded, with the attention mask and the position ids
  ``generate`` passes (each row's sinks, positions and evictions its own);
* ``SinkCache(n_sink=4, window=--window)``, prefilled with the prompts (``logits_to_keep=1``), then
  ``--steps`` greedy single-token decode steps, timed after ``--warmup`` untimed ones: ms per decode
  step and tokens/s (B tokens per step). The longest prompt fills the cache (4 + window < prompt):
  its row evicts at every step, shorter rows once they fill it (``kept_per_row`` in the JSON).
* peak memory: the process's peak resident set size (``ru_maxrss``, kilobytes on Linux), which counts
  the weights, the cache, the activations and the Python / torch runtime (about 0.3-0.5 GiB, the same in
  every cell). torch has no allocator statistics on the CPU; tracemalloc does not see torch's memory.

Printed and written (``benchmarks/results/device_batch.json``): per cell ms/step, tokens/s, peak RSS;
the ratios bfloat16 / float32 peak RSS (target <= 0.6) and batch-8 / batch-1 tokens/s (target >= 3),
all measured in one run, with ``os.getloadavg()`` before and after (the machine is shared: load above
the core count slows every cell, not the same amount each).

Usage::

    .venv/bin/python benchmarks/device_batch.py            # 16 layers, prompts <= 64, window 60, 24 steps
    .venv/bin/python benchmarks/device_batch.py --quick    # 2 layers, 6 steps: a smoke run (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

DTYPES = ("float32", "bfloat16")
BATCHES = (1, 8)


def _child(args: argparse.Namespace) -> dict:
    """One cell in this process: build the model in ``args.dtype``, prefill, decode; return the numbers."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sinklab.streaming import SinkCache

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=args.layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                      tie_word_embeddings=True, rope_theta=500000.0, attn_implementation="sdpa")
    t0 = time.perf_counter()
    torch.set_default_dtype(dtype)  # parameters are created in the measured dtype, never float32 first
    model = LlamaForCausalLM(cfg).eval()
    torch.set_default_dtype(torch.float32)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    B, P = args.batch, args.prompt
    lengths = [P] if B == 1 else [P // 2 + round(i * (P - P // 2) / (B - 1)) for i in range(B)]
    g = torch.Generator().manual_seed(1)
    ids = torch.zeros(B, P, dtype=torch.long)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, P - n :] = torch.randint(1, cfg.vocab_size, (n,), generator=g)
        mask[b, P - n :] = 1
    pos = (mask.cumsum(-1) - 1).clamp_min(0)  # generate's position ids: each row's real tokens from 0
    if args.cache == "dynamic":  # the reference: the model's own forward with transformers' full cache
        from transformers import DynamicCache

        cache = DynamicCache()
    else:
        cache = SinkCache(model, n_sink=4, window=args.window)
    times = []
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
                    logits_to_keep=1)
        prefill_s = time.perf_counter() - t0
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        pos = pos[:, -1:]
        for step in range(args.warmup + args.steps):
            mask = torch.cat((mask, mask.new_ones(B, 1)), dim=1)
            pos = pos + 1
            t0 = time.perf_counter()
            out = model(nxt, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
    step_s = sum(times) / len(times)
    if args.cache == "dynamic":
        kept, padded = [cache.get_seq_length()] * B, False
    else:
        padded = cache.padded
        kept = [cache.layers[0].rows[b].kept for b in range(B)] if padded else [cache.kept_length()] * B
    return dict(cache=args.cache, dtype=args.dtype, batch=B, lengths=lengths, layers=args.layers, params=n_params,
                param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()), build_s=build_s,
                prefill_s=prefill_s, ms_per_step=1000 * step_s, ms_per_token=1000 * step_s / B,
                tokens_per_s=B / step_s, kept_per_row=kept, padded_cache=padded,
                peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, threads=torch.get_num_threads())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 layers, prompts <= 32, window 28, 6 steps")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 16, --quick 2)")
    ap.add_argument("--prompt", type=int, default=None, help="longest prompt in tokens (default 64, --quick 32)")
    ap.add_argument("--window", type=int, default=None, help="SinkCache window (default 60, --quick 28)")
    ap.add_argument("--steps", type=int, default=None, help="timed decode steps (default 24, --quick 6)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="sink", help=argparse.SUPPRESS)
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the reference cells (transformers' DynamicCache: the model's own batch scaling)")
    args = ap.parse_args()
    q = args.quick
    args.layers = args.layers or (2 if q else 16)
    args.prompt = args.prompt or (32 if q else 64)
    args.window = args.window or (28 if q else 60)
    args.steps = args.steps or (6 if q else 24)
    if args.child:
        print(json.dumps(_child(args)))
        return

    load_before = os.getloadavg()
    t_start = time.perf_counter()
    cells = []
    caches = ("sink",) if args.no_reference else ("sink", "dynamic")
    for cache_kind, dtype, batch in [(c, d, b) for d in DTYPES for c in caches for b in BATCHES]:
        cmd = [sys.executable, __file__, "--child", "--cache", cache_kind, "--dtype", dtype, "--batch", str(batch), "--layers",
               str(args.layers), "--prompt", str(args.prompt), "--window", str(args.window), "--steps",
               str(args.steps), "--warmup", str(args.warmup)] + (["--threads", str(args.threads)] if args.threads else [])
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode:
            sys.exit(f"cell {dtype} batch {batch} failed:\n{res.stderr[-3000:]}")
        cell = json.loads(res.stdout.strip().splitlines()[-1])
        cells.append(cell)
        print(f"{cache_kind:>7} {dtype:>9} batch {batch}: {cell['ms_per_step']:8.1f} ms/step {cell['ms_per_token']:8.1f} ms/token "
              f"{cell['tokens_per_s']:7.2f} tok/s  peak RSS {cell['peak_rss_mib']:8.0f} MiB  "
              f"(prefill {cell['prefill_s']:.1f} s, build {cell['build_s']:.1f} s)", flush=True)
    load_after = os.getloadavg()
    by = {(c["dtype"], c["batch"]): c for c in cells if c["cache"] == "sink"}
    ref = {(c["dtype"], c["batch"]): c for c in cells if c["cache"] == "dynamic"}
    ratios = {
        f"peak_rss_bf16_over_fp32_batch{b}": by[("bfloat16", b)]["peak_rss_mib"] / by[("float32", b)]["peak_rss_mib"]
        for b in BATCHES
    } | {
        f"tokens_per_s_batch8_over_batch1_{d}": by[(d, 8)]["tokens_per_s"] / by[(d, 1)]["tokens_per_s"] for d in DTYPES
    } | {
        f"ms_per_token_bf16_over_fp32_batch{b}": by[("bfloat16", b)]["ms_per_token"] / by[("float32", b)]["ms_per_token"]
        for b in BATCHES
    } | {
        f"reference_dynamic_tokens_per_s_batch8_over_batch1_{d}": ref[(d, 8)]["tokens_per_s"] / ref[(d, 1)]["tokens_per_s"]
        for d in DTYPES if (d, 8) in ref and (d, 1) in ref
    } | {
        f"sink_over_dynamic_ms_per_step_{d}_batch{b}": by[(d, b)]["ms_per_step"] / ref[(d, b)]["ms_per_step"]
        for d in DTYPES for b in BATCHES if (d, b) in ref
    }
    print(f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in load_after)}, on {os.cpu_count()} CPUs")
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    from sinklab.provenance import code_version

    out = Path(args.out) if args.out else Path(__file__).parent / "results" / (
        "device_batch-quick.json" if q else "device_batch.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        benchmark="device_batch", quick=q, layers=args.layers, prompt=args.prompt, window=args.window, n_sink=4,
        steps=args.steps, warmup=args.warmup, cells=cells, ratios=ratios,
        targets=dict(peak_rss_bf16_over_fp32="<= 0.6", tokens_per_s_batch8_over_batch1=">= 3"),
        memory="peak resident set size of each cell's own process (ru_maxrss)",
        loadavg_before=load_before, loadavg_after=load_after, cpus=os.cpu_count(), machine=platform.machine(),
        processor=platform.processor(), python=platform.python_version(), code=code_version(),
        wall_s=time.perf_counter() - t_start), indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
