"""``sinklab stream``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sinklab.cli.common import (THREADS, check_outputs, device_map_option, device_option, dtype_option,
                                invoked_command, list_option, model_option, split_list)
from sinklab.cli.main import cli


@cli.command("stream")
def stream_cmd(
    model: str = model_option("zoo name or Hugging Face folder of a RoPE causal LM, or a sinklab train run with "
                              "relative positions"),
    corpus: str = typer.Option("sotu", help="corpus zoo name, a .txt file / folder (documents concatenated in order), "
                               "or run (a sinklab run's own validation documents)"),
    tokens: int = typer.Option(4096, "--tokens", help="stream length N: the first N tokens of the corpus"),
    window: int = typer.Option(256, "--window", "-w", help="recent tokens kept by the sink caches (and seen by recompute)"),
    sinks: Optional[List[str]] = list_option("--sinks", "numbers of sink tokens, e.g. --sinks 0,1,2,4,8 (0 = window "
                                             "only; default 0,1,2,4,8; not with --policy)"),
    out: Path = typer.Option(Path("runs/stream"), help="output folder (a stopped run resumes there)"),
    chunk: Optional[int] = typer.Option(None, help="positions per perplexity chunk (default: the window)"),
    recompute_every: Optional[int] = typer.Option(None, "--recompute-every", help="score every k-th position with "
                                                  "recomputation (default: N/128 rounded up)"),
    mode: str = typer.Option("parallel", help="parallel (one exact forward per cache configuration) | decode "
                             "(token by token through the real cache: same numbers, much slower)"),
    no_full: bool = typer.Option(False, "--no-full", help="skip the full cache"),
    no_recompute: bool = typer.Option(False, "--no-recompute", help="skip sliding window with recomputation"),
    policy: Optional[List[str]] = list_option("--policy", "cache policies to compare at equal budget, from window, "
                                              "sinks, h2o, tova, sinks+h2o, sinks+tova, detected-sinks (replaces "
                                              "--sinks; the cross product with --budget and the --kv-* options)"),
    budget: Optional[List[str]] = list_option("--budget", "tokens each layer keeps, e.g. --budget 64,128,256 "
                                              "(default 256; with --policy)"),
    n_sink: int = typer.Option(4, "--n-sink", help="sink tokens of the policies with sinks (sinks, sinks+h2o, "
                               "sinks+tova; at most this many detected ones for detected-sinks)"),
    kv_bits: Optional[List[str]] = list_option("--kv-bits", "key/value storage: 16 (as given) or 8, 4, 3, 2 bits "
                                               "(min-max codes in groups; e.g. 16,4; default 16; with --policy)"),
    kv_group: int = typer.Option(32, "--kv-group", help="channels per quantisation group (per token) or tokens per "
                                 "block (per-channel keys)"),
    key_quant: Optional[List[str]] = list_option("--key-quant", "keys quantised per token and/or per channel (KIVI): "
                                                 "--key-quant token,channel (default token)"),
    sinks_full_precision: Optional[List[str]] = list_option("--sinks-full-precision", "keep the first N tokens "
                                                            "lossless in a quantised cache, e.g. 0,1,4, or "
                                                            "'detected': the sinks the metric flags (default 0)"),
    task: str = typer.Option("ppl", "--task", help="ppl (perplexity by chunk, latency, memory) | passkey (retrieve a "
                             "5-digit key stated once in the stream; accuracy per depth)"),
    passkey_keys: int = typer.Option(20, "--passkey-keys", help="pass keys per depth"),
    passkey_depths: Optional[List[str]] = list_option("--passkey-depths", "depths of the key in [0, 1] (default "
                                                      "0,0.25,0.5,0.75,1)"),
    passkey_batch: int = typer.Option(20, "--passkey-batch", help="streams fed together (equal length)"),
    passkey_chunk: int = typer.Option(1, "--passkey-chunk", help="tokens per call while feeding a stream (1 = "
                                      "streaming; more: the chunk attends to the cache and itself, then it is cut)"),
    passkey_seed: int = typer.Option(0, "--passkey-seed", help="seed of the random keys"),
    streams: int = typer.Option(1, "--streams", help="1: one stream, the corpus's documents in order; more: one "
                                "document per stream, split evenly over the corpora of --corpus (comma-separated, "
                                "e.g. sotu,austen), each figure with a 95%% t-interval over streams and paired "
                                "comparisons"),
    device: str = device_option(),
    dtype: Optional[str] = dtype_option(),
    device_map: Optional[str] = device_map_option(),
    threads: Optional[int] = THREADS,
) -> None:
    """StreamingLLM on one long stream: perplexity, decode latency and cache memory for the full cache,
    window only, sinks + window and sliding window with recomputation; with --policy, any cache
    policy at a fixed budget, stored as given or quantised; --task passkey for retrieval."""
    check_outputs([("--out", out)])
    from sinklab.streaming import stream
    from sinklab.streaming.passkey import DEFAULT_DEPTHS

    res = stream(model, corpus, tokens=tokens, window=window, sinks=split_list(sinks, int, "--sinks"), out=out,
                 chunk=chunk, recompute_every=recompute_every, mode=mode, full=not no_full, recompute=not no_recompute,
                 threads=threads, policies=split_list(policy, str, "--policy"),
                 budgets=split_list(budget, int, "--budget"), n_sink=n_sink,
                 kv_bits=split_list(kv_bits, int, "--kv-bits"), kv_group=kv_group,
                 key_quant=split_list(key_quant, str, "--key-quant"),
                 sinks_full_precision=split_list(sinks_full_precision, str, "--sinks-full-precision"), task=task,
                 passkey_keys=passkey_keys,
                 passkey_depths=split_list(passkey_depths, float, "--passkey-depths") or DEFAULT_DEPTHS,
                 passkey_batch=passkey_batch, passkey_chunk=passkey_chunk, passkey_seed=passkey_seed,
                 streams=streams, device=device, dtype=dtype, device_map=device_map, command=invoked_command())
    typer.echo(f"{res['title']}")
    if task == "passkey":
        depths = sorted(res["configs"][0]["accuracy_by_depth"], key=float) if res["configs"] else []
        typer.echo(f"{'config':<28} {'accuracy':>8}  " + " ".join(f"{'d=' + d:>7}" for d in depths))
        for c in res["configs"]:
            typer.echo(f"{c['name']:<28} {c['accuracy']:>8.2f}  "
                       + " ".join(f"{c['accuracy_by_depth'][d]:>7.2f}" for d in depths))
        typer.echo(f"wrote {out}/passkey.json, passkey.csv, passkey_accuracy.csv, passkey.png")
        return
    if "streams" in res:
        _print_stream_set(res, out)
        return
    w = max([11] + [len(c["name"]) for c in res["configs"]])
    typer.echo(f"{'config':<{w}} {'n_sink':>6} {'ppl':>9} {'ppl@recomp':>10} {'last chunk (n)':>16} {'ms/token':>9} "
               f"{'cache MiB':>9} {'KL nats':>9} {'top-1':>6}")
    for c in res["configs"]:
        last_chunk = next((i for i in reversed(range(len(c["ppl_by_chunk"]))) if c["ppl_by_chunk"][i] is not None), None)
        counts = c.get("count_by_chunk") or []
        if last_chunk is None:
            last = "-"
        else:  # the perplexity of the last chunk with a scored position, and how many positions it rests on
            n = f"{counts[last_chunk]}" if counts else "?"
            last = f"{c['ppl_by_chunk'][last_chunk]:.2f} ({n})"
        ns = "-" if c["n_sink"] is None else str(c["n_sink"])
        matched = "-" if c["ppl_matched"] is None else f"{c['ppl_matched']:.2f}"
        typer.echo(f"{c['name']:<{w}} {ns:>6} {c['ppl']:>9.2f} {matched:>10} {last:>16} "
                   f"{c['latency_ms_per_token']:>9.1f} {c['cache_bytes'] / 2**20:>9.2f} "
                   f"{_num(c.get('kl'), '.4f'):>9} {_num(c.get('top1'), '.3f'):>6}")
    typer.echo("KL nats, top-1: agreement with the full cache (mean KL(full || config) of the next-token distribution, "
               "share of equal argmax tokens)")
    typer.echo("last chunk (n): perplexity of the last chunk, over the n positions scored in it (recompute scores "
               "every k-th position only)")
    typer.echo(f"wrote {out}/stream.json, stream.csv, stream_by_chunk.csv, stream_ppl.png")



def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _ci(c: dict, f: str, fmt: str) -> str:
    if c.get(f) is None:
        return "-"
    lo, hi = c.get(f + "_low"), c.get(f + "_high")
    return format(c[f], fmt) + ("" if lo is None else f" [{format(lo, fmt)}, {format(hi, fmt)}]")


def _print_stream_set(res, out: Path) -> None:
    """The summary over streams and the decided comparisons of a multi-stream run."""
    w = max([11] + [len(c["name"]) for c in res["configs"]])
    n = len(res["streams"])
    typer.echo(f"{'config':<{w}} {'ppl [95% CI]':>26} {'KL nats [95% CI]':>30} {'top-1 [95% CI]':>24}")
    for c in res["configs"]:
        typer.echo(f"{c['name']:<{w}} {_ci(c, 'ppl', '.2f'):>26} {_ci(c, 'kl', '.4f'):>30} {_ci(c, 'top1', '.3f'):>24}")
    typer.echo(f"means over {n} streams, 95% t-intervals over streams; ppl = exp(mean per-stream NLL)")
    decided = [x for x in res["comparisons"] if x["better"] != "inconclusive"]
    typer.echo(f"paired comparisons (A - B per stream): {len(decided)} of {len(res['comparisons'])} decided")
    for x in decided:
        typer.echo(f"  {x['figure']:<5} {x['better']} better ({x['a']} vs {x['b']}: mean diff {x['diff_mean']:+.4g} "
                   f"[{x['diff_low']:+.4g}, {x['diff_high']:+.4g}])")
    typer.echo(f"wrote {out}/stream.json, stream.csv, stream_by_stream.csv, stream_comparisons.csv, stream_by_chunk.csv, "
               "stream_ppl.png")
