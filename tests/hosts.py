"""Hosts for the multi-host tests: Linux network namespaces that share nothing but a network.

``Hosts(["a", "b"])`` makes a bridge in the test's own namespace (its address, ``Hosts.gateway``, is
where the S3 server listens) and, per host, a network namespace joined to the bridge by a veth pair,
with its own IP, its own hostname (a UTS namespace per command: ``hostname`` and ``socket.gethostname()``
say ``host-a``), and a ``/etc/hosts`` that names every host (``ip netns exec`` bind-mounts
``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``, as DNS would on real machines). Each host gets its
own project directory from the test; nothing in the product is told another host's path.

How it maps to real machines: a namespace is a machine, its veth address is the machine's address on
the cluster network, ``Host.run`` is ``ssh host-b -- cd PROJECT && CMD``, ``Hosts.link_down`` is a
cable pulled (or a partition), and the bridge's address is the object store's. The tests run as
root (namespaces need CAP_NET_ADMIN); everything is removed on ``close`` (also after a failure).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SUBNET = "10.{}.{}"  # 10.<x>.<y>.0/24, picked per Hosts so that two test workers never collide


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def available() -> str | None:
    """Why namespaced hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "iproute2 (ip) and util-linux (unshare) are needed"
    return None


@dataclass
class Host:
    name: str  # the hostname, host-<x>
    ns: str  # the network namespace
    ip: str
    veth: str  # its end on the bridge, in the test's namespace

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as a command on this host: in its namespace, under its hostname."""
        inner = f"hostname {shlex.quote(self.name)} && exec {shlex.join(argv)}"
        return ["ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c", inner]

    def popen(self, argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(self.argv(argv), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def run(self, argv: list[str], cwd: Path, env: dict[str, str],
            timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class Hosts:
    """A bridge and one namespace per host name; a context manager that removes them all."""

    def __init__(self, names: list[str]) -> None:
        tag = secrets.token_hex(3)
        a, b = 100 + int(tag[:2], 16) % 100, int(tag[2:4], 16)
        net = SUBNET.format(a, b)
        self.bridge, self.gateway = f"mbr{tag}", f"{net}.1"
        self.hosts: dict[str, Host] = {}
        self._etc: list[Path] = []
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names):
                self._add(f"host-{name}", f"mh{tag}{name}", f"{net}.{i + 2}", f"v{tag}{name}")
            self._write_hosts_files()
        except BaseException:
            self.close()
            raise

    def _add(self, name: str, ns: str, ip: str, veth: str) -> None:
        _ip("netns", "add", ns)
        self.hosts[name] = Host(name, ns, ip, veth)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def _write_hosts_files(self) -> None:
        lines = ["127.0.0.1 localhost", f"{self.gateway} object-store"]
        lines += [f"{h.ip} {h.name}" for h in self.hosts.values()]
        for h in self.hosts.values():
            etc = Path("/etc/netns") / h.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(lines) + "\n")
            self._etc.append(etc)

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name if name.startswith("host-") else f"host-{name}"]

    def link_down(self, name: str) -> None:
        """Host ``name`` drops off the network (its cable pulled): nothing reaches it, nothing leaves."""
        _ip("link", "set", self[name].veth, "down")

    def link_up(self, name: str) -> None:
        _ip("link", "set", self[name].veth, "up")

    def gateway_down(self) -> None:
        """The object store's address gone from the network (the hosts still reach each other)."""
        _ip("addr", "del", f"{self.gateway}/24", "dev", self.bridge)

    def gateway_up(self) -> None:
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)

    def kill_all(self, name: str) -> None:
        """SIGKILL every process in host ``name``'s namespace (a host that dies)."""
        out = subprocess.run(["ip", "netns", "pids", self[name].ns], capture_output=True, text=True).stdout
        for pid in out.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)

    def close(self) -> None:
        for h in self.hosts.values():
            self.kill_all(h.name)
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", h.ns)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.bridge)
        for etc in self._etc:
            shutil.rmtree(etc, ignore_errors=True)
        self.hosts.clear()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
