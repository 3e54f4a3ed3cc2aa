"""The device script: everything sinklab checks and measures on one GPU.

The first four steps take about 9 minutes on an H200, ``analyze`` and ``stream`` at most 5 more: a
15-minute device draw runs a subset (``--only analyze stream``).

    bash benchmarks/gpu.sh                      # = python benchmarks/gpu.py --out "$OUT"
    SINKLAB_GPU_SMOKE=1 bash benchmarks/gpu.sh  # the same steps on the CPU at tiny sizes (no GPU needed)

Steps, each in its own process with its own time limit (a step that fails, crashes or runs out
of time is reported as FAILED with the end of its log and the rows it finished, the others still
run, and the script exits 1):

1. ``cuda_tests``: ``pytest -m cuda tests/test_gpu.py`` (bf16 training of every attention
   operation, ``sinklab train`` on CUDA, blockwise measure on CUDA = CPU, SinkCache decoding on
   CUDA = CPU, NCCL data parallel with 2+ GPUs); counts and the JUnit XML. In the smoke run they
   are skipped (no CUDA), and reported so.
2. ``train``: training tokens/s, peak memory and MFU at the paper-60m shapes (d 768, 10 layers,
   8 heads, FFN 1536, vocabulary 32000, T 2048, micro-batch 16 as the preset), bf16 autocast,
   fused AdamW, per attention operation family: the SDPA family (softmax, sink_logit,
   gated_headwise; softmax also through FlexAttention, sink_logit through FlexAttention under
   ``torch.compile``: its score_mod's captured, learned logit), the tile family (sigmoid, relu,
   softpick; sigmoid also on the compiled tile path), softmax under ``torch.compile``, and
   transformers' ``LlamaForCausalLM`` (SDPA) on the same shapes and weights. ``MFU = (6 N + 6 L T d)
   tokens/s / peak`` (``benchmarks/train_throughput.py``), peak = the GPU's dense bf16 rate
   (table below or ``--peak-tflops``).
3. ``measure``: the blockwise collector (``sinklab measure --collector blockwise``) on SmolLM2-135M
   (bf16) at T = 8k / 32k / 128k: seconds and peak CUDA memory. 128k is left out, and said so,
   when 16 x the 32k time would not fit the step's time left.
4. ``decode``: SinkCache (4 sinks + 1020 recent tokens) decode latency per token at 4k and 64k
   tokens into a stream, against recomputing the window (one forward over its 1024 + 1 tokens).
5. ``analyze``: ``sinklab analyze massive``, ``depth`` and ``intervene`` through the library entry points, as
   ``--device cuda --dtype bfloat16`` runs them, on a model of LLaMA-3.2-1B's shape (1.24 B parameters, random
   weights: no hub here; :data:`LLAMA32_1B_SHAPE`) saved as a Hugging Face folder: seconds, peak CUDA memory
   and the headline numbers of each.
6. ``stream``: ``sinklab stream`` on the same model and device / dtype: full + 4 sinks (parallel mode), two
   policies at one budget (sinks, tova), a 4-bit quantised sink cache, and the pass key task: seconds and
   peak CUDA memory of each.

SmolLM2-135M is the cached model when ``$SINKLAB_HOME`` holds it, else a model of its shape with
random weights (``tests/gpu_models.py``; time and memory do not depend on the weights): the JSON
says which.

Writes into ``--out`` (default ``$OUT``, else ``benchmarks/results/gpu/``, the smoke run
``benchmarks/results/gpu-smoke/``): ``gpu.json`` (every
number, the command, the code version, the device, each step's status and wall time),
``summary.txt`` (a few lines), ``logs/<step>.log`` and ``cuda_tests.xml``. ``--time-scale X``
multiplies the step limits (a slower GPU); ``--only STEP ...`` runs some steps.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "tests"), str(ROOT / "src")]

STEPS = ("cuda_tests", "train", "measure", "decode", "analyze", "stream")
#: seconds per step on the GPU (sum 820 s; ``--only`` picks steps when a draw has less time)
LIMITS_S = {"cuda_tests": 150, "train": 200, "measure": 110, "decode": 60, "analyze": 120, "stream": 180}
#: seconds per step in the smoke run (a CPU, tiny sizes: no time promise)
SMOKE_LIMITS_S = {"cuda_tests": 300, "train": 900, "measure": 300, "decode": 300, "analyze": 300, "stream": 300}
#: LLaMA-3.2-1B's shape (its config.json: 16 layers, d 2048, 32 query / 8 key-value heads of 64, FFN 8192,
#: vocabulary 128256, tied embeddings, RoPE 5e5): 1.24 B parameters
LLAMA32_1B_SHAPE = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
                        rope_parameters={"rope_theta": 500000.0, "rope_type": "default"}, tie_word_embeddings=True,
                        max_position_embeddings=131072, bos_token_id=1, eos_token_id=2)
#: dense bf16 peak (TFLOP/s, no sparsity) by a substring of torch.cuda.get_device_name(), the first match in this
#: order (so "H100 NVL" and "H100 PCIe" before "H100"); no V100 (no bf16 tensor cores: its 125 is fp16's), so MFU
#: there needs --peak-tflops
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0,
                    "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10G": 125.0, "A10": 125.0, "RTX 4090": 165.0}


def smoke() -> bool:
    """``SINKLAB_GPU_SMOKE=1``: the CPU smoke run."""
    return os.environ.get("SINKLAB_GPU_SMOKE") == "1"


def device():
    import torch

    return torch.device("cpu" if smoke() else "cuda")


def sync() -> None:
    import torch

    if device().type == "cuda":
        torch.cuda.synchronize()


def reset_peak() -> None:
    import torch

    if device().type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float | None:
    """Peak CUDA memory allocated since :func:`reset_peak` (None on the CPU)."""
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 3) if device().type == "cuda" else None


# ----------------------------------------------------------------------------- steps


def step_cuda_tests(out: Path, limit_s: float) -> dict:
    """pytest -m cuda tests/test_gpu.py; the counts from its JUnit XML."""
    import xml.etree.ElementTree as ET

    xml = out / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", "-rA",
           str(ROOT / "tests" / "test_gpu.py"), f"--junitxml={xml}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(10, limit_s - 10))
    print(p.stdout[-6000:], p.stderr[-3000:], sep="\n")
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    cases = []
    for c in suite.iter("testcase"):
        state = "failed" if c.find("failure") is not None or c.find("error") is not None else \
            "skipped" if c.find("skipped") is not None else "passed"
        cases.append({"test": c.get("name"), "state": state, "seconds": float(c.get("time", 0))})
    res = {"command": " ".join(cmd[2:]), "counts": n, "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
           "cases": cases, "pytest_exit": p.returncode}
    if p.returncode != 0:
        raise RuntimeError(f"pytest exit {p.returncode}: {n['failures']} failed, {n['errors']} errors")
    if res["passed"] == 0:
        res["status"] = "skipped"
        res["reason"] = f"all {n['tests']} CUDA tests skipped (no CUDA device)" if smoke() else "no CUDA test ran"
        if not smoke():
            raise RuntimeError(res["reason"])
    return res


def train_shapes() -> dict:
    if smoke():
        return {"shape": dict(vocab_size=512, d_model=64, n_layers=2, n_heads=2, d_ff=128), "T": 64, "B": 2,
                "warmup": 1, "steps": 2, "box_s": 60.0}
    from train_throughput import PAPER60M

    return {"shape": PAPER60M, "T": 2048, "B": 16, "warmup": 2, "steps": 8, "box_s": 15.0}


#: (variant name, attention operation, family, compiled); "hf-llama" is transformers' LLaMA. The
#: family is also the ``model.attention_backend``: "sdpa" and "tile" are "reference" (today's paths),
#: "flex" FlexAttention, "compiled tile" the torch.compile'd tile path (sinklab.nn.backend)
TRAIN_VARIANTS = [("hf-llama", "softmax", "transformers sdpa", False), ("softmax", "softmax", "sdpa", False),
                  ("softmax+compile", "softmax", "sdpa", True), ("softmax+flex", "softmax", "flex", False),
                  ("sink_logit", "sink_logit", "sdpa", False), ("sink_logit+flex+compile", "sink_logit", "flex", True),
                  ("gated_headwise", "gated_headwise", "sdpa", False), ("sigmoid", "sigmoid", "tile", False),
                  ("sigmoid+compiled", "sigmoid", "compiled tile", False),
                  ("relu", "relu", "tile", False), ("softpick", "softpick", "tile", False)]
FAMILY_BACKEND = {"transformers sdpa": "reference", "sdpa": "reference", "tile": "reference", "flex": "flex",
                  "compiled tile": "compiled"}


def step_train(out: Path, limit_s: float) -> dict:
    """Training tokens/s, peak memory and MFU per attention operation family (see the module docstring)."""
    import torch
    from train_throughput import Trainee, batches, sink_config, train_flops_per_token

    from sinklab.nn import SinkLM
    from sinklab.nn.export import llama_config, llama_state_dict

    s, dev = train_shapes(), device()
    T, B = s["T"], s["B"]
    name = torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu"
    peak = next((tf * 1e12 for k, tf in BF16_PEAK_TFLOPS.items() if k in name), None) if dev.type == "cuda" else None
    if ARGS.peak_tflops:
        peak = ARGS.peak_tflops * 1e12
    data = [(x.to(dev), y.to(dev)) for x, y in batches(4, B, T, s["shape"]["vocab_size"])]
    rows, failed = [], []
    t_start = time.perf_counter()
    for vname, op, family, compiled in TRAIN_VARIANTS:
        row = {"variant": vname, "attention": op, "family": family, "compiled": compiled}
        try:
            reset_peak()
            cfg = sink_config(T, attention=op, attention_backend=FAMILY_BACKEND[family], **s["shape"])
            torch.manual_seed(0)
            model = SinkLM(cfg)
            fpt = train_flops_per_token(model, T)
            if vname == "hf-llama":
                from transformers import LlamaForCausalLM

                hcfg = llama_config(cfg)
                hcfg._attn_implementation = "sdpa"
                hf = LlamaForCausalLM(hcfg)
                hf.load_state_dict(llama_state_dict(model), strict=True)
                model = hf
            model = model.to(dev)
            run = torch.compile(model) if compiled else model
            t = Trainee(vname, run, hf=vname == "hf-llama", device=dev)
            t0 = time.perf_counter()
            for i in range(s["warmup"]):
                t.step(*data[i % len(data)])
            row["warmup_s"] = round(time.perf_counter() - t0, 2)  # compile time included
            t1 = time.perf_counter()
            for i in range(s["steps"]):
                dt, _ = t.step(*data[(s["warmup"] + i) % len(data)])
                t.seconds += dt
                t.steps += 1
                if time.perf_counter() - t1 > s["box_s"]:
                    break
            tps = t.steps * B * T / t.seconds
            row.update(timed_steps=t.steps, step_s=round(t.seconds / t.steps, 4), tokens_per_s=round(tps, 1),
                       flops_per_token=fpt, mfu=round(fpt * tps / peak, 4) if peak else None,
                       peak_gib=peak_gib(), final_loss=round(t.losses[-1], 4),
                       finite=all(math.isfinite(v) for v in t.losses))
            if not row["finite"]:
                raise RuntimeError(f"non-finite loss: {t.losses}")
        except Exception as e:  # one variant failing must not hide the others' numbers
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            failed.append(vname)
        rows.append(row)
        print(json.dumps(row), flush=True)
        save_so_far(rows=rows, failed_variants=failed)
        model = run = t = None  # noqa: F841 (free the model before the next variant)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    base = next((r["tokens_per_s"] for r in rows if r["variant"] == "hf-llama" and "tokens_per_s" in r), None)
    for r in rows:
        if base and "tokens_per_s" in r:
            r["vs_hf_llama"] = round(r["tokens_per_s"] / base, 3)
    res = {"device_name": name, "shape": s["shape"], "T": T, "micro_batch": B, "peak_bf16_flops": peak,
           "precision": "bf16 autocast", "rows": rows, "wall_s": round(time.perf_counter() - t_start, 1)}
    if failed:
        res["failed_variants"] = failed
        save_so_far(**res)
        raise RuntimeError(f"variants failed: {', '.join(failed)}")
    return res


def _measure_lengths() -> list[int]:
    return [128, 256, 512] if smoke() else [8192, 32768, 131072]


def step_measure(out: Path, limit_s: float) -> dict:
    """Blockwise collector time and peak memory on SmolLM2 at each T (see the module docstring)."""
    import torch
    from gpu_models import smollm2

    from sinklab.capture import collect

    lengths = _measure_lengths()
    dev = device()
    dtype = torch.float32 if smoke() else torch.bfloat16
    model, what = smollm2(device=dev, dtype=dtype, max_positions=max(lengths), layers=2 if smoke() else None)
    model_gib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**30
    rows, t_begin = [], time.perf_counter()
    for T in lengths:
        prev = [r for r in rows if "seconds" in r]
        left = limit_s - (time.perf_counter() - t_begin) - 15
        if prev and (T / prev[-1]["T"]) ** 2 * prev[-1]["seconds"] > left:
            rows.append({"T": T, "skipped": f"estimated {(T / prev[-1]['T']) ** 2 * prev[-1]['seconds']:.0f} s "
                                            f"(quadratic from T = {prev[-1]['T']}) > {left:.0f} s left in the step"})
            print(json.dumps(rows[-1]), flush=True)
            save_so_far(rows=rows)
            continue
        ids = torch.randint(0, 49152, (1, T), generator=torch.Generator().manual_seed(T))
        reset_peak()
        sync()
        t0 = time.perf_counter()
        st = collect(model, ids, collector="blockwise", batch_size=1)
        sync()
        dt = time.perf_counter() - t0
        total = (st.mass[0].double().cpu() * (T - torch.arange(T, dtype=torch.float64))).sum(-1)  # (L, H): = T
        rows.append({"T": T, "seconds": round(dt, 3), "peak_gib": peak_gib(),
                     "row_sum_max_rel_err": round(float((total / T - 1).abs().max()), 5),
                     "sink_rate_1": round(float((st.mass[0, :, :, 0] > 0.3).double().mean() * 100), 2)})
        print(json.dumps(rows[-1]), flush=True)
        save_so_far(rows=rows)
    bad = [r["T"] for r in rows if r.get("row_sum_max_rel_err", 0) > 2e-2]
    if bad:
        raise RuntimeError(f"attention rows do not sum to 1 at T = {bad}")
    return {"model": what, "dtype": str(dtype).removeprefix("torch."), "model_gib": round(model_gib, 3),
            "collector": "blockwise", "rows": rows}


def step_decode(out: Path, limit_s: float) -> dict:
    """SinkCache decode latency per token against recomputation (see the module docstring)."""
    import torch
    from gpu_models import smollm2

    from sinklab.streaming.harness import CacheSpec, _cache_nbytes, decode_latency

    n_sink, window = (4, 60) if smoke() else (4, 1020)
    points = [256, 1024] if smoke() else [4096, 65536]
    steps = 4 if smoke() else 32
    dev = device()
    dtype = torch.float32 if smoke() else torch.bfloat16
    model, what = smollm2(device=dev, dtype=dtype, max_positions=max(points) + steps + 1,
                          layers=2 if smoke() else None)
    ids = torch.randint(0, 49152, (max(points) + steps + 1,), generator=torch.Generator().manual_seed(0))
    spec = CacheSpec(f"sinks_{n_sink}", "sink", n_sink, window)
    rows = []
    for at in points:
        ms, nbytes = decode_latency(model, ids, spec, at=at, steps=steps)
        rows.append({"cache": spec.name, "window": window, "at_tokens": at, "ms_per_token": round(ms, 3),
                     "cache_mib": round(nbytes / 2**20, 2)})
        print(json.dumps(rows[-1]), flush=True)
        save_so_far(rows=rows)
    x = ids[-(n_sink + window + 1):].view(1, -1).to(dev)  # recompute: one forward over the window + 1 tokens
    with torch.no_grad():
        model(x, use_cache=False, logits_to_keep=1)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            model(x, use_cache=False, logits_to_keep=1)
        sync()
    rec = 1000 * (time.perf_counter() - t0) / steps
    rows.append({"cache": "recompute", "window": n_sink + window, "at_tokens": None, "ms_per_token": round(rec, 3)})
    print(json.dumps(rows[-1]), flush=True)
    return {"model": what, "dtype": str(dtype).removeprefix("torch."), "n_sink": n_sink, "steps": steps, "rows": rows,
            "speedup_over_recompute": {str(r["at_tokens"]): round(rec / r["ms_per_token"], 2) for r in rows[:-1]}}


def subject_model(out: Path) -> tuple[Path, Path, str, int]:
    """A Hugging Face folder of a LLaMA of LLaMA-3.2-1B's shape with seeded random weights (smoke: 2 layers of
    width 64) saved in bfloat16, with the tests' word-level tokenizer, and a folder of text documents drawn from
    its words: (model folder, corpus folder, what, parameters). Time and memory do not depend on the weights."""
    import torch
    from conftest import WORDS, make_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    folder, corpus = out / "work" / "llama-1b-shape", out / "work" / "corpus"
    tok = make_tokenizer()
    shape = dict(LLAMA32_1B_SHAPE)
    if smoke():
        shape.update(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**shape)).to(torch.bfloat16)
    n = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    del model
    corpus.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(1)
    for i in range(8):
        idx = torch.randint(0, len(WORDS), (3000,), generator=g).tolist()
        (corpus / f"doc{i}.txt").write_text(" ".join(WORDS[j] for j in idx))
    what = "random weights, LLaMA-3.2-1B shape" if not smoke() else "random weights, tiny LLaMA (smoke)"
    return folder, corpus, what, n


def _timed(fn):
    """(result, seconds, peak CUDA GiB or None) of ``fn()``."""
    reset_peak()
    sync()
    t0 = time.perf_counter()
    res = fn()
    sync()
    return res, round(time.perf_counter() - t0, 2), peak_gib()


def step_analyze(out: Path, limit_s: float) -> dict:
    """``sinklab analyze massive | depth | intervene`` in bfloat16 on the device (see the module docstring)."""
    from sinklab.analyze import ANALYSES

    folder, corpus, what, n = subject_model(out)
    dev = "cpu" if smoke() else "cuda"
    N, T = (2, 32) if smoke() else (8, 512)
    runs = {"massive": dict(num_samples=N, seq_len=T),
            "depth": dict(num_samples=N, seq_len=T),
            "intervene": dict(num_samples=N, seq_len=T // 2, only=["remove-sink", "massive-zero", "drop-first"],
                              allow_non_sink=True)}
    rows = []
    for kind, kw in runs.items():
        res, sec, peak = _timed(lambda: ANALYSES.get(kind)(str(folder), corpus=str(corpus), device=dev,
                                                            dtype="bfloat16", **kw))
        head = {k: v for k, v in res.summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        rows.append({"analysis": kind, "num_samples": N, "seq_len": kw["seq_len"], "seconds": sec, "peak_gib": peak,
                     "dtype": res.model.get("dtype"), "device": res.model.get("device"), "summary": head})
        print(json.dumps(rows[-1]), flush=True)
        save_so_far(rows=rows)
    return {"model": what, "parameters": n, "dtype": "bfloat16", "rows": rows,
            "note": "seconds include loading the model from its folder (each analysis loads it, as the CLI does)"}


def step_stream(out: Path, limit_s: float) -> dict:
    """``sinklab stream perplexity`` / ``passkey`` in bfloat16 on the device: sinks, two policies, a 4-bit cache, the pass key task."""
    from sinklab.streaming import stream

    folder, corpus, what, n = subject_model(out)
    dev = "cpu" if smoke() else "cuda"
    tokens, window = (100, 16) if smoke() else (1024, 252)
    common = dict(device=dev, dtype="bfloat16", progress=False)
    runs = {
        "sinks": dict(tokens=4 * tokens if not smoke() else tokens, window=window, sinks=[4], recompute=False),
        "policies": dict(tokens=tokens, window=window, policies=["sinks", "tova"], budgets=[window + 4], n_sink=4,
                         full=False, recompute=False),
        "quantised": dict(tokens=tokens, window=window, policies=["sinks"], budgets=[window + 4], n_sink=4,
                          kv_bits=[4], full=False, recompute=False),
        "passkey": dict(task="passkey", tokens=tokens, window=window, sinks=[4], keys=2,
                        depths=(0.0, 0.5, 1.0), batch=6, chunk=1 if smoke() else 16),
    }
    rows = []
    for name, kw in runs.items():
        res, sec, peak = _timed(lambda: stream(str(folder), str(corpus), **common, **kw))
        res.save(out / "work" / f"stream-{name}")
        configs = [{k: c.get(k) for k in ("name", "ppl", "accuracy", "latency_ms_per_token", "cache_bytes")
                    if c.get(k) is not None} for c in res["configs"]]
        rows.append({"run": name, "tokens": kw["tokens"], "seconds": sec, "peak_gib": peak,
                     "dtype": res["model_info"].get("dtype"), "configs": configs})
        print(json.dumps(rows[-1]), flush=True)
        save_so_far(rows=rows)
    return {"model": what, "parameters": n, "dtype": "bfloat16", "rows": rows,
            "note": "seconds include loading the model from its folder"}


STEP_FUNCS = {"cuda_tests": step_cuda_tests, "train": step_train, "measure": step_measure, "decode": step_decode,
              "analyze": step_analyze, "stream": step_stream}
#: the running step's result so far (its finished rows): kept when the step fails or is killed
RESULT_SO_FAR: dict = {}
#: ``out/steps/<step>.partial.json``, where :func:`save_so_far` writes RESULT_SO_FAR (set by run_step)
PARTIAL: dict = {}
ARGS: argparse.Namespace


def partial_path(out: Path, name: str) -> Path:
    return out / "steps" / f"{name}.partial.json"


def save_so_far(**fields) -> None:
    """Record the running step's result so far (e.g. ``rows=rows`` after each finished row) in
    RESULT_SO_FAR and on disk, so that a step killed at its time limit keeps the rows it finished.
    ``SINKLAB_GPU_STALL_AFTER=STEP:N`` (tests only) makes step STEP hang once it has saved N rows."""
    RESULT_SO_FAR.update(fields)
    if "path" in PARTIAL:
        PARTIAL["path"].write_text(json.dumps(RESULT_SO_FAR, indent=1))
    stall = os.environ.get("SINKLAB_GPU_STALL_AFTER", "")
    if stall and stall.split(":")[0] == PARTIAL.get("step") and len(RESULT_SO_FAR.get("rows", [])) >= int(stall.split(":")[1]):
        print(f"SINKLAB_GPU_STALL_AFTER={stall}: hanging until the time limit", flush=True)
        time.sleep(1e6)


def run_step(name: str, out: Path, limit_s: float) -> int:
    """Child process: run one step, write ``out/steps/<name>.json`` (its result, or its error)."""
    (out / "steps").mkdir(parents=True, exist_ok=True)
    path = out / "steps" / f"{name}.json"
    PARTIAL.update(step=name, path=partial_path(out, name))
    t0 = time.perf_counter()
    try:
        res = STEP_FUNCS[name](out, limit_s)
        res.setdefault("status", "ok")
        rc = 0
    except Exception as e:
        import traceback

        traceback.print_exc()
        res = {**RESULT_SO_FAR, "status": "failed", "error": f"{type(e).__name__}: {e}"}
        rc = 1
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    path.write_text(json.dumps(res, indent=1))
    partial_path(out, name).unlink(missing_ok=True)
    return rc


# ----------------------------------------------------------------------------- the driver


def environment() -> dict:
    import torch

    from sinklab.provenance import code_version

    cuda = torch.cuda.is_available()
    return {"smoke": smoke(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "device": torch.cuda.get_device_name() if cuda else None, "gpus": torch.cuda.device_count() if cuda else 0,
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "code": code_version(),
            "python": sys.version.split()[0]}


def summary_lines(res: dict) -> list[str]:
    """The short text summary: one line per step and per headline number."""
    env = res["environment"]
    lines = [f"sinklab device script ({'CPU SMOKE RUN, tiny sizes: not GPU figures' if env['smoke'] else env['device']}), "
             f"torch {env['torch']}, code {str(env['code'].get('commit', '?'))[:12] if isinstance(env['code'], dict) else env['code']}, "
             f"{res['wall_s']:.0f} s"]
    for name in res["steps_run"]:
        st = res["steps"][name]
        head = f"[{name}] {st['status'].upper()} ({st.get('wall_s', '?')} s)"
        if st["status"] == "failed":
            lines.append(f"{head}: {st.get('error', '')}")
        elif name == "cuda_tests":
            c = st.get("counts", {})
            lines.append(f"{head}: {st.get('passed', 0)} passed, {c.get('skipped', 0)} skipped, "
                         f"{c.get('failures', 0) + c.get('errors', 0)} failed" + (f"; {st['reason']}" if "reason" in st else ""))
        else:
            lines.append(head)
        if name == "train":
            for r in st.get("rows", []):
                if "tokens_per_s" in r:
                    mfu = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") else ""
                    vs = f", {r['vs_hf_llama']:.2f}x hf-llama" if "vs_hf_llama" in r else ""
                    mem = f", peak {r['peak_gib']:.1f} GiB" if r.get("peak_gib") is not None else ""
                    lines.append(f"  {r['variant']:<24} {r['family']:<18} {r['tokens_per_s']:>12,.0f} tok/s{mfu}{vs}{mem}")
                else:
                    lines.append(f"  {r['variant']:<24} FAILED {r.get('error', '')}")
        if name == "measure":
            for r in st.get("rows", []):
                mem = "n/a (CPU)" if r.get("peak_gib") is None else f"{r['peak_gib']:.2f} GiB"
                lines.append(f"  T = {r['T']:>6}: " + (f"{r['seconds']:.2f} s, peak {mem}"
                                                       if "seconds" in r else f"skipped: {r['skipped']}"))
        if name == "decode":
            for r in st.get("rows", []):
                at = f"at {r['at_tokens']:>6} tokens" if r["at_tokens"] else "any position   "
                lines.append(f"  {r['cache']:<10} {at}: {r['ms_per_token']:.2f} ms/token")
            for at, x in st.get("speedup_over_recompute", {}).items():
                lines.append(f"  sink cache at {at} tokens: {x:.1f}x faster than recomputing the window")
        if name in ("analyze", "stream"):
            for r in st.get("rows", []):
                mem = "n/a (CPU)" if r.get("peak_gib") is None else f"{r['peak_gib']:.2f} GiB"
                lines.append(f"  {r.get('analysis') or r.get('run'):<10} {r.get('dtype')}: {r['seconds']:.2f} s, "
                             f"peak {mem}")
    failed = [n for n in res["steps_run"] if res["steps"][n]["status"] == "failed"]
    lines.append("FAILED: " + ", ".join(failed) if failed else "every step ran (skips are listed above)")
    return lines


def main(argv: list[str] | None = None) -> int:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results" / ("gpu-smoke" if smoke() else "gpu")))
    ap.add_argument("--time-scale", type=float, default=1.0, help="multiply every step's time limit (a slower GPU)")
    ap.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: table)")
    ap.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)  # internal: run one step (child process)
    ap.add_argument("--limit-s", type=float, default=None, help=argparse.SUPPRESS)
    ARGS = args = ap.parse_args(argv)
    out = Path(args.out)
    if args.step:
        return run_step(args.step, out, args.limit_s)
    import torch

    if not smoke() and not torch.cuda.is_available():
        print("error: no CUDA device here; SINKLAB_GPU_SMOKE=1 runs the same steps on the CPU at tiny sizes",
              file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    limits = {k: round(v * args.time_scale, 1) for k, v in (SMOKE_LIMITS_S if smoke() else LIMITS_S).items()}
    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    t_start = time.perf_counter()
    res = {"command": "bash benchmarks/gpu.sh" + (" " + " ".join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ""),
           "environment": environment(), "limits_s": limits, "steps_run": args.only, "steps": {}}
    for name in args.only:
        print(f"== {name} (limit {limits[name]} s)", flush=True)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--out", str(out),
               "--limit-s", str(limits[name])] + (["--peak-tflops", str(args.peak_tflops)] if args.peak_tflops else [])
        t0 = time.perf_counter()
        for stale in (out / "steps" / f"{name}.json", partial_path(out, name)):  # an earlier run's
            stale.unlink(missing_ok=True)
        with open(out / "logs" / f"{name}.log", "w") as log:
            try:
                p = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env_vars, timeout=limits[name])
                rc = p.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        path = out / "steps" / f"{name}.json"
        st = json.loads(path.read_text()) if path.exists() and rc != "timeout" else {}
        if rc == "timeout":  # killed: keep what it finished (its rows so far)
            part = partial_path(out, name)
            st = {**(json.loads(part.read_text()) if part.exists() else {}), "status": "failed",
                  "error": f"ran past its {limits[name]} s limit"}
        elif not st:
            st = {"status": "failed", "error": f"the step process died (exit {rc}) before writing its result"}
        st["wall_s"] = round(time.perf_counter() - t0, 1)
        if st["status"] == "failed":
            tail = (out / "logs" / f"{name}.log").read_text(errors="replace").strip().splitlines()[-15:]
            st["log_tail"] = tail
            print(f"[{name}] FAILED: {st.get('error')}\n  " + "\n  ".join(tail), file=sys.stderr, flush=True)
        else:
            print(f"[{name}] {st['status']} in {st['wall_s']} s", flush=True)
        res["steps"][name] = st
    res["wall_s"] = round(time.perf_counter() - t_start, 1)
    (out / "gpu.json").write_text(json.dumps(res, indent=1))
    lines = summary_lines(res)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {out / 'gpu.json'} and {out / 'summary.txt'}")
    return 1 if any(s["status"] == "failed" for s in res["steps"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
