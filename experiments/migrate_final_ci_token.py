"""One-off migration (16th session): rename the 1-based ``top_sink_position`` of the final_ci.json caches packed in
``results/*/runs.jsonl.gz`` to ``top_sink_token`` (docs/concepts.md: a position is 0-based, a token number 1-based).

Every other row of a table and every other key of a cache is kept byte for byte (each row and each cache is checked
to round-trip through ``json`` unchanged before it is rewritten); a table without such a cache is left as it is.
Readers of older tables translate the old key themselves (:func:`sinklab.sweep.summary.final_ci`), so running this
again is not needed; it prints how many caches it renamed per study (0 once done).

Usage::

    python experiments/migrate_final_ci_token.py [results]
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def migrate(table: Path) -> int:
    """Rename the key in ``table`` in place (atomic replace); return how many caches were renamed."""
    raw = gzip.decompress(table.read_bytes()).decode("utf-8")
    out, n = [], 0
    for line in raw.splitlines(keepends=True):
        row = json.loads(line)
        if json.dumps(row, ensure_ascii=False) + "\n" != line:
            raise SystemExit(f"{table}: a row does not round-trip through json; nothing written")
        if row["file"] == "final_ci.json" and "top_sink_position" in row["text"]:
            obj = json.loads(row["text"])
            if json.dumps(obj, indent=1) != row["text"]:
                raise SystemExit(f"{table}: a final_ci.json does not round-trip through json; nothing written")
            row["text"] = json.dumps({("top_sink_token" if k == "top_sink_position" else k): v for k, v in obj.items()},
                                     indent=1)
            line = json.dumps(row, ensure_ascii=False) + "\n"
            n += 1
        out.append(line)
    if n:
        tmp = table.with_suffix(".tmp")
        tmp.write_bytes(gzip.compress("".join(out).encode("utf-8"), mtime=0))
        tmp.replace(table)
    return n


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "results")
    for t in sorted(root.glob("*/runs.jsonl.gz")):
        print(t.parent.name, migrate(t))
