"""Where things live in a marin project."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
SCHEMA_DIR = PACKAGE_ROOT.parent / "schemas"


def project_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The project root: $MARIN_ROOT, else the nearest directory holding params.yaml."""
    env = os.environ.get("MARIN_ROOT")
    if env:
        return Path(env).resolve()
    here = Path(start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if is_project(d):
            return d
    return here


NOT_A_PROJECT = "not a marin project (no dvc.yaml/params.yaml here or above)"


def is_project(root: Path) -> bool:
    """Whether ``root`` holds a project's params.yaml or dvc.yaml."""
    return (root / "params.yaml").is_file() or (root / "dvc.yaml").is_file()


def ledger_dir(root: Path) -> Path:
    return root / "ledger" / "runs"


def within(root: Path, given: str) -> str | None:
    """``given`` (absolute, ``~``, or relative to ``root``) as a project-relative POSIX path; None
    if it lies outside the project (each caller says why that is refused)."""
    path = Path(given).expanduser()
    full = (path if path.is_absolute() else root / path).resolve()
    try:
        return full.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return None


def relpath(root: Path, path: str | os.PathLike[str]) -> str:
    """``path`` relative to ``root`` as posix text, or the absolute path if it lies outside."""
    p = Path(path).resolve()
    try:
        return p.relative_to(Path(root).resolve()).as_posix()
    except ValueError:
        return str(p)
