"""Stage curate: raw archives → NFC-normalized, filtered, deduplicated, split documents.

Outputs data/curated/{train,validation}.parquet and manifest.json (the curation funnel).
"""

from pathlib import Path

import pyarrow as pa

from marin import fsutil, hashing
from marin.config import Params
from marin.data import manifest, parquet, sources
from marin.data.curate import curate
from marin.errors import StageError
from marin.ledger import Input, Run
from marin.stage import stage_main

RAW, OUT = Path("data/raw"), Path("data/curated")


def curate_stage(root: Path, params: Params) -> None:
    archives = []
    for src in params.fetch.sources:
        path = sources.archive_path(root / RAW, src)
        if path is None:
            raise StageError(f"no fetched archive for source {src.name!r} under {RAW}; run `dvc repro fetch`")
        archives.append((src, path))
    inputs = [Input(f"archive:{s.name}", p.relative_to(root).as_posix(), s.license, s.locator)
              for s, p in archives]
    with Run.start(root, "curate", params=params.section("fetch", "curate"), inputs=inputs) as run:
        result = curate(archives, params.curate)
        with fsutil.atomic_dir(root / OUT) as tmp:
            splits = {}
            for split in ("train", "validation"):
                docs = [d for d, s in result.kept if s == split]
                table = pa.table({
                    "doc_id": [d.doc_id for d in docs],
                    "corpus": [d.corpus for d in docs],
                    "source": [d.source for d in docs],
                    "name": [d.name for d in docs],
                    "license": [d.license for d in docs],
                    "n_bytes": pa.array([d.n_bytes for d in docs], pa.int64()),
                    "text": [d.text for d in docs],
                })
                parquet.write(table, tmp / f"{split}.parquet")
                splits[split] = {"file": f"{split}.parquet", "digest": hashing.file_digest(tmp / f"{split}.parquet"),
                                 "docs": len(docs), "bytes": sum(d.n_bytes for d in docs)}
            manifest.write({
                "kind": "curate",
                "params": params.raw["curate"],
                "sources": [{"name": s.name, "path": p.relative_to(root).as_posix(),
                             "digest": hashing.path_digest(p), "license": s.license,
                             "license_note": s.license_note, "locator": f"{s.kind}:{s.locator}"}
                            for s, p in archives],
                "funnel": result.funnel(),
                "removed": [{"corpus": r.corpus, "name": r.name, "step": r.step, "detail": r.detail,
                             "bytes": r.n_bytes, "doc_id": r.doc_id} for r in result.removed],
                "splits": splits,
            }, tmp / "manifest.json")
            for name in ("train.parquet", "validation.parquet", "manifest.json"):  # recorded, then published
                run.output(name.split(".")[0] if name != "manifest.json" else "curate_manifest", OUT / name,
                           source=tmp / name)
            run.output("curated", OUT, source=tmp)
        for step in result.funnel()["steps"]:
            if step["removed"]["docs"]:
                print(f"curate: {step['step']:22} removed {step['removed']['docs']:5} docs "
                      f"({step['removed']['bytes']:,} bytes)")
        print(f"curate: kept {len(result.kept)} documents: "
              f"{splits['train']['docs']} train, {splits['validation']['docs']} validation")


if __name__ == "__main__":
    stage_main(curate_stage)
