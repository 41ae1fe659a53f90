"""Stage trace_index: the training data as a suffix-array index (:mod:`marin.evaluate.trace_index`),
which ``marin trace`` searches for the verbatim spans of a text.

The training data is what the models were trained on, as the tokenizer saw it: the train split's
token shards of ``data/tokens`` (the very ids train read; each document's id, source and licence
from the curated train split, in the same order), then the instruction train set (each example's
messages joined by newlines, as decontaminate reads them, encoded by the same tokenizer). The index
is recorded with ``data/tokens`` as an input, so ``marin trace`` can check through the ledger that it
indexes the tokens the model's training run read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from marin import stages
from marin.config import Params
from marin.data import manifest
from marin.data import tokenize as tk
from marin.errors import StageError
from marin.evaluate import trace_index, training_data
from marin.evaluate.training_data import CURATED_TRAIN, INSTRUCTIONS_TRAIN
from marin.fsutil import atomic_dir
from marin.ledger import Input, Recipe, Run

_DECLARED = stages.declaration("trace_index")  # the paths below: marin/stages/table.py
TOKENS, OUT = _DECLARED.input("tokens"), _DECLARED.out("trace_index")
INSTRUCTIONS_MANIFEST = _DECLARED.input("instructions_manifest")
INSTRUCTION_SOURCE = "instructions"  # the source named for a built-in instruction example


def run_stage(root: Path, params: Params) -> None:
    """The trace_index stage: the training documents indexed, as a ledger run."""
    tp = params.trace
    inputs = [Input("tokens", TOKENS.as_posix()), Input("curated_train", CURATED_TRAIN.as_posix()),
              Input("instructions_train", INSTRUCTIONS_TRAIN.as_posix()),
              Input("instructions_manifest", INSTRUCTIONS_MANIFEST.as_posix())]
    with Run.start(root, Recipe("trace_index", {"trace": params.raw.get("trace", {})}, inputs,
                                         closure=stages.code_files(root, "trace_index"))) as run, \
            atomic_dir(root / OUT) as tmp:
        built = trace_index.build(documents(root), tmp, tp.shard_tokens)
        run.output("trace_index", OUT, source=tmp)
    print(f"trace_index: {built['tokens']:,} tokens of {built['documents']:,} training documents in "
          f"{built['shards']} shard(s)")


def documents(root: Path) -> Iterator[trace_index.Doc]:
    """The train split's documents, then the instruction train set's examples."""
    tok = manifest.read(root / TOKENS / "manifest.json", "tokenize")
    shards = [root / TOKENS / s["file"] for s in tok["splits"]["train"]["shards"]]
    licences: dict[str, str] = {}
    rows = training_data.curated_rows(root, ["doc_id", "corpus", "source", "license"], 1024)
    for (doc_id, ids), row in zip(_token_docs(shards), rows, strict=False):
        if doc_id != row["doc_id"]:
            raise StageError(f"trace_index: {TOKENS} does not follow {CURATED_TRAIN} (document {doc_id!r} "
                             f"where {row['doc_id']!r} is); rerun `dvc repro tokenize`")
        licences[row["doc_id"]] = row["license"]
        yield trace_index.Doc(row["doc_id"], row["corpus"], row["source"], row["license"], ids)
    yield from _instructions(root, licences)


def _token_docs(shards: list[Path]) -> Iterator[tuple[str, np.ndarray]]:
    import pyarrow.parquet as pq

    for shard in shards:
        with pq.ParquetFile(shard) as f:
            for b in f.iter_batches(batch_size=256, columns=["doc_id", "tokens"], use_threads=False):
                tokens = b.column("tokens")
                values = tokens.flatten().to_numpy(zero_copy_only=False)
                ends = np.cumsum(tokens.value_lengths().to_numpy(zero_copy_only=False))
                yield from zip(b.column("doc_id").to_pylist(), np.split(values, ends[:-1]), strict=True)


def _instructions(root: Path, licences: dict[str, str]) -> Iterator[trace_index.Doc]:
    """Each instruction train example as decontaminate reads it, encoded as tokenize encodes text;
    its licence that of the document it was cut from, or of the fetch source it came from."""
    sources = {s["name"]: s["license"] for s in
               manifest.read(root / INSTRUCTIONS_MANIFEST, "instructions").get("sources", [])}
    tok = tk.load(root / TOKENS / "tokenizer.json")
    for n, (row, text) in enumerate(training_data.instructions(root)):
        own = row.get("source")
        licence = sources.get(own, "unknown") if own else licences.get(row.get("doc_id", ""), "unknown")
        ids = np.array(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        yield trace_index.Doc(f"{INSTRUCTIONS_TRAIN.as_posix()}:{n + 1}", row.get("task", "own"),
                              own or INSTRUCTION_SOURCE, licence, ids)
