"""CUDA tests (marker ``cuda``: skipped without a GPU, see conftest.py; ``benchmarks/gpu.sh`` runs them).

* bf16 autocast training of every attention operation for 20 steps (finite, and the loss falls);
* ``sinklab train`` end to end on CUDA (bf16);
* the blockwise collector (``sinklab measure --collector blockwise``) on CUDA equals the CPU at
  T = 2048 on the same ids, and at T = 32768 on CUDA its attention masses satisfy the identity
  ``sum_j alpha_j (T - j) = T`` (every causal row sums to 1);
* SinkCache decoding on CUDA gives the CPU's next-token losses;
* every analysis (``sinklab analyze KIND --device cuda``) and ``sinklab stream perplexity --device cuda`` give the CPU's
  numbers in float32, and bfloat16 on CUDA the same conclusions within the documented tolerances;
* ``model.attention_backend`` on CUDA: FlexAttention (its own backward kernel) and the compiled tile
  path give the reference backend's logits and gradients (float32);
* (2+ GPUs) data parallel over NCCL: SGD parameters after 2 steps equal one process, DDP and FSDP2.

SmolLM2-135M is the cached model where there is one, else a model of its shape with random weights
(tests/gpu_models.py): the comparisons do not depend on the weights.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import USER_HOME
from gpu_models import smollm2
from sinklab.nn import ATTENTION, ModelConfig, SinkLM

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("op", ATTENTION.names())
def test_bf16_autocast_training_of_every_operation(op):
    """20 AdamW steps under bf16 autocast on one fixed batch: every loss finite, and the model
    learns the batch (the last loss at least 0.5 nats below the first, from ln 256 = 5.5)."""
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=128, attention=op)
    torch.manual_seed(0)
    model = SinkLM(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)
    g = torch.Generator().manual_seed(0)
    t = torch.randint(0, 256, (4, 129), generator=g).cuda()
    x, y = t[:, :-1], t[:, 1:]
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, targets=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    assert all(math.isfinite(v) for v in losses), (op, losses)
    assert losses[-1] < losses[0] - 0.5, (op, losses)


@pytest.mark.parametrize("att,pos,backend,window,prefix", [
    ("sink_logit", "alibi", "flex", None, 5), ("kv_bias", "t5", "flex", 8, 0), ("sigmoid", "alibi", "compiled", None, 0)])
def test_attention_backend_on_cuda_equals_reference(att, pos, backend, window, prefix):
    """float32 on CUDA, T 77 (not a multiple of a block): logits and every parameter's gradient of
    ``backend`` equal the ``reference`` backend's (rtol 1e-4, atol 1e-4 x the gradient's scale); on a
    GPU flex runs FlexAttention's own backward kernel, which the CPU tests cannot."""
    ids = torch.randint(0, 64, (2, 77), generator=torch.Generator().manual_seed(0)).cuda()
    res = {}
    for b in ("reference", backend):
        torch.manual_seed(0)
        cfg = ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=128,
                          attention=att, positional=pos, sliding_window=window, attention_backend=b)
        m = SinkLM(cfg).cuda()
        with torch.no_grad():
            for n, p in m.named_parameters():
                if p.dim() == 1 or "positional" in n:
                    p.add_(torch.randn_like(p) * 0.5)
        out = m(ids, prefix_len=prefix).logits
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).cuda()).sum().backward()
        res[b] = out.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    (o_ref, g_ref), (o, g) = res["reference"], res[backend]
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    assert sorted(g) == sorted(g_ref)
    for n in g_ref:
        scale = max(1.0, g_ref[n].abs().max().item())
        torch.testing.assert_close(g[n], g_ref[n], rtol=1e-4, atol=1e-4 * scale, msg=lambda s: f"{n}: {s}")


def test_sinklab_train_on_cuda_bf16(tmp_path):
    """``sinklab train`` with ``train.device = "cuda"`` and bf16: finite losses, the run on cuda:0,
    a final model that loads on the CPU."""
    from helpers import synthetic_run_toml

    from sinklab.train import loop
    from sinklab.nn.model import SinkLM as Model
    from sinklab.runs.config import load_config

    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(synthetic_run_toml(20))
    cfg = load_config(cfg_file, ['train.device="cuda"', 'train.precision="bf16"'])
    res = loop.train(cfg, tmp_path / "run", progress=False)
    assert sorted(res.losses) == list(range(1, 21)) and all(math.isfinite(v) for v in res.losses.values())
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["device"].startswith("cuda")
    Model.from_pretrained(tmp_path / "run" / "final")


def _ids(T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 49152, (1, T), generator=torch.Generator().manual_seed(seed))


def test_blockwise_measure_on_cuda_equals_cpu_at_2048():
    """SmolLM2 (fp32, TF32 off) on the same 2048 random ids: the blockwise collector's attention masses
    and hidden-state norms on CUDA equal the CPU's."""
    from sinklab.capture import collect

    ids = _ids(2048)
    torch.backends.cuda.matmul.allow_tf32 = False
    cpu, what = smollm2(home=USER_HOME)
    a = collect(cpu, ids, collector="blockwise", batch_size=1)
    gpu, _ = smollm2(device="cuda", home=USER_HOME)
    b = collect(gpu, ids, collector="blockwise", batch_size=1)
    torch.testing.assert_close(b.mass.cpu(), a.mass, rtol=1e-3, atol=1e-6, msg=what)
    torch.testing.assert_close(b.hidden_norms.cpu(), a.hidden_norms, rtol=1e-3, atol=1e-4, msg=what)


def test_blockwise_measure_on_cuda_at_32768_sums_each_row_to_one():
    """SmolLM2 in bf16 at T = 32768 on CUDA (RoPE past its 8192 training context): the masses are
    finite and sum_j alpha[l, h, j] (T - j) = T for every layer and head (each query's weights sum to 1)."""
    from sinklab.capture import collect

    T = 32768
    model, what = smollm2(device="cuda", dtype=torch.bfloat16, max_positions=T, home=USER_HOME)
    s = collect(model, _ids(T), collector="blockwise", batch_size=1)
    assert torch.isfinite(s.mass).all(), what
    total = (s.mass[0].cpu() * (T - torch.arange(T, dtype=torch.float64))).sum(-1)  # (L, H)
    torch.testing.assert_close(total, torch.full_like(total, float(T)), rtol=2e-2, atol=0.0, msg=what)


def test_sink_cache_decode_on_cuda_equals_cpu():
    """StreamingLLM decoding (4 sinks + a 64-token window) through 300 tokens, one at a time: the
    next-token losses on CUDA equal the CPU's (fp32), as does the full cache's."""
    from sinklab.streaming.harness import CacheSpec, stream_nll_decode

    ids = _ids(300, seed=1)[0]
    torch.backends.cuda.matmul.allow_tf32 = False
    for spec in (CacheSpec("sinks_4", "sink", 4, 64), CacheSpec("full", "full", None, None)):
        out = {}
        for device in ("cpu", "cuda"):
            model, what = smollm2(device=device, layers=4, home=USER_HOME)
            out[device] = stream_nll_decode(model, ids, spec, max_context=8192, progress=False)
        assert sorted(out["cpu"]) == sorted(out["cuda"]) == list(range(299))
        worst = max(abs(out["cpu"][t] - out["cuda"][t]) for t in out["cpu"])
        assert worst < 1e-3, (spec.name, worst, what)


@pytest.mark.parametrize("kind", ["massive", "keybias", "intervene", "repeat", "attention", "depth", "overmix", "frames"])
def test_every_analysis_on_cuda_equals_the_cpu(kind, tiny_model_dir, text_corpus_dir):
    """The same folder and probe through the Subject on the CPU and on CUDA (float32): the same summary to float32
    noise (sink rates equal, every other number within 1e-4 relative); bfloat16 on CUDA within the documented
    tolerance (sink position equal) except overmix, which refuses it."""
    from sinklab.analyze import ANALYSES
    from sinklab.errors import InputError

    kw = dict(corpus=str(text_corpus_dir), num_samples=4, seq_len=32, eps=0.05)
    kw.update({"keybias": dict(long_seq_len=None), "intervene": dict(allow_non_sink=True, position=0),
               "repeat": dict(prompt_len=3, counts=[4]), "attention": dict(layers=[0], heads=[0]),
               "overmix": dict(sources=[8], directions=1)}.get(kind, {}))
    if kind in ("attention", "frames"):
        kw.pop("eps")
    cpu = ANALYSES.get(kind)(str(tiny_model_dir), device="cpu", **kw).summary
    gpu = ANALYSES.get(kind)(str(tiny_model_dir), device="cuda", dtype="float32", **kw).summary

    def same(a, b, path=""):
        if isinstance(a, dict):
            assert a.keys() == b.keys(), path
            for k in a:
                same(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list):
            assert len(a) == len(b), path
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{path}[{i}]")
        elif isinstance(a, float) and math.isfinite(a):
            assert abs(a - b) <= 1e-4 * max(1.0, abs(a)), (path, a, b)
        elif not isinstance(a, float):
            assert a == b, (path, a, b)

    same(cpu, gpu)
    if kind == "overmix":
        with pytest.raises(InputError, match="--dtype float32"):
            ANALYSES.get(kind)(str(tiny_model_dir), device="cuda", dtype="bfloat16", **kw)
    elif "sink_position" in cpu:
        bf = ANALYSES.get(kind)(str(tiny_model_dir), device="cuda", dtype="bfloat16", **kw).summary
        assert bf["sink_position"] == cpu["sink_position"]


def test_stream_on_cuda_equals_the_cpu(tiny_model_dir, text_corpus_dir, tmp_path):
    """sinklab stream (sinks, a policy, a 4-bit cache) on CUDA in float32: the CPU's perplexities (1e-4 relative)."""
    from sinklab.streaming import stream

    for kw in (dict(sinks=[0, 2], recompute_every=9), dict(policies=["sinks", "tova"], budgets=[16], n_sink=2,
                                                           kv_bits=[16, 4], kv_group=8, recompute=False)):
        res = [stream(str(tiny_model_dir), str(text_corpus_dir), tokens=60, window=16, progress=False, device=d,
                      dtype="float32", **kw) for d in ("cpu", "cuda")]
        a, b = ({c["name"]: c["ppl"] for c in r["configs"]} for r in res)
        assert a.keys() == b.keys()
        assert all(abs(a[k] - b[k]) <= 1e-4 * a[k] for k in a), (a, b)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gpus_sgd_parameters_equal_one_process(tmp_path, parallel):
    """NCCL (process group cpu:gloo,cuda:nccl): 2 SGD steps without clipping on 2 GPUs give the
    one-GPU parameters (fp32, TF32 off), and every in-step collective is a CUDA tensor."""
    from dist_record_worker import sgd

    from sinklab.train import loop
    from helpers import synthetic_run_toml
    from sinklab.nn.model import SinkLM as Model
    from sinklab.runs.config import load_config, to_toml

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg_file = tmp_path / "base.toml"
    cfg_file.write_text(synthetic_run_toml(2))
    over = ['train.device="cuda"', 'train.precision="fp32"', "optim.lr=0.5", "optim.grad_clip=0",
            "optim.weight_decay=0", "train.grad_accum=3", f'train.parallel="{parallel}"']
    cfg = load_config(cfg_file, over)
    (tmp_path / "cfg.toml").write_text(to_toml(cfg))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "build_optimizer", sgd)
        loop.train(cfg, tmp_path / "one", progress=False)
    worker = str(Path(__file__).resolve().parent / "dist_record_worker.py")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", worker,
                        str(tmp_path / "cfg.toml"), str(tmp_path / "two"), str(tmp_path / "rec"), "sgd"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    one = Model.from_pretrained(tmp_path / "one" / "final").state_dict()
    two = Model.from_pretrained(tmp_path / "two" / "final").state_dict()
    assert max(float((one[k] - two[k]).abs().max()) for k in one) < 1e-5
    for r in range(2):
        recs = json.loads((tmp_path / "rec" / f"rank{r}.json").read_text())
        in_step = [x for x in recs if x["phase"] == "step" and x["device"] is not None]
        assert in_step and all(x["device"].startswith("cuda") for x in in_step), in_step
