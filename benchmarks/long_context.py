"""Benchmark: sink statistics at long context, time and peak memory per collector.

SmolLM2-135M (SDPA), one sequence of State of the Union text (the corpus's documents
joined, cut to T tokens) at T = 1024, 2048, 4096, 8192. For each T and each mode:

* ``plain``      -- the backbone forward with SDPA, no statistics (what ``collect`` runs
                    without capture: no LM head);
* ``blockwise``  -- ``collect(..., collector="blockwise")`` (exact statistics, no T x T);
* ``eager``      -- ``collect(..., collector="eager")`` (one layer's T x T matrix at a time);
* ``paired``     -- (not in the default set) ``plain`` and ``blockwise`` in one process,
                    timed in the order plain, blockwise, blockwise, plain: the time ratio
                    with both under the same machine load (no memory numbers);
* ``output_attentions`` -- the eager path the paper's script uses: every layer's
                    (B, H, T, T) attention returned at once (skipped when its estimated
                    memory exceeds ``--max-gb``).

Each (T, mode) runs in a **fresh subprocess**: the model is loaded and warmed up on 64
tokens, the kernel's peak-RSS counter is reset (``/proc/self/clear_refs`` = 5), the
forward runs once, and the peak RSS (``VmHWM``) minus the RSS before the forward is
reported. RSS is what the machine actually has to provide (torch's CPU allocator
returns large blocks to the OS, so the peak is not hidden by caching); tracemalloc
would miss torch's allocations and the torch profiler only sees tensors. Time is wall
clock and process CPU time of that one forward (CPU threads: torch's default, or
``--threads``; with 1 thread the CPU time is the number to read on a busy machine). Workers run with
``MALLOC_MMAP_THRESHOLD_=1048576`` so that glibc heap fragmentation does not
masquerade as peak memory. Linux only.

Usage::

    .venv/bin/python benchmarks/long_context.py                 # the full table
    .venv/bin/python benchmarks/long_context.py --seq-lens 1024 --modes plain blockwise
    .venv/bin/python benchmarks/long_context.py --seq-lens 4096 8192 --modes paired --threads 1   # time ratio, one process
    # before/after a change: the same script with the old sources first on the path
    PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/long_context.py --threads 1 --json before.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODES = ("plain", "blockwise", "eager", "output_attentions")
PAIRED = "paired"  # plain and blockwise timed in one process, in the order plain, blockwise, blockwise, plain


def _rss_mb(field: str) -> float:
    """``field`` of /proc/self/status (kB there, i.e. KiB) in MiB (2^20 bytes): every ``peak_mb`` of the result files
    is MiB (the field name predates the unit's label)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError(f"{field} not in /proc/self/status")


def _tokens(tokenizer, seq_len: int):
    """(1, seq_len) int64 ids of SOTU text (documents joined by blank lines, repeated if short)."""
    import torch

    from sinklab.zoo.corpora import load_corpus

    docs = load_corpus("sotu").documents
    text, i = "", 0
    while len(text) < 6 * seq_len:  # ~4 characters per token; generous
        text += docs[i % len(docs)] + "\n\n"
        i += 1
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    while len(ids) < seq_len:
        ids = ids + ids
    return torch.tensor([ids[:seq_len]], dtype=torch.long)


def worker(mode: str, seq_len: int, block_size: int | None, threads: int | None = None) -> dict:
    """Run one configuration in this (fresh) process and return its measurements."""
    import torch

    if threads:
        torch.set_num_threads(threads)

    from sinklab.capture import collect
    from sinklab.capture.blockwise import blockwise_options
    from sinklab.models import load_model

    loaded = load_model("smollm2-135m", attn_implementation="sdpa")
    model = loaded.model.eval()
    ids = _tokens(loaded.tokenizer, seq_len)

    def run(x):
        with torch.no_grad():
            if mode == "plain":
                model.model(input_ids=x, use_cache=False)
            elif mode in ("blockwise", "eager"):
                with blockwise_options(block_size=block_size):
                    collect(model, x, batch_size=1, collector=mode)
            elif mode == "output_attentions":
                model.set_attn_implementation("eager")
                out = model.model(input_ids=x, output_attentions=True, use_cache=False)
                assert len(out.attentions) == model.config.num_hidden_layers
                model.set_attn_implementation("sdpa")
            else:
                raise ValueError(mode)

    if mode == PAIRED:  # time ratio with both modes under the same load (no memory numbers)
        for m in ("plain", "blockwise"):
            mode = m
            run(ids[:, :64])
        times = {"plain": [], "blockwise": []}
        for m in ("plain", "blockwise", "blockwise", "plain"):
            mode = m
            t0, c0 = time.perf_counter(), time.process_time()
            run(ids)
            times[m].append((time.perf_counter() - t0, time.process_time() - c0))
        wall = {m: sum(t[0] for t in v) for m, v in times.items()}
        cpu = {m: sum(t[1] for t in v) for m, v in times.items()}
        return {"mode": PAIRED, "T": seq_len, "runs": times, "ratio_wall": wall["blockwise"] / wall["plain"],
                "ratio_cpu": cpu["blockwise"] / cpu["plain"], "threads": torch.get_num_threads()}

    run(ids[:, :64])  # warm-up: lazy imports, kernel selection
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    base = _rss_mb("VmRSS")
    t0, c0 = time.perf_counter(), time.process_time()
    run(ids)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return {
        "mode": mode, "T": seq_len, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mb": _rss_mb("VmHWM") - base,
        "base_mb": base, "threads": torch.get_num_threads(),
    }


def estimate_gb(mode: str, seq_len: int, layers: int = 30, heads: int = 9) -> float:
    """Rough attention-matrix memory of a mode (float32): all layers for output_attentions,
    one layer with ~3 temporaries for the eager collector, nothing T x T otherwise."""
    one = heads * seq_len * seq_len * 4 / 2**30
    return {"output_attentions": layers * one + 2 * one, "eager": 3 * one}.get(mode, 0.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES + (PAIRED,),
                   help=f"'{PAIRED}': plain and blockwise in one process, 2 runs each (ABBA), time ratio only")
    p.add_argument("--max-gb", type=float, default=16.0, help="skip a mode whose estimated memory exceeds this")
    p.add_argument("--eager-max-t", type=int, default=4096, help="longest T for the eager collector (time)")
    p.add_argument("--block-size", type=int, default=None, help="blockwise block size (default: automatic)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    p.add_argument("--threads", type=int, default=None, help="torch threads in each worker (default: torch's)")
    p.add_argument("--worker", nargs=2, metavar=("MODE", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker[0], int(args.worker[1]), args.block_size, args.threads)), flush=True)
        return

    rows = []
    load_start = [round(x, 2) for x in os.getloadavg()]
    print(f"load average at start: {load_start}", flush=True)
    for T in args.seq_lens:
        for mode in args.modes:
            est = estimate_gb(mode, T)
            if est > args.max_gb or (mode == "eager" and T > args.eager_max_t):
                rows.append({"mode": mode, "T": T, "skipped": f"estimated {est:.1f} GB" if est > args.max_gb else "time"})
                print(f"T={T:5d} {mode:18s} skipped ({rows[-1]['skipped']})", flush=True)
                continue
            cmd = [sys.executable, __file__, "--worker", mode, str(T)]
            if args.block_size:
                cmd += ["--block-size", str(args.block_size)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            # a fixed glibc mmap threshold: with the default dynamic one, freed blocks of up to
            # 32 MiB stay in the heap and fragmentation inflates the peak RSS (seen: 2.1-2.4 GB
            # instead of 0.31 GB for blockwise at T = 8192)
            env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=os.environ.get("MALLOC_MMAP_THRESHOLD_", "1048576"))
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
                rows.append({"mode": mode, "T": T, "skipped": f"failed (rc {proc.returncode}): {' | '.join(tail)}"})
                print(f"T={T:5d} {mode:18s} FAILED: {tail}", flush=True)
                continue
            row = json.loads(lines[-1][len("RESULT "):])
            rows.append(row)
            if mode == PAIRED:
                print(f"T={T:5d} {mode:18s} blockwise / plain = {row['ratio_wall']:.2f} wall, {row['ratio_cpu']:.2f} CPU "
                      f"(runs as (wall, CPU) s: {row['runs']})", flush=True)
                continue
            print(f"T={T:5d} {mode:18s} {row['seconds']:8.2f} s  CPU {row['cpu_seconds']:8.2f} s  peak +{row['peak_mb']:8.1f} MiB",
                  flush=True)
    print(f"load average at end: {os.getloadavg()}\n")

    plain = {r["T"]: r for r in rows if r["mode"] == "plain" and "seconds" in r}
    header = "| T | mode | time (s) | CPU time (s) | peak RSS delta (MiB) | time / plain | CPU time / plain | memory / plain |"
    print(header)
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["mode"] == PAIRED:
            print(f"| {r['T']} | blockwise vs plain, same process (ABBA) | | | | {r['ratio_wall']:.2f} | {r['ratio_cpu']:.2f} | |")
            continue
        if "seconds" not in r:
            print(f"| {r['T']} | {r['mode']} | skipped: {r['skipped']} | | | | | |")
            continue
        base = plain.get(r["T"])
        tr = f"{r['seconds'] / base['seconds']:.2f}" if base else ""
        cr = f"{r['cpu_seconds'] / base['cpu_seconds']:.2f}" if base else ""
        mr = f"{r['peak_mb'] / base['peak_mb']:.2f}" if base and base["peak_mb"] > 0 else ""
        print(f"| {r['T']} | {r['mode']} | {r['seconds']:.2f} | {r['cpu_seconds']:.2f} | {r['peak_mb']:.0f} | {tr} | {cr} | {mr} |")
    if args.json:
        from sinklab.provenance import code_version

        for r in rows:  # the conditions of the run, with every row
            r.update({"command": "python " + " ".join(sys.argv), "code": code_version()["commit"],
                      "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()]})
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
