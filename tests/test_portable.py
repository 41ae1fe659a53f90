"""Portable bits: under ``runtime.determinism: portable`` a run gives the same bits on every CPU
at the x86-64-v3 level. Other CPUs are emulated with ``qemu-x86_64 -cpu MODEL`` (Debian's
qemu-user): it runs this machine's Python and libraries while ``cpuid`` reports the emulated
CPU, so every library that dispatches kernels by CPU takes the emulated CPU's path.

qemu is ~10x slower (a tiny train under it: 7 s importing JAX, 70 s compiling, 15 s a step), so the
model is tiny (d_model 64, 1 layer, batch 4, 2 steps), evaluate reads few items, and each emulated stage
runs once, without the shared JAX compilation cache (a cached executable compiled here would hide what
another CPU compiles).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from marin import config
from tests.conftest import BIN, TINY, Project, copy_project

pytestmark = pytest.mark.slow

QEMU = shutil.which("qemu-x86_64")
# Two emulated CPUs, Intel and AMD, whose cpuid vendors, models, cache descriptors and features differ
# from this machine's and from each other's. qemu's TCG (7.2, Debian 12) cannot execute AVX-512: it masks
# those features off, so the AVX-512 side of every comparison is this machine itself when it has them.
# (Skylake-Client and Skylake-Server crash qemu itself, SIGSEGV, in the train stage. Broadwell was a third
# until 2026-12-04: under qemu 7.2 its cpuid leaf 4 caches (32K/32K/4M/16M) and the features marin.cpu
# reads are Haswell's, checked that day; its extra ADX/RDSEED/PREFETCHW/SMAP are not x86-64-v3 features.
# It cost 145 s of every suite run.)
CPUS = ("Haswell", "EPYC")
PORTABLE_TINY = {
    "model": {**TINY["model"], "d_model": 64, "d_ff": 128, "n_layers": 1},  # one block: XLA compiles the
    # unrolled layers, so a second one doubled the compile (most of an emulated run); a block's ops are the same
    "train": {**TINY["train"], "steps": 2, "batch_size": 4, "warmup_steps": 1, "log_every": 1,
              "checkpoint_every": 1},
}


def qemu(proj: Project, cpu: str, *argv: str, check: bool = True) -> Any:
    if QEMU is None:  # scripts/system-packages.sh installs it; a missing emulator is a failure, not a skip
        pytest.fail("qemu-x86_64 is not installed: run scripts/system-packages.sh (Debian package qemu-user)")
    return proj.run(QEMU, "-cpu", cpu, str(BIN / "python"), *argv, check=check, timeout=1800)


def fresh(proj: Project) -> Project:
    proj.env["JAX_ENABLE_COMPILATION_CACHE"] = "false"  # each CPU compiles its own code
    return proj


def set_profile(proj: Project, profile: str, **train: object) -> None:
    params = proj.params
    params.update(json.loads(json.dumps(PORTABLE_TINY)))
    params["train"].update(train)
    params["runtime"]["determinism"] = profile
    # evaluate's every code path, on fewer items: one prompt, 8 greedy tokens, 16 items of each harness task
    params["evaluate"].update(prompts=config.load(proj.root / "params.yaml").evaluate.prompts[:1], sample_tokens=8)
    params["evaluate"]["harness"]["limit"] = 16
    proj.write_params(params)
    proj.git("commit", "-qam", f"tiny model, {profile} profile")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Project:
    """Data stages run natively (the session's, tests/conftest.py); the project committed with the
    portable tiny model."""
    proj = fresh(copy_project(_data_project, tmp_path_factory.mktemp("portable") / "proj"))
    set_profile(proj, "portable")
    return proj


def train_bits(proj: Project) -> dict[str, Any]:
    """What the train run recorded: checkpoint digests and every metric value's hex."""
    [run] = proj.runs("train")
    ckpts = {r["body"]["step"]: r["body"]["digest"] for r in run if r["kind"] == "checkpoint"}
    metrics = {r["body"]["step"]: {k: v["hex"] for k, v in r["body"]["values"].items() if isinstance(v, dict)}
               for r in run if r["kind"] == "metric"}
    outputs = {r["body"]["name"]: r["body"]["digest"] for r in run if r["kind"] == "output"}
    return {"checkpoints": ckpts, "metrics": metrics, "outputs": outputs, "class": run[0]["body"]["determinism_class"],
            "env": run[0]["body"]["env"]}


@pytest.fixture(scope="module")
def trained_here(tokens: Project, tmp_path_factory: pytest.TempPathFactory) -> Project:
    proj = fresh(copy_project(tokens, tmp_path_factory.mktemp("native") / "proj"))
    proj.stage("train")
    return proj


@pytest.fixture(scope="module")
def native_train(trained_here: Project) -> dict[str, Any]:
    return train_bits(trained_here)


@pytest.mark.parametrize("cpu", CPUS)
def test_portable_train_gives_the_same_bits_on_every_emulated_cpu(tokens: Project, native_train: dict[str, Any],
                                                                  cpu: str, tmp_path: Path) -> None:
    proj = fresh(copy_project(tokens, tmp_path / "proj"))
    qemu(proj, cpu, "-m", "pipeline.train")
    got = train_bits(proj)
    assert cpu.split("-")[0].lower() in got["env"]["cpu_model"].lower()  # cpuid saw the emulated CPU
    assert len(got["checkpoints"]) == len(got["metrics"]) == PORTABLE_TINY["train"]["steps"]
    assert got["checkpoints"] == native_train["checkpoints"]
    assert got["metrics"] == native_train["metrics"]
    assert got["outputs"] == native_train["outputs"]
    assert got["class"] == native_train["class"]  # the class is the profile, not the CPU
    assert got["class"]["profile"] == "portable" and got["class"]["isa_level"] == "x86-64-v3"
    if cpu == "Haswell":  # the run recorded on Haswell verifies here, on another CPU, bit-exact
        [run] = proj.runs("train")
        r = proj.marin("verify", run[0]["run_id"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "BIT-EXACT on a different CPU" in r.stdout and "Haswell" in r.stdout
        v = [x for x in proj.runs("train")[0] if x["kind"] == "verification"][-1]["body"]
        assert v["result"] == "bit-exact" and "avx512f" in v["cpu"]["only_verifier"]


def test_a_native_run_from_another_cpu_is_class_differs_never_mismatch(tokens: Project, tmp_path: Path) -> None:
    proj = fresh(copy_project(tokens, tmp_path / "proj"))
    # the verdict is the claim, not each step's bits: one checkpoint and one validation pass (11 s less emulated)
    set_profile(proj, "native", log_every=2, checkpoint_every=2)
    qemu(proj, "Haswell", "-m", "pipeline.train")
    [run] = proj.runs("train")
    assert run[0]["body"]["determinism_class"]["profile"] == "native"
    assert "avx512f" not in run[0]["body"]["determinism_class"]["isa_flags"]
    r = proj.marin("verify", run[0]["run_id"])
    assert r.returncode == 3, r.stdout + r.stderr
    assert "NOT BIT-EXACT" in r.stdout and "isa_flags" in r.stdout
    v = [x for x in proj.runs("train")[0] if x["kind"] == "verification"][-1]["body"]
    assert v["result"] == "class-differs" and v["exit_code"] == 3
    assert [d["key"] for d in v["class_differences"]] == ["isa_flags"]


def test_data_stages_and_evaluate_give_the_same_outputs_on_haswell(trained_here: Project, tmp_path: Path) -> None:
    native = fresh(copy_project(trained_here, tmp_path / "native"))
    native.stage("evaluate")
    emulated = fresh(copy_project(native, tmp_path / "emulated"))
    for stage in ("fetch", "curate", "tokenize", "evaluate"):
        qemu(emulated, "Haswell", "-m", f"pipeline.{stage}")
    for stage in ("fetch", "curate", "tokenize", "evaluate"):
        mine, theirs = native.runs(stage)[-1], emulated.runs(stage)[-1]
        assert "Haswell" in theirs[0]["body"]["env"]["cpu_model"]
        outs = {r["body"]["name"]: r["body"]["digest"] for r in mine if r["kind"] == "output"}
        assert outs and outs == {r["body"]["name"]: r["body"]["digest"] for r in theirs if r["kind"] == "output"}
        evals = [r["body"] for r in mine if r["kind"] == "eval"]
        assert evals == [r["body"] for r in theirs if r["kind"] == "eval"], stage
    assert (native.root / "metrics/eval.json").read_bytes() == (emulated.root / "metrics/eval.json").read_bytes()


def test_below_the_level_the_stage_refuses_and_verify_cannot(trained_here: Project, tmp_path: Path) -> None:
    """Sandy Bridge has AVX but not AVX2 or FMA: below x86-64-v3, a portable run is neither made
    nor checked there (its bits would not be the profile's)."""
    proj = fresh(copy_project(trained_here, tmp_path / "proj"))
    before = proj.ledger_files()
    r = qemu(proj, "SandyBridge", "-m", "pipeline.train", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    [line] = [x for x in r.stderr.splitlines() if x.startswith("marin: error:")]
    assert "runtime.determinism: portable" in line and "x86-64-v3" in line and "AVX2" in line and "FMA3" in line
    assert proj.ledger_files() == before  # refused before any run started
    [run] = proj.runs("train")
    r = qemu(proj, "SandyBridge", "-m", "marin.cli", "verify", run[0]["run_id"], check=False)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "lacks AVX2" in r.stderr and "x86-64-v3" in r.stderr and "SandyBridge" in r.stderr.replace(" ", "")


def test_one_step_at_the_shipped_dimensions_gives_this_machines_gradient_on_haswell() -> None:
    """The shipped model's dimensions (params.yaml) with the batch cut to 2 rows: kernel libraries choose
    blocking by shape, so the tiny model above is no witness for them (1 min 49 s under emulation, quiet)."""
    import subprocess

    from tests.conftest import REPO, env_for_subprocess

    if QEMU is None:
        pytest.fail("qemu-x86_64 is not installed: run scripts/system-packages.sh (Debian package qemu-user)")
    env = {**env_for_subprocess(), "JAX_ENABLE_COMPILATION_CACHE": "false", "PYTHONPATH": str(REPO)}
    argv = [str(BIN / "python"), "benchmarks/shipped_step.py", "2"]
    lines = []
    for prefix in ([], [QEMU, "-cpu", "Haswell"]):
        p = subprocess.run([*prefix, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        assert p.returncode == 0, p.stderr
        lines.append(p.stdout.strip().splitlines()[-1].split(" (start")[0])
    assert "rows 2: loss 0x" in lines[0] and "gradients sha256:" in lines[0]
    assert lines[1] == lines[0]  # the loss and every gradient, hashed in tree order
