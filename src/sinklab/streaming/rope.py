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
checks every listed type against a fresh forward over the kept tokens. The type tables and the check
live with the other per-type statuses in :mod:`sinklab.capture.families` (``docs/models.md`` shows them).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# the per-type tables (one owner: sinklab.capture.families, which docs/models.md is generated from)
from sinklab.capture.families import (  # noqa: F401 - the tables are re-exported here
    INTERLEAVED_MODEL_TYPES,
    NO_ROPE_MODEL_TYPES,
    ROTATE_HALF_MODEL_TYPES,
    check_sink_cache,
)
from sinklab.errors import InputError
from sinklab.nn.positional import rotate_half  # the LLaMA/NeoX convention, shared with SinkLM's RoPE


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
        InputError: the model type is not exact for SinkCache (:func:`sinklab.capture.families.sink_cache_status`:
            no RoPE (learned absolute positions, ALiBi), interleaved or unchecked RoPE conventions, no attention,
            an encoder), or a RoPE scaling whose frequencies change with the length (dynamic NTK, LongRoPE).
    """
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    mt = getattr(cfg, "model_type", "?")
    check_sink_cache(cfg)  # the type's status (sinklab.capture.families.sink_cache_status): exact or refused
    rope = _rotary_module(model)
    if rope is None:
        raise InputError(f"SinkCache found no rotary embedding module (*RotaryEmbedding) in this {mt} model")
    rope_types = getattr(rope, "rope_type", None)
    kinds = rope_types.values() if isinstance(rope_types, dict) else [rope_types]
    if any(k is not None and "dynamic" in str(k) for k in kinds):
        raise InputError("SinkCache does not support dynamic RoPE scaling (its frequencies depend on the length)")
    if any(str(k) == "longrope" for k in kinds):  # transformers' dynamic_rope_update switches its frequencies
        raise InputError("SinkCache does not support LongRoPE scaling (Phi-3 128k, Phi-3.5, Phi-4-mini: its frequencies "
                         "switch once the sequence passes original_max_position_embeddings, so kept keys cannot be "
                         "re-rotated exactly)")
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
