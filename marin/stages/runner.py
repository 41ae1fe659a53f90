"""The runtime around a pipeline stage: what every ``pipeline/<stage>.py`` and the ``marin``
command share. A stage runs from its declaration (:mod:`marin.stages.table`), which is
:func:`marin.stages.current` while it runs. A MarinError, or a failing disk, ends as one line
on stderr and an exit code."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path

from marin import config
from marin.errors import MarinError, SchemaError, StageError
from marin.paths import project_root
from marin.stages import table
from marin.stages.declaration import Stage, running

# Set by `dvc exp run` (in the workspace, a queue worker or a temporary copy) for the stages it runs.
DVC_EXPERIMENT_VAR = "DVC_EXP_BASELINE_REV"


def guarded(fn: Callable[[], int], verbose: bool = False) -> int:
    """Run ``fn``; a MarinError, or a failing disk (full, quota, read-only, I/O error),
    becomes one line on stderr and an exit code."""
    from marin.fsutil import disk_cause, shown

    try:
        return fn()
    except MarinError as e:
        if verbose:
            raise
        print(f"marin: error: {e.diagnostics()}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        cause = disk_cause(e)
        if verbose or cause is None:
            raise
        where = f"{shown(e.filename)}: " if isinstance(e.filename, str) else ""
        print(f"marin: error: {where}{cause}; free space (or fix the disk) and rerun", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("marin: interrupted; a run it started is left unfinished, as a kill leaves it: rerun (`dvc repro`) "
              "and a train or sft run resumes from its last checkpoint", file=sys.stderr)
        return 130


def execute(stage: Stage, root: Path) -> int:
    """Validate params, check the schema pins, remove what killed runs left, run the stage's function
    with ``stage`` as :func:`marin.stages.current`, mirror it into MLflow: what every stage and
    ``marin report`` do. A stage returns False in a process that must not mirror the run (a train
    worker other than process 0, the launcher of local workers, or a stage that mirrored it itself
    with its own ledger index)."""
    params = config.load(root / "params.yaml")  # before any work: exit 2, no run started
    from marin import schemas

    for problem in schemas.pin_problems()[:1]:  # records are written only against the pinned schemas
        raise SchemaError(problem)
    remove_leftovers(root)
    with running(stage):
        mirrored = stage.function()(root, params)
    stage_ledger_for_experiment(root)
    if mirrored is False:
        return 0
    mirror = table.MIRROR  # the MLflow view; never fails the stage
    getattr(importlib.import_module(mirror.partition(":")[0]), mirror.partition(":")[2])(root)
    return 0


def find(root: Path, name: str) -> Stage:
    """The declaration of stage ``name`` in the project at ``root`` (a reference stage: from its params.yaml)."""
    found = next((s for s in table.declared(root) if s.name == name), None)
    if found is None:
        raise StageError(f"params.yaml: no stage {name} is declared (evaluate.references names the reference "
                         "stages); run `marin stages --write` and `dvc repro`")
    return found


def remove_leftovers(root: Path) -> None:
    """Remove what killed runs of every stage left beside the outputs dvc.yaml declares (temporary
    folders, a version set aside mid-rename), leaving any a live run holds (each under its folder's
    lock). Every stage does it as it starts, ``marin report`` too: a killed curate's folder went only
    at curate's next start, and a plain ``dvc repro`` that reruns another stage left it."""
    from marin import fsutil
    from marin.stages import dvcfiles

    for out in sorted(dvcfiles.declared_outs(root)):
        fsutil.remove_leftovers(root / out)


def stage_ledger_for_experiment(root: Path) -> None:
    """Under `dvc exp run`, put the ledger in git's index: DVC commits an experiment from the files
    git tracks and the stages' own files, and the runs that made its outputs belong in that commit
    (`dvc exp apply` and `dvc exp branch` then bring them with the outputs, and `ledger check` passes)."""
    if os.environ.get(DVC_EXPERIMENT_VAR):
        from marin.env import git

        # Not the run file of a `marin sweep` that is running this experiment as one of its trials: it is
        # still being written, and applying an experiment must not put back an older copy of it.
        git(root, "add", "--", "ledger", ":(exclude,glob)ledger/runs/sweep-*")  # the train launcher adds last


VERBOSE = ("-v", "--verbose")  # the one option a stage takes: a traceback instead of one line


class StageUsage(MarinError):
    """A stage's entry point given an argument it does not take (``--help`` among them)."""

    exit_code = 2


def check_arguments(name: str, argv: list[str]) -> int:
    """0 when ``argv`` is what stage ``name``'s entry point takes (``-v``; a reference stage, its
    reference's name), else StageUsage saying how to run the stage: it reads params.yaml, not argv."""
    ref = name.removeprefix(table.REFERENCE) if name.startswith(table.REFERENCE) else None
    extra = [a for a in argv if a not in VERBOSE]
    if extra == ([ref] if ref else []) and ref != "":
        return 0
    takes = "no arguments but -v" if ref is None else "a reference's name and -v"
    module, stage = (f"pipeline.{name}", name) if ref is None else \
        (f"pipeline.reference {ref or '<name>'}", f"{table.REFERENCE}{ref or '<name>'}")
    got = f"got {' '.join(extra)!r}" if extra else "got none"
    raise StageUsage(f"{module.split()[0]} takes {takes} ({got}): run the stage with `dvc repro {stage}` or "
                     f"`python -m {module}` in the project; its settings are in params.yaml")


def stage_main(name: str) -> None:
    """Entry point of a pipeline/ script: :func:`execute` of the stage declared as ``name`` in the
    project around the working directory, guarded, then exit. An argument it does not take (``--help``)
    is refused first, before anything is imported or run. A stage that uses JAX first restarts
    its process with the allocator a training step needs (:mod:`marin.allocator`)."""
    if refused := guarded(lambda: check_arguments(name, sys.argv[1:])):
        sys.exit(refused)
    static = table.get(name)
    if static is not None and static.uses_jax:
        from marin.allocator import restart_with_fast_allocator

        restart_with_fast_allocator()
    verbose = "-v" in sys.argv or "--verbose" in sys.argv
    sys.exit(guarded(lambda: execute(find(project_root(), name), project_root()), verbose))
