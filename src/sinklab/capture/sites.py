"""Named hook sites: the one mechanism through which a forward pass is read or edited.

A :class:`Hook` names a site (:data:`SITES`), a function and the layers it applies to. While hooks are
attached to a model (:func:`attached`, which the seams of :mod:`sinklab.capture.hf` and
:mod:`sinklab.capture.native` call; the public entry point is :func:`sinklab.hooks.hooked`) each
forward pass calls, at every selected site of every selected layer,
``fn(x, ctx) -> Tensor | None`` with the site's tensor ``x`` and a :class:`HookContext`; a returned
tensor (same shape) replaces ``x`` for the rest of the pass (an edit), None leaves it (a read).
Several hooks on one site run in registration order, each seeing the previous one's result. The
capture seam's recorder (:class:`~sinklab.capture.recorder.BatchRecorder`) reads the same sites after
the hooks, so statistics describe the edited pass.

Layers and positions are 0-based.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from torch import Tensor

from sinklab.attention_masks import repeat_kv
from sinklab.errors import CaptureError, InputError

#: The hook sites (public API: renaming one breaks users' code; ``tests/test_hooks.py`` lists them).
#: Shapes: B sequences, T tokens (T_q queries, T_k keys: T_k > T_q when decoding with a cache),
#: d model width, H query heads, H_kv key/value heads (grouped-query heads *not* repeated), D head width.
SITES: dict[str, str] = {
    "resid.pre": "(B, T, d) the residual stream entering block l (= output_hidden_states[l]); an edit replaces "
                 "the block's input",
    "attn.query": "(B, H, T_q, D) the queries of layer l after positions (RoPE) and query norms",
    "attn.key": "(B, H_kv, T_k, D) the keys of layer l after positions (RoPE) and key norms",
    "attn.value": "(B, H_kv, T_k, D) the values of layer l",
    "attn.weights": "(B, H, T_q, T_k) float32 attention weights of layer l after normalisation (softmax); an "
                    "edit replaces them and the layer's output is recomputed from the new weights",
    "attn.gate": "(B, H, T_q, G) the output gate of layer l in gated models: the factor each head's attention "
                 "output is multiplied by (after the sigmoid; G = 1 head-wise, G = D element-wise); sinklab's gated "
                 "operations and the transformers types of sinklab.capture.gates (read-only there); never called "
                 "in a layer without a gate",
    "attn.out": "(B, T, d) the output of block l's attention sublayer: after the output projection, before the "
                "residual add (BERT's BertAttention module includes its residual add and LayerNorm)",
    "block.out": "(B, T, d) the output of block l, before any final norm (= output_hidden_states[l + 1], except "
                 "for the last block of models whose last hidden state is taken after the final norm, as "
                 "transformers' LLaMA)",
}
#: sites computed inside the attention function (a model must route attention through the seam)
ATTENTION_SITES = ("attn.query", "attn.key", "attn.value", "attn.weights")

#: which layers a hook applies to: None (all), an int, an iterable of ints, or a predicate ``layer -> bool``
Layers = "None | int | Iterable[int] | Callable[[int], bool]"


@dataclass(frozen=True)
class HookContext:
    """What a hook function gets besides the tensor.

    Attributes:
        site: the site name (:data:`SITES`). layer: 0-based block index.
        kind: the model kind, ``"hf"`` (transformers) or ``"sinklab"`` (:class:`~sinklab.nn.SinkLM`).
        query, key, value: at ``attn.weights`` only, the layer's (B, H, T_q, D) queries and (B, H_kv, T_k, D)
            keys and values after positions (grouped-query heads not repeated); None at other sites.
        renormalised: at ``attn.weights`` of a SinkLM whose operation's rows do not sum to 1 (sigmoid,
            ReLU, kernels...): the weights were renormalised to rows summing to 1 (an edit is given back in
            the same normalisation); False otherwise.
        mask: at ``attn.weights`` only, a bool tensor broadcastable to the weights (B, H, T_q, T_k), True where
            the layer's own mask lets query i see key j (0-based; causal, sliding window, chunks, prefix,
            documents, padding as the layer applies them); None at other sites.
    """

    site: str
    layer: int
    kind: str
    query: Tensor | None = None
    key: Tensor | None = None
    value: Tensor | None = None
    renormalised: bool = False
    mask: Tensor | None = None


@dataclass(frozen=True)
class Hook:
    """A function at a named site of selected layers.

    Args:
        site: a name of :data:`SITES`.
        fn: ``fn(x, ctx: HookContext) -> Tensor | None``: return a tensor of ``x``'s shape to replace ``x``
            (an edit, cast to ``x``'s dtype), or None to leave it (a read).
        layers: None (every layer), an int, an iterable of ints (0-based), or a predicate ``layer -> bool``.

    Raises:
        InputError: unknown site (the message lists :data:`SITES`), ``fn`` not callable, or ``layers``
            of another type or holding a negative index.
    """

    site: str
    fn: Callable = field(repr=False)
    layers: object = None

    def __post_init__(self) -> None:
        if self.site not in SITES:
            raise InputError(f"unknown hook site {self.site!r}; the sites are: {', '.join(SITES)}")
        if not callable(self.fn):
            raise InputError(f"a hook's fn must be callable, got {type(self.fn).__name__}")
        layers = self.layers
        if layers is None or callable(layers):
            return
        if isinstance(layers, bool):
            raise InputError("hook layers must be None, an int, a list of ints or a predicate, got a bool")
        if isinstance(layers, int):
            layers = (layers,)
        try:
            layers = tuple(layers)
        except TypeError:
            raise InputError(f"hook layers must be None, an int, a list of ints or a predicate, got "
                             f"{type(self.layers).__name__}") from None
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers):
            raise InputError(f"hook layers must be 0-based non-negative ints, got {list(layers)}")
        object.__setattr__(self, "layers", frozenset(layers))

    def selects(self, layer: int) -> bool:
        """Whether the hook applies to 0-based ``layer``."""
        if self.layers is None:
            return True
        if isinstance(self.layers, frozenset):
            return layer in self.layers
        return bool(self.layers(layer))

    def check(self, n_layers: int) -> None:
        """Raises InputError when an explicit layer lies outside [0, n_layers)."""
        if isinstance(self.layers, frozenset):
            bad = sorted(i for i in self.layers if i >= n_layers)
            if bad:
                raise InputError(f"hook at {self.site!r}: layers {bad} outside the model's {n_layers} layers (0-based)")


class HookSet:
    """The hooks attached to one model, in registration order, and the capture's recorder if one runs.

    Attributes:
        n_layers: the model's block count. kind: ``"hf"`` or ``"sinklab"``.
        recorder: the :class:`~sinklab.capture.recorder.BatchRecorder` of a running capture, or None.
        seam: the seam's installation (set by the installer; its ``refresh()`` is called on every change).
    """

    def __init__(self, n_layers: int, kind: str) -> None:
        self.n_layers = n_layers
        self.kind = kind
        self.hooks: list[Hook] = []
        self.recorder = None
        #: the recorder's attention collector name (HF seam; layers whose weights are hooked use ``eager``)
        self.collector = "eager"
        self.users = 0
        self.seam = None
        self._by_site: dict[str, list[Hook]] = {}

    def _index(self) -> None:
        self._by_site = {}
        for h in self.hooks:
            self._by_site.setdefault(h.site, []).append(h)

    def add(self, hooks: Iterable[Hook]) -> list[Hook]:
        """Append ``hooks`` (checked against the layer count); returns them."""
        new = list(hooks)
        for h in new:
            if not isinstance(h, Hook):
                raise InputError(f"expected sinklab.hooks.Hook objects, got {type(h).__name__}")
            h.check(self.n_layers)
        self.hooks.extend(new)
        self._index()
        return new

    def remove(self, hooks: list[Hook]) -> None:
        """Remove one registration of each of these hook objects (by identity), the latest one: a hook object
        attached again in a nested block stays attached for the outer block when the inner one exits."""
        for h in hooks:
            for i in range(len(self.hooks) - 1, -1, -1):
                if self.hooks[i] is h:
                    del self.hooks[i]
                    break
        self._index()

    def at(self, site: str, layer: int) -> list[Hook]:
        """The hooks at ``site`` that select ``layer``, in registration order."""
        hs = self._by_site.get(site)
        return [h for h in hs if h.selects(layer)] if hs else []

    def has(self, site: str) -> bool:
        """Whether any hook is at ``site`` (whatever its layers)."""
        return site in self._by_site

    def wants(self, sites: Iterable[str], layer: int) -> bool:
        """Whether a hook at one of ``sites`` selects ``layer``."""
        return any(self.at(s, layer) for s in sites)

    @property
    def needs_attention(self) -> bool:
        """Whether the attention function must be intercepted: a hook at an attention site, or a recorder."""
        return self.recorder is not None or any(s in self._by_site for s in ATTENTION_SITES)

    def apply(self, site: str, layer: int, x: Tensor, **info) -> tuple[Tensor, bool]:
        """Run the hooks at ``site`` of ``layer`` on ``x`` in order; returns ``(x', edited)``.

        Raises:
            InputError: a hook returned something other than None or a tensor of ``x``'s shape.
        """
        hooks = self.at(site, layer)
        if not hooks:
            return x, False
        ctx = HookContext(site, layer, self.kind, **info)
        edited = False
        for h in hooks:
            new = h.fn(x, ctx)
            if new is None:
                continue
            if not isinstance(new, Tensor) or new.shape != x.shape:
                got = tuple(new.shape) if isinstance(new, Tensor) else type(new).__name__
                raise InputError(f"a hook at {site!r} layer {layer} returned {got}; an edit must be a tensor of "
                                 f"the site's shape {tuple(x.shape)} (or None to leave it)")
            x = new.to(x.dtype)
            edited = True
        return x, edited


def legacy_hooks(edit: Callable | None = None, hidden_edit: Callable | None = None) -> list[Hook]:
    """The hooks that run an :data:`~sinklab.capture.hf.AttentionEdit` (at ``attn.weights``, every layer, keys and values
    repeated to the H query heads as that protocol says) and a :data:`~sinklab.capture.hf.HiddenEdit` (at ``block.out``)."""
    out = []
    if edit is not None:
        def weights(w, ctx):
            n_rep = ctx.query.shape[1] // ctx.key.shape[1]
            return edit(ctx.layer, w, query=ctx.query, key=repeat_kv(ctx.key, n_rep), value=repeat_kv(ctx.value, n_rep),
                        mask=ctx.mask)

        out.append(Hook("attn.weights", weights))
    if hidden_edit is not None:
        out.append(Hook("block.out", lambda h, ctx: hidden_edit(ctx.layer, h)))
    return out


_ATTR = "_sinklab_hookset"


def hookset_of(model) -> HookSet | None:
    """The :class:`HookSet` attached to ``model`` (None when nothing is attached)."""
    return model.__dict__.get(_ATTR)


class attached:
    """Context manager: attach ``hooks`` (and ``recorder``) to ``model`` for the block.

    The first attachment to a model calls ``install(hookset)``, which installs the seam's module hooks
    and returns an object with ``refresh()`` (called after every change) and ``remove()`` (called when
    the last attachment ends); nested attachments share the set, their hooks running after the outer
    ones. Everything is removed on exit, also on an exception.

    Raises:
        InputError: bad hooks (see :class:`Hook`, :meth:`HookSet.add`).
        CaptureError: a second recorder on a model that already records.
    """

    def __init__(self, model, n_layers: int, kind: str, hooks: Iterable[Hook], install: Callable, *,
                 recorder=None) -> None:
        self.model, self.n_layers, self.kind, self.install = model, n_layers, kind, install
        self.hooks, self.recorder = list(hooks), recorder

    def __enter__(self) -> HookSet:
        state = hookset_of(self.model)
        fresh = state is None
        if fresh:
            state = HookSet(self.n_layers, self.kind)
        if self.recorder is not None and state.recorder is not None:
            raise CaptureError("a capture is already recording this model")
        self.added = state.add(self.hooks)
        if fresh:
            state.seam = self.install(state)
            self.model.__dict__[_ATTR] = state
        state.users += 1
        if self.recorder is not None:
            state.recorder = self.recorder
        self.state = state
        try:
            state.seam.refresh()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return state

    def __exit__(self, *exc) -> None:
        state = self.state
        state.remove(self.added)
        if self.recorder is not None:
            state.recorder = None
        state.users -= 1
        if state.users == 0:
            self.model.__dict__.pop(_ATTR, None)
            state.seam.remove()
        else:
            state.seam.refresh()


__all__ = ["SITES", "ATTENTION_SITES", "Hook", "HookContext", "HookSet", "attached", "hookset_of", "legacy_hooks"]
