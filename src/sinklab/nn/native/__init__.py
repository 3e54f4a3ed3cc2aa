"""Fused native kernels: the tile path's and the chunked cross-entropy's element-wise work in one C++ loop per row,
bit for bit.

The tile path (:class:`sinklab.nn.attention._TileAttention`) spends one full memory pass per element-wise step of an
operation's :meth:`~sinklab.nn.ops.AttentionOp.tile_weights` / :meth:`~sinklab.nn.ops.AttentionOp.tile_grad`
(softpick: about 27 per tile). ``tile_kernels.cpp`` does the same float32 arithmetic, in the same order, as one loop
over each row: the forward reads the logits and writes the weights; the backward reads the logits and
``dW = dO V^T`` and writes the weights (for ``dV``) and ``dS``. The results equal the eager tile functions' bit for
bit at one thread (``tests/test_native_tiles.py`` checks every operation the kernels take): the exponentials are
the Sleef functions PyTorch's own CPU kernels call, and each row sum re-implements PyTorch's cascade sum. So the
kernels change speed only, never a number: a study trained with them has the fingerprint of one trained without.

The chunked cross-entropy (:func:`sinklab.nn.loss.linear_cross_entropy`, float32 or bfloat16 logits, a vocabulary
that is a multiple of the vector width) runs its per-chunk log-sum-exp and softmax gradient the same way
(:func:`cross_entropy_exp`, :func:`cross_entropy_grad`, :func:`add_widened`).

Operations (:meth:`~sinklab.nn.ops.AttentionOp.native_tile`): the element-wise family (sigmoid, sigmoid_logn,
sigmoid_norm, sigmoid_pnorm with p = 2, relu, relu_norm, elu1_sim, and the kernels elu1, elu1_norm, linear,
linear_relu, linear_relu_norm), softpick and softmax_pnorm (any p). Tiles: float32 on the CPU, keys a multiple of the vector width (16 with
AVX-512, else 8) and the tile's size a multiple of 32 (elsewhere an eager pass takes a scalar path for its last elements, which the kernels do not copy);
any other tile, operation or option, and everything under ``torch.compile``, runs the eager functions.

Build: ``torch.utils.cpp_extension`` (a C++ compiler and ``ninja``; AVX2), once per machine and source version,
cached in PyTorch's extensions folder (``TORCH_EXTENSIONS_DIR``); ``make setup`` builds it
(``python -m sinklab.nn.native``). Where it cannot be built, or PyTorch is not a version the kernels were checked
against (:data:`VERIFIED_TORCH`; ``SINKLAB_NATIVE=1`` uses them anyway), the eager code runs (same numbers,
slower) and one warning says why. ``SINKLAB_NATIVE=0`` switches the kernels off without a warning. A NaN comes
out where eager gives one, but its bit pattern may differ.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["add_widened", "available", "cross_entropy_exp", "cross_entropy_grad", "load", "status", "takes",
           "takes_cross_entropy", "tile_backward", "tile_weights"]

SOURCE = Path(__file__).resolve().parent / "tile_kernels.cpp"
_FLAGS = ["-O3", "-ffp-contract=off", "-mavx2", "-mfma"]
_AVX512_FLAGS = ["-DSINKLAB_AVX512", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"]
_STATE: dict = {"ext": None, "tried": False, "why": None}
_EPS = 1e-6  # softpick's epsilon (sinklab.nn.ops._EPS)


#: PyTorch versions (major.minor) whose CPU kernels these were checked against bit for bit
VERIFIED_TORCH = ("2.13",)


def _why_not() -> str | None:
    """Why the kernels cannot run in this process (None: they may)."""
    setting = os.environ.get("SINKLAB_NATIVE", "")
    if setting == "0":
        return "SINKLAB_NATIVE=0"
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        return f"PyTorch's CPU capability is {cap}, the kernels need AVX2"
    version = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    if version not in VERIFIED_TORCH and setting != "1":
        return (f"checked bit for bit against PyTorch {', '.join(VERIFIED_TORCH)} only, this is {torch.__version__}; "
                "SINKLAB_NATIVE=1 uses them anyway")
    return None


def _ninja_dirs() -> list[str]:
    """The folder of the ``ninja`` package's executable where no ninja is on PATH (a virtual environment used
    without activating it), else nothing."""
    if shutil.which("ninja"):
        return []
    try:
        import ninja
    except ImportError:
        return []
    return [ninja.BIN_DIR]


def _build_name(wide: bool) -> str:
    """The extension's module name: its vector width and a digest of its source, flags and PyTorch version, so that
    a build of other code (another checkout, another commit) is never taken for this one."""
    flags = _FLAGS + (_AVX512_FLAGS if wide else [])
    h = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode() + torch.__version__.encode()).hexdigest()[:16]
    return f"sinklab_native_{'avx512' if wide else 'avx2'}_{h}"


def _import_built(name: str):
    """The module of an earlier build of ``name`` in PyTorch's extensions folder, or None (no build yet): imported
    directly, without the build tool's lock and up-to-date check (seconds per process when many start at once)."""
    from torch.utils.cpp_extension import _get_build_directory

    so = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
    if not so.is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, so)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load():
    """The compiled extension module, or None where it cannot be loaded (one warning says why, unless
    ``SINKLAB_NATIVE=0`` asked for that); compiled first where no build of this source is cached (tens of seconds,
    once per machine).

    Raises:
        nothing: a failed build is a warning and the eager code runs.
    """
    if _STATE["tried"]:
        return _STATE["ext"]
    _STATE["tried"] = True
    why = _why_not()
    if why is None:
        path = os.environ.get("PATH", "")
        try:
            from torch.utils.cpp_extension import load as cpp_load

            wide = torch.backends.cpu.get_cpu_capability() == "AVX512"  # 16 floats a vector where PyTorch uses 16
            name = _build_name(wide)
            _STATE["ext"] = _import_built(name)
            if _STATE["ext"] is None:
                os.environ["PATH"] = os.pathsep.join([*_ninja_dirs(), path])  # the ninja of the `ninja` package
                _STATE["ext"] = cpp_load(name, [str(SOURCE)], extra_cflags=_FLAGS + (_AVX512_FLAGS if wide else []),
                                         verbose=False)
        except Exception as e:  # no compiler, no ninja, a failed build: the eager path gives the same numbers
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        finally:
            os.environ["PATH"] = path
    _STATE["why"] = why
    if why is not None and why != "SINKLAB_NATIVE=0":  # asked for: no warning
        warnings.warn(f"sinklab: native kernels off ({why}); the eager code runs (the same numbers, slower)",
                      RuntimeWarning, stacklevel=2)
    return _STATE["ext"]


def available() -> bool:
    """True when the kernels are loaded (building them first if needed)."""
    return load() is not None


def status() -> str:
    """One line: whether the kernels run in this process, and why not."""
    return "native tile kernels: loaded" if available() else f"native tile kernels: off ({_STATE['why']})"


def takes(op, device: torch.device, shape: tuple[int, int, int]) -> bool:
    """Whether the kernels take a tile of (N, C, Tk) float32 logits of ``op`` on ``device`` (then the caller may
    leave out the -inf logit bias of masked keys: the kernels read masked logits as -inf)."""
    if torch.compiler.is_compiling() or device.type != "cpu" or op.native_tile() is None:
        return False  # under torch.compile the eager functions are what inductor fuses
    N, C, Tk = shape
    ext = load() if (N * C * Tk) % 32 == 0 else None
    return ext is not None and Tk % ext.vector_width == 0


def _kernel(op, s: Tensor):
    """(extension, the op's :class:`~sinklab.nn.ops.NativeTile`) where the kernels take this tile, else None."""
    if s.dtype != torch.float32 or s.dim() != 3 or not s.is_contiguous() or not takes(op, s.device, tuple(s.shape)):
        return None
    return _STATE["ext"], op.native_tile()


def _softpick_stats(ext, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """m = max(0, max_j s_j) over the visible keys, exp(-m) and 1e-6 exp(-m), (N, C, 1), as
    :meth:`sinklab.nn.ops.Softpick.tile_weights` (the exponential is PyTorch's: not the Sleef one the kernels call)."""
    m = ext.masked_row_max(s, mask).clamp_min_(0.0)
    em = torch.exp(-m)
    return m, em, _EPS * em


def _two_norm(ext, spec, op, s: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The 2-norm normaliser: g = sim(s) into s by the kernel, then (as :meth:`sinklab.nn.ops._Elementwise.tile_weights`)
    z = (sum g^2)^(1/2) by PyTorch (its float32 square root is not the correctly rounded one the kernel would
    compute), zc = max(z, floor) and z >= floor, each (N, C, 1)."""
    z = ext.elementwise_square_sums(s, mask, spec.kind, spec.bias, op.mask_as_bias).pow_(0.5)
    return z.clamp_min(spec.floor), z >= spec.floor


def _pnorm_normaliser(ext, p: float, s: Tensor, mask: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """softmax_pnorm's z = sum e^p and z^(1/p) (N, C, 1), z^(1/p) by PyTorch's pow as
    :meth:`sinklab.nn.ops.SoftmaxPNorm.tile_weights`; (None, None) for p = 1 and 1/2, whose z^(1/p) (z, z * z) the
    kernel computes in the same pass."""
    if p in (0.5, 1.0):
        return None, None
    z = ext.pnorm_sums(s, mask, p)
    return z, z.pow(1.0 / p)


def tile_weights(op, s: Tensor, mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor | None:
    """``op.tile_weights(s, mask)[0].to(dtype)`` by the kernel (float32: in place in ``s``; bfloat16: written as
    ``.to(torch.bfloat16)`` rounds, where the kernel can, in one pass); None where the kernel does not take the tile
    (then call ``op.tile_weights``).

    Args:
        op: the :class:`~sinklab.nn.ops.AttentionOp`.
        s: (N, C, Tk) float32 logits of the tile (``sinklab.nn.attention._tile_scores``); where
            ``op.mask_as_bias``, masked logits are read as -inf whatever they hold.
        mask: (C, Tk) or (N, C, Tk) bool, True where a query sees a key.
    """
    k = _kernel(op, s)
    if k is None:
        return None
    ext, spec = k
    mask = mask.contiguous()
    out = torch.empty(s.shape, dtype=torch.bfloat16) if dtype == torch.bfloat16 else None
    if spec.family == "softpick":
        return ext.softpick_weights(s, mask, *_softpick_stats(ext, s, mask), out)
    if spec.family == "softmax_pnorm":
        ext.pnorm_apply(s, mask, None, *_pnorm_normaliser(ext, spec.p, s, mask), spec.p, spec.p == 0.5, out)
        return s if out is None else out
    if spec.norm == 2:
        zc, _ = _two_norm(ext, spec, op, s, mask)
        return s.div_(zc)
    return ext.elementwise_weights(s, mask, spec.kind, spec.norm, spec.bias, spec.floor, op.mask_as_bias, out)


def tile_backward(op, s: Tensor, mask: Tensor, dw: Tensor) -> Tensor | None:
    """The tile gradient by the kernel: the weights ``W`` into ``s`` (returned, for ``dV = W^T dO``) and
    ``dS = op.tile_grad(...)`` into ``dw``; None where the kernel does not take the tile (nothing written).

    Args: as :func:`tile_weights`, and dw (N, C, Tk) float32 ``dO V^T``.
    """
    k = _kernel(op, s)
    if k is None or dw.shape != s.shape or dw.dtype != torch.float32 or not dw.is_contiguous():
        return None
    ext, spec = k
    mask = mask.contiguous()
    if spec.family == "softpick":
        ext.softpick_backward(s, mask, dw, *_softpick_stats(ext, s, mask))
    elif spec.family == "softmax_pnorm":
        ext.pnorm_apply(s, mask, dw, *_pnorm_normaliser(ext, spec.p, s, mask), spec.p, spec.p == 0.5, None)
    elif spec.norm == 2:
        zc, active = _two_norm(ext, spec, op, s, mask)
        ext.elementwise_backward(s, mask, dw, spec.kind, 2, spec.bias, spec.floor, op.mask_as_bias, zc, active)
    else:
        ext.elementwise_backward(s, mask, dw, spec.kind, spec.norm, spec.bias, spec.floor, op.mask_as_bias, None, None)
    return s


def takes_cross_entropy(device: torch.device, vocab: int, dtype: torch.dtype) -> bool:
    """Whether the kernels take the chunks of :func:`sinklab.nn.loss.linear_cross_entropy` (logits in ``dtype``,
    float32 or bfloat16, over ``vocab`` classes, on ``device``); the loss then still passes them only chunks of
    n rows with n * vocab a multiple of 32 (elsewhere an eager pass computes its last elements one at a time, with
    the C library's exp2, which the kernels do not copy)."""
    if torch.compiler.is_compiling() or device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    ext = load()
    return ext is not None and vocab % ext.vector_width == 0


def cross_entropy_exp(z: Tensor, e: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk's m = max_j z_j, e = exp(z - m) (as exp2) into ``e`` and s = sum_j e_j, as
    :class:`sinklab.nn.loss._LinearCrossEntropy` computes them, bit for bit.

    Args:
        z: (n, V) logits, float32 or bfloat16 (read exactly as float32); may be ``e`` itself.
        e: (n, V) float32 buffer.

    Returns:
        m, s: (n, 1) float32.
    """
    m, s = _STATE["ext"].ce_exp(z, e)
    return m, s


def cross_entropy_grad(e: Tensor, ws: Tensor, w: Tensor, y: Tensor, out: Tensor) -> None:
    """d loss / d logits of a chunk: ``p = e * ws``, ``p[i, y_i] -= w_i``, into ``out`` (float32, may be ``e``; or
    bfloat16, rounded as PyTorch's ``copy_``); ``e`` is overwritten with ``p``.

    Args: e (n, V) float32; ws, w (n, 1) float32 (w / s and w); y (n,) integer class ids; out (n, V). The caller
    passes only chunks whose n * V is a multiple of 32 (:func:`takes_cross_entropy`).
    """
    _STATE["ext"].ce_grad(e, ws.contiguous(), w.contiguous(), y.to(torch.int64).contiguous(), out)


def add_widened(acc: Tensor, x: Tensor) -> None:
    """``acc += x.float()`` for a bfloat16 ``x`` of ``acc``'s shape (float32), in one pass, the same bits."""
    _STATE["ext"].grad_add(acc, x)


def main(argv: list[str] | None = None) -> int:
    """``python -m sinklab.nn.native``: build (or find) the kernels and print :func:`status`; exit 0 either way."""
    print(status())
    return 0

