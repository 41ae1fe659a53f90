"""aarch64 in the portable class: a tiny train, sft and evaluate under ``qemu-aarch64`` give this
machine's bits, and a run recorded on either architecture verifies bit-exact on the other.

The arm64 interpreter is Debian's python3.11 for arm64 with PyPI's aarch64 wheels at this
environment's versions, built and cached by ``scripts/arm64-env.sh`` (a cold build ~100 s, then
nothing). Emulated aarch64 runs a tiny stage in ~4-5 minutes (a JAX import alone ~20 s), so
the model is the portable tests' tiny one and each emulated stage runs once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Project, copy_project, mini_params, new_project, tiny
from tests.test_instruct import instruct_params, make_instruct_corpus
from tests.test_portable import PORTABLE_TINY, fresh, train_bits

pytestmark = pytest.mark.slow

SFT = {"steps": 4, "warmup_steps": 1, "log_every": 1, "checkpoint_every": 2}


@pytest.fixture(scope="module")
def arm_python() -> str:
    if shutil.which("qemu-aarch64") is None:  # a missing emulator is a failure, not a skip
        pytest.fail("qemu-aarch64 is not installed: run scripts/system-packages.sh (Debian package qemu-user)")
    p = subprocess.run(["bash", str(REPO / "scripts/arm64-env.sh"), sys.executable], capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def on_arm(proj: Project, python: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return proj.run(python, *argv, check=check, timeout=1800)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """Data stages and the instruction set, natively; the portable tiny model and a 4-step fine-tune."""
    corpus = make_instruct_corpus(tmp_path_factory.mktemp("arm-corpus") / "mini")
    proj = fresh(new_project(tmp_path_factory.mktemp("arm-data") / "proj", mini_params(corpus)))
    tiny(proj)
    instruct_params(proj, **SFT)
    params = proj.params
    params.update(json.loads(json.dumps(PORTABLE_TINY)))
    proj.write_params(params)
    proj.git("commit", "-qam", "tiny portable model, short fine-tune")
    for stage in ("fetch", "curate", "tokenize", "instructions"):
        proj.stage(stage)
    return proj


@pytest.fixture(scope="module")
def host(data: Project, tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = fresh(copy_project(data, tmp_path_factory.mktemp("arm-host") / "proj"))
    for stage in ("train", "sft", "evaluate"):
        proj.stage(stage)
    return proj


@pytest.fixture(scope="module")
def arm(data: Project, arm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = fresh(copy_project(data, tmp_path_factory.mktemp("arm-emulated") / "proj"))
    for stage in ("train", "sft", "evaluate"):
        on_arm(proj, arm_python, "-m", f"pipeline.{stage}")
    return proj


def run_bits(proj: Project, stage: str) -> dict[str, Any]:
    bits = train_bits_of(proj, stage)
    bits.pop("env")
    return bits


def train_bits_of(proj: Project, stage: str) -> dict[str, Any]:
    if stage == "train":
        return train_bits(proj)
    [run] = proj.runs(stage)
    return {"records": [r["body"] for r in run if r["kind"] in ("checkpoint", "metric", "output", "eval")],
            "class": run[0]["body"].get("determinism_class"), "env": run[0]["body"]["env"]}


def test_train_sft_and_evaluate_give_the_hosts_bits_on_aarch64(host: Project, arm: Project) -> None:
    for stage in ("train", "sft", "evaluate"):
        theirs = train_bits_of(arm, stage)
        assert theirs["env"]["machine"] == "aarch64", stage  # it ran as arm64 code
        assert run_bits(arm, stage) == run_bits(host, stage), stage
    got = train_bits(arm)
    assert len(got["checkpoints"]) == 2 and len(got["metrics"]) == 4
    assert got["class"]["profile"] == "portable" and got["class"]["baselines"]["aarch64"] == "armv8-a"
    assert (arm.root / "metrics/eval.json").read_bytes() == (host.root / "metrics/eval.json").read_bytes()


def verdict(proj: Project, run_id: str) -> dict[str, Any]:
    [run] = [r for r in proj.runs("train") if r[0]["run_id"] == run_id]
    return [x for x in run if x["kind"] == "verification"][-1]["body"]


def test_an_aarch64_run_verifies_bit_exact_here(arm: Project, tmp_path: Path) -> None:
    proj = copy_project(arm, tmp_path / "proj")
    [run] = proj.runs("train")
    r = proj.marin("verify", run[0]["run_id"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU" in r.stdout
    assert verdict(proj, run[0]["run_id"])["result"] == "bit-exact"


def test_a_run_recorded_here_verifies_bit_exact_on_aarch64(host: Project, arm_python: str, tmp_path: Path) -> None:
    proj = copy_project(host, tmp_path / "proj")
    [run] = proj.runs("train")
    r = on_arm(proj, arm_python, "-m", "marin.cli", "verify", run[0]["run_id"], check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU" in r.stdout
    v = verdict(proj, run[0]["run_id"])
    assert v["result"] == "bit-exact" and v["cpu"]["verifier"]["machine"] == "aarch64"


def test_below_the_aarch64_baseline_a_stage_refuses_in_one_line(arm_python: str, data: Project) -> None:
    """No emulated aarch64 CPU lacks Advanced SIMD (qemu cannot turn it off), so the check is run on
    arm64 python with the feature set it is given; the message is the stage's."""
    code = ("from marin import cpu; from marin.config import RuntimeParams; from marin.train import runtime\n"
            "print(cpu.arch(), cpu.missing_for('armv8-a'), cpu.missing_for('armv8-a', frozenset()))\n"
            "runtime.check_cpu(RuntimeParams(2, 1, 'replicated'), have=frozenset())\n")
    r = on_arm(data, arm_python, "-c", code, check=False)
    assert r.stdout.split("\n")[0] == "aarch64 [] ['ASIMD']", r.stdout + r.stderr
    assert r.returncode == 1
    [line] = [x for x in r.stderr.splitlines() if x.startswith("marin.errors.StageError")]
    assert "armv8-a" in line and "lacks ASIMD" in line and "runtime.determinism: native" in line
