"""A disk that fills during a stage: under ledger/runs no torn line, under data/ no half
output; either way one line on stderr naming the file and the cause, a non-zero exit, and
`marin ledger check` passes without `marin ledger repair`.

Each test mounts a small tmpfs and fills it nearly full. Mounting needs root: as another user the
tests skip; as root (CI) a mount that fails fails the test.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import Project, tiny

PAGE = 4096
FILLER = "filler.bin"


@contextmanager
def small_disk(d: Path, size_kib: int) -> Iterator[None]:
    """Mount a tmpfs of ``size_kib`` over directory ``d``, carrying its contents in; unmounted at the end."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    saved = d.with_name(d.name + ".saved")
    shutil.copytree(d, saved, symlinks=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if p.returncode != 0:  # as root (CI) the test must run: a mount that fails is a failure, not a skip
        shutil.rmtree(saved)
        pytest.fail(f"running as root, but cannot mount a tmpfs over {d}: {p.stderr.strip()}; run the tests where "
                    "root may mount (a container needs CAP_SYS_ADMIN), or as a user other than root to skip them")
    try:
        shutil.copytree(saved, d, symlinks=True, dirs_exist_ok=True)
        yield
    finally:
        subprocess.run(["umount", str(d)], check=True)
        shutil.rmtree(saved)


def fill(d: Path, leave_pages: int) -> None:
    """Fill the file system of ``d`` until exactly ``leave_pages`` pages stay free."""
    fd = os.open(d / FILLER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while os.write(fd, b"\0" * PAGE) == PAGE:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    size = (d / FILLER).stat().st_size
    os.truncate(d / FILLER, size - leave_pages * PAGE)
    st = os.statvfs(d)
    assert st.f_bavail * st.f_frsize == leave_pages * PAGE


def assert_no_torn_line(proj: Project) -> None:
    for name, data in proj.ledger_files().items():
        assert data.endswith(b"\n"), f"{name} ends in a torn line"
        for line in data.splitlines():
            json.loads(line)


def one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1, p.stderr
    assert len(lines) == 1 and lines[0].startswith("marin: error: "), p.stderr  # no traceback
    return lines[0]


@pytest.mark.slow
def test_full_ledger_disk_leaves_no_torn_line(data_project: Project) -> None:
    runs_dir = data_project.root / "ledger" / "runs"
    before = data_project.ledger_files()
    curated = data_project.tree("data/curated")
    prev = next(d for n, d in before.items() if n.startswith("curate-")).splitlines(keepends=True)
    # Leave room for run.started and its input, not for all the outputs: an output record
    # fails halfway through its line, then run.finished (failed) fails too.
    head, body = len(b"".join(prev[:2])), len(b"".join(prev[:-1]))
    # run.started (its code closure file by file) can end in the same page as the outputs: a recorded
    # variable pads it so that a page boundary falls between the input record and the first output.
    pad = math.ceil((head + 200) / PAGE) * PAGE - head - 300
    data_project.env["MARIN_TEST_PAD"] = "x" * pad
    head, body = head + pad + len(',"MARIN_TEST_PAD":""'), body + pad + len(',"MARIN_TEST_PAD":""')
    pages = math.ceil((head + 200) / PAGE)
    assert pages * PAGE < body - 200, "the records are too small for this test's page arithmetic"
    with small_disk(runs_dir, 256):
        fill(runs_dir, pages)
        line = one_error_line(data_project.stage("curate", check=False))
        after = data_project.ledger_files()
        new = [n for n in after if n not in before]
        assert len(new) == 1
        assert re.fullmatch(
            rf"marin: error: ledger/runs/{re.escape(new[0])}: cannot append the output record: no space left "
            r"on device; nothing was written; free space \(or fix the disk\) and rerun the stage", line), line
        assert_no_torn_line(data_project)
        assert {n: after[n] for n in before} == before  # earlier runs untouched
        kinds = [json.loads(x)["kind"] for x in after[new[0]].splitlines()]
        assert kinds[:2] == ["run.started", "input"] and "run.finished" not in kinds  # honestly unfinished
        assert data_project.tree("data/curated") == curated
        check = data_project.marin("ledger", "check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "truncated" not in check.stderr


@pytest.mark.slow
@pytest.mark.parametrize("stage, shown", [
    ("curate", "data/curated"),  # the Parquet writer hits the full disk
    ("tokenize", "data/tokens/tokenizer.json"),  # fsutil.write_bytes inside the atomic directory does
])
def test_full_data_disk_leaves_the_previous_outputs(data_project: Project, stage: str, shown: str) -> None:
    data = data_project.root / "data"
    before = data_project.tree("data")
    runs = len(data_project.ledger_files())
    with small_disk(data, 512):
        fill(data, 2)
        line = one_error_line(data_project.stage(stage, check=False))
        assert line == (f"marin: error: {shown}: cannot write: no space left on device; the previous version "
                        "is left as it was and nothing half-written remains; free space (or fix the disk) "
                        "and rerun the stage")
        after = {k: v for k, v in data_project.tree("data").items() if k != FILLER}
        assert after == before  # byte-identical, and no temporary directory or .old left
        assert sorted(p.name for p in data.iterdir()) == sorted(["raw", "curated", "tokens", FILLER])
        log = data_project.runs(stage)[-1]
        assert len(data_project.ledger_files()) == runs + 1
        assert log[-1]["kind"] == "run.finished" and log[-1]["body"]["status"] == "failed"
        assert "no space left on device" in log[-1]["body"]["error"]
        assert_no_torn_line(data_project)
        check = data_project.marin("ledger", "check")
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_disk_error_no_writer_converted_is_still_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from marin.stages.runner import guarded

    def fail(e: OSError) -> Callable[[], int]:
        def fn() -> int:
            raise e
        return fn

    assert guarded(fail(OSError(errno.ENOSPC, "No space left on device", "data/x.bin"))) == 1
    assert capsys.readouterr().err == (
        "marin: error: data/x.bin: no space left on device; free space (or fix the disk) and rerun\n")
    pyarrow = OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert guarded(fail(pyarrow)) == 1
    assert capsys.readouterr().err == "marin: error: no space left on device; free space (or fix the disk) and rerun\n"
    with pytest.raises(OSError):
        guarded(fail(pyarrow), verbose=True)  # --verbose keeps the traceback
    with pytest.raises(FileNotFoundError):
        guarded(fail(FileNotFoundError(errno.ENOENT, "No such file or directory", "x")))  # not a disk failure


@pytest.mark.slow
def test_full_checkpoint_disk_during_train_is_one_line(data_project: Project) -> None:
    """orbax writes a checkpoint from background threads, and tensorstore's error is a ValueError
    that only quotes the system's words: still one line naming the step's folder, no folder of
    the failed step left, the run recorded as failed."""
    tiny(data_project)
    ckpts = data_project.root / "checkpoints"
    ckpts.mkdir()
    with small_disk(ckpts, 512):
        fill(ckpts, 4)  # room for none of a checkpoint's files in full
        p = data_project.stage("train", check=False)
        line = one_error_line(p)
        [log] = data_project.runs("train")
        run_id = log[0]["run_id"]
        assert line == (f"marin: error: checkpoints/{run_id}/4: cannot write: no space left on device; the previous "
                        "version is left as it was and nothing half-written remains; free space (or fix the disk) "
                        "and rerun the stage"), p.stderr
        assert not list(ckpts.glob(f"{run_id}/*")), list(ckpts.glob(f"{run_id}/*"))  # no step, no orbax temp folder
        assert log[-1]["kind"] == "run.finished" and log[-1]["body"]["status"] == "failed"
        assert "no space left on device" in log[-1]["body"]["error"]
        assert_no_torn_line(data_project)
        check = data_project.marin("ledger", "check")
        assert check.returncode == 0, check.stdout + check.stderr


def test_checkpoint_reports_are_held_during_a_save_and_dropped_after_a_disk_failure() -> None:
    """The hooks Checkpoints installs once: a report passes outside a save, waits for a save that works,
    and is dropped with the save that fails on the disk and ever after; the stage's WriteError still shows."""
    import logging
    import sys
    import threading

    from marin import fsutil
    from marin.train.checkpoint import _Reports

    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    absl = logging.getLogger("absl")
    absl.addHandler(handler)
    before = sys.excepthook, threading.excepthook, sys.unraisablehook
    threading.excepthook = lambda a: seen.append(f"thread: {a.exc_value}")
    sys.excepthook = lambda t, v, tb: seen.append(f"main: {v}")
    ours = sys.excepthook, threading.excepthook, sys.unraisablehook

    def thread_fails() -> None:
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(RuntimeError("Event loop is closed")))
        t.start()
        t.join()

    try:
        for ok in (True, False):
            seen.clear()
            r = _Reports()
            r.open()
            absl.warning("outside")
            r.saving = True
            absl.warning("during")
            thread_fails()
            assert seen == ["outside"]
            r.done(failed_on_disk=not ok)
            absl.warning("after")
            thread_fails()
            if ok:
                assert seen == ["outside", "during", "thread: Event loop is closed", "after",
                                "thread: Event loop is closed"]
            else:
                assert seen == ["outside"]
                e = fsutil.WriteError(Path("checkpoints/r/4"), "no space left on device")
                sys.excepthook(type(e), e, None)  # --verbose: the stage's own error keeps its traceback
                assert seen[-1].startswith("main: checkpoints/r/4: cannot write: no space left on device")
            r.close()
            assert ((sys.excepthook, threading.excepthook, sys.unraisablehook) == ours) is ok  # kept after a failure
            sys.excepthook, threading.excepthook, sys.unraisablehook = ours
            for f in list(absl.filters):
                absl.removeFilter(f)
    finally:
        sys.excepthook, threading.excepthook, sys.unraisablehook = before
        absl.removeHandler(handler)
