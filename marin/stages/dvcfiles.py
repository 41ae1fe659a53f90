"""Reading the project's DVC files: the outputs ``dvc.yaml`` declares and the hashes
``dvc.lock`` records. One home for both, used by ``ledger check`` and ``marin status``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from marin import readers
from marin.errors import LedgerError, MarinError

DVC_YAML, DVC_LOCK = "dvc.yaml", "dvc.lock"
OUT_KEYS = ("outs", "metrics", "plots")


def _load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(readers.read_text(path, "text", LedgerError)) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise LedgerError(f"{path}: not readable YAML ({e}); restore it from git") from None
    if not isinstance(data, dict):
        raise LedgerError(f"{path}: not a DVC file (a mapping of stages); restore it from git")
    return data


def lock_outs(root: Path) -> dict[str, dict[str, str]]:
    """Stage -> {output path: md5} of every output ``dvc.lock`` lists with a hash."""
    out: dict[str, dict[str, str]] = {}
    for name, stage in (_load(Path(root) / DVC_LOCK).get("stages") or {}).items():
        for o in stage.get("outs") or []:
            if "md5" in o:
                out.setdefault(name, {})[Path(o["path"]).as_posix()] = o["md5"]
    return out


def locked(root: Path) -> dict[str, str]:
    """Output path -> md5 of every output ``dvc.lock`` lists with a hash, whatever its stage."""
    return {p: md5 for outs in lock_outs(root).values() for p, md5 in outs.items()}


def stage_deps(root: Path, stage: str) -> list[str]:
    """The dependencies ``dvc.yaml`` lists for ``stage`` (POSIX paths, as written)."""
    deps = ((_load(Path(root) / DVC_YAML).get("stages") or {}).get(stage) or {}).get("deps") or []
    return [Path(str(d)).as_posix() for d in deps]


def declared_outs(root: Path) -> dict[str, bool]:
    """Every output path ``dvc.yaml`` declares (outs, metrics, plots), ``${…}`` resolved from
    params -> whether DVC caches it (``cache: false`` outputs are kept in git instead)."""
    paths: dict[str, bool] = {}
    for stage in (_load(Path(root) / DVC_YAML).get("stages") or {}).values():
        for key in OUT_KEYS:
            for o in stage.get(key) or []:
                name = next(iter(o)) if isinstance(o, dict) else str(o)
                opts = o.get(name) if isinstance(o, dict) else None
                paths[name] = not (isinstance(opts, dict) and opts.get("cache") is False)
    resolved = {interpolate(root, p): cached for p, cached in paths.items()}
    return {Path(p).as_posix(): cached for p, cached in resolved.items() if p is not None}


def interpolate(root: Path, path: str) -> str | None:
    """``reports/${report.model_name}`` with the value from the validated params (None if unknown)."""
    if "${" not in path:
        return path
    from marin import config

    try:
        raw = config.load(Path(root) / "params.yaml").raw
    except MarinError:
        return None

    def value(m: re.Match[str]) -> str:
        v: Any = raw
        for part in m.group(1).split("."):
            v = v[part]
        return str(v)

    try:
        return re.sub(r"\$\{([^}]+)\}", value, path)
    except (KeyError, TypeError):
        return None
