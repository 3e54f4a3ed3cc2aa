"""The learned-sink streaming experiment (issue 9): collect results/streaming/learned_sink/<op>/seed<k>/stream.json
into runs.csv (one row per run and configuration) and summary.csv (perplexity per seed, median over the seeds).

The runs themselves, for OP in softmax sink_token learned_sink_logit and K in 0 1 2:
    sinklab stream perplexity --model results/archive/attention_operation_a70ad4f/runs/OP/seedK --corpus run --tokens 2048 --window 32 \
        --sinks 0,1,2,4 --chunk 256 --out results/streaming/learned_sink/OP/seedK --threads 1
Then, from the repository root:
    python experiments/streaming_learned_sink.py
"""
import json
from pathlib import Path

import pandas as pd

root = Path(__file__).resolve().parent.parent / "results" / "streaming" / "learned_sink"
rows = []
for f in sorted(root.glob("*/seed*/stream.json")):
    d = json.loads(f.read_text())
    for c in d["configs"]:
        rows.append({"op": f.parent.parent.name, "seed": int(f.parent.name[4:]), "config": c["name"],
                     "n_sink": c["n_sink"], "window": c["window"], "ppl": c["ppl"], "ppl_matched": c["ppl_matched"],
                     "evaluated": c["evaluated"], "code": d["code"]["commit"], "command": d["command"]})
df = pd.DataFrame(rows)
df.to_csv(root / "runs.csv", index=False)
wide = df.pivot_table(index=["op", "config"], columns="seed", values="ppl").add_prefix("ppl_seed")
wide["ppl_median"] = wide.median(axis=1)
wide.reset_index().to_csv(root / "summary.csv", index=False, float_format="%.4g")
print(wide.reset_index().to_string(index=False, float_format=lambda x: f"{x:.4g}"))
