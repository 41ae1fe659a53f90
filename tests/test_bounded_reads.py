"""Bounded reads outside the data stages (issue 38, defect 6): every file the product opens goes
through :mod:`marin.readers`, a regular file under a cap for its kind. Each command runs as a real
subprocess measured by tests/proc.py (one line, exit code, under 10 s and 500 MB, under an
address-space cap; see tests/test_bounded.py), and the ledger checks afterwards with every earlier
run file kept. Hostile files are sparse (``os.truncate``): 10 GiB of zeros cost no disk."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from marin import readers
from marin.errors import LedgerError
from tests.conftest import Project
from tests.test_bounded import bounded, ledger_kept, refused, run

GiB, MiB = 1 << 30, 1 << 20


def _sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    os.truncate(path, size)
    return path


def _fails(child, *words: str) -> str:
    """The FAIL line of a `ledger check` naming the hostile file; exit 1, bounded, no traceback."""
    assert child.code == 1 and "Traceback" not in child.stderr, child.stderr[-2000:]
    [line] = [x for x in child.stderr.splitlines() if x.startswith("FAIL ") and all(w in x for w in words)]
    bounded(child)
    print(f"line: {line}")
    return line


def _other_run(proj: Project) -> str:
    return sorted(proj.ledger_files())[0].removesuffix(".jsonl")


COMMANDS = [("ledger", "log"), ("ledger", "head"), ("status",), ("lineage", "RUN"), ("diff", "RUN", "huge")]


@pytest.mark.parametrize("size, words", [(10 * GiB, ("10,737,418,240 bytes", "cap for a run file")),
                                         (512 * MiB, ("536,870,912 bytes", "cap for a run file")),
                                         (64 * MiB, ("line 1", "cap for one line of a run file"))])
def test_a_huge_run_file_is_refused_by_every_ledger_command(data_project: Project, size: int,
                                                            words: tuple[str, ...]) -> None:
    """10 GiB and 512 MiB of one line: over the run file's cap, refused by its size unread; 64 MiB of
    one line: under it, refused at the record cap (16 MiB) without reading the rest of the line."""
    before, other = data_project.ledger_files(), _other_run(data_project)
    huge = _sparse(data_project.root / "ledger" / "runs" / "huge.jsonl", size)
    _fails(run(data_project, "-m", "marin.cli", "ledger", "check"), "huge.jsonl", *words)
    for argv in COMMANDS:
        argv = tuple(other if a == "RUN" else a for a in argv)
        refused(run(data_project, "-m", "marin.cli", *argv), 1, "huge.jsonl", *words)
    huge.unlink()
    ledger_kept(data_project, before)


def test_ledger_check_since_a_device_or_a_huge_file_is_refused_unread(data_project: Project) -> None:
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "marin.cli", "ledger", "check", "--since", "/dev/zero"), 1,
            "/dev/zero: is a character device, not a ledger snapshot")
    big = _sparse(data_project.root.parent / "head.json", 10 * GiB)
    refused(run(data_project, "-m", "marin.cli", "ledger", "check", "--since", str(big)), 1,
            "10,737,418,240 bytes, over the 1,048,576-byte cap for a ledger snapshot")
    ledger_kept(data_project, before)


def test_lineage_of_a_device_or_a_fifo_is_refused_at_once(data_project: Project) -> None:
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "marin.cli", "lineage", "/dev/zero"), 1, "/dev/zero: is a character device")
    fifo = data_project.root / "data" / "pipe"
    os.mkfifo(fifo)
    refused(run(data_project, "-m", "marin.cli", "lineage", "data/pipe"), 1, "data/pipe: is a fifo")
    fifo.unlink()
    ledger_kept(data_project, before)


def test_a_signing_key_of_dev_zero_is_refused_in_one_line(trained_project: Project) -> None:
    before = trained_project.ledger_files()
    trained_project.env["MARIN_SIGNING_KEY"] = "/dev/zero"
    refused(run(trained_project, "-m", "marin.cli", "report"), 1,
            "/dev/zero: is a character device, not a key file")
    big = _sparse(trained_project.root.parent / "key.pem", 10 * GiB)
    trained_project.env["MARIN_SIGNING_KEY"] = str(big)
    refused(run(trained_project, "-m", "marin.cli", "report"), 1, "over the 65,536-byte cap for a key file")
    del trained_project.env["MARIN_SIGNING_KEY"]
    ledger_kept(trained_project, before)


@pytest.mark.parametrize(("where", "what"), [("run", "cap for a verification summary"),
                                             ("verifiers.json", "cap for a verifiers list"),
                                             ("keys", "cap for a key file")])
def test_a_huge_file_under_verifications_is_refused_by_the_report(trained_project: Project, where: str,
                                                                  what: str) -> None:
    before = trained_project.ledger_files()
    fetch = next((trained_project.root / "ledger" / "runs").glob("fetch-*.jsonl")).stem
    rel = {"run": f"verifications/{fetch}/{'a' * 64}.intoto.json", "verifiers.json": "verifications/verifiers.json",
           "keys": f"verifications/keys/{'a' * 64}.pub"}[where]
    (trained_project.root / rel).parent.mkdir(parents=True, exist_ok=True)
    _sparse(trained_project.root / rel, 10 * GiB)
    refused(run(trained_project, "-m", "marin.cli", "report"), 1, rel, what)
    (trained_project.root / rel).unlink()
    ledger_kept(trained_project, before)


# -- the reader itself, in process --------------------------------------------------------------

def test_read_bytes_refuses_a_file_over_its_cap_and_what_is_not_a_regular_file(tmp_path: Path) -> None:
    ok = tmp_path / "key.pem"
    ok.write_bytes(b"k" * 100)
    assert readers.read_bytes(ok, "key") == b"k" * 100 and readers.read_text(ok, "key") == "k" * 100
    with pytest.raises(readers.ReadError, match=r"key\.pem: 70,000 bytes, over the 65,536-byte cap for a key file"):
        readers.read_bytes(_sparse(tmp_path / "key.pem", 70_000), "key")
    with pytest.raises(LedgerError, match="/dev/zero: is a character device, not a ledger snapshot"):
        readers.read_bytes("/dev/zero", "snapshot", LedgerError)
    (tmp_path / "link").symlink_to(ok)
    with pytest.raises(readers.ReadError, match="is a symbolic link"):
        readers.read_bytes(tmp_path / "link", "key")
    with pytest.raises(FileNotFoundError):
        readers.read_bytes(tmp_path / "gone", "key")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = threading.Event()

    def read() -> None:
        with pytest.raises(readers.ReadError, match="is a fifo, not a run file"):
            list(readers.lines(fifo, "run"))
        done.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(5)
    assert done.is_set(), "reading a fifo blocked"


def test_lines_stream_under_a_cap_per_line_and_keep_an_unterminated_last_line(tmp_path: Path) -> None:
    p = tmp_path / "run.jsonl"
    p.write_bytes(b'{"a":1}\n{"b":2}\ntorn')
    assert list(readers.lines(p, "run")) == [b'{"a":1}\n', b'{"b":2}\n', b"torn"]
    cap = readers.CAPS["run"].line
    p.write_bytes(b"x\n" + b"y" * (cap - 1) + b"\n" + b"z" * cap + b"\n")  # line 2 is exactly at the cap
    with pytest.raises(readers.ReadError, match=rf"run\.jsonl line 3: over the {cap:,}-byte cap for one line"):
        for _ in readers.lines(p, "run"):
            pass
