"""Stage fetch: download or copy every pinned raw source into data/raw/<name>/, verified by sha256.

All sources are fetched and checked into a temporary directory first; data/raw is
replaced only when every digest matches, so a bad download leaves earlier outputs intact.
Every source is checked before the stage fails, and the error names each one that failed.
"""

from __future__ import annotations

from pathlib import Path

from marin import fsutil, hashing, stages
from marin.config import Params
from marin.data import sources
from marin.errors import FetchError
from marin.ledger import Recipe, Run
from marin.ledger.bodies import InputBody

RAW = stages.declaration("fetch").out("raw")  # marin/stages/table.py


def run_stage(root: Path, params: Params) -> None:
    """The fetch stage: every source into data/raw, recorded as a ledger run."""
    raw = root / RAW
    tracked = sources.tracked_paths(params.fetch.sources, root)  # local sources in the project: dirty if changed
    with Run.start(root, Recipe("fetch", params.section("fetch"), closure=stages.code_files(root, "fetch"),
                                     tracked=tracked)) as run, \
            fsutil.atomic_dir(raw) as tmp:
        failures: list[FetchError] = []
        for src in params.fetch.sources:
            (tmp / src.name).mkdir()
            try:
                got = sources.fetch(src, tmp / src.name, root, cached=sources.archive_path(raw, src),
                                    bounds=params.network)
            except FetchError as e:  # go on: one run names every source that fails
                failures.append(e)
                continue
            came: InputBody = {  # what came from outside, as verified
                "name": src.name, "path": (RAW / src.name / got.name).as_posix(),
                "digest": sources.digest_of(got), "size": hashing.path_size(got),
                "license": src.license, "locator": f"{src.kind}:{src.locator}",
            }
            if src.text_license:  # the texts' own status, beside the archive's licence
                came["text_license"] = src.text_license
            run.record("input", came)
            print(f"fetch: {src.name}: {src.locator} ok ({got.name})")
            run.output(f"archive:{src.name}", RAW / src.name / got.name, source=got)
        if failures:
            raise sources.failed(failures, len(params.fetch.sources))
        run.output("raw", RAW, source=tmp)  # recorded, then published: a full ledger keeps data/raw as it was

