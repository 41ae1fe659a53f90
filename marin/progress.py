"""Progress on stderr for the steps that take more than a few seconds (stdout stays the result)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def meter(desc: str, total: int | None = None, unit: str = "it", initial: int = 0, hide: bool = False) -> tqdm:
    """A progress bar named ``desc`` on stderr, advanced with ``update(n)``. It appears once a
    step has run for a second (a quick step, or a quick refusal, prints only its result);
    ``MARIN_PROGRESS=off`` hides it, ``MARIN_PROGRESS=always`` shows it from the start."""
    import os

    mode = os.environ.get("MARIN_PROGRESS", "on").lower()
    return tqdm(desc=desc, total=total, unit=unit, initial=initial, file=sys.stderr,
                disable=hide or mode in ("0", "off", "false", "no"),
                delay=0 if mode == "always" else 1.0, dynamic_ncols=True, mininterval=0.5)


def bar(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items`` with a progress bar named ``desc`` on stderr."""
    with meter(desc, total, unit) as m:
        for item in items:
            yield item
            m.update(1)
