"""mkdocs hook: the repository's Markdown pages outside ``docs/`` (README.md as the site's front page,
CONTRIBUTING.md, benchmarks/README.md) join the site as they are, so each text has one source, and every
page's relative links, written as repository paths (what GitHub follows), are turned into site paths."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

PAGES = {"README.md": "index.md", "CONTRIBUTING.md": "contributing.md", "benchmarks/README.md": "benchmarks.md"}
DOCS = "docs/"
LINK = re.compile(r"\]\(([^)\s#:]+)(#[^)\s]*)?\)")  # ](target#anchor), no scheme: a relative link


def on_files(files: Files, config: Any) -> Files:
    root = Path(config["config_file_path"]).parent
    for src, dest in PAGES.items():
        files.append(File.generated(config, dest, abs_src_path=str(root / src)))
    return files


def site_path(repo_path: str) -> str | None:
    """The page of the site that shows the repository file ``repo_path``, or None."""
    if repo_path in PAGES:
        return PAGES[repo_path]
    return repo_path[len(DOCS):] if repo_path.startswith(DOCS) else None


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    here = page.file.src_uri
    mine = next((src for src, dest in PAGES.items() if dest == here), DOCS + here)

    def relink(m: re.Match[str]) -> str:
        target = site_path(posixpath.normpath(posixpath.join(posixpath.dirname(mine), m.group(1))))
        if target is None:
            return m.group(0)  # left as written: mkdocs --strict names it if it is broken
        return f"]({posixpath.relpath(target, posixpath.dirname(here) or '.')}{m.group(2) or ''})"

    out, fenced = [], False
    for line in markdown.split("\n"):
        fenced ^= line.lstrip().startswith("```")
        out.append(line if fenced or line.lstrip().startswith("```") else LINK.sub(relink, line))
    return "\n".join(out)
