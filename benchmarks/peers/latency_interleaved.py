"""Decode latency per token of the peers in ONE run, interleaved step block by step block (issue 23,
item 6): every peer runs in its own process (its own venv), all loaded at once, each after the same
1024-token prefill and 16 warm-up steps (common.serve); then, round after round, each peer in turn
times ``--block`` single-token steps while the others wait (the order rotates every round). So every
peer sees the same machine load, and the ratios to sinklab are what to read on a shared machine.

    python benchmarks/peers/latency_interleaved.py [--rounds 12] [--block 8] [--peers sinklab attention_sinks ...]

Writes benchmarks/results/peers/latency_interleaved.json: per peer the ms of every step, the mean
and median, and ``ratio_to_sinklab`` (peer's median / sinklab's median; above 1: sinklab is faster)
with the per-round ratios of the block means; prints one line per peer. Stdlib only (any python).
Env: PEER_VENVS (default /work/peer-venvs), SINKLAB_PY (default: this interpreter), SINKLAB_BEFORE_SRC
(peer ``sinklab_before``: sinklab's src/ at another commit, to time a change in the same run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "peers"


def commands(model_dir: str) -> dict[str, list[str]]:
    venvs = Path(os.environ.get("PEER_VENVS", "/work/peer-venvs"))
    spy = os.environ.get("SINKLAB_PY", sys.executable)
    kv = str(venvs / "kvpress" / "bin" / "python")
    base = ["--model-dir", model_dir, "--serve"]
    return {
        "sinklab": [spy, str(HERE / "sinklab_peer.py"), *base],
        "attention_sinks": [str(venvs / "attention_sinks" / "bin" / "python"), str(HERE / "attention_sinks_peer.py"),
                            *base],
        # sinklab at another commit (its src/ exported, e.g. `git archive COMMIT src | tar -x -C DIR`): before/after
        "sinklab_before": [spy, str(HERE / "sinklab_peer.py"), *base],
        "kvpress_decoding": [kv, str(HERE / "kvpress_peer.py"), "--variant", "decoding", *base],
        "kvpress_decoding-rerotate": [kv, str(HERE / "kvpress_peer.py"), "--variant", "decoding-rerotate", *base],
    }


def read_json_line(proc: subprocess.Popen):
    """The next stdout line that parses as JSON (other output skipped)."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {proc.args[1]} ended: see its stderr")
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=8, help="steps per peer per round")
    ap.add_argument("--peers", nargs="+", default=["sinklab", "attention_sinks"])
    ap.add_argument("--out", default=str(RESULTS / "latency_interleaved.json"))
    a = ap.parse_args()
    ids = json.loads((RESULTS / "ids.json").read_text())
    if a.rounds * a.block + 1040 >= len(ids["ids"]):
        raise SystemExit(f"rounds x block = {a.rounds * a.block} steps past the {len(ids['ids'])}-token stream")
    cmds = commands(ids["model_dir"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
           "PYTHONPATH": f"{ROOT / 'src'}:{HERE}"}
    before = os.environ.get("SINKLAB_BEFORE_SRC")
    if "sinklab_before" in a.peers and not before:
        raise SystemExit("sinklab_before needs SINKLAB_BEFORE_SRC=DIR (a src/ folder of sinklab at another commit)")
    procs, info = {}, {}
    for name in a.peers:
        penv = {**env, "PYTHONPATH": f"{before}:{HERE}"} if name == "sinklab_before" else env
        procs[name] = subprocess.Popen(cmds[name], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=penv,
                                       stderr=open(RESULTS / f"log_latency_{name}.txt", "w"))
    for name, p in procs.items():  # all loaded and warm before the first timed step
        info[name] = read_json_line(p)
    times = {n: [] for n in a.peers}
    block_means = {n: [] for n in a.peers}
    load = []
    t0 = time.time()
    for r in range(a.rounds):
        order = a.peers[r % len(a.peers):] + a.peers[: r % len(a.peers)]
        load.append(os.getloadavg()[0])
        for name in order:
            procs[name].stdin.write(f"{a.block}\n")
            procs[name].stdin.flush()
            ms = read_json_line(procs[name])
            times[name] += ms
            block_means[name].append(sum(ms) / len(ms))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {block_means[n][-1]:.1f} ms" for n in a.peers), flush=True)
    for p in procs.values():
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(timeout=60)
    ref = statistics.median(times["sinklab"]) if "sinklab" in times else None
    out = {"protocol": {"prefill": 1024, "warmup": 16, "rounds": a.rounds, "block": a.block, "n_sink": 4, "window": 256,
                        "threads": 1, "what": "wall ms of one single-token decode step; peers interleaved block by "
                                              "block in one run, all processes loaded at once"},
           "load_average_1min_by_round": load, "wall_s": time.time() - t0, "peers": {}}
    for name in a.peers:
        ts = times[name]
        entry = {"ms_per_token_median": statistics.median(ts), "ms_per_token_mean": statistics.fmean(ts),
                 "steps": len(ts), "ms": ts, "env": info[name], "command": cmds[name]}
        if name == "sinklab_before":
            entry["src"] = before
        if ref is not None:
            entry["ratio_to_sinklab"] = entry["ms_per_token_median"] / ref
            entry["round_ratios_to_sinklab"] = [b / s for b, s in zip(block_means[name], block_means["sinklab"])]
            entry["round_ratio_median"] = statistics.median(entry["round_ratios_to_sinklab"])
        out["peers"][name] = entry
        print(f"{name}: median {entry['ms_per_token_median']:.2f} ms/token, mean {entry['ms_per_token_mean']:.2f}"
              + (f", {name}/sinklab = {entry['ratio_to_sinklab']:.3f} (median of per-round ratios "
                 f"{entry['round_ratio_median']:.3f})" if ref is not None else ""))
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
