"""The mask builder registered beside sinklab's capture attention function.

``transformers`` builds every layer's mask with the function registered under the
attention implementation's name in ``AttentionMaskInterface``. Its SDPA builder
already returns None for a plain causal pattern without padding (the attention
function then uses ``is_causal``), but for a **sliding-window** layer whose sequence
is longer than the window it materialises a (B, 1, T, T) boolean mask: 64 MiB per
mask at T = 8192, more per batch. :func:`capture_mask` returns None for that pattern
as well and records the window; the collectors rebuild causality and the window
block by block from the ``sliding_window`` value (``kv > q - window``, 0-based).
Every other pattern (padding, packed sequences, bidirectional overlays, chunked
attention) is built exactly as by ``transformers.masking_utils.sdpa_mask``.
"""

from __future__ import annotations

import threading

import torch

_state = threading.local()


def skipped_window() -> int | None:
    """The window of the last sliding-window mask that :func:`capture_mask` skipped, or None."""
    return getattr(_state, "window", None)


def reset_skipped_window() -> None:
    """Forget the recorded window."""
    _state.window = None


def set_capture_active(active: bool) -> None:
    """Called by :func:`sinklab.capture.hf.capturing` when a capture starts (True) and ends (False);
    forgets the recorded window either way. Only while active does :func:`capture_mask` skip masks."""
    _state.active = bool(active)
    _state.window = None


def capture_active() -> bool:
    """Whether a capture is running in this thread (see :func:`set_capture_active`)."""
    return getattr(_state, "active", False)


def is_sliding_window_pattern(mask_function, window: int, device="cpu") -> bool:
    """Whether ``mask_function`` is exactly the causal sliding window ``q - window < kv <= q``.

    Checked on the query rows ``0, 1, window - 1, window, window + 1, 2 window`` against
    every key in ``[0, 2 window + 2)`` (enough to tell it from plain causal and from
    chunked attention); a mask function that cannot be evaluated on tensors gives False.
    """
    try:
        q = torch.tensor([0, 1, window - 1, window, window + 1, 2 * window], device=device)[:, None]
        kv = torch.arange(2 * window + 2, device=device)[None, :]
        zero = torch.zeros((), dtype=torch.long, device=device)
        got = mask_function(zero, zero, q, kv)
        want = (kv <= q) & (kv > q - window)
        return bool(torch.equal(torch.as_tensor(got, device=device).expand_as(want), want))
    except Exception:  # noqa: BLE001 - any failure means "not the plain pattern"
        return False


def capture_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    allow_is_causal_skip: bool = True,
    allow_is_bidirectional_skip: bool = False,
    **kwargs,
) -> torch.Tensor | None:
    """``sdpa_mask`` that also returns None for a plain causal sliding window (no padding, no cache).

    Same arguments and result as ``transformers.masking_utils.sdpa_mask``: a boolean
    (B, 1, T_q, T_k) mask (True = may attend) or None. Returns None for a sliding
    window only while a capture is active (:func:`set_capture_active`, called by
    ``sinklab.capture.hf``), so that the
    capture's attention function, which then applies the window itself, is the only
    consumer.
    """
    from transformers.masking_utils import (
        _ignore_causal_mask_sdpa,
        causal_mask_function,
        prepare_padding_mask,
        sdpa_mask,
    )

    if mask_function is None:
        mask_function = causal_mask_function
    device = kwargs.get("device", "cpu")
    if (
        local_size is not None
        and int(local_size) >= 1  # a window of 0 (Qwen2-MoE without sliding window) is no window: built as given
        and allow_is_causal_skip
        and capture_active()
        and isinstance(q_offset, int)
        and isinstance(kv_offset, int)
        and q_offset == 0
        and kv_offset == 0
        and q_length == kv_length
        and is_sliding_window_pattern(mask_function, int(local_size), device)
    ):
        padding_mask = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if _ignore_causal_mask_sdpa(padding_mask, q_length, kv_length, q_offset, kv_offset, None):
            _state.window = int(local_size)
            return None
    return sdpa_mask(
        batch_size,
        q_length,
        kv_length,
        q_offset=q_offset,
        kv_offset=kv_offset,
        mask_function=mask_function,
        attention_mask=attention_mask,
        local_size=local_size,
        allow_is_causal_skip=allow_is_causal_skip,
        allow_is_bidirectional_skip=allow_is_bidirectional_skip,
        **kwargs,
    )
