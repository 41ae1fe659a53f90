"""The universal-profile run the end-to-end tests start from (a pytest plugin: tests/conftest.py): the data
project's tokens, a tiny one-layer model, 3 steps with a checkpoint and a metric record each, recorded once per
session under ``runtime.determinism: universal`` and copied by the tests (tests/test_universal_runs.py,
tests/test_aarch64.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY, Project, copy_project, shared

UNIVERSAL = {  # one block (a block's ops are all there; a second one only doubles the compile), 3 steps
    "model": {**TINY["model"], "n_layers": 1},
    "train": {**TINY["train"], "steps": 3, "warmup_steps": 1, "log_every": 1, "checkpoint_every": 1},
}


def universal(proj: Project, **train: object) -> None:
    """The tiny universal run's params, committed (a run others verify is recorded at a clean commit)."""
    params = proj.params
    params.update(json.loads(json.dumps(UNIVERSAL)))
    params["train"].update(train)
    params["runtime"]["determinism"] = "universal"
    proj.write_params(params)
    proj.git("commit", "-qam", "universal")


def train_run(proj: Project) -> list[dict]:
    [run] = proj.runs("train")
    return run


def summary(run: list[dict]) -> dict:
    """What must repeat bit for bit: checkpoint digests, exact metrics with their rounding log summaries, the model."""
    return {
        "checkpoints": [(r["body"]["step"], r["body"]["digest"]) for r in run if r["kind"] == "checkpoint"],
        "metrics": [(r["body"]["step"], {k: v["hex"] for k, v in r["body"]["values"].items()}, r["body"]["rounding"])
                    for r in run if r["kind"] == "metric"],
        "model": [r["body"]["digest"] for r in run if r["kind"] == "output" and r["body"]["name"] == "model"],
    }


def _record(dest: Path, data: Project) -> None:
    proj = copy_project(data, dest / "proj")
    universal(proj)
    proj.stage("train")


@pytest.fixture(scope="session")
def _universal_project(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Project:
    return Project(shared(tmp_path_factory, "universal", lambda d: _record(d, _data_project)) / "proj")
