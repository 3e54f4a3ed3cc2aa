"""``repeat``: the repeated-token mechanism (Yona et al. 2025, *Interpreting the repeated token phenomenon
in large language models*; seed 003 section 1).

In LLaMA-2 the first layer has heads whose query and key are near-orthogonal for the same token, so they
attend to every token but themselves, while the causal mask forces the first token to attend to itself;
later layers find "the token that attended to itself", and a run of repeated tokens looks more and more
like that token, so the sink dissolves. Three parts:

1. the first-layer mechanism on natural text: per (layer, head) the self-attention share
   ``mean_{i >= 2} A[i, i]`` against a uniform head's ``mean_{i >= 2} 1 / (i + 1)``, and the query-key
   cosine of the same token, ``cos(q_i, k_i)`` (:func:`self_attention_statistics`);
2. a natural prompt followed by one token repeated n times: the cosine of each repeated position's
   hidden state to the first position's, layer by layer, and the sink rate as n grows;
3. sink injection: make a chosen position look self-attending in the first layer (its attention row set
   to weight 1 on itself, :func:`force_self_attention`) and measure the attention mass later layers put
   on that position, against the same windows without the edit.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.analyze.common import (DEFAULT_SEQ_LEN, AnalysisResult, Subject, analysis, check_heads, check_layers,
                                    command_line, num_heads, resolve_subject, run_model)
from sinklab.errors import InputError, param
from sinklab.metrics import sink_rate
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL

#: queries from this 0-based position on enter the self-attention share (query 0 must attend to
#: itself, query 1 sees only two keys)
SELF_START = 2


def self_attention_statistics(weights: Tensor, query: Tensor, key: Tensor, *, start: int = SELF_START,
                              causal: bool = True, visible: Tensor | None = None) -> dict[str, Tensor]:
    """How much each head attends to the query's own token, and why.

    Args:
        weights: (B, H, T, T) attention weights (rows = queries). query, key: (B, H, T, D) after RoPE
            (grouped-query heads repeated to H); RoPE rotates a token's query and key by the same
            angle, so ``cos(q_i, k_i)`` is the same before and after it.
        start: first 0-based query position counted (default 2).
        causal: query i sees keys j <= i (else every key).
        visible: the layer's own mask, bool, broadcastable to (B, H, T, T), True where query i sees key j
            (:attr:`sinklab.capture.sites.HookContext.mask`: a sliding window, chunks, a prefix); given, it
            replaces ``causal`` for the visible keys of ``uniform_share`` and ``qk_cos_other``.

    Returns:
        (B, H) float64 tensors over the queries ``i >= start``: ``self_share`` the mean of ``A[i, i]``;
        ``uniform_share`` a head spreading evenly, the mean of ``1 / (i + 1)`` (causal) or ``1 / T``;
        ``qk_cos_self`` the mean of ``cos(q_i, k_i)``; ``qk_cos_other`` the mean of ``cos(q_i, k_j)``
        over the other visible keys j.

    Raises:
        InputError: ``start`` not in [0, T).
    """
    B, H, T, _ = weights.shape
    if not 0 <= start < T:
        raise InputError(f"start {start} is outside [0, T={T})")
    dev = weights.device
    diag = weights.double().diagonal(dim1=-2, dim2=-1)[..., start:]  # (B, H, T - start)
    if visible is None:
        vis = torch.ones(T, T, dtype=torch.bool, device=dev)
        vis = vis.tril() if causal else vis
    else:
        vis = visible.to(device=dev, dtype=torch.bool)
    n_vis = vis[..., start:, :].sum(dim=-1).double()  # (..., T - start) keys each query sees
    cos = torch.matmul(F.normalize(query.double(), dim=-1), F.normalize(key.double(), dim=-1).transpose(-1, -2))
    other = vis.clone()  # (..., T, T), the mask's own leading dims
    other[..., torch.arange(T, device=dev), torch.arange(T, device=dev)] = False  # the other keys
    other[..., :start, :] = False
    other = other.double()
    return {
        "self_share": diag.mean(dim=-1),
        "uniform_share": (1.0 / n_vis.clamp_min(1)).mean(dim=-1).expand(B, H),
        "qk_cos_self": cos.diagonal(dim1=-2, dim2=-1)[..., start:].mean(dim=-1),
        "qk_cos_other": (cos * other).sum(dim=(-1, -2)) / other.sum(dim=(-1, -2)).clamp_min(1),
    }


def force_self_attention(position: int, heads: dict[int, list[int]]):
    """An attention edit (:data:`sinklab.capture.hf.AttentionEdit`) that makes query ``position`` attend only
    to itself: in each layer of ``heads`` (0-based layer -> 0-based heads) row ``position`` of those heads
    becomes ``A[position, j] = 1 if j == position else 0`` (what the causal mask does to position 0 in
    every head). Other rows, heads and layers are untouched (the edit returns None there); a virtual key's
    share, if the model has one, is left as it was.

    Raises:
        InputError: ``position`` < 0 (a position past T is refused when the edit runs).
    """
    if position < 0:
        raise InputError(f"{param('position')} must be >= 0, got {position}")

    def edit(layer, w, **_):
        hs = heads.get(layer)
        if not hs:
            return None
        if position >= w.shape[-2]:
            raise InputError(f"{param('position', position)} is outside the sequence (0-based, T={w.shape[-2]})")
        new = w.clone()
        new[:, hs, position, :] = 0.0
        new[:, hs, position, position] = 1.0
        return new

    return edit


def cosine_to_first(hidden: Tensor, start: int) -> Tensor:
    """Cosine similarity of every position from ``start`` on with position 0, per layer.

    Args:
        hidden: (N, L, T, d) block outputs. start: first 0-based position compared (>= 1).

    Returns:
        (N, L, T - start) float64 ``cos(h[n, l, start + i], h[n, l, 0])``.
    """
    h = hidden.double()
    return F.cosine_similarity(h[:, :, start:], h[:, :, :1].expand_as(h[:, :, start:]), dim=-1)


@analysis("repeat", help={
    "prompt_len": "natural prompt tokens before the repeats",
    "counts": "numbers of repeats, e.g. 1,4,16,64 (default 1, 2, 4, ... up to T)",
    "token": "the repeated token (default: one per sample, random, seeded)",
    "position": "position made to attend only to itself (default T // 2)",
    "heads": "heads made self-attending (default: the lowest self-attention shares)",
    "layers": "layers where --position is made self-attending (default 0)"})
def repeat(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 32,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    prompt_len: int = 8,
    counts: list[int] | None = None,
    token: int | None = None,
    position: int | None = None,
    heads: list[int] | None = None,
    layers: list[int] | None = None,
    batch_size: int = 16,
) -> AnalysisResult:
    """The repeated-token mechanism: first-layer self-attention, repeated tokens, sink injection.

    **First-layer mechanism** (table ``self_attention``, every layer and head, on the natural windows):
    :func:`self_attention_statistics`; the summary lists the first layer's heads, and as
    ``attend_to_others_heads`` those whose self-attention share is below the uniform head's.

    **Sink injection** (table ``inject``): on the natural windows, query ``position`` (default T // 2) is
    made to attend only to itself (:func:`force_self_attention`) in ``layers`` (default: the first, 0)
    in one of these head sets: ``self_heads`` -- ``heads`` (default: the ceil(H / 3) heads of lowest
    self-attention share in the first of ``layers``, the "attend to others" candidates); ``self_all``
    -- every head; ``control_heads`` -- as many heads of the highest self-attention share; ``none``
    -- no edit. Per variant and layer: the attention mass on ``position`` (mean over samples and heads of
    ``alpha[l, h, position]``), its sink rate (percent of (sample, head) pairs with mass > eps), the same
    on position 0, and the cosine of ``position``'s block output with position 0's. The summary gives
    them over the layers after the last edited one.

    **Repeats**: prompt (the first ``prompt_len`` tokens of each natural window) + one token
    repeated n times, for n in ``counts`` (default 1, 2, 4, ... up to ``seq_len``).

    Per n and layer: the mean over samples and repeated positions of the cosine between each repeated
    token's block output and position 0's (:func:`cosine_to_first`), and for the last repeated token;
    per n: Sink^eps at position 0, and the largest sink rate among the repeated positions (those seen
    by at least 10% of the queries), and the control ``sink_rate_pos0_natural_same_len``: Sink^eps at
    position 0 of natural windows of the same total length ``prompt_len + n``, paired: the prompt of each
    repeated sequence is the first ``prompt_len`` tokens of its control window (the probe windows; when
    ``prompt_len + max(counts)`` exceeds T, new natural windows of that length from the corpus, whose first
    ``prompt_len`` tokens are then the prompt; without a corpus, the probe windows and NaN past T), so the
    effect of repetition can be told from that of length. ``prompt_len = 0`` is the fully repeated sequence (the paper's
    repeated-token probe; position 0 then holds the repeated token too).

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        model: zoo name / folder / run, or a :class:`Subject`. corpus, num_samples, seq_len, seed: the probe
            (seq_len None: the run's probe length for a ``sinklab train`` run, else 64).
        token: the repeated token id (default: one per sample, drawn from the non-special vocabulary, seeded).
        position: 0-based position made self-attending (default T // 2), in [1, T).
        heads: 0-based heads of the ``self_heads`` variant (default: the lowest self-attention shares).
        layers: 0-based layers where the position is made self-attending (default [0]).

    Raises:
        InputError: prompt_len outside [0, T), a count < 1, a token outside the vocabulary, a position
            outside [1, T), a layer or head out of range.
    """
    if not 0 <= prompt_len < (seq_len or DEFAULT_SEQ_LEN):
        raise InputError(f"{param('prompt_len')} must lie in [0, {param('seq_len')}={seq_len or DEFAULT_SEQ_LEN}), got {prompt_len}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    m, ids = subj.model, subj.input_ids
    N, T = ids.shape
    if not isinstance(model, Subject) and not prompt_len < T:  # T taken from a training run
        raise InputError(f"{param('prompt_len')} must lie in [0, {param('seq_len')}={T}), got {prompt_len}")
    counts, position = _check(subj, prompt_len, counts, position)
    L, H = subj.num_layers, num_heads(m)
    inject_layers = check_layers([0] if layers is None else layers, L)
    if heads is not None:
        heads = check_heads(heads, H)
    mech, base = _mechanism(subj, batch_size, not subj.is_encoder)  # (N, L', H) statistics, the unedited pass
    toks = _repeated_tokens(subj, token)
    longest = prompt_len + max(counts)  # control: natural text of the same total lengths
    control = subj.windows(N, longest) if longest > T and subj.documents is not None else ids
    # paired: each repeated sequence's prompt is the first prompt_len tokens of its control window, so that at
    # every n the two arms differ only in what follows the prompt (repeats or the window's own text)
    cos_df, sink_df = _repeats(m, toks, counts, prompt_len, control, eps, batch_size)
    mech_df = _mechanism_table(mech, base.stats.block_ids, H)
    first = inject_layers[0]
    if first not in base.stats.block_ids:
        raise InputError(f"layer {first} has no attention (blocks with attention: {base.stats.block_ids})")
    l0 = mech_df[mech_df["layer"] == first].sort_values("head")
    chosen, control = _choose_heads(l0, heads, H)
    variants = {"none": None, "self_heads": chosen, "self_all": list(range(H)), "control_heads": control}
    inj_df = _inject(m, ids, base, variants, position, inject_layers, eps, batch_size)
    summary = {
        **_first_layer_summary(l0, first),
        "inject_position": position, "inject_layers": inject_layers, "inject_heads": chosen, "control_heads": control,
        "inject_after_last_edited_layer": _inject_summary(inj_df, inject_layers),
        "prompt_len": prompt_len, "counts": counts, "num_samples": N,
        **_repeat_summary(cos_df, sink_df, max(counts)),
    }
    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "prompt_len": prompt_len, "counts": counts, "token": token,
                "position": position, "heads": heads, "layers": layers}
    tables = {"cosine": cos_df, "sink_rate": sink_df, "self_attention": mech_df, "inject": inj_df}
    plots = {"repeat": functools.partial(_plot, cos_df=cos_df, sink_df=sink_df, counts=counts),
             "mechanism": functools.partial(_plot_mechanism, l0=l0, inj_df=inj_df, first=first, position=position,
                                            inject_layers=inject_layers)}
    return AnalysisResult("repeat", summary, tables, plots, settings,
                          subj.model_info, subj.corpus_info, command_line("repeat", settings, subj))


def _check(subj: Subject, prompt_len: int, counts: list[int] | None, position: int | None) -> tuple[list[int], int]:
    """The repeat counts (default 1, 2, 4, ... up to T) and the injected position (default T // 2), checked.

    Raises:
        InputError: a count < 1, the prompt and the most repeats past the model's context, a position
            outside [1, T).
    """
    T = subj.input_ids.shape[1]
    if counts is None:
        counts = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= T]
    if any(n < 1 for n in counts):
        raise InputError(f"repeat counts must be >= 1, got {counts}")
    limit = subj.model_info.get("max_context")
    if limit is not None and prompt_len + max(counts) > limit:
        raise InputError(f"prompt {prompt_len} + {max(counts)} repeats is past the model's context of {limit} tokens")
    position = T // 2 if position is None else position
    if not 1 <= position < T:
        raise InputError(f"{param('position', position)} must lie in [1, T={T}) (position 0 attends to itself already)")
    return counts, position


def _choose_heads(l0, heads: list[int] | None, H: int) -> tuple[list[int], list[int]]:
    """The heads of the ``self_heads`` variant (``heads``, else the ceil(H / 3) heads of lowest self-attention
    share in the first edited layer, whose rows of the ``self_attention`` table are ``l0``) and as many
    control heads of the highest share."""
    order = l0.sort_values(["self_share", "head"])["head"].tolist()  # lowest self-attention share first
    k = len(heads) if heads is not None else math.ceil(H / 3)
    chosen = heads if heads is not None else sorted(order[:k])
    return chosen, sorted([h for h in reversed(order) if h not in chosen][:k])


def _repeated_tokens(subj: Subject, token: int | None) -> Tensor:
    """(N,) int64: ``token`` for every sample, or one token per sample drawn (seeded with ``subj.seed``) from
    the tokenizer's non-special vocabulary (without a tokenizer: from [0, max id + 1)).

    Raises:
        InputError: ``token`` outside the vocabulary.
    """
    ids = subj.input_ids
    N = ids.shape[0]
    vocab = len(subj.tokenizer) if subj.tokenizer is not None else int(ids.max()) + 1
    if token is not None:
        if not 0 <= token < vocab:
            raise InputError(f"{param('token', token)} is outside the vocabulary (size {vocab})")
        return torch.full((N,), token, dtype=torch.int64)
    g = torch.Generator().manual_seed(subj.seed)
    if subj.tokenizer is not None:
        from sinklab.probe.inputs import candidate_token_ids

        pool = candidate_token_ids(subj.tokenizer)
    else:
        pool = torch.arange(vocab)
    return pool[torch.randint(0, len(pool), (N,), generator=g)]


def _repeats(m, toks: Tensor, counts: list[int], prompt_len: int, control: Tensor, eps: float, batch_size: int):
    """Prompt (``control[:, :prompt_len]``, control (N, T') natural windows) + ``toks`` (N,) repeated n times for n
    in ``counts``: the ``cosine`` table (per n and layer, :func:`cosine_to_first` over the repeated positions and
    for the last one) and the ``sink_rate`` table (per n: Sink^eps at 0, the largest among the repeated positions,
    and at 0 of the same ``control`` windows cut to the same length, NaN past their length: the paired control,
    which shares the prompt)."""
    import pandas as pd

    N = control.shape[0]
    rows, sink_rows = [], []
    for n in counts:
        seq = torch.cat([control[:, :prompt_len], toks[:, None].expand(N, n)], dim=1)
        start = max(1, prompt_len)
        res = run_model(m, seq, hidden=True, batch_size=batch_size)
        cos = cosine_to_first(res.hidden, start)  # (N, L, n or n - 1)
        rate = sink_rate(res.stats.visible_mass, eps)  # (T',)
        Tn = seq.shape[1]
        rankable = rankable_positions(Tn, res.stats.causal)
        rep = rate[start:rankable]
        natural = float("nan")
        if Tn <= control.shape[1]:
            natural = float(sink_rate(run_model(m, control[:, :Tn], batch_size=batch_size).stats.visible_mass, eps)[0])
        sink_rows.append({"repeats": n, "seq_len": Tn, "sink_rate_pos0": float(rate[0]),
                          "max_sink_rate_repeated": float(rep.max()) if len(rep) else float("nan"),
                          "sink_rate_pos0_natural_same_len": natural})
        for l in range(cos.shape[1]):
            if cos.shape[2] == 0:
                continue
            rows.append({"repeats": n, "layer": l, "mean_cos_to_first": float(cos[:, l].mean()),
                         "last_cos_to_first": float(cos[:, l, -1].mean())})
    return pd.DataFrame(rows), pd.DataFrame(sink_rows)


def _mechanism_table(mech: dict[str, Tensor], ids_layers: list[int], H: int):
    """The ``self_attention`` table: per (layer, head) the means over samples of the (N, L', H) ``mech``
    statistics and ``self_share_over_uniform``."""
    import pandas as pd

    rows = []
    for i, b in enumerate(ids_layers):
        for h in range(H):
            r = {name: float(v[:, i, h].mean()) for name, v in mech.items()}
            r["self_share_over_uniform"] = r["self_share"] / r["uniform_share"]
            rows.append({"layer": b, "head": h, **r})
    return pd.DataFrame(rows)


def _inject(m, ids: Tensor, base, variants: dict, position: int, inject_layers: list[int], eps: float,
            batch_size: int):
    """The ``inject`` table: for each variant (name -> heads made self-attending, None: the unedited ``base``
    pass) and layer, the attention mass and sink rate on ``position`` and on 0, and cos(h[position], h[0])."""
    import pandas as pd

    rows = []
    for name, hs in variants.items():
        if name == "control_heads" and not hs:
            continue
        if hs is None:
            res = base
        else:
            res = run_model(m, ids, edit=force_self_attention(position, {l: hs for l in inject_layers}), hidden=True,
                            batch_size=batch_size)
        mass = res.stats.visible_mass.double()  # (N, L', H, T)
        cos_p = F.cosine_similarity(res.hidden[:, :, position].double(), res.hidden[:, :, 0].double(), dim=-1)  # (N, L')
        for i, b in enumerate(res.stats.block_ids):
            rows.append({
                "variant": name, "heads": ",".join(map(str, hs)) if hs is not None else "",
                "layer": b, "mass_on_position": float(mass[:, i, :, position].mean()),
                "sink_rate_position": float((mass[:, i, :, position] > eps).double().mean() * 100),
                "mass_on_first": float(mass[:, i, :, 0].mean()),
                "sink_rate_first": float((mass[:, i, :, 0] > eps).double().mean() * 100),
                "cos_position_to_first": float(cos_p[:, i].mean()),
            })
    return pd.DataFrame(rows)


def _inject_summary(inj_df, inject_layers: list[int]) -> dict:
    """Per variant, the means over the layers after the last edited one (and the last layer's cosine)."""
    after = inj_df[inj_df["layer"] > max(inject_layers)]
    out = {}
    for name, d in after.groupby("variant", sort=False):
        out[name] = {
            "sink_rate_position": float(d["sink_rate_position"].mean()),
            "mass_on_position": float(d["mass_on_position"].mean()),
            "sink_rate_first": float(d["sink_rate_first"].mean()),
            "cos_position_to_first_last_layer": float(d.sort_values("layer")["cos_position_to_first"].iloc[-1]),
        }
    return out


def _first_layer_summary(l0, first: int) -> dict:
    """The first edited layer's self-attention shares and query-key cosines by head (``l0``: its rows of the
    ``self_attention`` table), and its heads that attend to others more than a uniform head."""
    return {
        "first_layer": first,
        "first_layer_self_share_by_head": l0["self_share"].tolist(),
        "first_layer_uniform_share": float(l0["uniform_share"].iloc[0]),
        "first_layer_qk_cos_self_by_head": l0["qk_cos_self"].tolist(),
        "first_layer_qk_cos_other_by_head": l0["qk_cos_other"].tolist(),
        "attend_to_others_heads": sorted(l0[l0["self_share"] < l0["uniform_share"]]["head"].tolist()),
    }


def _repeat_summary(cos_df, sink_df, nmax: int) -> dict:
    """The repeats' headlines: sink rates by n, and the cosines by layer at the largest n."""
    at_max = cos_df[cos_df["repeats"] == nmax]
    reps = sink_df["repeats"].tolist()
    return {
        "sink_rate_pos0_by_repeats": dict(zip(reps, sink_df["sink_rate_pos0"].tolist())),
        "sink_rate_pos0_natural_same_len_by_repeats": dict(zip(reps, sink_df["sink_rate_pos0_natural_same_len"].tolist())),
        "max_sink_rate_repeated_by_repeats": dict(zip(reps, sink_df["max_sink_rate_repeated"].tolist())),
        "mean_cos_to_first_at_max_repeats_by_layer": at_max["mean_cos_to_first"].tolist(),
        "last_cos_to_first_at_max_repeats_by_layer": at_max["last_cos_to_first"].tolist(),
    }


def _plot(path, *, cos_df, sink_df, counts: list[int]) -> None:
    """cos(last repeated token, position 0) by layer for each n; sink rates against n."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for n in counts:
        d = cos_df[cos_df["repeats"] == n]
        if len(d):
            axes[0].plot(d["layer"], d["last_cos_to_first"], marker="o", ms=2, label=f"n={n}")
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("cos(last repeated token, position 0)")
    axes[0].legend(fontsize=7)
    axes[1].plot(sink_df["repeats"], sink_df["sink_rate_pos0"], marker="o", label="Sink at position 0")
    axes[1].plot(sink_df["repeats"], sink_df["max_sink_rate_repeated"], marker="s", label="max Sink, repeated positions")
    axes[1].plot(sink_df["repeats"], sink_df["sink_rate_pos0_natural_same_len"], marker="^", ls="--",
                 label="Sink at position 0, natural text of the same length")
    axes[1].set_xscale("log", base=2)
    axes[1].set_xlabel("repeats n")
    axes[1].set_ylabel("sink rate (%)")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_mechanism(path, *, l0, inj_df, first: int, position: int, inject_layers: list[int]) -> None:
    """The first layer's self-attention shares and query-key cosines per head; the sink injection by layer."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    x = l0["head"].to_numpy()
    axes[0].bar(x - 0.2, l0["self_share"], width=0.4, label="self-attention share")
    axes[0].axhline(float(l0["uniform_share"].iloc[0]), color="k", ls="--", lw=1, label="uniform head")
    axes[0].set_xlabel(f"head of layer {first}")
    axes[0].set_ylabel(f"mean A[i, i], i >= {SELF_START}")
    ax2 = axes[0].twinx()
    ax2.plot(x, l0["qk_cos_self"], "o-", color="tab:red", ms=3, label="cos(q_i, k_i)")
    ax2.plot(x, l0["qk_cos_other"], "s:", color="tab:gray", ms=3, label="cos(q_i, k_j), j != i")
    ax2.set_ylabel("query-key cosine")
    axes[0].legend(loc="upper left", fontsize=7)
    ax2.legend(loc="upper right", fontsize=7)
    for col, ax, label in (("mass_on_position", axes[1], f"attention mass on position {position}"),
                           ("cos_position_to_first", axes[2], f"cos(h[{position}], h[0])")):
        for name, d in inj_df.groupby("variant", sort=False):
            ax.plot(d["layer"], d[col], marker="o", ms=2, label=f"{name} {d['heads'].iloc[0]}".strip())
        ax.set_xlabel("layer")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    axes[1].set_title(f"query {position} forced to attend only to itself in layer(s) {inject_layers}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _mechanism(subj: Subject, batch_size: int, causal: bool):
    """The natural windows through the seam with an inspecting edit: (N, L', H) tensors of
    :func:`self_attention_statistics` per layer with attention, and the unedited pass (hidden states kept)."""
    per_layer: dict[int, list[dict]] = {}

    def inspect(layer, w, *, query, key, value, mask=None):
        per_layer.setdefault(layer, []).append(self_attention_statistics(w, query, key, causal=causal, visible=mask))
        return None

    res = run_model(subj.model, subj.input_ids, edit=inspect, hidden=True, batch_size=batch_size)
    layers = sorted(per_layer)
    stacked = {name: torch.stack([torch.cat([d[name] for d in per_layer[l]]) for l in layers], dim=1)
               for name in per_layer[layers[0]][0]}
    return stacked, res
