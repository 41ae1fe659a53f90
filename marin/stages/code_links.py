"""A stage's code as DVC sees it: one folder of links to the files of its import closure.

Listing every closure file in ``dvc.yaml`` made each one a dependency column of ``dvc exp show``
(about 180 on the tiny project). Instead ``closures/<stage>/`` holds a relative symbolic link to each
file of the stage's closure (:mod:`marin.stages.closure`) at its own path (``closures/train/marin/train/
loop.py -> ../../../../marin/train/loop.py``), ``schemas/`` and ``uv.lock`` included, so that a stage's
code is one dependency and one column. DVC hashes a folder dependency through its links, by the
content and mtime of the files they point to, so an edit to any closure file still makes ``dvc
status`` name exactly the stages that import it. ``marin stages --write`` writes the links with
``dvc.yaml``; ``--check`` names a missing, extra or misdirected one.
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER = "closures"


def dep(name: str) -> str:
    """The code dependency ``dvc.yaml`` lists for stage ``name``: its folder of links."""
    return f"{FOLDER}/{name}"


def wanted(folders: dict[str, set[str]]) -> dict[str, str]:
    """Link path -> the project file it points to, for every link of every folder."""
    return {f"{FOLDER}/{name}/{f}": f for name, files in folders.items() for f in files}


def existing(root: Path) -> dict[str, str | None]:
    """Every file under ``closures/`` -> the project file its link points to (None: not a link into
    the project)."""
    root, base = Path(root), Path(root) / FOLDER
    out: dict[str, str | None] = {}
    for dirpath, _, names in os.walk(base):
        for n in names:
            p = Path(dirpath, n)
            out[p.relative_to(root).as_posix()] = target(root, p)
    return out


def target(root: Path, link: Path) -> str | None:
    """The project-relative file ``link`` points to, or None (not a link, or pointing outside)."""
    if not link.is_symlink():
        return None
    dest = Path(os.path.normpath(link.parent / os.readlink(link)))
    try:
        return dest.relative_to(Path(root)).as_posix()
    except ValueError:
        return None


def write(root: Path, folders: dict[str, set[str]]) -> None:
    """Make ``closures/`` hold exactly the wanted links (relative), removing every other file there."""
    root = Path(root)
    want = wanted(folders)
    for rel, dest in existing(root).items():
        if rel not in want or want[rel] != dest:
            (root / rel).unlink()
    for rel, dest in sorted(want.items()):
        link = root / rel
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(root / dest, link.parent))
    for dirpath, _, _ in sorted(os.walk(root / FOLDER), key=lambda w: -len(w[0])):
        if not os.listdir(dirpath):
            os.rmdir(dirpath)


def problems(root: Path, folders: dict[str, set[str]]) -> list[str]:
    """One line per link that is missing, extra, or points elsewhere than the closure says."""
    want, have = wanted(folders), existing(root)
    out = [f"{rel}: missing (a link to {dest})" for rel, dest in sorted(want.items()) if rel not in have]
    out += [f"{rel}: {'not a link into the project' if dest is None else 'links to ' + dest}, "
            f"{'not in the closure' if rel not in want else 'not ' + want[rel]}"
            for rel, dest in sorted(have.items()) if rel not in want or want[rel] != dest]
    return out
