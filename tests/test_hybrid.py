"""Hybrid models (attention + SSM blocks, seed 000: Jamba's sink rate): sinklab measures the attention
blocks, names the others, and its attention mass equals the one computed from eager attention weights."""

import json

import pytest
import torch

from sinklab.capture import collect

from helpers import run_cli_captured


def tiny_jamba(vocab_size: int = 80):
    """4 blocks: Mamba, attention, Mamba, attention (attention at blocks 1 and 3)."""
    from transformers import JambaConfig, JambaForCausalLM

    torch.manual_seed(0)
    cfg = JambaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1,
                      expert_layer_period=2, expert_layer_offset=1, num_experts=2, mamba_d_state=4, mamba_d_conv=2,
                      mamba_expand=2, mamba_dt_rank=4, pad_token_id=0)
    return JambaForCausalLM(cfg).eval()


def naive_mass(a: torch.Tensor) -> torch.Tensor:
    """Gu et al. Eq. 2 from a (B, H, T, T) causal attention matrix: alpha_j = mean over i >= j of A[i, j]."""
    a = a.double()
    T = a.shape[-1]
    return torch.stack([a[..., j:, j].mean(dim=-1) for j in range(T)], dim=-1)  # (B, H, T)


def test_jamba_attention_blocks_match_eager_weights():
    m = tiny_jamba()
    ids = torch.randint(4, 80, (3, 12), generator=torch.Generator().manual_seed(2))
    stats = collect(m, ids, batch_size=3)
    assert stats.layer_ids == [1, 3]
    assert stats.other_layers == {0: "JambaMambaDecoderLayer", 2: "JambaMambaDecoderLayer"}
    assert stats.mass.shape == (3, 2, 4, 12) and stats.hidden_norms.shape == (3, 2, 12)
    m.set_attn_implementation("eager")
    with torch.no_grad():
        out = m(input_ids=ids, output_attentions=True, use_cache=False, output_hidden_states=True)
    assert len(out.attentions) == 2  # transformers returns the attention blocks' weights only
    for l, a in enumerate(out.attentions):
        torch.testing.assert_close(stats.mass[:, l], naive_mass(a), atol=1e-6, rtol=1e-5)
    # hidden states of the attention blocks' outputs (hidden_states[b + 1] is block b's output, before the final norm
    # only for the last block)
    h1 = out.hidden_states[2].float().norm(dim=-1)  # block 1's output
    torch.testing.assert_close(stats.hidden_norms[:, 0], h1, atol=1e-5, rtol=1e-5)


def test_measure_cli_names_the_ssm_blocks(tokenizer, text_corpus_dir, tmp_path, capsys):
    model_dir = tmp_path / "tiny-jamba"
    tiny_jamba(vocab_size=len(tokenizer)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "m"
    code, stdout, stderr = run_cli_captured(["measure", "--model", str(model_dir), "--corpus", str(text_corpus_dir),
                                             "-n", "4", "-t", "10", "--out", str(out)], capsys)
    assert code == 0, stderr
    assert "attention layers 1, 3 of blocks 0 to 3; blocks 0, 2 have no attention (JambaMambaDecoderLayer)" in stdout
    res = json.loads((out / "results.json").read_text())
    summary = res.get("summary", res)
    assert summary["layer_ids"] == [1, 3] and summary["other_layers"] == {"0": "JambaMambaDecoderLayer",
                                                                          "2": "JambaMambaDecoderLayer"}
    import pandas as pd

    assert sorted(pd.read_csv(out / "attention.csv")["layer"].unique().tolist()) == [1, 3]
    # the console names the block of the largest massive-activation ratio (it printed the list index: "layer 0",
    # a Mamba block; outside audit, 2026-12-07)
    mar = summary["massive_activation_ratio"]
    top = summary["layer_ids"][max(range(len(mar)), key=mar.__getitem__)]
    assert f"largest massive-activation ratio: {max(mar):.0f}x in layer {top} " in stdout


def test_intervene_refuses_a_block_without_attention_and_edits_the_attention_block():
    """``analyze.intervene(layers=[0])`` on Jamba (block 0 is Mamba) removed nothing and reported a loss change
    of 0 as if the sink did not matter (outside audit, 2026-12-07): a block without attention is refused,
    naming the attention blocks; an attention block is edited (its loss moves)."""
    from sinklab import analyze
    from sinklab.errors import InputError

    m = tiny_jamba()
    ids = torch.randint(3, 80, (3, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(InputError, match=r"layer 0 of JambaForCausalLM has no attention .*attention layers are \[1, 3\]"):
        analyze.intervene(analyze.Subject(m, ids), only=["remove-sink"], layers=[0, 1], allow_non_sink=True)
    r = analyze.intervene(analyze.Subject(m, ids), only=["remove-sink"], layers=[1], allow_non_sink=True)
    t = r.tables["interventions"].set_index("intervention")
    assert abs(t.loc["remove-sink", "loss"] - t.loc["baseline", "loss"]) > 1e-6
