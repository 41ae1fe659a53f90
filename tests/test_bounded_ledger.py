"""Bounded work for every input, continued (issue 30, items 7-11): a file that changes while it
is pinned, odd entries in ledger/runs/, one finding hiding others, temporary folders a killed
run left, and a git merge the ledger cannot see. Each command runs as a real subprocess measured
by tests/proc.py (exit code, one line, CPU time, peak RSS under an address-space cap; see
tests/test_bounded.py), and the ledger checks afterwards with every earlier record kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Project, copy_project
from tests.test_bounded import bounded, ledger_kept, refused, run

# A writer that rewrites the first bytes of a file every millisecond until it is killed.
WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY)
print("writing", flush=True)
i = 0
while True:
    os.pwrite(fd, i.to_bytes(8, "little"), 0)
    i += 1
    time.sleep(0.001)
"""

# A process that makes a temporary sibling of an output through the one helper that makes them
# (marin.fsutil.atomic_dir), puts a file in it, says so, and waits to be killed.
HOLDER = """
import sys, time
from pathlib import Path
from marin import fsutil
with fsutil.atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "part.bin").write_bytes(b"x" * 65536)
    print(tmp.name, flush=True)
    time.sleep(600)
"""


def _started(argv: list[str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().strip() if p.stdout else ""
    assert line, "the helper process did not start"
    return p, line


def _fails(child, *lines: str) -> list[str]:
    """The FAIL lines of a `ledger check`: each of ``lines`` among them."""
    fails = [x for x in child.stderr.splitlines() if x.startswith("FAIL ")]
    for want in lines:
        assert any(want in x for x in fails), (want, child.stderr[-3000:])
    return fails


# -- 7. a file that changes while it is pinned ---------------------------------------------------

def test_pin_refuses_a_file_that_changes_while_it_is_read(tmp_path: Path, project: Project) -> None:
    path = tmp_path / "moving.bin"
    with open(path, "wb") as f:
        f.truncate(512 << 20)  # sparse: reading and hashing it takes a few hundred ms
    writer, _ = _started([sys.executable, "-c", WRITER, str(path)], tmp_path)
    try:
        refused(run(project, "-m", "marin.cli", "--root", str(project.root), "pin", "moving.bin", cwd=tmp_path), 1,
                "moving.bin: changed while it was read", "its digest would not be the file's", "run again")
    finally:
        writer.kill()
        writer.wait()
    child = run(project, "-m", "marin.cli", "--root", str(project.root), "pin", "moving.bin", cwd=tmp_path)  # pinned
    assert child.code == 0, child.stderr
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    assert f"sha256:{h.hexdigest()}" in child.stdout  # the digest printed is the file's, as read here
    bounded(child)


# -- 8. odd entries in ledger/runs/ ----------------------------------------------------------------

def _odd(runs: Path, kind: str) -> Path:
    odd = runs / "curate-20990101T000000Z-0dd0dd00.jsonl"
    if kind == "fifo":
        os.mkfifo(odd)  # opening it to read would block until a writer came
    elif kind == "dir":
        odd.mkdir()
    else:
        odd.symlink_to("/dev/zero")  # endless bytes, no newline
    return odd


@pytest.mark.parametrize("kind, what", [("fifo", "is a fifo"), ("dir", "is a directory"),
                                        ("link", "is a symbolic link")])
def test_odd_entries_in_the_runs_folder_are_named_never_opened(data_project: Project, kind: str,
                                                               what: str) -> None:
    runs = data_project.root / "ledger" / "runs"
    before = data_project.ledger_files()
    n = len(list(runs.glob("*.jsonl")))
    odd = _odd(runs, kind)
    check = run(data_project, "-m", "marin.cli", "ledger", "check")
    assert check.code == 1
    [line] = _fails(check, f"FAIL ledger/runs/{odd.name}: {what}, not a run file", "move it out of ledger/runs/")
    assert f"ledger check: {n} runs," in check.stdout and "Traceback" not in check.stderr
    bounded(check)
    print(f"line: {line}")
    if kind == "fifo":  # every other reader of the ledger: bounded, and the odd entry is no run
        for argv in (("ledger", "log"), ("ledger", "head"), ("status",)):
            child = run(data_project, "-m", "marin.cli", *argv)
            assert child.code == 0 and "Traceback" not in child.stderr, (argv, child.stderr)
            bounded(child)
        refused(run(data_project, "-m", "marin.cli", "lineage", odd.name.removesuffix(".jsonl")), 1,
                "is not a run id")
    odd.rmdir() if kind == "dir" else odd.unlink()
    ledger_kept(data_project, before)


def test_open_regular_refuses_what_is_not_a_regular_file_without_blocking(tmp_path: Path) -> None:
    from marin import fsutil

    os.mkfifo(tmp_path / "f")
    (tmp_path / "d").mkdir()
    (tmp_path / "r").write_bytes(b"ok\n")
    (tmp_path / "l").symlink_to(tmp_path / "r")
    for name, why in (("f", "is a fifo"), ("d", "is a directory"), ("l", "")):
        with pytest.raises(OSError) as e:
            fsutil.open_regular(tmp_path / name)
        assert why in str(e.value)
    with fsutil.open_regular(tmp_path / "r") as f:
        assert f.read() == b"ok\n"


def test_a_fifo_in_place_of_a_listing_is_refused_unopened(tmp_path: Path) -> None:
    from marin.errors import IntegrityError
    from marin.ledger import listing

    digest = "sha256:" + "ab" * 32
    path = tmp_path / listing.listing_path(digest)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)  # reading it would block with no writer
    with pytest.raises(IntegrityError, match=r"ledger/listings/abab.*\.jsonl: is a fifo, not a listing file"):
        list(listing.entries(tmp_path, {"path": "data/x", "digest": digest,
                                        "listing": str(listing.listing_path(digest))}))


# -- 9. one finding hides no other -----------------------------------------------------------------

def test_an_edited_schema_does_not_hide_a_tampered_record(data_project: Project) -> None:
    before = data_project.ledger_files()
    schema = data_project.root / "schemas" / "ledger" / "input.schema.json"
    kept_schema = schema.read_bytes()
    schema.write_bytes(kept_schema.replace(b'"minimum": 0', b'"minimum": -1'))
    assert schema.read_bytes() != kept_schema
    fetch = data_project.root / "ledger" / "runs" / next(n for n in before if n.startswith("fetch-"))
    recs = [json.loads(x) for x in fetch.read_bytes().splitlines()]
    recs[0]["body"]["command"] = ["python", "-m", "pipeline.forged"]  # its digest no longer matches
    fetch.write_bytes(b"".join(json.dumps(r, sort_keys=True, separators=(",", ":")).encode() + b"\n"
                               for r in recs))
    check = run(data_project, "-m", "marin.cli", "ledger", "check")
    assert check.code == 1, check.stderr
    fails = _fails(check, "FAIL schemas/ledger/input.schema.json: edited",
                   f"FAIL {fetch.name} seq 0: record digest mismatch")
    assert len(fails) == 2, fails  # the records of the edited schema's kind add no false findings
    assert f"ledger check: {len(before)} runs, " in check.stdout
    bounded(check)
    schema.write_bytes(kept_schema)
    fetch.write_bytes(before[fetch.name])
    ledger_kept(data_project, before)


# -- 10. temporary folders a killed run left ------------------------------------------------------

def test_a_killed_runs_temporary_folder_is_listed_then_removed_by_its_stage_but_a_live_one_is_kept(
        data_project: Project) -> None:
    root, python = data_project.root, sys.executable
    live, held = _started([python, "-c", HOLDER, "data/curated"], root)  # a concurrent run, alive
    killed, left = _started([python, "-c", HOLDER, "data/curated"], root)  # it kept the live one's folder
    os.kill(killed.pid, signal.SIGKILL)  # kill -9 mid-write: nothing cleans up
    killed.wait()
    try:
        assert (root / "data" / left).is_dir() and (root / "data" / held).is_dir()
        before = data_project.ledger_files()
        check = run(data_project, "-m", "marin.cli", "ledger", "check")
        assert check.code == 0, check.stderr
        [line] = [x for x in check.stderr.splitlines() if x.startswith("LEFTOVER ")]
        assert line.startswith(f"LEFTOVER data/{left} (65,536 bytes): left by a killed run")
        bounded(check)
        status = run(data_project, "-m", "marin.cli", "status")
        assert f"leftover: data/{left} " in status.stderr and held not in status.stderr, status.stderr
        bounded(status)
        tokens = data_project.tree("data/tokens")
        child = run(data_project, "-m", "pipeline.curate")  # the stage owns data/curated: it cleans first
        assert child.code == 0, child.stderr
        bounded(child)
        assert f"marin: removed data/{left}, left behind by a stage that was killed" in child.stderr
        assert not (root / "data" / left).exists() and (root / "data" / held).is_dir()  # the live one stays
        assert data_project.tree("data/tokens") == tokens
    finally:
        live.kill()
        live.wait()
    after = data_project.marin("ledger", "check").stderr  # killed now too: listed, and deleted as it says
    assert [x.split(" (")[0] for x in after.splitlines() if x.startswith("LEFTOVER")] == [f"LEFTOVER data/{held}"]
    shutil.rmtree(root / "data" / held)
    ledger_kept(data_project, before)


def test_leftovers_lists_unheld_temporaries_and_the_old_version_beside_no_live_writer(tmp_path: Path) -> None:
    import fcntl

    from marin import fsutil

    for name in (".out.abcd1234.tmp", ".out.old", ".other.zz99zz99.tmp", "out", ".out.tmp", ".out.abc.tmp"):
        (tmp_path / name).mkdir()
    assert [p.name for p in fsutil.leftovers(tmp_path)] == [".other.zz99zz99.tmp", ".out.abcd1234.tmp", ".out.old"]
    fd = os.open(tmp_path / ".out.abcd1234.tmp", os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live writer of out: its temporary and .old are its own
    child = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from marin import fsutil; "
                            "print([p.name for p in fsutil.leftovers(Path(sys.argv[1]))])", str(tmp_path)],
                           capture_output=True, text=True, check=True)
    os.close(fd)
    assert child.stdout.strip() == "['.other.zz99zz99.tmp']"


# -- 11. a merge the ledger cannot see ---------------------------------------------------------------

def test_status_names_a_merged_dvc_lock_unlike_the_model_on_disk_and_params_no_run_used(
        tmp_path: Path, trained_project: Project) -> None:
    proj = copy_project(trained_project, tmp_path / "merge")
    proj.dvc("commit", "-f", "-q", "-d", "train")  # the stages ran as scripts: record train and its deps
    proj.git("add", "-A")
    proj.git("commit", "-qm", "base")
    clean = proj.marin("status")  # a workspace the runs made: nothing named
    assert not [x for x in clean.stderr.splitlines() if x.startswith(("differs: ", "params match no run", "leftover"))]
    assert "no run made" not in clean.stdout, clean.stdout + clean.stderr
    base = proj.git("rev-parse", "--abbrev-ref", "HEAD").strip()
    lr, steps = proj.params["train"]["lr"], proj.params["train"]["steps"]
    made = {}
    for branch, key, value in (("faster", "lr", lr * 2), ("shorter", "steps", steps - 4)):
        proj.git("checkout", "-q", "-b", branch, base)
        params = proj.params
        params["train"][key] = value
        proj.write_params(params)
        proj.dvc("repro", "--single-item", "train")
        made[branch] = proj.runs("train")[-1][0]["run_id"]
        proj.git("add", "-A")
        proj.git("commit", "-qm", f"train.{key} {value}")
    proj.git("checkout", "-q", "faster")
    proj.dvc("checkout", "-q", "train")  # the workspace holds the faster branch's model
    proj.git("merge", "-q", "-X", "theirs", "--no-edit", "shorter")  # dvc.lock: the shorter branch's
    assert proj.params["train"]["lr"] == lr * 2 and proj.params["train"]["steps"] == steps - 4
    before = proj.ledger_files()
    assert proj.marin("ledger", "check").returncode == 0  # the ledger alone sees nothing wrong
    child = run(proj, "-m", "marin.cli", "status")
    assert child.code == 1, child.stdout + child.stderr
    bounded(child)
    err = child.stderr.splitlines()
    [differs] = [x for x in err if x.startswith("differs: train (models/final)")]
    assert f"dvc.lock names the output of run {made['shorter']}" in differs
    assert f"the one on disk is of run {made['faster']}" in differs
    [params] = [x for x in err if x.startswith("params match no run: train:")]
    assert f"train.lr {lr * 2!r}, train.steps {steps - 4!r} in params.yaml were never used together" in params
    assert f"run {made['shorter']} had train.lr {lr!r}; run {made['faster']} had train.steps {steps!r}" in params
    assert "thing(s) in the workspace no run made" in child.stdout
    print(f"lines: {differs}\n{params}")
    proj.dvc("checkout", "-q", "train")  # dvc.lock's model back in place: only the params remain
    again = proj.marin("status")
    assert not any(x.startswith("differs: train (models/final)") for x in again.stderr.splitlines()), again.stderr
    assert "params match no run: train:" in again.stderr
    ledger_kept(proj, before)
