"""The progress bars: shown for long steps only, so a quick step (or refusal) prints just its result."""

import pytest

from marin.progress import bar, meter


def test_a_quick_step_draws_no_bar_by_default(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MARIN_PROGRESS", "on")
    assert list(bar(range(3), "curate", unit=" shards")) == [0, 1, 2]
    with meter("tokenize train", total=5) as m:
        m.update(5)
    assert capsys.readouterr().err == ""


def test_always_and_off(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MARIN_PROGRESS", "always")
    with meter("tokenize train", total=5, unit=" docs") as m:
        m.update(5)
    err = capsys.readouterr().err
    assert "tokenize train: 100%" in err and "5/5" in err
    monkeypatch.setenv("MARIN_PROGRESS", "off")
    assert list(bar(range(2), "curate")) == [0, 1]
    assert capsys.readouterr().err == ""
