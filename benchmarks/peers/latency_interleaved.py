"""Decode latency per token of the peers in ONE run, interleaved step block by step block (issue 23,
item 6): every peer runs in its own process (its own venv), all loaded at once, each after the same
1024-token prefill and 16 warm-up steps (common.serve); then, round after round, each peer in turn
times ``--block`` single-token steps while the others wait (the order rotates every round). So every
peer sees the same machine load, and the ratios to sinklab are what to read on a shared machine.

    python benchmarks/peers/latency_interleaved.py [--rounds 12] [--block 8] [--peers sinklab attention_sinks ...]

Writes benchmarks/results/peers/latency_interleaved.json: per peer, for the wall time and for the worker's
CPU time (the steadier one on a loaded machine), the ms of every step, the mean and median, and
``ratio_to_sinklab`` (peer's median / sinklab's median; above 1: sinklab is faster) with the per-round
ratios of the block means; prints one line per peer. Stdlib only (any python).
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
    times = {k: {n: [] for n in a.peers} for k in ("wall", "cpu")}
    block_means = {k: {n: [] for n in a.peers} for k in ("wall", "cpu")}
    load = []
    t0 = time.time()
    for r in range(a.rounds):
        order = a.peers[r % len(a.peers):] + a.peers[: r % len(a.peers)]
        load.append(os.getloadavg()[0])
        for name in order:
            procs[name].stdin.write(f"{a.block}\n")
            procs[name].stdin.flush()
            ms = read_json_line(procs[name])
            for k in ("wall", "cpu"):
                times[k][name] += ms[k]
                block_means[k][name].append(sum(ms[k]) / len(ms[k]))
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{n} {block_means['wall'][n][-1]:.1f} ms wall "
                                                        f"{block_means['cpu'][n][-1]:.1f} ms cpu" for n in a.peers), flush=True)
    for p in procs.values():
        p.stdin.write("quit\n")
        p.stdin.flush()
        p.wait(timeout=60)
    out = {"protocol": {"prefill": 1024, "warmup": 16, "rounds": a.rounds, "block": a.block, "n_sink": 4, "window": 256,
                        "threads": 1, "what": "ms of one single-token decode step: wall (perf_counter) and the worker "
                                              "process's CPU time (process_time); peers interleaved block by block in "
                                              "one run, all processes loaded at once"},
           "load_average_1min_by_round": load, "wall_s": time.time() - t0, "peers": {}}
    for name in a.peers:
        entry = {"steps": len(times["wall"][name]), "env": info[name], "command": cmds[name]}
        if name == "sinklab_before":
            entry["src"] = before
        for k in ("wall", "cpu"):
            ts = times[k][name]
            entry[k] = {"ms_per_token_median": statistics.median(ts), "ms_per_token_mean": statistics.fmean(ts), "ms": ts}
            if "sinklab" in a.peers:
                entry[k]["ratio_to_sinklab"] = statistics.median(ts) / statistics.median(times[k]["sinklab"])
                rr = [b / s for b, s in zip(block_means[k][name], block_means[k]["sinklab"])]
                entry[k]["round_ratios_to_sinklab"] = rr
                entry[k]["round_ratio_median"] = statistics.median(rr)
        out["peers"][name] = entry
        print(name + ": " + "; ".join(
            f"{k} median {entry[k]['ms_per_token_median']:.2f} ms/token"
            + (f", {name}/sinklab = {entry[k]['ratio_to_sinklab']:.3f} (median of round ratios "
               f"{entry[k]['round_ratio_median']:.3f})" if "ratio_to_sinklab" in entry[k] else "") for k in ("cpu", "wall")))
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
