"""A StreamingLLM KV cache (attention sinks + a window of recent tokens) on the ``transformers`` Cache API.

StreamingLLM (Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks",
sec. 3.2): keep the key/value states of the first ``n_sink`` tokens of the stream (the attention
sinks) and of the ``window`` most recent tokens; evict everything in between. Positions are
assigned *inside the cache*: the kept keys are re-rotated (:mod:`sinklab.streaming.rope`) so that,
seen from the current query, they sit at contiguous positions right before it, whatever
positions the caller used (``generate`` counts absolute positions; :func:`sinklab.streaming.harness.evaluate_stream`
passes cache positions, as the paper does). The stored keys keep the rotation the model gave
them, with that position; every read rotates them by the difference, so no rounding accumulates
over a long stream.

Semantics of one call with ``q`` new tokens, ``K`` kept tokens before the call: the new tokens
attend causally to the K kept tokens and to each other (K + q keys); afterwards the cache keeps
the first ``n_sink`` tokens of the stream and the last ``window`` tokens (so a one-token decode
step sees at most ``n_sink + window + 1`` keys, itself included). A prompt longer than
``n_sink + window`` given in one call attends to all of itself, like the full cache, and is then
cut down. Layers the model declares as sliding-window layers (Gemma 3's local layers) keep their
own window of ``sliding_window - 1`` tokens and no sinks, as the model was trained.

Every row of a batch is one stream of the same length (no padding).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, CacheLayerMixin, get_layer_types_and_kwargs

from sinklab.errors import InputError
from sinklab.streaming.rope import KeyRotation, key_rotations

SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def layer_windows(model) -> list[int | None]:
    """Per decoder layer of a ``transformers`` model: its own sliding window (tokens), or None for a
    full-attention layer.

    Raises:
        InputError: a layer type other than full or sliding attention (linear, chunked, ...).
    """
    types, kws = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    bad = sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})
    if bad:
        raise InputError(f"SinkCache supports full and sliding attention layers, this model has {', '.join(bad)}")
    return [int(kw["sliding_window"]) if t == "sliding_attention" else None for t, kw in zip(types, kws)]


def _position_start(kwargs: dict, recorded: Tensor | None, default: int) -> int:
    """First position id of the new tokens.

    From the kwargs the attention passes to ``update`` (``transformers`` 5 LLaMA-like models call
    ``cache.update(k, v, layer_idx, kwargs=attn_kwargs)`` with the decoder layer's ``position_ids``
    (B, q) inside), else from the ids the rotary module saw (``recorded``), else ``default``: the
    model counted from ``cache.get_seq_length()``.

    Raises:
        InputError: rows of ``position_ids`` that differ (padded batches are not supported).
    """
    inner = kwargs.get("kwargs")
    pos = None
    for d in (inner if isinstance(inner, dict) else {}, kwargs):
        if isinstance(d.get("position_ids"), Tensor):
            pos = d["position_ids"]
            break
    if pos is None:
        pos = recorded
    if pos is None:
        return default
    pos = pos.reshape(-1, pos.shape[-1]) if pos.dim() > 1 else pos[None]
    if pos.shape[0] > 1 and not bool((pos == pos[:1]).all()):
        raise InputError("SinkCache needs the same position ids in every row of the batch (equal-length streams, "
                         "no padding)")
    return int(pos[0, 0])


class SinkCacheLayer(CacheLayerMixin):
    """The cache of one attention layer: ``n_sink`` first tokens + ``window`` most recent tokens.

    Args:
        n_sink: number of initial tokens kept (>= 0).
        window: number of most recent tokens kept (>= 1).
        rotation: the layer's :class:`KeyRotation`, or None for a model without RoPE (no re-rotation).
        is_sliding: True for a layer the model declares sliding-window (informs transformers' masks).

    Attributes:
        keys, values: (B, H_kv, K, head_dim) kept states, K <= n_sink + window, keys rotated at ``positions``.
        positions: (K,) int64 position each kept key was rotated at.
        seen: tokens passed through :meth:`update` so far (the stream length).
    """

    is_compileable = False
    is_croppable = False

    def __init__(self, n_sink: int, window: int, rotation: KeyRotation | None, is_sliding: bool = False) -> None:
        super().__init__()
        self.n_sink, self.window, self.rotation, self.is_sliding = n_sink, window, rotation, is_sliding
        self.positions: Tensor | None = None
        self.seen = 0

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.device = key_states.device
        self.keys = key_states[..., :0, :]
        self.values = value_states[..., :0, :]
        self.positions = torch.zeros(0, dtype=torch.long, device=key_states.device)
        self.is_initialized = True

    @property
    def kept(self) -> int:
        """Number of tokens held now."""
        return 0 if self.keys is None else self.keys.shape[-2]

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """Add ``q`` new tokens; return the keys/values the new queries attend to.

        Args:
            key_states: (B, H_kv, q, head_dim) new keys, rotated by the model at positions P0 .. P0+q-1
                (P0 read from ``position_ids`` in the kwargs, else ``seen``).
            value_states: (B, H_kv, q, head_dim).

        Returns:
            keys, values (B, H_kv, K + q, head_dim): the K kept tokens re-rotated to positions
            P0-K .. P0-1, then the new ones.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q, K = key_states.shape[-2], self.kept
        recorded = self.rotation.last_position_ids() if self.rotation is not None else None
        if recorded is not None and recorded.shape[-1] != q:
            recorded = None
        p0 = _position_start(kwargs, recorded, self.seen)
        dev = key_states.device
        new_pos = torch.arange(p0, p0 + q, device=dev)
        keys_old = self.keys
        if K and self.rotation is not None:
            delta = (p0 - K + torch.arange(K, device=dev)) - self.positions  # (K,)
            moved = delta != 0
            if bool(moved.all()):
                keys_old = self.rotation.rotate(keys_old, delta)
            elif bool(moved.any()):
                idx = moved.nonzero().squeeze(-1)
                keys_old = keys_old.clone()
                keys_old[..., idx, :] = self.rotation.rotate(keys_old[..., idx, :], delta[idx])
        full_k = torch.cat((keys_old, key_states), dim=-2)
        full_v = torch.cat((self.values, value_states), dim=-2)
        # keep the model's own rotation and its position; evict the middle
        keys = full_k if keys_old is self.keys else torch.cat((self.keys, key_states), dim=-2)
        positions = torch.cat((self.positions, new_pos))
        n = keys.shape[-2]
        if n > self.n_sink + self.window:
            keep = torch.cat((torch.arange(self.n_sink, device=dev), torch.arange(n - self.window, n, device=dev)))
            self.keys, self.values, self.positions = keys[..., keep, :], full_v[..., keep, :], positions[keep]
        else:
            self.keys, self.values, self.positions = keys, full_v, positions
        self.seen += q
        return full_k, full_v

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """(kv_length, kv_offset) for transformers' masks: the K kept + q new keys sit at the K
        positions right before the queries (queries at ``seen`` .. ``seen + q - 1``)."""
        return self.kept + query_length, self.seen - self.kept

    def get_seq_length(self) -> int:
        """Tokens seen so far (what ``generate`` needs to slice new input ids), not tokens kept."""
        return self.seen

    def get_max_length(self) -> int:
        """Most tokens held between calls: ``n_sink + window``."""
        return self.n_sink + self.window

    def reset(self) -> None:
        self.keys = self.values = self.positions = None
        self.is_initialized = False
        self.seen = 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.kept:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: Tensor) -> None:
        if self.kept:
            self.keys, self.values = self.keys[indices], self.values[indices]

    @property
    def nbytes(self) -> int:
        """Bytes held by the kept keys and values."""
        if self.keys is None:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()


def _native_layers(model, n_sink: int, window: int, max_context: int | None) -> list[SinkCacheLayer]:
    """Cache layers for a model trained with ``sinklab train`` (:class:`sinklab.nn.SinkLM`).

    Its learned sinks (a sink token, key/value biases, a sink logit) live in the attention
    operation and are always attended, whatever the cache keeps: ``n_sink = 0`` is the
    learned-sink variant of StreamingLLM (Xiao et al. 2024, sec. 3.3).

    Raises:
        InputError: absolute positions (learned, sinusoidal), a sliding-window model, or
            ``n_sink + window`` above ``max_seq_len``.
    """
    cfg = model.config
    if model.positional.absolute(1, torch.device("cpu")) is not None:
        raise InputError(f"SinkCache needs relative positions; this sinklab model uses {cfg.positional!r} absolute "
                         "positions, baked into the hidden states")
    if cfg.sliding_window is not None:
        raise InputError("SinkCache does not support sinklab models trained with a sliding window")
    limit = cfg.max_seq_len if max_context == -1 else max_context
    if limit is not None and n_sink + window > limit:
        raise InputError(f"n_sink + window = {n_sink + window} exceeds the model's context of {limit} tokens")
    inv = getattr(model.positional, "inv_freq", None)
    rotation = KeyRotation(inv) if isinstance(inv, Tensor) else None  # RoPE; None: NoPE / ALiBi / T5 buckets
    return [SinkCacheLayer(n_sink, window, rotation) for _ in range(cfg.n_layers)]


def _hf_layers(model, n_sink: int, window: int, max_context: int | None) -> list[SinkCacheLayer]:
    """Cache layers for a ``transformers`` RoPE decoder (sliding layers keep their own window, no sinks).

    Raises:
        InputError: not a transformers model, ``n_sink + window`` above the context, an unsupported
            layer type or RoPE convention.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        raise InputError(f"SinkCache needs a transformers model with a config, got {type(model).__name__}")
    if max_context == -1:
        max_context = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    if max_context is not None and n_sink + window > max_context:
        raise InputError(f"n_sink + window = {n_sink + window} exceeds the model's context of {max_context} tokens")
    windows = layer_windows(model)
    rotations = key_rotations(model, [("full_attention" if w is None else "sliding_attention") for w in windows])
    return [SinkCacheLayer(n_sink, window, rot) if w is None else SinkCacheLayer(0, w - 1, rot, is_sliding=True)
            for w, rot in zip(windows, rotations)]


class SinkCache(Cache):
    """StreamingLLM cache for a ``transformers`` RoPE decoder: attention sinks + a window.

    Use::

        cache = SinkCache(model, n_sink=4, window=1020)
        out = model.generate(input_ids, past_key_values=cache, max_new_tokens=4000)  # or cache=cache

    or a manual loop ``model(ids_t, cache=cache, use_cache=True)`` one token (or chunk) at a time.

    Args:
        model: a ``transformers`` causal LM with RoPE (LLaMA, Mistral, Qwen, Gemma 1-3, Phi, ...;
            see :data:`sinklab.streaming.rope.ROTATE_HALF_MODEL_TYPES`); grouped-query attention
            and partial rotary are handled. Or a model trained with ``sinklab train``
            (:class:`sinklab.nn.SinkLM`, relative positions), decoded with ``model(ids, cache=cache)``:
            its learned sinks (sink token, key/value bias, sink logit) stay in every step, so
            ``n_sink = 0`` is the learned-sink variant.
        n_sink: initial tokens kept (0 = a plain window cache).
        window: most recent tokens kept (>= 1).
        max_context: refuse ``n_sink + window`` above this many tokens (default: the model's
            ``max_position_embeddings``; None in the config = no check).

    Raises:
        InputError: ``window < 1``, ``n_sink < 0``, ``n_sink + window`` above the model's context,
            a layer type other than full or sliding attention, or a model without a supported RoPE
            (the message names what is missing).
    """

    def __init__(self, model: nn.Module, n_sink: int = 4, window: int = 1020, *, max_context: int | None = -1) -> None:
        if not isinstance(window, int) or window < 1:
            raise InputError(f"window must be an integer >= 1, got {window!r}")
        if not isinstance(n_sink, int) or n_sink < 0:
            raise InputError(f"n_sink (number of sink tokens) must be an integer >= 0, got {n_sink!r}")
        from sinklab.nn import SinkLM

        if isinstance(model, SinkLM):
            layers = _native_layers(model, n_sink, window, max_context)
        else:
            layers = _hf_layers(model, n_sink, window, max_context)
        super().__init__(layers=layers)
        self.n_sink, self.window = n_sink, window

    def __repr__(self) -> str:
        return f"SinkCache(n_sink={self.n_sink}, window={self.window}, layers={len(self.layers)}, seen={self.get_seq_length()})"

    @property
    def nbytes(self) -> int:
        """Bytes held by all layers' kept keys and values."""
        return sum(layer.nbytes for layer in self.layers)

    def kept_length(self, layer_idx: int | None = None) -> int:
        """Tokens held now by layer ``layer_idx`` (default: the first full-attention layer; <= n_sink + window).

        This is the cache position of the next token: pass it as ``position_ids`` to give
        positions inside the cache, as StreamingLLM does."""
        if layer_idx is None:
            layer_idx = next((i for i, layer in enumerate(self.layers) if not layer.is_sliding), 0)
        return self.layers[layer_idx].kept if layer_idx < len(self.layers) else 0
