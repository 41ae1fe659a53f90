"""The universal-profile run the end-to-end tests start from (a pytest plugin: tests/conftest.py): the data
project's tokens, a tiny one-layer model, 3 steps with a checkpoint and a metric record each, recorded once per
session under ``runtime.determinism: universal`` and copied by the tests (tests/test_universal_runs.py,
tests/test_aarch64.py); and that model evaluated under universal, once per session (evalsets built, one harness
task on 4 items, one prompt of 4 tokens: every rounded function runs, emulation stays short;
tests/test_universal_scoring.py, tests/test_aarch64.py); and its universal fine-tune, 3 steps, evaluated by
evaluate_instruct on 8 held-out instructions of 4 tokens each, once per session."""

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


EVALUATE = {"prompts": ["ROMEO."], "sample_tokens": 4, "batch_size": 8,
            "harness": {"tasks": ["marin_cloze"], "limit": 4, "batch_size": 8}}


SFT = {"steps": 3, "batch_size": 4, "lr": 3.0e-3, "schedule": "cosine", "warmup_steps": 1, "min_lr_ratio": 0.1,
       "wsd_decay_fraction": 0.2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8, "grad_clip": 1.0,
       "log_every": 1, "checkpoint_every": 1}
INSTRUCTIONS = {"salt": "marin-instructions-v1", "per_document": 2, "heldout_max": 8, "tasks": ["continue"],
                "eval_tokens": 4}


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


def _evaluate(dest: Path, trained: Project) -> None:
    proj = copy_project(trained, dest / "proj")
    params = proj.params
    params["evaluate"] = json.loads(json.dumps(EVALUATE))
    proj.write_params(params)
    proj.git("commit", "-qam", "evaluate: one prompt, one harness task on 4 items")
    proj.stage("evalsets")
    proj.stage("evaluate")


def _fine_tune(dest: Path, trained: Project) -> None:
    proj = copy_project(trained, dest / "proj")
    params = proj.params
    params["sft"], params["instructions"] = dict(SFT), json.loads(json.dumps(INSTRUCTIONS))
    proj.write_params(params)
    proj.git("commit", "-qam", "universal sft: 3 steps; 8 held-out instructions")
    for stage in ("instructions", "sft", "evaluate_instruct"):
        proj.stage(stage)


@pytest.fixture(scope="session")
def _universal_sft(tmp_path_factory: pytest.TempPathFactory, _universal_project: Project) -> Project:
    return Project(shared(tmp_path_factory, "universal-sft", lambda d: _fine_tune(d, _universal_project)) / "proj")


@pytest.fixture(scope="session")
def _universal_evaluated(tmp_path_factory: pytest.TempPathFactory, _universal_project: Project) -> Project:
    return Project(shared(tmp_path_factory, "universal-evaluated",
                          lambda d: _evaluate(d, _universal_project)) / "proj")


@pytest.fixture(scope="session")
def _universal_project(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Project:
    return Project(shared(tmp_path_factory, "universal", lambda d: _record(d, _data_project)) / "proj")
