"""The one bounded reader: every file the product opens is read here, under a cap for its kind.

A file is opened only if it is a regular file (never a fifo, a device or a link: ``/dev/zero`` and a
fifo are refused at once, see :func:`marin.fsutil.open_regular`), refused by its size before a byte is
read, and read for at most its cap plus one byte (a file can grow after ``fstat``). Files of records,
one a line (run files, listings, task data), are streamed with a cap per line as well, so a 512 MiB
line costs a 16 MiB buffer, not the line. tests/test_no_unbounded_reads.py checks that no other module
reads a whole file or a whole line.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, Literal, NamedTuple

from marin.errors import MarinError
from marin.fsutil import open_regular, shown

KiB, MiB = 1 << 10, 1 << 20


class Cap(NamedTuple):
    size: int  # bytes in the whole file
    line: int  # bytes in one line, newline included (files of records); the size cap otherwise
    what: str  # what the file is, for messages
    fix: str  # what to do about a file over the cap


# what a file is read as: one a key of CAPS (tests/test_no_unbounded_reads.py holds the two the same)
Kind = Literal["run", "listing", "snapshot", "vsa", "trust", "key", "params", "tokenizer", "task", "conversations",
               "config", "report", "manifest", "dvc_dir", "json", "samples", "text", "rounding_log", "published",
               "model_config", "weights"]

CAPS: dict[Kind, Cap] = {
    # a run's records: a long training run's metrics stay far below (about 300 bytes a step); the
    # largest record, an output naming 10,000 files inline (marin.ledger.run.MAX_ENTRIES), is ~2 MB
    "run": Cap(256 * MiB, 16 * MiB, "a run file", "move it out of ledger/runs/ and run `marin ledger check`"),
    "listing": Cap(4096 * MiB, 64 * KiB, "a listing file", "restore ledger/listings/ from git"),
    "snapshot": Cap(1 * MiB, 1 * MiB, "a ledger snapshot",
                    "give a file from `marin ledger head --json` or a report directory"),
    "vsa": Cap(1 * MiB, 1 * MiB, "a verification summary", "remove it from verifications/"),
    "trust": Cap(1 * MiB, 1 * MiB, "a verifiers list", "list verifiers, not data (verifications/verifiers.json)"),
    "key": Cap(64 * KiB, 64 * KiB, "a key file", "point MARIN_SIGNING_KEY (or the option) at a PEM key"),
    "params": Cap(1 * MiB, 1 * MiB, "params.yaml", "trim it; the shipped one is about 5 KB"),
    "tokenizer": Cap(32 * MiB, 32 * MiB, "a tokenizer.json", "use a smaller vocabulary"),
    "task": Cap(64 * MiB, 1 * MiB, "task data", "trim the task file"),
    "conversations": Cap(1024 * MiB, 1 * MiB, "a conversations file",
                         "fewer or shorter conversations (params.yaml: instructions)"),
    "config": Cap(1 * MiB, 1 * MiB, "a config file", "regenerate it with the stage that writes it"),
    "report": Cap(64 * MiB, 64 * MiB, "a report file", "rebuild the report (marin report)"),
    "manifest": Cap(256 * MiB, 256 * MiB, "a manifest", "restore it (dvc checkout) or rerun its stage (dvc repro)"),
    "dvc_dir": Cap(256 * MiB, 256 * MiB, "a DVC directory listing", "restore the DVC cache (dvc fetch)"),
    "json": Cap(16 * MiB, 16 * MiB, "a JSON file", "regenerate it with the stage that writes it"),
    "samples": Cap(4096 * MiB, 16 * MiB, "a harness samples file", "rerun the evaluate stage (dvc repro evaluate)"),
    "text": Cap(16 * MiB, 16 * MiB, "a text file", "trim it"),
    "rounding_log": Cap(4096 * MiB, 64 * KiB, "a rounding log", "restore the run's rounding.jsonl (its checkpoints "
                        "folder, or its model folder: dvc checkout)"),
    "published": Cap(1 * MiB, 1 * MiB, "published digests", "restore the committed copy "
                     "(git checkout -- published-digests.json), the file `marin reference write` writes"),
    "model_config": Cap(4 * MiB, 4 * MiB, "a model's config", "download the model's files again"),
    # only a weights file's header is read, within marin.evaluate.reference_folder.HEADER_CAP
    "weights": Cap(1 << 40, 1 << 40, "a weights file", "use a model in shards of safetensors files"),
}


class ReadError(MarinError):
    """A file is not a regular file, or is over the cap for its kind; nothing of it was kept."""


def _over(where: str, cap: Cap, size: str, limit: int) -> str:
    return f"{where}: {size}, over the {limit:,}-byte cap for {cap.what}; it was not read; {cap.fix}"


def open_file(path: str | os.PathLike[str], kind: Kind, error: type[MarinError] = ReadError) -> BinaryIO:
    """``path`` opened for reading as a file of ``kind``: a regular file within its size cap, else
    ``error`` in one line. FileNotFoundError passes through (callers say what a missing file means)."""
    cap = CAPS[kind]
    try:
        f = open_regular(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise error(f"{shown(path)}: {_why(e)}, not {cap.what}; {cap.fix}") from None
    size = os.fstat(f.fileno()).st_size
    if size > cap.size:
        f.close()
        raise error(_over(shown(path), cap, f"{size:,} bytes", cap.size))
    return f


def _why(e: OSError) -> str:
    if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
        return "is a symbolic link"
    if e.errno == errno.EINVAL:  # open_regular's own: "is a fifo", ...
        return e.strerror or "cannot be read"
    return f"cannot be read ({os.strerror(e.errno).lower() if e.errno else e})"


@contextmanager
def opened(path: str | os.PathLike[str], kind: Kind,
           error: type[MarinError] = ReadError) -> Iterator[BinaryIO]:
    """:func:`open_file` as a context manager."""
    with open_file(path, kind, error) as f:
        yield f


def read_bytes(path: str | os.PathLike[str], kind: Kind, error: type[MarinError] = ReadError) -> bytes:
    """All of ``path``, a regular file of ``kind`` within its cap (checked before reading and while)."""
    cap = CAPS[kind]
    with opened(path, kind, error) as f:
        data = f.read(cap.size + 1)  # it may have grown since fstat
    if len(data) > cap.size:
        raise error(_over(shown(path), cap, f"over {cap.size:,} bytes", cap.size))
    return data


def read_text(path: str | os.PathLike[str], kind: Kind, error: type[MarinError] = ReadError) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a byte that is not UTF-8 is ``error`` in one line)."""
    data = read_bytes(path, kind, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{shown(path)}: not UTF-8 (byte {e.start}); {CAPS[kind].fix}") from None


def read_json(path: str | os.PathLike[str], kind: Kind = "json", error: type[MarinError] = ReadError) -> Any:
    """The JSON value in ``path`` (bounded as :func:`read_bytes`), as :func:`json.loads` gives it (the caller
    knows its shape: a schema validates it, or a typed reader reads it); unparsable JSON is ``error``."""
    import json

    try:
        return json.loads(read_bytes(path, kind, error))
    except ValueError as e:
        raise error(f"{shown(path)}: not JSON ({e}); {CAPS[kind].fix}") from None
    except RecursionError:
        raise error(f"{shown(path)}: not JSON this reader takes (nested too deeply); {CAPS[kind].fix}") from None


def lines(path: str | os.PathLike[str], kind: Kind, error: type[MarinError] = ReadError) -> Iterator[bytes]:
    """The lines of ``path``, newline kept (a last line without one is yielded as it is), streamed:
    a file over the size cap is refused before reading, and a line over the line cap when the cap
    is reached, without reading the rest of it."""
    with opened(path, kind, error) as f:
        yield from stream_lines(f, path, kind, error)


def stream_lines(f: BinaryIO, path: str | os.PathLike[str], kind: Kind,
                 error: type[MarinError] = ReadError) -> Iterator[bytes]:
    """The lines of the open file ``f`` (see :func:`lines`), within ``kind``'s caps."""
    cap, total, n = CAPS[kind], 0, 0
    while line := f.readline(cap.line + 1):
        n += 1
        total += len(line)
        if len(line) > cap.line:
            raise error(f"{shown(path)} line {n}: over the {cap.line:,}-byte cap for one line of {cap.what}; "
                        f"it was not read; {cap.fix}")
        if total > cap.size:
            raise error(_over(shown(path), cap, f"over {cap.size:,} bytes", cap.size))
        yield line
