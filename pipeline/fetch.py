"""Stage fetch: download every pinned raw source into data/raw/<name>/, verified by sha256.

All sources are fetched and checked into a temporary directory first; data/raw is
replaced only when every digest matches, so a bad download leaves earlier outputs intact.
"""

from pathlib import Path

from marin import fsutil, hashing
from marin.config import Params
from marin.data import sources
from marin.ledger import Run
from marin.stage import stage_main

RAW = Path("data/raw")


def fetch(root: Path, params: Params) -> None:
    raw = root / RAW
    with Run.start(root, "fetch", params=params.section("fetch"), inputs=[]) as run, fsutil.atomic_dir(raw) as tmp:
        for src in params.fetch.sources:
            (tmp / src.name).mkdir()
            got = sources.fetch(src, tmp / src.name, root, cached=sources.archive_path(raw, src))
            run.record("input", {  # what came from outside, as verified
                "name": src.name, "path": (RAW / src.name / got.name).as_posix(),
                "digest": sources.digest_of(got), "size": hashing.path_size(got),
                "license": src.license, "locator": f"{src.kind}:{src.locator}",
            })
            print(f"fetch: {src.name}: {src.locator} ok ({got.name})")
            run.output(f"archive:{src.name}", RAW / src.name / got.name, source=got)
        run.output("raw", RAW, source=tmp)  # recorded, then published: a full ledger keeps data/raw as it was


if __name__ == "__main__":
    stage_main(fetch)
