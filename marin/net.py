"""Bounded network operations: every request marin makes has a connect timeout, a read timeout
and a bounded number of tries, and a failure is one line naming the URL.

The bounds come from params.yaml's optional ``network`` section (:class:`marin.config.NetworkParams`;
defaults there). The same approach, set up here, serves each client: urllib for ``url``
sources (:func:`download`), pip for ``pypi`` ones (:func:`pip_args`), botocore and s3fs for an
S3 DVC remote (:func:`bound_dvc_remotes`), and MLflow's REST client (:func:`mlflow_env`).
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from marin.config import NetworkParams
from marin.errors import MarinError

T = TypeVar("T")
TRANSIENT = (TimeoutError, socket.timeout, ConnectionError, urllib.error.URLError, http.client.HTTPException)
DEFAULT = NetworkParams()
MLFLOW_TIMEOUT_S = 10  # after a stage, MLflow is best effort: a short bound, no retry (the ledger has it all)


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


def retrying(url: str, fn: Callable[[], T], t: NetworkParams, transient: tuple[type[BaseException], ...] = TRANSIENT,
             what: str = "") -> T:
    """``fn()``, tried again after a transient error at most ``t.retries`` times (backoff 0.5 s,
    1 s, 2 s ... at most 5 s); then one NetworkError naming ``url`` and the bounds."""
    for i in range(t.retries + 1):
        try:
            return fn()
        except urllib.error.HTTPError as e:  # the server answered: only its own trouble is worth another try
            if e.code < 500 or i == t.retries:
                raise NetworkError(f"{what}{url}: HTTP {e.code} {e.reason}; check the URL") from None
        except transient as e:
            if i == t.retries:
                raise NetworkError(f"{what}{url}: no answer ({cause(e)}) after {bounds(t)}; check the URL and the "
                                   "server, or raise the bounds") from None
        time.sleep(min(0.5 * 2**i, 5.0))
    raise AssertionError("unreachable")


def cause(e: BaseException) -> str:
    """One short phrase for a network error (a timeout, a refused connection, the reason)."""
    inner = getattr(e, "reason", None) or e
    return (str(inner).strip().splitlines() or [type(inner).__name__])[0][:200] or type(inner).__name__


class _Read:
    """A connection whose socket waits ``read_s`` for each read once it is connected."""

    read_s: float

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]  # connects within the connect timeout
        self.sock.settimeout(self.read_s)  # type: ignore[attr-defined]


class _HTTP(_Read, http.client.HTTPConnection):
    pass


class _HTTPS(_Read, http.client.HTTPSConnection):
    pass


class _Handler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    def __init__(self, read_s: float):
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self)
        self.read_s = read_s

    def http_open(self, req: Any) -> Any:
        return self.do_open(self._conn(_HTTP), req)

    def https_open(self, req: Any) -> Any:
        return self.do_open(self._conn(_HTTPS), req, context=self._context)  # type: ignore[attr-defined]

    def _conn(self, cls: type) -> Any:
        return type(cls.__name__, (cls,), {"read_s": self.read_s})


def download(url: str, out: Path, t: NetworkParams, what: str = "") -> None:
    """``url`` (http(s) or file) into the file ``out``, within the bounds; a retry starts over."""
    opener = urllib.request.build_opener(_Handler(t.read_timeout_s))

    def once() -> None:
        with opener.open(url, timeout=t.connect_timeout_s) as r, open(out, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)

    retrying(url, once, t, what=what)


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
