"""The project files a lab's harness tasks read, so that they are in the provenance.

A lab task is a YAML in a folder that ``evaluate.harness.include`` (or ``tasks``) names, reading
its items from local data files (``dataset_kwargs.data_files``). Every such folder, and every data
file that lies outside those folders, is a dependency of the evaluate stage in dvc.yaml (generated
by ``marin stages --write``) and an input of its run, by digest: an edit to one byte of a task's
data makes ``dvc status`` and ``marin status`` name evaluate, and ``marin verify`` of the earlier
run name the input. The built-in tasks' YAMLs are package code; their data is ``data/evalsets``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from marin import readers
from marin.config import HarnessParams
from marin.errors import StageError

LOCAL_FORMATS = ("json", "csv", "parquet", "text", "arrow")
MAX_YAMLS = 1000  # task YAMLs in one folder: a folder of tasks, not a dataset


class _Lenient(yaml.SafeLoader):
    """Reads lm-eval's ``!function`` tags as nothing: only plain keys are wanted here."""


_Lenient.add_multi_constructor("!", lambda loader, suffix, node: None)


def folders(root: Path, hp: HarnessParams) -> list[str]:
    """The project folders of task YAMLs: ``include``, and entries of ``tasks`` that are folders."""
    named = [*hp.include, *(t for t in hp.tasks if (Path(root) / t).is_dir())]
    return sorted({inside(root, f, "evaluate.harness") for f in named})


def task_paths(root: Path, hp: HarnessParams) -> list[str]:
    """Every folder of task YAMLs, every folder of a registry task's hub dataset
    (``evaluate.harness.datasets``, :mod:`marin.evaluate.registry`) and every local data file the
    tasks name outside those folders: project-relative, sorted, the folders first. A data file
    outside the project is a StageError."""
    dirs = folders(root, hp)
    hub = sorted({inside(root, d.path, f"evaluate.harness.datasets {d.hub_id}") for d in hp.datasets})
    files: set[str] = set()
    for d in dirs:
        yamls = sorted((Path(root) / d).rglob("*.yaml"))
        if len(yamls) > MAX_YAMLS:
            raise StageError(f"{d}: {len(yamls)} task YAMLs, over {MAX_YAMLS}; split the folder")
        for y in yamls:
            for f in data_files(config_of(y)):
                rel = inside(root, f, f"{y.relative_to(root).as_posix()}: dataset_kwargs.data_files")
                if (Path(root) / rel).is_file() and not any(PurePosixPath(rel).is_relative_to(x) for x in dirs):
                    files.add(rel)
    return [*dirs, *(h for h in hub if h not in dirs), *sorted(files)]


def listed_paths(root: Path, hp: HarnessParams, stage: str) -> list[str]:
    """:func:`task_paths`, refused unless dvc.yaml lists each as a dependency of ``stage``: an edit DVC
    cannot see would leave the stage "up to date"."""
    from marin.stages import dvcfiles

    paths = task_paths(root, hp)
    listed = set(dvcfiles.stage_deps(root, stage))
    missing = [p for p in paths if p not in listed]
    if missing:
        raise StageError(f"dvc.yaml: stage {stage} does not list {missing[0]}, which evaluate.harness reads: "
                         "run `marin stages --write` and commit dvc.yaml, so that DVC sees an edit to it")
    return paths


def data_files(cfg: dict[str, Any]) -> list[str]:
    """The local data files a task config names (none unless its dataset_path is a local format)."""
    if cfg.get("dataset_path") not in LOCAL_FORMATS:
        return []
    listed = (cfg.get("dataset_kwargs") or {}).get("data_files")
    values = [listed] if isinstance(listed, str) else list(listed.values()) if isinstance(listed, dict) else listed
    return [f for x in values or [] for f in ([x] if isinstance(x, str) else x) if isinstance(f, str)]


def config_of(path: Path) -> dict[str, Any]:
    try:
        cfg = yaml.load(readers.read_text(path, "task", StageError), Loader=_Lenient)
    except yaml.YAMLError:
        return {}  # lm-eval names a YAML it cannot read, in one line, when the task runs
    return cfg if isinstance(cfg, dict) else {}


def inside(root: Path, path: str, where: str) -> str:
    """``path`` as a project-relative POSIX path; a StageError naming ``where`` when it lies outside."""
    p = Path(path)
    full = (p if p.is_absolute() else Path(root) / p).resolve()
    base = Path(root).resolve()
    if not full.is_relative_to(base):
        raise StageError(f"{where}: {path} lies outside the project; copy it into the project (the provenance "
                         "covers project files only)")
    return full.relative_to(base).as_posix()
