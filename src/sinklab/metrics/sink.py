"""Attention-sink metrics of Gu et al., *When Attention Sink Emerges in Language
Models: An Empirical View* (ICLR 2025), Sec. 3.

Notation: ``A[l, h, i, j]`` is the attention of head ``h`` in layer ``l`` from query
``i`` to key ``j``. **Positions are 0-based in code** (position 0 is the paper's
token 1). ``N`` samples, ``L`` layers, ``H`` heads, ``T`` tokens, ``K`` leading
key positions kept for the sink rate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sinklab.attention_masks import CAUSAL, MaskSpec
from sinklab.errors import InputError, NonFiniteMassError


def _check_eps(eps: float) -> None:
    if not 0.0 < eps < 1.0:
        raise InputError(f"eps must lie in (0, 1), got {eps}")


def _check_mass(mass: Tensor) -> None:
    if mass.dim() != 4:
        raise InputError(f"mass must be (N, L, H, T), got shape {tuple(mass.shape)}")
    if mass.is_floating_point() and bool(torch.isnan(mass).any()):
        n = int(torch.isnan(mass).any(dim=(1, 2, 3)).sum())
        raise NonFiniteMassError(f"the attention mass is NaN in {n} of {mass.shape[0]} samples (a numerically broken forward, "
                         "e.g. an overflow in half precision): a sink rate would count those as no sink")


def key_counts(seq_len: int, *, causal: bool = True, device=None) -> Tensor:
    """Number of queries that can see each key: ``T - j`` (causal) or ``T`` (bidirectional).

    Returns: (T,) float64, key position ``j`` 0-based.
    """
    j = torch.arange(seq_len, device=device, dtype=torch.float64)
    return (seq_len - j) if causal else torch.full_like(j, float(seq_len))


def visible_key_counts(seq_len: int, mask: MaskSpec = CAUSAL, *, device=None) -> Tensor:
    """Number of queries that may attend each key under the model's own mask.

    The mask (0-based positions; :class:`~sinklab.attention_masks.MaskSpec`, the rule of
    :func:`sinklab.attention_masks.visible`):
    query ``i`` sees key ``j`` iff ``(j <= i or j < prefix_len)`` for a causal model (all
    ``i`` for a bidirectional one) and, with a sliding window ``w``, ``|i - j| < w``. The
    count is the denominator of the *visible* attention mass (see
    :func:`attention_mass_visible_from_column_sums`); for plain causal attention it is
    ``T - j``, the paper's denominator (Gu et al. 2025, Eq. 2), so both masses agree.

    Args:
        seq_len: T.
        mask: causal decoder or bidirectional encoder (``mask.causal``), a bidirectional prefix of
            ``mask.prefix_len`` keys (prefix LM; a prefix of T keys or more makes every key a prefix key), a
            sliding window ``mask.window``.

    Returns:
        (T,) float64 counts, key position ``j`` 0-based, each in [1, T].

    Raises:
        InputError: ``seq_len < 1`` (a negative prefix or a window < 1 is refused by :class:`MaskSpec` itself).
    """
    causal, prefix_len, window = mask.causal, mask.prefix_len, mask.window
    if seq_len < 1:
        raise InputError(f"seq_len must be >= 1, got {seq_len}")
    if prefix_len < 0:
        raise InputError(f"prefix_len must be >= 0, got {prefix_len}")
    if window is not None and window < 1:
        raise InputError(f"window must be >= 1, got {window}")
    T = seq_len
    j = torch.arange(T, device=device, dtype=torch.float64)
    w = float(T) if window is None else float(min(window, T))
    hi = torch.clamp(j + w - 1, max=T - 1)  # last query that sees j
    lo_all = torch.clamp(j - w + 1, min=0)  # first query that sees j when earlier queries may look ahead
    bidir = hi - lo_all + 1
    if not causal:
        return bidir
    return torch.where(j < prefix_len, bidir, hi - j + 1)


def attention_mass_visible_from_column_sums(column_sums: Tensor, counts: Tensor) -> Tensor:
    """Mask-aware attention mass: ``sum_i A[..., i, j] / #{queries that may attend j}``.

    The paper's mass (:func:`attention_mass_from_column_sums`) divides by ``T - j`` whatever
    the mask, so under a sliding window of width ``w`` key 0 can never exceed ``w / T``; this
    variant divides by the queries that can actually see the key (``counts`` from
    :func:`visible_key_counts`), so it is a mean attention weight in [0, 1] for any mask.
    Identical to the paper's mass for plain causal attention.

    Args:
        column_sums: (..., T) sums over all queries of the attention on each key.
        counts: (T,) number of queries that may attend each key (0-based).

    Returns:
        (..., T) float64.

    Raises:
        InputError: ``counts`` does not have T entries.
    """
    if counts.shape[-1] != column_sums.shape[-1]:
        raise InputError(f"counts has {counts.shape[-1]} entries for {column_sums.shape[-1]} keys")
    return column_sums.to(torch.float64) / counts.to(device=column_sums.device, dtype=torch.float64)


def sink_rate_virtual(extra_mass: Tensor, eps: float = 0.3) -> float:
    """Sink rate on a virtual key (the paper's ``Sink*``, Gu et al. 2025, Sec. 7.2 / Table 4).

    For operations with a virtual key (learnable sink token, key/value biases, a learned
    sink logit, softmax-off-by-one, gpt-oss sinks) ``extra_mass[n, l, h]`` is the attention
    weight on that key averaged over the queries; ``Sink*`` is the percentage of
    (sample, layer, head) triples where it exceeds ``eps`` (threshold per sample, as for
    :func:`sink_rate`).

    Args:
        extra_mass: (N, L, H) mean attention on the virtual key.
        eps: threshold in (0, 1).

    Returns:
        Percentage in [0, 100].

    Raises:
        InputError: eps outside (0, 1), ``extra_mass`` not 3-D or holding a NaN.
    """
    _check_eps(eps)
    if extra_mass.dim() != 3:
        raise InputError(f"extra_mass must be (N, L, H), got shape {tuple(extra_mass.shape)}")
    _check_mass(extra_mass[..., None])
    return float((extra_mass > eps).to(torch.float64).mean() * 100.0)


def gate_magnitude(gate: Tensor) -> Tensor:
    """Each head's gate magnitude per query: ``|g[b, h, i]|``, or for an element-wise gate the mean of
    ``|g[b, h, i, c]|`` over the head's ``G`` channels (DESIGN "gate-weighted attention"; the head-wise and
    element-wise output gates of Qiu et al. 2025, *Gated Attention for Large Language Models*).

    Args:
        gate: (B, H, T_q, G) the factor each head's output is multiplied by after attention (G = 1 head-wise,
            G = the head width element-wise; query positions 0-based).

    Returns:
        (B, H, T_q) float64, >= 0.

    Raises:
        InputError: ``gate`` is not 4-D or has no channel.
    """
    if gate.dim() != 4 or gate.shape[-1] == 0:
        raise InputError(f"gate must be (B, H, T_q, G) with G >= 1, got shape {tuple(gate.shape)}")
    return gate.detach().to(torch.float64).abs().mean(dim=-1)


def gate_weighted_column_sums(weights: Tensor, magnitude: Tensor) -> Tensor:
    """Column sums of the gate-weighted attention ``sum_i A[b, h, i, j] * m[b, h, i]`` (DESIGN "gate-weighted
    attention": a head's weights times its gate's magnitude for that query, :func:`gate_magnitude`), the
    input of :func:`attention_mass_from_column_sums` for the gate-weighted attention mass.

    Args:
        weights: (B, H, T_q, T_k) attention weights (query i, key j, 0-based).
        magnitude: (B, H, T_q) the gate magnitude of each head and query.

    Returns:
        (B, H, T_k) float64.

    Raises:
        InputError: shapes that do not match.
    """
    if weights.dim() != 4 or tuple(magnitude.shape) != tuple(weights.shape[:3]):
        raise InputError(f"weights (B, H, T_q, T_k) and gate magnitude (B, H, T_q) do not match: "
                         f"{tuple(weights.shape)} and {tuple(magnitude.shape)}")
    m = magnitude.to(device=weights.device, dtype=torch.float64)
    return torch.einsum("bhij,bhi->bhj", weights.to(torch.float64), m)


def attention_mass_from_column_sums(column_sums: Tensor, *, causal: bool = True) -> Tensor:
    """Attention mass from the column sums ``sum_i A[..., i, j]``.

    ``alpha[..., j] = column_sums[..., j] / (#queries that see key j)``: the mean over
    queries ``i >= j`` (causal; ``T - j`` of them, 0-based ``j``) or over all ``T``
    queries (bidirectional encoder). Used by collectors that never build ``A``.

    Args:
        column_sums: (..., T) sums over queries of the attention on each key.
        causal: causal decoder (True) or bidirectional encoder (False).

    Returns:
        (..., T) float64 attention mass per key position (0-based).
    """
    T = column_sums.shape[-1]
    return column_sums.to(torch.float64) / key_counts(T, causal=causal, device=column_sums.device)


def attention_mass(attn: Tensor, *, causal: bool = True) -> Tensor:
    """Attention mass on every key: ``alpha[..., j] = mean_{i >= j} A[..., i, j]``.

    Gu et al. (2025), Eq. 2 (the per-head quantity thresholded by the sink rate).
    For a causal model the mean runs over the ``T - j`` queries that can see key ``j``
    (0-based); for a bidirectional encoder (``causal=False``) over all ``T`` queries.

    Args:
        attn: (..., T, T) attention weights, query axis then key axis, rows summing to 1
            for softmax attention (masked entries must be 0).
        causal: see above. Only the weights of queries ``i >= j`` count, so for a prefix LM, whose
            earlier queries also see the prefix keys, the mass is still Eq. 2's (as ``sinklab measure``
            takes it); summing every query there gave masses above 1.

    Returns:
        (..., T) float64.

    Raises:
        InputError: if ``attn`` is not square in its last two dimensions.
    """
    if attn.dim() < 2 or attn.shape[-1] != attn.shape[-2]:
        raise InputError(f"attention must be (..., T, T), got shape {tuple(attn.shape)}")
    a = attn.to(torch.float64)
    return attention_mass_from_column_sums((a.tril() if causal else a).sum(dim=-2), causal=causal)


def sink_rate_per_sample(mass: Tensor, eps: float = 0.3, positions: int | None = None) -> Tensor:
    """Per-sample sink rate: percentage of (layer, head) pairs with ``alpha > eps``.

    Args:
        mass: (N, L, H, T') attention mass, key positions 0-based.
        eps: threshold in (0, 1); the paper's default is 0.3.
        positions: keep only the first ``K`` key positions (default: all ``T'``).

    Returns:
        (N, K) float64 percentages in [0, 100].

    Raises:
        InputError: eps outside (0, 1), ``mass`` not 4-D or holding a NaN (a NaN would count as no sink).
    """
    _check_eps(eps)
    _check_mass(mass)
    m = mass if positions is None else mass[..., :positions]
    return (m > eps).to(torch.float64).mean(dim=(1, 2)) * 100.0


def sink_rate(mass: Tensor, eps: float = 0.3, positions: int | None = None) -> Tensor:
    """Sink rate ``Sink_k^eps`` of Gu et al. (2025), Eq. 2, for every key position k.

    The threshold ``alpha[n, l, h, k] > eps`` is applied per sample, then averaged over
    samples, layers and heads, and expressed in percent.

    Args:
        mass: (N, L, H, T') attention mass (see :func:`attention_mass`), 0-based keys.
        eps: threshold in (0, 1), default 0.3.
        positions: keep the first ``K`` positions (default all).

    Returns:
        (K,) float64 percentages; index 0 is the paper's ``Sink_1``.

    Raises:
        InputError: eps outside (0, 1), ``mass`` not 4-D or holding a NaN (a NaN would count as no sink).
    """
    return sink_rate_per_sample(mass, eps, positions).mean(dim=0)


def sink_rate_per_layer(mass: Tensor, eps: float = 0.3, positions: int | None = None) -> Tensor:
    """Sink rate per layer: (L, K) percentages over samples and heads. Same args and errors as :func:`sink_rate`."""
    _check_eps(eps)
    _check_mass(mass)
    m = mass if positions is None else mass[..., :positions]
    return (m > eps).to(torch.float64).mean(dim=(0, 2)) * 100.0


def sink_rate_per_head(mass: Tensor, eps: float = 0.3, positions: int | None = None) -> Tensor:
    """Sink rate per (layer, head): (L, H, K) percentages over samples. Same args and errors as :func:`sink_rate`."""
    _check_eps(eps)
    _check_mass(mass)
    m = mass if positions is None else mass[..., :positions]
    return (m > eps).to(torch.float64).mean(dim=0) * 100.0


def bootstrap_sink_rate_ci(
    mass: Tensor,
    eps: float = 0.3,
    positions: int | None = None,
    *,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> Tensor:
    """Percentile bootstrap confidence interval of the sink rate, resampling samples.

    Samples (sequences) are the independent units: each bootstrap replicate draws
    ``N`` of them with replacement and recomputes :func:`sink_rate`.

    Args:
        mass: (N, L, H, T') attention mass.
        eps, positions: as in :func:`sink_rate`.
        n_boot: number of bootstrap replicates.
        level: two-sided coverage, e.g. 0.95.
        seed: seed of the resampling generator (results are reproducible).

    Returns:
        (K, 2) float64: lower and upper bounds in percent; NaN with fewer than two samples
        (one sample has no sampling distribution to resample: every replicate is that sample,
        and a [x, x] interval would claim a certainty that one sample cannot give).
    """
    per_sample = sink_rate_per_sample(mass, eps, positions)  # (N, K)
    N = per_sample.shape[0]
    if N < 2:
        return torch.full((per_sample.shape[1], 2), float("nan"), dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, N, (n_boot, N), generator=gen)
    reps = per_sample.cpu()[idx].mean(dim=1)  # (n_boot, K)
    alpha = (1.0 - level) / 2.0
    q = torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)
    return torch.quantile(reps, q, dim=0).T.contiguous()


def norm_ratio_per_layer(hidden_norms: Tensor, reduce: str = "mean") -> Tensor:
    """Per-layer norm ratio ``||h_k^l|| / mean_t ||h_t^l||`` (or ``median_t``): the term of ``Sink'_k``
    (DESIGN.md) before the mean over layers; at k = 0 it is the first token's hidden-norm ratio.

    Args:
        hidden_norms: (N, L, T) l2 norms of the hidden states (layer outputs); the mean / median in
            the denominator runs over all T positions, k included.
        reduce: "mean" or "median" over token positions in the denominator.

    Returns:
        (N, L, T) float64 ratios per sample, layer and position (0-based).

    Raises:
        InputError: unknown ``reduce``.
    """
    h = hidden_norms.to(torch.float64)
    if reduce == "mean":
        denom = h.mean(dim=-1, keepdim=True)
    elif reduce == "median":
        denom = h.median(dim=-1, keepdim=True).values
    else:
        raise InputError(f"reduce must be 'mean' or 'median', got {reduce!r}")
    return h / denom


def norm_ratio(hidden_norms: Tensor, reduce: str = "mean") -> Tensor:
    """Norm-ratio sink score ``Sink'_k`` for every position k.

    ``Sink'_k = mean_l ||h_k^l|| / mean_t ||h_t^l||`` (or ``median_t`` with
    ``reduce="median"``): how much larger token k's hidden state is than a typical
    token's, averaged over layers (:func:`norm_ratio_per_layer` before that mean). Values
    far above 1 mark a sink token (massive activations, Sun et al. 2024).

    Args:
        hidden_norms: (N, L, T) l2 norms of the hidden states (layer outputs).
        reduce: "mean" or "median" over token positions in the denominator.

    Returns:
        (N, T) float64 ratios per sample and position (0-based).

    Raises:
        InputError: unknown ``reduce``.
    """
    return norm_ratio_per_layer(hidden_norms, reduce).mean(dim=1)


def massive_activation_ratio(max_abs: Tensor, median_abs: Tensor) -> Tensor:
    """Ratio of the largest hidden-state entry magnitude to the layer's median magnitude.

    Sun et al. (2024), *Massive Activations in Large Language Models*, flag entries
    around 1000x the median.

    Args:
        max_abs: (N, L) largest ``|h|`` entry per sample and layer.
        median_abs: (N, L) median ``|h|`` entry per sample and layer.

    Returns:
        (N, L) float64 ratios.
    """
    return max_abs.to(torch.float64) / median_abs.to(torch.float64).clamp_min(1e-30)
