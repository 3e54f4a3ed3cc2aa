"""Training objectives: what the loss of a micro-batch is (``train.objective``).

* ``causal`` -- next-token cross-entropy of a causal (or prefix) LM: the packing's targets.
* ``masked_diffusion`` -- the masked diffusion loss of MDLM / LLaDA
  (:mod:`sinklab.diffusion.masking`) on a bidirectional model (``model.causal = false``): the
  window's own tokens are the targets at the masked positions, the input is the window with
  those positions replaced by the mask token.

Both take the same windows from :class:`~sinklab.data.packing.PackedData`, so a causal run and
a diffusion run with the same data config read exactly the same tokens in the same order.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from sinklab.data.packing import IGNORE_INDEX
from sinklab.runs.config import OBJECTIVES  # the names live with the config that checks them


class CausalObjective:
    """Next-token cross-entropy (nats/token) over the counted targets; ``prefix_len`` for a prefix LM;
    ``document_ids`` for intra-document masking (``data.attention_mask = "document"``): the packer's
    :meth:`~sinklab.data.packing.Packer.document_ids`, windows (B, T) -> document ids (B, T), which
    the model gets in training and validation forwards; None = attention across documents."""

    name = "causal"

    def __init__(self, prefix_len: int = 0, document_ids=None, restart_positions: bool = False) -> None:
        self.prefix_len = prefix_len
        self.document_ids = document_ids
        self.restart_positions = restart_positions  # positions 0, 1, ... in every document (data.restart_positions)

    def _documents(self, x: Tensor) -> dict:
        if self.document_ids is None:
            return {}
        more = {"restart_positions": True} if self.restart_positions else {}
        return {"document_ids": self.document_ids(x), **more}

    def loss(self, model: torch.nn.Module, x: Tensor, y: Tensor, first_sample: int) -> Tensor:
        """Mean next-token cross-entropy of ``model`` on inputs x (B, T) and targets y (B, T) (-100 = not
        counted), from the final hidden states (:func:`sinklab.nn.loss.linear_cross_entropy`)."""
        return model(x, prefix_len=self.prefix_len, targets=y, **self._documents(x)).loss

    def count(self, x: Tensor, y: Tensor) -> float:
        """Positions the mean runs over (weights a data-parallel rank's share)."""
        return float((y != IGNORE_INDEX).sum())

    @torch.no_grad()
    def eval_sums(self, model: torch.nn.Module, x: Tensor, y: Tensor, first_sample: int,
                  autocast=contextlib.nullcontext) -> tuple[float, float]:
        """(sum of cross-entropies, number of counted targets) on a validation batch (full logits)."""
        with autocast():
            logits = model(x, prefix_len=self.prefix_len, **self._documents(x)).logits
        total = float(F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"))
        return total, float((y != IGNORE_INDEX).sum())

    def baseline_sums(self, logp: Tensor, x: Tensor, y: Tensor, first_sample: int) -> tuple[float, float]:
        """:meth:`eval_sums` of a predictor that gives every target the log-probabilities ``logp`` (V,) float64
        whatever the input (the unigram baseline, :func:`sinklab.data.baseline.unigram_logprobs`)."""
        ok = y != IGNORE_INDEX
        return float(-logp[y[ok]].sum()), float(ok.sum())


@dataclass
class MaskedDiffusionObjective:
    """The masked diffusion loss (:mod:`sinklab.diffusion.masking`) of a bidirectional model.

    Fields:
        mask_id: id of the mask token (the tokenizer's size).
        eps: lower end of the mask ratio t ~ U(eps, 1).
        seed: seed of the training draws (``train.seed``).
        eval_seed: seed of the validation draws (``track.seed``; the same masks at every evaluation).
        keep_ids: ids never masked (BOS).
        keep_positions: 0-based positions never masked (the tokens the packing inserts: ``random_first2``'s two).
    """

    mask_id: int
    eps: float
    seed: int
    eval_seed: int
    keep_ids: tuple[int, ...] = ()
    keep_positions: tuple[int, ...] = ()
    name = "masked_diffusion"

    def maskable(self, x: Tensor) -> Tensor:
        """(B, T) bool: text positions of the clean ids x (B, T) (not BOS, not the inserted tokens)."""
        m = torch.ones_like(x, dtype=torch.bool)
        for i in self.keep_ids:
            m &= x != i
        for p in self.keep_positions:
            m[:, p] = False
        return m

    def batch(self, x: Tensor, first_sample: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        """(x_t (B, T) model input, targets (B, T), weights (B, T)) of clean windows x (B, T)."""
        from sinklab.diffusion.masking import corrupt, diffusion_targets, mask_ratio_and_mask

        t, masked = mask_ratio_and_mask(seed, first_sample, self.maskable(x), self.eps)
        targets, w = diffusion_targets(x, masked, t)
        return corrupt(x, masked, self.mask_id), targets, w

    def loss(self, model: torch.nn.Module, x: Tensor, y: Tensor, first_sample: int) -> Tensor:
        """Masked diffusion loss (nats/token, LLaDA Eq. 3) of the clean windows x (B, T); y is unused."""
        xt, targets, w = self.batch(x, first_sample, self.seed)
        return model(xt, targets=targets, target_weights=w).loss

    def count(self, x: Tensor, y: Tensor) -> float:
        """The loss is normalised by every position of the batch (B T)."""
        return float(x.numel())

    @torch.no_grad()
    def eval_sums(self, model: torch.nn.Module, x: Tensor, y: Tensor, first_sample: int,
                  autocast=contextlib.nullcontext) -> tuple[float, float]:
        """(loss x B T, B T) on validation windows, with the fixed masks of ``eval_seed``."""
        xt, targets, w = self.batch(x, first_sample, self.eval_seed)
        with autocast():
            loss = model(xt, targets=targets, target_weights=w).loss
        return float(loss) * x.numel(), float(x.numel())

    def baseline_sums(self, logp: Tensor, x: Tensor, y: Tensor, first_sample: int) -> tuple[float, float]:
        """:meth:`eval_sums` of a predictor that gives every masked position the log-probabilities ``logp`` (V,)
        float64 (the unigram baseline): the same fixed validation masks and 1/t weights, ``sum w_i (-logp[x_i]) / n``
        per batch as :func:`sinklab.nn.loss.linear_cross_entropy` weighs them, times B T."""
        _, targets, w = self.batch(x, first_sample, self.eval_seed)
        ok = targets != IGNORE_INDEX
        n = max(int(ok.sum()), 1)
        part = float((w[ok].to(torch.float64) * -logp[targets[ok]]).sum()) / n
        return part * x.numel(), float(x.numel())


def make_objective(cfg, tc, packer) -> CausalObjective | MaskedDiffusionObjective:
    """The objective of run config ``cfg`` for the tokenized corpus ``tc`` and its packer.

    The mask token of masked diffusion gets the id ``tc.vocab_size`` (the first id past the
    tokenizer's), which :func:`sinklab.data.tokenizer.with_mask_token` gives it in the saved tokenizer.

    Raises:
        ConfigError: the model has no embedding row for the mask token.
    """
    from sinklab.errors import ConfigError

    if cfg.train.objective == "causal":
        return CausalObjective(cfg.train.prefix_len,
                               document_ids=packer.document_ids if cfg.data.document_mask else None,
                               restart_positions=bool(cfg.data.restart_positions))
    mask_id = tc.vocab_size
    if mask_id >= cfg.model.vocab_size:
        raise ConfigError(f"model.vocab_size={cfg.model.vocab_size} has no row for the mask token (id {mask_id}); "
                          f"leave model.vocab_size unset or make it at least {mask_id + 1}")
    return MaskedDiffusionObjective(mask_id=mask_id, eps=cfg.train.mask_eps, seed=cfg.train.seed,
                                    eval_seed=cfg.track.seed, keep_ids=(tc.bos_id,), keep_positions=packer.inserted_positions)
