"""Atomic writes: a failed write leaves the old version; the temporary siblings a killed
writer leaves behind are removed at the next write of the same path, a live writer's never."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from marin import fsutil
from tests.conftest import REPO, Project

HOLD = """
import sys, time
from pathlib import Path
from marin import fsutil
with fsutil.atomic_dir(Path(sys.argv[1])) as tmp:
    (tmp / "half-written.parquet").write_bytes(b"PAR1 and then nothing")
    print(tmp, flush=True)
    time.sleep(600)
"""


@contextmanager
def holder(target: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process inside ``atomic_dir(target)``, and its temporary directory; killed at the end."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = p.stdout.readline().strip() if p.stdout else ""
        assert line, "the holder process did not start"
        yield p, Path(line)
    finally:
        p.kill()
        p.wait(30)


def killed_leftover(target: Path) -> Path:
    """The temporary directory of a writer SIGKILLed inside ``atomic_dir(target)``."""
    with holder(target) as (p, tmp):
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    assert tmp.is_dir()  # what a killed stage leaves behind today
    return tmp


def test_atomic_dir_replaces_whole_and_keeps_no_lock_file(tmp_path: Path) -> None:
    out = tmp_path / "tokens"
    with fsutil.atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with fsutil.atomic_dir(out) as tmp:
        (tmp / "b").write_text("2")
        fsutil.write_bytes(tmp / "c.json", b"{}")
    assert sorted(p.name for p in out.iterdir()) == ["b", "c.json"]  # nothing of ours inside (DVC hashes it)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_atomic_dir_failure_leaves_old_output_and_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "tokens"
    with fsutil.atomic_dir(out) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), fsutil.atomic_dir(out) as tmp:
        (tmp / "a").write_text("new, half")
        raise RuntimeError("stage failed")
    assert (out / "a").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens"]


def test_stale_leftovers_are_removed_at_next_start_live_ones_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "data"
    out = data / "tokens"
    with fsutil.atomic_dir(out) as tmp:
        (tmp / "a").write_text("old")
    with holder(out) as (_, live):
        stale = killed_leftover(out)
        legacy = data / ".tokens.ab12cd34.tmp"  # as the code before locks left it: no lock at all
        legacy.mkdir()
        (legacy / "x.parquet").write_bytes(b"half")
        old = data / ".tokens.old"
        old.mkdir()
        other = data / ".curated.zz99yy88.tmp"  # another output's leftover: not this call's business
        other.mkdir()
        capsys.readouterr()
        removed = fsutil.clean_stale(out)  # what atomic_dir(out) does first
        err = capsys.readouterr().err
        assert sorted(removed) == sorted([stale, legacy])
        assert not stale.exists() and not legacy.exists()
        assert live.is_dir() and (live / "half-written.parquet").is_file()  # a running stage's: kept
        assert old.is_dir() and other.is_dir()  # .old is kept while a writer is live: it may be mid-swap
        assert sorted(err.splitlines()) == sorted(
            f"marin: removed {fsutil.shown(p)}, left behind by a stage that was killed" for p in (stale, legacy)
        )
    fsutil.clean_stale(out)  # the writer was killed: its directory and .old are stale now
    assert not live.exists() and not old.exists() and (out / "a").read_text() == "old"


def test_old_version_is_put_back_if_killed_between_the_renames(tmp_path: Path) -> None:
    out = tmp_path / "tokens"
    old = tmp_path / ".tokens.old"
    old.mkdir()
    (old / "a").write_text("previous")
    fsutil.clean_stale(out)
    assert (out / "a").read_text() == "previous" and not old.exists()
    old.mkdir()
    fsutil.clean_stale(out)  # now the output exists: the set-aside copy is stale
    assert not old.exists() and (out / "a").read_text() == "previous"


def test_write_bytes_removes_its_own_stale_temps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / ".metrics.json.k3j4h5g6.tmp"
    stale.write_bytes(b'{"half": ')
    fsutil.write_bytes(tmp_path / "metrics.json", b"{}\n")
    assert not stale.exists() and "removed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


@pytest.mark.slow
def test_next_stage_start_removes_a_killed_stages_temp(data_project: Project) -> None:
    out = data_project.root / "data" / "tokens"
    before = data_project.tree("data/tokens")
    with holder(out) as (_, live):
        stale = killed_leftover(out)
        p = data_project.stage("tokenize")
        assert f"marin: removed data/{stale.name}, left behind by a stage that was killed" in p.stderr
        assert live.is_dir()
    assert not stale.exists()
    assert data_project.tree("data/tokens") == before  # same recipe, same bytes
    assert data_project.marin("ledger", "check").returncode == 0


@pytest.mark.parametrize("e, cause", [
    (OSError(errno.ENOSPC, "No space left on device"), "no space left on device"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded"),
    (OSError(errno.EROFS, "Read-only file system"), "read-only file system"),
    (OSError(errno.EIO, "Input/output error"), "input/output error"),
    (OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"), "no space left on device"),
    (OSError(errno.ENOENT, "No such file or directory"), None),
    (ValueError("No space left on device"), None),
])
def test_disk_cause(e: BaseException, cause: str | None) -> None:
    assert fsutil.disk_cause(e) == cause


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - an implicit __context__, as orbax's threads leave it
    except BaseException as e:
        return e


@pytest.mark.parametrize("e, cause", [
    (ValueError('RESOURCE_EXHAUSTED: Error writing local file "x/_sharding": Failed to write 15461 bytes to '
                "file 9: No space left on device [os_error_code='28']"), "no space left on device"),
    (_chained(RuntimeError("save failed"), OSError(errno.ENOSPC, "No space left on device")),
     "no space left on device"),
    (OSError(errno.EIO, "Input/output error"), "input/output error"),
    (_chained(RuntimeError("save failed"), KeyError("x")), None),
    (ValueError("a bad shape"), None),
])
def test_failure_cause_looks_through_the_chain_and_library_words(e: BaseException, cause: str | None) -> None:
    assert fsutil.failure_cause(e) == cause
