"""Stage instructions: the instruction set (data/instructions), built in from the curated train
split (marin.instruct.tasks) plus your own conversations (fetch sources with ``format: messages``,
marin.instruct.messages), and the held-out set from the validation split. The manifest counts
each task and source, like curate's funnel."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from marin import fsutil, hashing
from marin.config import InstructionsParams, Params
from marin.data import chat, manifest, sources
from marin.data.shards import Oversize
from marin.errors import ParamsError, StageError
from marin.instruct import messages, tasks
from marin.ledger import Input, Run

CURATED, RAW, OUT = Path("data/curated"), Path("data/raw"), Path("data/instructions")
SETS = {"train": "train", "heldout": "validation"}  # instruction set -> curated split
RESERVED = (chat.EOS, *chat.CHAT_TOKENS)  # the strings counted: a pretrained tokenizer's others are not known here


def section(params: Params) -> InstructionsParams:
    if params.instructions is None:
        raise ParamsError("params.yaml: no instructions section; add one (the shipped params.yaml has it)")
    return params.instructions


def curated_docs(path: Path) -> Iterator[tasks.Doc]:
    with pq.ParquetFile(path) as f:
        for b in f.iter_batches(batch_size=256, columns=["doc_id", "corpus", "name", "text"], use_threads=False):
            for row in b.to_pylist():
                yield tasks.Doc(**row)


def built_in(path: Path, ip: InstructionsParams, limit: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """(examples, documents read) of one curated split; ``limit``: keep the first by key."""
    out, docs = [], 0
    for doc in curated_docs(path):
        out += tasks.examples(doc, ip.tasks, ip.salt, ip.per_document)
        docs += 1
    if limit is not None:
        out = sorted(out, key=lambda e: e["key"])[:limit]
    return out, docs


def own(root: Path, params: Params) -> tuple[list[tuple[Any, Path, int]], list[dict[str, Any]]]:
    """The messages sources (source, archive, lines dropped over the cap) and their conversations,
    in params order."""
    found, convs = [], []
    for src in params.fetch.sources:
        if not messages.has_messages(src):
            continue
        path = sources.archive_path(root / RAW, src)
        if path is None:
            raise StageError(f"no fetched archive for source {src.name!r} under {RAW}; run `dvc repro fetch`")
        dropped = 0
        for member, n, c in messages.read(src, path, params.curate):
            if isinstance(c, Oversize):
                dropped += 1
            else:
                convs.append({**c, "task": "own", "source": src.name, "line": f"{member}:{n}"})
        found.append((src, path, dropped))
    return found, convs


def special_text(rows: list[dict[str, Any]]) -> int:
    """Messages whose content holds a reserved special token's string (sft encodes it as text)."""
    return sum(chat.carries(m["content"], RESERVED) for r in rows for m in r["messages"])


def warn_special_text(n: dict[str, int]) -> None:
    if any(n.values()):
        print(f"marin: warning: instructions: {sum(n.values()):,} message(s) (train {n['train']:,}, heldout "
              f"{n['heldout']:,}) hold the string of a special token ({', '.join(RESERVED)}); sft encodes it as "
              "ordinary tokens, never a turn (special_text_messages in data/instructions/manifest.json)",
              file=sys.stderr)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    fsutil.write_bytes(path, "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode())


def counts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"examples": len(rows), "tasks": dict(sorted(Counter(r["task"] for r in rows).items())),
            "sources": dict(sorted(Counter(r.get("source", "curated") for r in rows).items())),
            "special_text_messages": special_text(rows)}


def run_stage(root: Path, params: Params) -> None:
    """The instructions stage: data/curated (and messages sources) into data/instructions."""
    ip = section(params)
    byod = [(s, sources.archive_path(root / RAW, s)) for s in params.fetch.sources if messages.has_messages(s)]
    inputs = [Input(s, (CURATED / f"{s}.parquet").as_posix()) for s in SETS.values()]
    inputs += [Input(f"archive:{s.name}", p.relative_to(root).as_posix(), s.license, s.locator)
               for s, p in byod if p is not None]
    with Run.start(root, "instructions", params=params.section("fetch", "curate", "instructions"),
                   inputs=inputs) as run:
        train, train_docs = built_in(root / CURATED / "train.parquet", ip)
        heldout, heldout_docs = built_in(root / CURATED / "validation.parquet", ip, ip.heldout_max)
        found, convs = own(root, params)
        train += convs
        with fsutil.atomic_dir(root / OUT) as tmp:
            write_jsonl(tmp / "train.jsonl", train)
            write_jsonl(tmp / "heldout.jsonl", heldout)
            manifest.write({
                "kind": "instructions", "params": params.raw["instructions"],
                "inputs": {s: hashing.file_digest(root / CURATED / f"{s}.parquet") for s in SETS.values()},
                "sources": [{"name": s.name, "license": s.license, "locator": f"{s.kind}:{s.locator}",
                             "digest": sources.digest_of(p),
                             "conversations": sum(c["source"] == s.name for c in convs), "oversize": d}
                            for s, p, d in found],
                "sets": {"train": {"file": "train.jsonl", "digest": hashing.file_digest(tmp / "train.jsonl"),
                                   "documents": train_docs, **counts(train)},
                         "heldout": {"file": "heldout.jsonl", "digest": hashing.file_digest(tmp / "heldout.jsonl"),
                                     "documents": heldout_docs, **counts(heldout)}},
            }, tmp / "manifest.json")
            warn_special_text({"train": counts(train)["special_text_messages"],
                               "heldout": counts(heldout)["special_text_messages"]})
            for name in ("train", "heldout"):
                run.output(f"instructions_{name}", OUT / f"{name}.jsonl", source=tmp / f"{name}.jsonl")
            run.output("instructions_manifest", OUT / "manifest.json", source=tmp / "manifest.json")
            run.output("instructions", OUT, source=tmp)
    print(f"instructions: {len(train)} train examples ({len(convs)} your own), {len(heldout)} held out; "
          f"tasks {counts(train)['tasks']}")
