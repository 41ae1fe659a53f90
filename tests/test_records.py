"""Every ledger schema is valid; every record kind round-trips with a stable digest."""

import json

import pytest

from marin import schemas
from marin.errors import LedgerError, SchemaError
from marin.ledger.records import KINDS, Record, exact
from marin.paths import SCHEMA_DIR

D = "sha256:" + "ab" * 32

EXAMPLES = {
    "run.started": {
        "stage": "curate", "command": ["pipeline/curate.py"], "params": {"curate": {}},
        "recipe_digest": D, "inputs": [{"name": "x", "digest": D}],
        "code": {"git_commit": "0" * 40, "tree_digest": "git-tree:" + "1" * 40, "dirty": False,
                 "diff_digest": None, "code_digest": D, "lock_digest": D},
        "env": {"python": "3.11.7", "platform": "Linux", "machine": "x86_64", "cpu_model": "x",
                "isa_flags": ["avx2"], "cpu_count": 2, "usable_cores": [0, 1], "packages": {},
                "env_vars": {}},
        "determinism_class": {"kind": "data"}, "determinism_digest": D, "seeds": {"root": 1},
    },
    "run.resumed": {"from_seq": 7, "reason": "unfinished run of the same recipe", "env": {}, "code": {}},
    "input": {"name": "archive:x", "path": "data/raw/x/x.tar.gz", "digest": D, "size": 10,
              "license": "MIT", "locator": "pypi:x==1", "dvc_md5": "0" * 32},
    "output": {"name": "train", "path": "data/curated/train.parquet", "digest": D, "size": 5,
               "type": "file", "dvc_md5": "f" * 32},
    "checkpoint": {"step": 50, "path": "checkpoints/train-x/50", "digest": D, "params_digest": D,
                   "loader": {"epoch": 0, "index": 1600}, "leaves": 40},
    "metric": {"step": 10, "values": {"loss": exact(3.25), "lr": exact(1e-3)}, "timing": {"tokens_per_s": 8000.0}},
    "eval": {"name": "model", "split": "validation", "corpus": "bible",
             "values": {"bits_per_byte": exact(1.5), "tokens": 1000},
             "samples": [{"prompt": "ROMEO.", "completion": " O", "token_ids": [1, 2]}]},
    "run.finished": {"status": "succeeded", "outputs": [{"name": "train", "digest": D}],
                     "merkle_root": D, "records": 3, "wall_s": 1.5, "ledger_s": 0.1},
    "verification": {"verified": {"run_id": "train-x", "recipe_digest": D, "finished_digest": D},
                     "mode": "segments", "result": "mismatch", "exit_code": 1,
                     "verifier": {"env": {}, "code": {}, "determinism_class": {"kind": "jax"},
                                  "workspace": "git worktree at 0123", "inputs": [
                                      {"name": "tokens", "digest": D, "source": "DVC cache"}]},
                     "compared": {"checkpoint": 2, "metric": 4},
                     "first_divergence": {"seq": 9, "kind": "metric", "step": 6, "name": "loss",
                                          "what": "loss recorded 1.0 replayed 2.0"},
                     "segments": {"seed": 7, "seed_source": "random", "k": 2, "n": 8, "drawn": [[0, 50], [150, 200]],
                                  "detection_probability": 0.25},
                     "time": {"total_s": 3.5}},
    "publication": {"what": "checkpoint", "name": "checkpoint:50", "path": "checkpoints/train-x/50", "digest": D,
                    "size": 1000, "remote": "lab", "url": "s3://lab/dvc/marin/sha256/ab/" + "ab" * 31,
                    "run_id": "train-x", "step": 50, "manifest": D, "files": 7},
    "trial": {"index": 1, "params": {"train.lr": 0.01}, "status": "failed", "experiment": "sweep-0123abcd-t1",
              "runs": [{"run_id": "train-x", "stage": "train", "status": "unfinished"}],
              "metrics": {"step": 6, "loss": 5.5, "val_loss": 5.75}, "error": "ERROR: failed to reproduce 'train'"},
    "selection": {"rule": {"metric": "bits_per_byte", "goal": "min"}, "trial": 0, "experiment": "sweep-0123abcd-t0",
                  "value": 3.25, "reason": "lowest bits_per_byte of 2 succeeded trials"},
}


def schema_files():
    return sorted(SCHEMA_DIR.rglob("*.schema.json"))


@pytest.mark.parametrize("path", schema_files(), ids=lambda p: p.relative_to(SCHEMA_DIR).as_posix())
def test_every_schema_is_a_valid_2020_12_schema(path) -> None:
    from jsonschema import Draft202012Validator

    schema = json.loads(path.read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_record_roundtrip_and_stable_digest(kind: str) -> None:
    rec = Record.create("curate-20260101T000000Z-0123abcd", 0, None, kind, EXAMPLES[kind],
                        time="2026-01-01T00:00:00.000000Z")
    again = Record.from_line(rec.line(), "test")
    assert again == rec
    # The digest is a pure function of the content: recompute independently.
    d = {k: v for k, v in json.loads(rec.line()).items() if k != "digest"}
    import hashlib

    import rfc8785

    assert rec.digest == "sha256:" + hashlib.sha256(rfc8785.dumps(d)).hexdigest()
    twin = Record.create(rec.run_id, 0, None, kind, json.loads(json.dumps(EXAMPLES[kind])), time=rec.time)
    assert twin.digest == rec.digest


def test_every_kind_has_a_schema() -> None:
    for kind in KINDS:
        assert (SCHEMA_DIR / "ledger" / f"{kind}.schema.json").is_file(), kind


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_invalid_body_cannot_be_constructed(kind: str) -> None:
    body = dict(EXAMPLES[kind])
    required = json.loads((SCHEMA_DIR / "ledger" / f"{kind}.schema.json").read_text())["required"]
    body.pop(required[0])
    with pytest.raises(SchemaError, match=kind):
        Record.create("curate-20260101T000000Z-0123abcd", 0, None, kind, body)


def test_bad_envelope_is_named() -> None:
    rec = Record.create("curate-20260101T000000Z-0123abcd", 0, None, "output", EXAMPLES["output"])
    d = rec.to_dict()
    d["seq"] = -1
    with pytest.raises(SchemaError, match="seq"):
        Record.from_dict(d, "somewhere")


def test_exact_float_roundtrips() -> None:
    x = 0.1 + 0.2
    e = exact(x)
    assert float.fromhex(e["hex"]) == x and e["value"] == x


def test_schema_error_lines_name_the_key_path() -> None:
    lines = schemas.errors({"seed": "x"}, "params")
    assert any(line.startswith("seed:") for line in lines)


@pytest.mark.parametrize("kind", KINDS)
def test_the_content_digest_of_a_line_is_the_record_digest(kind: str) -> None:
    from marin.ledger.records import content_digest

    rec = Record.create("curate-20260101T000000Z-0123abcd", 3, D, kind, EXAMPLES[kind])
    assert content_digest(rec.line()) == rec.digest == Record.compute_digest(rec.to_dict())
    edited = rec.line().replace(b'"seq":3', b'"seq":4')
    assert content_digest(edited) != rec.digest


@pytest.mark.parametrize("text", [
    '{"a":1.0}', '{"a":1e-07}', '{"a":1E5}', '{"a":-0}', '{"a":12345678901234567890}', '{"a": 1}',
    '{"b":1,"a":2}', '{"a":"\\u00e9"}', '{"a":0.10}', '{"a":1,"a":1}', '{"\\ue000":1,"\\ud83d\\ude00":2}',
    ' {"a":1}', '{"a":1} ', '{"a":1}{}', '{"a":NaN}', '{"a":Infinity}', '{"a":1e999}', '[1]', '{"a":1',
])
def test_the_fast_canonical_check_never_accepts_what_rfc8785_would_write_otherwise(text: str) -> None:
    import rfc8785

    from marin.ledger.records import _canonical_fast

    line = text.encode()
    d = _canonical_fast(line)
    if d is not None:  # accepted only when the exact serializer agrees byte for byte
        assert rfc8785.dumps(d) == line
    try:
        exact_ok = rfc8785.dumps(json.loads(line)) == line
    except Exception:
        exact_ok = False
    assert d is None or exact_ok


def test_the_fast_canonical_check_accepts_canonical_lines() -> None:
    """Every line the ledger writes takes the fast path (else every check pays for the exact serializer)."""
    from marin.ledger.records import _canonical_fast

    for kind in KINDS:
        line = Record.create("curate-20260101T000000Z-0123abcd", 3, D, kind, EXAMPLES[kind]).line().rstrip(b"\n")
        assert _canonical_fast(line) == json.loads(line), kind


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_a_body_reads_as_its_own_kind_only(kind: str) -> None:
    rec = Record.create("curate-20260101T000000Z-0123abcd", 0, None, kind, EXAMPLES[kind])
    assert rec.body_as(kind) is rec.body  # type: ignore[call-overload]  # a str kind: the overloads take literals
    other = next(k for k in KINDS if k != kind)
    with pytest.raises(LedgerError, match=f"a {kind} record, read as {other}"):
        rec.body_as(other)  # type: ignore[call-overload]


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_step_and_name_are_the_bodys_for_every_kind(kind: str) -> None:
    """A reader of any kind (verify's comparison) gets a record's step and name typed, from its body alone."""
    rec = Record.create("curate-20260101T000000Z-0123abcd", 0, None, kind, EXAMPLES[kind])
    body = json.loads(rec.line())["body"]
    assert rec.step == body.get("step")
    assert rec.name == body.get("name")


def test_step_and_name_of_a_body_that_has_other_types_are_none() -> None:
    """An unvalidated record (verify reads a forged run with validation off) may carry anything there."""
    for step, name in ((True, 3), ("7", None), (None, ["x"]), (2.0, {"a": 1})):
        rec = Record("s", "r", 0, None, "t", "metric", {"step": step, "name": name}, "d")
        assert rec.step is None and rec.name is None
