"""benchmarks/gpu.sh, the device script: the CPU smoke run end to end, a failing step fails the
script loudly, and it refuses to start without CUDA outside the smoke run."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.sh"


def run(out: Path, *args: str, smoke: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    import sys

    env = {**os.environ, "PY": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1"}
    env.pop("SINKLAB_GPU_SMOKE", None)
    if smoke:
        env["SINKLAB_GPU_SMOKE"] = "1"
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """One CPU smoke run of the cuda_tests, decode, analyze and stream steps (each step is its own process, as in
    any run; one script start serves the two tests below): the script's result and its folder."""
    out = tmp_path_factory.mktemp("gpu-smoke")
    return run(out, "--only", "cuda_tests", "decode", "analyze", "stream"), out


def test_smoke_run_writes_json_and_summary_and_reports_cuda_steps_as_skipped(smoke):
    """The CUDA tests (skipped here) and the decode step at tiny sizes on the CPU: exit 0, gpu.json
    with each step's status, a summary that names the skip, the per-step logs."""
    p, tmp_path = smoke
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["environment"]["smoke"] is True and res["steps_run"] == ["cuda_tests", "decode", "analyze", "stream"]
    tests = res["steps"]["cuda_tests"]
    assert tests["status"] == "skipped" and tests["passed"] == 0 and tests["counts"]["skipped"] >= 25
    dec = res["steps"]["decode"]
    assert dec["status"] == "ok" and [r["at_tokens"] for r in dec["rows"]] == [256, 1024, None]
    assert all(r["ms_per_token"] > 0 for r in dec["rows"])
    text = (tmp_path / "summary.txt").read_text()
    assert "CPU SMOKE RUN" in text and "[cuda_tests] SKIPPED" in text and "no CUDA device" in text
    assert "every step ran" in text and (tmp_path / "logs" / "decode.log").exists()
    assert (tmp_path / "cuda_tests.xml").exists()


def test_a_step_past_its_limit_fails_the_script_loudly(tmp_path):
    p = run(tmp_path, "--only", "decode", "--time-scale", "0.0005")  # 0.15 s: it cannot finish
    assert p.returncode == 1
    assert "[decode] FAILED: ran past its" in p.stderr
    res = json.loads((tmp_path / "gpu.json").read_text())
    assert res["steps"]["decode"]["status"] == "failed"
    assert (tmp_path / "summary.txt").read_text().strip().splitlines()[-1] == "FAILED: decode"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_without_cuda_and_without_smoke_it_refuses_in_one_line(tmp_path):
    p = run(tmp_path, smoke=False, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1].startswith("error: no CUDA device here; SINKLAB_GPU_SMOKE=1 runs")
    assert not (tmp_path / "gpu.json").exists()


def test_a_step_killed_at_its_limit_keeps_its_finished_rows(tmp_path):
    """The decode step hangs after its first row (SINKLAB_GPU_STALL_AFTER, a test hook) and is killed
    at its limit: gpu.json keeps that row (256 tokens into the stream, a positive latency) with the
    timeout as the step's error; the partial file is not left as a result of a later run.

    The limit is the smoke limit (300 s) x 0.035 = 10.5 s (the first row: ~6 s on an idle 2-core CPU);
    where the first row did not arrive within it (a loaded machine), the step is run once more at
    x 0.1 = 30 s, and that run is the one checked."""
    import sys

    def attempt(scale: float, out: Path) -> tuple[subprocess.CompletedProcess, dict, float]:
        env = {**os.environ, "PY": sys.executable, "OUT": str(out), "OMP_NUM_THREADS": "1",
               "SINKLAB_GPU_SMOKE": "1", "SINKLAB_GPU_STALL_AFTER": "decode:1"}
        p = subprocess.run(["bash", str(SCRIPT), "--only", "decode", "--time-scale", str(scale)], env=env,
                           capture_output=True, text=True, timeout=300)
        dec = json.loads((out / "gpu.json").read_text())["steps"]["decode"]
        return p, dec, round(300 * scale, 1)

    p, dec, limit = attempt(0.035, tmp_path)
    if not dec.get("rows"):  # the first row did not arrive in time: once more with a longer limit
        tmp_path = tmp_path / "retry"
        p, dec, limit = attempt(0.1, tmp_path)
    assert p.returncode == 1
    assert f"[decode] FAILED: ran past its {limit} s limit" in p.stderr, p.stderr[-3000:]
    assert dec["status"] == "failed" and dec["error"] == f"ran past its {limit} s limit"
    assert [r["at_tokens"] for r in dec["rows"]] == [256] and dec["rows"][0]["ms_per_token"] > 0, dec
    assert "hanging until the time limit" in (tmp_path / "logs" / "decode.log").read_text()
    text = (tmp_path / "summary.txt").read_text()
    assert "at    256 tokens" in text and text.strip().splitlines()[-1] == "FAILED: decode"


def test_smoke_run_of_the_analyze_and_stream_steps(smoke):
    """The analyze (massive, depth, intervene) and stream (sinks, two policies, a 4-bit cache, pass key) steps at
    tiny sizes on the CPU, in bfloat16 as on the GPU: every run has its seconds, the dtype the Subject loaded, and
    the numbers it produced (finite perplexities, an accuracy in [0, 1])."""
    p, tmp_path = smoke
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((tmp_path / "gpu.json").read_text())
    an, st = res["steps"]["analyze"], res["steps"]["stream"]
    assert an["status"] == "ok" and [r["analysis"] for r in an["rows"]] == ["massive", "depth", "intervene"]
    assert all(r["seconds"] > 0 and r["dtype"] == "bfloat16" and r["peak_gib"] is None for r in an["rows"])
    assert 0 <= an["rows"][0]["summary"]["sink_rate"] <= 100
    assert st["status"] == "ok" and [r["run"] for r in st["rows"]] == ["sinks", "policies", "quantised", "passkey"]
    assert all(r["seconds"] > 0 and r["dtype"] == "bfloat16" for r in st["rows"])
    names = {r["run"]: [c["name"] for c in r["configs"]] for r in st["rows"]}
    assert names["policies"] == ["sinks@20", "tova@20"] and names["quantised"] == ["sinks@20:kv4-token-fp0"]
    import math

    assert all(math.isfinite(c["ppl"]) for r in st["rows"][:3] for c in r["configs"])
    assert all(0 <= c["accuracy"] <= 1 for c in st["rows"][3]["configs"])
    text = (tmp_path / "summary.txt").read_text()
    assert "[analyze] OK" in text and "[stream] OK" in text and "passkey" in text
