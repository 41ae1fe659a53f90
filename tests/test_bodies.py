"""Each record body's TypedDict (marin.ledger.bodies) against its JSON Schema: required keys are
the schema's ``required``, all keys its ``properties``; nested objects the schema closes too."""

from __future__ import annotations

import json
from typing import Any, get_args

import pytest

from marin.ledger import bodies, records
from marin.paths import PACKAGE_ROOT

SCHEMAS = PACKAGE_ROOT.parent / "schemas" / "ledger"
KINDS = json.loads((SCHEMAS / "record.schema.json").read_text())["properties"]["kind"]["enum"]

# (TypedDict, schema file, path inside the schema to the object it types)
NESTED = [
    (bodies.Named, "run.started", ("properties", "inputs", "items")),
    (bodies.Named, "run.finished", ("properties", "outputs", "items")),
    (bodies.Exact, "metric", ("$defs", "exact")),
    (bodies.Exact, "eval", ("$defs", "exact")),
    (bodies.LoaderPosition, "checkpoint", ("properties", "loader")),
    (bodies.Sample, "eval", ("properties", "samples", "items")),
    (bodies.VerifiedRun, "verification", ("properties", "verified")),
    (bodies.CodeState, "run.started", ("properties", "code")),
]
# Objects the schema leaves open (no ``additionalProperties: false``): the TypedDict must have every key
# the schema requires, required, and every key it describes.
OPEN = [
    (bodies.Env, "run.started", ("properties", "env")),
    (bodies.DeterminismClass, "run.started", ("properties", "determinism_class")),
    (bodies.Seeds, "run.started", ("properties", "seeds")),
    (bodies.Env, "run.resumed", ("properties", "env")),
    (bodies.CodeState, "run.resumed", ("properties", "code")),
    (bodies.CpuDifference, "verification", ("properties", "cpu")),
    (bodies.ClassDifference, "verification", ("properties", "class_differences", "items")),
    (bodies.Segments, "verification", ("properties", "segments")),
]


def _schema(kind: str, path: tuple[str, ...] = ()) -> dict[str, Any]:
    node = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    for key in path:
        node = node[key]
    return node


def _keys(td: type) -> tuple[set[str], set[str]]:
    return set(td.__required_keys__), set(td.__required_keys__ | td.__optional_keys__)


def test_every_record_kind_has_a_body_type() -> None:
    assert sorted(bodies.BODIES) == sorted(KINDS)


def test_the_typed_kinds_and_the_ledger_kinds_are_the_schema_kinds() -> None:
    assert sorted(get_args(bodies.Kind)) == sorted(KINDS)  # what RunLog.bodies and Run.record are typed over
    assert sorted(records.KINDS) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_body_keys_match_the_schema(kind: str) -> None:
    schema = _schema(kind)
    required, every = _keys(bodies.BODIES[kind])
    assert required == set(schema["required"])
    assert every == set(schema["properties"])
    assert schema.get("additionalProperties") is False  # so the properties are every key a body may have


@pytest.mark.parametrize(("td", "kind", "path"), NESTED, ids=[f"{k}:{'/'.join(p)}" for _, k, p in NESTED])
def test_nested_keys_match_the_schema(td: type, kind: str, path: tuple[str, ...]) -> None:
    schema = _schema(kind, path)
    required, every = _keys(td)
    assert required == set(schema["required"])
    assert every == set(schema["properties"])


@pytest.mark.parametrize(("td", "kind", "path"), OPEN, ids=[f"{k}:{'/'.join(p)}" for _, k, p in OPEN])
def test_open_nested_keys_cover_the_schema(td: type, kind: str, path: tuple[str, ...]) -> None:
    schema = _schema(kind, path)
    required, every = _keys(td)
    assert "additionalProperties" not in schema  # open: a closed one belongs in NESTED, keys held equal
    assert set(schema.get("required", [])) <= required
    assert set(schema.get("properties", {})) <= every


def test_the_fingerprint_has_the_env_keys() -> None:
    """What marin writes as ``env`` is what the Env TypedDict says it is, key for key."""
    from marin import env

    required, every = _keys(bodies.Env)
    assert set(env.fingerprint()) == every == required


def test_a_determinism_class_kind_is_required_and_nothing_else() -> None:
    required, _ = _keys(bodies.DeterminismClass)
    assert required == {"kind"}


def test_the_verification_body_is_the_outcome_and_valid() -> None:
    """Outcome.body is the one structure a verification record is written from: every key the schema
    allows, when the outcome has every part, and valid."""
    from marin import schemas
    from marin.verify.compare import Divergence
    from marin.verify.outcome import Outcome

    out = Outcome("train-20260101T000000Z-0123abcd", "train", "segments", signer="a" * 64)
    out.divergences = [Divergence(3, "metric", "loss differs", step=1)]
    out.class_diffs = [{"key": "xla_cpu_threads", "recorded": 2, "verifier": 4}]
    out.segments = {"seed": 1, "k": 1, "n": 2, "drawn": [[0, 1]], "detection_probability": 0.5}
    out.cpu = {"recorded": {}, "verifier": {}, "only_recorded": [], "only_verifier": ["avx512f"]}
    out.replay_run_id, out.seconds = "train-20260101T000001Z-0123abcd", {"total_s": 1.0}
    out.verifier = {"env": {}, "code": {}, "determinism_class": {}, "workspace": "git worktree"}
    verified = bodies.VerifiedRun(run_id=out.run_id, recipe_digest="sha256:" + "0" * 64,
                                  finished_digest="sha256:" + "1" * 64)
    body = out.body(verified)
    schemas.validate(body, "ledger/verification", "Outcome.body")
    assert set(body) == _keys(bodies.VerificationBody)[1]
    assert (body["result"], body["exit_code"]) == (out.result, out.exit_code)
    assert body["first_divergence"] == out.divergences[0].to_dict()


@pytest.mark.parametrize(("compared", "diverged", "nothing"), [
    ({}, False, True),
    ({"metric": 0, "output": 0}, False, True),
    ({"metric": 3}, False, False),
    ({}, True, False),  # a divergence is a verdict (mismatch), whatever was counted
])
def test_a_verification_that_compared_nothing_is_no_verdict(compared: dict[str, int], diverged: bool,
                                                            nothing: bool) -> None:
    """Issue 55, item 5: BIT-EXACT over no record is not a verdict; verify refuses it (exit 4, nothing
    recorded) and a report never counts such a record (``compared_nothing``)."""
    from marin.verify.compare import Divergence
    from marin.verify.outcome import Outcome

    out = Outcome("fetch-20260101T000000Z-0123abcd", "fetch")
    out.compared = dict(compared)
    out.divergences = [Divergence(2, "output", "differs", independent=True)] if diverged else []
    assert out.verified_nothing is nothing
    body = bodies.VerificationBody(verified=bodies.VerifiedRun(run_id=out.run_id, recipe_digest="", finished_digest=""),
                                   mode="full", result=out.result, exit_code=out.exit_code, verifier={},
                                   compared=out.compared, first_divergence=None, time={})
    assert bodies.compared_nothing(body) is (not any(compared.values()))
