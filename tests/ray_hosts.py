"""A real Ray cluster across namespaced hosts (tests/hosts.py): the head on host A, a worker on each
other host, every host with its own project directory and nothing shared with the others but the
network. As on real machines: ``ray start --head`` on A, ``ray start --address A:6379`` on B, and a
stage run on A with ``RAY_ADDRESS`` set.

Every host sees its own project directory at the same path, ``RayHosts.project`` (a bind mount in a mount namespace
of its own per command), as clones at the same path on real machines: Ray puts the driver's folder on
every worker's ``sys.path``, and on a real host B that folder is B's own checkout, never A's. So host B's
tasks import B's ``marin``, and a node with other code is a node with another checkout. Stopping is by
namespace (``Hosts.kill_all``), never ``ray stop``: that kills every Ray process on the machine, other
tests' included.
"""

from __future__ import annotations

import contextlib
import secrets
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import BIN, Project, env_for_subprocess
from tests.hosts import Host, Hosts
from tests.ray_cluster import NO_UV_HOOK, ray_processes

PORT = 6379  # each namespace has its own ports: the defaults are free on every host
# fixed, so that the raylet need not wait for the agents to report theirs
PORTS = ("--node-manager-port=52369", "--object-manager-port=52370", "--dashboard-agent-grpc-port=52366",
         "--dashboard-agent-listen-port=52365", "--runtime-env-agent-port=52367", "--metrics-export-port=52368")
# Ray 2.60's raylet gives the dashboard agent 15 s to report its port, and aborts after; on 2 loaded cores
# the agent's first import (compiling ray.dashboard) takes ~17 s, from the session's bytecode cache 2.5 s
WARM = ("import ray.dashboard.agent, ray._private.runtime_env.agent.main, ray.dashboard.utils as u; "
        "u.get_all_modules(u.DashboardAgentModule)")


@dataclass
class RayHosts:
    hosts: Hosts
    projects: dict[str, Project]  # host name -> its own project directory
    temp: Path  # each host's Ray session folder is below it (short: Ray's sockets live there)
    token: str = field(default_factory=lambda: secrets.token_hex(32))

    @property
    def head(self) -> Host:
        return next(iter(self.hosts.hosts.values()))

    @property
    def project(self) -> Path:
        """Where every host sees its own project directory."""
        return self.temp / "project"

    def argv(self, name: str, argv: list[str]) -> list[str]:
        """``argv`` on host ``name``: in its namespace, under its hostname, in its project (at ``project``)."""
        host = self.hosts[name]
        inner = (f"hostname {host.name} && mount --bind {shlex.quote(str(self.projects[host.name].root))} "
                 f"{shlex.quote(str(self.project))} && cd {shlex.quote(str(self.project))} && exec {shlex.join(argv)}")
        return ["ip", "netns", "exec", host.ns, "unshare", "--uts", "--mount", "sh", "-c", inner]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{PORT}"

    def env(self, name: str, **extra: str) -> dict[str, str]:
        """A command's environment on host ``name``: its own project's code, the cluster's token."""
        return {**env_for_subprocess(), **NO_UV_HOOK, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                "PYTHONPATH": str(self.project), "RAY_ADDRESS": self.address, **extra}

    def run(self, name: str, *argv: str, timeout: float = 900, **extra: str) -> subprocess.CompletedProcess[str]:
        """``argv`` on host ``name``, in its project directory."""
        host = self.hosts[name]
        return subprocess.run(self.argv(name, list(argv)), env=self.env(host.name, **extra), capture_output=True,
                              text=True, timeout=timeout)

    def popen(self, name: str, *argv: str, log: Path, **extra: str) -> subprocess.Popen[bytes]:
        host = self.hosts[name]
        with open(log, "wb") as out:
            return subprocess.Popen(self.argv(name, list(argv)), env=self.env(host.name, **extra), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, name: str) -> None:
        """Ray on host ``name``: the head on the first host, a worker joining it on the others (1 CPU each)."""
        host = self.hosts[name]
        role = ["--head", f"--port={PORT}", "--include-dashboard=false"] if host is self.head else \
            [f"--address={self.address}"]
        argv = [str(BIN / "ray"), "start", *role, f"--node-ip-address={host.ip}", "--num-cpus=1",
                "--disable-usage-stats", f"--temp-dir={self.temp / host.name}", *PORTS]
        for attempt in range(2):  # a raylet that lost the race with its agent is started again, once
            p = self.run(host.name, *argv, timeout=300)
            if p.returncode == 0:
                return
            self.hosts.kill_all(host.name)
            if attempt:
                raise AssertionError(f"ray start on {host.name} exited {p.returncode}:\n{p.stdout[-3000:]}\n"
                                     f"{p.stderr[-3000:]}")

    def alive(self) -> list[str]:
        """The hostnames of the cluster's live nodes, as Ray's GCS has them."""
        code = "import ray; ray.init(); print(' '.join(sorted(n['NodeManagerHostname'] for n in ray.nodes() " \
               "if n['Alive'])))"
        p = self.run(self.head.name, str(BIN / "python"), "-c", code, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.split()

    def whole(self) -> None:
        """Every host's node alive (a test that killed one brings it back before the next test)."""
        for name, host in self.hosts.hosts.items():
            if not subprocess.run(["ip", "netns", "pids", host.ns], capture_output=True, text=True).stdout.strip():
                self.start(name)
        deadline = time.monotonic() + 120
        while sorted(self.alive()) != sorted(self.hosts.hosts) and time.monotonic() < deadline:
            time.sleep(2)  # a killed node is marked dead, and the new one registered
        assert sorted(self.alive()) == sorted(self.hosts.hosts)

    def stop(self) -> None:
        """Every Ray process of every host, by namespace, and its session folder's."""
        for name in self.hosts.hosts:
            self.hosts.kill_all(name)
        for p in ray_processes(str(self.temp)):
            with contextlib.suppress(Exception):
                p.kill()


def ray_across(hosts: Hosts, projects: dict[str, Project], temp: Path) -> RayHosts:
    """Ray on every host of ``hosts`` (the bytecode of Ray's agents compiled first)."""
    cluster = RayHosts(hosts, projects, temp)
    cluster.project.mkdir()
    subprocess.run([str(BIN / "python"), "-c", WARM], env=env_for_subprocess(), capture_output=True, check=True)
    try:
        for name in hosts.hosts:
            cluster.start(name)
    except BaseException:
        cluster.stop()
        raise
    return cluster
