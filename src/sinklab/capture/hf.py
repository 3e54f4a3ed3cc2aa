"""The seam into ``transformers`` models: a registered attention function.

``transformers`` (>= 5) looks up each layer's attention function by name in
``AttentionInterface`` on every forward. :func:`capturing` switches a model to
``"sinklab_capture"``, whose function runs the active collector (which returns
both the attention output and the column sums of the attention matrix) and
records per-layer statistics; on exit the model's previous implementation is
restored, even on error. Masks come from the SDPA mask builder registered under
the same name (see ``shared/notes/hf-attention-interface.md``): without it padding
and sliding windows would be silently lost.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Callable, Iterator

import torch
from torch import nn

from sinklab.attention_masks import MaskSpec, repeat_kv
from sinklab.capture.collectors import COLLECTORS, layer_mask
from sinklab.capture.gates import gate_reader
from sinklab.capture.masks import capture_mask, set_capture_active, skipped_window
from sinklab.capture.recorder import BatchRecorder
from sinklab.capture.sites import ATTENTION_SITES, Hook, HookSet, attached, legacy_hooks
from sinklab.errors import CaptureError, InputError
from sinklab.metrics.entropy import attention_entropy
from sinklab.metrics.sink import gate_weighted_column_sums

ATTN_NAME = "sinklab_capture"

#: An intervention on attention weights: ``edit(layer, weights, *, query, key, value, mask)`` with 0-based
#: ``layer``, ``weights`` (B, H, T_q, T_k) float32 after softmax, ``query`` (B, H, T_q, D) after RoPE,
#: ``key``/``value`` (B, H, T_k, D) with grouped-query heads repeated to H, ``mask`` the layer's visibility
#: (:attr:`~sinklab.capture.sites.HookContext.mask`); returns replacement
#: weights of the same shape, or None to leave them unchanged (an inspection). Kept for the analyses'
#: ``run_model(edit=...)``: it is run as an ``attn.weights`` :class:`~sinklab.capture.sites.Hook`
#: (:func:`~sinklab.capture.sites.legacy_hooks`).
AttentionEdit = Callable[..., "torch.Tensor | None"]
#: An intervention on a block's output: ``hidden_edit(layer, hidden (B, T, d)) -> hidden | None``; run as a
#: ``block.out`` hook.
HiddenEdit = Callable[[int, "torch.Tensor"], "torch.Tensor | None"]
_current = threading.local()  # .block: [HookSet, 0-based block index, attention called] while a hooked block runs


def _active() -> list | None:
    """``[HookSet, block index, attention called]`` of the hooked block running in this thread, or None."""
    return getattr(_current, "block", None)


def _sdpa(module, query, key, value, attention_mask, *, dropout, scaling, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _capture_attention(module: nn.Module, query, key, value, attention_mask, *, scaling=None, dropout=0.0, **kwargs):
    """AttentionInterface function: (out (B, T, H, D), None), running the hooks at the attention sites
    and recording statistics on the side."""
    current = _active()
    if current is None:  # used outside a hooked block: behave like SDPA
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    state, idx, _ = current
    current[2] = True
    recorder = state.recorder
    layer = recorder.next_layer() if recorder is not None else idx
    if state.hooks:
        query = state.apply("attn.query", layer, query)[0]
        key = state.apply("attn.key", layer, key)[0]
        value = state.apply("attn.value", layer, value)[0]
    hooked_weights = bool(state.at("attn.weights", layer))
    # SDPA ignores gpt-oss's sink logits (s_aux) and refuses Gemma 2's soft-capping: a layer with either is
    # computed by the eager collector even when nothing reads it
    sdpa_exact = kwargs.get("s_aux") is None and kwargs.get("softcap") is None
    if recorder is None and not hooked_weights and sdpa_exact:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    more = {}
    gate = recorder.gate_of(layer) if recorder is not None else None  # a gated layer: its gate, read before
    gated: list = []
    if hooked_weights or gate is not None:
        # the eager collector hands the weights to the hooks (and recomputes the output from an edit) and to
        # the gate weighting (DESIGN "gate-weighted attention")
        collector = COLLECTORS.get("eager")

        def edit(w, q=query, k=key, v=value):
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device) if seen is None else seen
            new, edited = state.apply("attn.weights", layer, w, query=q, key=k, value=v, mask=mask)
            if gate is not None:
                gated.append(gate_weighted_column_sums(new, gate))
            return new if edited else None

        more["edit"] = edit
    elif recorder is None:  # a layer SDPA cannot compute (above), nothing recorded
        collector = COLLECTORS.get("eager")
    else:
        collector = COLLECTORS.get(state.collector)
    # The window of a sliding layer whose mask capture_mask skipped (None otherwise):
    # the `sliding_window` kwarg (Gemma 3, Mistral, gpt-oss...), else the module's
    # attribute, else the skipped mask's own window (models that pass neither).
    window = None
    if attention_mask is None and skipped_window() is not None:
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", skipped_window()))
    # the visibility the collector applies (None: every key), for the hooks' context and the recorder's counts of a
    # mask tensor; only built when one of them needs it (a causal T x T mask is what the blockwise collector avoids)
    square = query.shape[2] == key.shape[2]
    seen = (layer_mask(attention_mask, bool(is_causal) and query.shape[2] > 1, query.shape[2], key.shape[2],
                       query.device, window)
            if "edit" in more or (recorder is not None and attention_mask is not None and square) else None)
    if recorder is not None and recorder.wants_entropy:
        more["entropy"] = True
    out, col, *ent = collector(
        query,
        key,
        value,
        scaling=scaling,
        attention_mask=attention_mask,
        is_causal=bool(is_causal) and query.shape[2] > 1,
        softcap=kwargs.get("softcap"),
        sinks=kwargs.get("s_aux"),
        sliding_window=window,
        **more,
    )
    if recorder is None:
        return out, None
    real = _real_queries(seen, square)  # None, or (B|1, H|1, T_q) bool: the queries of a left-padded batch's tokens
    extra = None
    if kwargs.get("s_aux") is not None:
        # gpt-oss style sink logits: every query's weights on the real keys sum to 1 - (its weight on the
        # virtual sink), so the mean weight on the sink over the n real queries is 1 - sum(col) / n (a pad query of
        # a left-padded row sees nothing and adds nothing to col)
        n = query.shape[2] if real is None else real.sum(dim=-1).clamp_min(1).to(col.dtype)  # (B|1, H|1)
        extra = (1.0 - col.sum(dim=-1) / n).unsqueeze(-1)  # (B, H, 1)
    counts = None
    if attention_mask is not None and square:
        # the layer's own mask tensor (chunked attention, Llama 4; a window or a prefix the model passes as a
        # tensor): the queries that may see each key, counted from it, (B or 1, H or 1, T_k)
        counts = seen.expand(*seen.shape[:-2], query.shape[2], key.shape[2]).sum(dim=-2)
    recorder.add_attention(layer, col, MaskSpec(causal=bool(is_causal), window=window), key=key, value=value,
                           extra=extra, entropy=ent[0] if ent else None, gated_column_sums=gated[0] if gated else None,
                           visible_counts=counts, query_mask=real)
    return out, None


def _real_queries(seen: Tensor | None, square: bool) -> Tensor | None:
    """The queries of real tokens in a padded batch: (B|1, H|1, T_q) bool, or None when every query is one.

    A pad position is one whose own key the layer's mask hides. A left-padded causal row's pads see no key at all
    and add nothing to the column sums: their queries are only left out of the means over queries (entropy, the
    virtual sink's weight). A pad query that sees other keys (right padding, or any padding of a bidirectional
    encoder) would add its attention to every statistic: refused.

    Raises:
        InputError: a pad query that sees keys."""
    if seen is None or not square:
        return None
    own = seen.diagonal(dim1=-2, dim2=-1)  # (B|1, H|1, T): each query sees its own position
    if bool(own.all()):
        return None
    if bool((seen & ~own[..., None]).any()):
        raise InputError("a padded batch whose pad positions see other tokens (right padding, or a padded "
                         "bidirectional encoder): sinklab's statistics would count the pads' attention; pad causal "
                         "models on the left (tokenizer.padding_side = 'left') or measure each sequence unpadded")
    return own


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if ATTN_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_NAME, _capture_attention)
        AttentionMaskInterface.register(ATTN_NAME, capture_mask)


def has_attention(block: nn.Module) -> bool:
    """Whether a transformer block holds an attention module (a submodule whose class name contains
    "Attention" or "Attn"); False for the SSM / Mamba blocks of a hybrid model (Jamba, Bamba, ...)."""
    return any("attention" in type(m).__name__.lower() or "attn" in type(m).__name__.lower()
               for m in block.modules())


def attention_module(block: nn.Module) -> nn.Module | None:
    """The attention sublayer of a transformer block: its first direct child whose class name contains
    "Attention" or "Attn" (LLaMA's ``self_attn``, GPT-2's ``attn``, BERT's ``attention``), or None."""
    for _, m in block.named_children():
        name = type(m).__name__.lower()
        if "attention" in name or "attn" in name:
            return m
    return None


def find_layers(model: nn.Module) -> nn.ModuleList:
    """The model's list of transformer blocks: the ModuleList of length ``num_hidden_layers``.

    Raises:
        CaptureError: if no such list exists.
    """
    n = getattr(model.config, "num_hidden_layers", None)
    best = None
    for _, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            best = mod
            break
    if best is None:
        raise CaptureError(f"cannot find the {n} transformer blocks of {type(model).__name__}")
    return best


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def _replace_first(out, new):
    return (new, *out[1:]) if isinstance(out, tuple) else new


def _weights_loaded(module: nn.Module):
    """A context in which ``module``'s own weights are usable: for a module that ``accelerate`` offloads (a
    ``device_map`` placement that keeps them on the ``meta`` device between calls), they are loaded onto its
    execution device for the context, as accelerate does for the module's own call (which runs after the forward
    pre-hooks that read gates); any other module as it is."""
    hook = getattr(module, "_hf_hook", None)
    if hook is None or not getattr(hook, "offload", False):
        return contextlib.nullcontext()
    from accelerate.utils import align_module_device

    return align_module_device(module)


class HFSeam:
    """The hook sites of a ``transformers`` model (installed by :func:`hf_hooks` while a
    :class:`~sinklab.capture.sites.HookSet` is attached): forward pre-hooks / hooks on every block
    (``resid.pre``, ``block.out``, the recorder's hidden states) and on each block's attention sublayer
    (``attn.out``); the attention sites run inside ``AttentionInterface``'s ``"sinklab_capture"``, to which
    the model is switched only while a hook at an attention site or a recorder is attached."""

    def __init__(self, model: nn.Module, state: HookSet) -> None:
        self.model, self.state = model, state
        self.layers = find_layers(model)
        self.previous: str | None = None
        self.switched = False
        self.attention = [has_attention(b) for b in self.layers]
        self.handles = []
        reader = gate_reader(model.config)  # a gated type (sinklab.capture.gates): its attention's output gate
        try:
            for i, block in enumerate(self.layers):
                self.handles.append(block.register_forward_pre_hook(self._pre(i), with_kwargs=True))
                self.handles.append(block.register_forward_hook(self._post(i)))
                attn = attention_module(block)
                if attn is not None:
                    self.handles.append(attn.register_forward_hook(self._attn_out(i)))
                    if reader is not None:
                        self.handles.append(attn.register_forward_pre_hook(self._gate(i, reader), with_kwargs=True))
        except BaseException:
            self.remove()
            raise

    def _pre(self, i: int):
        state = self.state

        def fn(_mod, args, kwargs):
            _current.block = [state, i, False]
            if state.recorder is not None:
                state.recorder.current_block = i
            if not state.at("resid.pre", i):
                return None
            if args:
                new, edited = state.apply("resid.pre", i, args[0])
                return ((new, *args[1:]), kwargs) if edited else None
            new, edited = state.apply("resid.pre", i, kwargs["hidden_states"])
            return (args, {**kwargs, "hidden_states": new}) if edited else None

        return fn

    def _post(self, i: int):
        state = self.state

        def fn(_mod, _inp, out):
            current = getattr(_current, "block", None)
            _current.block = None
            if (current is not None and not current[2] and self.attention[i]
                    and state.wants(ATTENTION_SITES, i) and self.switched):
                raise CaptureError(f"{type(self.model).__name__} does not route attention through transformers' "
                                   f"AttentionInterface: hooks at {', '.join(ATTENTION_SITES)} need that seam")
            h = _first(out)
            h, edited = state.apply("block.out", i, h)
            if state.recorder is not None:
                state.recorder.add_hidden(i, h)
            return _replace_first(out, h) if edited else None

        return fn

    def _gate(self, i: int, reader):
        """The ``attn.gate`` site of a gated type (:mod:`sinklab.capture.gates`): before block i's attention
        module runs, its gate (B, H, T, G) is read from the module's input; hooks see it (read-only) and the
        recorder gets it (:meth:`BatchRecorder.add_gate`)."""
        state = self.state

        def fn(mod, args, kwargs):
            if state.recorder is None and not state.at("attn.gate", i):
                return None
            x = args[0] if args else kwargs["hidden_states"]
            with torch.no_grad(), _weights_loaded(mod):
                g = reader(mod, x)
            if g is None:  # this module has no gate (switched off in its config)
                return None
            if state.apply("attn.gate", i, g)[1]:
                raise InputError(f"a hook edited 'attn.gate' of {type(self.model).__name__}: the gate of a "
                                 "transformers model is read-only (the model computes its own; edit attn.out instead)")
            if state.recorder is not None:
                state.recorder.add_gate(i, g)
            return None

        return fn

    def _attn_out(self, i: int):
        state = self.state

        def fn(_mod, _inp, out):
            h, edited = state.apply("attn.out", i, _first(out))
            return _replace_first(out, h) if edited else None

        return fn

    def refresh(self) -> None:
        """Switch the attention implementation to the seam's exactly while it is needed.

        Raises:
            InputError: a hook at an attention site (or ``attn.out``) names a block without attention (the
                SSM / Mamba blocks of a hybrid model).
        """
        for h in self.state.hooks:
            if h.site in ATTENTION_SITES + ("attn.out",) and isinstance(h.layers, frozenset):
                bad = sorted(i for i in h.layers if not self.attention[i])
                if bad:
                    raise InputError(f"hook at {h.site!r}: blocks {bad} of {type(self.model).__name__} have no "
                                     "attention (SSM / Mamba blocks of a hybrid model)")
        need = self.state.needs_attention
        if need and not self.switched:
            _register()
            self.previous = self.model.config._attn_implementation
            self.model.set_attn_implementation(ATTN_NAME)
            self.switched = True
        elif not need and self.switched:
            self.model.set_attn_implementation(self.previous)
            self.switched = False
        set_capture_active(self.state.recorder is not None)

    def remove(self) -> None:
        """Remove every module hook and restore the attention implementation."""
        _current.block = None
        set_capture_active(False)
        for h in self.handles:
            h.remove()
        self.handles = []
        if self.switched:
            self.model.set_attn_implementation(self.previous)
            self.switched = False


@contextlib.contextmanager
def hf_hooks(model: nn.Module, hooks=(), *, recorder: BatchRecorder | None = None,
             collector: str = "eager") -> Iterator[HookSet]:
    """Context manager: ``hooks`` (:class:`~sinklab.capture.sites.Hook`) and ``recorder`` attached to the
    ``transformers`` model ``model`` (see :class:`HFSeam`); everything removed on exit, also on errors.
    ``collector``: the recorder's attention collector (:data:`~sinklab.capture.COLLECTORS`; layers whose
    weights are hooked use ``eager``).

    Raises:
        InputError: bad hooks. CaptureError: no block list found; a second recorder.
    """
    with attached(model, model.config.num_hidden_layers, "hf", hooks, lambda state: HFSeam(model, state),
                  recorder=recorder) as state:
        if recorder is not None:
            state.collector = collector
        yield state


@contextlib.contextmanager
def capturing(
    model: nn.Module,
    recorder: BatchRecorder,
    collector: str = "eager",
    *,
    edit: AttentionEdit | None = None,
    hidden_edit: HiddenEdit | None = None,
) -> Iterator[BatchRecorder]:
    """Within the block, forward passes of ``model`` record into ``recorder``.

    ``edit`` (see :data:`AttentionEdit`) changes or inspects every layer's attention weights
    (the eager collector is then used); ``hidden_edit`` (see :data:`HiddenEdit`) may replace
    each block's output before it is recorded and passed on. Both run as hooks
    (:func:`~sinklab.capture.sites.legacy_hooks`), after any hooks already attached to the model. The model is restored
    exactly (attention implementation, hooks) on exit.

    Raises:
        UnknownNameError: unknown collector name.
    """
    COLLECTORS.get(collector)
    for i, layer in enumerate(find_layers(model)):
        if not has_attention(layer):
            recorder.block_types[i] = type(layer).__name__
    with hf_hooks(model, legacy_hooks(edit, hidden_edit), recorder=recorder, collector=collector):
        yield recorder


def forward_hf(
    model: nn.Module,
    input_ids: torch.Tensor,
    collector: str,
    *,
    edit: AttentionEdit | None = None,
    hidden_edit: HiddenEdit | None = None,
    logits: bool = False,
    keep_hidden: bool = False,
    entropy: bool = False,
) -> BatchRecorder:
    """One forward pass of ``input_ids`` (B, T) with statistics recorded.

    Falls back to ``output_attentions=True`` (eager, all layers at once) when the
    model does not route attention through ``AttentionInterface``, noting it.
    ``edit``/``hidden_edit``: interventions, see :func:`capturing`. ``logits``: run the LM
    head too and keep ``recorder.logits`` (B, T, V). ``keep_hidden``: keep every block's
    output in ``recorder.full_hidden``. ``entropy``: record each head's mean attention entropy
    (:attr:`ProbeStats.attention_entropy`).

    Raises:
        CaptureError: the model exposes no attention weights at all, or an ``edit`` was
            given for a model whose attention does not go through ``AttentionInterface``.
    """
    L = model.config.num_hidden_layers
    recorder = BatchRecorder(L, collector, keep_hidden=keep_hidden, entropy=entropy)
    # The backbone alone (no LM head) unless logits are asked for: the statistics never need
    # them, and the head is a large matmul over the vocabulary.
    runner = model if logits else getattr(model, "base_model", model)
    with capturing(model, recorder, collector, edit=edit, hidden_edit=hidden_edit), torch.no_grad():
        out = runner(input_ids=input_ids, use_cache=False)
    if recorder.attn_calls == L - len(recorder.block_types) and recorder.attn_calls > 0:
        if logits:
            recorder.logits = out.logits
        return recorder
    if edit is not None or hidden_edit is not None or logits or keep_hidden:
        raise CaptureError(f"{type(model).__name__} does not route attention through transformers' "
                           "AttentionInterface: interventions and analyses need that seam")
    # Fallback: the model's code does not use the AttentionInterface.
    recorder = BatchRecorder(L, "output_attentions", entropy=entropy)
    recorder.notes.append("attention not interceptable: fell back to eager output_attentions")
    warnings.warn(
        f"{type(model).__name__} does not route attention through transformers' AttentionInterface: "
        "falling back to eager output_attentions (every layer's T x T attention at once)",
        stacklevel=2,
    )
    previous = model.config._attn_implementation
    try:
        try:
            model.set_attn_implementation("eager")
        except (ValueError, ImportError):
            pass
        with hf_hooks(model, [Hook("block.out", lambda h, ctx: recorder.add_hidden(ctx.layer, h))]), torch.no_grad():
            out = model(input_ids=input_ids, output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(previous)
    attns = getattr(out, "attentions", None)
    if not attns or any(a is None for a in attns):
        raise CaptureError(f"{type(model).__name__} exposes no attention weights; cannot measure sinks")
    # causal or bidirectional is read off the mask the model applied, not off its class name: a causal
    # mask leaves every weight above the diagonal exactly 0 (GPT2Model is causal although its config
    # says is_decoder=False; an encoder attends both ways)
    causal = all(bool((a.triu(diagonal=1) == 0).all()) for a in attns)
    windows = fallback_windows(model.config, len(attns))
    for i, a in enumerate(attns):
        spec = MaskSpec(causal=causal, window=windows[i])
        check_fallback_mask(type(model).__name__, i, a, spec)
        recorder.add_attention(i, a.sum(dim=-2, dtype=torch.float64), spec,
                               entropy=attention_entropy(a) if entropy else None)
    return recorder


def fallback_windows(config, n_layers: int) -> list[int | None]:
    """The sliding window of each layer of a model measured through ``output_attentions`` (keys ``j`` with
    ``|i - j| < window`` visible to query ``i``; None: every key its causal or bidirectional mask allows), read off
    the config: GPT-Neo's ``attention_layers`` ("local" layers see ``window_size`` keys, the query's own
    included). Other models: None for every layer (:func:`check_fallback_mask` refuses one whose weights show a
    narrower mask)."""
    kinds = getattr(config, "attention_layers", None)
    window = getattr(config, "window_size", None)
    if getattr(config, "model_type", None) == "gpt_neo" and kinds and window:
        return [int(window) if kinds[i] == "local" else None for i in range(n_layers)]
    return [None] * n_layers


def check_fallback_mask(model_name: str, layer: int, a: torch.Tensor, spec: MaskSpec) -> None:
    """Refuse a layer whose ``output_attentions`` weights ``a`` (B, H, T, T) hide a key that ``spec`` says the last
    query sees: the farthest visible key (key 0 for a causal layer, the window's first key for a windowed one) has
    weight exactly 0 in every head and row, so the model masks keys sinklab's mask does not know (a sliding window
    it does not declare), and the mask-aware rates (``sink_rate_visible``) would divide by queries that never saw
    the key.

    Raises:
        CaptureError: naming the model and the layer.
    """
    T = a.shape[-1]
    if T < 2 or a.shape[-2] != T:
        return
    j = 0 if spec.window is None else max(0, T - spec.window)
    if bool((a[..., T - 1, j] == 0).all()):
        raise CaptureError(f"{model_name} layer {layer}: the last query gives key {j} weight exactly 0 in every head "
                           "although its mask lets it see that key; the model masks keys (a sliding window?) that "
                           "sinklab cannot read off its config, so its mask-aware numbers would be wrong")
