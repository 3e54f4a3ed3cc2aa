"""Measuring a model spread over devices by an accelerate device map, and several models in one go."""


import pytest
import torch

from sinklab.capture import collect
from sinklab.capture.collect import input_device
from sinklab.errors import InputError
from sinklab.models import load_model


def test_capture_with_layers_split_by_a_device_map_equals_one_device(tiny_model_dir):
    """CPU-only machine: the second device is accelerate's disk offload. Layer 1 (and the head) live
    off the CPU between forwards (weights on the meta device, streamed in by accelerate's hooks at
    each forward), so the capture runs through the same hooks as a multi-GPU split."""
    one = load_model(str(tiny_model_dir), attn_implementation="sdpa").model
    split = load_model(str(tiny_model_dir), attn_implementation="sdpa", device_map={
        "model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.layers.0": "cpu",
        "model.layers.1": "disk", "model.norm": "disk", "lm_head": "disk"}).model
    assert split.model.layers[1].self_attn.q_proj.weight.device.type == "meta"  # really not resident
    assert input_device(split) == torch.device("cpu")
    ids = torch.randint(4, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    for collector in ("eager", "blockwise"):
        a, b = collect(one, ids, collector=collector), collect(split, ids, collector=collector)
        torch.testing.assert_close(b.mass, a.mass, rtol=0, atol=1e-6)
        torch.testing.assert_close(b.hidden_norms, a.hidden_norms, rtol=1e-6, atol=1e-6)


def test_device_map_is_refused_for_native_models(tmp_path):
    from sinklab.nn import ModelConfig, SinkLM

    folder = tmp_path / "native"
    SinkLM(ModelConfig(vocab_size=40, d_model=8, n_layers=1, n_heads=1, d_ff=8, max_seq_len=16)).save_pretrained(folder)
    with pytest.raises(InputError, match="use device, not device_map"):
        load_model(str(folder), device_map="auto")
