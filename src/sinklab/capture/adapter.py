"""One interface to the two kinds of model sinklab runs: :class:`ModelAdapter`.

sinklab measures, edits and streams two kinds of model: ``transformers`` models (HF: zoo models,
local folders, hub ids) and its own :class:`sinklab.nn.SinkLM`. They differ in how attention is
observed (``AttentionInterface`` collectors vs the model's own observer), in the mask (SinkLM may be
a prefix LM, use a sliding window or be bidirectional), in how a cache is fed (absolute position ids
vs positions taken from the cache) and in attribute names. Everything that depends on the kind goes
through :func:`adapt` (the one test of which kind a model is) and the adapter it returns:

* :class:`HFAdapter` -- ``transformers`` models;
* :class:`SinkLMAdapter` -- :class:`sinklab.nn.SinkLM` (also one wrapped in place by FSDP2).

Positions are 0-based throughout.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from sinklab.capture.families import check_measurable
from sinklab.capture.hf import forward_hf, hf_hooks
from sinklab.capture.native import forward_native, native_hooks
from sinklab.capture.recorder import BatchRecorder
from sinklab.errors import InputError
from sinklab.nn.model import SinkLM


class ModelAdapter:
    """What sinklab needs of a model, whatever its kind.

    Attributes:
        model: the wrapped module (eval mode is the caller's business).
        kind: ``"hf"`` or ``"sinklab"``.
    """

    kind: str = ""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    # ---------------------------------------------------------------- loading
    @staticmethod
    def load(name_or_path: str, **kwargs):
        """:func:`sinklab.models.load_model` (same arguments and errors), returning
        ``(adapter, loaded)`` where ``loaded`` is the :class:`~sinklab.models.LoadedModel`."""
        from sinklab.models import load_model

        loaded = load_model(name_or_path, **kwargs)
        return adapt(loaded.model), loaded

    # ---------------------------------------------------------------- structure
    @property
    def config(self):
        return self.model.config

    @property
    def n_layers(self) -> int:
        """Blocks (L)."""
        raise NotImplementedError

    @property
    def n_heads(self) -> int:
        """Query heads per attention layer (H)."""
        raise NotImplementedError

    @property
    def attention_layers(self) -> list[int]:
        """The 0-based blocks that hold an attention layer: every block, but for a hybrid (Jamba, Bamba,
        Qwen3-Next...) only those that are not SSM / linear-attention blocks."""
        return list(range(self.n_layers))

    @property
    def embeddings(self) -> nn.Embedding:
        """The input token-embedding table (rows = token ids)."""
        raise NotImplementedError

    @property
    def has_lm_head(self) -> bool:
        """True when the model predicts tokens (a loss readout is possible)."""
        raise NotImplementedError

    def position_table(self) -> nn.Embedding:
        """The learned absolute position-embedding table (row ``position_offset() + p`` holds 0-based position p).

        Raises:
            InputError: the model has none (rotary, ALiBi, relative or no positions): says which.
        """
        raise NotImplementedError

    def position_offset(self) -> int:
        """The row of :meth:`position_table` that position 0 reads: 0, except for tables that reserve their first
        rows (OPT's ``embed_positions.offset`` of 2; RoBERTa-style tables, whose position ids start after their
        padding index, ``padding_idx + 1``)."""
        table = self.position_table()
        offset = getattr(table, "offset", None)
        if isinstance(offset, int):
            return offset
        return 0 if table.padding_idx is None else int(table.padding_idx) + 1

    @property
    def max_context(self) -> int | None:
        """Longest sequence (tokens) its positions cover, or None when unknown."""
        raise NotImplementedError

    # ---------------------------------------------------------------- mask
    @property
    def accepts_prefix(self) -> bool:
        """True when a forward pass takes a bidirectional prefix (``prefix_len``, prefix LM)."""
        return False

    @property
    def masked_diffusion(self) -> bool:
        """True for a bidirectional (masked diffusion) language model trained by sinklab."""
        return False

    # ---------------------------------------------------------------- forward with capture and edits
    def capture(self, input_ids: Tensor, *, collector: str = "eager", prefix_len: int = 0, edit=None,
                hidden_edit=None, logits: bool = False, keep_hidden: bool = False,
                entropy: bool = False, renormalise: bool = True) -> BatchRecorder:
        """One forward pass of ``input_ids`` (B, T) int64 with attention and hidden-state statistics
        recorded (:class:`~sinklab.capture.recorder.BatchRecorder`).

        Args:
            collector: the attention collector (HF models; :data:`sinklab.capture.COLLECTORS`).
            prefix_len: bidirectional prefix of a prefix-LM SinkLM (0 = its plain mask).
            edit: :data:`sinklab.capture.hf.AttentionEdit` or None. hidden_edit:
                :data:`sinklab.capture.hf.HiddenEdit` or None.
            logits: keep ``recorder.logits`` (B, T, V). keep_hidden: keep every block's output.
            entropy: record each head's attention entropy.
            renormalise: SinkLM operations whose rows do not sum to 1 are recorded renormalised
                (True) or raw (False); softmax rows and HF models are unaffected.

        Raises:
            CaptureError: the model exposes no attention weights.
        """
        raise NotImplementedError

    def hooked(self, hooks):
        """Context manager: the :class:`~sinklab.capture.sites.Hook` s ``hooks`` attached to the model for the
        block (every forward pass runs them), removed on exit, also on an exception; see
        :func:`sinklab.hooks.hooked`.

        Raises:
            InputError: bad hooks (unknown site, a layer outside the model).
        """
        raise NotImplementedError

    # ---------------------------------------------------------------- cache
    @property
    def attn_implementation(self) -> str | None:
        """The ``transformers`` attention implementation in use (None for SinkLM)."""
        return None

    @contextmanager
    def attention(self, name: str | None) -> Iterator[str | None]:
        """Within the block the model runs the attention implementation ``name`` (None: as loaded);
        yields the implementation in use (None for SinkLM, which has one)."""
        yield None

    @property
    def parallel_stream(self) -> bool:
        """True when a whole stream can be scored in one parallel forward under a sink cache's mask
        (:func:`sinklab.streaming.parallel.sink_window_mode`) and caches batched over streams."""
        return False

    def dynamic_cache(self):
        """``transformers``' DynamicCache for the model, or None when the model decodes only through
        sinklab's own cache (SinkLM)."""
        return None

    def step(self, ids: Tensor, cache, start: int, *, last_only: bool = False) -> Tensor:
        """Feed ``ids`` (B, q), B streams of equal length, at positions ``start ..`` (0-based) through
        ``cache``; returns logits (B, q or 1, V)."""
        raise NotImplementedError


class HFAdapter(ModelAdapter):
    """A ``transformers`` model (decoder or encoder)."""

    kind = "hf"

    @property
    def n_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def n_heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def attention_layers(self) -> list[int]:
        from sinklab.capture.hf import find_layers, has_attention

        return [i for i, block in enumerate(find_layers(self.model)) if has_attention(block)]

    @property
    def embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def position_table(self) -> nn.Embedding:
        for name, mod in self.model.named_modules():
            if isinstance(mod, nn.Embedding) and name.split(".")[-1] in ("position_embeddings", "wpe", "embed_positions"):
                return mod
        rope = getattr(self.config, "rope_theta", None) or getattr(self.config, "rope_parameters", None)
        why = ("ALiBi adds a distance bias to the attention logits; there is no position vector to swap"
               if getattr(self.config, "alibi", False) else
               "rotary position embeddings (RoPE) rotate queries and keys; there is no position vector to swap"
               if rope else "no learned absolute position-embedding table was found")
        raise InputError(f"a position swap needs learned absolute position embeddings; {type(self.model).__name__}: {why}")

    @property
    def has_lm_head(self) -> bool:
        return hasattr(self.model, "lm_head") or getattr(self.model, "get_output_embeddings", lambda: None)() is not None

    @property
    def max_context(self) -> int | None:
        from sinklab.models import max_context_of

        return max_context_of(self.config)

    def capture(self, input_ids: Tensor, *, collector: str = "eager", prefix_len: int = 0, edit=None,
                hidden_edit=None, logits: bool = False, keep_hidden: bool = False,
                entropy: bool = False, renormalise: bool = True) -> BatchRecorder:
        check_measurable(self.config)  # a type the architecture matrix found not exact: refused in one line
        return forward_hf(self.model, input_ids, collector, edit=edit, hidden_edit=hidden_edit, logits=logits,
                          keep_hidden=keep_hidden, entropy=entropy)

    def hooked(self, hooks):
        return hf_hooks(self.model, hooks)

    @property
    def attn_implementation(self) -> str | None:
        return self.config._attn_implementation

    @contextmanager
    def attention(self, name: str | None) -> Iterator[str | None]:
        before = self.config._attn_implementation
        if name is None or name == before:
            yield before
            return
        self.model.set_attn_implementation(name)
        try:
            yield name
        finally:
            self.model.set_attn_implementation(before)

    @property
    def parallel_stream(self) -> bool:
        return True

    def dynamic_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def step(self, ids: Tensor, cache, start: int, *, last_only: bool = False) -> Tensor:
        kw = {"logits_to_keep": 1} if last_only else {}
        pos = torch.arange(start, start + ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
        return self.model(ids, cache=cache, use_cache=True, position_ids=pos, **kw).logits


class SinkLMAdapter(ModelAdapter):
    """sinklab's own :class:`~sinklab.nn.SinkLM`: observer capture, prefix-LM / sliding-window /
    bidirectional masks from its config, positions taken from the cache when decoding."""

    kind = "sinklab"

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    @property
    def embeddings(self) -> nn.Embedding:
        return self.model.embed

    def position_table(self) -> nn.Embedding:
        kind = self.config.positional
        if kind != "learned":
            raise InputError(f"a position swap needs learned absolute position embeddings; this sinklab model "
                             f"uses positional = {kind!r}")
        return self.model.positional.table

    def position_offset(self) -> int:
        return 0  # a sinklab model's row p is position p

    @property
    def has_lm_head(self) -> bool:
        return True

    @property
    def max_context(self) -> int | None:
        return self.config.max_seq_len

    @property
    def accepts_prefix(self) -> bool:
        return True

    @property
    def masked_diffusion(self) -> bool:
        return not getattr(self.config, "causal", True)

    def capture(self, input_ids: Tensor, *, collector: str = "eager", prefix_len: int = 0, edit=None,
                hidden_edit=None, logits: bool = False, keep_hidden: bool = False,
                entropy: bool = False, renormalise: bool = True) -> BatchRecorder:
        return forward_native(self.model, input_ids, prefix_len, edit=edit, hidden_edit=hidden_edit, logits=logits,
                              keep_hidden=keep_hidden, entropy=entropy, renormalise=renormalise)

    def hooked(self, hooks):
        return native_hooks(self.model, hooks)

    def step(self, ids: Tensor, cache, start: int, *, last_only: bool = False) -> Tensor:
        logits = self.model(ids, cache=cache).logits  # positions come from the cache itself
        return logits[:, -1:] if last_only else logits


def adapt(model: nn.Module | ModelAdapter) -> ModelAdapter:
    """The adapter of ``model``: :class:`SinkLMAdapter` for a :class:`~sinklab.nn.SinkLM` (also one
    wrapped in place by FSDP2 ``fully_shard``, a generated subclass), else :class:`HFAdapter`. An
    adapter is returned as it is."""
    if isinstance(model, ModelAdapter):
        return model
    return SinkLMAdapter(model) if isinstance(model, SinkLM) else HFAdapter(model)


__all__ = ["ModelAdapter", "HFAdapter", "SinkLMAdapter", "adapt"]
