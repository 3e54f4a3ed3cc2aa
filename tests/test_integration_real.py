"""Integration: the real SmolLM2-135M on real State of the Union text (fetched and cached by the run)."""

import pytest

from sinklab.measure import measure
from sinklab.measure.run import load_results

pytestmark = pytest.mark.network


def test_smollm2_sink_on_natural_text_far_above_repeated(real_home, tmp_path):
    # 8 samples of 64 tokens (24 before): Sink_1 72.2% on natural text here (70.3% over 24), 0.0% on the repeated
    # token either way; the thresholds below are unchanged and 30 points away
    nat = measure(num_samples=8, seq_len=64, out=tmp_path / "natural", progress=False)
    rep = measure(input="repeated", num_samples=8, seq_len=64, progress=False)
    assert nat.model["name"] == "smollm2-135m" and nat.corpus["name"] == "sotu"
    # the paper's observation for RoPE LLaMA-family models: strong token-1 sink on natural
    # text, (almost) none on a repeated token
    assert nat.sink_rate[0] > 40.0
    assert nat.sink_rate[0] > rep.sink_rate[0] + 30.0
    assert nat.summary["top_sink_position"] == 0
    assert nat.summary["norm_ratio"][0] > 5.0  # massive activation on the sink token
    res = load_results(tmp_path / "natural")
    assert res["sink_rate"] == nat.sink_rate
    assert res["input_ids"] == nat.probe.input_ids.tolist()
    assert res["model"]["sha256"] and res["corpus"]["sha256"]


def test_readme_python_loading_example_runs_as_written(real_home, capsys):
    """The Python API page's "Loading a model in Python" block (docs/api.md), executed as it stands."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    after = text.split("**Loading a model in Python**", 1)[1]
    block = re.search(r"```python\n(.*?)```", after, re.S).group(1)
    exec(compile(block, "docs/api.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "LlamaForCausalLM llama" and out[1] == "' Paris'"
    assert re.fullmatch(r"Sink_1 \d+\.\d%", out[2]) and 0 <= float(out[2].split()[1][:-1]) <= 100
