"""Share of each stage's wall time spent on ledger work (hashing inputs and outputs,
fingerprinting, appends), read from the ledger's own run.finished records.

    uv run dvc repro -f && uv run python benchmarks/bench_ledger_share.py

Each stage measures its ledger time (`ledger_s`) and wall time (`wall_s`) in the same
process, so the ratio is measured side by side. Asserts nothing.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

from marin.ledger.store import read_all
from marin.paths import ledger_dir, project_root


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else project_root()
    per_stage: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for log in read_all(ledger_dir(root)):
        fin = log.finished
        if fin is None or fin.body["status"] != "succeeded":
            continue
        per_stage[log.started.body["stage"]].append((fin.body["wall_s"], fin.body["ledger_s"]))
    print(f"{'stage':10} {'runs':>4} {'wall s':>8} {'ledger s':>9} {'ledger share':>13}")
    for stage, rows in per_stage.items():
        wall = sum(w for w, _ in rows) / len(rows)
        led = sum(x for _, x in rows) / len(rows)
        print(f"{stage:10} {len(rows):4d} {wall:8.2f} {led:9.3f} {led / wall:12.1%}")


if __name__ == "__main__":
    main()
