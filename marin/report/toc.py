"""Heading ids and a table of contents for report.md and report.html.

Each ``##`` and ``###`` heading of report.md gets an explicit anchor on the line before it
(``<a id="..."></a>``, as the Sources appendix already had), so the ids are the same whatever renders
the Markdown; the ids are GitHub's slugs of the heading text (lower case, punctuation dropped, spaces
as hyphens), a repeat numbered ``-1``, ``-2`` as GitHub does. The contents list goes after the title's
paragraph. In report.html the anchor moves onto the heading itself (``<h2 id="...">``).
"""

from __future__ import annotations

import re

ANCHOR = re.compile(r'^<a id="([^"]+)"></a>$')
HEADING = re.compile(r"^(#{2,3}) (.+)$")
HTML_ANCHOR = re.compile(r'<p><a id="([^"]+)"></a></p>\n<(h[23])>')
CONTENTS = "Contents"


def plain(text: str) -> str:
    """A heading's text without its Markdown links (a contents entry cannot hold a link)."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)


def slug(text: str) -> str:
    """GitHub's heading id: links and code marks dropped, lower case, punctuation out, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", plain(text).replace("`", "").strip().lower()).replace(" ", "-")


def _unique(base: str, used: set[str]) -> str:
    found, n = base, 0
    while found in used:
        n += 1
        found = f"{base}-{n}"
    used.add(found)
    return found


def with_toc(md: str) -> str:
    """report.md with an anchor before each ``##``/``###`` heading and a contents list after the title's paragraph."""
    lines = md.split("\n")
    used = {m.group(1) for m in map(ANCHOR.match, lines) if m}
    out: list[str] = []
    entries: list[tuple[int, str, str]] = []  # (level, text, id)
    fenced = False
    for line in lines:
        fenced ^= line.startswith("```")
        m = None if fenced else HEADING.match(line)
        if m is None:
            out.append(line)
            continue
        prev = next((x for x in reversed(out) if x), "")
        given = ANCHOR.match(prev)
        hid = given.group(1) if given else _unique(slug(m.group(2)), used)
        if not given:
            out += [f'<a id="{hid}"></a>', ""]
        out.append(line)
        entries.append((len(m.group(1)), m.group(2), hid))
    toc = [f"**{CONTENTS}**", "", *_entries(entries)]
    first = next(i for i, x in enumerate(out) if i > 0 and not x and out[i - 1] and not out[i - 1].startswith("#"))
    return "\n".join(out[: first + 1] + toc + [""] + out[first + 1:])


def _entries(entries: list[tuple[int, str, str]]) -> list[str]:
    """One list item per ``##`` heading, its ``###`` headings on the same line (a short list on a long page)."""
    out: list[str] = []
    for level, text, hid in entries:
        link = f"[{plain(text)}](#{hid})"
        if level == 2 or not out:
            out.append(f"- {link}")
        else:
            out[-1] += (": " if out[-1].count("](#") == 1 else " · ") + link
    return out


def heading_ids(page: str) -> str:
    """report.html with each heading's anchor moved onto the heading: ``<h2 id="...">``."""
    return HTML_ANCHOR.sub(r'<\2 id="\1">', page)
