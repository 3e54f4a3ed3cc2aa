"""kvpress 0.5.5's presses on sinklab's long-context task items (issue 35, item 6). Run with kvpress's own
venv (setup_venvs.sh); it never imports sinklab and never tokenises: the items (prompt token ids split
into context and question, expected answers, tokens to decode, EOS id, model folder) come from
``make_task_items.py``, and the answers are scored on sinklab's side (``tasks_compare.py``).

    /work/peer-venvs/kvpress/bin/python benchmarks/peers/kvpress_tasks.py [--budget 256]
        -> benchmarks/results/peers/tasks_kvpress.json

For every item and every configuration: a fresh ``DynamicCache``, SmolLM2-135M in float32 with SDPA
attention, the press applied once at prefill with ``compression_ratio = 1 - budget / (prefill tokens)``
(so ``compute_n_kept`` keeps ``budget`` tokens per KV head), then greedy decoding of the item's
``max_new_tokens`` tokens, stopping after EOS, exactly as ``KVPressTextGenerationPipeline.generate_answer``
does (pipeline.py): the question in one call, then one call per token, ``position_ids`` counted from
the context's length (with ``KeyRerotationPress``: from the compressed cache's length, as the pipeline does).

Presses (those sinklab shares): ``StreamingLLMPress(n_sink=4)``, ``SnapKVPress`` (window 64, kernel 5:
its defaults), ``KnormPress``, ``PyramidKVPress`` (window 64, beta 20: its defaults), and ``full``
(no press: the same-model check against sinklab's full cache). Modes (``question``):
  in-press  the whole prompt (context + question) prefilled under the press, which thus scores the
            question's tokens (sinklab's ``query_aware=True``; kvpress's advice for query-aware
            compression: put the question in the context); decoding from the prefill's last logits.
  after     kvpress's pipeline protocol: the context alone prefilled under the press, the question then
            fed in one call outside it (the cache grows by the question), then decoding.
``rerotate``: the press wrapped in ``KeyRerotationPress`` (kept keys re-rotated to positions 0..budget-1,
as sinklab's cache places them) or not (kvpress's default: kept keys at their original positions).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "peers"
PRESSES = ["full", "streaming_llm", "snapkv", "knorm", "pyramidkv"]


def make_press(name: str, ratio: float, rerotate: bool):
    from kvpress import KeyRerotationPress, KnormPress, PyramidKVPress, SnapKVPress, StreamingLLMPress

    press = {"streaming_llm": lambda: StreamingLLMPress(compression_ratio=ratio, n_sink=4),
             "snapkv": lambda: SnapKVPress(compression_ratio=ratio),
             "knorm": lambda: KnormPress(compression_ratio=ratio),
             "pyramidkv": lambda: PyramidKVPress(compression_ratio=ratio)}[name]()
    return KeyRerotationPress(press=press) if rerotate else press


@torch.no_grad()
def answer(model, item: dict, press, question: str, eos: int) -> dict:
    """Prefill (under ``press`` as ``question`` says), then greedy decoding as kvpress's pipeline does."""
    import contextlib

    from kvpress import KeyRerotationPress
    from transformers import DynamicCache

    ctx = torch.tensor([item["context_ids"]])
    q = torch.tensor([item["question_ids"]])
    cache = DynamicCache()
    under = press(model) if press is not None else contextlib.nullcontext()
    prompt = torch.cat((ctx, q), dim=1) if question == "in-press" else ctx
    with under:
        out = model(input_ids=prompt, past_key_values=cache, logits_to_keep=1)
    kept = [cache.get_seq_length(layer) for layer in range(len(cache))]
    # positions of what follows: the prefill's length, or the compressed cache's under KeyRerotationPress
    pos = cache.get_seq_length() if isinstance(press, KeyRerotationPress) else prompt.shape[1]
    if question == "after":
        out = model(input_ids=q, past_key_values=cache, position_ids=torch.arange(pos, pos + q.shape[1])[None],
                    logits_to_keep=1)
        pos += q.shape[1]
    gen = [int(out.logits[0, -1].argmax())]
    while len(gen) < item["max_new_tokens"] and gen[-1] != eos:
        out = model(input_ids=torch.tensor([[gen[-1]]]), past_key_values=cache, position_ids=torch.tensor([[pos]]))
        pos += 1
        gen.append(int(out.logits[0, -1].argmax()))
    return {"new_ids": gen, "kept_per_layer": kept, "cache_at_end": cache.get_seq_length()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", default=str(RESULTS / "task_items.json"))
    ap.add_argument("--budget", type=int, default=256)
    ap.add_argument("--presses", nargs="+", default=PRESSES, choices=PRESSES)
    ap.add_argument("--questions", nargs="+", default=["in-press", "after"], choices=["in-press", "after"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(RESULTS / "tasks_kvpress.json"))
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = json.loads(Path(a.items).read_text())
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    eos = spec["eos_token_id"]
    rows = []
    for question in a.questions:
        for name in a.presses:
            for rerotate in ((False,) if name == "full" else (True, False)):
                t0 = time.perf_counter()
                for it in spec["items"]:
                    n_prefill = it["n_tokens"] if question == "in-press" else len(it["context_ids"])
                    ratio = 1.0 - a.budget / n_prefill
                    press = None if name == "full" else make_press(name, ratio, rerotate)
                    r = answer(model, it, press, question, eos)
                    rows.append({"press": name, "question": question, "rerotate": rerotate,
                                 "budget": None if name == "full" else a.budget,
                                 "compression_ratio": None if name == "full" else ratio,
                                 "task": it["task"], "index": it["index"], "length": it["length"],
                                 "depth": it["depth"], "at": it["at"], "n_tokens": it["n_tokens"],
                                 "answers": it["answers"], "output": tok.decode(r["new_ids"], skip_special_tokens=True),
                                 **r})
                print(f"{name} {question} rerotate={rerotate}: {time.perf_counter() - t0:.0f} s", flush=True)
                write(a, spec, rows)  # after every configuration: a partial run keeps what it did


def write(a, spec: dict, rows: list) -> None:
    from importlib.metadata import version

    import transformers

    out = {"command": "/work/peer-venvs/kvpress/bin/python benchmarks/peers/kvpress_tasks.py "
                      + " ".join(map(shlex.quote, sys.argv[1:])),
           "items_file": a.items, "budget": a.budget, "kvpress": version("kvpress"), "transformers": transformers.__version__, "torch": torch.__version__,
           "threads": torch.get_num_threads(), "model_dir": spec["model_dir"], "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(a.out, len(rows), "rows")


if __name__ == "__main__":
    main()
