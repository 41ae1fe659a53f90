"""Your own instruction data: JSONL files of ``{"messages": [{"role": ..., "content": ...}, ...]}``
(the format of HF chat datasets and the OpenAI API), one conversation per line, in a fetch
source whose extract has ``format: messages``. Every line is checked; the first bad one stops
the stage with one line naming the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from marin.config import Source
from marin.data import archive
from marin.data.chat import ROLES
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


def read(source: Source, path: Path) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(member, line number, conversation) of every line of the source's messages extracts."""
    for ex in source.extract:
        if ex.format != "messages":
            continue
        found = False
        for m in archive.open_members(path, ex.include, ex.exclude):
            found = True
            for n, line in enumerate(archive.decompressed(m, path).read().split(b"\n"), 1):
                if not line.strip():
                    continue
                why = problem(line)
                if why is not None:
                    where = m.name if path.is_file() else f"{shown(path)}: member {m.name!r}"
                    raise StageError(f"{where} line {n}: {why}; fix the line (fetch.sources[{source.name}]: "
                                     f"{source.kind}:{source.locator})")
                yield m.name, n, {"messages": json.loads(line)["messages"]}
        if not found:
            raise StageError(f"fetch.sources[{source.name}].extract[{ex.corpus}]: no member of {path.name} "
                             f"matches {list(ex.include)}; check the include patterns")


def has_messages(source: Source) -> bool:
    return any(ex.format == "messages" for ex in source.extract)
