"""The fused native tile kernels (sinklab.nn.native) against the eager tile functions, bit for bit.

The kernels exist for speed only: every test here compares them with the eager PyTorch arithmetic of
``AttentionOp.tile_weights`` / ``tile_grad`` (and a whole training run with and without them) with ``torch.equal``.
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from sinklab.nn import ModelConfig, SinkLM, native
from sinklab.nn.ops import ATTENTION, OpContext

# the operations the kernels take (native_tile() not None with their default options)
NATIVE_OPS = ["sigmoid", "sigmoid_logn", "sigmoid_norm", "sigmoid_pnorm", "relu", "relu_norm", "elu1_sim", "elu1",
              "elu1_norm", "linear", "linear_relu", "linear_relu_norm", "softpick", "softmax_pnorm"]

CTX = OpContext(n_heads=4, n_kv_heads=4, head_dim=16, d_model=64, max_seq_len=1024)


@pytest.fixture(scope="module")
def ext():
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the kernels cannot be built here (the eager tile path runs)")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("the kernels need AVX2")
    e = native.load()
    assert e is not None, native.status()
    return e


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # eager passes take a scalar path at thread-chunk ends: bits are pinned at one thread
    yield
    torch.set_num_threads(n)


def test_the_operations_the_kernels_take_are_the_documented_ones():
    taken = [n for n in ATTENTION.names() if ATTENTION.get(n)(CTX).native_tile() is not None]
    assert sorted(taken) == sorted(NATIVE_OPS)
    import re

    for n in NATIVE_OPS:
        assert re.search(rf"\b{n}\b", native.__doc__), n
    # an option the kernels do not copy (a p-norm other than 2) leaves the operation on the eager functions
    assert ATTENTION.get("sigmoid_pnorm")(CTX, p=3.0).native_tile() is None
    assert ATTENTION.get("sigmoid_pnorm")(CTX, p=2.0).native_tile().norm == 2


@pytest.mark.parametrize("n", [*range(1, 70), 127, 128, 129, 255, 256, 257, 1000, 1024, 4100, 70000])
def test_the_row_sum_is_pytorchs_sum_bit_for_bit(ext, n):
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(5, n, generator=g) * torch.logspace(-3, 3, 5)[:, None]).contiguous()
    assert torch.equal(ext.row_sum(x), x.sum(dim=-1, keepdim=True))


def _tile(op, N, C, Tk, document: bool, seed: int):
    """(scores maker, mask, dW) of a causal tile of C queries ending at key Tk (a per-window random mask with
    ``document``), logits of a few units as in training."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(Tk - C, Tk)[:, None] >= torch.arange(Tk)[None, :]  # (C, Tk)
    if document:
        mask = mask & (torch.rand(N, C, Tk, generator=g) > 0.3)
        mask[..., 0] = True
    q, k = torch.randn(N, C, 16, generator=g) * 2, torch.randn(N, Tk, 16, generator=g) * 2
    dw = torch.randn(N, C, Tk, generator=g)

    def scores():
        s = torch.bmm(q, k.transpose(1, 2)).mul_(0.25)
        return s.masked_fill_(~mask, float("-inf")) if op.mask_as_bias else s

    return scores, mask, dw


SHAPES = [(16, 64, 1024, False), (128, 64, 64, False), (4, 16, 96, True), (8, 4, 16, False), (2, 16, 32, True)]


@pytest.mark.parametrize("name", NATIVE_OPS)
def test_the_kernels_equal_the_eager_tile_functions_bit_for_bit(ext, name):
    op = ATTENTION.get(name)(CTX)
    for i, (N, C, Tk, document) in enumerate(SHAPES):
        scores, mask, dw0 = _tile(op, N, C, Tk, document, seed=i)
        w, aux = op.tile_weights(scores(), mask)
        w_eager = w.clone()
        ds_eager = op.tile_grad(w, aux, dw0.clone(), mask)
        s = scores()
        w_native = native.tile_weights(op, s, mask)
        assert w_native is not None and w_native.data_ptr() == s.data_ptr()  # in place
        assert torch.equal(w_native, w_eager), (name, N, C, Tk)
        s, dw = scores(), dw0.clone()
        w_back = native.tile_backward(op, s, mask, dw)
        assert torch.equal(w_back, w_eager), (name, N, C, Tk)
        assert torch.equal(dw, ds_eager), (name, N, C, Tk, int((dw != ds_eager).sum()))
        w_bf16 = native.tile_weights(op, scores(), mask, torch.bfloat16).to(torch.bfloat16)  # forward under bf16 autocast
        assert torch.equal(w_bf16.view(torch.int16), w_eager.to(torch.bfloat16).view(torch.int16)), (name, N, C, Tk)
        if op.mask_as_bias:  # the production path: logits without the -inf bias, the kernel masks them itself
            raw = scores().nan_to_num_(neginf=0.0) + torch.where(mask, 0.0, 3.0)  # masked logits large, not -inf
            assert torch.equal(native.tile_weights(op, raw.clone(), mask), w_eager), (name, N, C, Tk)
            s, dw = raw.clone(), dw0.clone()
            assert torch.equal(native.tile_backward(op, s, mask, dw), w_eager) and torch.equal(dw, ds_eager)


def test_options_are_copied_too(ext):
    for op in (ATTENTION.get("sigmoid")(CTX, bias=-2.5), ATTENTION.get("sigmoid_logn")(CTX, n=77),
               *(ATTENTION.get("softmax_pnorm")(CTX, p=p) for p in (0.25, 1.0, 2.0, 0.3))):
        scores, mask, dw0 = _tile(op, 16, 64, 256, False, seed=7)
        w, aux = op.tile_weights(scores(), mask)
        ds = op.tile_grad(w.clone(), aux, dw0.clone(), mask)
        s, dw = scores(), dw0.clone()
        assert torch.equal(native.tile_backward(op, s, mask, dw), w) and torch.equal(dw, ds)


def test_a_tile_the_kernels_do_not_copy_is_left_to_the_eager_functions(ext):
    op = ATTENTION.get("softpick")(CTX)
    width = ext.vector_width
    for N, C, Tk in [(1, 3, 8 * width + width), (3, 5, 2 * width), (16, 64, width + 4)]:  # numel % 32, Tk % width
        scores, mask, dw = _tile(op, N, C, Tk, False, seed=1)
        s, d = scores(), dw.clone()
        if (N * C * Tk) % 32 == 0 and Tk % width == 0:
            continue
        assert native.tile_weights(op, s, mask) is None and native.tile_backward(op, s, mask, d) is None
        assert torch.equal(s, scores()) and torch.equal(d, dw)  # nothing written
    s = torch.zeros(16, 64, 64, dtype=torch.float64)
    assert native.tile_weights(op, s, torch.ones(64, 64, dtype=torch.bool)) is None  # float64: eager


@pytest.mark.parametrize("name", ["softpick", "sigmoid_norm", "elu1_norm", "relu", "softmax_pnorm"])
def test_training_with_and_without_the_kernels_gives_the_same_model(ext, name, monkeypatch):
    """Three AdamW steps under bf16 autocast (as the throughput benchmark) and in float32: the same parameters."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=128, attention=name)
    x = torch.randint(0, 64, (2, 129), generator=torch.Generator().manual_seed(0))
    on, on_ce = native.takes, native.takes_cross_entropy
    results = []
    for use, bf16 in [(True, False), (False, False), (True, True), (False, True)]:
        monkeypatch.setattr(native, "takes", on if use else (lambda op, device, shape: False))
        monkeypatch.setattr(native, "takes_cross_entropy", on_ce if use else (lambda *a: False))
        torch.manual_seed(0)
        m = SinkLM(cfg)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = m(x[:, :-1], targets=x[:, 1:]).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        results.append([p.detach().clone() for p in m.parameters()])
    for a, b in (results[0:2], results[2:4]):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert not all(torch.equal(p, q) for p, q in zip(results[0], results[2]))  # bf16 is another run


def test_sinklab_native_0_switches_the_kernels_off(monkeypatch):
    monkeypatch.setenv("SINKLAB_NATIVE", "0")
    monkeypatch.setattr(native, "_STATE", {"ext": None, "tried": False, "why": None})
    assert not native.available()
    assert native.status() == "native tile kernels: off (SINKLAB_NATIVE=0)"
    op = ATTENTION.get("softpick")(CTX)
    scores, mask, dw = _tile(op, 16, 64, 64, False, seed=0)
    assert native.tile_weights(op, scores(), mask) is None and native.tile_backward(op, scores(), mask, dw) is None


def test_the_kernel_source_is_part_of_the_code_a_run_records(tmp_path, monkeypatch):
    """A run's ``code.source`` digest covers the C++ kernels: a changed kernel is changed code."""
    import sinklab
    from sinklab.provenance import source_digest

    (tmp_path / "nn").mkdir()
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "nn" / "k.cpp").write_text("int a;")
    monkeypatch.setattr(sinklab, "__file__", str(tmp_path / "__init__.py"))
    before = source_digest()
    (tmp_path / "nn" / "k.cpp").write_text("int b;")
    assert source_digest() != before


def test_a_tile_the_kernel_declines_after_all_gets_its_masked_logits_back(ext, monkeypatch):
    """tile_forward leaves the -inf bias out for a fused tile; should the kernel decline it after all, the eager
    functions get the masked logits (not the raw ones)."""
    from sinklab.nn.attention import tile_backward, tile_forward

    op = ATTENTION.get("sigmoid_norm")(CTX)
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(2, 4, n, 16, generator=g) for n in (64, 128, 128, 64))
    mask = torch.arange(64, 128)[:, None] >= torch.arange(128)[None, :]
    fused = [tile_forward(q, k, v, mask, None, op, 0.25), *tile_backward(q, k, v, do, mask, None, op, 0.25)]
    monkeypatch.setattr(native, "_kernel", lambda op, s: None)  # takes() says yes, the kernel says no
    declined = [tile_forward(q, k, v, mask, None, op, 0.25), *tile_backward(q, k, v, do, mask, None, op, 0.25)]
    monkeypatch.setattr(native, "takes", lambda op, device, shape: False)
    eager = [tile_forward(q, k, v, mask, None, op, 0.25), *tile_backward(q, k, v, do, mask, None, op, 0.25)]
    for a, b, c in zip(fused, declined, eager):
        assert torch.equal(a, c) and torch.equal(b, c)


def _same_loss_with_and_without_the_kernels(monkeypatch, h0, w0, calls):
    """linear_cross_entropy(h0, w0, **call) for each call, the kernels on and off: loss, h.grad and w.grad equal."""
    from sinklab.nn.loss import linear_cross_entropy

    out = []
    for fused in (True, False):
        monkeypatch.setattr(native, "takes_cross_entropy", (lambda *a: True) if fused else (lambda *a: False))
        res = []
        for call in calls:
            call = dict(call)
            bf16 = call.pop("bf16", False)
            h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = linear_cross_entropy(h, w, call.pop("targets"), **call)
            loss.backward()
            res += [loss.detach(), h.grad, w.grad]
        out.append(res)
    for a, b in zip(*out):
        assert torch.equal(a, b)


@pytest.mark.parametrize("bf16", [False, True])
def test_the_chunked_cross_entropy_is_the_same_with_and_without_the_kernels(ext, bf16, monkeypatch):
    """sinklab.nn.loss.linear_cross_entropy: loss and both gradients bit for bit, with ignored targets, row weights
    and a last chunk shorter than the others."""
    g = torch.Generator().manual_seed(int(bf16))
    N, d, V = 700, 48, 1024
    h0, w0 = torch.randn(N, d, generator=g), torch.randn(V, d, generator=g) * 0.3
    y = torch.randint(0, V, (N,), generator=g)
    y[::7] = -100
    rw = torch.rand(N, generator=g) + 0.5
    _same_loss_with_and_without_the_kernels(monkeypatch, h0, w0, [
        dict(targets=y, chunk_elems=256 * V, weights=weights, bf16=bf16) for weights in (None, rw)])


def test_the_bfloat16_rounding_is_pytorchs(ext):
    x = torch.cat([torch.tensor([0.0, -0.0, 1e-40, -1e-40, 3.4e38, float("inf"), -float("inf"), 1.00390625,
                                 1.01171875, float("nan")]), torch.randn(1 << 16) * 10])  # zeros, subnormals, ties
    x = x[: (x.numel() // 16) * 16].reshape(1, -1)
    e, out = x.clone(), torch.empty(x.shape, dtype=torch.bfloat16)
    ext.ce_grad(e, torch.ones(1), torch.zeros(1), torch.zeros(1, dtype=torch.long), out)  # p = e * 1, p[0] -= 0
    assert torch.equal(out.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))  # NaN's bits too
    x = x.nan_to_num()
    out = x.to(torch.bfloat16)
    acc = torch.randn(x.shape)
    ref = acc + out.float()
    ext.grad_add(acc, out)
    assert torch.equal(acc, ref)


@pytest.mark.compile
@pytest.mark.integration  # a nested pytest
def test_the_avx2_build_equals_pytorchs_avx2_kernels_too(ext):
    """On a CPU without AVX-512 PyTorch runs its 8-wide kernels and sinklab builds its 8-wide ones: the same bit-for-bit
    checks, in a process where PyTorch is held to AVX2 (ATEN_CPU_CAPABILITY=avx2; builds the AVX2 kernels once)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "PYTHONPATH": os.pathsep.join([str(root / "src"), str(root / "tests")])}
    code = ("import torch; assert torch.backends.cpu.get_cpu_capability() == 'AVX2'; "
            "from sinklab.nn import native; assert native.load().vector_width == 8, native.status()")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=600)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(Path(__file__)), "-k",
                        "equal_the_eager or row_sum or options or cross_entropy or bfloat16 or declines"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1]


@pytest.mark.parametrize("N,V", [(3, 48), (5, 48), (1, 16), (7, 80), (3, 1040), (4, 48), (64, 80)])
def test_the_cross_entropy_at_sizes_that_leave_an_eager_scalar_tail(ext, N, V, monkeypatch):
    """Chunks whose n * V is not a multiple of 32 stay eager (its last elements take the C library's exp2), the others
    take the kernels: either way the numbers of the eager loss, with int32 targets too."""
    g = torch.Generator().manual_seed(N * V)
    h0, w0 = torch.randn(N, 24, generator=g), torch.randn(V, 24, generator=g)
    y = torch.randint(0, V, (N,), generator=g)
    _same_loss_with_and_without_the_kernels(monkeypatch, h0, w0, [
        dict(targets=t, chunk_elems=16) for t in (y, y.to(torch.int32))])


def test_the_kernels_say_why_they_are_off(monkeypatch):
    import warnings

    for env, cap, version, warns, why in [("0", "AVX512", "2.13.0", False, "SINKLAB_NATIVE=0"),
                                          ("", "DEFAULT", "2.13.0", True, "capability is DEFAULT"),
                                          ("", "AVX512", "2.9.1+cpu", True, "only, this is 2.9.1+cpu")]:
        monkeypatch.setenv("SINKLAB_NATIVE", env)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: cap)
        monkeypatch.setattr(torch, "__version__", version)
        monkeypatch.setattr(native, "_STATE", {"ext": None, "tried": False, "why": None})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert native.load() is None
        assert why in native.status()
        assert [str(w.message).startswith("sinklab: native kernels off") for w in caught] == ([True] if warns else [])
