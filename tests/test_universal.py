"""The universal profile's rounding log (marin.train.universal.RoundingLog) on host arrays: recording the
near-midpoint values' directions, a replay that follows them across a float64 difference and stops, naming
step, tensor, index and distance, at what the log does not account for; a resumed run's log cut back to its
checkpoint; the metric record's summary; the AdamW step's exact parts. No model runs here (the stage's own
tests do that). Distances are in float32 ulps of the tensor's largest value (3.0 here: 2^-22, twice the
ulp at 1)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

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


def test_an_unlogged_near_value_stops_the_replay_naming_it(tmp_path: Path) -> None:
    log = RoundingLog(0.0)  # tau 0 at record time: nothing near is logged
    log.open(tmp_path / "rounding.jsonl", 0)
    log.round(1, ".params['w']", state(+NEAR))
    log.close()
    replay = RoundingLog(TAU, rounding_log.read(tmp_path / "rounding.jsonl"))
    replay.open(None, 0)
    with pytest.raises(RoundingError) as e:
        replay.round(1, ".params['w']", state(+NEAR), near=1)
    msg = str(e.value)
    assert msg.startswith("step 1 tensor .params['w'] index 1: the value lies +1.19e-07 float32 ulp (of its scale)")
    assert "no direction for it" in msg


def test_a_logged_position_beyond_tau_stops_the_replay_naming_it(tmp_path: Path) -> None:
    path = recorded(tmp_path, state(+NEAR))
    replay = RoundingLog(TAU, rounding_log.read(path))
    replay.open(None, 0)
    far = state(+NEAR)
    far[1] = 1.0 + ULP1 / 4  # a quarter ulp from the midpoint: the log's direction is not this value's to take
    with pytest.raises(RoundingError, match=r"^step 1 tensor .params\['w'\] index 1: the recorded rounding log gives "
                                            r"direction 1, but the value lies -0.125 float32 ulp .* beyond 4 tau"):
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


def test_the_scaled_distance_is_in_ulps_of_the_largest_value_and_zeros_are_never_near() -> None:
    x = np.array([MID + NEAR, 2.0**-30 * (1 + 2.0**-24), 0.0, -4.0])  # scale: 4.0, ulp 2^-21
    d = rounding.scaled_distance(x)
    assert d[0] == 2.0**-22 / 4 and d[1] == 0.0 and d[3] == -0.5  # a tiny value's own tie is 0 in any unit
    assert list(rounding.near_scaled(x, 2.0**-20)) == [True, True, False, False]
    per_element = rounding.scaled_distance(x, np.abs(x))  # each value its own scale: the own-ulp distance
    assert list(per_element[[0, 1, 3]]) == list(rounding.midpoint_distance(x)[[0, 1, 3]])


def _adam(tree: object) -> Any:
    import jax
    import optax

    [adam] = [s for s in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
              if isinstance(s, optax.ScaleByAdamState)]
    return adam


def test_adamw64_is_optax_adamw_with_exact_first_moments_and_powers() -> None:
    import jax
    import jax.numpy as jnp
    import optax

    from marin.config import TrainParams
    from marin.train import adamw64, step

    tp = TrainParams(steps=10, batch_size=1, lr=1e-2, schedule="cosine", warmup_steps=0, min_lr_ratio=0.1,
                     wsd_decay_fraction=0.2, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0,
                     log_every=1, checkpoint_every=1)
    rng = np.random.default_rng(3)
    update = jax.jit(adamw64.update, static_argnums=5)
    with jax.enable_x64(True):
        params = {"w": jnp.asarray(rng.standard_normal((4, 8)), jnp.float32), "s": jnp.ones((8,), jnp.float32)}
        opt = step.make_optimizer(tp)
        state = opt.init(params)
        for _ in range(3):  # several steps, each from float32 state as a universal run keeps it
            g = jax.tree.map(lambda p: jnp.asarray(rng.standard_normal(p.shape) * 0.1, jnp.float32), params)
            p64, s64 = jax.tree.map(lambda a: a.astype(jnp.float64) if a.dtype == jnp.float32 else a, (params, state))
            lr = jnp.float64(np.float32(np.asarray(step.lr_schedule(tp)(int(_adam(state).count)))))
            res = update(s64, g, p64, jnp.float64(1.0), lr, tp)
            updates, _ = opt.update(jax.tree.map(lambda a: a.astype(jnp.float64), g), s64, p64)
            want: Any = optax.apply_updates(p64, updates)
            for k in params:  # the same method: optax's own float64 step agrees to float32 precision
                np.testing.assert_allclose(np.asarray(res.params[k]), np.asarray(want[k]), rtol=1e-6, atol=1e-9)
            b1, new, old = float(np.float32(0.9)), _adam(res.opt_state), _adam(s64)
            for k in params:  # two exact products, one rounding: numpy's unfused arithmetic gives the same bits
                exact = b1 * np.asarray(old.mu[k]) + (1.0 - b1) * np.asarray(g[k], np.float64)
                assert np.array_equal(np.asarray(new.mu[k]), exact)
            assert int(new.count) == int(old.count) + 1
            params = jax.tree.map(lambda a: jnp.asarray(rounding.round_f32(np.asarray(a))), res.params)
            state = jax.tree.map(lambda a: jnp.asarray(rounding.round_f32(np.asarray(a)))
                                 if a.dtype == jnp.float64 else a, res.opt_state)
        acc, sq, t = 1.0, 0.95, 37
        for k in range(31):  # the same products in the same order
            if (t >> k) & 1:
                acc *= sq
            sq *= sq
        assert float(jax.jit(adamw64.power, static_argnums=0)(0.95, jnp.int32(t))) == acc
