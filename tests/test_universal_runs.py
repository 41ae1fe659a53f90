"""The universal profile end to end (tests/universal_fixtures.py: a tiny model, 3 steps, a checkpoint and a
metric record each): what the run records, a resume that gives the uninterrupted run's bits, a changed
rounding log entry named by ``marin verify`` (exit 1), and a replay that meets a value its log does not
have (recorded with tau 0) naming it. The replay on another architecture is tests/test_aarch64.py's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from marin.train import rounding_log
from tests.conftest import Project, copy_project
from tests.universal_fixtures import summary, train_run, universal

pytestmark = pytest.mark.slow


def log_path(proj: Project) -> Path:
    [path] = (proj.root / "checkpoints").glob(f"*/{rounding_log.LOG_FILE}")
    return path


def test_a_universal_run_records_its_class_log_and_counts(_universal_project: Project) -> None:
    proj = _universal_project
    run = train_run(proj)
    det = run[0]["body"]["determinism_class"]
    assert det["profile"] == "universal" and det["tau"] == rounding_log.TAU and det["x64"] is True
    assert "machine" not in det  # x86-64 and aarch64 are one class
    found = list(rounding_log.entries(log_path(proj)))
    metrics = [r["body"] for r in run if r["kind"] == "metric"]
    assert [m["rounding"]["entries"] for m in metrics] == [[sum(e[0] == s for e in found)] for s in (1, 2, 3)]
    assert found and all(i >= 0 and d in (0, 1) for _, _, i, d in found)
    model = proj.root / "models" / "final"
    assert (model / rounding_log.LOG_FILE).read_bytes() == log_path(proj).read_bytes()
    config = json.loads((model / "config.json").read_text())
    assert config["model"]["dtype"] == "float32" and config["rounding_log"]["entries"] == len(found)


def test_a_killed_universal_run_resumes_to_the_uninterrupted_bits(_universal_project: Project, tmp_path: Path) -> None:
    """The state a kill leaves after checkpoint 2 was recorded, while step 3 ran: the run file ends at that
    record, checkpoint 3 and the model are absent, and the log holds step 3's entries and half a line."""
    proj = copy_project(_universal_project, tmp_path / "proj")
    whole, log_bytes = train_run(proj), log_path(proj).read_bytes()
    path = next((proj.root / "ledger" / "runs").glob("train-*.jsonl"))
    lines = path.read_bytes().splitlines(keepends=True)
    recs = [json.loads(x) for x in lines]
    cut = next(i for i, r in enumerate(recs) if r["kind"] == "checkpoint" and r["body"]["step"] == 2)
    path.write_bytes(b"".join(lines[: cut + 1]))
    shutil.rmtree(log_path(proj).parent / "3")
    shutil.rmtree(proj.root / "models")
    with open(log_path(proj), "ab") as f:
        f.write(b'{"step": 3, "tensor": ".par')
    proj.stage("train")
    resumed = train_run(proj)
    assert any(r["kind"] == "run.resumed" and r["body"]["from_step"] == 2 for r in resumed)
    assert summary(resumed) == summary(whole)
    assert log_path(proj).read_bytes() == log_bytes


def test_one_flipped_log_entry_is_a_mismatch_naming_step_tensor_and_index(_universal_project: Project,
                                                                         tmp_path: Path) -> None:
    proj = copy_project(_universal_project, tmp_path / "proj")
    path = log_path(proj)
    lines = path.read_text().splitlines()
    n, e = next((n, e) for n, e in enumerate(map(json.loads, lines))  # a value's, not a metric's or the lr's
                if n and not e["tensor"].startswith(("metric.", "scalar.")))
    lines[n] = json.dumps({**e, "direction": 1 - e["direction"]})
    path.write_text("\n".join(lines) + "\n")
    r = proj.marin("verify", train_run(proj)[0]["run_id"])
    assert r.returncode == 1, r.stdout + r.stderr
    [first] = [x for x in r.stdout.splitlines() if "first divergence" in x]
    assert f"rounding_log step {e['step']} tensor {e['tensor']} index {e['index']}:" in first
    assert "was changed" in first


def test_a_replay_names_a_near_midpoint_value_the_log_does_not_have(_data_project: Project, tmp_path: Path) -> None:
    """Recorded with tau 0 (nothing near a midpoint is logged), replayed with the profile's tau."""
    proj = copy_project(_data_project, tmp_path / "proj")
    universal(proj, steps=2)
    proj.env[rounding_log.TAU_VAR] = "0"
    proj.stage("train")
    del proj.env[rounding_log.TAU_VAR]
    run = train_run(proj)
    assert run[0]["body"]["determinism_class"]["tau"] == 0.0
    r = proj.marin("verify", run[0]["run_id"])
    assert r.returncode == 4, r.stdout + r.stderr  # the log cannot serve this replay: not verifiable here
    line = next(x for x in r.stderr.splitlines() if "no direction for it" in x)
    assert line.startswith("marin: error: step ") and " tensor " in line and " index " in line
    assert "float32 ulp (of its scale) from a float32 rounding midpoint, within tau/4" in line


def test_segment_verification_follows_the_log(_universal_project: Project, tmp_path: Path) -> None:
    """marin verify --segments replays intervals in one process, from their checkpoints, with the log."""
    proj = copy_project(_universal_project, tmp_path / "proj")
    r = proj.marin("verify", train_run(proj)[0]["run_id"], "--segments", "1", "--seed", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT" in r.stdout
