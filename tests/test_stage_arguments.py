"""A stage's entry point takes no arguments but ``-v`` (a reference stage: its reference's name): anything
else, ``--help`` among it, is refused in one line saying how to run the stage, before anything is imported
or run (issue 57: ``python -m pipeline.train --help`` used to train)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from marin.stages import table
from marin.stages.runner import StageUsage, check_arguments
from tests.conftest import REPO


@pytest.mark.parametrize("name", table.NAMES)
@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--steps", "3"], ["extra"], ["-v", "--help"]])
def test_every_stage_refuses_an_argument_it_does_not_take(name: str, argv: list[str]) -> None:
    with pytest.raises(StageUsage) as e:
        check_arguments(name, argv)
    got = " ".join(a for a in argv if a != "-v")
    assert str(e.value) == (f"pipeline.{name} takes no arguments but -v (got {got!r}): run the stage with "
                            f"`dvc repro {name}` or `python -m pipeline.{name}` in the project; its settings are "
                            "in params.yaml")
    assert e.value.exit_code == 2


@pytest.mark.parametrize(("name", "argv", "got"), [
    ("reference_gpt2", ["gpt2", "--help"], "got 'gpt2 --help'"),
    ("reference_gpt2", [], "got none"),
    ("reference_", ["--help"], "got '--help'"),  # `python -m pipeline.reference --help`: no name at all
])
def test_a_reference_stage_takes_its_name(name: str, argv: list[str], got: str) -> None:
    ref = name.removeprefix(table.REFERENCE) or "<name>"
    with pytest.raises(StageUsage, match=f"^pipeline.reference takes a reference's name and -v \\({got}\\): run "
                                         f"the stage with `dvc repro reference_{ref}` or `python -m pipeline.reference "
                                         f"{ref}` in the project"):
        check_arguments(name, argv)


@pytest.mark.parametrize(("name", "argv"), [("train", []), ("train", ["-v"]), ("report", ["--verbose"]),
                                            ("reference_gpt2", ["gpt2"]), ("reference_gpt2", ["gpt2", "-v"])])
def test_what_a_stage_takes_is_accepted(name: str, argv: list[str]) -> None:
    assert check_arguments(name, argv) == 0


def test_train_help_is_one_line_and_exit_2_and_runs_nothing(tmp_path: Path) -> None:
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())  # a project train could start in
    (tmp_path / "ledger" / "runs").mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "pipeline.train", "--help"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["marin: error: pipeline.train takes no arguments but -v (got '--help'): run the "
                                     "stage with `dvc repro train` or `python -m pipeline.train` in the project; its "
                                     "settings are in params.yaml"]
    assert list((tmp_path / "ledger" / "runs").iterdir()) == []  # no run started
    # refused before JAX, MLflow or the stage's code is imported
    probe = ("import runpy, sys\nsys.argv = ['pipeline.train', '--help']\ntry:\n"
             "    runpy.run_module('pipeline.train', run_name='__main__')\nexcept SystemExit as e:\n"
             "    print(e.code, sorted(m for m in ('jax', 'mlflow', 'marin.train.train_stage') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "2 []", r.stderr
