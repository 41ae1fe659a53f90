"""Real servers on 127.0.0.1 for the publishing and team-MLflow tests, started and stopped by them:
an S3 API (moto's server), a throwaway PostgreSQL cluster (Debian's postgresql: initdb/pg_ctl,
as the ``postgres`` user when the tests run as root), ``mlflow server`` on both, and the hostile
HTTP servers of the network bounds tests (silent, a byte a second, endless zeros)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}  # no instance-metadata lookups (seconds each)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    """moto's S3 server in a thread of the test process."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        from moto.server import ThreadedMotoServer

        self.port = free_port()
        self.url = f"http://{host}:{self.port}"  # a namespaced host's object store: tests/hosts.py's gateway
        self.server = ThreadedMotoServer(ip_address=host, port=self.port, verbose=False)

    def start(self) -> S3:
        import logging

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        os.environ.update(S3_ENV)  # boto3 in this process (the client below)
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, **{k.lower(): v for k, v in S3_ENV.items()
                                                            if k.startswith("AWS_") and "KEY" in k},
                            region_name=S3_ENV["AWS_DEFAULT_REGION"])

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def get(self, bucket: str, key: str) -> bytes:
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=bucket, Key=key, Body=data)


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} not found: apt-get install postgresql (.ci/run does)")
    return found


class Postgres:
    """A throwaway cluster in a temporary directory; trust authentication on 127.0.0.1 only."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="marin-pg-"))
        self.data = self.dir / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *cmd: str) -> None:
        subprocess.run([*self.as_user, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> Postgres:
        if self.as_user:  # postgres refuses to run as root
            shutil.chown(self.dir, "postgres")
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.dir / "log"), "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                  "-c synchronous_commit=off -c full_page_writes=off", "start")
        return self

    def uri(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.uri(name)

    def stop(self) -> None:
        try:
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def wait_http(url: str, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


class Silent:
    """A server on 127.0.0.1 that accepts every connection and never answers (nor closes it): what
    a hung or black-holed server looks like to a client."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by stop()
                return
            self.held.append(conn)

    def stop(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()

    def __enter__(self) -> Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Http:
    """An HTTP server on 127.0.0.1 that answers every request by calling ``answer(conn)``, one
    thread per connection: a file, a trickle of a byte a second, endless zeros. ``served``
    counts the requests."""

    def __init__(self, answer) -> None:
        import threading

        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.served = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed by stop()
                return
            self.conns.append(conn)
            self.served += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data and len(data) < 65536:
                got = conn.recv(4096)
                if not got:
                    return
                data += got
            self.answer(conn)
        except OSError:  # the client gave up and closed it
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()

    def __enter__(self) -> Http:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def file_answer(data: bytes):
    """A 200 with ``data`` as the body, its length declared."""
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(data) + data)
    return answer


def trickle(conn: socket.socket) -> None:
    """A 200 whose body comes a byte a second, without end: no read ever times out."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n")
    while True:
        conn.sendall(b"\0")
        time.sleep(1)


def drip(data: bytes, piece: int, every_s: float, length: bool = True):
    """A 200 with ``data`` as the body, ``piece`` bytes every ``every_s`` (its length declared or not)."""
    def answer(conn: socket.socket) -> None:
        declared = b"Content-Length: %d\r\n" % len(data) if length else b""
        conn.sendall(b"HTTP/1.1 200 OK\r\n" + declared + b"Connection: close\r\n\r\n")
        for i in range(0, len(data), piece):
            conn.sendall(data[i:i + piece])
            time.sleep(every_s)
    return answer


def page(html: str):
    """A 200 with ``html`` as a text/html body (pip's find-links page)."""
    body = html.encode()
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\nConnection: close"
                     b"\r\n\r\n" % len(body) + body)
    return answer


def zeros(conn: socket.socket) -> None:
    """A 200 whose body is zeros as fast as the client reads them, without end (no length declared)."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
    chunk = bytes(1 << 16)
    while True:
        conn.sendall(chunk)


def huge(conn: socket.socket) -> None:
    """A 200 that declares a terabyte and then sends zeros."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\nConnection: close\r\n\r\n")
    zeros_body = bytes(1 << 16)
    while True:
        conn.sendall(zeros_body)


# MLflow 3's job runner (GenAI scorers, trace archival) is 7 more processes, ~16 CPU s each time a
# server starts, beside the stage under test on 2 cores; marin uses none of it.
NO_JOBS = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a SQLite backend (or ``backend``: a team's PostgreSQL,
    with ``artifacts`` on S3 and ``env`` saying where the S3 server is: tests/test_team.py)."""

    def __init__(self, workdir: Path, backend: str | None = None, artifacts: str | None = None,
                 env: dict[str, str] | None = None):
        self.workdir, self.port, self.proc = workdir, free_port(), None
        self.uri = f"http://127.0.0.1:{self.port}"
        self.backend = backend or f"sqlite:///{self.workdir / 'server.db'}"
        self.artifacts, self.extra_env = artifacts or str(self.workdir / "artifacts"), env or {}

    def start(self) -> None:
        from tests.conftest import BIN, env_for_subprocess

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
             "--backend-store-uri", self.backend, "--artifacts-destination", self.artifacts],
            cwd=self.workdir, env={**env_for_subprocess(), **NO_JOBS, **self.extra_env}, stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "server.log", "ab"))  # noqa: SIM115 (the server's, for as long as it runs)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("mlflow server did not come up")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)
            self.proc = None

    def rest(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"{self.uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.uri}/api/2.0/mlflow/{path}", timeout=30) as r:
            return json.loads(r.read())
