"""``repeat``: a natural prompt followed by one token repeated n times. Do the repeated tokens' hidden
states become like the first position's, and what happens to the sink on the first position as n grows?"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.analyze.common import AnalysisResult, Subject, command_line, natural_ids, resolve_subject, run_model
from sinklab.errors import InputError
from sinklab.metrics import sink_rate
from sinklab.metrics.summary import rankable_positions


def cosine_to_first(hidden: Tensor, start: int) -> Tensor:
    """Cosine similarity of every position from ``start`` on with position 0, per layer.

    Args:
        hidden: (N, L, T, d) block outputs. start: first 0-based position compared (>= 1).

    Returns:
        (N, L, T - start) float64 ``cos(h[n, l, start + i], h[n, l, 0])``.
    """
    h = hidden.double()
    return F.cosine_similarity(h[:, :, start:], h[:, :, :1].expand_as(h[:, :, start:]), dim=-1)


def repeat(
    model: "str | Subject" = "smollm2-135m",
    *,
    corpus: str | None = None,
    num_samples: int = 32,
    seq_len: int = 64,
    seed: int = 0,
    eps: float = 0.3,
    prompt_len: int = 8,
    counts: list[int] | None = None,
    token: int | None = None,
    batch_size: int = 16,
) -> AnalysisResult:
    """Repeated-token probe: prompt (the first ``prompt_len`` tokens of each natural window) + one token
    repeated n times, for n in ``counts`` (default 1, 2, 4, ... up to ``seq_len``).

    Per n and layer: the mean over samples and repeated positions of the cosine between each repeated
    token's block output and position 0's (:func:`cosine_to_first`), and for the last repeated token;
    per n: Sink^eps at position 0, and the largest sink rate among the repeated positions (those seen
    by at least 10% of the queries), and the control ``sink_rate_pos0_natural_same_len``: Sink^eps at
    position 0 of natural windows of the same total length ``prompt_len + n`` (prefixes of the probe
    windows, which begin with the same prompt; when ``prompt_len + max(counts)`` exceeds T, prefixes of
    new natural windows of that length from the corpus; without a corpus, NaN past T), so the effect of
    repetition can be told from that of length. ``prompt_len = 0`` is the fully repeated sequence (the paper's
    repeated-token probe; position 0 then holds the repeated token too).

    Args:
        token: the repeated token id (default: one per sample, drawn from the non-special vocabulary, seeded).

    Raises:
        InputError: prompt_len outside [0, seq_len), a count < 1, or a token outside the vocabulary.
    """
    import pandas as pd

    if not 0 <= prompt_len < seq_len:
        raise InputError(f"--prompt-len must lie in [0, --seq-len={seq_len}), got {prompt_len}")
    subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed)
    m, ids = subj.model, subj.input_ids
    N, T = ids.shape
    if counts is None:
        counts = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= T]
    if any(n < 1 for n in counts):
        raise InputError(f"repeat counts must be >= 1, got {counts}")
    limit = subj.model_info.get("max_context")
    if limit is not None and prompt_len + max(counts) > limit:
        raise InputError(f"prompt {prompt_len} + {max(counts)} repeats is past the model's context of {limit} tokens")
    vocab = len(subj.tokenizer) if subj.tokenizer is not None else int(ids.max()) + 1
    if token is not None:
        if not 0 <= token < vocab:
            raise InputError(f"--token {token} is outside the vocabulary (size {vocab})")
        toks = torch.full((N,), token, dtype=torch.int64)
    else:
        g = torch.Generator().manual_seed(subj.seed)
        if subj.tokenizer is not None:
            from sinklab.probe.inputs import candidate_token_ids

            pool = candidate_token_ids(subj.tokenizer)
        else:
            pool = torch.arange(vocab)
        toks = pool[torch.randint(0, len(pool), (N,), generator=g)]
    # control: natural text of the same total lengths (sink rates fall with length alone)
    longest = prompt_len + max(counts)
    control = natural_ids(subj, N, longest) if longest > T and subj.documents is not None else ids
    rows, sink_rows = [], []
    for n in counts:
        seq = torch.cat([ids[:, :prompt_len], toks[:, None].expand(N, n)], dim=1)
        start = max(1, prompt_len)
        res = run_model(m, seq, hidden=True, batch_size=batch_size)
        cos = cosine_to_first(res.hidden, start)  # (N, L, n or n - 1)
        rate = sink_rate(res.stats.mass, eps)  # (T',)
        Tn = seq.shape[1]
        rankable = rankable_positions(Tn, res.stats.causal)
        rep = rate[start:rankable]
        natural = float("nan")
        if Tn <= control.shape[1]:
            natural = float(sink_rate(run_model(m, control[:, :Tn], batch_size=batch_size).stats.mass, eps)[0])
        sink_rows.append({"repeats": n, "seq_len": Tn, "sink_rate_pos0": float(rate[0]),
                          "max_sink_rate_repeated": float(rep.max()) if len(rep) else float("nan"),
                          "sink_rate_pos0_natural_same_len": natural})
        for l in range(cos.shape[1]):
            if cos.shape[2] == 0:
                continue
            rows.append({"repeats": n, "layer": l, "mean_cos_to_first": float(cos[:, l].mean()),
                         "last_cos_to_first": float(cos[:, l, -1].mean())})
    cos_df, sink_df = pd.DataFrame(rows), pd.DataFrame(sink_rows)
    nmax = max(counts)
    at_max = cos_df[cos_df["repeats"] == nmax]
    summary = {
        "prompt_len": prompt_len, "counts": counts, "num_samples": N,
        "sink_rate_pos0_by_repeats": dict(zip(sink_df["repeats"].tolist(), sink_df["sink_rate_pos0"].tolist())),
        "sink_rate_pos0_natural_same_len_by_repeats": dict(zip(sink_df["repeats"].tolist(),
                                                               sink_df["sink_rate_pos0_natural_same_len"].tolist())),
        "max_sink_rate_repeated_by_repeats": dict(zip(sink_df["repeats"].tolist(), sink_df["max_sink_rate_repeated"].tolist())),
        "mean_cos_to_first_at_max_repeats_by_layer": at_max["mean_cos_to_first"].tolist(),
        "last_cos_to_first_at_max_repeats_by_layer": at_max["last_cos_to_first"].tolist(),
    }

    def plot(path):
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

    settings = {"model": subj.model_info.get("name"), "corpus": corpus, "num_samples": N, "seq_len": T,
                "seed": seed, "eps": eps, "prompt_len": prompt_len, "counts": counts, "token": token}
    return AnalysisResult("repeat", summary, {"cosine": cos_df, "sink_rate": sink_df}, {"repeat": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("repeat", settings, subj))
