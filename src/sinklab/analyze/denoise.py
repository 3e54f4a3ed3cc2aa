"""``denoise``: where a masked diffusion LM's sink sits at every denoising step.

A prompt (the first P tokens of each probe window) is continued by G = T - P mask tokens, which
:func:`sinklab.diffusion.sampler.sample` unmasks over S steps (lowest-confidence remasking, LLaDA).
At every step's input (S + 1 states: all G masked, ..., nothing masked) one forward pass through the
capture seam records the attention mass on every key (bidirectional: the mean over all T queries),
the sink rate of every position, the top sink position and which kind of token sits there (BOS, EOS,
the mask token, prompt text or generated text), the kind of key each head attends to most, and the
hidden-state and key norms of the sink against the other positions.

Positions are 0-based (position 0 is the paper's token 1); steps are 0-based (step s = the input of
the s-th denoising step; step S = the finished sequence).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from sinklab.analyze.common import (AnalysisResult, Subject, analysis, command_line, position_norm_ratio, resolve_subject,
                                    run_model)
from sinklab.capture.adapter import adapt
from sinklab.errors import InputError, param
from sinklab.metrics import sink_rate
from sinklab.metrics.summary import rankable_positions

KINDS = ("bos", "eos", "mask", "prompt", "generated")


def token_kinds(ids: Tensor, *, prompt_len: int, mask_id: int, bos_id: int | None, eos_id: int | None) -> Tensor:
    """Kind of every token as an index into :data:`KINDS`.

    Args:
        ids: (N, T) int64 token ids. prompt_len: P (positions < P are the prompt). mask_id, bos_id, eos_id:
            special ids (None = the tokenizer has none).

    Returns:
        (N, T) int64: ``bos``/``eos``/``mask`` by id (anywhere), else ``prompt`` for positions < P and
        ``generated`` after.
    """
    kind = torch.full_like(ids, KINDS.index("generated"))
    kind[:, :prompt_len] = KINDS.index("prompt")
    for name, i in (("eos", eos_id), ("bos", bos_id), ("mask", mask_id)):
        if i is not None:
            kind[ids == i] = KINDS.index(name)
    return kind


def _special_ids(subj: Subject, mask_id: int | None) -> tuple[int, int | None, int | None]:
    tok = subj.tokenizer
    if mask_id is None:  # a masked diffusion run's saved tokenizer declares <|mask|> as its mask token
        mask_id = None if tok is None else getattr(tok, "mask_token_id", None)
    if mask_id is None:
        raise InputError("no mask token: the model's tokenizer has no <|mask|>; analyze denoise needs a masked "
                         f"diffusion run (trained with {param('train.objective', 'masked_diffusion')})")
    bos = getattr(tok, "bos_token_id", None) if tok is not None else None
    eos = getattr(tok, "eos_token_id", None) if tok is not None else None
    return int(mask_id), bos, eos


def step_row(st, kinds: Tensor, eps: float, prompt_len: int, sink_level: float) -> tuple[dict, list[dict]]:
    """One denoising step's row of the ``steps`` table (without ``step``) and its rows of the ``mass`` table.

    Args:
        st: :class:`~sinklab.capture.stats.ProbeStats` of the step's pass (mass (N, L, H, T)).
        kinds: (N, T) token kinds (:func:`token_kinds`). eps: sink threshold. prompt_len: P.
        sink_level: sink rate (percent) at which the top position counts as a sink.
    """
    T = kinds.shape[1]
    N = kinds.shape[0]
    k_rank = rankable_positions(T, False)
    rate = sink_rate(st.visible_mass, eps)  # (T,) percent
    # positions by sink rate, ties by position (the first of equal rates, as argmax): top3 starts with top
    order = torch.sort(rate[:k_rank], descending=True, stable=True).indices
    top = int(order[0])
    mean_mass = st.visible_mass.mean(dim=(0, 1, 2))  # (T,)
    top_kind = torch.bincount(kinds[:, top], minlength=len(KINDS))
    per_key = st.visible_mass  # (N, L, H, T)
    is_mask, is_bos = (kinds == KINDS.index("mask")), (kinds == KINDS.index("bos"))
    head_top = per_key.argmax(dim=-1)  # (N, L, H)
    head_kind = kinds.gather(1, head_top.flatten(1)).flatten()  # kinds of each head's top key
    counts = torch.bincount(head_kind, minlength=len(KINDS)).double() / head_kind.numel()
    row = {
        "masked_share": float(is_mask[:, prompt_len:].double().mean()),
        "top_sink_position": top,
        "top_sink_rate": float(rate[top]),
        "top3_positions": ";".join(str(int(j)) for j in order[:3] if float(rate[j]) > 0),
        "has_sink": bool(float(rate[top]) >= sink_level),
        "top_sink_kind": KINDS[int(top_kind.argmax())],
        "top_sink_kind_share": float(top_kind.max()) / N,
        "mass_top": float(mean_mass[top]),
        "mass_bos": float((per_key * is_bos[:, None, None]).sum(-1).mean()),
        "mass_mask": float((per_key * is_mask[:, None, None]).sum(-1).mean()),
        "mask_key_share": float(is_mask.double().mean()),
        **{f"head_top_{k}": float(counts[i]) for i, k in enumerate(KINDS)},
        "hidden_norm_ratio": position_norm_ratio(st.hidden_norms, top),
        "key_norm_ratio": position_norm_ratio(st.key_norms, top) if st.key_norms is not None else float("nan"),
        "sink_rate_pos0": float(rate[0]),
    }
    share_masked = is_mask.double().mean(dim=0)
    masses = [{"position": j, "mass": float(mean_mass[j]), "sink_rate": float(rate[j]),
               "masked_share": float(share_masked[j])} for j in range(T)]
    return row, masses


@analysis("denoise", help={
    "steps": "denoising steps S",
    "prompt_len": "prompt tokens before the masked continuation",
    "temperature": "sampling temperature (0 = greedy)",
    "mask_id": "the mask token id (default: <|mask|> of the tokenizer)",
    "sink_level": "sink rate (%) that makes a step's top position a sink"})
def denoise(
    model: "str | Subject",
    *,
    corpus: str | None = None,
    num_samples: int = 32,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    steps: int = 16,
    prompt_len: int = 16,
    temperature: float = 0.0,
    mask_id: int | None = None,
    sink_level: float = 10.0,
    batch_size: int = 16,
) -> AnalysisResult:
    """Sinks of a masked diffusion LM across the denoising steps of generation.

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        model: a masked diffusion run (folder or its ``final/``), or a :class:`Subject` with a
            bidirectional SinkLM. corpus, num_samples, seq_len, seed: the probe (default: the run's own
            held-out windows); the first ``prompt_len`` tokens of each window are the prompt.
        eps: sink threshold on the attention mass. steps: S denoising steps (1 <= S <= T - P).
        prompt_len: P, 1 <= P < T. temperature: 0 = greedy (see :func:`sinklab.diffusion.sampler.sample`).
        mask_id: the mask token id (default: ``<|mask|>`` of the model's tokenizer).
        sink_level: a step ``has_sink`` when its top position's sink rate reaches this (percent; the
            emergence level of training, 10): below it the "top sink position" is only the least flat key.

    Returns:
        :class:`AnalysisResult` with tables ``steps`` (one row per step: ``masked_share`` of the
        generated positions, ``top_sink_position``, ``top_sink_rate`` (Sink^eps, percent),
        ``top_sink_kind`` (the most common token kind there over samples) and ``top_sink_kind_share``,
        ``top3_positions`` (the three positions with the highest sink rates, ties by position, ``;``-separated;
        only positions whose rate is above 0, so empty when no position passes eps), ``mass_top``, ``mass_bos``, ``mass_mask`` (attention mass summed over the BOS / mask keys, mean
        over samples, layers and heads), ``mask_key_share`` (share of keys that are mask tokens: what
        ``mass_mask`` would be under uniform attention), ``head_top_KIND`` (share of (sample, layer,
        head) whose largest-mass key is of that kind), ``hidden_norm_ratio`` and ``key_norm_ratio``
        (the top sink position's norm over the mean of the other positions, mean over samples, layers
        (and heads)), ``sink_rate_pos0``) and ``mass`` (step x position: mean mass, sink rate, share of
        samples where that position is masked).

    Raises:
        InputError: a causal model or a ``transformers`` model; no mask token; P or S out of range.
    """
    import pandas as pd

    from sinklab.diffusion.sampler import sample

    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                           device=device, dtype=dtype, device_map=device_map)
    m = subj.model
    if not adapt(m).masked_diffusion:
        raise InputError("analyze denoise needs a masked diffusion model (a sinklab run trained with "
                         "train.objective = 'masked_diffusion'); this model is causal or not a sinklab model")
    ids = subj.input_ids
    N, T = ids.shape
    if not 1 <= prompt_len < T:
        raise InputError(f"{param('prompt_len', prompt_len)} must be in [1, {T - 1}] (T={T})")
    mask_id, bos_id, eos_id = _special_ids(subj, mask_id)
    trace = sample(m, ids[:, :prompt_len], gen_len=T - prompt_len, steps=steps, mask_id=mask_id,
                   temperature=temperature, seed=seed)
    rows, mass_rows = [], []
    from sinklab.progress import progress

    for s, state in enumerate(progress(trace.states, desc="denoise steps", unit="step")):
        st = run_model(m, state, batch_size=batch_size).stats
        kinds = token_kinds(state.cpu(), prompt_len=prompt_len, mask_id=mask_id, bos_id=bos_id, eos_id=eos_id)  # (N, T), as the stats
        row, masses = step_row(st, kinds, eps, prompt_len, sink_level)
        rows.append({"step": s, **row})
        mass_rows += [{"step": s, **r} for r in masses]
    table = pd.DataFrame(rows)
    mass_table = pd.DataFrame(mass_rows)
    tops = table["top_sink_position"].tolist()
    example = None
    if subj.tokenizer is not None:
        example = {"prompt": subj.tokenizer.decode(trace.tokens[0, :prompt_len].tolist()),
                   "generated": subj.tokenizer.decode(trace.tokens[0, prompt_len:].tolist())}
    summary = {
        "num_samples": N, "seq_len": T, "prompt_len": prompt_len, "gen_len": T - prompt_len, "steps": steps,
        "schedule": trace.schedule, "mask_id": mask_id, "bos_id": bos_id, "eos_id": eos_id,
        "top_sink_positions": tops,
        "top_sink_kinds": table["top_sink_kind"].tolist(),
        "sink_moves": len(set(tops)) > 1,
        "steps_with_sink": int(table["has_sink"].sum()),
        "first_step": {k: rows[0][k] for k in ("top_sink_position", "top_sink_rate", "top_sink_kind", "mass_mask",
                                               "mask_key_share", "hidden_norm_ratio", "key_norm_ratio")},
        "last_step": {k: rows[-1][k] for k in ("top_sink_position", "top_sink_rate", "top_sink_kind",
                                               "hidden_norm_ratio", "key_norm_ratio")},
        "example": example,
    }

    plot = functools.partial(_plot, table=table, mass_table=mass_table, prompt_len=prompt_len, steps=steps, T=T)
    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T, "seed": seed,
                "eps": eps, "steps": steps, "prompt_len": prompt_len, "temperature": temperature, "mask_id": mask_id,
                "sink_level": sink_level}
    return AnalysisResult("denoise", summary, {"steps": table, "mass": mass_table}, {"denoise": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("denoise", settings, subj))


def _plot(path, *, table, mass_table, prompt_len: int, steps: int, T: int) -> None:
    """Heat map key position x step of the attention mass; the top sink position and the mass on it and on
    the mask keys by step."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    grid = mass_table.pivot(index="position", columns="step", values="mass").to_numpy()
    im = axes[0].imshow(grid, aspect="auto", origin="lower", cmap="viridis")
    axes[0].axhline(prompt_len - 0.5, color="w", lw=0.8, ls="--")
    axes[0].set_xlabel("denoising step (0 = all masked)")
    axes[0].set_ylabel("key position (0-based)")
    axes[0].set_title("attention mass on each key")
    fig.colorbar(im, ax=axes[0], shrink=0.8)
    ax = axes[1]
    ax.plot(table["step"], table["top_sink_position"], "o-", color="C3", label="top sink position")
    ax.set_xlabel("denoising step")
    ax.set_ylabel("top sink position (0-based)", color="C3")
    ax2 = ax.twinx()
    ax2.plot(table["step"], table["mass_top"], "s--", color="C0", label="mass on the top sink")
    ax2.plot(table["step"], table["mass_mask"], "^:", color="C2", label="mass on all mask keys")
    ax2.plot(table["step"], table["mask_key_share"], "-", color="C2", alpha=0.4, label="share of mask keys")
    ax2.set_ylabel("attention mass")
    ax2.set_ylim(0, 1)
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax2.legend(lines, labels, fontsize=8, loc="upper right")
    ax.set_title(f"sink across {steps} denoising steps (P={prompt_len}, G={T - prompt_len})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

