"""pip under marin's rate floor. pip bounds each read (``--timeout``) and its tries, but has no
floor: a server that trickles an sdist a byte a second keeps every read alive until the total
deadline. ``python -m marin.pipfloor RATE WINDOW PIP-ARGS...`` runs pip with the bytes its sockets
receive counted while it reads a download's body (pip's ``response_chunks``); a window under the
floor ends pip at once with one line on stderr (after :data:`MARK`) and exit code :data:`SLOW`. pip
is then left mid-download, so the caller gives it a TMPDIR of its own and removes it. A pip without
``response_chunks`` runs without the floor, still within the caller's total deadline.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from marin import net
from marin.config import NetworkParams

SLOW = 75  # pip's own codes are 0-23
MARK = "marin pip floor: "


def command(t: NetworkParams) -> list[str]:
    """The start of a command line that runs pip (its arguments follow) under ``t``'s rate floor."""
    return [sys.executable, "-m", __name__, repr(t.min_rate_bytes_s), repr(t.min_rate_window_s)]


def slow_line(stderr: str) -> str:
    """What the floor said (the URL, the rate seen, the knob), from pip's stderr."""
    return next((x[len(MARK):] for x in stderr.splitlines() if x.startswith(MARK)), "its server: under the rate floor")


def _count_sockets(floor: net.RateFloor) -> None:
    """Every byte a socket file receives (http.client's, TLS included) counted for ``floor``."""
    readinto = socket.SocketIO.readinto

    def counted(self: socket.SocketIO, b: Any) -> int | None:
        n = readinto(self, b)
        if n:
            floor.add(n)
        return n

    socket.SocketIO.readinto = counted  # pyright: ignore[reportAttributeAccessIssue]


def _bracket_downloads(floor: net.RateFloor, url: list[str]) -> bool:
    """The floor counts only while pip reads a download's body (not while it builds metadata)."""
    try:
        from pip._internal.network import download
        chunks = download.response_chunks  # pyright: ignore[reportPrivateImportUsage]
    except (ImportError, AttributeError):  # another pip: no floor, the total deadline still holds
        return False

    def bracketed(response: Any, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        url[0] = str(getattr(response, "url", "") or "a pip download")
        floor.start()
        try:
            yield from chunks(response, *args, **kwargs)
        finally:
            floor.stop()

    download.response_chunks = bracketed  # pyright: ignore[reportPrivateImportUsage]
    return True


def _watch(floor: net.RateFloor, t: NetworkParams, url: list[str]) -> None:
    while True:
        time.sleep(net.TICK)
        if (rate := floor.check()) is not None:
            sys.stderr.write(f"{MARK}{net.too_slow(url[0], rate, t)}\n")
            sys.stderr.flush()
            os._exit(SLOW)  # pip's threads and its half-written temporary files with it: the caller's TMPDIR


def main(argv: list[str]) -> int:
    t = NetworkParams(min_rate_bytes_s=float(argv[0]), min_rate_window_s=float(argv[1]))
    floor, url = net.RateFloor(t), [""]
    if _bracket_downloads(floor, url):
        _count_sockets(floor)
        threading.Thread(target=_watch, args=(floor, t, url), name="pip rate floor", daemon=True).start()
    from pip._internal.cli.main import main as pip

    return pip(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
