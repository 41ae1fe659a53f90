"""marin lineage on a real ledger (fetch, curate, tokenize on the mini corpus): the tree checked
against the run files read as plain JSON, TARGET resolution, and a PROV-JSON export that
validates against the W3C PROV-JSON schema and round-trips through the `prov` package."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from prov.model import ProvDocument

from marin.commands import lineage
from marin.ledger import RunFile, query
from marin.ledger.prov import to_prov
from marin.paths import ledger_dir
from marin.stages import SOURCE_STAGES
from tests.conftest import Project, reference

SCHEMA = reference("prov-json.schema.json")
TOKENIZER = "data/tokens/tokenizer.json"


def stage_runs(project: Project) -> dict[str, list[dict[str, Any]]]:
    """The one run of each data stage, as the plain JSON records of its run file."""
    return {stage: project.runs(stage)[0] for stage in ("fetch", "curate", "tokenize")}


def bodies(run: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r["body"] for r in run if r["kind"] == kind]


def output(run: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(b for b in bodies(run, "output") if b["name"] == name)


def short(digest: str) -> str:
    return "sha256:" + digest.split(":")[1][:12]




def test_tree_from_tokenizer_path_reaches_the_raw_archive(data_project: Project) -> None:
    runs = stage_runs(data_project)
    tok, cur, fetch = runs["tokenize"], runs["curate"], runs["fetch"]
    node = query.tree(data_project.root, TOKENIZER, SOURCE_STAGES)

    assert isinstance(node, query.Artifact) and node.run is not None
    assert (node.digest, node.path) == (output(tok, "tokenizer")["digest"], TOKENIZER)
    step = node.run
    started = tok[0]["body"]
    assert (step.stage, step.run_id, step.recipe_digest) == ("tokenize", tok[0]["run_id"], started["recipe_digest"])
    assert step.code["git_commit"] == started["code"]["git_commit"]
    assert [a.digest for a in step.inputs] == [b["digest"] for b in bodies(tok, "input")]
    assert {a.digest for a in step.inputs} <= {b["digest"] for b in bodies(cur, "output")}
    curate = step.inputs[0].run
    assert curate is not None and curate.run_id == cur[0]["run_id"]
    assert all(a.run is curate for a in step.inputs)  # train and validation: one curate run

    (archive,) = curate.inputs
    assert archive.digest == bodies(cur, "input")[0]["digest"] == output(fetch, "archive:mini")["digest"]
    assert archive.run is not None and (archive.run.stage, archive.run.run_id) == ("fetch", fetch[0]["run_id"])
    (raw,) = archive.run.inputs
    (raw_rec,) = bodies(fetch, "input")
    assert (raw.digest, raw.locator, raw.license, raw.run) == (
        raw_rec["digest"], raw_rec["locator"], raw_rec["license"], None)

    lines = lineage.render_text(node).splitlines()
    chain = [short(node.digest), tok[0]["run_id"], short(step.inputs[0].digest), cur[0]["run_id"],
             short(archive.digest), fetch[0]["run_id"], raw_rec["locator"]]
    at = [next(i for i, line in enumerate(lines) if s in line) for s in chain]
    depth = [len(lines[i]) - len(lines[i].lstrip(" |`-")) for i in at]
    assert at == sorted(at) and depth == sorted(set(depth)), lines  # each step one level deeper
    tok_line = lines[at[1]]
    assert f"recipe {started['recipe_digest'][7:19]}" in tok_line
    assert f"commit {started['code']['git_commit'][:12]}" in tok_line
    assert raw_rec["license"] in lines[at[-1]]
    curate_lines = [line for line in lines if cur[0]["run_id"] in line]
    assert len(curate_lines) == 2 and curate_lines[1].endswith("(shown above)")


def test_target_by_run_id_and_by_digest(data_project: Project) -> None:
    root, runs = data_project.root, stage_runs(data_project)
    cur_id = runs["curate"][0]["run_id"]
    assert query.resolve(root, cur_id, SOURCE_STAGES) == query.Target("run", cur_id)
    step = query.tree(root, cur_id, SOURCE_STAGES)
    assert isinstance(step, query.Step)
    assert [o.digest for o in step.outputs] == [b["digest"] for b in bodies(runs["curate"], "output")]
    text = lineage.render_text(step)
    assert text.startswith(f"curate  {cur_id}  ")
    assert all(f"wrote {short(o.digest)}" in text for o in step.outputs)

    tokens = output(runs["tokenize"], "tokens")["digest"]
    for target in (tokens, tokens[:19], tokens[7:15], tokens[7:]):
        assert query.resolve(root, target, SOURCE_STAGES) == query.Target("digest", tokens), target
    assert query.resolve(root, "data/tokens", SOURCE_STAGES) == query.Target("digest", tokens)


def test_ambiguous_digest_prefix(data_project: Project) -> None:
    root, tok = data_project.root, stage_runs(data_project)["tokenize"]
    digest = output(tok, "tokens")["digest"]
    twin = digest[:17] + ("1" if digest[17] == "0" else "0") + digest[18:]  # shares 10 hex digits
    twin_id = "tokenize-20990101T000000Z-00000000"
    forged = RunFile(ledger_dir(root) / f"{twin_id}.jsonl", twin_id)
    forged.append("run.started", tok[0]["body"])
    forged.append("output", {**output(tok, "tokens"), "digest": twin})

    with pytest.raises(query.AmbiguousTarget, match=f"{digest[7:17]}.*ambiguous: 2 digests") as e:
        query.resolve(root, digest[7:17], SOURCE_STAGES)
    assert "\n" not in str(e.value)
    assert query.resolve(root, digest[7:18], SOURCE_STAGES) == query.Target("digest", digest)  # one more digit decides


def test_unknown_target(data_project: Project) -> None:
    root = data_project.root
    for target in ("no-such-run", "sha256:" + "ab" * 32, "deadbeefdeadbeef", "data/nothing.txt"):
        with pytest.raises(query.UnknownTarget) as e:
            query.resolve(root, target, SOURCE_STAGES)
        assert target in str(e.value) and "\n" not in str(e.value)
    p = data_project.marin("lineage", "no-such-run")  # as a user runs it: argparse, then one line and an exit code
    err = p.stderr
    assert p.returncode == 1 and err.startswith("marin: error: 'no-such-run' is not a run id") and err.count("\n") == 1


def test_changed_file_resolves_to_its_recorded_output(data_project: Project) -> None:
    recorded = output(stage_runs(data_project)["tokenize"], "tokenizer")["digest"]
    (data_project.root / TOKENIZER).write_text("edited by hand\n")
    target = query.resolve(data_project.root, TOKENIZER, SOURCE_STAGES)
    assert target.key == recorded and target.note and "differs from every recorded output" in target.note
    p = data_project.marin("lineage", TOKENIZER)  # the recorded tree, but the bytes on disk have no lineage
    assert p.returncode == 1 and p.stderr.startswith(f"marin: error: {TOKENIZER} differs from every recorded")
    assert recorded.split(":")[1][:12] in p.stdout and "tokenize" in p.stdout


def test_a_file_inside_a_directory_output_has_the_lineage_of_its_folder(data_project: Project) -> None:
    shard = sorted((data_project.root / "data/tokens").glob("train-*.parquet"))[0]
    rel = shard.relative_to(data_project.root).as_posix()
    folder = output(stage_runs(data_project)["tokenize"], "tokens")
    p = data_project.marin("lineage", rel)
    assert p.returncode == 0, p.stderr
    assert p.stderr.startswith(f"marin: note: {rel} is a file of data/tokens, which run ") and "tokenize" in p.stdout
    assert folder["digest"].split(":")[1][:12] in p.stdout
    shard.write_bytes(shard.read_bytes()[:-1] + bytes([shard.read_bytes()[-1] ^ 1]))
    p = data_project.marin("lineage", rel)
    assert p.returncode == 1 and f"{rel} differs from every recorded version in data/tokens" in p.stderr


def test_a_line_that_does_not_parse_in_the_lineage_is_named_and_fails(data_project: Project) -> None:
    path = data_project.root / "ledger/runs" / f"{stage_runs(data_project)['curate'][0]['run_id']}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:2], b"hello this is not json\n", *lines[2:]]))
    p = data_project.marin("lineage", TOKENIZER)
    assert p.returncode == 1 and "tokenize" in p.stdout
    assert f"marin: error: ledger/runs/{path.name} line 3: " in p.stderr and "Traceback" not in p.stderr
    log = data_project.marin("ledger", "log")  # the listing names it too, not as a crash's truncated line
    assert log.returncode == 1 and "(unreadable line 3)" in log.stdout and "(truncated)" not in log.stdout
    assert f"ledger/runs/{path.name} line 3: " in log.stderr


def test_prov_json_validates_against_w3c_schema_and_round_trips(data_project: Project, tmp_path: Path) -> None:
    root, runs = data_project.root, list(stage_runs(data_project).values())
    out = tmp_path / "lineage.json"
    p = data_project.marin("lineage", TOKENIZER, "--format", "prov-json", "--output", str(out))
    assert p.returncode == 0, p.stderr
    text = out.read_text()
    data = json.loads(text)

    schema = json.loads(SCHEMA.read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator = validator_cls(schema)
    assert not sorted(validator.iter_errors(data), key=str), list(validator.iter_errors(data))
    assert not validator.is_valid({**data, "wasGeneratedBy": {"_:x": {}}})  # the schema does bite

    original = to_prov(query.tree(root, TOKENIZER, SOURCE_STAGES))
    assert ProvDocument.deserialize(content=text, format="json") == original

    inputs = [(f"marin:{run[0]['run_id']}", b["digest"]) for run in runs for b in bodies(run, "input")]
    outputs = [(b["digest"], f"marin:{run[0]['run_id']}") for run in runs for b in bodies(run, "output")]
    derived = {(o["digest"], i["digest"]) for run in runs
               for o in bodies(run, "output") for i in bodies(run, "input") if o["digest"] != i["digest"]}
    builders = {json.dumps([run[0]["body"]["code"]["code_digest"], run[0]["body"]["code"]["git_commit"],
                            run[0]["body"]["env"]], sort_keys=True) for run in runs}
    assert set(data["entity"]) == {d for _, d in inputs} | {d for d, _ in outputs}
    assert set(data["activity"]) == {f"marin:{run[0]['run_id']}" for run in runs}
    assert len(data["agent"]) == len(builders)
    assert sorted((r["prov:activity"], r["prov:entity"]) for r in data["used"].values()) == sorted(inputs)
    assert sorted((r["prov:entity"], r["prov:activity"]) for r in data["wasGeneratedBy"].values()) == sorted(outputs)
    assert len(data["wasAssociatedWith"]) == len(runs)
    got = [(r["prov:generatedEntity"], r["prov:usedEntity"]) for r in data["wasDerivedFrom"].values()]
    assert sorted(got) == sorted(derived)

    for run in runs:
        act = data["activity"][f"marin:{run[0]['run_id']}"]
        assert dt.datetime.fromisoformat(act["prov:startTime"]) == dt.datetime.fromisoformat(run[0]["time"])
        assert dt.datetime.fromisoformat(act["prov:endTime"]) == dt.datetime.fromisoformat(run[-1]["time"])
        assert (act["marin:stage"], act["marin:recipe_digest"], act["marin:status"]) == (
            run[0]["body"]["stage"], run[0]["body"]["recipe_digest"], run[-1]["body"]["status"])
    (raw,) = bodies(runs[0], "input")
    assert data["entity"][raw["digest"]]["marin:license"] == raw["license"]
