"""Training on two hosts that share nothing but a network and an S3 endpoint (tests/hosts.py).

Host A runs process 0 and host B process 1 (2 devices each: the topology of the local 2 x 2 runs of
tests/test_distributed.py), each in its own project directory, checkpoints stored on S3
(MARIN_CHECKPOINT_REMOTE). One module fixture runs, once:

1. a run whose host B is killed (every process in its namespace, SIGKILL) after the first stored
   checkpoint; host A's stage must end within the heartbeat bound, naming host B;
2. its resumption on both hosts: host B has no checkpoint of its own and fetches the stored one;
3. ``marin verify`` of the resumed run on host A alone (2 local processes): a fresh, uninterrupted
   replay, so BIT-EXACT means the 2-host, killed and resumed run has the uninterrupted 2 x 2 bits.

Then one run per further fault: a partition (host B's link down) with host B's clock an hour ahead
(faketime), and the S3 endpoint lost during a checkpoint write.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.conftest import BIN, Project, copy_project, env_for_subprocess, tiny
from tests.hosts import Hosts, available
from tests.servers import S3, S3_ENV, free_port

HEARTBEAT_BOUND_S = 90  # marin.train.distributed.HEARTBEAT_S (20 s) and the launcher's stop, on a loaded machine
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _runtime(proj: Project, seed: int | None = None) -> None:
    params = proj.params
    params["runtime"].update(devices=2, processes=2)
    params["train"].update(steps=16, log_every=2, checkpoint_every=4)
    params["network"] = {"connect_timeout_s": 3.0, "read_timeout_s": 5.0, "retries": 1}
    if seed is not None:
        params["seed"] = seed
    proj.write_params(params)


@dataclass
class Cluster:
    hosts: Hosts
    s3: S3
    a: Project
    b: Project
    port: int

    def env(self, proj: Project, process_id: int, **extra: str) -> dict[str, str]:
        return {**env_for_subprocess(), **proj.env, **S3_ENV, "MARIN_CHECKPOINT_REMOTE": "default",
                "MARIN_COORDINATOR": f"host-a:{self.port}", "MARIN_PROCESS_ID": str(process_id),
                "MARIN_NUM_PROCESSES": "2", **extra}

    def start(self, b_env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """The train stage on both hosts, as each host's own command."""
        argv = [str(BIN / "python"), "-m", "pipeline.train"]
        pa = self.hosts["a"].popen(argv, self.a.root, self.env(self.a, 0), self.a.root / "stage.log")
        pb = self.hosts["b"].popen(argv, self.b.root, {**self.env(self.b, 1), **(b_env or {})},
                                   self.b.root / "stage.log")
        return pa, pb

    def each(self, *args: str) -> None:
        for p in (self.a, self.b):
            p.run(*args, check=True)


def log(proj: Project) -> str:
    return (proj.root / "stage.log").read_text(errors="replace")


def wait_for(what: Callable[[], bool], procs: tuple[subprocess.Popen[bytes], ...], limit_s: float = 600) -> None:
    end = time.monotonic() + limit_s
    while not what():
        assert all(p.poll() is None for p in procs), "a stage ended before the awaited moment"
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.05)


def stored_checkpoints(proj: Project) -> list[dict]:
    runs = proj.runs("train")
    return [r["body"] for r in runs[-1] if r["kind"] == "checkpoint"] if runs else []


def problems_with(check: subprocess.CompletedProcess[str], run_id: str) -> list[str]:
    """What `marin ledger check` finds wrong with one run (the module's other runs may have their own:
    the partition's host B clock is an hour ahead)."""
    assert "ledger check:" in check.stdout + check.stderr, check.stdout + check.stderr
    return [x for x in (check.stdout + check.stderr).splitlines() if x.startswith("FAIL") and run_id in x]


def ended_within(procs: tuple[subprocess.Popen[bytes], ...], t0: float) -> list[float]:
    """Seconds from ``t0`` until each process ended (each waited for, at most 10 minutes)."""
    out = []
    for p in procs:
        p.wait(timeout=600)
        out.append(time.monotonic() - t0)
    return out


@dataclass
class Killed:
    rc: int
    stopped_s: float
    line: str
    after_checkpoint: int
    check: subprocess.CompletedProcess[str]


@dataclass
class Two:
    cluster: Cluster
    killed: Killed
    resumed: list[dict]
    b_log: str
    verify: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Iterator[Cluster]:
    why = available()
    assert why is None, f"namespaced hosts cannot be made here: {why} (the tests run as root, as .ci/run does)"
    base = tmp_path_factory.mktemp("hosts")
    with Hosts(["a", "b"]) as hosts:
        s3 = S3(hosts.gateway).start()
        try:
            origin = copy_project(_data_project, base / "origin")
            origin.env.update(S3_ENV)
            tiny(origin)
            _runtime(origin)
            s3.bucket("lab")
            origin.dvc("remote", "add", "-d", "lab", "s3://lab/dvc")
            origin.dvc("remote", "modify", "lab", "endpointurl", s3.url)
            origin.git("add", "-A")
            origin.git("commit", "-qm", "two hosts, a DVC remote on S3")
            a, b = copy_project(origin, base / "a"), copy_project(origin, base / "b")
            for p, cache in ((a, "jax-a"), (b, "jax-b")):  # each host compiles into its own cache
                p.env.update(JAX_COMPILATION_CACHE_DIR=str(base / cache),
                             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
            yield Cluster(hosts, s3, a, b, free_port())
        finally:
            s3.stop()


@pytest.fixture(scope="module")
def two(cluster: Cluster) -> Two:
    c = cluster
    procs, _ = new_run(c, 5)
    wait_for(lambda: any("stored" in b for b in stored_checkpoints(c.a)), procs)
    after = stored_checkpoints(c.a)[-1]["step"]
    t0 = time.monotonic()
    c.hosts.kill_all("b")
    (a_s, _) = ended_within(procs, t0)
    line = [x for x in log(c.a).splitlines() if x.startswith("marin: error:")][-1]
    killed = Killed(procs[0].returncode, a_s, line, after, c.a.marin("ledger", "check"))
    procs = c.start()
    ended_within(procs, time.monotonic())
    assert [p.returncode for p in procs] == [0, 0], log(c.a)[-3000:] + log(c.b)[-3000:]
    resumed = c.a.runs("train")[-1]
    verify = c.hosts["a"].run([str(BIN / "python"), "-m", "marin.cli", "verify", resumed[0]["run_id"]], c.a.root,
                              {**env_for_subprocess(), **c.a.env, **S3_ENV})
    return Two(c, killed, resumed, (c.b.root / ".marin/logs/train/process-1.log").read_text(errors="replace"), verify)


@pytest.mark.slow
def test_host_b_killed_stops_host_a_within_the_bound_naming_host_b(two: Two) -> None:
    k, b = two.killed, two.cluster.hosts["b"]
    print(f"host B killed after checkpoint {k.after_checkpoint}: host A's stage exited {k.rc} in {k.stopped_s:.1f} s: "
          f"{k.line}")
    assert k.rc == 1 and k.stopped_s < HEARTBEAT_BOUND_S
    assert f"process 1 ({b.name}, {b.ip}) is gone" in k.line and "rerun the stage" in k.line
    assert problems_with(k.check, two.resumed[0]["run_id"]) == []  # the ledger holds; the run was unfinished


@pytest.mark.slow
def test_the_resumed_run_is_one_ledger_run_with_both_hosts_recorded(two: Two) -> None:
    kinds = [r["kind"] for r in two.resumed]
    assert kinds.count("run.resumed") == 1 and kinds[-1] == "run.finished"
    # the ledger records why the run had stopped: host A's line, kept by its launcher for the resumption
    reason = next(r["body"]["reason"] for r in two.resumed if r["kind"] == "run.resumed")
    assert f"it had stopped: train: process 1 (host-b, {two.cluster.hosts['b'].ip}) is gone" in reason, reason
    assert two.resumed[-1]["body"]["status"] == "succeeded"
    procs = two.resumed[0]["body"]["execution"]["processes"]
    hosts = two.cluster.hosts
    assert [(p["process_id"], p["host"], p["ip"]) for p in procs] == [
        (0, "host-a", hosts["a"].ip), (1, "host-b", hosts["b"].ip)]
    assert all(p["env"].get("cpu_model") for p in procs), procs  # what CPU each host has


@pytest.mark.slow
def test_host_b_fetched_the_checkpoint_it_never_had_from_s3(two: Two) -> None:
    ckpts = [r["body"] for r in two.resumed if r["kind"] == "checkpoint"]
    assert ckpts and all(c["stored"]["remote"] == "lab" for c in ckpts)
    resumed_from = next(r["body"]["from_step"] for r in two.resumed if r["kind"] == "run.resumed")
    assert resumed_from == two.killed.after_checkpoint > 0
    b_ckpts = two.cluster.b.root / "checkpoints" / two.resumed[0]["run_id"]
    assert sorted(p.name for p in b_ckpts.iterdir()) == [str(resumed_from)]  # fetched; B saves none itself
    assert f"checkpoint {resumed_from} of {two.resumed[0]['run_id']}: not on this host; fetching" in two.b_log
    # the manifest on S3 names every file of the checkpoint with its sha256, as the record says
    c = next(c for c in ckpts if c["step"] == resumed_from)
    key = c["stored"]["url"].split("://", 1)[1].split("/", 1)[1]
    manifest = json.loads(two.cluster.s3.get("lab", key))
    assert manifest["digest"] == c["digest"] and manifest["step"] == resumed_from and manifest["files"]


@pytest.mark.slow
def test_verify_of_the_two_host_run_on_one_host_is_bit_exact(two: Two) -> None:
    v = two.verify
    assert v.returncode == 0, v.stdout[-2000:] + v.stderr[-2000:]
    assert "BIT-EXACT" in v.stdout


def new_run(c: Cluster, seed: int, b_env: dict[str, str] | None = None
            ) -> tuple[tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]], str]:
    """Another recipe (a new seed on both hosts) started on both; its run id, once process 0 began it."""
    before = {r[0]["run_id"] for r in c.a.runs("train")}
    for p in (c.a, c.b):
        _runtime(p, seed=seed)
    procs = c.start(b_env)
    wait_for(lambda: any(r[0]["run_id"] not in before for r in c.a.runs("train")), procs)
    return procs, next(r[0]["run_id"] for r in c.a.runs("train") if r[0]["run_id"] not in before)


def run_log(proj: Project, run_id: str) -> list[dict]:
    return next(r for r in proj.runs("train") if r[0]["run_id"] == run_id)


def error_line(proj: Project) -> str:
    return ([x for x in log(proj).splitlines() if x.startswith("marin: error:")] or [""])[-1]


@dataclass
class Fault:
    run: list[dict]
    lines: tuple[str, str]  # host A's and host B's
    codes: tuple[int, int]
    took_s: list[float]
    check: subprocess.CompletedProcess[str]


def fault_after_first_checkpoint(c: Cluster, seed: int, fault: Callable[[], None], undo: Callable[[], None],
                                 b_env: dict[str, str] | None = None) -> Fault:
    """A new run on both hosts; ``fault`` once its first checkpoint is stored, ``undo`` once both ended."""
    procs, run_id = new_run(c, seed, b_env)
    wait_for(lambda: any("stored" in r["body"] for r in run_log(c.a, run_id) if r["kind"] == "checkpoint"), procs)
    t0 = time.monotonic()
    fault()
    try:
        took = ended_within(procs, t0)
    finally:
        undo()
    return Fault(run_log(c.a, run_id), (error_line(c.a), error_line(c.b)), (procs[0].returncode, procs[1].returncode),
                 took, c.a.marin("ledger", "check"))


@pytest.fixture(scope="module")
def partitioned(cluster: Cluster) -> Fault:
    """Host B's link down after the first stored checkpoint, host B's clock an hour ahead all along."""
    # jemalloc (the stage's allocator) and libfaketime deadlock on clock_gettime: glibc's malloc on host B
    return fault_after_first_checkpoint(cluster, 7, lambda: cluster.hosts.link_down("b"),
                                        lambda: cluster.hosts.link_up("b"),
                                        {"LD_PRELOAD": FAKETIME, "FAKETIME": "+1h", "MARIN_ALLOCATOR": "system"})


@pytest.mark.slow
def test_a_partition_ends_both_hosts_within_the_bound_each_naming_the_other(partitioned: Fault) -> None:
    f = partitioned
    print(f"partition: host A exited {f.codes[0]} after {f.took_s[0]:.1f} s: {f.lines[0]}")
    print(f"partition: host B exited {f.codes[1]} after {f.took_s[1]:.1f} s: {f.lines[1]}")
    assert f.codes == (1, 1) and max(f.took_s) < HEARTBEAT_BOUND_S
    assert "process 1 (host-b, " in f.lines[0] and " is gone" in f.lines[0], f.lines[0]
    assert "process 0 (host-a, " in f.lines[1] and " is gone" in f.lines[1], f.lines[1]
    assert f.run[-1]["kind"] != "run.finished"  # unfinished: the next run resumes it


@pytest.mark.slow
def test_after_a_partition_only_committed_checkpoints_are_recorded_and_the_ledger_holds(
        partitioned: Fault, cluster: Cluster) -> None:
    for c in (r["body"] for r in partitioned.run if r["kind"] == "checkpoint"):
        folder = cluster.a.root / c["path"]
        assert folder.is_dir() and not list(folder.parent.glob(f"{c['step']}.orbax-checkpoint-tmp*"))
    # the ledger holds; the one thing it reports of the run is host B's clock, an hour ahead of process 0's
    [problem] = problems_with(partitioned.check, partitioned.run[0]["run_id"])
    b = cluster.hosts["b"]
    assert f"seq 0: process 1 on host-b ({b.ip}): its clock read " in problem and "+3600 s off process 0's" in problem
    assert partitioned.check.returncode != 0


@pytest.fixture(scope="module")
def s3_lost(cluster: Cluster) -> Fault:
    """The S3 endpoint unreachable (its address gone) after the first stored checkpoint: the next store fails."""
    return fault_after_first_checkpoint(cluster, 8, cluster.hosts.gateway_down, cluster.hosts.gateway_up)


@pytest.mark.slow
def test_losing_s3_during_a_checkpoint_write_fails_cleanly_and_keeps_the_resume_point(s3_lost: Fault) -> None:
    f = s3_lost
    print(f"S3 lost: host A exited {f.codes[0]} after {f.took_s[0]:.1f} s: {f.lines[0]}")
    ckpts = [r["body"] for r in f.run if r["kind"] == "checkpoint"]
    assert f.codes[0] == 1 and "could not be stored in DVC remote lab" in f.lines[0], f.lines[0]
    failed_step = int(re.search(r"checkpoint (\d+) of \S+ could not be stored", f.lines[0]).group(1))
    assert [c["step"] for c in ckpts] == [failed_step - 4] and all("stored" in c for c in ckpts)
    assert "the checkpoint before it as the resume point" in f.lines[0]
    assert f.run[-1]["kind"] != "run.finished"  # unfinished: resumable from the last stored checkpoint
    assert problems_with(f.check, f.run[0]["run_id"]) == []


@pytest.fixture(scope="module")
def differing(cluster: Cluster) -> Fault:
    """Host B's params.yaml with another learning rate: no step is taken."""
    c = cluster
    for p in (c.a, c.b):
        _runtime(p, seed=9)
    params = c.b.params
    params["train"]["lr"] = 1.0e-3
    c.b.write_params(params)
    before = {r[0]["run_id"] for r in c.a.runs("train")}
    procs = c.start()
    took = ended_within(procs, time.monotonic())
    new = [r for r in c.a.runs("train") if r[0]["run_id"] not in before]
    return Fault(new[0] if new else [], (error_line(c.a), error_line(c.b)),
                 (procs[0].returncode, procs[1].returncode), took, c.a.marin("ledger", "check"))


@pytest.mark.slow
def test_a_host_with_other_params_stops_both_before_the_first_step_naming_it(differing: Fault) -> None:
    f = differing
    assert f.codes == (1, 1) and f.run == [], f.lines  # no ledger run: nothing was trained
    for line in f.lines:
        assert "the hosts' projects differ from process 0's (process 1 on host-b: params train.lr 0.001 " \
               "(process 0: 0.003))" in line, line
