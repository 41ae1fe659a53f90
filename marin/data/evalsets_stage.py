"""Stage evalsets: the built-in harness tasks' data (data/evalsets), cut from the curated
validation split (:mod:`marin.data.evalsets`). Each file is an output with its digest;
manifest.json gives its items, corpora and licences (those of the documents it was cut from)."""

from __future__ import annotations

from pathlib import Path

from marin import hashing, stages
from marin.config import Params
from marin.data import evalsets as es
from marin.data import manifest
from marin.data.parquet import read
from marin.fsutil import atomic_dir
from marin.ledger import Input, Recipe, Run

_DECLARED = stages.declaration("evalsets")  # the paths below: marin/stages/table.py
CURATED, OUT = _DECLARED.input("curated"), _DECLARED.out("evalsets")


def run_stage(root: Path, params: Params) -> None:
    """The evalsets stage: data/curated's validation split into data/evalsets, as a ledger run."""
    inputs = [Input("validation", (CURATED / "validation.parquet").as_posix())]
    # no params: what is drawn, and how, is code (es.SALT and the sizes in marin.data.evalsets)
    with Run.start(root, Recipe("evalsets", {}, inputs, closure=stages.code_files(root, "evalsets"))) as run, \
            atomic_dir(root / OUT) as tmp:
        validation = [es.Doc(r["doc_id"], r["corpus"], r["name"], r["license"], r["text"])
                      for r in read(root / CURATED / "validation.parquet").to_pylist()]
        files = {}
        for name, items in es.build(validation).items():
            data = es.jsonl(items)
            (tmp / f"{name}.jsonl").write_bytes(data)
            files[name] = {"path": (OUT / f"{name}.jsonl").as_posix(), "items": len(items),
                           "digest": hashing.bytes_digest(data),
                           "corpora": sorted({it["corpus"] for it in items}),
                           "licenses": sorted({it["license"] for it in items})}
            run.output(f"evalset:{name}", OUT / f"{name}.jsonl", source=tmp / f"{name}.jsonl")
            print(f"evalsets: {name}: {len(items)} items ({', '.join(files[name]['corpora']) or 'none'})")
        manifest.write({"kind": "evalsets", "salt": es.SALT, "files": files},
                       tmp / "manifest.json")
        run.output("evalsets_manifest", OUT / "manifest.json", source=tmp / "manifest.json")
        run.output("evalsets", OUT, source=tmp)
