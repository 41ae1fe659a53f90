"""The derived ledger index: rebuilt correctly behind its back, never the source of truth (issue 11)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from marin.ledger.index import Index, index_path
from marin.ledger.store import RunFile
from tests.conftest import Project, copy_project
from tests.test_records import EXAMPLES


def snapshot(root: Path) -> tuple[list, list]:
    """Everything the index answers, in a comparable form."""
    idx = Index.open(root)
    try:
        runs = [(r, idx.merkle_state(r.run_id)[0] if idx.merkle_state(r.run_id) else None,
                 idx.merkle_state(r.run_id)[1].root() if idx.merkle_state(r.run_id) else None)
                for r in idx.runs(include_unstarted=True)]
        entities = idx.entities()
    finally:
        idx.close()
    return runs, entities


def from_scratch(root: Path, tmp: Path) -> tuple[list, list]:
    """The index a fresh clone would build: same files, no index."""
    clone = tmp / "scratch"
    shutil.rmtree(clone, ignore_errors=True)
    (clone / "ledger").mkdir(parents=True)
    shutil.copytree(root / "ledger" / "runs", clone / "ledger" / "runs")
    return snapshot(clone)


def run_path(proj: Project, stage: str) -> Path:
    return sorted((proj.root / "ledger" / "runs").glob(f"{stage}-*.jsonl"))[-1]


def test_the_index_follows_every_change_behind_its_back(data_project: Project, tmp_path: Path) -> None:
    root = data_project.root
    assert snapshot(root) == from_scratch(root, tmp_path)
    idx = Index.open(root)
    assert [r.stage for r in idx.runs()] == ["fetch", "curate", "tokenize"]
    assert idx.refresh() == 0  # nothing changed: nothing read

    data_project.stage("tokenize")  # added
    assert idx.refresh() == 1 and len(idx.runs("tokenize")) == 2
    assert snapshot(root) == from_scratch(root, tmp_path)

    path = run_path(data_project, "tokenize")  # extended: only the new line is read
    before = idx.run(path.stem)
    RunFile(path, path.stem).append("verification", EXAMPLES["verification"])
    assert idx.refresh() == 1
    after = idx.run(path.stem)
    assert after.last_seq == before.last_seq + 1 and after.status == "succeeded" and after.records == before.records + 1
    assert snapshot(root) == from_scratch(root, tmp_path)

    curate = run_path(data_project, "curate")  # edited in place, same length
    lines = curate.read_bytes().splitlines(keepends=True)
    i = next(n for n, x in enumerate(lines) if b'"kind":"output"' in x)
    rec = json.loads(lines[i])
    old, new = rec["body"]["digest"], "sha256:" + "0" * 64
    lines[i] = lines[i].replace(old.encode(), new.encode())
    curate.write_bytes(b"".join(lines))
    assert idx.refresh() == 1
    assert idx.entities(digest=new) and not [e for e in idx.entities(digest=old) if e[0] == curate.stem]
    assert snapshot(root) == from_scratch(root, tmp_path)
    check = data_project.marin("ledger", "check")
    assert check.returncode == 1 and f"FAIL {curate.name} seq {rec['seq']}: record digest mismatch" in check.stderr

    fetch = run_path(data_project, "fetch")  # deleted
    fetch.unlink()
    assert idx.refresh() == 0 and idx.run(fetch.stem) is None and not idx.entities(run_id=fetch.stem)
    assert snapshot(root) == from_scratch(root, tmp_path)


def test_a_rewritten_tail_of_the_same_size_plus_an_append_is_reindexed(data_project: Project, tmp_path: Path) -> None:
    root = data_project.root
    Index.open(root).close()
    path = run_path(data_project, "tokenize")
    lines = path.read_bytes().splitlines(keepends=True)
    rec = json.loads(lines[-1])
    rec["digest"] = "sha256:" + "1" * 64  # the last indexed line changes, then the file grows
    lines[-1] = json.dumps(rec, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    path.write_bytes(b"".join(lines) + lines[-1])
    assert snapshot(root) == from_scratch(root, tmp_path)


def test_deleting_the_index_changes_no_answer(trained_project: Project) -> None:
    commands = [("ledger", "log"), ("ledger", "head"), ("ledger", "check"), ("lineage", "models/final"),
                ("lineage", "models/final", "--format", "prov-json")]
    first = [trained_project.marin(*c) for c in commands]
    assert all(p.returncode == 0 for p in first), [p.stderr for p in first]
    assert index_path(trained_project.root).is_file()
    shutil.rmtree(index_path(trained_project.root).parent)
    again = [trained_project.marin(*c) for c in commands]
    assert [(p.returncode, p.stdout) for p in again] == [(p.returncode, p.stdout) for p in first]
    index_path(trained_project.root).write_bytes(b"not a database")  # a corrupt index is rebuilt, never believed
    corrupt = [trained_project.marin(*c) for c in commands]
    assert [(p.returncode, p.stdout) for p in corrupt] == [(p.returncode, p.stdout) for p in first]


def test_two_branches_that_add_runs_merge_without_conflicts_and_check(data_project: Project, tmp_path: Path) -> None:
    proj = data_project
    proj.git("add", "-A", "ledger")
    proj.git("commit", "-qm", "data runs")
    proj.git("checkout", "-qb", "other")
    proj.stage("tokenize")
    proj.git("add", "-A", "ledger")
    proj.git("commit", "-qm", "a tokenize run on a branch")
    proj.git("checkout", "-q", "-")
    params = proj.params
    params["tokenize"]["min_frequency"] = 3  # another recipe on the main line
    proj.write_params(params)
    proj.stage("tokenize")
    proj.git("add", "-A", "ledger", "params.yaml")
    proj.git("commit", "-qm", "a tokenize run on main")
    merge = proj.run("git", "merge", "--no-edit", "other")
    assert merge.returncode == 0, merge.stdout + merge.stderr
    assert len(list((proj.root / "ledger" / "runs").glob("tokenize-*.jsonl"))) == 3
    proj.stage("tokenize")  # the workspace's outputs are the main line's recipe again
    check = proj.marin("ledger", "check")
    assert check.returncode == 0, check.stderr
    assert "6 runs" in check.stdout


@pytest.mark.parametrize("limit", [3])
def test_a_directory_beyond_the_inline_limit_keeps_every_file_named(data_project: Project, monkeypatch,
                                                                     limit: int) -> None:
    """A listing file, named by the directory's digest, holds the entries; check names a changed file."""
    from marin.ledger import run as run_mod
    from marin.ledger.check import DvcOuts, check
    from marin.ledger.run import Recipe, Run
    from marin.stages import dvcfiles

    monkeypatch.setattr(run_mod, "MAX_ENTRIES", limit)
    root = data_project.root
    out = root / "data" / "many"
    out.mkdir()
    for i in range(limit + 4):
        (out / f"f{i}.txt").write_text(f"file {i}\n")
    dvc = DvcOuts(dvcfiles.locked(root), dvcfiles.declared_outs(root))
    with Run.start(root, Recipe("curate", {})) as run:
        rec = run.output("many", "data/many")
    assert "entries" not in rec.body and rec.body["files"] == limit + 4
    listing = root / rec.body["listing"]
    assert listing.name == rec.body["digest"][7:] + ".jsonl"
    rows = [json.loads(x) for x in listing.read_bytes().splitlines()]
    assert sorted(r["path"] for r in rows) == sorted(f"f{i}.txt" for i in range(limit + 4))
    assert check(root, dvc, 300.0).ok
    (out / "f2.txt").write_text("changed\n")
    problems = [str(p) for p in check(root, dvc, 300.0).problems]
    assert any(p.startswith("data/many/f2.txt: on disk it hashes to") for p in problems), problems
    listing.write_bytes(listing.read_bytes().replace(b"f1.txt", b"g1.txt"))
    problems = [str(p) for p in check(root, dvc, 300.0).problems]
    assert any("does not hash to" in p and "the listing was edited" in p for p in problems), problems


def test_two_projects_share_no_index(tmp_path: Path, data_project: Project) -> None:
    other = copy_project(data_project, tmp_path / "other")
    shutil.rmtree(other.root / ".marin" / "index", ignore_errors=True)
    next(iter((other.root / "ledger" / "runs").glob("fetch-*.jsonl"))).unlink()
    assert len(Index.open(other.root).runs()) == 2 and len(Index.open(data_project.root).runs()) == 3


def test_an_index_that_cannot_be_kept_on_disk_is_kept_in_memory(data_project: Project) -> None:
    """A read-only checkout or a full disk: commands still answer, from an index in memory."""
    first = [data_project.marin(*c) for c in (("ledger", "log"), ("ledger", "check"), ("ledger", "head"))]
    shutil.rmtree(index_path(data_project.root).parent)
    index_path(data_project.root).parent.write_text("not a directory")  # mkdir of the index fails
    again = [data_project.marin(*c) for c in (("ledger", "log"), ("ledger", "check"), ("ledger", "head"))]
    assert [(p.returncode, p.stdout) for p in again] == [(p.returncode, p.stdout) for p in first]
    assert all(p.returncode == 0 for p in again)
