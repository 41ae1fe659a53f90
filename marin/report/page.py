"""What a section of report.md renders from (:class:`Page`), and the Markdown helpers the sections
share: a table, a digest shortened with the whole of it on hover."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from marin.report.facts import Fact, md_escape

V = Callable[[str | None], str]  # a fact id as printed: a link to its source, "not recorded" for None


@dataclass(frozen=True)
class Page:
    """The facts (by id), the gathered document, the report's meta (params.yaml: report), and
    ``link_prefix`` for the links ``v`` makes."""

    facts: dict[str, Fact]
    doc: dict[str, Any]
    meta: dict[str, Any]
    link_prefix: str = ""

    def v(self, fid: str | None) -> str:
        """A fact as a link to its entry under Sources."""
        if fid is None:
            return "not recorded"
        return f"[{md_escape(self.facts[fid].text)}]({self.link_prefix}#{fid})"


def table(head: list[str], rows: Iterable[list[str]]) -> list[str]:
    """A Markdown table, and the blank line after it."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows),
            ""]


def short(digest: str, n: int = 12) -> str:
    """A digest as its first ``n`` hex digits, the whole digest on hover (report.json has it too)."""
    hexpart = digest.split(":", 1)[-1]
    return f'<code title="{html.escape(digest)}">{hexpart[:n]}</code>'
