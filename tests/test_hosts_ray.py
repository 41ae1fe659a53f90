"""The data stages on a Ray cluster across two hosts that share no disk (issue 58 items 3 and 4):
the head on host A, a worker on host B, each host with its own project directory (tests/hosts.py,
tests/ray_hosts.py). curate and tokenize run from A and give the in-process engine's bytes, with
tasks on both nodes (the engine prints the nodes Ray ran them on); host B killed mid-curate, its
tasks rerun on A and the bytes are the same; ``marin launch ray`` starts the train stage on both hosts,
checkpoints on the S3 remote (moto's server on the hosts' gateway). One cluster for the module (Ray starts
slowly)."""

from __future__ import annotations

import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hosts as hostlib
from tests.conftest import BIN, Project, copy_project, tiny
from tests.ray_hosts import RayHosts, ray_across
from tests.servers import S3, S3_ENV

CURATED = ("train.parquet", "validation.parquet", "manifest.json")
# The stages with small tasks, so that the mini corpus makes tens of them (as tests/test_curate_scale.py
# and tests/test_tokenize_scale.py do): the stage's own code otherwise
SMALL = ("import marin.data.shards as sm, marin.data.tokenize as tk; sm.SHARD_BYTES = 500; "
         "tk.ENCODE_BATCH_BYTES = 1; tk.READ_ROWS = 1; from marin.stages.runner import stage_main; stage_main('{}')")
# Host B stalls in its first task after telling the test (a TCP connection to the gateway), so that the
# test kills it with tasks in flight there; elsewhere the stage's own function. Defined in __main__, so
# Ray ships the function itself to the nodes.
STALL_ON_B = """
import socket, time
import marin.data.curate as cm
import marin.data.shards as sm
sm.SHARD_BYTES = 500
shard = cm.process_shard

def stall_on_b(sh):
    if socket.gethostname() == "host-b":
        socket.create_connection(("{gateway}", {port}), timeout=30).close()
        time.sleep(3600)
    return shard(sh)

cm.process_shard = stall_on_b
from marin.stages.runner import stage_main
stage_main("curate")
"""
FAULT_TIMEOUT_S = 180  # Ray marks a dead node after ~15 s of failed health checks, then reruns its tasks


def _origin(data: Project, dest: Path, s3: S3) -> Project:
    """The session's data project with a tiny model trained on 2 processes x 2 devices, its DVC remote on
    S3 (the hosts' object store), committed: what every host clones."""
    origin = copy_project(data, dest)
    origin.env.update(S3_ENV)
    tiny(origin)
    params = origin.params
    params["runtime"].update(devices=2, processes=2)
    origin.write_params(params)
    s3.bucket("lab")
    origin.dvc("remote", "add", "-d", "lab", "s3://lab/dvc")
    origin.dvc("remote", "modify", "lab", "endpointurl", s3.url)
    origin.git("add", "-A")
    origin.git("commit", "-qm", "two hosts, a DVC remote on S3")
    return origin


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Iterator[RayHosts]:
    why = hostlib.available()
    assert why is None, f"namespaced hosts cannot be made here: {why} (the tests run as root, as .ci/run does)"
    base = tmp_path_factory.mktemp("hosts")
    temp = Path(tempfile.mkdtemp(prefix="rayh", dir="/tmp"))  # short: Ray's sockets live there
    hosts = hostlib.Hosts(["a", "b"])
    c = s3 = None
    try:
        s3 = S3(hosts.gateway).start()
        origin = _origin(_data_project, base / "origin", s3)
        projects = {h: copy_project(origin, base / h) for h in hosts.hosts}  # nothing shared
        c = ray_across(hosts, projects, temp)
        yield c
    finally:
        if c is not None:
            c.stop()
        if s3 is not None:
            s3.stop()
        hosts.close()
        shutil.rmtree(temp, ignore_errors=True)


def _tree(root: Path, rel: str, names: tuple[str, ...] | None = None) -> dict[str, bytes]:
    base = root / rel
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file() and (names is None or p.name in names)}


def _ray_engine(c: RayHosts) -> None:
    """runtime.data: ray in host A's params.yaml, for a test's data stages (``committed`` restores it)."""
    proj = c.projects["host-a"]
    params = proj.params
    params["runtime"]["data"] = {"engine": "ray", "workers": 2}
    proj.write_params(params)


@pytest.fixture(autouse=True)
def committed(cluster: RayHosts) -> Iterator[None]:
    """After each test, host A's params.yaml is the committed one again: a training run needs the hosts'
    projects to agree (commit, params, data), and tests run in any order."""
    yield
    cluster.projects["host-a"].git("checkout", "params.yaml")


def _nodes(out: str) -> dict[str, int]:
    """The engine's ``ray: N tasks on K nodes: host (ip) n, ...`` lines, summed by host."""
    seen: dict[str, int] = {}
    for line in out.splitlines():
        if line.startswith("ray: "):
            for host, n in re.findall(r"(host-\w+) \([\d.]+\) (\d+)", line):
                seen[host] = seen.get(host, 0) + int(n)
    return seen


def test_curate_and_tokenize_across_two_hosts_give_the_in_process_bytes(cluster: RayHosts,
                                                                         _data_project: Project) -> None:
    cluster.whole()
    _ray_engine(cluster)
    a, b = cluster.projects["host-a"], cluster.projects["host-b"]
    b_data = _tree(b.root, "data")
    for stage, rel, names in (("curate", "data/curated", CURATED), ("tokenize", "data/tokens", None)):
        shutil.rmtree(a.root / rel)  # made again, from A's own inputs
        p = cluster.run("a", str(BIN / "python"), "-c", SMALL.format(stage))
        assert p.returncode == 0, p.stderr[-3000:]
        assert _tree(a.root, rel, names) == _tree(_data_project.root, rel, names)  # the in-process engine's
        seen = _nodes(p.stdout)
        assert set(seen) == {"host-a", "host-b"} and min(seen.values()) >= 1, p.stdout  # Ray's own report
        started = a.runs(stage)[-1][0]["body"]
        assert started["execution"] == {"engine": "ray", "workers": 2, "ray_address": cluster.address}
    assert _tree(b.root, "data") == b_data  # B's disk is neither read nor written: its tasks get bytes
    assert a.marin("ledger", "check").returncode == 0


def test_host_b_killed_mid_curate_its_tasks_rerun_on_a(cluster: RayHosts, _data_project: Project,
                                                       tmp_path: Path) -> None:
    cluster.whole()
    _ray_engine(cluster)
    a = cluster.projects["host-a"]
    shutil.rmtree(a.root / "data/curated")
    with socket.create_server((cluster.hosts.gateway, 0)) as server:
        server.settimeout(600)
        script = STALL_ON_B.format(gateway=cluster.hosts.gateway, port=server.getsockname()[1])
        stage = cluster.popen("a", str(BIN / "python"), "-c", script, log=tmp_path / "curate.log")
        try:
            server.accept()[0].close()  # host B is running a task of the stage
            cluster.hosts.kill_all("b")  # every process of host B, SIGKILL
            killed = time.monotonic()
            rc = stage.wait(FAULT_TIMEOUT_S)
            took = time.monotonic() - killed
        finally:
            if stage.poll() is None:
                stage.kill()
    out = (tmp_path / "curate.log").read_text()
    assert rc == 0, out[-3000:]
    assert took < FAULT_TIMEOUT_S
    print(f"host B killed mid-curate: the stage finished {took:.0f} s later")
    assert _tree(a.root, "data/curated", CURATED) == _tree(_data_project.root, "data/curated", CURATED)
    assert set(_nodes(out)) == {"host-a"}, out  # every result that counted came from A
    assert a.marin("ledger", "check").returncode == 0



# As STALL_ON_B, and once host B is killed every task on A kills its own worker (the test then listens
# on a second port): Ray's retries run out, with host B dead
CRASH_ON_A = STALL_ON_B.replace("    return shard(sh)", """    try:
        socket.create_connection(("{gateway}", {crash}), timeout=5).close()
    except OSError:
        return shard(sh)
    import os
    os._exit(1)""")


def test_when_ray_cannot_recover_the_stage_fails_in_one_line_naming_the_lost_node(
        cluster: RayHosts, tmp_path: Path) -> None:
    cluster.whole()
    _ray_engine(cluster)
    a = cluster.projects["host-a"]
    before = _tree(a.root, "data/curated")
    gw = cluster.hosts.gateway
    with socket.create_server((gw, 0)) as server, socket.socket() as probe:
        probe.bind((gw, 0))
        crash = probe.getsockname()[1]
        probe.close()
        server.settimeout(600)
        script = CRASH_ON_A.format(gateway=gw, port=server.getsockname()[1], crash=crash)
        stage = cluster.popen("a", str(BIN / "python"), "-c", script, log=tmp_path / "curate.log")
        try:
            server.accept()[0].close()
            cluster.hosts.kill_all("b")
            killed = time.monotonic()
            with socket.create_server((gw, crash), backlog=1024):  # from now on, a task on A crashes its worker
                rc = stage.wait(FAULT_TIMEOUT_S)
            took = time.monotonic() - killed
        finally:
            if stage.poll() is None:
                stage.kill()
    err = [x for x in (tmp_path / "curate.log").read_text().splitlines() if x.startswith("marin: error:")]
    assert rc == 1 and len(err) == 1, (tmp_path / "curate.log").read_text()[-3000:]
    assert f"lost Ray node(s): host-b ({cluster.hosts['b'].ip}); " in err[0] and "nothing was written" in err[0], err
    assert took < FAULT_TIMEOUT_S
    print(f"host B killed and A's retries crashing: the stage failed {took:.0f} s later: {err[0]}")
    assert _tree(a.root, "data/curated") == before  # the previous output stands
    assert a.runs("curate")[-1][-1]["body"]["status"] == "failed"
    assert a.marin("ledger", "check").returncode == 0


# What each launched process sees, after joining the others through jax.distributed at the coordinator
# the launcher chose: its host, folder, variables and the number of processes JAX counts
SHOW = ("import os, socket, jax; e = os.environ; jax.distributed.initialize(e['MARIN_COORDINATOR'], "
        "int(e['MARIN_NUM_PROCESSES']), int(e['MARIN_PROCESS_ID'])); print(socket.gethostname(), os.getcwd(), "
        "e['MARIN_COORDINATOR'], e['MARIN_PROCESS_ID'], e['MARIN_NUM_PROCESSES'], jax.process_count()); "
        "jax.distributed.shutdown()")


def test_launch_ray_runs_the_command_on_every_node_as_process_i_of_n(cluster: RayHosts) -> None:
    cluster.whole()
    p = cluster.run("a", str(BIN / "python"), "-m", "marin.cli", "launch", "ray", "--per-node", "2", "--",
                    str(BIN / "python"), "-c", SHOW)  # 2 hosts x 2 processes, as the training across hosts
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    assert p.stdout.splitlines() == [f"marin launch: process {i} on {h.name} ({h.ip}) exited 0"
                                     for i, h in enumerate((a, a, b, b))]
    for i, name in enumerate(("host-a", "host-a", "host-b", "host-b")):
        root = cluster.projects[name].root  # each host's own project: its log is there, not on the other
        log = (root / f".marin/logs/launch/process-{i}.log").read_text()
        host_name, cwd, coordinator, pid, n, count = next(x for x in log.splitlines() if x.startswith(name)).split()
        assert (host_name, cwd, pid, n, count) == (name, str(cluster.project), str(i), "4", "4")
        assert coordinator.startswith(f"{a.ip}:")  # the head's address, on its own network
    give_up = 'echo "process $MARIN_PROCESS_ID gives up $WHY"; test "$MARIN_PROCESS_ID" != 1 || exit 3'
    fail = cluster.run("a", str(BIN / "python"), "-m", "marin.cli", "launch", "ray", "--env", "WHY=on purpose",
                       "--", "sh", "-c", give_up)
    assert fail.returncode == 1, fail.stdout + fail.stderr
    assert f"process 1 on host-b ({b.ip}) exited 3: process 1 gives up on purpose" in fail.stdout
    assert f"process 0 on host-a ({a.ip}) exited 0" in fail.stdout
    assert fail.stderr.strip().splitlines()[-1] == ("marin: error: process 1 of 2 exited 3; its output is "
                                                   ".marin/logs/launch/process-1.log on its node"), fail.stderr


def test_a_node_with_other_code_is_refused_in_one_line_naming_it(cluster: RayHosts) -> None:
    cluster.whole()
    _ray_engine(cluster)
    a = cluster.projects["host-a"]
    changed = cluster.projects["host-b"].root / "marin/data/filters.py"  # B's checkout, edited there
    original = changed.read_bytes()
    before = _tree(a.root, "data/curated")
    changed.write_bytes(original + b"# edited on host B\n")
    try:
        p = cluster.run("a", str(BIN / "python"), "-c", SMALL.format("curate"))
    finally:
        changed.write_bytes(original)
    b = cluster.hosts["b"]
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert p.stderr.strip().splitlines()[-1].startswith(f"marin: error: Ray node host-b ({b.ip}) runs other code "
                                                       "than this driver"), p.stderr[-2000:]
    assert _tree(a.root, "data/curated") == before


def test_a_stage_error_inside_a_task_on_b_is_the_stages_one_line(cluster: RayHosts) -> None:
    cluster.whole()
    _ray_engine(cluster)
    script = STALL_ON_B.replace('''        socket.create_connection(("{gateway}", {port}), timeout=30).close()
        time.sleep(3600)''', '''        from marin.errors import StageError
        raise StageError(f"texts/x.txt line 3: refused on {socket.gethostname()}; fix the line")''')
    p = cluster.run("a", str(BIN / "python"), "-c", script)
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    err = [x for x in p.stderr.splitlines() if x.strip() and not re.match(r"\d{4}-\d\d-\d\d ", x)]
    assert err == ["marin: error: texts/x.txt line 3: refused on host-b; fix the line"], p.stderr[-3000:]


def test_launch_ray_trains_on_both_hosts_through_the_s3_remote(cluster: RayHosts) -> None:
    cluster.whole()
    env = [f"--env={k}={v}" for k, v in S3_ENV.items()]
    p = cluster.run("a", str(BIN / "python"), "-m", "marin.cli", "launch", "ray",
                    "--env=MARIN_CHECKPOINT_REMOTE=default", *env, "--", str(BIN / "python"), "-m", "pipeline.train")
    a, b = cluster.hosts["a"], cluster.hosts["b"]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.splitlines() == [f"marin launch: process 0 on host-a ({a.ip}) exited 0",
                                     f"marin launch: process 1 on host-b ({b.ip}) exited 0"]
    run = cluster.projects["host-a"].runs("train")[-1]
    assert run[-1]["kind"] == "run.finished" and run[-1]["body"]["status"] == "succeeded"
    procs = run[0]["body"]["execution"]["processes"]
    assert [(x["process_id"], x["host"], x["ip"]) for x in procs] == [(0, "host-a", a.ip), (1, "host-b", b.ip)]
    assert all(r["body"]["stored"]["remote"] == "lab" for r in run if r["kind"] == "checkpoint")
    assert not cluster.projects["host-b"].runs("train")  # process 0 alone writes the ledger
    assert cluster.projects["host-a"].marin("ledger", "check").returncode == 0
