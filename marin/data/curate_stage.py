"""Stage curate: raw archives → NFC-normalized, filtered, deduplicated, split documents.

Outputs data/curated/{train,validation}.parquet and manifest.json (the curation funnel).
The per-shard work runs on the data engine (runtime.data), recorded as the run's execution.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from marin import fsutil, hashing, stages
from marin.config import Params
from marin.data import manifest, sources
from marin.data.curate import curate
from marin.data.engine import Engine
from marin.errors import StageError
from marin.ledger import Input, Recipe, Run

_DECLARED = stages.declaration("curate")  # the paths below: marin/stages/table.py
RAW, OUT = _DECLARED.input("raw"), _DECLARED.out("curated")


def run_stage(root: Path, params: Params) -> None:
    """The curate stage: data/raw's archives into data/curated, recorded as a ledger run."""
    archives = []
    for src in params.fetch.sources:
        if all(ex.format == "messages" for ex in src.extract):  # instruction data only: not a corpus
            continue
        path = sources.archive_path(root / RAW, src)
        if path is None:
            raise StageError(f"no fetched archive for source {src.name!r} under {RAW}; run `dvc repro fetch`")
        archives.append((src, path))
    inputs = [Input(f"archive:{s.name}", p.relative_to(root).as_posix(), s.license, s.locator)
              for s, p in archives]
    engine = Engine.from_params(params)
    with Run.start(root, Recipe("curate", params.section("fetch", "curate"), inputs,
                                 closure=stages.code_files(root, "curate"), execution=engine.describe())) as run:
        with fsutil.atomic_dir(root / OUT) as tmp:
            work = tmp / ".work"  # scratch inside the staged output: a killed run's is removed with it
            work.mkdir()
            result = curate(archives, params.curate, engine, tmp, work)
            splits = result.close()
            funnel = result.funnel.as_dict()
            refuse_empty(splits, funnel)
            manifest.write_streamed({
                "kind": "curate",
                "params": params.raw["curate"],
                "sources": [{"name": s.name, "path": p.relative_to(root).as_posix(),
                             "digest": hashing.digest_path(p, run.hashes).digest, "license": s.license,
                             "license_note": s.license_note, "locator": f"{s.kind}:{s.locator}"}
                            for s, p in archives],
                "funnel": funnel,
                "removed": [],  # streamed from the spool
                "splits": splits,
            }, result.removed, tmp / "manifest.json")
            shutil.rmtree(work)
            for name in ("train.parquet", "validation.parquet", "manifest.json"):  # recorded, then published
                run.output(name.split(".")[0] if name != "manifest.json" else "curate_manifest", OUT / name,
                           source=tmp / name)
            run.output("curated", OUT, source=tmp)
        for step in funnel["steps"]:
            if step["removed"]["docs"]:
                print(f"curate: {step['step']:22} removed {step['removed']['docs']:5} docs "
                      f"({step['removed']['bytes']:,} bytes)")
        print(f"curate: kept {splits['train']['docs'] + splits['validation']['docs']} documents: "
              f"{splits['train']['docs']} train, {splits['validation']['docs']} validation")


def refuse_empty(splits: dict[str, dict[str, Any]], funnel: dict[str, Any]) -> None:
    """No document in the train split is refused here, the first stage that can know: tokenize and
    train would have nothing to learn from. (An empty validation split is train's to refuse: it
    measures the validation loss, and a small corpus may still be tokenized.)"""
    if splits["train"]["docs"]:
        return
    steps = [s for s in funnel["steps"] if s["removed"]["docs"]]
    why = ", ".join(f"{s['step']} removed {s['removed']['docs']}" for s in steps) or "no step removed any"
    n_in = funnel["steps"][0]["in"]["docs"] if funnel["steps"] else 0
    raise StageError(f"curate: no document is left for the train split ({n_in} document(s) in; {why}; "
                     f"{splits['validation']['docs']} in validation); add data, or loosen curate.filters")
