"""Re-rotating RoPE keys to new positions, with the model's own frequencies.

RoPE (Su et al. 2021) rotates each pair of key dimensions by an angle proportional to the
token's position, so a key rotated at position p is moved to position p + d by one more
rotation by d: ``R(p + d) k = R(d) R(p) k``. StreamingLLM (Xiao et al. 2024, sec. 3.2) assigns
positions *inside the cache*; :class:`KeyRotation` is what lets a cache do that for a
``transformers`` model whose attention rotates keys before it hands them to the cache.

Supported: the rotate-half convention of LLaMA and its relatives (``q' = q cos + rotate_half(q) sin``
on the first ``rotary_dim`` dimensions; partial rotary models rotate only those, the rest pass
through), including models with one frequency table per layer type (Gemma 3). Layers a config
marks as without RoPE (SmolLM3's ``no_rope_layers``) are left unrotated. Learned absolute positions
(GPT-2, OPT), ALiBi (BLOOM, MPT) and models whose RoPE interleaves pairs (GLM-4, Helium) are refused
with :class:`~sinklab.errors.InputError` naming what is missing. ``tests/test_sink_cache_families.py``
checks every listed type against a fresh forward over the kept tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from sinklab.errors import InputError
from sinklab.nn.positional import rotate_half  # the LLaMA/NeoX convention, shared with SinkLM's RoPE

#: model_type values whose attention applies RoPE with ``rotate_half`` to the first rotary_dim dims (gpt_oss
#: writes it as two halves, ``first * cos - second * sin, second * cos + first * sin``: the same rotation).
ROTATE_HALF_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
    "gemma3_text", "phi", "phi3", "stablelm", "olmo", "olmo2", "granite", "smollm3", "starcoder2", "gpt_neox", "gpt_oss",
})
#: model_type values whose RoPE rotates interleaved pairs (dims 2i, 2i+1: GLM-4, Helium): refused
INTERLEAVED_MODEL_TYPES = frozenset({"glm", "glm4", "helium"})
_LEARNED = ("learned absolute position embeddings, which are baked into the hidden states, so positions cannot be "
            "reassigned inside the cache")
_ALIBI = ("ALiBi, a distance bias inside attention; StreamingLLM gives ALiBi models contiguous biases over the cache, "
          "which this cache does not implement")
#: model types with learned absolute positions or ALiBi: keys carry no rotation a cache could move.
NO_ROPE_MODEL_TYPES = {
    "gpt2": _LEARNED, "opt": _LEARNED, "gpt_bigcode": _LEARNED, "bert": _LEARNED + " (and it is an encoder)",
    "bloom": _ALIBI, "mpt": _ALIBI,
}


class KeyRotation:
    """Rotates RoPE keys by per-slot position offsets.

    Args:
        inv_freq: (rotary_dim / 2,) float inverse frequencies, as the model's rotary module holds them
            (scaled RoPE variants such as LLaMA 3's already folded in; a YaRN attention factor is
            not applied here: it multiplies both the old and the new rotation, so moving a key
            needs the pure rotation only).

    The angles ``delta * inv_freq`` are computed in float64 on the keys' device (float32 where the
    device has no float64, e.g. Apple's MPS), then cos / sin are cast to the keys' dtype: no copy
    to the host on the decode path.
    """

    def __init__(self, inv_freq: Tensor, rope_module: nn.Module | None = None) -> None:
        self.inv_freq = inv_freq.detach().clone()
        self.rope_module = rope_module
        self.rotary_dim = 2 * self.inv_freq.numel()
        self._inv: dict[torch.device, Tensor] = {}  # inv_freq in float64 per device
        self._memo: tuple[Tensor, torch.device, torch.dtype, Tensor, Tensor, Tensor] | None = None
        self._scalar_memo: tuple[int, torch.device, torch.dtype, Tensor, Tensor] | None = None

    def _cos_sin(self, delta: Tensor, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin (..., n, rotary_dim) for integer offsets ``delta`` (n,) or (B, n); the last table is
        reused (every layer of a cache moves the same slots by the same offsets in one step)."""
        m = self._memo
        if m is not None and m[1] == device and m[2] == dtype and (m[5] is delta or (
                m[0].shape == delta.shape and torch.equal(m[0], delta))):
            return m[3], m[4]
        inv = self._inv_on(delta.device)
        freqs = delta.detach().to(inv.dtype)[..., None] * inv  # (..., n, r/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(device, dtype), emb.sin().to(device, dtype)
        self._memo = (delta.detach().clone(), device, dtype, cos, sin, delta)
        return cos, sin

    def _inv_on(self, device: torch.device) -> Tensor:
        """``inv_freq`` (r/2,) on ``device`` in float64 (float32 on MPS, which has no float64), kept."""
        inv = self._inv.get(device)
        if inv is None:
            wide = torch.float32 if device.type == "mps" else torch.float64
            inv = self._inv[device] = self.inv_freq.to(device=device, dtype=wide)
        return inv

    def last_position_ids(self) -> Tensor | None:
        """The ``position_ids`` (B, q) the model's rotary module saw in its latest call, or None
        (recorded by a hook: some models, GPT-NeoX among them, do not pass them to the cache)."""
        return getattr(self.rope_module, "_sinklab_position_ids", None)

    def rotate(self, keys: Tensor, delta: Tensor) -> Tensor:
        """Move keys by ``delta`` positions.

        Args:
            keys: (B, H_kv, n, head_dim) keys already rotated at their old positions.
            delta: (n,) int64 offsets (new position - old position), per key slot, or (B, n): per
                row and slot (caches whose rows keep different tokens).

        Returns:
            (B, H_kv, n, head_dim): the keys as if rotated at old position + delta; the
            dimensions past ``rotary_dim`` unchanged. The angles are computed in float64.
        """
        cos, sin = self._cos_sin(delta, keys.device, keys.dtype)  # (n, r) or (B, n, r)
        if delta.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, n, r): the same angles for every head
        return self._apply(keys, cos, sin)

    def rotate_by(self, keys: Tensor, delta: int) -> Tensor:
        """Move every key of ``keys`` (B, H_kv, n, head_dim) by the same ``delta`` positions: the values
        :meth:`rotate` gives for a ``delta`` repeated n times (the same float64 angles, broadcast),
        with one (rotary_dim,) table, reused while consecutive calls (the layers of one step) move by
        the same offset."""
        m = self._scalar_memo
        if m is not None and m[0] == delta and m[1] == keys.device and m[2] == keys.dtype:
            cos, sin = m[3], m[4]
        else:
            freqs = float(delta) * self._inv_on(keys.device)  # (r/2,), float64 on the keys' device
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(keys.device, keys.dtype), emb.sin().to(keys.device, keys.dtype)
            self._scalar_memo = (delta, keys.device, keys.dtype, cos, sin)
        return self._apply(keys, cos, sin)

    def _apply(self, keys: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        r = self.rotary_dim
        kr = keys[..., :r]
        out = kr * cos + rotate_half(kr) * sin
        if keys.shape[-1] == r:
            return out
        return torch.cat((out, keys[..., r:]), dim=-1)


def _record_position_ids(module: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook on a rotary module ``forward(x, position_ids, ...)``: keep the position ids."""
    pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    module._sinklab_position_ids = pos if isinstance(pos, Tensor) else None


def _rotary_module(model: nn.Module) -> nn.Module | None:
    """The model's rotary embedding module, with a hook that records its position ids (added once)."""
    for m in model.modules():
        if type(m).__name__.endswith("RotaryEmbedding"):
            if not getattr(m, "_sinklab_position_hook", False):
                m.register_forward_pre_hook(_record_position_ids, with_kwargs=True)
                m._sinklab_position_hook = True
            return m
    return None


def key_rotations(model: nn.Module, layer_types: list[str]) -> list[KeyRotation | None]:
    """One :class:`KeyRotation` per decoder layer of a ``transformers`` causal LM (None for a layer the config
    marks as without RoPE, ``no_rope_layers``: its keys have no position to move).

    Args:
        model: a ``transformers`` model (``PreTrainedModel``).
        layer_types: per layer, ``"full_attention"`` or ``"sliding_attention"`` (Gemma 3 keeps
            one frequency table per layer type).

    Raises:
        InputError: the model has no RoPE (learned absolute positions, ALiBi), an unknown RoPE
            convention, or a dynamic RoPE scaling whose frequencies change with the length.
    """
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    mt = getattr(cfg, "model_type", "?")
    if mt in NO_ROPE_MODEL_TYPES:
        raise InputError(f"SinkCache needs a RoPE model: {mt} uses {NO_ROPE_MODEL_TYPES[mt]}")
    if mt in INTERLEAVED_MODEL_TYPES:
        raise InputError(f"SinkCache does not support model type {mt!r}: its RoPE interleaves pairs of dimensions "
                         "(2i, 2i+1), which the cache's re-rotation (rotate-half) would move wrongly")
    if mt not in ROTATE_HALF_MODEL_TYPES:
        raise InputError(f"SinkCache does not know the RoPE convention of model type {mt!r}: it supports the "
                         f"rotate-half RoPE of {', '.join(sorted(ROTATE_HALF_MODEL_TYPES))}")
    rope = _rotary_module(model)
    if rope is None:
        raise InputError(f"SinkCache found no rotary embedding module (*RotaryEmbedding) in this {mt} model")
    rope_types = getattr(rope, "rope_type", None)
    kinds = rope_types.values() if isinstance(rope_types, dict) else [rope_types]
    if any(k is not None and "dynamic" in str(k) for k in kinds):
        raise InputError("SinkCache does not support dynamic RoPE scaling (its frequencies depend on the length)")
    out: list[KeyRotation] = []
    shared = KeyRotation(rope.inv_freq, rope) if isinstance(getattr(rope, "inv_freq", None), Tensor) else None
    per_type: dict[str, KeyRotation] = {}
    uses_rope = getattr(cfg, "no_rope_layers", None)  # SmolLM3 / LLaMA 4: 1 = RoPE, 0 = NoPE, per layer
    for i, lt in enumerate(layer_types):
        if isinstance(uses_rope, (list, tuple)) and i < len(uses_rope) and not uses_rope[i]:
            out.append(None)  # NoPE layer: its keys carry no position, nothing to move
            continue
        if shared is not None:
            out.append(shared)
            continue
        inv = getattr(rope, f"{lt}_inv_freq", None)
        if not isinstance(inv, Tensor):
            raise InputError(f"SinkCache found no RoPE frequencies for layer type {lt!r} in {type(rope).__name__}")
        out.append(per_type.setdefault(lt, KeyRotation(inv, rope)))
    return out
