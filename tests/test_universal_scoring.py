"""The universal profile in the stages that score the model (marin.evaluate.universal_scoring): float64
outputs rounded to float32 with the stage's rounding log, an argmax whose near tie is a logged rounding, a
replay that rounds as its log says; then the evaluate stage end to end (tests/universal_fixtures.py's
``_universal_evaluated``): its class and log, ``marin verify`` BIT-EXACT, and a flipped log entry named (exit 1).
The same evaluate across architectures is tests/test_aarch64.py's. Distances as in tests/test_universal.py."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from marin import hashing
from marin.evaluate.universal_scoring import Rounder
from marin.train import rounding, rounding_log
from marin.train.universal import RoundingLog
from tests.conftest import Project, copy_project

TAU = 2.0**-16
ULP1 = 2.0**-23
MID = 1.0 + ULP1 / 2  # between 1 and 1 + ulp (the next float32): nearest even is 1
NEAR = 2.0**-45  # 2^-22 float32 ulp of the row's scale: within TAU


def logits(shift: float) -> np.ndarray:
    """One machine's float64 logits: token 0 near the midpoint below token 1's value (1 + ulp, a float32),
    so whether token 0 ties token 1 (and wins, the lowest id) is the rounding of token 0."""
    return np.array([[MID + shift, 1.0 + ULP1, 0.25, -3.0]])


def argmax_of(rounder: Rounder, x: np.ndarray) -> tuple[int, np.ndarray]:
    with jax.enable_x64(True):  # this test's arrays only: the process stays float32 for the other tests
        out = np.asarray(rounder.jit("logits", lambda a: a * 1.0)(x))
    return int(out.argmax(-1)[0]), out


def recorded(tmp_path: Path, shift: float) -> tuple[Path, int]:
    log = RoundingLog(TAU)
    log.open(tmp_path / "evaluate.jsonl", 0)
    best, _ = argmax_of(Rounder(log), logits(shift))
    log.close()
    return tmp_path / "evaluate.jsonl", best


@pytest.mark.parametrize(("shift", "direction", "best"), [(+NEAR, 1, 0), (-NEAR, 0, 1)])
def test_a_near_tie_of_logits_is_a_logged_rounding_and_a_replay_takes_the_recorders_argmax(
        tmp_path: Path, shift: float, direction: int, best: int) -> None:
    path, got = recorded(tmp_path, shift)
    assert got == best
    assert list(rounding_log.entries(path)) == [(1, "logits", 0, direction)]
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    theirs, out = argmax_of(Rounder(replay), logits(-shift))  # the other machine: across the midpoint
    replay.close()
    assert theirs == best and out[0, 0] == rounding.round_f32(logits(shift))[0, 0]
    assert replay.against == [(1, "logits", 0, direction)]  # against its own nearest even: named, not an error


def test_a_flipped_entry_changes_the_argmax_and_the_replay_names_it(tmp_path: Path) -> None:
    path, best = recorded(tmp_path, +NEAR)
    path.write_bytes(rounding_log.header() + rounding_log.entry(1, "logits", 0, 0))
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    theirs, _ = argmax_of(Rounder(replay), logits(+NEAR))  # the same machine: the same float64
    replay.close()
    assert (best, theirs) == (0, 1) and replay.against == [(1, "logits", 0, 0)]


@pytest.mark.parametrize(("raw", "rounded"), [
    ({"perplexity": 1.1, "tokens": 7}, {"perplexity": float(np.float32(1.1)), "tokens": 7}),  # a count as it is
    ({"acc": 0.5, "alias": "marin_cloze"}, {"acc": 0.5, "alias": "marin_cloze"}),  # a float32 already
    ({"nll": MID + NEAR}, {"nll": 1.0 + ULP1}),  # near its midpoint: logged, rounded up as nearest even says
])
def test_metrics_are_rounded_to_float32_each_a_tensor_of_its_own(raw: dict, rounded: dict) -> None:
    log = RoundingLog(TAU)
    log.open(None, 0)
    r = Rounder(log)
    assert r.values("model.all", raw) == rounded and r.step == 1
    assert log.total() == (1 if raw.get("nll") == MID + NEAR else 0)


def test_a_host_table_is_rounded_with_the_log_in_its_shape(tmp_path: Path) -> None:
    log = RoundingLog(TAU)
    log.open(tmp_path / "log.jsonl", 0)
    table = Rounder(log).table("unigram.logp", np.array([[MID + NEAR, 0.1]]))
    log.close()
    assert table.shape == (1, 2) and table.dtype == np.float64
    assert list(table[0]) == [1.0 + ULP1, float(np.float32(0.1))]
    assert list(rounding_log.entries(tmp_path / "log.jsonl")) == [(1, "unigram.logp", 0, 1)]


def evaluate_run(proj: Project) -> list[dict]:
    [run] = proj.runs("evaluate")
    return run


def log_of(proj: Project) -> Path:
    return proj.root / rounding_log.SCORING_DIR / "evaluate.jsonl"


def test_a_universal_evaluate_computes_in_float64_and_records_its_rounding_log(_universal_evaluated: Project) -> None:
    proj = _universal_evaluated
    run = evaluate_run(proj)
    det = run[0]["body"]["determinism_class"]
    assert det["profile"] == "universal" and det["tau"] == rounding_log.TAU and det["x64"] is True
    [out] = [r["body"] for r in run if r["kind"] == "output" and r["body"]["name"] == rounding_log.OUTPUT]
    assert out["path"] == "evals/rounding/evaluate.jsonl" and out["digest"] == hashing.file_digest(log_of(proj))
    found = list(rounding_log.entries(log_of(proj)))
    assert found and {t.split(".")[0].split("[")[0] for _, t, _, _ in found} <= {"logits", "nll", "loglik", "metric",
                                                                               "unigram", "next"}
    evals = {r["body"]["name"]: r["body"]["values"] for r in run if r["kind"] == "eval"}
    for name in ("model", "unigram_baseline", "harness:marin_cloze"):  # every recorded float is a float32
        floats = [v["value"] for v in evals[name].values() if isinstance(v, dict) and isinstance(v["value"], float)]
        assert floats and all(float(np.float32(x)) == x for x in floats), name


def test_a_universal_evaluate_verifies_bit_exact(_universal_evaluated: Project, tmp_path: Path) -> None:
    proj = copy_project(_universal_evaluated, tmp_path / "proj")
    r = proj.marin("verify", evaluate_run(proj)[0]["run_id"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "BIT-EXACT" in r.stdout


def test_a_flipped_evaluate_log_entry_is_a_mismatch_naming_step_tensor_and_index(_universal_evaluated: Project,
                                                                                  tmp_path: Path) -> None:
    proj = copy_project(_universal_evaluated, tmp_path / "proj")
    path = log_of(proj)
    lines = path.read_text().splitlines()
    n, e = next((n, e) for n, e in enumerate(map(json.loads, lines)) if n)
    lines[n] = json.dumps({**e, "direction": 1 - e["direction"]})
    path.write_text("\n".join(lines) + "\n")
    r = proj.marin("verify", evaluate_run(proj)[0]["run_id"])
    assert r.returncode == 1, r.stdout + r.stderr
    [first] = [x for x in r.stdout.splitlines() if "first divergence" in x]
    assert f"rounding_log step {e['step']} tensor {e['tensor']} index {e['index']}:" in first
    assert "was changed" in first


def test_a_universal_sft_and_evaluate_instruct_verify_bit_exact(_universal_sft: Project, tmp_path: Path) -> None:
    """The fine-tune's 3 universal steps, and both models answering under universal, each replayed here."""
    proj = copy_project(_universal_sft, tmp_path / "proj")
    [sft] = proj.runs("sft")
    [ev] = proj.runs("evaluate_instruct")
    assert {run[0]["body"]["determinism_class"]["profile"] for run in (sft, ev)} == {"universal"}
    assert any(r["kind"] == "output" and r["body"]["name"] == rounding_log.OUTPUT for r in ev)
    for run in (sft, ev):
        r = proj.marin("verify", run[0]["run_id"])
        assert r.returncode == 0, r.stdout + r.stderr
        assert "BIT-EXACT" in r.stdout
