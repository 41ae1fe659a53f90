"""``marin publish --push REPO --revisions`` (issue 57, item 2): the export to ``main`` and every checkpoint's
revision to its branch ``step<N>``, each one commit of ``huggingface_hub``'s own ``upload_folder``; ``--dry-run``
prints what each would send and sends nothing. There is no Hub here: the pushes go to a stand-in on 127.0.0.1
(tests/fake_hub.py) through ``HF_ENDPOINT``, which keeps the bytes each branch received."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import Project
from tests.fake_hub import FakeHub

REPO = "lab/marin-tiny"


@pytest.fixture
def hub():
    server = FakeHub().start()
    yield server
    server.stop()


def test_push_sends_the_export_and_every_revision_and_a_dry_run_sends_nothing(trained_project: Project, hub: FakeHub,
                                                                             tmp_path) -> None:
    proj = trained_project
    proj.stage("export")
    proj.env.update({"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_test", "HF_HUB_OFFLINE": "0"})
    steps = sorted({r["body"]["step"] for r in proj.runs("train")[0] if r["kind"] == "checkpoint"})
    revisions = ["main", *(f"step{s}" for s in steps)]

    dry = proj.marin("publish", "--push", REPO, "--revisions", "--dry-run", check=True).stdout
    said = re.findall(rf"^would push {REPO}@(\S+): (\d+) files, ([\d,]+) bytes", dry, re.M)
    assert [r for r, _, _ in said] == revisions and len(steps) >= 2, dry
    assert "dry run: nothing sent" in dry and hub.commits == [] and hub.repos == {}

    out = tmp_path / "hub"  # kept, to compare with what arrived
    p = proj.marin("publish", "--push", REPO, "--revisions", "--hf-folder", str(out), check=True)
    assert re.findall(rf"^pushed {REPO}@(\S+): commit [0-9a-f]{{40}}$", p.stdout, re.M) == revisions, p.stdout
    assert [(c["repo"], c["revision"]) for c in hub.commits] == [(REPO, r) for r in revisions]
    entries = json.loads((tmp_path / "hub-revisions/revisions.json").read_text())
    for rev, (_, files, size) in zip(revisions, said, strict=True):
        folder = out if rev == "main" else tmp_path / "hub-revisions" / rev
        sent = {q.relative_to(folder).as_posix(): q.read_bytes() for q in folder.rglob("*") if q.is_file()}
        assert hub.repos[REPO][rev] == sent, rev  # byte for byte, as the dry run announced
        assert (len(sent), sum(map(len, sent.values()))) == (int(files), int(size.replace(",", "")))
    for e in entries:  # each revision's commit names its checkpoint's tensor digest
        [c] = [c for c in hub.commits if c["revision"] == e["revision"]]
        assert e["tensor_digest"] in c["summary"], c
    assert not [u for u in hub.unknown if not u.startswith("GET /api/agent")], hub.unknown

    hub.stop()  # the Hub gone: one line naming the repository and what to check, no traceback
    p = proj.marin("publish", "--push", REPO)
    assert p.returncode != 0 and len(p.stderr.strip().splitlines()) == 1 and f"push to {REPO} failed" in p.stderr, \
        p.stderr
    p = proj.marin("publish", "--dry-run")
    assert p.returncode != 0 and "--dry-run goes with --push REPO" in p.stderr
