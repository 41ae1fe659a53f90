"""Manifests: validated against schemas/manifest/<kind>.schema.json, written stably."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from marin import fsutil, schemas


def dumps(obj: Any) -> bytes:
    """Stable, human-readable JSON (sorted keys, fixed indent, trailing newline)."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def write(obj: dict[str, Any], path: Path) -> None:
    schemas.validate(obj, f"manifest/{obj['kind']}", f"manifest {path}")
    fsutil.write_bytes(path, dumps(obj))


def read(path: Path, kind: str) -> dict[str, Any]:
    obj = json.loads(path.read_text())
    schemas.validate(obj, f"manifest/{kind}", f"manifest {path}")
    return obj
