"""Models spread by ``accelerate`` with modules offloaded to disk (``device_map``): their offloaded weights sit on
the ``meta`` device between calls. The inputs go to the device the input embedding runs on
(:func:`sinklab.models.input_device`), and the gate readers of gated attention see the module's weights loaded;
the numbers equal the same model held in memory."""

from __future__ import annotations

import warnings

import pytest
import torch

from sinklab.analyze.common import run_model
from sinklab.models import input_device
from tiny_models import VOCAB, tiny_model



def _offloaded(model, folder, tmp_path):
    """``model`` saved to ``folder`` and loaded back with its input embedding and its first block offloaded to disk
    (every other module on the CPU)."""
    from transformers import AutoModelForCausalLM

    from sinklab.capture.hf import find_layers

    model.save_pretrained(folder)
    names = {m: n for n, m in model.named_modules()}
    blocks = [names[b] for b in find_layers(model)]
    device_map = {b: "cpu" for b in blocks}
    for name, mod in model.named_modules():  # the modules outside the blocks that hold weights or buffers themselves
        own = [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
        if own and not any(name == b or name.startswith(b + ".") for b in blocks):
            device_map[name] = "cpu"
    device_map[names[model.get_input_embeddings()]] = device_map[blocks[0]] = "disk"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, offload_folder=str(tmp_path / "off"),
                                                    dtype=torch.float32).eval()


@pytest.mark.parametrize("model_type", ["llama", "beam"])
def test_offloaded_model_gives_the_in_memory_numbers(model_type, tmp_path):
    """LLaMA, and Beam (whose gate reader reads the attention module's own gate_bias, a weight accelerate loads only
    for the module's call): the capture statistics and next-token losses of the offloaded model equal the in-memory
    model's (the inputs had gone to the embedding's weights on ``meta``: 'Cannot copy out of meta tensor')."""
    model = tiny_model(model_type)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gate_bias"):
                p.copy_(torch.linspace(-2.0, 2.0, p.numel()).view_as(p))
    off = _offloaded(model, tmp_path / "m", tmp_path)
    emb = off.get_input_embeddings()
    assert emb.weight.device.type == "meta"  # offloaded: the case this test is about
    assert input_device(off) == torch.device("cpu") and input_device(model) == torch.device("cpu")
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    ref, got = run_model(model, ids, nll=True), run_model(off, ids, nll=True)
    torch.testing.assert_close(got.nll, ref.nll, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.stats.mass, ref.stats.mass, atol=1e-6, rtol=0)
    if model_type == "beam":
        assert ref.stats.gated_mass is not None
        torch.testing.assert_close(got.stats.gated_mass, ref.stats.gated_mass, atol=1e-6, rtol=0)
    assert emb.weight.device.type == "meta"  # and offloaded again after the calls


def test_input_device_of_a_model_without_parameters_is_refused():
    from sinklab.errors import InputError

    with pytest.raises(InputError, match="no parameters"):
        input_device(torch.nn.Sequential())


def test_overmix_runs_on_an_offloaded_model(tmp_path):
    """analyze overmix embeds the ids itself: it sent them to the offloaded embedding's meta weight ('Cannot copy out
    of meta tensor'; outside review, 2026-12-07). Its tables equal the in-memory model's."""
    from sinklab.analyze import overmix
    from sinklab.subject import Subject

    model = tiny_model("llama")
    off = _offloaded(model, tmp_path / "m", tmp_path)
    ids = torch.randint(3, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    kw = dict(sources=[4], directions=1)
    a = overmix(Subject(model, ids, model_info={"name": "m"}), **kw).tables["per_layer"]
    b = overmix(Subject(off, ids, model_info={"name": "m"}), **kw).tables["per_layer"]
    for col in ("intact", "removed"):
        assert b[col].tolist() == pytest.approx(a[col].tolist(), abs=1e-7)
