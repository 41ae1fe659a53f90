"""Bounded work in the instructions stage (issue 38, defect 2): a ``format: messages`` source
streams line by line with curate's per-record cap (``curate.max_document_bytes``), so a
decompression bomb or a giant conversation line is refused in one line naming the file and the
line, or, with ``curate.oversize: drop``, skipped unread and counted. Each command runs as a
measured child process (tests/test_bounded.py's helpers): one line, the exit code, under 10 s
and 500 MB, the ledger valid with every earlier run file unchanged."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from tests.conftest import Project
from tests.test_bounded import bounded, gzip_stream, ledger_kept, refused, repeat, run
from tests.test_instruct import conversation, instruct_params


def with_messages(proj: Project, path: Path, **curate: object) -> None:
    """``path`` as a fetch source of format messages (kind file), fetched; curate params updated."""
    instruct_params(proj)
    params = proj.params
    params["fetch"]["sources"].append({
        "name": "chat", "kind": "file", "locator": str(path), "license": "CC0-1.0",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "extract": [{"corpus": "chat", "include": [path.name], "format": "messages"}]})
    params["curate"].update(curate)
    proj.write_params(params)
    proj.stage("fetch")


def test_a_messages_bomb_is_refused_in_one_line_naming_the_file_and_line(tmp_path: Path,
                                                                          data_project: Project) -> None:
    src = tmp_path / "bomb.jsonl.gz"
    member = gzip.compress(b"a" * (1 << 20), 9)  # concatenated members are one stream
    head = gzip.compress(b"\n".join(conversation(i) for i in range(3)) + b'\n{"messages": [{"role": "user", '
                         b'"content": "', 9)
    with open(src, "wb") as f:  # 4 GiB of 'a' in one unterminated line: the audit's case ran out of memory at 5.1 GB
        f.write(head + member * 4096)
    assert src.stat().st_size < 8 << 20
    with_messages(data_project, src)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.instructions"), 1, "bomb.jsonl.gz line 4: a record or document of",
            "over the 16,777,216-byte cap (curate.max_document_bytes)", "curate.oversize: drop")
    assert not (data_project.root / "data/instructions").exists()
    assert data_project.runs("instructions")[-1][-1]["body"]["status"] == "failed"
    ledger_kept(data_project, before)


def test_a_giant_conversation_line_is_refused_or_dropped_and_counted(tmp_path: Path, data_project: Project) -> None:
    giant = 200 << 20  # one 200 MB messages line: accepted at 694 MB of RSS before
    lines = [conversation(i) + b"\n" for i in range(5)]
    src = gzip_stream(tmp_path / "giant.jsonl.gz", [
        *lines, b'{"messages": [{"role": "user", "content": "', *repeat(b"word " * (1 << 18), giant),
        b'"}, {"role": "assistant", "content": "x"}]}\n', *lines])
    with_messages(data_project, src)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.instructions"), 1, "giant.jsonl.gz line 6: a record or document of",
            "over the 16,777,216-byte cap")
    ledger_kept(data_project, before)

    params = data_project.params
    params["curate"]["oversize"] = "drop"
    data_project.write_params(params)
    before = data_project.ledger_files()
    child = run(data_project, "-m", "pipeline.instructions")
    assert child.code == 0, child.stderr
    bounded(child)
    m = json.loads((data_project.root / "data/instructions/manifest.json").read_text())
    [s] = m["sources"]
    assert s["oversize"] == 1 and s["conversations"] == 10  # the giant line skipped unread, the rest kept
    own = [json.loads(x)["line"] for x in (data_project.root / "data/instructions/train.jsonl").read_text()
           .splitlines() if json.loads(x).get("source") == "chat"]
    assert own == [f"giant.jsonl.gz:{n}" for n in (*range(1, 6), *range(7, 12))]  # line numbers past it hold
    ledger_kept(data_project, before)
