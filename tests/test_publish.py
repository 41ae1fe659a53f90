"""`marin publish` to a real S3 server, and a stranger's check from a fresh clone in another
directory with an empty DVC cache and without the lab's folder (README: "Publish a run so that
anyone can check it")."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import Project, copy_project
from tests.servers import S3_ENV

pytestmark = pytest.mark.slow
BUCKET = "marin-lab"


RAN = ("fetch", "curate", "evalsets", "tokenize", "train", "evaluate", "export")  # the stages the lab ran


@pytest.fixture(scope="module")
def lab(tmp_path_factory, _trained_project, s3) -> Project:
    """The trained tiny project as a lab publishes it: a DVC remote on S3, dvc.lock, `marin publish`,
    the ledger committed and pushed to a bare git repository."""
    base = tmp_path_factory.mktemp("lab")
    proj = copy_project(_trained_project, base / "lab")
    proj.env.update(S3_ENV)
    s3.bucket(BUCKET)
    proj.dvc("remote", "add", "-d", "lab", f"s3://{BUCKET}/dvc")
    proj.dvc("remote", "modify", "lab", "endpointurl", s3.url)
    proj.stage("export")
    proj.marin("report", check=True)  # unsigned: the lab's key is not the point here
    # the stages ran as scripts: record their outputs in dvc.lock (the instruct stages did not run here)
    proj.dvc("commit", "-f", "-q", *RAN)
    r = proj.marin("publish", check=True)
    assert "now commit and push the ledger" in r.stdout, r.stdout
    proj.git("add", "-A")
    proj.git("commit", "-qm", "publish")
    proj.run("git", "clone", "-q", "--bare", str(proj.root), str(base / "lab.git"), check=True)
    return proj


def publications(proj: Project) -> list[dict]:
    return [x["body"] for recs in proj.runs("publish") for x in recs if x["kind"] == "publication"]


def stranger(lab: Project, dest: Path) -> Project:
    """A fresh clone somewhere else: no DVC cache, no data, no checkpoints, no .marin."""
    bare = lab.root.parent / "lab.git"
    dest.parent.mkdir(parents=True, exist_ok=True)
    Project(dest.parent).run("git", "clone", "-q", str(bare), str(dest), check=True)
    clone = Project(dest)
    clone.env.update(S3_ENV)
    assert not (dest / ".dvc" / "cache").exists() and not (dest / "data").exists()
    return clone


def s3_key(url: str) -> tuple[str, str]:
    bucket, key = url.removeprefix("s3://").split("/", 1)
    return bucket, key


def test_publish_records_where_each_object_lives(lab, s3) -> None:
    pubs = publications(lab)
    dvc = {p["path"]: p for p in pubs if p["what"] == "dvc"}
    assert {"data/raw", "data/curated", "data/tokens", "models/final"} <= set(dvc)
    outputs = {x["body"]["path"]: x["body"] for recs in lab.runs() for x in recs if x["kind"] == "output"}
    for path, p in dvc.items():  # each named object is in the bucket, under the md5 the ledger holds
        assert p["digest"] == outputs[path]["digest"] and p["dvc_md5"] == outputs[path]["dvc_md5"]
        bucket, key = s3_key(p["url"])
        data = s3.get(bucket, key)
        if not p["dvc_md5"].endswith(".dir"):
            assert hashlib.md5(data).hexdigest() == p["dvc_md5"]
    train = lab.runs("train")[-1]
    ckpts = [x["body"] for x in train if x["kind"] == "checkpoint"]
    published = {p["step"]: p for p in pubs if p["what"] == "checkpoint"}
    assert sorted(published) == [c["step"] for c in ckpts]
    for c in ckpts:  # a manifest by digest, listing every file of the checkpoint by its sha256
        p = published[c["step"]]
        assert p["digest"] == c["digest"]
        manifest = s3.get(*s3_key(p["url"]))
        assert "sha256:" + hashlib.sha256(manifest).hexdigest() == p["manifest"]
        files = json.loads(manifest)["files"]
        on_disk = sorted(f.relative_to(lab.root / c["path"]).as_posix()
                         for f in (lab.root / c["path"]).rglob("*") if f.is_file())
        assert sorted(f["path"] for f in files) == on_disk
        for f in files[:3]:
            hexd = f["sha256"].split(":")[1]
            assert hashlib.sha256(s3.get(BUCKET, f"dvc/marin/sha256/{hexd[:2]}/{hexd[2:]}")).hexdigest() == hexd
    assert lab.marin("ledger", "check").returncode == 0
    datasheet = (lab.root / "reports/marin-tiny/datasheet.md").read_text()
    assert f"Distributed through the DVC remote `lab` (`s3://{BUCKET}/dvc`)" in datasheet


def upstream_table(stdout: str) -> dict[str, str]:
    """`verify --upstream`'s closing table: stage -> result."""
    stages = ("fetch", "curate", "tokenize", "train")
    return {w[0]: w[2] for w in map(str.split, stdout.splitlines()[-6:]) if w and w[0] in stages}


def test_a_stranger_checks_the_run_from_a_fresh_clone(lab, tmp_path) -> None:
    clone = stranger(lab, tmp_path / "elsewhere" / "check")
    hidden = lab.root.with_name("lab-hidden")
    lab.root.rename(hidden)  # no access to the lab's folders during the check
    try:
        clone.dvc("pull", "-q", *RAN)
        # Every stage behind the model replayed bit for bit, train from its first step to its last.
        r = clone.marin("verify", "--upstream", "models/final")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert upstream_table(r.stdout) == dict.fromkeys(("fetch", "curate", "tokenize", "train"), "bit-exact"), \
            r.stdout[-2000:]
        assert "intervals replayed" not in r.stdout  # the whole run, not segments
        # Then train by 2 of its 3 checkpoint intervals, from the published checkpoints (the stages
        # before it were replayed above: `--upstream --segments 2` would replay them again).
        train = clone.runs("train")[-1][0]["run_id"]
        r = clone.marin("verify", "--segments", "2", "--seed", "1", train)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert "2 of 3 intervals" in r.stdout and f"verify {train}: BIT-EXACT" in r.stdout, r.stdout[-2000:]
        assert (clone.root / ".marin/cache/checkpoints" / train).is_dir()  # fetched by digest, not the lab's
        assert not (clone.root / "checkpoints").exists()
    finally:
        hidden.rename(lab.root)


def test_a_changed_checkpoint_object_in_the_remote_is_named(lab, s3, tmp_path) -> None:
    pub = next(p for p in publications(lab) if p["what"] == "checkpoint")
    manifest = json.loads(s3.get(*s3_key(pub["url"])))
    victim = max(manifest["files"], key=lambda f: f["size"])  # a tensor data file
    hexd = victim["sha256"].split(":")[1]
    key = f"dvc/marin/sha256/{hexd[:2]}/{hexd[2:]}"
    original = s3.get(BUCKET, key)
    s3.put(BUCKET, key, original[:-1] + bytes([original[-1] ^ 1]))
    try:
        clone = stranger(lab, tmp_path / "check")
        train = clone.runs("train")[-1][0]["run_id"]
        r = clone.marin("verify", "--segments", "1", train)
        assert r.returncode == 1, r.stdout + r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("marin: error:") and f"s3://{BUCKET}/{key}" in line and victim["path"] in line
        assert not (clone.root / ".marin/cache/checkpoints" / train / str(pub["step"])).exists()
    finally:
        s3.put(BUCKET, key, original)


def test_a_changed_data_object_in_the_remote_is_named(lab, s3, tmp_path) -> None:
    tokens = next(p for p in publications(lab) if p["what"] == "dvc" and p["path"] == "data/tokens")
    listing = json.loads(s3.get(*s3_key(tokens["url"])))
    shard = next(e for e in listing if e["relpath"].endswith(".parquet"))
    key = f"dvc/files/md5/{shard['md5'][:2]}/{shard['md5'][2:]}"
    original = s3.get(BUCKET, key)
    s3.put(BUCKET, key, original + b"\0")
    try:
        clone = stranger(lab, tmp_path / "check")
        clone.dvc("pull", "-q", "data/tokens")  # DVC does not re-hash what it downloads
        train = clone.runs("train")[-1][0]["run_id"]
        before = (clone.root / "ledger/runs" / f"{train}.jsonl").read_bytes()
        r = clone.marin("verify", train)  # the recorded bytes are nowhere: cannot verify here, never a mismatch
        assert r.returncode == 4, r.stdout + r.stderr
        [line] = r.stderr.strip().splitlines()
        assert "cannot verify here" in line and shard["relpath"] in line and f"s3://{BUCKET}/{key}" in line, line
        assert (clone.root / "ledger/runs" / f"{train}.jsonl").read_bytes() == before  # nothing recorded
    finally:
        s3.put(BUCKET, key, original)


def test_publish_without_a_remote_says_what_to_do(trained_project) -> None:
    r = trained_project.marin("publish")
    assert r.returncode == 1
    assert r.stderr.strip().startswith("marin: error: no DVC remote is configured: `dvc remote add -d")
    assert not trained_project.runs("publish")


def test_the_datasheet_says_where_the_data_is() -> None:
    from marin.report.cards import _distribution

    assert "Not distributed" in _distribution(None) and "no DVC remote is configured" in _distribution(None)
    there = _distribution({"name": "lab", "url": "s3://bucket/dvc"})
    assert there.startswith("- Distributed through the DVC remote `lab` (`s3://bucket/dvc`)")
    assert "with the project" not in there + _distribution(None)
