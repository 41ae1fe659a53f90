"""marin.paths: project-relative paths (one helper for every 'must lie in the project' check)."""

from __future__ import annotations

from pathlib import Path

from marin.paths import within


def test_within_gives_project_relative_posix_paths_and_none_outside(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "data" / "out").symlink_to(tmp_path / "elsewhere")  # a link that leaves the project
    monkeypatch.setenv("HOME", str(root))
    assert within(root, "data/x.json") == "data/x.json"
    assert within(root, str(root / "data" / "x.json")) == "data/x.json"
    assert within(root, "data/../data/x.json") == "data/x.json"
    assert within(root, "~/data/x.json") == "data/x.json"
    assert within(root, ".") == "."
    assert within(root, "../proj2/x.json") is None
    assert within(root, str(tmp_path / "x.json")) is None
    assert within(root, "data/out/x.json") is None
