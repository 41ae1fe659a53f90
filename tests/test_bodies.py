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
