"""The first divergence `marin diff` names: the earliest step, metrics or checkpoint."""

from __future__ import annotations

from marin.commands.diff import first_divergence

CA = {4: "sha256:a4", 8: "sha256:a8"}


def test_metrics_that_differ_before_the_first_differing_checkpoint_are_named() -> None:
    cb = {4: "sha256:b4", 8: "sha256:b8"}
    got = first_divergence([(2, "loss"), (2, "lr"), (4, "loss")], CA, cb)
    assert got == "metrics at step 2: loss, lr"


def test_a_checkpoint_that_differs_before_any_metric_is_named() -> None:
    cb = {4: "sha256:b4", 8: "sha256:a8"}
    assert first_divergence([(6, "loss")], CA, cb) == "checkpoint at step 4: sha256:a4 vs sha256:b4"
    assert first_divergence([], CA, cb) == "checkpoint at step 4: sha256:a4 vs sha256:b4"


def test_at_the_same_step_the_metrics_measured_during_it_come_first() -> None:
    cb = {4: "sha256:b4", 8: "sha256:a8"}
    assert first_divergence([(4, "grad_norm")], CA, cb) == "metrics at step 4: grad_norm"


def test_identical_runs_have_no_divergence() -> None:
    assert first_divergence([], CA, dict(CA)) is None
