"""Sink tracking during training: validation loss and sink metrics on a fixed probe set.

Uses :func:`sinklab.capture.collect` and :func:`sinklab.metrics.summarize` (no second sink
metric here). Paper probe (Gu et al. 2025): 100 windows of 64 tokens, eps = 0.3.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from sinklab.runs.config import TrackConfig


class SinkTracker:
    """Evaluate a model on fixed validation windows and a fixed probe set.

    Args:
        probe_ids: (N, T_probe) int64 probe windows (0-based positions; position 0 = token 1).
        val_inputs, val_targets: (M, T) int64 validation windows; masked targets are -100.
        cfg: the tracker config (eps, positions, emergence level).
        prefix_len: prefix-LM prefix length used for the validation loss (0 = causal).
        objective: the run's training objective (:mod:`sinklab.train.objective`); its
            ``eval_sums`` gives the validation loss (next-token cross-entropy, or the masked
            diffusion loss with fixed masks). Default: the causal objective with ``prefix_len``.

    The probe runs on clean text (no mask tokens) under the model's own mask: causal, prefix LM,
    or bidirectional for a masked diffusion model.
    """

    def __init__(self, probe_ids: torch.Tensor, val_inputs: torch.Tensor, val_targets: torch.Tensor,
                 cfg: TrackConfig, prefix_len: int = 0, objective=None) -> None:
        from sinklab.train.objective import CausalObjective

        self.objective = CausalObjective(prefix_len) if objective is None else objective
        self.probe_ids = probe_ids
        self.val_inputs = val_inputs
        self.val_targets = val_targets
        self.cfg = cfg
        self.prefix_len = prefix_len
        self.history: list[dict[str, Any]] = []

    @torch.no_grad()
    def validation_loss(self, model: torch.nn.Module, device: torch.device, autocast=contextlib.nullcontext) -> float:
        """The objective's loss (nats/token) on the validation windows: the mean cross-entropy over the
        unmasked targets (causal), or the masked diffusion loss with the fixed validation masks."""
        total, count = 0.0, 0.0
        bs = self.cfg.batch_size
        for s in range(0, len(self.val_inputs), bs):
            x = self.val_inputs[s : s + bs].to(device)
            y = self.val_targets[s : s + bs].to(device)
            part, n = self.objective.eval_sums(model, x, y, s, autocast)
            total += part
            count += n
        return total / max(count, 1)

    def baseline_loss(self, logp) -> float:
        """The validation loss (:meth:`validation_loss`, the same windows, batches and fixed masks) of a predictor
        that gives every target the log-probabilities ``logp`` (V,) whatever the input: the unigram baseline of
        :func:`sinklab.data.baseline.unigram_logprobs` under the run's own objective (for masked diffusion the
        masked diffusion loss, not the next-token cross-entropy). nan without any counted target."""
        logp = torch.as_tensor(logp, dtype=torch.float64)
        total, count = 0.0, 0.0
        bs = self.cfg.batch_size
        for s in range(0, len(self.val_inputs), bs):
            part, n = self.objective.baseline_sums(logp, self.val_inputs[s : s + bs], self.val_targets[s : s + bs], s)
            total += part
            count += n
        return total / count if count else float("nan")

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, step: int, device: torch.device, autocast=contextlib.nullcontext) -> dict[str, Any]:
        """Metrics at ``step``: ``val_loss``, ``sink_rate`` (K percentages, position 1 first),
        ``attention_mass_first``, ``norm_ratio`` (Sink'_1, mean variant), ``max_norm_ratio``,
        ``top_sink_position`` (0-based), ``renormalised``, the mask-aware ``sink_rate_visible`` and
        ``attention_mass_first_visible`` (the probe runs under the training mask: prefix LM and
        sliding window), and ``sink_rate_virtual`` (Sink*) for operations with a virtual key.
        Appended to :attr:`history`.

        The model is put in eval mode and restored to its previous mode afterwards.
        """
        from sinklab.capture import collect
        from sinklab.metrics import summarize

        was_training = model.training
        model.eval()
        try:
            val_loss = self.validation_loss(model, device, autocast)
            stats = collect(model, self.probe_ids, batch_size=self.cfg.batch_size, prefix_len=self.prefix_len)
            s = summarize(stats, eps=self.cfg.eps, positions=self.cfg.positions, n_boot=200)
        finally:
            model.train(was_training)
        rec = {
            "step": step,
            "val_loss": round(val_loss, 6),
            "sink_rate": s["sink_rate"],
            "attention_mass_first": s["attention_mass_first"],
            "norm_ratio": s["norm_ratio"][0],
            "max_norm_ratio": s["max_norm_ratio"],
            "top_sink_position": s["top_sink_position"],
            "renormalised": s["renormalised"],
            "sink_rate_visible": s["sink_rate_visible"],
            "attention_mass_first_visible": s["attention_mass_first_visible"],
        }
        if "sink_rate_virtual" in s:
            rec["sink_rate_virtual"] = s["sink_rate_virtual"]
        self.history.append(rec)
        return rec

    def emergence_step(self, level: float | None = None) -> int | None:
        """First tracked step whose Sink_1 (percent) reached ``level`` (default ``cfg.emerge_level``), or None."""
        level = self.cfg.emerge_level if level is None else level
        for rec in self.history:
            if rec["sink_rate"][0] >= level:
                return int(rec["step"])
        return None
