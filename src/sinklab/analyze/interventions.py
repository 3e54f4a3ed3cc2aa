"""The interventions of ``sinklab analyze intervene``, one small class each, registered by name.

Every intervention is an :class:`Intervention` subclass registered in :data:`INTERVENTIONS` (the same
:class:`~sinklab.registry.Registry` as the attention operations of :mod:`sinklab.nn.ops`). A subclass
changes one thing of a forward pass and nothing else:

* :meth:`Intervention.inputs` -- the token ids fed (drop or replace the first token);
* :meth:`Intervention.attention` -- an edit of the (B, H, T_q, T_k) attention weights of one layer (run as
  an ``attn.weights`` hook, :mod:`sinklab.hooks`; :data:`sinklab.capture.hf.AttentionEdit`);
* :meth:`Intervention.hidden` -- an edit of the (B, T, d) output of one block (a ``block.out`` hook;
  :data:`sinklab.capture.hf.HiddenEdit`);
* :meth:`Intervention.hooks` -- hooks at any other site (:class:`sinklab.hooks.Hook`, e.g. ``attn.key`` or
  ``resid.pre``) attached around the pass;
* :meth:`Intervention.context` -- a temporary change of the weights (the position swap).

:meth:`Intervention.apply` runs the pass with those changes: the hooks are attached with
:func:`sinklab.hooks.hooked`, the one mechanism every edit of a forward pass goes through. What each acts on (the sink position, the
layers, the massive dimensions...) is fixed once from the unedited pass and given as a :class:`Target`.
Positions, layers, heads and dimensions are 0-based (position 0 is the paper's token 1).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
from torch import Tensor, nn

from sinklab.capture.adapter import adapt
from sinklab.errors import InputError
from sinklab.hooks import Hook, hooked
from sinklab.metrics import sink_rate
from sinklab.registry import Registry


def remove_key(weights: Tensor, position: int) -> Tensor:
    """Attention weights with key ``position`` removed and each row renormalised to its old total.

    Args:
        weights: (B, H, T_q, T_k) attention weights. position: 0-based key index.

    Returns:
        (B, H, T_q, T_k): rows that gave key ``position`` weight 0, and rows that gave it all their
        weight (nothing left to renormalise, e.g. query 0 attending only to itself), are returned
        exactly as they were; other rows get 0 on the key and the rest scaled by
        ``row_total / (row_total - removed)``.

    Raises:
        InputError: ``position`` outside [0, T_k).
    """
    if not 0 <= position < weights.shape[-1]:
        raise InputError(f"position {position} is outside the {weights.shape[-1]} keys")
    removed = weights[..., position : position + 1]  # (B, H, T_q, 1)
    new = weights.clone()
    new[..., position] = 0
    # the rest summed directly, in float64: ``total - removed`` cancels when the key holds nearly all of a
    # row's weight (a strong sink), and in float32 left rows at 0 (unedited) or 10% off
    total = weights.sum(dim=-1, keepdim=True, dtype=torch.float64)
    rest = new.sum(dim=-1, keepdim=True, dtype=torch.float64)
    act = (removed != 0) & (rest > 0)
    scale = total / torch.where(act, rest, torch.ones_like(rest))  # (B, H, T_q, 1) float64
    new = (new.to(torch.float64) * scale).to(weights.dtype)
    return torch.where(act, new, weights)


def position_table(model: nn.Module) -> nn.Embedding:
    """The learned absolute position-embedding table of ``model`` (rows = 0-based positions).

    Raises:
        InputError: the model has none (rotary, ALiBi, relative or no positions): says which.
    """
    return adapt(model).position_table()


@contextlib.contextmanager
def swapped_positions(model: nn.Module, t: int, *, swap: bool = True):
    """Within the block, position 0 uses the embedding of position ``t`` and (``swap``) ``t`` that of 0;
    with ``swap=False`` only position 0 is replaced. Restored exactly on exit.

    Raises:
        InputError: no learned position table (see :func:`position_table`), or ``t`` outside [1, table size).
    """
    adapter = adapt(model)
    table, o = adapter.position_table(), adapter.position_offset()  # position p reads row o + p (OPT, RoBERTa: 2)
    n = table.weight.shape[0] - o
    if not 1 <= t < n:
        raise InputError(f"position {t} is outside the position table (1 to {n - 1})")
    saved = table.weight.data.clone()
    try:
        with torch.no_grad():
            table.weight[o] = saved[o + t]
            if swap:
                table.weight[o + t] = saved[o]
        yield
    finally:
        with torch.no_grad():
            table.weight.copy_(saved)


@dataclass
class Target:
    """What the interventions act on, fixed from the unedited pass.

    Attributes:
        position: the sink position p (0-based). layers: 0-based layers of ``remove-sink``.
        num_layers: L, the model's layer count (to say "all layers").
        massive_layer, dims: the block whose output the ``massive-*`` edits change and the hidden
            dimensions they set (None when no ``massive-*`` intervention runs).
        sample_mean: (len(dims),) the sink token's mean value of ``dims`` over the samples at the output
            of ``massive_layer`` (``massive-samplemean``), or None.
        token: the replacement first token of ``replace-first`` (None: random per sample).
        vocab: ``replace-first``'s random tokens are drawn from [0, vocab). seed: seed of that draw.
        swap_to: t of the position swap (0-based).
    """

    position: int
    layers: list[int] = field(default_factory=list)
    num_layers: int = 0
    massive_layer: int | None = None
    dims: list[int] | None = None
    sample_mean: Tensor | None = None
    token: int | None = None
    vocab: int = 0
    seed: int = 0
    swap_to: int = 4


#: ``run(ids, *, edit, hidden_edit, first_dropped)``: one forward pass with the readout, as
#: :func:`sinklab.analyze.common.run_model` (``edit`` / ``hidden_edit`` run as ``attn.weights`` / ``block.out``
#: hooks; ``first_dropped``: the first token of the window is gone)
PassRunner = Callable[..., "object"]


class Intervention:
    """One change to a forward pass, read out by ``analyze intervene``.

    Subclasses set ``name`` (the registry's) and override any of :meth:`inputs`, :meth:`attention`,
    :meth:`hidden`, :meth:`hooks`, :meth:`context`; an override of :meth:`attention` or :meth:`hidden` becomes
    a hook, the base methods do not (so an intervention without an attention edit runs the
    pass without one). ``needs_lm``: needs a language-modelling head; ``needs_learned_positions``: needs a
    learned absolute position table; ``needs_massive``: needs :attr:`Target.massive_layer` / ``dims`` /
    ``sample_mean``; ``drops_first``: the sequence fed lacks the window's first token.
    """

    name: ClassVar[str] = ""
    needs_lm: ClassVar[bool] = False
    needs_learned_positions: ClassVar[bool] = False
    needs_massive: ClassVar[bool] = False
    drops_first: ClassVar[bool] = False

    def __init__(self, target: Target) -> None:
        self.target = target

    def inputs(self, ids: Tensor) -> Tensor:
        """The (N, T') int64 token ids fed for the (N, T) window ``ids`` (default: unchanged)."""
        return ids

    def attention(self, layer: int, weights: Tensor, **_) -> Tensor | None:
        """The attention edit: (B, H, T_q, T_k) weights of 0-based ``layer`` -> new weights or None (unchanged).
        Keyword arguments ``query``, ``key``, ``value`` as :data:`sinklab.capture.hf.AttentionEdit` says."""
        return None

    def hidden(self, layer: int, h: Tensor) -> Tensor | None:
        """The block-output edit: (B, T, d) output of 0-based block ``layer`` -> new output or None (unchanged)."""
        return None

    def context(self, model: nn.Module):
        """A context within which the pass runs (default: nothing changes)."""
        return contextlib.nullcontext()

    def note(self) -> str:
        """One line saying what was changed (the ``note`` column of the table)."""
        return ""

    def describe(self, res, eps: float) -> dict:
        """The row's ``note`` and any extra columns, from the edited pass ``res`` and the sink threshold."""
        return {"note": self.note()}

    def hooks(self) -> list[Hook]:
        """Hooks at any other site (:class:`sinklab.hooks.Hook`) attached around the pass (default: none).
        :meth:`attention` and :meth:`hidden` need no hook of their own: the runner attaches them at
        ``attn.weights`` and ``block.out`` (:func:`sinklab.capture.sites.legacy_hooks`)."""
        return []

    def apply(self, model: nn.Module, ids: Tensor, run: PassRunner):
        """Run the edited pass on the (N, T) window ``ids`` with ``run`` (see :data:`PassRunner`): inside
        :meth:`context`, with :meth:`hooks` attached (:func:`sinklab.hooks.hooked`), and the overridden
        :meth:`attention` / :meth:`hidden` passed as the runner's ``edit`` / ``hidden_edit``, which the capture
        seam runs as ``attn.weights`` / ``block.out`` hooks after those: one mechanism for every edit."""
        cls = type(self)
        edit = self.attention if cls.attention is not Intervention.attention else None
        hidden_edit = self.hidden if cls.hidden is not Intervention.hidden else None
        more = self.hooks()
        with self.context(model), (hooked(model, more) if more else contextlib.nullcontext()):
            return run(self.inputs(ids), edit=edit, hidden_edit=hidden_edit, first_dropped=self.drops_first)


#: every intervention by name, in the order ``analyze intervene`` runs and lists them
INTERVENTIONS: Registry[type[Intervention]] = Registry("intervention")


def register(name: str):
    """Class decorator: register an :class:`Intervention` under ``name`` (description = docstring's first line)."""
    def add(cls: type[Intervention]) -> type[Intervention]:
        cls.name = name
        return INTERVENTIONS.register(name)(cls)

    return add


@register("noop")
class NoOp(Intervention):
    """The identity attention edit ``A' = A``: must give the baseline exactly (a check of the seam)."""

    def attention(self, layer, weights, **_):
        return weights

    def note(self) -> str:
        return "identity attention edit: must equal baseline exactly"


@register("remove-sink")
class RemoveSink(Intervention):
    """Attention to the sink position p removed and each row renormalised (:func:`remove_key`).

    ``A'[i, j] = A[i, j] * S_i / (S_i - A[i, p])`` for j != p and ``A'[i, p] = 0``, with ``S_i = sum_j A[i, j]``
    (rows that gave p nothing or everything unchanged), in ``target.layers``; the "remove the sink"
    ablation of Gu et al. 2025 (*When attention sink emerges*) and Barbero et al. 2025.
    """

    def attention(self, layer, weights, **_):
        return remove_key(weights, self.target.position) if layer in self.target.layers else None

    def note(self) -> str:
        t = self.target
        chosen = set(t.layers)
        return (f"attention to position {t.position} removed and rows renormalised in layers "
                f"{'all' if len(chosen) == t.num_layers else sorted(chosen)}")


class MassiveAblation(Intervention):
    """Set the massive dimensions ``dims`` of the sink token p at the output of block ``massive_layer`` to
    :meth:`value` (Sun et al. 2024, *Massive activations in large language models*, Sec. 3)."""

    what: ClassVar[str] = ""
    needs_massive = True

    def value(self, h: Tensor, idx: Tensor) -> Tensor:
        """(B, len(dims)) values written into ``h[:, p, dims]`` for the (B, T, d) block output ``h``."""
        raise NotImplementedError

    def hidden(self, layer, h):
        t = self.target
        if layer != t.massive_layer:
            return None
        idx = torch.tensor(t.dims, device=h.device)
        h = h.clone()
        h[:, t.position, idx] = self.value(h, idx)
        return h

    def note(self) -> str:
        t = self.target
        return f"dims {t.dims} of position {t.position} set to {self.what} at the output of layer {t.massive_layer}"


@register("massive-zero")
class MassiveZero(MassiveAblation):
    """``h'[n, p, d] = 0`` for d in dims at the massive layer (Sun et al. 2024's zero ablation)."""

    what = "0"

    def value(self, h, idx):
        return torch.zeros((), dtype=h.dtype, device=h.device)


@register("massive-mean")
class MassiveMean(MassiveAblation):
    """``h'[n, p, d] = mean_{j != p} h[n, j, d]``: the mean over the sample's other tokens."""

    what = "their mean over the other tokens of the sample"

    def value(self, h, idx):
        others = torch.ones(h.shape[1], dtype=torch.bool, device=h.device)
        others[self.target.position] = False
        return h[:, others][:, :, idx].mean(dim=1)


@register("massive-samplemean")
class MassiveSampleMean(MassiveAblation):
    """``h'[n, p, d] = mean_m h[m, p, d]`` (over the samples m of the unedited pass): the sink token's own
    mean value, Sun et al. 2024's "mean" ablation."""

    what = "the sink token's own mean value over the samples"

    def value(self, h, idx):
        return self.target.sample_mean.to(h.device, h.dtype)


@register("drop-first")
class DropFirst(Intervention):
    """The window without its first token, ``x' = x[1:]``; the loss over the same targets."""

    needs_lm = True
    drops_first = True

    def inputs(self, ids):
        return ids[:, 1:]

    def note(self) -> str:
        return "first token removed; loss over the same targets"


@register("replace-first")
class ReplaceFirst(Intervention):
    """``x'[0] = token`` (or a random token per sample, seeded), the rest of the window unchanged."""

    needs_lm = True

    def inputs(self, ids):
        t = self.target
        new = ids.clone()
        if t.token is None:
            g = torch.Generator().manual_seed(t.seed)
            new[:, 0] = torch.randint(0, t.vocab, (ids.shape[0],), generator=g)
        else:
            new[:, 0] = t.token
        return new

    def note(self) -> str:
        what = "a random token per sample (seeded)" if self.target.token is None else f"token {self.target.token}"
        return f"first token replaced by {what}"


@register("position-replace")
class PositionReplace(Intervention):
    """Position 0 given the learned position embedding of position t: ``P'[0] = P[t]`` (Gu et al. 2025's
    GPT2-XL experiment; :func:`swapped_positions` with ``swap=False``)."""

    needs_learned_positions = True
    swap: ClassVar[bool] = False

    def context(self, model):
        return swapped_positions(model, self.target.swap_to, swap=self.swap)

    def describe(self, res, eps: float) -> dict:
        t = self.target.swap_to
        r = sink_rate(res.stats.visible_mass, eps)
        what = f"positions 0 and {t} swapped" if self.swap else f"position 0 given the embedding of position {t}"
        return {"note": what + f"; Sink at 0: {float(r[0]):.2f}%, at {t}: {float(r[t]):.2f}%",
                "sink_rate_swap_to": float(r[t])}


@register("position-swap")
class PositionSwap(PositionReplace):
    """Positions 0 and t swap their learned position embeddings: ``P'[0] = P[t]``, ``P'[t] = P[0]``."""

    swap = True


__all__ = ["INTERVENTIONS", "Intervention", "Target", "register", "remove_key", "position_table", "swapped_positions"]
