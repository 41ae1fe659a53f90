"""The docs: the mkdocs site builds with --strict (a broken link or anchor in any page fails it),
README.md's relative links, which mkdocs does not follow out of the site, name files that exist,
and the README stays a front door whose test command `.ci/run` can still find."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.conftest import BIN, REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")  # inline Markdown links: ](target)
SOURCES = ("mkdocs.yml", "docs", "README.md", "CONTRIBUTING.md", "benchmarks/README.md")


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([str(BIN / "mkdocs"), "build", "--strict", "-f", str(root / "mkdocs.yml"), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=300)


def relative_links(text: str) -> list[str]:
    """Link targets without a scheme, their anchors dropped (links within the page itself left out)."""
    out: list[str] = []
    for m in LINK.finditer(text):
        path = m.group(1).split("#", 1)[0]
        if path and ":" not in path:
            out.append(path)
    return out


def test_the_site_builds_strict_with_the_readme_as_its_front_page(tmp_path: Path) -> None:
    p = build(REPO, tmp_path / "site")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    index = (tmp_path / "site/index.html").read_text()
    assert "A fully open language-model lab in miniature." in index
    assert 'href="guide/own-corpus/"' in index  # the README's repository links, turned into the site's
    for page in ("guide/own-corpus", "guide/verify", "determinism", "architecture", "performance", "benchmarks",
                 "contributing"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    for rel in SOURCES:
        src, dst = REPO / rel, tmp_path / "repo" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        _ = shutil.copytree(src, dst) if src.is_dir() else shutil.copy(src, dst)
    page = tmp_path / "repo/docs/guide/verify.md"
    _ = page.write_text(page.read_text() + "\nSee [the ledger](ledger.md#no-such-heading).\n")
    p = build(tmp_path / "repo", tmp_path / "site")
    assert p.returncode != 0
    assert "#no-such-heading" in p.stderr, p.stderr


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    links = relative_links((REPO / "README.md").read_text())
    assert "docs/guide/own-corpus.md" in links and "CONTRIBUTING.md" in links
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_relative_links_keep_paths_and_drop_anchors_and_addresses() -> None:
    text = "[a](docs/x.md#h) [b](https://example.org/y.md) [c](#here) [d](../z.md)"
    assert relative_links(text) == ["docs/x.md", "../z.md"]


def test_the_readme_is_a_front_door_whose_test_command_ci_finds() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 220
    found = re.search(r"awk '([^']+)'", (REPO / ".ci/run").read_text())
    assert found, ".ci/run reads the README's test command with awk"
    program = found.group(1)
    line = subprocess.run(["awk", program, str(REPO / "README.md")], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert line.endswith("uv run pytest -n 2 --dist loadfile") and line.startswith("bash scripts/system-packages.sh")
    pipeline = readme.split("## Run the pipeline (fresh machine, one command)\n\n```bash\n", 1)[1].split("\n", 1)[0]
    assert pipeline == ("python3 -m pip install uv && uv sync --frozen && uv run marin keygen --if-missing && "
                        "uv run dvc repro && uv run marin ledger check")


def test_the_readmes_first_paragraph_names_every_stage_of_the_pipeline() -> None:
    from marin.stages.table import NAMES

    first = (REPO / "README.md").read_text().split("\n\n")[1]  # after the title
    named = re.findall(r"`([a-z_]+)`", first)
    assert sorted(set(named)) == sorted(NAMES) and f" {len(NAMES)} stages " in first
