"""Attention operations: how the logits ``s_ij = q_i . k_j / sqrt(d_h)`` become weights.

Every operation is one small :class:`AttentionOp` subclass registered by name in
:data:`ATTENTION`. The shared machinery (projections, positions, masks, SDPA fast
path, query-chunked memory-frugal path, observer) lives in
:mod:`sinklab.nn.attention`; an operation only says

* ``normalise(logits, mask, extra)``: weights from a block of logits (the one
  place an operation's formula lives, used by the reference and chunked paths);
* optionally a *virtual key* visible to every query and carrying no position:
  a learned key/value pair (``virtual_kv``: sink token, key/value biases) or a
  fixed or learned logit with a zero value (``virtual_logit``: softmax-off-by-one,
  gpt-oss sink logit);
* optionally a feature map ``phi`` applied to q and k (linear-attention kernels);
* whether SDPA computes it exactly (``sdpa = True``).

Notation (Gu et al., ICLR 2025, Sec. 7 / Table 6): ``v_i' = sum_j sim(phi(q_i),
phi(k_j)) v_j / Z_i`` over visible keys j; positions are 0-based. All weights are
computed in float32.

Names (``sinklab list attention``)::

    softmax              exp(s) / sum exp(s)                            (SDPA)
    softmax_scaled       alpha * softmax, rows sum to alpha (option alpha, default 0.8)   (SDPA)
    softmax_pnorm        exp(s) / (sum exp(s)^p)^(1/p) = softmax(p s)^(1/p) (option p, default 0.5)
    softmax_off_by_one   exp(s) / (1 + sum exp(s)) (Miller 2023): virtual logit 0, value 0   (SDPA)
    sink_logit           exp(s) / (exp(b_h) + sum exp(s)), learned b_h per head (gpt-oss)   (SDPA)
    sink_token           learned token x* (per layer) whose k* = W_k x*, v* = W_v x* are
                         prepended to the keys/values (no query, no position)   (SDPA)
    kv_bias              learned k*, v* per kv head prepended (option shared: one for all heads)   (SDPA)
    k_bias               learned k*, v* = 0 (Gu et al. Table 4 "k bias, v = 0")   (SDPA)
    v_bias               k* = 0 (logit 0), learned v*   (SDPA)
    gated_headwise       softmax, output of each head times sigmoid(x W_g) (one gate per head; Qiu et al. 2025)   (SDPA)
    gated_elementwise    softmax, output times sigmoid(x W_g) elementwise (one gate per head dim)   (SDPA)
    sigmoid              sigmoid(s + b), no normalisation (option bias, default 0)
    sigmoid_logn         sigmoid(s - log n), n = max_seq_len (Ramapuram et al. 2024; option n)
    sigmoid_norm         sigmoid(s) / sum sigmoid(s)
    sigmoid_pnorm        sigmoid(s) / (sum sigmoid(s)^p)^(1/p) (option p, default 2)
    relu                 relu(s), no normalisation
    relu_norm            relu(s) / max(sum relu(s), 1e-6)
    elu1_sim             elu(s)+1, no normalisation (the similarity form of Gu et al.'s code)
    elu1                 (elu(q)+1).(elu(k)+1) / sqrt(d_h), no normalisation (the kernel form)
    elu1_norm            the same / max(row sum, 1e-6) (Katharopoulos et al. 2020 linear attention)
    linear               q.k / sqrt(d_h) (identity kernel), no normalisation
    linear_relu          relu(q).relu(k) / sqrt(d_h), no normalisation
    linear_relu_norm     the same / max(row sum, 1e-6)
    softpick             relu(exp(s) - 1) / (sum |exp(s) - 1| + 1e-6) (Zuhri et al. 2025)

Every operation also takes the option ``gate`` (None, "headwise", "elementwise").
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from sinklab.errors import ConfigError
from sinklab.registry import Registry


class KVProjector(Protocol):
    """What an operation's :meth:`AttentionOp.virtual_kv` needs from its attention layer
    (:class:`sinklab.nn.attention.Attention` is one; ops never import that module)."""

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value (H_kv, d_h) each of one hidden vector x (d,), without positions."""
        ...


@dataclass(frozen=True)
class OpContext:
    """Shapes an operation is built with (from :meth:`ModelConfig.op_context`)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    max_seq_len: int
    init_std: float = 0.02


@dataclass(frozen=True)
class NativeTile:
    """How the fused kernels of :mod:`sinklab.nn.native` compute an operation's tile (bit for bit its
    :meth:`AttentionOp.tile_weights` / :meth:`AttentionOp.tile_grad`).

    family: "elementwise" (:class:`_Elementwise`), "softpick" or "softmax_pnorm" (with its p). For "elementwise":
    kind, the similarity (0 identity: a linear-attention kernel's logits, 1 relu, 2 sigmoid(s + bias),
    3 elu(s) + 1); norm, the row normaliser (0 none, 1 sum, 2 the 2-norm); floor, the normaliser's floor in float32.
    """

    family: str
    kind: int = 0
    norm: int = 0
    bias: float = 0.0
    floor: float = 0.0
    p: float = 1.0


#: name -> :class:`AttentionOp` subclass.
ATTENTION: Registry[type["AttentionOp"]] = Registry("attention operation")

_EPS = 1e-6  # floor of row sums for operations whose sums can reach 0
_LOG2E = 1.0 / math.log(2.0)


class AttentionOp(nn.Module):
    """Base class: plain softmax over the visible keys.

    Class attributes a subclass may change:
        sdpa: SDPA computes this operation exactly (fast path).
        normalised: each row's weights, virtual key included, sum to 1.
        accepts_logit_bias: additive positional biases (ALiBi, T5) make sense (False
            for feature-map kernels, which have no logits).
        gate_default: default of the ``gate`` option.
    """

    sdpa: ClassVar[bool] = True
    normalised: bool = True
    accepts_logit_bias: ClassVar[bool] = True
    gate_default: ClassVar[str | None] = None
    #: implements :meth:`tile_weights` and :meth:`tile_grad` (the chunked path's own autograd)
    has_tile_grad: ClassVar[bool] = False
    #: a logit of -inf gives weight 0 with gradient 0, so the mask can be added to the logits
    mask_as_bias: ClassVar[bool] = True
    #: differential attention: the layer computes two softmax maps from the two halves of every head's
    #: query and key and combines them with :meth:`Differential.combine` (see that class)
    differential: ClassVar[bool] = False

    def __init__(self, ctx: OpContext, *, gate: str | None = "default") -> None:
        super().__init__()
        self.ctx = ctx
        gate = self.gate_default if gate == "default" else gate
        if gate not in (None, "headwise", "elementwise"):
            raise ConfigError(f"attention_options.gate must be null, 'headwise' or 'elementwise', got {gate!r}")
        self.gate = gate
        self.output_scale = 1.0  # factor on the output (softmax_scaled's alpha)

    @classmethod
    def matched_heads(cls, n_heads: int) -> int:
        """Heads this operation is given when compared with a softmax model of ``n_heads`` heads (same ``d_model``)
        in its paper's setting: ``n_heads`` itself for every operation but differential attention
        (:meth:`Differential.matched_heads`). Apply it to ``n_kv_heads`` too under grouped-query attention. Used by
        ``benchmarks/train_throughput.py``'s operation table and the study row that follows the paper's setup.

        Raises:
            ConfigError: ``n_heads`` cannot be matched (differential attention with an odd ``n_heads``).
        """
        return n_heads

    @classmethod
    def option_names(cls) -> set[str]:
        """Names of the ``attention_options`` this operation accepts."""
        names: set[str] = set()
        for klass in cls.__mro__:
            if "__init__" in vars(klass) and issubclass(klass, AttentionOp):
                sig = inspect.signature(klass.__init__)
                names |= {p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}
        return names

    # ------------------------------------------------------------ hooks
    def feature_map(self, x: Tensor) -> Tensor:
        """phi applied to queries and keys (B, H, T, d_h) -> same shape; identity by default."""
        return x

    def virtual_kv(self, attn: KVProjector) -> tuple[Tensor, Tensor] | None:
        """Virtual key and value (H_kv, d_h) each, visible to every query; None if none."""
        return None

    def virtual_logit(self) -> Tensor | None:
        """Logit (H,) of a virtual key whose value is 0; None if none."""
        return None

    def normalise(self, logits: Tensor, mask: Tensor, extra: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Attention weights from logits.

        Args:
            logits: (B, H, C, Tk) float32, ``q.k * scale`` (+ positional bias).
            mask: (C, Tk) bool, True where query i may attend key j. Every row has at
                least one True (the diagonal).
            extra: (B, H, C, 1) float32 logit of the virtual key, or None.

        Returns:
            weights (B, H, C, Tk), zero where masked; weight on the virtual key
            (B, H, C, 1) or None.
        """
        logits = logits.masked_fill(~mask, float("-inf"))
        if extra is None:
            return torch.softmax(logits, dim=-1), None
        w = torch.softmax(torch.cat([extra, logits], dim=-1), dim=-1)  # (B, H, C, 1 + Tk)
        return w[..., 1:], w[..., :1]


    # ------------------------------------------ tile autograd (chunked path)
    def tile_weights(self, scores: Tensor, mask: Tensor) -> tuple[Tensor, Any]:
        """Weights of a tile of logits, for the chunked path's custom autograd function.

        Must equal :meth:`normalise` (without a virtual key). May overwrite ``scores``.

        Args:
            scores: (N, C, Tk) float32 logits, N = batch x heads; where ``mask`` is False
                they are already -inf if :attr:`mask_as_bias`, else arbitrary.
            mask: (C, Tk) bool, True = visible; every row has a visible key.

        Returns:
            weights (N, C, Tk) float32, 0 where masked; ``aux``, whatever
            :meth:`tile_grad` needs besides the weights (row statistics, ...).
        """
        raise NotImplementedError(f"{type(self).__name__} has no tile autograd")

    def native_tile(self) -> NativeTile | None:
        """How :mod:`sinklab.nn.native`'s fused kernels compute this operation's tile, or None (the eager tile
        functions run). An operation that returns one must keep its tile functions' arithmetic as the kernel
        copies it (``tests/test_native_tiles.py`` compares them bit for bit)."""
        return None

    def tile_grad(self, w: Tensor, aux: Any, dw: Tensor, mask: Tensor) -> Tensor:
        """Gradient of the logits from the gradient of the weights, for one tile.

        Args:
            w, aux: what :meth:`tile_weights` returned for the tile (``w`` may be overwritten).
            dw: (N, C, Tk) float32 gradient of the loss w.r.t. the weights (may be overwritten).
            mask: (C, Tk) bool, True = visible.

        Returns:
            (N, C, Tk) float32 gradient w.r.t. the logits, 0 where masked.
        """
        raise NotImplementedError(f"{type(self).__name__} has no tile autograd")


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """sum_j a_ij b_ij over the last axis, keepdim: (..., C, Tk) x 2 -> (..., C, 1)."""
    return (a * b).sum(dim=-1, keepdim=True)  # (5x faster than einsum's batched dot on CPU)


def register(name: str):
    """Class decorator: register an :class:`AttentionOp` under ``name`` (description = docstring's first line)."""
    return ATTENTION.register(name)


# ============================================================ softmax family
@register("softmax")
class Softmax(AttentionOp):
    """Softmax attention exp(s) / sum_j exp(s) (LLaMA default)."""


@register("softmax_scaled")
class SoftmaxScaled(AttentionOp):
    """Scaled normalisation: alpha * softmax(s), rows sum to alpha (Gu et al. Table 14; option alpha)."""

    def __init__(self, ctx: OpContext, *, alpha: float = 0.8, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
            raise ConfigError(f"attention_options.alpha must be a positive finite number, got {alpha!r}")
        self.alpha = float(alpha)
        self.output_scale = self.alpha
        self.normalised = self.alpha == 1.0

    def normalise(self, logits, mask, extra):
        w, _ = super().normalise(logits, mask, None)
        return w * self.alpha, None


@register("softmax_off_by_one")
class SoftmaxOffByOne(AttentionOp):
    """Softmax-off-by-one exp(s) / (1 + sum exp(s)): a virtual key with logit 0 and value 0 (Miller 2023)."""

    def virtual_logit(self) -> Tensor:
        return torch.zeros(self.ctx.n_heads)


@register("sink_logit")
class SinkLogit(AttentionOp):
    """Learned per-head sink logit b_h in the denominator: exp(s) / (exp(b_h) + sum exp(s)) (gpt-oss)."""

    def __init__(self, ctx: OpContext, *, init: float = 0.0, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        self.sink_logit = nn.Parameter(torch.full((ctx.n_heads,), float(init)))  # (H,)

    def virtual_logit(self) -> Tensor:
        return self.sink_logit


@register("sink_token")
class SinkToken(AttentionOp):
    """Learnable sink token x* (per layer): k* = W_k x*, v* = W_v x* prepended to keys/values, no position."""

    def __init__(self, ctx: OpContext, *, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        self.sink_token = nn.Parameter(torch.randn(ctx.d_model) * ctx.init_std)  # (d,)

    def virtual_kv(self, attn: KVProjector) -> tuple[Tensor, Tensor]:
        return attn.project_kv(self.sink_token)  # (H_kv, d_h) each


@register("kv_bias")
class KVBias(AttentionOp):
    """Learned key and value biases k*, v* (per kv head, or shared) prepended as a virtual key (Gu et al. Table 4).

    Options: ``shared`` (one bias for every head, Table 12 right), ``key_dims = d_a`` (the key bias is
    learned in its first d_a dimensions only and 0 in the others, Table 13)."""

    learn_key: ClassVar[bool] = True
    learn_value: ClassVar[bool] = True

    def __init__(self, ctx: OpContext, *, shared: bool = False, key_dims: int | None = None,
                 gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        if not isinstance(shared, bool):
            raise ConfigError(f"attention_options.shared must be true or false, got {shared!r}")
        if key_dims is not None and (isinstance(key_dims, bool) or not isinstance(key_dims, int)
                                     or not 1 <= key_dims <= ctx.head_dim):
            raise ConfigError(f"attention_options.key_dims must be an integer in [1, head_dim = {ctx.head_dim}], "
                              f"got {key_dims!r}")
        if key_dims is not None and not self.learn_key:
            raise ConfigError("attention_options.key_dims needs a learned key bias (kv_bias or k_bias)")
        self.shared = shared
        self.key_dims = key_dims  # Gu et al. Table 13: the key bias is learned in its first d_a dims only, 0 elsewhere
        rows = 1 if shared else ctx.n_kv_heads
        shape = (rows, ctx.head_dim)
        if self.learn_key:
            k_shape = shape if key_dims is None else (rows, key_dims)
            self.k_bias = nn.Parameter(torch.randn(k_shape) * ctx.init_std)  # (H_kv | 1, d_h or d_a)
        else:
            self.register_buffer("k_bias", torch.zeros(shape), persistent=False)
        if self.learn_value:
            self.v_bias = nn.Parameter(torch.randn(shape) * ctx.init_std)  # (H_kv | 1, d_h)
        else:
            self.register_buffer("v_bias", torch.zeros(shape), persistent=False)

    def virtual_kv(self, attn: KVProjector) -> tuple[Tensor, Tensor]:
        Hkv = self.ctx.n_kv_heads
        k = self.k_bias if self.key_dims is None else F.pad(self.k_bias, (0, self.ctx.head_dim - self.key_dims))
        return k.expand(Hkv, -1), self.v_bias.expand(Hkv, -1)  # (H_kv, d_h) each


@register("k_bias")
class KBias(KVBias):
    """Learned key bias k* with value bias fixed at 0 (Gu et al. Table 4: 'k bias, v = 0')."""

    learn_value = False


@register("v_bias")
class VBias(KVBias):
    """Learned value bias v* with key bias fixed at 0 (virtual logit 0)."""

    learn_key = False


@register("gated_headwise")
class GatedHeadwise(AttentionOp):
    """Softmax with a head-wise sigmoid gate on each head's output (Qiu et al. 2025, Qwen)."""

    gate_default = "headwise"


@register("gated_elementwise")
class GatedElementwise(AttentionOp):
    """Softmax with an element-wise sigmoid gate on the head outputs (Qiu et al. 2025, Qwen)."""

    gate_default = "elementwise"


@register("softmax_pnorm")
class SoftmaxPNorm(AttentionOp):
    """p-normalised softmax exp(s) / (sum exp(s)^p)^(1/p) = softmax(p*s)^(1/p) (Gu et al. rebuttal; option p)."""

    sdpa = False

    def __init__(self, ctx: OpContext, *, p: float = 0.5, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        self.p = _positive("p", p)
        self.normalised = self.p == 1.0

    def normalise(self, logits, mask, extra):
        logits = logits.masked_fill(~mask, float("-inf"))
        m = logits.amax(dim=-1, keepdim=True)  # (B, H, C, 1), finite: every row has a visible key
        e = torch.exp(logits - m)  # (B, H, C, Tk)
        if self.p == 1.0:
            return e / e.sum(dim=-1, keepdim=True), None
        z = torch.exp(self.p * (logits - m)).sum(dim=-1, keepdim=True).pow(1.0 / self.p)  # (B, H, C, 1)
        return e / z, None

    has_tile_grad = True

    def native_tile(self) -> NativeTile:
        return NativeTile("softmax_pnorm", p=self.p)

    def tile_weights(self, scores, mask):
        # w = e / N, e = exp(s - m), N = (sum e^p)^(1/p) = Z^(1/p); exp as exp2 (faster on CPU)
        m = scores.amax(dim=-1, keepdim=True)  # (N, C, 1)
        s2 = scores.sub_(m).mul_(_LOG2E)  # (N, C, Tk) base-2 shifted logits, -inf where masked
        ep = torch.mul(s2, self.p).exp2_() if self.p != 1.0 else None  # e^p
        e = s2.exp2_()
        ep = e if ep is None else ep
        z = ep.sum(dim=-1, keepdim=True)  # (N, C, 1)
        return e.div_(z.pow(1.0 / self.p)), (ep, z)

    def tile_grad(self, w, aux, dw, mask):
        # dL/ds_j = w_j dw_j - r w_j^p, r = sum_k dw_k w_k (m cancels; d e_j / d s_j = e_j); w^p = e^p / Z
        ep, z = aux
        r = _row_dot(dw, w)  # (N, C, 1)
        # p = 1: e^p is e, which tile_weights divided in place into w = e / Z = w^p (dividing it by Z again gave the
        # gradient of another function)
        wp = w.mul(r) if self.p == 1.0 else ep.div_(z).mul_(r)
        return dw.mul_(w).sub_(wp)


# ====================================================== element-wise families
class _Elementwise(AttentionOp):
    """sim(s) for an element-wise function of the logit, then a normaliser Z_i."""

    sdpa = False
    normalised = False
    norm: ClassVar[str] = "none"  # "none" | "sum" | "pnorm"
    #: floor of the normaliser Z_i for a similarity whose rows can sum to 0 (ReLU: max(Z, 1e-6)); None for one
    #: whose rows never do (sigmoid > 0): Z is used as it is, only an underflowed 0 is lifted to the dtype's smallest
    #: normal number (a 1e-6 floor turned sigmoid(-16) / Z into sigmoid(-16) / 1e-6 = 0.11 for a lone key)
    z_floor: ClassVar[float | None] = _EPS

    def __init__(self, ctx: OpContext, *, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        self.p = 1.0
        self.normalised = self.norm == "sum"

    def _floor(self, z: Tensor) -> float:
        return self.z_floor if self.z_floor is not None else torch.finfo(z.dtype).tiny

    has_tile_grad = True

    #: the fused kernels' code for :meth:`similarity` (:class:`NativeTile`), None where they do not have it
    native_kind: ClassVar[int | None] = None

    def native_tile(self) -> NativeTile | None:
        norm = {"none": 0, "sum": 1, "pnorm": 2 if self.p == 2.0 else None}[self.norm]
        if self.native_kind is None or norm is None:
            return None
        floor = self.z_floor if self.z_floor is not None else torch.finfo(torch.float32).tiny
        return NativeTile("elementwise", self.native_kind, norm, float(getattr(self, "bias", 0.0)), floor)

    def similarity(self, logits: Tensor) -> Tensor:
        raise NotImplementedError

    def similarity_(self, scores: Tensor) -> Tensor:
        """:meth:`similarity` in place (tile path); masked -inf logits must give 0."""
        raise NotImplementedError

    def similarity_grad(self, g: Tensor, mask: Tensor) -> Tensor:
        """d sim / d s (N, C, Tk) from g = sim(s) (0 where masked); 0 where masked. May overwrite ``g`` (and
        return it): :meth:`tile_grad` no longer needs it, and a pass in place costs about half of one that
        allocates its result (``benchmarks/tile_ops.py``)."""
        raise NotImplementedError

    def tile_weights(self, scores, mask):
        g = self.similarity_(scores)  # (N, C, Tk), 0 where masked
        if not self.mask_as_bias:
            g.masked_fill_(~mask, 0.0)
        if self.norm == "none":
            return g, None
        if self.norm == "sum":
            z = g.sum(dim=-1, keepdim=True)  # (N, C, 1)
        else:
            z = g.pow(self.p).sum(dim=-1, keepdim=True).pow_(1.0 / self.p)  # (N, C, 1), masked g = 0 adds 0
        floor = self._floor(z)
        zc = z.clamp_min(floor)
        return g.div_(zc), (zc, z >= floor)

    def tile_grad(self, w, aux, dw, mask):
        if self.norm == "none":
            return dw.mul_(self.similarity_grad(w, mask))
        zc, active = aux  # (N, C, 1): clamped normaliser, and where the clamp is not in force
        r = _row_dot(dw, w) * active  # (N, C, 1)
        if self.norm == "sum":
            dw.sub_(r)  # dL/dg = (dw - r) / Z
        else:  # dL/dg = (dw - r w^(p-1)) / N
            wp1 = torch.where(w > 0, w, 1.0).pow_(self.p - 1.0).masked_fill_(w <= 0, 0.0) if self.p != 2.0 else w
            dw.sub_(wp1 * r)
        dw.div_(zc)
        return dw.mul_(self.similarity_grad(w.mul_(zc), mask))  # w * Z = g

    def normalise(self, logits, mask, extra):
        w = self.similarity(logits).masked_fill(~mask, 0.0)  # (B, H, C, Tk)
        if self.norm == "sum":
            w = w / w.sum(dim=-1, keepdim=True).clamp_min(self._floor(w))
        elif self.norm == "pnorm":
            wp = torch.where(mask, w, 1.0).pow(self.p).masked_fill(~mask, 0.0)  # no 0^p: finite gradients
            w = w / wp.sum(dim=-1, keepdim=True).pow(1.0 / self.p).clamp_min(self._floor(w))
        return w, None


class _BiasedSigmoid(_Elementwise):
    """sigmoid(s + b) for a fixed bias ``self.bias``, no normalisation."""

    bias: float = 0.0
    native_kind = 2

    def similarity(self, logits):
        return torch.sigmoid(logits + self.bias)

    def similarity_(self, scores):
        return scores.add_(self.bias).sigmoid_() if self.bias else scores.sigmoid_()

    def similarity_grad(self, g, mask):
        return _sigmoid_grad(g)


@register("sigmoid")
class Sigmoid(_BiasedSigmoid):
    """Sigmoid attention sigmoid(s + b) without normalisation (Gu et al. Table 6; option bias, default 0)."""

    def __init__(self, ctx: OpContext, *, bias: float = 0.0, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ConfigError(f"attention_options.bias must be a finite number, got {bias!r}")
        self.bias = float(bias)


@register("sigmoid_logn")
class SigmoidLogN(_BiasedSigmoid):
    """Sigmoid attention with bias -log n, n = max_seq_len, no normalisation (Ramapuram et al. 2024, Apple; option n)."""

    def __init__(self, ctx: OpContext, *, n: int | None = None, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        n = ctx.max_seq_len if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"attention_options.n must be a positive integer, got {n!r}")
        self.bias = -math.log(n)


@register("sigmoid_norm")
class SigmoidNorm(_Elementwise):
    """Sigmoid attention normalised: sigmoid(s) / sum_j sigmoid(s) (Gu et al. Table 6); no floor on the sum."""

    norm = "sum"
    z_floor = None
    native_kind = 2

    def similarity(self, logits):
        return torch.sigmoid(logits)

    def similarity_(self, scores):
        return scores.sigmoid_()

    def similarity_grad(self, g, mask):
        return _sigmoid_grad(g)


@register("sigmoid_pnorm")
class SigmoidPNorm(_Elementwise):
    """p-normalised sigmoid: sigmoid(s) / (sum sigmoid(s)^p)^(1/p), no floor (Gu et al. rebuttal; option p, default 2)."""

    norm = "pnorm"
    z_floor = None
    native_kind = 2

    def __init__(self, ctx: OpContext, *, p: float = 2.0, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        self.p = _positive("p", p)
        self.normalised = self.p == 1.0

    def similarity(self, logits):
        return torch.sigmoid(logits)

    def similarity_(self, scores):
        return scores.sigmoid_()

    def similarity_grad(self, g, mask):
        return _sigmoid_grad(g)


@register("relu")
class ReLU(_Elementwise):
    """ReLU attention relu(s) without normalisation (Gu et al. Table 6)."""

    native_kind = 1

    def similarity(self, logits):
        return torch.relu(logits)

    def similarity_(self, scores):
        return scores.relu_()

    def similarity_grad(self, g, mask):
        return torch.gt(g, 0.0, out=g)  # g = relu(s) > 0 iff s > 0: 1.0 or 0.0, in place (no bool tile)


@register("relu_norm")
class ReLUNorm(_Elementwise):
    """ReLU attention normalised: relu(s) / max(sum_j relu(s), 1e-6)."""

    norm = "sum"

    native_kind = 1

    def similarity(self, logits):
        return torch.relu(logits)

    def similarity_(self, scores):
        return scores.relu_()

    def similarity_grad(self, g, mask):
        return torch.gt(g, 0.0, out=g)  # g = relu(s) > 0 iff s > 0: 1.0 or 0.0, in place (no bool tile)


@register("elu1_sim")
class Elu1Sim(_Elementwise):
    """elu+1 similarity elu(s)+1 of the logit s = q.k/sqrt(d_h), no normalisation (Gu et al. Table 6's 0.80*).

    The similarity form of the paper's code (``model_attn_sim.py``: ``elu(q k^T * scale) + 1``, masked
    keys 0), not the kernel form :class:`Elu1` ``(elu(q)+1).(elu(k)+1)/sqrt(d_h)``, which the paper
    reports as failing to train without normalisation. Weights are positive, rows do not sum to 1.
    """

    native_kind = 3

    def similarity(self, logits):
        return F.elu(logits) + 1.0

    def similarity_(self, scores):
        return F.elu(scores, inplace=True).add_(1.0)  # elu(-inf) + 1 = 0 on masked logits

    def similarity_grad(self, g, mask):
        return g.clamp_(max=1.0)  # d/ds = 1 for s > 0 (g > 1), exp(s) = g for s <= 0; 0 where masked


# ===================================================== feature-map kernels
class _Kernel(_Elementwise):
    """Linear-attention kernel: sim = phi(q).phi(k) / sqrt(d_h); no logits to bias."""

    accepts_logit_bias = False
    mask_as_bias = False  # sim(-inf) is not 0

    native_kind = 0

    def similarity(self, logits):
        return logits  # logits are already phi(q).phi(k) * scale

    def similarity_(self, scores):
        return scores

    def similarity_grad(self, g, mask):
        return mask.to(g.dtype).expand_as(g)


@register("elu1")
class Elu1(_Kernel):
    """elu+1 kernel (elu(q)+1).(elu(k)+1)/sqrt(d_h) without normalisation (Gu et al. Table 6)."""

    def feature_map(self, x):
        return F.elu(x) + 1.0


@register("elu1_norm")
class Elu1Norm(Elu1):
    """elu+1 kernel normalised by the row sum: linear attention (Katharopoulos et al. 2020)."""

    norm = "sum"


@register("linear")
class Linear(_Kernel):
    """Identity kernel q.k/sqrt(d_h) without normalisation (plain linear attention, Gu et al. Table 6)."""


@register("linear_relu")
class LinearReLU(_Kernel):
    """ReLU feature-map kernel relu(q).relu(k)/sqrt(d_h) without normalisation."""

    def feature_map(self, x):
        return torch.relu(x)


@register("linear_relu_norm")
class LinearReLUNorm(LinearReLU):
    """ReLU feature-map kernel normalised by max(row sum, 1e-6)."""

    norm = "sum"


@register("softpick")
class Softpick(AttentionOp):
    """Softpick relu(exp(s) - 1) / (sum_j |exp(s) - 1| + 1e-6): rows sum to <= 1 (Zuhri et al. 2025)."""

    sdpa = False
    normalised = False

    def native_tile(self) -> NativeTile:
        return NativeTile("softpick")

    def normalise(self, logits, mask, extra):
        # Multiply numerator and denominator by exp(-m), m = max(0, max_j s_ij): no overflow.
        logits = logits.masked_fill(~mask, float("-inf"))  # exp -> 0 there, with zero gradient
        m = logits.amax(dim=-1, keepdim=True).clamp_min(0.0)  # (B, H, C, 1)
        em = torch.exp(-m)
        d = (torch.exp(logits - m) - em).masked_fill(~mask, 0.0)  # exp(-m) (exp(s) - 1)
        return torch.relu(d) / (d.abs().sum(dim=-1, keepdim=True) + _EPS * em), None

    has_tile_grad = True

    # The tile functions use float 0/1 masks and signs, no boolean tiles: on CPU a masked_fill_ with a broadcast
    # (C, Tk) mask, a product with a bool tile or torch.where over a tile cost several times a plain element-wise
    # pass (benchmarks/tile_ops.py).
    def tile_weights(self, scores, mask):
        m = scores.amax(dim=-1, keepdim=True).clamp_min_(0.0)  # (N, C, 1)
        em = torch.exp(-m)
        e = scores.sub_(m).mul_(_LOG2E).exp2_()  # (N, C, Tk) exp(s - m) (as exp2: faster on CPU), 0 where masked
        d = torch.addcmul(e, em, mask.to(e.dtype), value=-1.0)  # exp(-m) (exp(s) - 1) where visible, 0 where masked
        a = d.abs().sum(dim=-1, keepdim=True).add_(_EPS * em)  # (N, C, 1)
        w = torch.relu(d).div_(a)
        return w, (d, e, a)

    def tile_grad(self, w, aux, dw, mask):
        # u = exp(s) - 1, Q = sum |u| + eps: dL/ds_j = ([u_j > 0] dw_j - r sign(u_j)) exp(s_j) / Q, r = sum dw w,
        # computed as (relu(sign u_j) dw_j - r) sign(u_j) exp(s_j) / Q (the same for u_j > 0, < 0 and = 0)
        d, e, a = aux
        r = _row_dot(dw, w)  # (N, C, 1)
        sgn = d.sign_()  # (N, C, Tk) in {-1, 0, 1}: d is 0 where masked (in place: d is not needed after)
        g = dw.mul_(torch.relu(sgn)).sub_(r)
        return g.mul_(sgn.mul_(e).div_(a))


def _sigmoid_grad(g: Tensor) -> Tensor:
    """sigma'(s) = g (1 - g) = g - g g from g = sigma(s) (0 where masked: g = 0 there), in place in ``g``."""
    return g.addcmul_(g, g, value=-1.0)


def _positive(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"attention_options.{name} must be a positive number, got {v!r}")
    return float(v)


@register("diff")
class Differential(AttentionOp):
    """Differential attention (Ye et al. 2024): (softmax(q1.k1) - lambda softmax(q2.k2)) v, per-head RMSNorm, x (1 - lambda_init).

    Every head's query and key are split into two halves of d = d_h / 2 (q1 = the first half, as in
    the paper's code, whose ``num_heads`` is sinklab's ``n_heads``; to compare with a softmax model of H heads
    as the paper does, give this one H / 2 heads: :meth:`matched_heads`); the two softmax maps (logits scaled by 1 / sqrt(d), RoPE on d dims) share the
    head's full-width value. ``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` with four
    learnable d-vectors per layer (shared by the heads, initialised N(0, 0.1)) and
    ``lambda_init = 0.8 - 0.6 exp(-0.3 l)`` for 0-based layer l (option ``lambda_init`` fixes it).
    Each head's output goes through an RMSNorm over its d_h channels (learnable gain, eps 1e-5) and is
    multiplied by ``1 - lambda_init``. The map ``A1 - lambda A2`` is signed: the sink metric sees the
    paper's proxy scores ``|w| / sum |w|`` (``normalised = False``). Positional logit biases (ALiBi,
    T5) are not supported (a bias would have to be split between the two maps).
    """

    differential = True
    normalised = False
    accepts_logit_bias = False
    rms_eps: ClassVar[float] = 1e-5

    def __init__(self, ctx: OpContext, *, lambda_init: float | None = None, gate: str | None = "default") -> None:
        super().__init__(ctx, gate=gate)
        if ctx.head_dim % 2:
            raise ConfigError(f"attention='diff' splits each head in two halves: the head dimension must be even, "
                              f"got {ctx.head_dim}")
        if lambda_init is not None and (isinstance(lambda_init, bool) or not isinstance(lambda_init, (int, float))):
            raise ConfigError(f"attention_options.lambda_init must be a number, got {lambda_init!r}")
        d = ctx.head_dim // 2
        self.fixed_lambda_init = None if lambda_init is None else float(lambda_init)
        self.lambda_init = 0.2 if lambda_init is None else float(lambda_init)  # layer 0's; see set_layer
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.randn(d) * 0.1))  # (d,)
        self.subln = nn.Parameter(torch.ones(ctx.head_dim))  # (d_h,) RMSNorm gain

    @classmethod
    def matched_heads(cls, n_heads: int) -> int:
        """Half of ``n_heads`` (and of ``n_kv_heads`` under grouped-query attention): Ye et al. (2024, Sec. 2.1;
        and their code's README on "the impact of halving heads": "Diff Transformer with more than 8 heads ... the same number
        of parameters as Transformer with 16 heads") give a differential model ``h = d_model / 2d``
        heads, d the softmax model's head width. Each of its heads then has two maps of query/key width d and a
        value of width 2d: as many attention maps per layer as the softmax model, each as wide in q.k. The
        projections are the same d_model x d_model matrices at any head count; only the lambda vectors and the
        per-head norm gain (4 d + 2 d per layer) are added. At ``n_heads`` itself a differential model computes
        twice the maps, each half as wide. (sinklab's SDPA path pads each map's query/key to the value's width and
        computes ``A V`` per map, so its attention kernels do about twice softmax's multiply-adds at either
        head count.)

        Raises:
            ConfigError: ``n_heads`` is odd.
        """
        if n_heads % 2:
            raise ConfigError(f"differential attention matches a softmax model of an even number of heads, got {n_heads}")
        return n_heads // 2

    def set_layer(self, layer_idx: int) -> None:
        """``lambda_init`` of 0-based layer ``layer_idx`` (the paper's depth schedule), unless fixed."""
        if self.fixed_lambda_init is None:
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer_idx)

    def lam(self) -> Tensor:
        """The scalar lambda (0-dim tensor, differentiable)."""
        return (torch.exp(torch.dot(self.lambda_q1, self.lambda_k1)) - torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
                + self.lambda_init)

    def combine(self, y: Tensor) -> Tensor:
        """The two maps' outputs (B, 2, H, T, d_h) -> the layer's head outputs (B, H, T, d_h):
        ``(y1 - lambda y2)``, RMSNorm per head, times ``1 - lambda_init``."""
        z = y[:, 0] - self.lam().to(y.dtype) * y[:, 1]
        return self.normalise_heads(z)

    def normalise_heads(self, z: Tensor) -> Tensor:
        """RMSNorm over each head's d_h channels (float32), gain, times ``1 - lambda_init``: (B, H, T, d_h)."""
        zf = z.float()
        zf = zf * torch.rsqrt(zf.pow(2).mean(dim=-1, keepdim=True) + self.rms_eps)
        return (zf * self.subln * (1.0 - self.lambda_init)).to(z.dtype)
