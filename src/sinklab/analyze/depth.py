"""``depth``: sinks, the first token's norm and the representation entropy, layer by layer (and checkpoint by
checkpoint of a training run).

Queipo-de-Llano et al. 2025 (*Attention sinks and compression valleys in LLMs are two sides of the same
coin*) find that where the first token's hidden norm spikes, the matrix-based entropy of the layer's token
representations drops (a "compression valley") and the first-token sink rate rises, in the same layers.
Per layer this analysis reports:

* ``sink_rate_first``: Sink_1 of the layer, the percentage of (sample, head) pairs whose attention mass on
  position 0 exceeds eps (Gu et al. 2025, Eq. 2, restricted to one layer);
* the top non-first sink positions: the layer's sink-rate curve over positions 1.. (those seen by at least
  10% of the queries), its ``top_k`` largest, and the per-sample secondary sink (each sample's most
  sink-like non-first position, its rate averaged over samples, and the most common token there);
* ``norm_ratio_first``: the first token's hidden-norm ratio ``||h_0^l|| / mean_t ||h_t^l||`` (DESIGN.md,
  the term of ``Sink'_1`` before the mean over layers);
* ``matrix_entropy``: :func:`sinklab.metrics.matrix_entropy` of the layer's block outputs (the T tokens of
  each sample; mean over samples), also divided by ``log(min(T, d))`` and without position 0.

For a ``sinklab train`` run folder every checkpoint it keeps is analysed on the same probe (the run's own
held-out data): ``final/``, ``checkpoint.pt`` and any ``checkpoints/*.pt`` (training itself keeps only
the latest ``checkpoint.pt``, replaced as it goes, and ``final/``; see :func:`run_checkpoints`).
Positions, layers and steps are 0-based / optimizer steps.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from sinklab.analyze.common import AnalysisResult, Subject, analysis, command_line, resolve_subject, run_model
from sinklab.errors import InputError, param
from sinklab.metrics import matrix_entropy, norm_ratio_per_layer
from sinklab.metrics.summary import rankable_positions
from sinklab.zoo.models import DEFAULT_MODEL


@dataclass
class Checkpoint:
    """One saved state of a training run: its optimizer ``step``, where it is, and how to load it."""

    step: int
    source: str  # "final", "checkpoint.pt" or "checkpoints/NAME.pt"
    path: Path
    load: Callable[[], torch.nn.Module]


def run_checkpoints(folder: str | Path) -> list[Checkpoint]:
    """Every model state a ``sinklab train`` run folder keeps, by step: ``final/`` (the finished model,
    step ``summary.json``'s ``steps`` or ``train.steps``), ``checkpoint.pt`` (the latest training
    checkpoint) and ``checkpoints/*.pt`` (copies of earlier checkpoints, kept by whoever trained the run:
    ``sinklab train`` replaces ``checkpoint.pt`` at every ``train.checkpoint_every`` and keeps no
    history). A step held twice is analysed once (``final/`` first, then ``checkpoint.pt``).

    Raises:
        InputError: not a run folder, or a run that keeps no model state at all (names what is missing).
        CheckpointError: a checkpoint file that is not a sinklab checkpoint.
    """
    from sinklab.fileio import read_json
    from sinklab.train.checkpoint import load_run_checkpoint
    from sinklab.runs.config import from_dict, load_config
    from sinklab.models import NATIVE_MARKER, is_run_folder

    folder = Path(folder).expanduser().resolve()
    if not is_run_folder(folder):
        raise InputError(f"{folder} is not a sinklab training run folder (config.toml with a checkpoint, metrics or final/)")
    cfg = load_config(folder / "config.toml")
    found: dict[int, Checkpoint] = {}
    final = folder / "final"
    if (final / NATIVE_MARKER).exists():
        from sinklab.nn.model import SinkLM

        steps = cfg.train.steps
        if (folder / "summary.json").exists():
            steps = int(read_json(folder / "summary.json", "run summary").get("steps", steps))
        found[steps] = Checkpoint(steps, "final", final, lambda: SinkLM.from_pretrained(final).eval())
    files = [folder / "checkpoint.pt"] + sorted((folder / "checkpoints").glob("*.pt"))
    for f in files:
        if not f.is_file():
            continue
        state = load_run_checkpoint(f)
        step = int(state["step"])
        if step in found:
            continue

        def load(state=state):
            from sinklab.nn.model import SinkLM

            model = SinkLM(from_dict(state["config"]).model)
            model.load_state_dict(state["model"])
            return model.eval()

        found[step] = Checkpoint(step, str(f.relative_to(folder)), f, load)
    if not found:
        raise InputError(f"{folder} keeps no model state: no final/ and no checkpoint.pt (a run's weights are not "
                         f"committed with its results; retrain it with `sinklab train {folder / 'config.toml'} --out DIR`)")
    return [found[s] for s in sorted(found)]


def layer_statistics(stats, hidden: Tensor, *, eps: float = 0.3, top_k: int = 3, alpha: float = 1.0,
                     tokens: list[list[str]] | None = None) -> list[dict]:
    """Per-layer rows of :func:`depth` from one pass.

    Args:
        stats: the pass's :class:`~sinklab.capture.ProbeStats` (mass (N, L', H, T), hidden norms (N, L', T)).
        hidden: (N, L, T, d) block outputs (L >= L': a hybrid model's SSM blocks have no attention row).
        eps: sink threshold. top_k: non-first sink positions reported per layer. alpha: entropy order.
        tokens: per sample, the T token strings (for the secondary sink's most common token), or None.

    Returns:
        One dict per attention layer, keyed ``layer`` (0-based block index) and the quantities of the
        module docstring; ``sink{r}_position`` / ``sink{r}_rate`` for r = 2 .. top_k + 1 (rank 1 is
        position 0; position -1 and rate 0 where no further position has a sink rate above 0). The
        sink rates of layer l come from its attention, which reads the output of layer l - 1; the norm
        ratio and the entropy are those of layer l's own output.
    """
    mass = stats.visible_mass.double()  # (N, L', H, T)
    N, Lp, H, T = mass.shape
    k = rankable_positions(T, stats.causal)
    hot = (mass > eps).double()  # (N, L', H, T)
    curve = hot.mean(dim=(0, 2)) * 100  # (L', T)
    per_sample = hot.mean(dim=2) * 100  # (N, L', T)
    ratio = norm_ratio_per_layer(stats.hidden_norms)[..., 0]  # (N, L')
    d = hidden.shape[-1]
    rows = []
    for i, b in enumerate(stats.block_ids):
        h = hidden[:, b]  # (N, T, d)
        ent = matrix_entropy(h, alpha)  # (N,)
        ent_rest = matrix_entropy(h[:, 1:], alpha) if T > 2 else torch.full((N,), math.nan)
        row = {"layer": b, "sink_rate_first": float(curve[i, 0]), "norm_ratio_first": float(ratio[:, i].mean()),
               "matrix_entropy": float(ent.mean()), "matrix_entropy_normalised": float(ent.mean() / math.log(min(T, d))),
               "matrix_entropy_without_first": float(ent_rest.mean())}
        rest = curve[i, 1:k]
        order = rest.argsort(descending=True, stable=True)[:top_k]
        for r in range(top_k):  # position -1 and rate 0: no further position with any sink
            has = r < len(order) and float(rest[order[r]]) > 0
            row[f"sink{r + 2}_position"] = int(order[r]) + 1 if has else -1
            row[f"sink{r + 2}_rate"] = float(rest[order[r]]) if has else 0.0
        if k > 1:
            sec_rate, sec_pos = per_sample[:, i, 1:k].max(dim=1)  # (N,): each sample's most sink-like non-first position
            row["secondary_sink_rate"] = float(sec_rate.mean())
            common = Counter(tokens[n][int(sec_pos[n]) + 1] for n in range(N) if float(sec_rate[n]) > 0) \
                if tokens is not None else Counter()
            row["secondary_sink_top_token"] = common.most_common(1)[0][0] if common else ""
        rows.append(row)
    return rows


@analysis("depth", help={
    "top_k": "non-first sink positions per layer",
    "alpha": "order of the matrix-based Renyi entropy (1 = von Neumann)"})
def depth(
    model: "str | Subject" = DEFAULT_MODEL,
    *,
    corpus: str | None = None,
    num_samples: int = 8,
    seq_len: int | None = None,
    seed: int = 0,
    device: str = "cpu",
    dtype: str | None = None,
    device_map: str | None = None,
    eps: float = 0.3,
    top_k: int = 3,
    alpha: float = 1.0,
    batch_size: int = 16,
) -> AnalysisResult:
    """Per layer: Sink_1, the top non-first sink positions and their rates, the first token's hidden-norm
    ratio and the matrix-based entropy of the hidden states; for a training run, at every checkpoint it keeps.

    Tables: ``layers`` (one row per (step, layer); ``step`` is -1 for a model that is not a training run),
    ``steps`` (per step: Sink_1 over all layers, the layer and value of the lowest entropy and of the
    largest first-token norm ratio). Plot ``depth``: the four quantities against layer (a model), or
    heat maps layer x step of Sink_1, the first token's norm ratio and the entropy (a run).

    Args:
        device, dtype, device_map: where and in which dtype the model runs (:meth:`Subject.load`;
            ``cuda`` / ``bfloat16`` / ``auto`` as ``sinklab measure``); statistics are reduced in float32/float64.
        model: a model (zoo name, folder) or a ``sinklab train`` run folder (all its checkpoints, on the
            run's own held-out data unless ``corpus`` is given), or a :class:`Subject`.
        top_k: non-first sink positions per layer. alpha: order of the matrix entropy (1 = von Neumann).

    Raises:
        InputError: bad sizes, ``top_k`` < 1, ``alpha`` <= 0, a run that keeps no model state.
    """
    import pandas as pd

    if top_k < 1:
        raise InputError(f"{param('top_k')} must be >= 1, got {top_k}")
    if not alpha > 0:
        raise InputError(f"{param('alpha')} must be > 0, got {alpha}")
    ckpts = None
    if isinstance(model, (str, Path)) and _is_run(model):
        ckpts = run_checkpoints(model)
        subj = _run_subject(Path(model), ckpts, corpus, num_samples, seq_len, seed, device, dtype)
    elif isinstance(model, Subject):
        subj = resolve_subject(model)  # as given, once its checks pass (a prefix-LM run is refused)
    else:
        subj = resolve_subject(model, corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                               device=device, dtype=dtype, device_map=device_map)
    ids = subj.input_ids
    tokens = None
    if subj.tokenizer is not None:
        tokens = [subj.tokenizer.convert_ids_to_tokens(r) for r in ids.tolist()]
    rows = []
    if ckpts:  # every checkpoint on the final model's device and dtype
        states = [(c.step, c.source, lambda c=c: Subject.load(c.load(), device=device, dtype=dtype or subj.dtype).model)
                  for c in ckpts]
    else:
        states = [(-1, "model", lambda: subj.model)]
    for step, source, load in states:
        m = load()
        res = run_model(m, ids, hidden=True, batch_size=batch_size)
        for r in layer_statistics(res.stats, res.hidden, eps=eps, top_k=top_k, alpha=alpha, tokens=tokens):
            rows.append({"step": step, "source": source, **r})
        del m, res
    df = pd.DataFrame(rows)
    steps_df = _step_table(df)
    last = df[df["step"] == df["step"].max()].sort_values("layer")
    summary = {
        "steps": steps_df["step"].tolist(), "sources": steps_df["source"].tolist(),
        "sink_rate_first_by_layer": last["sink_rate_first"].tolist(),
        "norm_ratio_first_by_layer": last["norm_ratio_first"].tolist(),
        "matrix_entropy_by_layer": last["matrix_entropy"].tolist(),
        "matrix_entropy_without_first_by_layer": last["matrix_entropy_without_first"].tolist(),
        "secondary_sink_rate_by_layer": last["secondary_sink_rate"].tolist() if "secondary_sink_rate" in last else [],
        **{k: v for k, v in steps_df.iloc[-1].to_dict().items() if k not in ("step", "source")},
    }
    if ckpts is None or len(ckpts) == 1:
        summary["note"] = ("one model state" if ckpts is None else
                           f"the run keeps one model state ({ckpts[0].source}, step {ckpts[0].step}): no history over "
                           "training (sinklab train keeps only its latest checkpoint.pt and final/)")
    name = subj.model_info.get("name")
    title = name if ckpts is None else f"run {Path(model).resolve().name}"
    plot = functools.partial(_plot, df=df, steps_df=steps_df, last=last, eps=eps, alpha=alpha,
                             title=title, size=tuple(ids.shape))
    settings = {"model": name if ckpts is None else str(Path(model).resolve()), "corpus": corpus,
                "num_samples": int(ids.shape[0]), "seq_len": int(ids.shape[1]), "seed": seed, "eps": eps,
                "top_k": top_k, "alpha": alpha}
    return AnalysisResult("depth", summary, {"layers": df, "steps": steps_df}, {"depth": plot}, settings,
                          subj.model_info, subj.corpus_info, command_line("depth", settings, subj))


def _step_table(df):
    """Per step of the ``layers`` table ``df``: Sink_1 over all layers, the layer and value of the lowest
    entropy and of the largest first-token norm ratio, and the entropy's correlations with both."""
    import pandas as pd

    step_rows = []
    for step, d in df.groupby("step", sort=True):
        lo, hi = d.loc[d["matrix_entropy"].idxmin()], d.loc[d["norm_ratio_first"].idxmax()]
        step_rows.append({"step": step, "source": d["source"].iloc[0], "sink_rate_first": float(d["sink_rate_first"].mean()),
                          "min_entropy_layer": int(lo["layer"]), "min_entropy": float(lo["matrix_entropy"]),
                          "max_norm_ratio_layer": int(hi["layer"]), "max_norm_ratio_first": float(hi["norm_ratio_first"]),
                          "corr_entropy_sink_rate": _corr(d["matrix_entropy"], d["sink_rate_first"]),
                          "corr_entropy_log_norm_ratio": _corr(d["matrix_entropy"], d["norm_ratio_first"].map(math.log))})
    return pd.DataFrame(step_rows)


def _plot(path, *, df, steps_df, last, eps: float, alpha: float, title: str, size: tuple[int, int]) -> None:
    """One model state: Sink_1 and the secondary sinks, the first token's norm ratio and the entropy against
    layer; several (a run): heat maps layer x step of Sink_1, the norm ratio and the entropy."""
    import matplotlib.pyplot as plt
    import numpy as np

    if len(steps_df) == 1:
        fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
        axes[0].plot(last["layer"], last["sink_rate_first"], "o-", ms=3, label="Sink_1 (position 0)")
        if "secondary_sink_rate" in last:
            axes[0].plot(last["layer"], last["secondary_sink_rate"], "s--", ms=3, label="secondary sink (per sample)")
        axes[0].plot(last["layer"], last["sink2_rate"], "^:", ms=3, label="top non-first position")
        axes[0].set_ylabel(f"sink rate (%, eps={eps})")
        axes[0].legend(fontsize=7)
        axes[1].plot(last["layer"], last["norm_ratio_first"], "o-", ms=3)
        axes[1].set_yscale("log")
        axes[1].set_ylabel("||h_0|| / mean_t ||h_t||")
        axes[2].plot(last["layer"], last["matrix_entropy"], "o-", ms=3, label="all tokens")
        axes[2].plot(last["layer"], last["matrix_entropy_without_first"], "s--", ms=3, label="without position 0")
        axes[2].set_ylabel(f"matrix entropy (nats, alpha={alpha})")
        axes[2].legend(fontsize=7)
        for ax in axes:
            ax.set_xlabel("layer (0-based)")
        fig.suptitle(f"{title}: N={size[0]} T={size[1]}", fontsize=9)
    else:
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for ax, col, label, log in ((axes[0], "sink_rate_first", "Sink_1 per layer (%)", False),
                                    (axes[1], "norm_ratio_first", "log10 first-token norm ratio", True),
                                    (axes[2], "matrix_entropy", f"matrix entropy (nats, alpha={alpha})", False)):
            grid = df.pivot(index="layer", columns="step", values=col).sort_index()
            vals = np.log10(grid.to_numpy()) if log else grid.to_numpy()
            im = ax.imshow(vals, aspect="auto", origin="lower", cmap="viridis")
            ax.set_xticks(range(grid.shape[1]), [str(s) for s in grid.columns], rotation=90, fontsize=6)
            ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index], fontsize=7)
            ax.set_xlabel("training step")
            ax.set_ylabel("layer (0-based)")
            ax.set_title(label, fontsize=9)
            fig.colorbar(im, ax=ax)
        fig.suptitle(f"{title}: emergence over depth and training, N={size[0]} T={size[1]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def _is_run(model: "str | Path") -> bool:
    from sinklab.models import is_run_folder

    p = Path(model).expanduser()
    return p.is_dir() and is_run_folder(p.resolve())


def _run_subject(folder: Path, ckpts: list[Checkpoint], corpus, num_samples: int, seq_len: int | None,
                 seed: int, device: str, dtype: str | None) -> Subject:
    """The probe of a run's checkpoints: with ``final/``, :func:`resolve_subject` (the run's held-out data, or
    ``corpus``); without it, the run's held-out data prepared from its config (no tokenizer strings).
    ``seq_len`` None: the run's probe length (:meth:`sinklab.runs.Run.probe_len`)."""
    if any(c.source == "final" for c in ckpts):
        return resolve_subject(str(folder), corpus=corpus, num_samples=num_samples, seq_len=seq_len, seed=seed,
                               device=device, dtype=dtype)
    if corpus is not None:
        raise InputError(f"{folder} has no final/ (no saved tokenizer): only its own held-out data can be used, drop {param('corpus')}")
    from sinklab.runs import Run, load_config

    run = Run(load_config(folder / "config.toml"), folder.resolve())
    probe = run.probe(num_samples, run.probe_len("auto") if seq_len is None else seq_len, seed, "auto")
    info = {"name": str(folder.resolve()), "run": str(folder.resolve()), "architecture": f"sinklab:{run.config.model.attention}",
            "prefix_len": run.config.train.prefix_len}
    return resolve_subject(Subject(Subject.load(ckpts[-1].load(), device=device, dtype=dtype).model, probe.input_ids,
                                   None, info, {"name": "run", **probe.details}, False, seed, source=str(folder)))


def _corr(a, b) -> float:
    """Pearson correlation of two equal-length series (NaN when either is constant or shorter than 3)."""
    import numpy as np

    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])

