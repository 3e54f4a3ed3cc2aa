"""Why differential attention trains at about half softmax's speed on CPU: the cost of its two maps in SDPA.

Usage::

    python benchmarks/diff_sdpa_cost.py [--T 1024] [--B 4] [--reps 5] [--out FILE]

Times ``F.scaled_dot_product_attention`` forward + backward (causal, float32, 1 thread, process CPU time) at
the shapes of ``benchmarks/train_throughput.py``'s operation table (d_model 128, 4 heads of d_h 32, 4096
tokens per step) for softmax and for the ways differential attention (Ye et al. 2024) can call it:

* ``softmax``: H = 4 heads, q/k/v width 32 (the reference).
* ``diff padded`` (what :class:`sinklab.nn.Attention` does): 2H = 8 maps, q/k halves (16) zero-padded to
  the value's width 32 so that SDPA keeps its fused kernel.
* ``diff unpadded``: 8 maps, q/k width 16, v width 32 (SDPA falls back to its unfused math path).
* ``diff four calls``: the value split in halves too, 16 maps of width 16 (the paper's flash-attention code).
* ``diff tiled C``: no SDPA: query tiles of C rows (:func:`sinklab.attention_masks.query_blocks`), each computing
  both maps (q/k width 16), their difference ``A1 - lambda A2`` and one ``W V`` product of width 32, with the
  analytic backward in PyTorch ops (:class:`TiledDiff`; the two-map kernel a faster ``diff`` would need). Its
  output and gradients are checked against ``diff padded`` (``max_abs_diff`` in the file).

Prints each time and its ratio to softmax, and writes ``benchmarks/results/diff_sdpa_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from sinklab.train.fingerprint import cpu_model

RESULTS = Path(__file__).resolve().parent / "results"


def cost(B: int, T: int, maps: int, dqk: int, dv: int, reps: int) -> float:
    """CPU seconds of one SDPA forward + backward over (B, maps, T, dqk) queries / keys and (B, maps, T, dv) values."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, maps, T, dqk, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(B, maps, T, dv, generator=g).requires_grad_()
    for _ in range(2):  # warm-up
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    t = time.process_time()
    for _ in range(reps):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    return (time.process_time() - t) / reps


class TiledDiff(torch.autograd.Function):
    """Differential attention ``(softmax(q1 k1^T s) - lam softmax(q2 k2^T s)) v``, causal, over query tiles.

    q, k (B, 2H, T, d) (maps 0..H-1 the first, H..2H-1 the second); v (B, H, T, d_v); lam a 0-dim tensor;
    -> (B, H, T, d_v). Backward per tile: ``dW = dO V^T``, ``dS1 = A1 (dW - rowsum(dW A1))``,
    ``dS2 = -lam A2 (dW - rowsum(dW A2))``, ``dlam = -sum(dW A2)``."""

    @staticmethod
    def _tile(q, k, i0, i1, j0, j1, scale):
        from sinklab.attention_masks import CAUSAL, visible

        B, H2, _, d = q.shape
        m = visible(torch.arange(i0, i1), torch.arange(j0, j1), CAUSAL)
        bias = torch.zeros(m.shape).masked_fill_(~m, float("-inf"))
        qc, kc = q[:, :, i0:i1].reshape(B * H2, i1 - i0, d), k[:, :, j0:j1].reshape(B * H2, j1 - j0, d)
        w = torch.softmax(torch.baddbmm(bias, qc, kc.transpose(1, 2), alpha=scale), -1)
        return qc, kc, w.view(B, 2, H2 // 2, i1 - i0, j1 - j0)

    @staticmethod
    def forward(ctx, q, k, v, lam, chunk):
        from sinklab.attention_masks import query_blocks

        B, H2, T, d = q.shape
        scale, lamf = d ** -0.5, float(lam)
        out = torch.empty(B, H2 // 2, T, v.shape[-1])
        for i0, i1, j0, j1 in query_blocks(T, chunk):
            _, _, w = TiledDiff._tile(q, k, i0, i1, j0, j1, scale)
            out[:, :, i0:i1] = torch.matmul(torch.sub(w[:, 0], w[:, 1], alpha=lamf), v[:, :, j0:j1])
        ctx.save_for_backward(q, k, v, lam)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, dout):
        from sinklab.attention_masks import query_blocks

        q, k, v, lam = ctx.saved_tensors
        B, H2, T, d = q.shape
        scale, lamf = d ** -0.5, float(lam)
        dq, dk, dv, dlam = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros(())
        for i0, i1, j0, j1 in query_blocks(T, ctx.chunk):
            qc, kc, w = TiledDiff._tile(q, k, i0, i1, j0, j1, scale)
            do = dout[:, :, i0:i1]
            dv[:, :, j0:j1] += torch.matmul(torch.sub(w[:, 0], w[:, 1], alpha=lamf).transpose(-1, -2), do)
            dw = torch.matmul(do, v[:, :, j0:j1].transpose(-1, -2))  # (B, H, C, Tk)
            dlam -= (dw * w[:, 1]).sum()
            g = torch.stack([dw, dw * -lamf], 1)  # (B, 2, H, C, Tk): d loss / d A1, d loss / d A2
            ds = (w * (g - (g * w).sum(-1, keepdim=True))).view(B * H2, i1 - i0, j1 - j0)
            dq[:, :, i0:i1] = torch.bmm(ds, kc).mul_(scale).view(B, H2, i1 - i0, d)
            dk[:, :, j0:j1] += torch.bmm(ds.transpose(1, 2), qc).mul_(scale).view(B, H2, j1 - j0, d)
        return dq, dk, dv, dlam, None


def tiled_cost(B: int, T: int, chunk: int, reps: int, H: int = 4, d: int = 16, dv: int = 32) -> tuple[float, float]:
    """CPU seconds of one :class:`TiledDiff` forward + backward, and the largest difference of its output and
    gradients from the padded two-map SDPA call (what the model computes)."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(B, 2 * H, T, d, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(B, H, T, dv, generator=g).requires_grad_()
    lam = torch.tensor(0.3, requires_grad=True)
    probe = torch.linspace(-1, 1, dv)

    def grads(fn):
        for t in (q, k, v, lam):
            t.grad = None
        y = fn()
        (y * probe).sum().backward()
        return [y.detach()] + [t.grad.clone() for t in (q, k, v, lam)]

    def padded():
        y = F.scaled_dot_product_attention(F.pad(q, (0, dv - d)), F.pad(k, (0, dv - d)), torch.cat([v, v], 1),
                                           is_causal=True, scale=d ** -0.5)
        return y[:, :H] - lam * y[:, H:]

    ref = grads(padded)
    got = grads(lambda: TiledDiff.apply(q, k, v, lam, chunk))
    err = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    t = time.process_time()
    for _ in range(reps):
        TiledDiff.apply(q, k, v, lam, chunk).sum().backward()
    return (time.process_time() - t) / reps, err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "diff_sdpa_cost.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = {"softmax": (4, 32, 32), "diff padded": (8, 32, 32), "diff unpadded": (8, 16, 32),
            "diff four calls": (16, 16, 16)}
    out = {}
    for name, (maps, dqk, dv) in rows.items():
        out[name] = {"maps": maps, "qk_width": dqk, "v_width": dv, "cpu_s": cost(a.B, a.T, maps, dqk, dv, a.reps)}
    for chunk in (32, 128):
        sec, err = tiled_cost(a.B, a.T, chunk, a.reps)
        out[f"diff tiled {chunk}"] = {"maps": 8, "qk_width": 16, "v_width": 32, "cpu_s": sec, "chunk": chunk,
                                      "max_abs_diff_vs_padded": err}
    ref = out["softmax"]["cpu_s"]
    print(f"SDPA forward + backward, causal, B={a.B}, T={a.T}, float32, 1 thread (CPU seconds per call)")
    for name, r in out.items():
        r["vs_softmax"] = r["cpu_s"] / ref
        print(f"{name:16s} {r['maps']:3d} maps  q/k {r['qk_width']:3d}  v {r['v_width']:3d}  {r['cpu_s']:.4f} s  "
              f"{r['vs_softmax']:.2f}x softmax")
    rec = {"command": "python benchmarks/diff_sdpa_cost.py " + f"--T {a.T} --B {a.B} --reps {a.reps}",
           "torch": torch.__version__, "machine": platform.processor() or platform.machine(), "cpu_model": cpu_model(),
           "load_1min": __import__("os").getloadavg()[0], "rows": out}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
