"""``attention``: one sample's attention pattern for chosen layers and heads, and every head's attention
entropy on it.

Up to ``max_matrix_len`` tokens the full (T x T) attention matrices of the chosen heads are kept (the
eager seam, one layer's matrix at a time); past it only the attention mass per key (Gu et al. 2025,
Eq. 2: ``alpha[j] = mean_{i >= j} A[i, j]``), from the ``blockwise`` collector, which never builds a
T x T matrix. Positions, layers and heads are 0-based.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from sinklab.attention_masks import MaskSpec, build_mask
from sinklab.analyze.common import (AnalysisResult, Subject, analysis, check_heads, check_layers, command_line, num_heads,
                                    resolve_subject, run_model)
from sinklab.errors import InputError, param
from sinklab.metrics import attention_entropy
from sinklab.metrics.entropy import uniform_attention_entropy
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL

#: T above which ``attention`` shows the mass per key instead of the full matrices
MAX_MATRIX_LEN = 256


def capture_weights(model, input_ids: Tensor, layers: list[int], heads: list[int]) -> tuple[Tensor, "object"]:
    """The attention weights of ``heads`` in ``layers`` on one pass of ``input_ids`` (1, T).

    Args:
        model: a ``transformers`` model or a SinkLM. input_ids: (1, T) int64. layers, heads: 0-based.

    Raises:
        InputError: a layer without attention (an SSM block of a hybrid model).

    Returns:
        ``(weights, pass)``: weights (len(layers), len(heads), T, T) float32, rows = queries (the
        eager seam's softmax output; a sinklab model's observer weights, renormalised as the sink metric
        sees them), and the :class:`~sinklab.analyze.common.Pass` of the same forward (entropies recorded).
    """
    kept: dict[int, Tensor] = {}
    want = set(layers)

    def inspect(layer, w, **_):
        if layer in want:
            kept[layer] = w[0, heads].detach().float().cpu()
        return None

    res = run_model(model, input_ids, edit=inspect, batch_size=1, entropy=True)
    missing = [l for l in layers if l not in kept]
    if missing:
        raise InputError(f"layer {missing[0]} has no attention (blocks with attention: {sorted(kept) or res.stats.block_ids})")
    return torch.stack([kept[l] for l in layers]), res


@analysis("attention", help={
    "sample": "0-based probe window shown",
    "layers": "layers shown, e.g. 0,15,29 (default first, middle, last)",
    "heads": "heads shown, e.g. 0,3 (default all)",
    "max_matrix_len": "longest T shown as full matrices; longer: mass per key, blockwise"})
def attention(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 1,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    sample: int = 0,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    max_matrix_len: int = MAX_MATRIX_LEN,
    batch_size: int = 16,
) -> AnalysisResult:
    """One probe window's attention for chosen layers and heads, and each head's attention entropy on it.

    The probe is ``sinklab measure``'s (``num_samples`` natural windows of ``seq_len`` tokens, ``seed``);
    window ``sample`` (0-based) is shown.

    Tables: ``entropy`` -- every (layer, head): the mean over the T queries of ``-sum_j A[i, j] log A[i, j]``
    (nats) on this window, the uniform reference (:func:`~sinklab.metrics.entropy.uniform_attention_entropy`)
    and whether the head is shown; ``mass`` -- the shown heads' attention mass on every key (with its
    token); ``weights`` (T <= ``max_matrix_len`` only; CSV only) -- the shown heads' visible weights
    ``A[i, j]`` (query, key). Plot ``attention``: the matrices (T <= ``max_matrix_len``), else the mass per key.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        sample: 0-based index of the window among the ``num_samples``.
        layers: 0-based layers shown (default: first, middle, last). heads: 0-based heads shown (default all).
        max_matrix_len: longest T shown as full matrices; longer windows show the mass per key
            (blockwise collector, no T x T matrix).
        eps: the sink threshold marked on the mass plot.

    Raises:
        InputError: ``sample`` outside [0, num_samples), a layer or head out of range, ``max_matrix_len`` < 1.
    """
    if not 0 <= sample < num_samples:
        raise InputError(f"{param('sample', sample)} is outside the {num_samples} probe windows (0-based); raise {param('num_samples')}")
    if max_matrix_len < 1:
        raise InputError(f"max_matrix_len must be >= 1, got {max_matrix_len}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    m = subj.model
    if not 0 <= sample < subj.input_ids.shape[0]:
        raise InputError(f"sample {sample} is outside the subject's {subj.input_ids.shape[0]} windows")
    ids = subj.input_ids[sample : sample + 1]
    T = ids.shape[1]
    L = subj.num_layers
    layers = check_layers(layers if layers is not None else sorted({0, L // 2, L - 1}), L)
    full = T <= max_matrix_len
    H = num_heads(m)
    heads = check_heads(heads, H)
    if full:
        weights, res = capture_weights(m, ids, layers, heads)  # (len(layers), len(heads), T, T)
        stats = res.stats
    else:  # column sums only (a sinklab model's observer still sees one layer's weights at a time)
        from sinklab.capture import collect

        weights, stats = None, collect(m, ids, collector="blockwise", entropy=True)
    block_ids = stats.block_ids
    rows_of = {b: i for i, b in enumerate(block_ids)}
    missing = [l for l in layers if l not in rows_of]
    if missing:
        raise InputError(f"layer {missing[0]} has no attention (blocks with attention: {block_ids})")
    mask = MaskSpec.from_dict(stats.mask, causal=stats.causal)  # the probe's mask (a window, a prefix)
    # each layer's own mask (a model may mix windowed and global layers): its uniform reference
    own = [MaskSpec.from_dict(m, causal=stats.causal) for m in stats.layer_masks] if stats.layer_masks else None
    uniforms = [uniform_attention_entropy(T, m) for m in own] if own else [uniform_attention_entropy(T, mask)] * len(block_ids)
    uniform = uniform_attention_entropy(T, mask) if len(set(uniforms)) <= 1 else None
    k = rankable_positions(T, stats.causal)  # keys seen by at least 10% of the queries
    ent = stats.attention_entropy[0]  # (L', H)
    mass = stats.visible_mass[0]  # (L', H, T)
    tokens = (subj.tokenizer.convert_ids_to_tokens(ids[0].tolist()) if subj.tokenizer is not None
              else [str(int(t)) for t in ids[0]])
    masks = own or [mask] * len(block_ids)
    tables = _tables(ent, mass, weights, block_ids, layers, heads, tokens, uniforms, masks)
    head_ent = {f"{l}.{h}": float(ent[rows_of[l], h]) for l in layers for h in heads}
    layer_ent = ent.double().mean(dim=1)
    summary = {
        "sample": sample, "seq_len": T, "view": "matrix" if full else "mass_per_key", "layers": layers, "heads": heads,
        "attention_entropy_uniform": uniform,  # None where layers differ in their masks: then per layer
        **({} if uniform is not None else
           {"attention_entropy_uniform_per_layer": dict(zip([str(b) for b in block_ids], uniforms))}),
        "attention_entropy_shown": head_ent,
        "attention_entropy_per_layer": dict(zip([str(b) for b in block_ids], layer_ent.tolist())),
        "lowest_entropy_head": _lowest(ent, block_ids),
        "top_mass_position_shown": {f"{l}.{h}": int(mass[rows_of[l], h, :k].argmax()) for l in layers for h in heads},
    }
    name = subj.model_info.get("name")
    plot = functools.partial(_plot, ent=ent, mass=mass, weights=weights, rows_of=rows_of, layers=layers, heads=heads,
                             eps=eps, title=f"{name} · window {sample} · T={T}", uniform=uniform)
    settings = {"model": name, "corpus": corpus, "num_samples": num_samples, "seq_len": T, "seed": seed,
                "eps": eps, "sample": sample, "layers": layers, "heads": heads, "max_matrix_len": max_matrix_len}
    return AnalysisResult("attention", summary, tables, {"attention": plot}, settings, subj.model_info,
                          subj.corpus_info, command_line("attention", settings, subj),
                          csv_only=("weights",) if full else ())


def _tables(ent: Tensor, mass: Tensor, weights: Tensor | None, block_ids: list[int], layers: list[int],
            heads: list[int], tokens: list[str], uniforms: list[float], masks: list[MaskSpec]) -> dict:
    """The ``entropy`` (every (layer, head)), ``mass`` (shown heads, every key) and, with ``weights``
    (len(layers), len(heads), T, T), ``weights`` (the visible ``A[i, j]`` of the shown heads) tables.
    ``ent``: (L', H) entropies (nats); ``mass``: (L', H, T); ``block_ids``: the L' layers with attention;
    ``uniforms`` / ``masks``: each of them its uniform reference and its own mask."""
    import pandas as pd

    T, H = mass.shape[-1], ent.shape[1]
    rows_of = {b: i for i, b in enumerate(block_ids)}
    ent_rows = [{"layer": b, "head": h, "attention_entropy": float(ent[i, h]), "uniform_entropy": uniforms[i],
                 "shown": b in layers and h in heads} for i, b in enumerate(block_ids) for h in range(H)]
    mass_rows = [{"layer": l, "head": h, "position": j, "token": tokens[j], "attention_mass": float(mass[rows_of[l], h, j])}
                 for l in layers for h in heads for j in range(T)]
    tables = {"entropy": pd.DataFrame(ent_rows), "mass": pd.DataFrame(mass_rows)}
    if weights is not None:
        w = weights.double()
        frames = []
        for a, l in enumerate(layers):
            vis = build_mask(T, T, masks[rows_of[l]])  # the pairs this layer's mask shows (causal, window, prefix)
            qi, kj = vis.nonzero(as_tuple=True)
            for b, h in enumerate(heads):
                frames.append(pd.DataFrame({"layer": l, "head": h, "query": qi.numpy(), "key": kj.numpy(),
                                            "weight": w[a, b][qi, kj].numpy()}))
        tables["weights"] = pd.concat(frames, ignore_index=True)
    return tables


def _plot(path, *, ent: Tensor, mass: Tensor, weights: Tensor | None, rows_of: dict, layers: list[int],
          heads: list[int], eps: float, title: str, uniform: float | None) -> None:
    """One panel per shown (layer, head): the weight matrix (``weights`` given), else the mass per key."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    full = weights is not None
    nr, nc = len(layers), len(heads)
    fig, axes = plt.subplots(nr, nc, figsize=(1.9 * nc + 1.2, 2.2 * nr + 1.0), squeeze=False)
    for a, l in enumerate(layers):
        for b, h in enumerate(heads):
            ax = axes[a][b]
            e = float(ent[rows_of[l], h])
            if full:
                mat = weights[a, b].numpy()
                ax.imshow(mat, cmap="viridis", norm=PowerNorm(0.4, vmin=0.0, vmax=1.0), interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
            else:
                ax.plot(mass[rows_of[l], h].numpy(), lw=0.7)
                ax.axhline(eps, color="red", lw=0.5, ls="--")
                ax.set_yscale("log")
                ax.tick_params(labelsize=5)
            ax.set_title(f"L{l} H{h}  H={e:.2f}", fontsize=6)
            if b == 0:
                ax.set_ylabel("query" if full else "mass on key", fontsize=6)
            if a == nr - 1:
                ax.set_xlabel("key position (0-based)", fontsize=6)
    what = ("attention weights (rows: queries; colour: weight, power 0.4)" if full
            else f"attention mass per key (blockwise collector; red: eps={eps})")
    fig.suptitle(f"{title} · {what}\nH = attention entropy (nats, mean over queries); "
                 + (f"uniform {uniform:.2f}" if uniform is not None else "uniform: per layer (the entropy table)"),
                 fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _lowest(ent: Tensor, block_ids: list[int]) -> dict:
    """The (layer, head) of lowest entropy: the most concentrated head on this window."""
    i = int(ent.argmin())
    l, h = divmod(i, ent.shape[1])
    return {"layer": block_ids[l], "head": h, "attention_entropy": float(ent[l, h])}
