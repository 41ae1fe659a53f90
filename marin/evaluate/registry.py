"""lm-eval's own registry tasks (``lambada_openai``, ``arc_easy``, ``hellaswag`` ...) run by name,
offline, on their hub datasets kept in the project.

There is no dataset hub here. A registry task whose YAML reads the hub dataset ``D``
(``dataset_path: D``) runs when ``evaluate.harness.datasets`` lists ``D`` with a project folder,
pinned by the folder's tree digest (:func:`marin.hashing.dir_digest`) like a corpus. The folder
holds one file per split, ``<dataset_name, or default>/<split>.<jsonl|json|parquet|csv>``, fetched
once by the user (docs/guide/harness.md). A generated YAML ``include``\\ s the registry's own, so the
prompts, metrics and ``!function`` hooks are lm-eval's, and points ``dataset_path`` at those files.
The folder is a dependency of the evaluate stage and an input of its run (:mod:`task_files`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from marin import hashing
from marin.config import HarnessParams, HubDataset
from marin.errors import StageError
from marin.stages import task_files

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
SPLITS = ("test_split", "validation_split", "training_split", "fewshot_split")  # the first two: one is needed


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    """lm-eval's task index over its ~15,000 bundled YAMLs (about 11 s): built once per process,
    and only when a task is in no local folder."""
    from lm_eval.tasks import TaskManager

    return dict(TaskManager(include_defaults=True).task_index)


def entry(name: str) -> Any | None:
    """The registry's entry for the task ``name`` (its YAML path and resolved config), or None."""
    e = _index().get(name)
    return e if e is not None and getattr(e, "yaml_path", None) else None


def write_overrides(root: Path, hp: HarnessParams, names: list[str], dest: Path) -> dict[str, str]:
    """A YAML in ``dest`` for each of ``names`` that is a registry task whose hub dataset
    ``evaluate.harness.datasets`` lists; the others that are registry tasks, with why they cannot
    run (one line each). Names the registry does not know are left to the caller."""
    errors: dict[str, str] = {}
    listed = {d.hub_id: d for d in hp.datasets}
    for name in names:
        e = entry(name)
        if e is None:
            continue
        cfg = e.cfg or {}
        if getattr(e.kind, "name", "TASK") != "TASK":
            errors[name] = f"harness task {name!r} is an lm-eval group or tag; name its tasks one by one"
            continue
        hub = str(cfg.get("dataset_path"))
        if hub not in listed:
            errors[name] = (f"harness task {name!r} reads the hub dataset {hub}, which is not here (there is no "
                            "hub); fetch it once into a project folder and list it in evaluate.harness.datasets "
                            "(docs/guide/harness.md)")
            continue
        check_pin(root, listed[hub])  # a refused pin fails the stage: its items are not the pinned ones
        try:
            files = split_files(root, listed[hub], cfg)
        except StageError as err:
            errors[name] = f"harness task {name!r}: {err}"
            continue
        fmt = FORMATS[Path(next(iter(files.values()))).suffix]
        doc = {"include": str(e.yaml_path), "task": name, "dataset_path": fmt, "dataset_name": None,
               "dataset_kwargs": {"data_files": files}}
        (dest / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=True))
    return errors


def split_files(root: Path, ds: HubDataset, cfg: dict[str, Any]) -> dict[str, str]:
    """The project-relative file of each split the task uses, from ``ds``'s folder (its pin checked
    before); a StageError (the rest of a line) when a needed split or the format is wrong."""
    sub = f"{task_files.inside(root, ds.path, 'evaluate.harness.datasets')}/{cfg.get('dataset_name') or 'default'}"
    files: dict[str, str] = {}
    for key in SPLITS:
        split = cfg.get(key)
        found = [f"{sub}/{split}{ext}" for ext in FORMATS if split and (root / sub / f"{split}{ext}").is_file()]
        if len(found) > 1:
            raise StageError(f"{sub} holds {' and '.join(found)}; keep one file per split")
        if found:
            files[str(split)] = found[0]
    if not (files.keys() & {cfg.get("test_split"), cfg.get("validation_split")}):
        split = cfg.get("test_split") or cfg.get("validation_split")
        raise StageError(f"no file for its {split!r} split in {sub} (expected {split}.jsonl, .json, .parquet or .csv)")
    if len({FORMATS[Path(f).suffix] for f in files.values()}) > 1:
        raise StageError(f"{sub}: its splits are in different formats; use one")
    return files


def check_pin(root: Path, ds: HubDataset) -> None:
    """A StageError unless ``ds``'s folder is a project folder whose tree digest is the pinned one."""
    folder = root / task_files.inside(root, ds.path, "evaluate.harness.datasets")
    if not folder.is_dir():
        raise StageError(f"evaluate.harness.datasets {ds.hub_id}: {ds.path} is not a folder; fetch the dataset's "
                         "files into it (docs/guide/harness.md)")
    try:  # links refused: a pinned dataset holds its own bytes, never a way out of the project
        found = hashing.dir_digest(folder, links=False).removeprefix(hashing.PREFIX)
    except hashing.NotPlain as e:
        raise StageError(f"evaluate.harness.datasets {ds.hub_id}: {e}") from None
    if found != ds.sha256:
        raise StageError(f"evaluate.harness.datasets {ds.hub_id}: {ds.path} has sha256 {found}, params.yaml pins "
                         f"{ds.sha256}; if you replaced its files on purpose, pin the new digest")
