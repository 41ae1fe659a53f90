"""The reference data a report reads: the FMTI indicator list and the MOF license list.

Both are files inside the project, named by ``params.yaml: report`` (defaults: the copies
vendored in ``marin/report/reference/``, with their licences and sources in its README.md).
Each is recorded by digest in ``report.json``, in the signed statement and as an input of
the report run; ``marin report verify`` rereads exactly the recorded files and checks their
digests. A missing file is an error: there is no built-in fallback list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marin import hashing
from marin.config import ReportParams
from marin.errors import ParamsError
from marin.paths import within
from marin.report.facts import ReportError

REFERENCE_DIR = "marin/report/reference"
DEFAULTS = {"fmti_indicators": f"{REFERENCE_DIR}/fmti-indicators-dec2025.csv",
            "mof_licenses": f"{REFERENCE_DIR}/mof-licenses.json"}
_RESTORE = f"restore it (`git checkout -- {REFERENCE_DIR}`) or point report.{{key}} at a file inside the project"


@dataclass(frozen=True)
class Reference:
    """One reference file: the params key that names it, its project-relative path, digest and size."""

    key: str
    path: str
    digest: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "digest": self.digest, "size": self.size}


References = dict[str, Reference]


def inside(root: Path, key: str, given: str) -> str:
    """``given`` as a project-relative POSIX path; a path outside ``root`` is a params error (exit 2)."""
    rel = within(root, given)
    if rel is None:
        raise ParamsError(f"params.yaml: report.{key}: {given} lies outside the project; the report reads only "
                          f"project files: use {DEFAULTS[key]} (vendored) or copy the file into the project")
    return rel


def _read(root: Path, key: str, rel: str) -> Reference:
    path = Path(root) / rel
    if not path.is_file():
        raise ReportError(f"report.{key}: {rel} is missing; {_RESTORE.format(key=key)}")
    return Reference(key, rel, hashing.file_digest(path), path.stat().st_size)


def resolve(root: Path, p: ReportParams | None) -> References:
    """The reference files ``params.yaml: report`` names (or the vendored defaults), digested now."""
    given = {k: (getattr(p, k, None) if p else None) or default for k, default in DEFAULTS.items()}
    return {k: _read(root, k, inside(root, k, v)) for k, v in given.items()}


def recorded(root: Path, data: dict[str, Any] | None) -> tuple[References, list[str]]:
    """The reference files a report recorded (``report.json: references``), reread: each one
    whose file is gone or whose digest changed is a problem (the report is re-derived only from
    the very bytes it was built from)."""
    if not data or set(data) != set(DEFAULTS):
        return {}, [f"report.json: records no reference files {sorted(DEFAULTS)}; built by an older marin? "
                    "rebuild it with `marin report`"]
    refs, problems = {}, []
    for key, rec in sorted(data.items()):
        try:
            now = _read(root, key, inside(root, key, rec["path"]))
        except (ReportError, ParamsError) as e:
            problems.append(f"reference {key}: {e}")
            continue
        if now.digest != rec["digest"]:
            problems.append(f"reference {key}: {rec['path']} hashes to {now.digest}, the report was built from "
                            f"{rec['digest']}; restore that file (git log -- {rec['path']})")
            continue
        refs[key] = now
    return refs, problems


def file(root: Path, ref: Reference) -> Path:
    return Path(root) / ref.path
