"""Bounded network operations: every request marin makes has a connect timeout, a read timeout
and a bounded number of tries, and a failure is one line naming the URL. A download also has a
total deadline over all its tries, a rate floor within each (a server that trickles a byte a
second never times out a read) and a byte cap, and speaks http(s) only: no ``file:``
(``/dev/zero`` never ends), ``ftp:`` or ``data:`` address, and no redirect to one.

The bounds come from params.yaml's optional ``network`` section (:class:`marin.config.NetworkParams`;
defaults there). The same approach, set up here, serves each client: urllib for ``url``
sources (:func:`download`), pip for ``pypi`` ones (:func:`pip_args`), botocore and s3fs for an
S3 DVC remote (:func:`bound_dvc_remotes`), and MLflow's REST client (:func:`mlflow_env`).
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from marin.config import NetworkParams
from marin.errors import MarinError

T = TypeVar("T")
TRANSIENT = (TimeoutError, socket.timeout, ConnectionError, urllib.error.URLError, http.client.HTTPException)
DEFAULT = NetworkParams()
SCHEMES = ("http", "https")
MLFLOW_TIMEOUT_S = 10  # after a stage, MLflow is best effort: a short bound, no retry (the ledger has it all)
TICK = 0.25  # seconds between two looks at a download's deadline and rate


class NetworkError(MarinError):
    """A server did not answer within the bounds, or refused, after every try."""


def settings(root: Path) -> NetworkParams:
    """The project's ``network`` params (params.yaml at ``root``), else the defaults."""
    if not (root / "params.yaml").is_file():
        return DEFAULT
    from marin import config

    return config.load(root / "params.yaml").network


def bounds(t: NetworkParams) -> str:
    return (f"connect timeout {t.connect_timeout_s:g} s, read timeout {t.read_timeout_s:g} s, {1 + t.retries} "
            "tries (network.* in params.yaml)")


class RateFloor:
    """The bytes of a try's last ``min_rate_window_s`` against ``min_rate_bytes_s``: ``add`` counts
    what arrived, ``check`` (every TICK) gives the rate seen when it is under the floor."""

    def __init__(self, t: NetworkParams) -> None:
        self.floor, self.window, self.got = t.min_rate_bytes_s, t.min_rate_window_s, 0
        self._marks: collections.deque[tuple[float, int]] | None = None  # (time, bytes so far); None: not counting

    def start(self) -> None:
        """A try begins: the window counts from now (a retry starts over, as its bytes do)."""
        self._marks = collections.deque([(time.monotonic(), self.got)])

    def stop(self) -> None:
        self._marks = None

    def add(self, n: int) -> None:
        self.got += n

    def check(self) -> float | None:
        marks, now, got = self._marks, time.monotonic(), self.got
        if marks is None or self.floor <= 0:
            return None
        while len(marks) > 1 and marks[1][0] <= now - self.window:  # the first mark: the last one a window ago
            marks.popleft()
        marks.append((now, got))
        t0, n0 = marks[0]
        if now - t0 < self.window:
            return None
        rate = (got - n0) / (now - t0)
        return rate if rate < self.floor else None


def too_slow(url: str, rate: float, t: NetworkParams) -> str:
    return (f"{url}: {rate:.0f} bytes/s over the last {t.min_rate_window_s:g} s, under network.min_rate_bytes_s "
            f"({t.min_rate_bytes_s:g} bytes/s); check the server, or lower network.min_rate_bytes_s in params.yaml "
            "(0: no floor)")


class Deadline:
    """The end of one download: ``total_timeout_s`` over every try, or a try under the rate floor.
    Either way each socket the download opened is shut, which wakes a read that is blocked, or
    crawling, at once."""

    def __init__(self, t: NetworkParams) -> None:
        self.at, self.passed, self.slow = time.monotonic() + t.total_timeout_s, False, None
        self.floor = RateFloor(t)
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="download deadline", daemon=True).start()

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            if self.ended():
                _shut(sock)

    def ended(self) -> bool:
        return self.passed or self.slow is not None

    def error(self, url: str, t: NetworkParams, what: str) -> NetworkError | None:
        """Why the download ended (the rate floor, the deadline), or None while it runs."""
        if self.slow is not None:
            return NetworkError(f"{what}{too_slow(url, self.slow, t)}")
        return _late(url, t, what) if self.passed else None

    def _watch(self) -> None:
        while not self._closed.wait(min(TICK, self.left())):
            slow = self.floor.check()
            if slow is None and self.left() > 0:
                continue
            with self._lock:
                self.slow, self.passed = slow, slow is None
                for sock in self._socks:
                    _shut(sock)
            return

    def close(self) -> None:
        self._closed.set()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        # the plain socket's shutdown, also for TLS: SSLSocket.shutdown would drop its state under a reader
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _late(url: str, t: NetworkParams, what: str) -> NetworkError:
    return NetworkError(f"{what}{url}: not finished within network.total_timeout_s ({t.total_timeout_s:g} s, every "
                        "try included); check the server, or raise network.total_timeout_s in params.yaml")


def retrying(url: str, fn: Callable[[], T], t: NetworkParams, transient: tuple[type[BaseException], ...] = TRANSIENT,
             what: str = "", deadline: Deadline | None = None) -> T:
    """``fn()``, tried again after a transient error at most ``t.retries`` times (backoff 0.5 s,
    1 s, 2 s ... at most 5 s), never past ``deadline``; then one NetworkError naming ``url`` and the bounds."""
    for i in range(t.retries + 1):
        try:
            return fn()
        except urllib.error.HTTPError as e:  # the server answered: only its own trouble is worth another try
            if e.code < 500 or i == t.retries:
                raise NetworkError(f"{what}{url}: HTTP {e.code} {e.reason}; check the URL") from None
        except transient as e:
            if deadline is not None and (ended := deadline.error(url, t, what)):
                raise ended from None
            if i == t.retries:
                raise NetworkError(f"{what}{url}: no answer ({cause(e)}) after {bounds(t)}; check the URL and the "
                                   "server, or raise the bounds") from None
        pause = min(0.5 * 2**i, 5.0)
        if deadline is not None and deadline.left() <= pause:
            raise _late(url, t, what)
        time.sleep(pause)
    raise AssertionError("unreachable")


def cause(e: BaseException) -> str:
    """One short phrase for a network error (a timeout, a refused connection, the reason)."""
    inner = getattr(e, "reason", None) or e
    return (str(inner).strip().splitlines() or [type(inner).__name__])[0][:200] or type(inner).__name__


class _Read(http.client.HTTPConnection):
    """A connection whose socket waits ``read_s`` for each read once it is connected, and is shut
    at the ``deadline``."""

    read_s: float
    deadline: Deadline | None

    def connect(self) -> None:
        super().connect()  # connects within the connect timeout (HTTPS: and its handshake)
        self.sock.settimeout(self.read_s)
        if self.deadline is not None:
            self.deadline.watch(self.sock)


class _HTTP(_Read, http.client.HTTPConnection):
    pass


class _HTTPS(_Read, http.client.HTTPSConnection):
    pass


class _Handler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    def __init__(self, read_s: float, deadline: Deadline | None = None):
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self)
        self.read_s, self.deadline = read_s, deadline

    def http_open(self, req: Any) -> Any:
        return self.do_open(self._conn(_HTTP), req)

    def https_open(self, req: Any) -> Any:
        return self.do_open(self._conn(_HTTPS), req, context=self._context)  # type: ignore[attr-defined]

    def _conn(self, cls: type) -> Any:
        return type(cls.__name__, (cls,), {"read_s": self.read_s, "deadline": self.deadline})


class _Redirect(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s) only (urllib's own would follow one to ``ftp:``, outside every bound)."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in SCHEMES:
            raise NetworkError(f"{req.full_url}: redirected to {newurl[:200]}; only http(s) addresses are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def scheme_problem(url: str) -> str | None:
    """Why ``url`` is not an address :func:`download` reads (http or https), or None."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme in SCHEMES:
        return None
    if scheme == "file":
        return "a file: address is local data; use kind local for a directory, or kind file for one file"
    return f"{scheme or 'no'} scheme; a url source is an http:// or https:// address"


def _opener(t: NetworkParams, deadline: Deadline) -> urllib.request.OpenerDirector:
    """urllib for http(s) alone: no file, ftp or data handler, so nothing reaches one."""
    opener = urllib.request.OpenerDirector()
    for h in (urllib.request.ProxyHandler(), _Handler(t.read_timeout_s, deadline), _Redirect(),
              urllib.request.HTTPDefaultErrorHandler(), urllib.request.HTTPErrorProcessor()):
        opener.add_handler(h)
    return opener


def _copy(r: Any, f: Any, url: str, t: NetworkParams, what: str, floor: RateFloor) -> None:
    """The body of ``r`` into ``f``, refused past ``t.max_bytes`` (a declared length at once), counted
    for the rate ``floor``."""
    declared = (r.headers.get("Content-Length") or "").strip()
    if declared.isdigit() and int(declared) > t.max_bytes:
        raise _too_big(url, t, what, f"the server declares {int(declared)} bytes, more than")
    n = 0
    while chunk := r.read1(1 << 20):  # read1: whatever has arrived, so the deadline is seen between reads too
        n += len(chunk)
        floor.add(len(chunk))
        if n > t.max_bytes:
            raise _too_big(url, t, what, "the server sent more than")
        f.write(chunk)


def _too_big(url: str, t: NetworkParams, what: str, did: str) -> NetworkError:
    return NetworkError(f"{what}{url}: {did} network.max_bytes ({t.max_bytes} bytes); refusing the download "
                        "(nothing kept); raise network.max_bytes in params.yaml if the source is that big")


def download(url: str, out: Path, t: NetworkParams, what: str = "") -> None:
    """``url`` (http or https) into the file ``out``, within the bounds: each try's timeouts, at
    most ``t.max_bytes``, at least ``t.min_rate_bytes_s`` over each window of a try, and
    ``t.total_timeout_s`` over all tries; a retry starts over."""
    if problem := scheme_problem(url):
        raise NetworkError(f"{what}{url[:200]}: {problem}")
    deadline = Deadline(t)
    opener = _opener(t, deadline)

    def once() -> None:
        deadline.floor.start()
        try:
            with opener.open(url, timeout=max(0.001, min(t.connect_timeout_s, deadline.left()))) as r, \
                    open(out, "wb") as f:
                _copy(r, f, url, t, what, deadline.floor)
        finally:
            deadline.floor.stop()  # the backoff between tries is not a slow transfer
        if ended := deadline.error(url, t, what):  # shut while reading: what arrived may be only a part
            raise ended

    try:
        retrying(url, once, t, what=what, deadline=deadline)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    finally:
        deadline.close()


def pip_args(t: NetworkParams) -> list[str]:
    """pip's own bounds: its socket timeout and its retries."""
    return ["--timeout", f"{max(t.connect_timeout_s, t.read_timeout_s):g}", "--retries", str(t.retries)]


def bound_dvc_remotes(config: Any, t: NetworkParams) -> None:
    """Give every S3 remote in a DVC repo's config the timeouts (unless .dvc/config sets them),
    and botocore and s3fs the tries: botocore tries ``1 + retries`` times, s3fs once around it
    (its own default is 5 tries of each botocore call: 15 calls in all)."""
    for remote in config.get("remote", {}).values():
        if str(remote.get("url", "")).startswith("s3://"):
            remote.setdefault("connect_timeout", max(1, round(t.connect_timeout_s)))
            remote.setdefault("read_timeout", max(1, round(t.read_timeout_s)))
    os.environ.setdefault("AWS_MAX_ATTEMPTS", str(1 + t.retries))  # as for MLflow: the environment wins
    os.environ.setdefault("AWS_RETRY_MODE", "standard")
    try:
        import s3fs
    except ImportError:  # no S3 support installed: nothing to bound
        return
    s3fs.S3FileSystem.retries = 1


def mlflow_env() -> None:
    """MLflow's REST client, where the environment does not set it: a short timeout, no retry."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(MLFLOW_TIMEOUT_S))
