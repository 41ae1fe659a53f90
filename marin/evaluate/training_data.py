"""The training data as the checks against it read it: the curated train split and the instruction
train set, each example's messages joined by newlines. Stage decontaminate reads their text, stage
trace_index their documents' ids and licences."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin import readers, stages
from marin.errors import StageError

_DECLARED = stages.declaration("decontaminate")  # the paths: marin/stages/table.py
CURATED_TRAIN, INSTRUCTIONS_TRAIN = _DECLARED.input("curated_train"), _DECLARED.input("instructions_train")


def curated_rows(root: Path, columns: list[str], batch_rows: int = 256) -> Iterator[dict[str, Any]]:
    """The train split's rows (``columns`` of them), in file order."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(root / CURATED_TRAIN) as f:
        for b in f.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
            yield from b.to_pylist()


def instructions(root: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """Each instruction train example and its text: its messages' contents joined by newlines."""
    for line in readers.lines(root / INSTRUCTIONS_TRAIN, "conversations", StageError):
        row = json.loads(line)
        yield row, "\n".join(m["content"] for m in row["messages"])
