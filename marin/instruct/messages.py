"""Your own instruction data: JSONL files of ``{"messages": [{"role": ..., "content": ...}, ...]}``
(the format of HF chat datasets and the OpenAI API), one conversation per line, in a fetch
source whose extract has ``format: messages``. Every line is checked; the first bad one stops
the stage with one line naming the file and the line.

Lines stream as curate's JSONL does (:func:`marin.data.shards.line_chunks`): a line over
``curate.max_document_bytes`` is never held, and is refused in one line or, with
``curate.oversize: drop``, skipped unread and counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from marin.config import CurateParams, Source
from marin.data import archive
from marin.data.chat import ROLES
from marin.data.shards import Oversize, line_chunks, oversize
from marin.errors import StageError
from marin.fsutil import shown


def problem(line: bytes) -> str | None:
    """What is wrong with one line, or None."""
    try:
        rec = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 at byte {e.start}"
    except json.JSONDecodeError as e:
        return f"not JSON ({e.msg} at column {e.colno})"
    msgs = rec.get("messages") if isinstance(rec, dict) else None
    if not isinstance(msgs, list) or not msgs:
        return 'not an object with a non-empty "messages" list'
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or "role" not in m:
            return f"messages[{i}] is not an object with a role and a string content"
        if m["role"] not in ROLES:
            return f"messages[{i}] has role {m['role']!r}; roles are {', '.join(ROLES)}"
    if not any(m["role"] == "assistant" for m in msgs):
        return "no assistant turn: nothing to learn from"
    return None


def lines(stream: archive.Readable, where: str, p: CurateParams) -> Iterator[tuple[int, bytes | Oversize]]:
    """(line number, bytes) of every non-blank line of ``stream``, or an :class:`Oversize` for a
    line over the cap (refused by :func:`oversize` unless ``curate.oversize`` is drop)."""
    over = partial(_over, where, p)
    for first, chunk in line_chunks(stream, cap=p.max_document_bytes, over=over):
        if isinstance(chunk, Oversize):
            yield first, chunk
            continue
        for j, line in enumerate(chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")):
            if len(line) > p.max_document_bytes:  # ended within the block that took it past the cap
                yield first + j, over(first + j, len(line))
            elif line.strip():
                yield first + j, line


def _over(where: str, p: CurateParams, line: int, n: int) -> Oversize:
    return oversize(f"{where} line {line}", n, p)


def read(source: Source, path: Path, p: CurateParams) -> Iterator[tuple[str, int, dict[str, Any] | Oversize]]:
    """(member, line number, conversation) of every line of the source's messages extracts; an
    :class:`Oversize` instead of a conversation for a line dropped over the cap."""
    for m in members(source, path):
        where = _where(m, path)
        for n, line in lines(archive.decompressed(m, path), where, p):
            if isinstance(line, Oversize):
                yield m.name, n, line
                continue
            why = problem(line)
            if why is not None:
                raise StageError(f"{where} line {n}: {why}; fix the line (fetch.sources[{source.name}]: "
                                 f"{source.kind}:{source.locator})")
            yield m.name, n, {"messages": json.loads(line)["messages"]}


def _where(m: archive.Member, path: Path) -> str:
    return m.name if path.is_file() else f"{shown(path)}: member {m.name!r}"


def scan(source: Source, path: Path, p: CurateParams, budget: int) -> int:
    """The bytes of the source's messages members, decompressed, counted without parsing a line
    (chunks cut at line ends, at the speed of decompression); a line over the cap is refused or
    skipped as :func:`read` does. Stops once over ``budget``: the result is then over it."""
    total = 0
    for m in members(source, path):
        stream = archive.decompressed(m, path)
        for _, chunk in line_chunks(stream, cap=p.max_document_bytes, over=partial(_over, _where(m, path), p)):
            total += chunk.bytes if isinstance(chunk, Oversize) else len(chunk)
            if total > budget:
                return total
    return total


def members(source: Source, path: Path) -> Iterator[archive.Member]:
    """The members of the source's messages extracts, each extract's in path order; an extract
    that matches no member is refused."""
    for ex in source.extract:
        if ex.format != "messages":
            continue
        found = False
        for m in archive.open_members(path, ex.include, ex.exclude):
            found = True
            yield m
        if not found:
            raise StageError(f"fetch.sources[{source.name}].extract[{ex.corpus}]: no member of {path.name} "
                             f"matches {list(ex.include)}; check the include patterns")


def has_messages(source: Source) -> bool:
    return any(ex.format == "messages" for ex in source.extract)
