"""Score kvpress's answers by sinklab's rule and set them beside sinklab's, item by item (issue 35, item 6).
Run with sinklab's venv after ``sinklab_tasks.py`` and ``kvpress_tasks.py``:

    PYTHONPATH=src python benchmarks/peers/tasks_compare.py
        (reads task_items.json, tasks_sinklab.json, tasks_kvpress.json and tasks_kvpress_after.json)
        -> benchmarks/results/peers/tasks_compare.csv (one row per item x method x pairing)
           benchmarks/results/peers/tasks_compare.md  (correct counts per configuration, and the pairs' agreement)

kvpress's decoded continuations are scored by :func:`sinklab.streaming.tasks.score_item` (the task's rule
in :mod:`sinklab.streaming.tasks.scoring`: for ``needle`` the first run of digits must equal the value).
Pairs: sinklab's ``one-call`` protocol with kvpress's ``in-press`` mode (the question inside what the press
scores), sinklab's ``question-after`` with kvpress's ``after``; each against kvpress with and without
``KeyRerotationPress``. Methods: full <-> full (no press), sinks <-> streaming_llm, snapkv, knorm, pyramidkv.
"""
from __future__ import annotations

import json

import pandas as pd

from common import RESULTS

METHODS = {"full": "full", "sinks": "streaming_llm", "snapkv": "snapkv", "knorm": "knorm", "pyramidkv": "pyramidkv"}
#: kvpress's runs: the question inside the press (``--questions in-press``) and after it (``--questions after``)
KVPRESS_FILES = ["tasks_kvpress.json", "tasks_kvpress_after.json"]
PAIRS = {"one-call": "in-press", "question-after": "after"}


def main() -> None:
    from sinklab.streaming.tasks import TaskItem, score_item

    spec = json.loads((RESULTS / "task_items.json").read_text())
    items = {(d["task"], d["length"], d["depth"], d["index"]): TaskItem(
        task=d["task"], index=d["index"], length=d["length"], depth=d["depth"], context_ids=d["context_ids"],
        question_ids=d["question_ids"], answers=d["answers"], seed=d["seed"], at=d["at"]) for d in spec["items"]}
    kv = pd.DataFrame([r for f in KVPRESS_FILES if (RESULTS / f).exists()
                       for r in json.loads((RESULTS / f).read_text())["rows"]])
    sl = pd.DataFrame(json.loads((RESULTS / "tasks_sinklab.json").read_text())["rows"])
    key = ["task", "length", "depth", "index"]
    kv["score"] = [score_item(items[tuple(r[k] for k in key)], r["output"]) for _, r in kv.iterrows()]
    kv["correct"] = kv["score"] == 1.0
    rows = []
    for _, s in sl.iterrows():
        it = items[tuple(s[k] for k in key)]
        press = METHODS[s["policy"]]
        mode = PAIRS[s["protocol"]]
        modes = list(PAIRS.values()) if press == "full" else [mode]
        for m in modes:
            match = kv[(kv.press == press) & (kv.question == m) & (kv.task == it.task) & (kv.length == it.length)
                       & (kv.depth == it.depth) & (kv["index"] == it.index)]
            for _, k in match.iterrows():
                rows.append({"task": it.task, "length": it.length, "depth": it.depth, "index": it.index, "at": it.at,
                             "answer": "|".join(it.answers), "method": s["policy"],
                             "sinklab_protocol": s["protocol"], "kvpress_press": press, "kvpress_question": m,
                             "kvpress_rerotate": bool(k["rerotate"]), "sinklab_output": s["output"],
                             "sinklab_correct": bool(s["correct"]), "kvpress_output": k["output"],
                             "kvpress_correct": bool(k["correct"]), "same_output": s["output"] == k["output"],
                             "same_correct": bool(s["correct"]) == bool(k["correct"]),
                             "kvpress_kept_min": min(k["kept_per_layer"]), "kvpress_kept_max": max(k["kept_per_layer"])})
    cmp = pd.DataFrame(rows)
    cmp.to_csv(RESULTS / "tasks_compare.csv", index=False)
    lines = ["Correct answers (of the items run) per configuration, sinklab's scoring rule on both sides:", "",
             "| side | configuration | correct | items |", "|---|---|---|---|"]
    for (p, prot), g in sl.groupby(["policy", "protocol"], sort=False):
        lines.append(f"| sinklab | {p} {prot} | {int(g['correct'].sum())} | {len(g)} |")
    for (p, q, r), g in kv.groupby(["press", "question", "rerotate"], sort=False):
        lines.append(f"| kvpress | {p} {q}{' rerotate' if r else ''} (kept per layer {min(map(min, g.kept_per_layer))}"
                     f"..{max(map(max, g.kept_per_layer))}) | {int(g['correct'].sum())} | {len(g)} |")
    lines += ["", "Agreement of the pairs (same decoded continuation / same correctness, of the items):", "",
              "| method | sinklab | kvpress | same output | same correct | items |", "|---|---|---|---|---|---|"]
    for (m, prot, q, r), g in cmp.groupby(["method", "sinklab_protocol", "kvpress_question", "kvpress_rerotate"],
                                          sort=False):
        lines.append(f"| {m} | {prot} | {q}{' rerotate' if r else ''} | {int(g.same_output.sum())} | "
                     f"{int(g.same_correct.sum())} | {len(g)} |")
    (RESULTS / "tasks_compare.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
