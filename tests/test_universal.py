"""The universal profile's rounding log (marin.train.universal.RoundingLog) on host arrays: recording the
near-midpoint values' directions, a replay that follows them across a float64 difference and stops, naming
step, tensor, index and distance, at what the log does not account for; a resumed run's log cut back to its
checkpoint; the metric record's summary. No model runs here (the stage's own tests do that)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from marin.train import rounding, rounding_log
from marin.train.rounding_log import RoundingError
from marin.train.universal import RoundingLog

TAU = 2.0**-16
ULP1 = 2.0**-23
MID = 1.0 + ULP1 / 2  # between 1 and 1 + ulp: nearest even is 1 (down)
NEAR = 2.0**-45  # 2^-22 float32 ulp: within TAU


def state(shift: float) -> np.ndarray:
    """One machine's float64 results: a value near a midpoint (moved by ``shift``), the rest far from any."""
    return np.array([0.25, MID + shift, -3.0, 1.0 + 3 * ULP1 / 2 + 2.0**-30])


def recorded(tmp_path: Path, x: np.ndarray) -> Path:
    log = RoundingLog(TAU)
    log.open(tmp_path / "rounding.jsonl", 0)
    out = log.round(1, ".params['w']", x)
    log.end_step(1, durable=True)
    log.close()
    assert out is not None and list(out) == list(rounding.round_f32(x))  # recording is nearest even
    return tmp_path / "rounding.jsonl"


def test_recording_logs_the_near_values_direction_and_its_digest_is_the_files(tmp_path: Path) -> None:
    path = recorded(tmp_path, state(+NEAR))  # just above the midpoint: rounded up
    assert list(rounding_log.entries(path)) == [(1, ".params['w']", 1, 1)]
    log = RoundingLog(TAU)
    log.open(None, 0)
    log.round(1, ".params['w']", state(+NEAR), near=1)
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert log.summary(1, 1) == {"entries": [1], "from_step": 1, "log_digest": digest}


def test_a_replay_on_the_other_side_of_the_midpoint_rounds_as_logged(tmp_path: Path) -> None:
    path = recorded(tmp_path, state(+NEAR))
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    theirs = state(-NEAR)  # the other machine's float64: below the midpoint, nearest even would go down
    got = replay.round(1, ".params['w']", theirs, near=1)
    assert got is not None and got[1] == np.float32(1.0 + ULP1) != rounding.round_f32(theirs)[1]
    assert np.array_equal(got, rounding.round_f32(state(+NEAR)))  # the recorder's bits
    replay.end_step(1, durable=False)
    replay.close()


@pytest.mark.parametrize(("shift", "words"), [
    (+NEAR, "no direction for it"),  # replayed near a midpoint the log does not have (recorded with tau 0)
], ids=["unlogged"])
def test_an_unlogged_near_value_stops_the_replay_naming_it(tmp_path: Path, shift: float, words: str) -> None:
    log = RoundingLog(0.0)  # tau 0 at record time: nothing near is logged
    log.open(tmp_path / "rounding.jsonl", 0)
    log.round(1, ".params['w']", state(shift))
    log.close()
    replay = RoundingLog(TAU, rounding_log.read(tmp_path / "rounding.jsonl"))
    replay.open(None, 0)
    with pytest.raises(RoundingError) as e:
        replay.round(1, ".params['w']", state(shift), near=1)
    msg = str(e.value)
    assert msg.startswith("step 1 tensor .params['w'] index 1: the value lies +2.38e-07 float32 ulp") and words in msg


def test_a_logged_position_beyond_tau_stops_the_replay_naming_it(tmp_path: Path) -> None:
    path = recorded(tmp_path, state(+NEAR))
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    far = state(+NEAR)
    far[1] = 1.0 + ULP1 / 4  # a quarter ulp from the midpoint: the log's direction is not this value's to take
    with pytest.raises(RoundingError, match=r"^step 1 tensor .params\['w'\] index 1: the recorded rounding log gives "
                                            r"direction 1, but the value lies -0.25 float32 ulp .* beyond tau"):
        replay.round(1, ".params['w']", far, near=0)


def test_an_entry_for_a_tensor_the_replay_never_rounds_is_named(tmp_path: Path) -> None:
    path = recorded(tmp_path, state(+NEAR))
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    replay.round(1, ".params['other']", state(0.5), near=0)
    with pytest.raises(RoundingError, match=r"^step 1 tensor .params\['w'\] index 1: .* a value this run does not"):
        replay.end_step(2, durable=False)


def test_a_resumed_run_keeps_the_log_through_its_checkpoint_and_writes_the_same_bytes(tmp_path: Path) -> None:
    path = tmp_path / "rounding.jsonl"
    whole = RoundingLog(TAU)
    whole.open(path, 0)
    for step in (1, 2, 3):
        whole.round(step, ".params['w']", state(+NEAR * step))
        whole.values(step, {"loss": MID - NEAR})
        whole.end_step(step, durable=True)
    whole.close()
    uninterrupted, digest = path.read_bytes(), whole.summary(3, 3)["log_digest"]
    with open(path, "ab") as f:
        f.write(b'{"step": 4, "tensor": ".params')  # a kill in the middle of a line, after step 3
    resumed = RoundingLog(TAU)
    resumed.open(path, 2)  # resumed from the checkpoint at step 2
    assert path.read_bytes() == uninterrupted[:uninterrupted.index(b'{"step": 3')]
    assert resumed.summary(1, 2)["entries"] == [2, 2]
    resumed.round(3, ".params['w']", state(+NEAR * 3))
    resumed.values(3, {"loss": MID - NEAR})
    resumed.end_step(3, durable=True)
    resumed.close()
    assert path.read_bytes() == uninterrupted and resumed.summary(3, 3)["log_digest"] == digest


def test_metric_values_are_rounded_with_the_log() -> None:
    log = RoundingLog(TAU)
    log.open(None, 0)
    out = log.values(5, {"loss": MID + NEAR, "lr": 0.1})
    assert out == {"loss": float(np.float32(1.0 + ULP1)), "lr": float(np.float32(0.1))}
    assert log.counts == {5: 1}


@pytest.mark.parametrize("raw", ["0.5", "-1", "x"])
def test_a_threshold_outside_zero_to_one_half_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(rounding_log.TAU_VAR, raw)
    with pytest.raises(RoundingError, match=rounding_log.TAU_VAR):
        rounding_log.tau()
