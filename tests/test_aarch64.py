"""aarch64 under ``qemu-aarch64`` with a real arm64 python: Debian's python3.11 for arm64 and PyPI's
aarch64 wheels at this environment's versions (``scripts/arm64-env.sh``: built once into a cache, ~100 s,
then reused). The portable profile is not defined there (its last-axis sums and fused elementwise code
give other bits: docs/architecture.md, "Portable bits"), so a portable stage refuses in one line before
any run starts, and a portable run recorded here cannot be verified there (exit 4, naming what is
missing): each such emulated command only starts and refuses, ~20-45 s. The universal profile is defined
there: a universal run recorded on x86-64 verifies BIT-EXACT under qemu-aarch64 and one recorded under
qemu-aarch64 verifies BIT-EXACT here (tests/universal_fixtures.py's 3-step tiny run; each emulated
train or replay is minutes: docs/determinism.md has the times). So does its universal 3-step sft recorded
here, and its universal evaluate both ways (one prompt, one harness task on 4 items). Not emulated, to keep
the file's minutes down: an sft recorded there (its step is train's, whose reverse is tested) and
evaluate_instruct (evaluate's rounded functions, on two models).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, Project, copy_project
from tests.universal_fixtures import train_run, universal

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def arm_python() -> str:
    if shutil.which("qemu-aarch64") is None:  # a missing emulator is a failure, not a skip
        pytest.fail("qemu-aarch64 is not installed: run scripts/system-packages.sh (Debian package qemu-user)")
    p = subprocess.run(["bash", str(REPO / "scripts/arm64-env.sh"), sys.executable], capture_output=True, text=True,
                       timeout=1800)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().splitlines()[-1]


def test_the_arm64_environment_is_aarch64_code_with_this_environments_jaxlib(arm_python: str) -> None:
    import jax

    code = "import platform; from importlib.metadata import version; print(platform.machine(), version('jaxlib'))"
    p = subprocess.run([arm_python, "-c", code],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["aarch64", jax.__version__]  # jax and jaxlib share their version


def test_on_aarch64_a_portable_stage_refuses_and_verify_exits_4(arm_python: str, _trained_project: Project,
                                                                tmp_path: Path) -> None:
    proj = copy_project(_trained_project, tmp_path / "proj")
    [run] = proj.runs("train")
    assert run[0]["body"]["determinism_class"]["profile"] == "portable"
    before = proj.ledger_files()
    r = proj.run(arm_python, "-m", "pipeline.train", timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("marin: error:")]
    assert "runtime.determinism: portable" in line and "aarch64" in line and "runtime.determinism: native" in line
    assert proj.ledger_files() == before  # refused before any run started
    r = proj.run(arm_python, "-m", "marin.cli", "verify", run[0]["run_id"], timeout=900)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "x86-64-v3" in r.stderr and "lacks the x86-64 architecture itself (this CPU is aarch64)" in r.stderr
    assert proj.ledger_files() == before  # nothing appended: the replay never started


def test_a_universal_run_recorded_here_verifies_bit_exact_on_aarch64(arm_python: str, _universal_project: Project,
                                                                     tmp_path: Path) -> None:
    proj = copy_project(_universal_project, tmp_path / "proj")
    run_id = train_run(proj)[0]["run_id"]
    r = proj.run(arm_python, "-m", "marin.cli", "verify", run_id, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU (exit 0" in r.stdout and "verified on aarch64" in r.stdout


def test_a_universal_run_recorded_on_aarch64_verifies_bit_exact_here(arm_python: str, _data_project: Project,
                                                                     tmp_path: Path) -> None:
    proj = copy_project(_data_project, tmp_path / "proj")
    universal(proj)
    proj.run(arm_python, "-m", "pipeline.train", check=True, timeout=1800)
    [run] = proj.runs("train")
    started = run[0]["body"]
    assert started["env"]["machine"] == "aarch64" and started["determinism_class"]["profile"] == "universal"
    r = proj.marin("verify", run[0]["run_id"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU (exit 0" in r.stdout and "recorded on aarch64" in r.stdout


def test_a_universal_sft_recorded_here_verifies_bit_exact_on_aarch64(arm_python: str, _universal_sft: Project,
                                                                     tmp_path: Path) -> None:
    """The session's universal run fine-tuned 3 steps under universal (tests/universal_fixtures.py)."""
    proj = copy_project(_universal_sft, tmp_path / "proj")
    [run] = proj.runs("sft")
    r = proj.run(arm_python, "-m", "marin.cli", "verify", run[0]["run_id"], timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU (exit 0" in r.stdout and "verified on aarch64" in r.stdout


def test_a_universal_evaluate_recorded_here_verifies_bit_exact_on_aarch64(arm_python: str,
                                                                          _universal_evaluated: Project,
                                                                          tmp_path: Path) -> None:
    """Its log-likelihoods, greedy tokens and harness scores from float64 rounded with the stage's log."""
    proj = copy_project(_universal_evaluated, tmp_path / "proj")
    [run] = proj.runs("evaluate")
    r = proj.run(arm_python, "-m", "marin.cli", "verify", run[0]["run_id"], timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU (exit 0" in r.stdout and "verified on aarch64" in r.stdout


def test_a_universal_evaluate_recorded_on_aarch64_verifies_bit_exact_here(arm_python: str,
                                                                          _universal_evaluated: Project,
                                                                          tmp_path: Path) -> None:
    proj = copy_project(_universal_evaluated, tmp_path / "proj")
    proj.run(arm_python, "-m", "pipeline.evaluate", check=True, timeout=1800)
    run = proj.runs("evaluate")[-1]
    assert run[0]["body"]["env"]["machine"] == "aarch64"
    r = proj.marin("verify", run[0]["run_id"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT on a different CPU (exit 0" in r.stdout and "recorded on aarch64" in r.stdout
