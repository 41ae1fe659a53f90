"""The schema set is pinned: an edited schema is reported, never used to judge records (issue 10, item 4)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import rfc8785

from marin.ledger.merkle import merkle_root
from marin.paths import PACKAGE_ROOT, SCHEMA_DIR
from tests.conftest import Project


def test_every_shipped_schema_is_the_pinned_one() -> None:
    pins = json.loads((PACKAGE_ROOT / "schema_pins.json").read_text())
    files = {f"schemas/{p.relative_to(SCHEMA_DIR).as_posix()}": p for p in SCHEMA_DIR.rglob("*.schema.json")}
    assert set(pins) == set(files)  # after an intended change: `marin schemas pin`
    for rel, path in files.items():
        assert pins[rel] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest(), rel


def _rechain(recs: list[dict]) -> bytes:
    """Recompute every digest, link and the Merkle root, as a forger with the whole file would."""
    for i, rec in enumerate(recs):
        rec["prev"] = recs[i - 1]["digest"] if i else None
        if rec["kind"] == "run.finished":
            rec["body"]["merkle_root"] = "sha256:" + merkle_root(
                [bytes.fromhex(r["digest"][7:]) for r in recs[:i]]).hex()
        body = rfc8785.dumps({k: v for k, v in rec.items() if k != "digest"})
        rec["digest"] = "sha256:" + hashlib.sha256(body).hexdigest()
    return b"".join(rfc8785.dumps(r) + b"\n" for r in recs)


def test_an_edited_schema_that_accepts_a_forged_record_is_reported(trained_project: Project) -> None:
    path = sorted((trained_project.root / "ledger" / "runs").glob("train-*.jsonl"))[0]
    recs = [json.loads(x) for x in path.read_bytes().splitlines()]
    metric = next(r for r in recs if r["kind"] == "metric")
    metric["body"]["values"]["loss"] = "low"
    path.write_bytes(_rechain(recs))
    before = trained_project.marin("ledger", "check")
    assert before.returncode == 1 and f"{path.name} line {metric['seq'] + 1}" in before.stderr  # the schema says no

    schema = trained_project.root / "schemas" / "ledger" / "metric.schema.json"
    schema.write_text('{"$schema": "https://json-schema.org/draft/2020-12/schema"}\n')  # accept anything
    r = trained_project.marin("ledger", "check")
    assert r.returncode == 1
    assert "FAIL schemas/ledger/metric.schema.json: edited (now sha256:" in r.stderr
    assert "an edited schema is not used to check records" in r.stderr and "marin schemas pin" in r.stderr


def test_a_stage_refuses_to_write_records_against_an_edited_schema(data_project: Project) -> None:
    ledger = data_project.ledger_files()
    schema: Path = data_project.root / "schemas" / "ledger" / "input.schema.json"
    schema.write_text(schema.read_text().replace('"minimum": 0', '"minimum": -1'))
    p = data_project.stage("tokenize", check=False)
    assert p.returncode == 1 and p.stderr.count("\n") == 1
    assert "schemas/ledger/input.schema.json: edited" in p.stderr
    assert data_project.ledger_files() == ledger  # nothing was appended


def test_pinning_refuses_a_schema_that_is_not_a_schema(project: Project) -> None:
    """`marin schemas pin` checks each file against the draft 2020-12 meta-schema first: a schema that
    could not judge a record is never pinned (records are accepted by the compiled validator alone)."""
    pins = project.root / "marin" / "schema_pins.json"
    before = pins.read_bytes()
    schema = project.root / "schemas" / "ledger" / "metric.schema.json"
    schema.write_text('{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": 5}\n')
    r = project.marin("schemas", "pin")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "schemas/ledger/metric.schema.json: not a valid draft 2020-12 schema" in r.stderr
    assert pins.read_bytes() == before
    schema.write_text('{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}\n')
    assert project.marin("schemas", "pin").returncode == 0
    assert json.loads(pins.read_text())["schemas/ledger/metric.schema.json"] == \
        "sha256:" + hashlib.sha256(schema.read_bytes()).hexdigest()
