"""Reads switched to :mod:`marin.readers` (issue 38, defect 6): each refuses a fifo at once and a
huge sparse file unread, in one line of its module's own error class, so callers' handling holds."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from marin import hashing, model_folder
from marin.data import manifest
from marin.errors import IntegrityError, LedgerError, MarinError, StageError
from marin.evaluate import harness_run
from marin.report import check
from marin.report.facts import ReportError
from marin.stages import dvcfiles

GiB = 1 << 30


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _huge(path: Path) -> None:
    path.touch()
    os.truncate(path, 10 * GiB)


CASES: list[tuple[str, str, Callable[[Path], object], type[MarinError]]] = [
    ("model config", "config.json", model_folder.read_config, IntegrityError),
    ("manifest", "manifest.json", lambda d: manifest.read(d / "manifest.json", "tokenize"), StageError),
    ("report.json", "report.json", check._load, ReportError),
    ("dvc.lock", "dvc.lock", lambda d: dvcfiles._load(d / "dvc.lock"), LedgerError),
    ("task yaml", "task.yaml", lambda d: harness_run._task_of(d / "task.yaml"), StageError),
]


@pytest.mark.parametrize("hostile", [_fifo, _huge], ids=["fifo", "10GiB"])
@pytest.mark.parametrize("what, name, read, error", CASES, ids=[c[0] for c in CASES])
def test_a_switched_read_refuses_a_fifo_or_a_huge_file_in_one_line(tmp_path: Path, hostile, what: str, name: str,
                                                                   read, error: type[MarinError]) -> None:
    if name == "report.json":  # _load wants the envelope beside it
        from marin.report import build
        (tmp_path / build.ENVELOPE).write_text("{}")
    hostile(tmp_path / name)
    if name in ("report.json", "dvc.lock") and hostile is _fifo:  # not a file: read as absent, never opened
        read(tmp_path)
        return
    with pytest.raises(error) as e:
        read(tmp_path)
    assert "\n" not in str(e.value) and name in str(e.value), str(e.value)


def test_a_missing_model_config_still_says_so(tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match="not a readable model config"):
        model_folder.read_config(tmp_path)


def test_hashing_refuses_a_fifo_at_once(tmp_path: Path) -> None:
    _fifo(tmp_path / "f")
    with pytest.raises((OSError, MarinError)):
        hashing.file_digest(tmp_path / "f")


def test_a_conversation_line_over_its_cap_is_refused_naming_the_line(tmp_path: Path) -> None:
    from marin.instruct import sft

    class Tok:
        def id_to_token(self, i: int) -> str:
            return "<eos>"

    path = tmp_path / "train.jsonl"
    path.write_bytes(b"x" * (2 << 20) + b"\n")
    with pytest.raises(StageError, match=r"train.jsonl line 1: over the 1,048,576-byte cap") as e:
        sft.encoded(path, Tok(), 0, 8)
    assert "\n" not in str(e.value)
