"""Models for the CUDA tests (tests/test_gpu.py) and the device script (benchmarks/gpu.py).

A GPU machine often has no sinklab cache and no way to fetch one, so SmolLM2-135M is taken from
the user's cache when it is there and is otherwise a LLaMA of its exact shape with seeded random
weights: time, peak memory and the equality of a CUDA run with a CPU run do not depend on the
weights (sink rates do, and are not what these runs check).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

#: SmolLM2-135M's shape (its config.json: 30 layers, d 576, 9 query / 3 key-value heads of 64, RoPE 1e5)
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                     rope_parameters={"rope_theta": 100000.0, "rope_type": "default"}, tie_word_embeddings=True,
                     max_position_embeddings=8192, bos_token_id=1, eos_token_id=2)


def cached_smollm2(home: str | Path | None = None) -> Path | None:
    """The SmolLM2-135M folder in the sinklab cache ``home`` (default ``$SINKLAB_HOME``, else
    ``~/.cache/sinklab``), or None."""
    home = Path(home or os.environ.get("SINKLAB_HOME") or Path.home() / ".cache" / "sinklab")
    folder = home / "models" / "smollm2-135m"
    return folder if (folder / "model.safetensors").exists() else None


def smollm2(*, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, max_positions: int | None = None,
            attn: str = "sdpa", layers: int | None = None, weights: str = "auto", home: str | Path | None = None):
    """SmolLM2-135M (``LlamaForCausalLM``, eval mode) on ``device`` in ``dtype``.

    Args:
        max_positions: ``max_position_embeddings`` (RoPE has no table: a longer context only
            lifts transformers' and sinklab's checks).
        attn: ``attn_implementation``.
        layers: keep only the first ``layers`` blocks (a smaller model of the same width).
        weights: "auto" (the cached weights when present, else random), "random" or "cached".
        home: the sinklab cache to look in (see :func:`cached_smollm2`).

    Returns:
        (model, what): ``what`` = "smollm2-135m" or "random weights, SmolLM2-135M shape".
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = cached_smollm2(home) if weights in ("auto", "cached") else None
    if weights == "cached" and folder is None:
        raise FileNotFoundError("SmolLM2-135M is not in the sinklab cache (sinklab fetch smollm2-135m)")
    shape = dict(SMOLLM2_SHAPE)
    if max_positions:
        shape["max_position_embeddings"] = max_positions
    if layers:
        shape["num_hidden_layers"] = layers
    if folder is not None:
        from transformers.utils import logging

        logging.set_verbosity_error()  # (the load report lists the blocks left out by ``layers``)
        model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn,
                                                 max_position_embeddings=shape["max_position_embeddings"],
                                                 num_hidden_layers=shape["num_hidden_layers"])
        what = "smollm2-135m"
    else:
        torch.manual_seed(0)
        cfg = LlamaConfig(**shape)
        cfg._attn_implementation = attn
        model = LlamaForCausalLM(cfg).to(dtype)
        what = "random weights, SmolLM2-135M shape"
    return model.to(device).eval(), what
