"""Next-token cross-entropy from the final hidden states, chunked over tokens.

``linear_cross_entropy(h, W, y)`` equals ``F.cross_entropy((h @ W.T).float(), y,
ignore_index=-100)`` (mean over the targets that are not ignored) but never holds the
(N, V) float32 logits of the whole batch: rows are processed in chunks of at most
``chunk_elems`` logits, and each chunk's gradient with respect to ``h`` and ``W`` is
computed right away in the forward pass (the softmax minus the one-hot target,
``d loss / d logits = (softmax(z) - onehot(y)) / n``), so the backward pass only
scales the stored gradients by the incoming gradient. This is the "fused linear
cross-entropy" of Liger-Kernel (Hsu et al. 2024), written in plain PyTorch for CPU.

Precision follows autocast as the unfused ``lm_head`` + ``F.cross_entropy`` would:
under autocast the matmuls run in the autocast dtype (bf16), the log-sum-exp and the
softmax in float32; the weight gradient is accumulated in float32. On a CPU the element-wise
work of a chunk runs in :mod:`sinklab.nn.native`'s fused kernels where they are built (bit for
bit the same numbers).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from sinklab.errors import InputError
import sinklab.nn.native as native

__all__ = ["linear_cross_entropy"]

_LOG2E = 1.0 / math.log(2.0)

CHUNK_ELEMS = 1 << 21
"""Default logits per chunk (8 MiB of float32)."""

MIN_ROWS = 256
"""Fewest rows per chunk (and at least d rows): every chunk adds a (V, d) product into the float32
weight gradient, so chunks of few rows would spend more on that than on their own logits (at
V 32000, d 768 and 32 rows per chunk the training step took 1.55x the CPU time of the one with full logits:
``benchmarks/results/train_throughput_paper60m-rows32.json``). A chunk is then at most as large
as the weight gradient itself (V x d float32) or ``chunk_elems``."""


def _compute_dtype(t: Tensor) -> torch.dtype:
    dev = t.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return t.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss and both gradients in one chunked pass; backward scales them."""

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, chunk_elems: int, min_rows: int, ignore_index: int,
                row_weights: Tensor | None) -> Tensor:
        cdtype = _compute_dtype(h)
        N, V = h.shape[0], weight.shape[0]
        rows = max(min_rows, chunk_elems // max(1, V))
        valid = targets != ignore_index  # (N,)
        n_valid = valid.sum()
        inv_n = 1.0 / n_valid.clamp_min(1).to(torch.float32)  # 0/0 handled below: loss is nan like F.cross_entropy
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.detach().to(cdtype), weight.detach().to(cdtype)  # (N, d), (V, d)
            grad_h = torch.empty(N, h.shape[1], dtype=h.dtype, device=h.device) if need_h else None
            grad_w = torch.zeros(V, h.shape[1], dtype=torch.float32, device=h.device) if need_w else None
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            # One buffer per intermediate, reused by every chunk: a fresh multi-MB tensor per chunk costs
            # its page faults again on CPU (as much as the chunk's softmax); the arithmetic is unchanged.
            n0 = min(rows, N)
            zbuf = torch.empty(n0, V, dtype=torch.float32, device=h.device)  # float32 logits / softmax
            lowp = cdtype != torch.float32
            cbuf = torch.empty(n0, V, dtype=cdtype, device=h.device) if lowp else None  # logits / dlogits in cdtype
            wbuf = torch.empty(V, h.shape[1], dtype=cdtype, device=h.device) if need_w else None  # a chunk's dW
            # (a half-precision dW is widened exactly into a reused float32 buffer before the add; float64's is added as is)
            half = cdtype in (torch.bfloat16, torch.float16)
            wbuf32 = torch.empty(V, h.shape[1], dtype=torch.float32, device=h.device) if need_w and half else None
            fuse = native.takes_cross_entropy(h.device, V, cdtype)  # the fused kernels (the same bits) take it
            for i0 in range(0, N, rows):
                i1 = min(N, i0 + rows)
                z = zbuf[: i1 - i0]  # (n, V) logits
                ok = valid[i0:i1]  # (n,)
                yc = torch.where(ok, targets[i0:i1], 0)  # (n,) safe index
                # the kernels copy the eager passes' vector arithmetic: not a chunk whose size leaves a scalar tail
                fused = fuse and ((i1 - i0) * V) % 32 == 0
                if lowp:
                    zl = torch.mm(hc[i0:i1], wc.T, out=cbuf[: i1 - i0])
                    if not fused:
                        z.copy_(zl)
                else:
                    zl = torch.mm(hc[i0:i1], wc.T, out=z)
                zy = zl.gather(1, yc[:, None]).float()  # (n, 1) target logit (a bf16 logit widens exactly)
                if fused:  # m, e = exp(z - m) into z, s = sum e
                    m, s = native.cross_entropy_exp(zl, z)
                    e = z
                else:
                    m = z.amax(dim=-1, keepdim=True)  # (n, 1)
                    e = z.sub_(m).mul_(_LOG2E).exp2_()  # (n, V) exp(z - m), as exp2 (faster than exp on CPU), in place
                    s = e.sum(dim=-1, keepdim=True)  # (n, 1)
                okf = ok.to(torch.float32)[:, None]  # (n, 1)
                if row_weights is not None:
                    okf = okf * row_weights[i0:i1, None].to(torch.float32)  # weighted mean (diffusion loss)
                total += ((m + s.log() - zy) * okf).sum()  # logsumexp - target logit
                if not (need_h or need_w):
                    continue
                w = okf * inv_n  # (n, 1) weight of each row in the mean
                if fused:  # p = e (w / s), p[y] -= w, written as cdtype
                    pc = cbuf[: i1 - i0] if lowp else e
                    native.cross_entropy_grad(e, w / s, w, yc, pc)
                else:
                    p = e.mul_(w / s)  # softmax / n_valid
                    p[torch.arange(i1 - i0, device=h.device), yc] -= w[:, 0]  # - onehot / n_valid: d loss / d logits
                    pc = cbuf[: i1 - i0].copy_(p) if lowp else p
                if need_h:
                    grad_h[i0:i1] = (pc @ wc).to(h.dtype)  # (n, d)
                if need_w:
                    dw = torch.mm(pc.T, hc[i0:i1], out=wbuf)  # (V, d) in cdtype
                    if fused and cdtype == torch.bfloat16:
                        native.add_widened(grad_w, dw)  # grad_w += float(dw) in one pass
                    else:
                        grad_w.add_(wbuf32.copy_(dw) if half else dw)  # accumulated in float32
        ctx.save_for_backward(grad_h if need_h else None, grad_w if need_w else None)
        ctx.weight_dtype = weight.dtype
        loss = total / n_valid.to(torch.float32)  # nan when no target counts, as F.cross_entropy
        return loss

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gh = None if grad_h is None else grad_h * grad_out.to(grad_h.dtype)
        gw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_elems: int = CHUNK_ELEMS, min_rows: int | None = None,
    ignore_index: int = -100, weights: Tensor | None = None,
) -> Tensor:
    """Mean cross-entropy (nats) of the logits ``hidden @ weight.T`` against ``targets``.

    Args:
        hidden: (..., d) final hidden states (after the final norm), any float dtype.
        weight: (V, d) output-embedding (LM head) matrix.
        targets: (...) int64 target ids in [0, V), or ``ignore_index`` to leave a position
            out; same leading shape as ``hidden``.
        chunk_elems: logits computed at once (memory bound of the float32 chunk), but at
            least ``min_rows`` rows per chunk.
        min_rows: default ``max(MIN_ROWS, d)`` (:data:`MIN_ROWS`), so that a chunk holds at most
            ``max(chunk_elems, V x d)`` logits.
        ignore_index: target value not counted (-100, as ``F.cross_entropy`` and
            ``sinklab.data.packing.IGNORE_INDEX``).
        weights: optional (...) float weights, same shape as ``targets`` (not differentiated):
            the loss becomes ``sum_i w_i ce_i / n`` over the ``n`` counted positions (the masked
            diffusion loss's 1/t weights, :func:`sinklab.diffusion.masking.diffusion_targets`).

    Returns:
        0-dim float32 tensor: sum over counted positions of ``logsumexp(z) - z[y]``,
        divided by their number (nan when no position counts, as ``F.cross_entropy``).
        Differentiable with respect to ``hidden`` and ``weight``.

    Raises:
        InputError: shapes that do not match, or a non-positive ``chunk_elems``.
    """
    if weights is not None and weights.shape != targets.shape:
        raise InputError(f"weights must have the targets' shape {tuple(targets.shape)}, got {tuple(weights.shape)}")
    if hidden.shape[:-1] != targets.shape or weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise InputError(f"expected hidden (..., d), weight (V, d), targets (...), got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(targets.shape)}")
    if chunk_elems <= 0 or (min_rows is not None and min_rows <= 0):
        raise InputError(f"chunk_elems and min_rows must be positive, got {chunk_elems} and {min_rows}")
    min_rows = max(MIN_ROWS, hidden.shape[-1]) if min_rows is None else min_rows
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), chunk_elems, min_rows,
                                     ignore_index, None if weights is None else weights.reshape(-1).detach())
