"""Progress on stderr for the steps that take more than a few seconds (stdout stays the result)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def bar(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items`` with a progress bar named ``desc`` on stderr; ``MARIN_PROGRESS=off`` hides it."""
    import os

    off = os.environ.get("MARIN_PROGRESS", "on").lower() in ("0", "off", "false", "no")
    yield from tqdm(items, desc=desc, total=total, unit=unit, file=sys.stderr, disable=off, dynamic_ncols=True,
                    mininterval=0.5)
