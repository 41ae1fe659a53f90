"""``marin publish --hf-folder OUT``: the export (``models/hf``) as a plain folder holding exactly
what ``huggingface_hub.upload_folder`` sends: the files the export run recorded, as regular files
(DVC may have linked them to its cache), nothing else; and the one command that pushes it."""

from __future__ import annotations

import shutil
from pathlib import Path

from marin import hashing, stages
from marin.errors import MarinError
from marin.export.export_stage import OUT as EXPORT
from marin.ledger.query import Ledger


class HubFolderError(MarinError):
    """The export is missing or not what an export run recorded, or the destination is in use."""


def recorded_export(root: Path) -> tuple[str, str]:
    """(export run id, folder digest) of ``models/hf`` as it is on disk, when an export run wrote it so."""
    src = root / EXPORT
    if not src.is_dir():
        raise HubFolderError(f"{EXPORT}: no such folder; run the export stage (`dvc repro export`)")
    digest = hashing.path_digest(src)
    with Ledger(root, sources=stages.SOURCE_STAGES) as ledger:
        found = [(log.run_id, b) for log, b in ledger.producers_of(digest) if b.get("name") == "hf_model"]
    if not found:
        raise HubFolderError(f"{EXPORT}: is not what any export run recorded (a file was added, edited or removed); "
                             "restore it with `dvc checkout models/hf` or rerun `dvc repro export`")
    return found[-1][0], digest


def write_hub_folder(root: Path, out: Path, repo: str) -> tuple[list[str], str]:
    """Copy the recorded export into ``out`` (new or empty) as regular files. Returns the files
    written (relative posix paths) and the command that uploads the folder to the Hub repository ``repo``."""
    run_id, digest = recorded_export(root)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise HubFolderError(f"{out}: exists and is not an empty folder; give a new folder")
    names = [p for p, _, _ in hashing.dir_entries(root / EXPORT)]
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / EXPORT / name, out / name)  # follows a DVC link: the bytes, never the link
    if hashing.path_digest(out) != digest:
        raise HubFolderError(f"{out}: the copy does not hash to {digest} (export run {run_id}); "
                             "the disk changed under it: remove the folder and rerun")
    return names, f"hf upload {repo} {out} ."
