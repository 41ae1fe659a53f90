"""Stage instructions: the instruction set (data/instructions), built in from the curated train
split (marin.instruct.tasks) plus your own conversations (fetch sources with ``format: messages``,
marin.instruct.messages), and the held-out set from the validation split. The manifest counts
each task and source, like curate's funnel."""

from __future__ import annotations

import heapq
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from marin import fsutil, hashing, readers, stages
from marin.config import InstructionsParams, Params
from marin.data import chat, manifest, sources
from marin.data.shards import Oversize
from marin.errors import ParamsError, StageError
from marin.fsutil import shown
from marin.instruct import messages, tasks
from marin.ledger import Input, Recipe, Run

_DECLARED = stages.declaration("instructions")  # the paths below: marin/stages/table.py
CURATED, RAW, OUT = _DECLARED.input("curated"), _DECLARED.input("raw"), _DECLARED.out("instructions")
SETS = {"train": "train", "heldout": "validation"}  # instruction set -> curated split
RESERVED = (chat.EOS, *chat.CHAT_TOKENS)  # the strings counted: a pretrained tokenizer's others are not known here
CAP = readers.CAPS["conversations"]  # what sft and evaluate read back, a file and a line


def section(params: Params) -> InstructionsParams:
    if params.instructions is None:
        raise ParamsError("params.yaml: no instructions section; add one (the shipped params.yaml has it)")
    return params.instructions


def curated_docs(path: Path) -> Iterator[tasks.Doc]:
    with pq.ParquetFile(path) as f:
        for b in f.iter_batches(batch_size=256, columns=["doc_id", "corpus", "name", "text"], use_threads=False):
            for row in b.to_pylist():
                yield tasks.Doc(**row)


def built_in(path: Path, ip: InstructionsParams) -> Iterator[dict[str, Any]]:
    """The examples of one curated split, document by document."""
    for doc in curated_docs(path):
        yield from tasks.examples(doc, ip.tasks, ip.salt, ip.per_document)


POOL = 8  # held-out examples are balanced among the POOL × heldout_max of smallest key (bounded memory)


def heldout_examples(path: Path, ip: InstructionsParams) -> list[dict[str, Any]]:
    """``heldout_max`` examples of the validation split, balanced (:func:`balanced`) among those
    of smallest key, so that no task and no answer fills the set (a constant answer would score
    what its share is)."""
    pool = heapq.nsmallest(POOL * ip.heldout_max, built_in(path, ip), key=lambda e: e["key"])
    return balanced(pool)[:ip.heldout_max]


def balanced(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``examples`` in round-robin order over the tasks (sorted by name) and, within a task, over
    its answers: each task's examples ordered by (how many of its answer come before, key)."""
    before: Counter[tuple[str, str]] = Counter()
    per_task: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
    for e in sorted(examples, key=lambda e: e["key"]):
        answer = (e["task"], e["messages"][-1]["content"])
        per_task.setdefault(e["task"], []).append((before[answer], e["key"], e))
        before[answer] += 1
    queues = [[e for _, _, e in sorted(rows, key=lambda r: r[:2])] for _, rows in sorted(per_task.items())]
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def own(root: Path, params: Params, out: Out) -> list[tuple[Any, Path, int]]:
    """The messages sources' conversations, in params order, written to ``out``; (source, archive,
    lines dropped over the cap) of each."""
    found = []
    for src, path in own_archives(root, params):
        dropped = 0
        for member, n, c in messages.read(src, path, params.curate):
            if isinstance(c, Oversize):
                dropped += 1
            else:
                out.add({**c, "task": "own", "source": src.name, "line": f"{member}:{n}"})
        found.append((src, path, dropped))
    return found


def own_archives(root: Path, params: Params) -> Iterator[tuple[Any, Path]]:
    for src in params.fetch.sources:
        if messages.has_messages(src):
            path = sources.archive_path(root / RAW, src)
            if path is None:
                raise StageError(f"no fetched archive for source {src.name!r} under {RAW}; run `dvc repro fetch`")
            yield src, path


def refuse_large(root: Path, params: Params) -> None:
    """Your own conversations, decompressed and counted before a line is parsed: over the cap of
    the file sft reads (CAPS["conversations"]) refused in seconds (4 GB of valid small lines in a
    20 MB .jsonl.gz ran out of memory before; parsing 1 GiB of them would take minutes)."""
    total = 0
    for src, path in own_archives(root, params):
        total += messages.scan(src, path, params.curate, CAP.size - total)
        if total > CAP.size:
            raise StageError(f"fetch.sources[{src.name}]: {shown(path)}: your own conversations (format: messages) "
                             f"decompress to over {CAP.size:,} bytes, the cap for {CAP.what} sft reads; refusing "
                             f"them unparsed: {CAP.fix}")


def special_text(messages_: list[dict[str, str]]) -> int:
    """Messages whose content holds a reserved special token's string (sft encodes it as text)."""
    return sum(chat.carries(m["content"], RESERVED) for m in messages_)


def warn_special_text(n: dict[str, int]) -> None:
    if any(n.values()):
        print(f"marin: warning: instructions: {sum(n.values()):,} message(s) (train {n['train']:,}, heldout "
              f"{n['heldout']:,}) hold the string of a special token ({', '.join(RESERVED)}); sft encodes it as "
              "ordinary tokens, never a turn (special_text_messages in data/instructions/manifest.json)",
              file=sys.stderr)


class Out:
    """One set's JSONL file, written a row at a time and counted; a line or a file over the caps
    of what sft and evaluate read back (CAPS["conversations"]) is refused in one line."""

    def __init__(self, path: Path):
        self.path, self.f = path, open(path, "wb")  # noqa: SIM115 (closed by close())
        self.examples = self.bytes = self.special = 0
        self.tasks: Counter[str] = Counter()
        self.sources: Counter[str] = Counter()

    def add(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n").encode()
        where = (f"{OUT / self.path.name}: example {self.examples + 1:,} "
                 f"({row.get('source', 'curated')} {row.get('line', row.get('key', ''))})")
        if len(line) > CAP.line:
            raise StageError(f"{where} is {len(line):,} bytes, over the {CAP.line:,}-byte cap for one line of "
                             f"{CAP.what}; shorten it or drop it from the source")
        if self.bytes + len(line) > CAP.size:
            raise StageError(f"{where} takes the file over {CAP.size:,} bytes, the cap for {CAP.what}; {CAP.fix}")
        self.f.write(line)
        self.examples, self.bytes = self.examples + 1, self.bytes + len(line)
        self.tasks[row["task"]] += 1
        self.sources[row.get("source", "curated")] += 1
        self.special += special_text(row["messages"])

    def close(self) -> dict[str, Any]:
        """Close the file; the manifest's counts for it."""
        self.f.close()
        return {"file": self.path.name, "digest": hashing.file_digest(self.path), "examples": self.examples,
                "tasks": dict(sorted(self.tasks.items())), "sources": dict(sorted(self.sources.items())),
                "special_text_messages": self.special}


def run_stage(root: Path, params: Params) -> None:
    """The instructions stage: data/curated (and messages sources) into data/instructions."""
    ip = section(params)
    byod = [(s, sources.archive_path(root / RAW, s)) for s in params.fetch.sources if messages.has_messages(s)]
    inputs = [Input(s, (CURATED / f"{s}.parquet").as_posix()) for s in SETS.values()]
    inputs += [Input(f"archive:{s.name}", p.relative_to(root).as_posix(), s.license, s.locator)
               for s, p in byod if p is not None]
    recipe = Recipe("instructions", params.section("fetch", "curate", "instructions"), inputs,
                    closure=stages.code_files(root, "instructions"))
    with Run.start(root, recipe) as run, fsutil.atomic_dir(root / OUT) as tmp:
        refuse_large(root, params)
        train, heldout = Out(tmp / "train.jsonl"), Out(tmp / "heldout.jsonl")
        try:
            for e in built_in(root / CURATED / "train.parquet", ip):
                train.add(e)
            for e in heldout_examples(root / CURATED / "validation.parquet", ip):
                heldout.add(e)
            found = own(root, params, train)
        finally:
            sets = {"train": train.close(), "heldout": heldout.close()}
        docs = {s: pq.ParquetFile(root / CURATED / f"{SETS[s]}.parquet").metadata.num_rows for s in SETS}
        manifest.write({
            "kind": "instructions", "params": params.raw["instructions"],
            "inputs": {s: hashing.file_digest(root / CURATED / f"{s}.parquet") for s in SETS.values()},
            "sources": [{"name": s.name, "license": s.license, "locator": f"{s.kind}:{s.locator}",
                         "digest": sources.digest_of(p), "conversations": train.sources[s.name], "oversize": d}
                        for s, p, d in found],
            "sets": {k: {"file": v["file"], "digest": v["digest"], "documents": docs[k],
                         **{x: y for x, y in v.items() if x not in ("file", "digest")}} for k, v in sets.items()},
        }, tmp / "manifest.json")
        warn_special_text({k: v["special_text_messages"] for k, v in sets.items()})
        for name in ("train", "heldout"):
            run.output(f"instructions_{name}", OUT / f"{name}.jsonl", source=tmp / f"{name}.jsonl")
        run.output("instructions_manifest", OUT / "manifest.json", source=tmp / "manifest.json")
        run.output("instructions", OUT, source=tmp)
    own_n = sum(train.sources[s.name] for s, _, _ in found)
    print(f"instructions: {train.examples} train examples ({own_n} your own), {heldout.examples} held out; "
          f"tasks {sets['train']['tasks']}")
