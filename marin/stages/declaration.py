"""What a stage is: one declaration (:class:`Stage`) says the function it runs, its named data inputs
and outputs, the params sections it reads and what kind of work it does; ``dvc.yaml``, the runner
(:mod:`marin.stages.runner`) and the stage's own code all read it. While a stage runs, its
declaration is :func:`current`."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from marin.errors import StageError

if TYPE_CHECKING:
    from marin.config import Params

# A stage's function: (project root, validated params) -> False when the runtime must not mirror the run
StageFn = Callable[["Path", "Params"], "bool | None"]


@dataclass(frozen=True)
class Out:
    name: str  # what the stage's code calls it (Stage.out)
    path: str
    kind: str = "outs"  # outs | plots | metrics (the last two: small files, cache: false; a plots file is drawn
    #                     by dvc.yaml's top-level plots against its step column, marin.stages.dvcyaml.PLOTS)


@dataclass(frozen=True)
class Stage:
    name: str
    fn: str  # the function it runs, "package.module:function", imported only when the stage runs
    inputs: Mapping[str, str] = field(default_factory=dict)  # data inputs, name -> path (besides the code closure)
    params: tuple[str, ...] = ()
    outs: tuple[Out, ...] = ()
    uses_jax: bool = False  # runs a JAX model: the process restarts with the fast allocator (marin.allocator)
    trains: bool = False  # runs marin.train.loop: checkpoints, segments, resume
    fetches: bool = False  # its inputs come from outside the project (sources named in params.yaml)
    note: str = ""  # one line, written as a comment beside the stage in dvc.yaml
    dep_notes: Mapping[str, str] = field(default_factory=dict)
    task_deps: bool = False  # also the lab's harness task folders and data files (marin.stages.task_files)
    entry: str = ""  # the pipeline/ module, where it is not the stage's name (the reference stages)
    args: str = ""  # after the module in the command

    @property
    def deps(self) -> tuple[str, ...]:
        return tuple(self.inputs.values())

    @property
    def module(self) -> str:
        return f"pipeline.{self.entry or self.name}"

    @property
    def fn_module(self) -> str:
        return self.fn.partition(":")[0]

    @property
    def cmd(self) -> str:
        return f"python -m {self.module}" + (f" {self.args}" if self.args else "")

    def input(self, name: str) -> Path:
        """The path of the data input ``name``."""
        if name not in self.inputs:
            raise StageError(f"stage {self.name} declares no input {name!r} (marin/stages/table.py)")
        return Path(self.inputs[name])

    def out(self, name: str) -> Path:
        """The path of the output ``name``."""
        found = next((o for o in self.outs if o.name == name), None)
        if found is None:
            raise StageError(f"stage {self.name} declares no output {name!r} (marin/stages/table.py)")
        return Path(found.path)

    def function(self) -> StageFn:
        """The stage's function, imported now (a declaration imports none of the stage's code)."""
        module, _, name = self.fn.partition(":")
        return cast(StageFn, getattr(importlib.import_module(module), name))


_CURRENT: ContextVar[Stage | None] = ContextVar("marin_stage", default=None)


def current() -> Stage:
    """The declaration of the stage running in this process (set by :func:`marin.stages.runner.execute`)."""
    stage = _CURRENT.get()
    if stage is None:
        raise StageError("no stage is running: a stage's code runs under marin.stages.runner.execute")
    return stage


@contextmanager
def running(stage: Stage) -> Iterator[Stage]:
    """``stage`` is :func:`current` inside the block."""
    token = _CURRENT.set(stage)
    try:
        yield stage
    finally:
        _CURRENT.reset(token)

