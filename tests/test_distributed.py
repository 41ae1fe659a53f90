"""Training on 2 processes x 2 devices with jax.distributed: records every process, stops
without hanging when a process is killed, resumes and verifies bit for bit.

One module fixture runs the trainings once: a 2x2 run whose process 1 is SIGKILLed after its
first checkpoint, its resumption, `marin verify` of it (a fresh, uninterrupted 2-process
replay compared record by record and tensor by tensor: so the resumed run equals an
uninterrupted one, and 2x2 repeats bit for bit), and a 1x4 run; the tests read them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from marin.config import RuntimeParams
from marin.errors import StageError
from marin.train import distributed, launch
from tests.conftest import BIN, Project, copy_project, env_for_subprocess, tiny
from tests.test_train import summary


def train_argv() -> list[str]:
    return [str(BIN / "python"), "-m", "pipeline.train"]


def set_runtime(proj: Project, **rt: object) -> None:
    params = proj.params
    params["runtime"].update(rt)
    params["train"].update(steps=24, log_every=2, checkpoint_every=4)  # 6 checkpoints: room to kill mid-run
    proj.write_params(params)


def worker_pid(launcher: int, process_id: int) -> int | None:
    """The pid of the launcher's child with MARIN_PROCESS_ID=process_id (from /proc)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == launcher and f"MARIN_PROCESS_ID={process_id}".encode() in environ:
            return int(entry)
    return None


def kill_after_first_checkpoint(proj: Project) -> dict:
    """Start the 2-process stage, SIGKILL process 1 once a checkpoint is recorded; how it ended."""
    before = {r[0]["run_id"] for r in proj.runs("train")}
    p = subprocess.Popen(train_argv(), cwd=proj.root, env={**env_for_subprocess(), **proj.env},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at, ckpt_step, deadline = None, None, time.time() + 400
    while p.poll() is None and killed_at is None and time.time() < deadline:
        new = [r for r in proj.runs("train") if r[0]["run_id"] not in before]
        steps = [r["body"]["step"] for r in new[0] if r["kind"] == "checkpoint"] if new else []
        pid = worker_pid(p.pid, 1) if steps else None
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed_at, ckpt_step = time.monotonic(), steps[-1]
        time.sleep(0.005)
    out, err = p.communicate(timeout=120)
    stopped_s = time.monotonic() - killed_at if killed_at else None
    return {"rc": p.returncode, "stderr": err, "stdout": out, "stopped_s": stopped_s, "after_checkpoint": ckpt_step}


@dataclass
class Dist:
    proj: Project
    killed: dict  # how the killed 2x2 launch ended
    killed_run: list[dict]  # its ledger run, unfinished
    resumed: list[dict]  # the same ledger run, resumed and finished
    verify: subprocess.CompletedProcess[str]  # marin verify of the resumed run
    one: list[dict]  # a 1x4 run
    mlflow_train_runs: list[str]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory, _data_project: Project) -> Dist:
    proj = copy_project(_data_project, tmp_path_factory.mktemp("dist") / "proj")
    # Later launches reuse the first one's executables (measured here: 31 against 46 CPU s for a
    # 2x2 run, and the same bits; the tests below would catch other bits).
    proj.env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("jax-cache")),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    tiny(proj)
    set_runtime(proj, devices=2, processes=2)
    killed = kill_after_first_checkpoint(proj)
    killed_run = proj.runs("train")[-1]
    proj.env["MARIN_MLFLOW"] = "on"  # the resumed run is mirrored (by process 0 alone)
    proj.run(*train_argv(), check=True)
    proj.env.pop("MARIN_MLFLOW")
    resumed = proj.runs("train")[-1]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{proj.root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("marin").experiment_id
    mlflow_train = [r.data.tags["marin.run_id"] for r in client.search_runs([exp])
                    if r.data.tags.get("marin.stage") == "train"]

    verify = proj.marin("verify", resumed[0]["run_id"])

    set_runtime(proj, devices=4, processes=1)
    proj.run(*train_argv(), check=True)
    one = proj.runs("train")[-1]
    return Dist(proj, killed, killed_run, resumed, verify, one, mlflow_train)


@pytest.mark.slow
def test_two_processes_record_one_run_with_both_fingerprints(dist: Dist) -> None:
    started = dist.resumed[0]["body"]
    assert dist.resumed[-1]["kind"] == "run.finished" and dist.resumed[-1]["body"]["status"] == "succeeded"
    assert started["params"]["runtime"]["processes"] == 2
    resumed = [r["body"] for r in dist.resumed if r["kind"] == "run.resumed"]
    for procs in (started["execution"]["processes"], resumed[0]["execution"]["processes"]):
        assert [p["process_id"] for p in procs] == [0, 1]
        for i, p in enumerate(procs):
            assert len(p["devices"]) == 2 and p["host"] and p["xla_cpu_threads"] == 2
            assert p["env"]["packages"]["jax"] == started["env"]["packages"]["jax"]
            assert p["env"]["env_vars"]["MARIN_PROCESS_ID"] == str(i)
        assert len({d["id"] for p in procs for d in p["devices"]}) == 4  # four distinct devices
    det = started["determinism_class"]
    assert det["device_count"] == 4 and det["mesh"]["processes"] == 2 and det["mesh"]["cpu_collectives"] == "gloo"
    # one ledger run per training run: the killed-and-resumed 2x2 run and the 1x4 run
    assert len(dist.proj.runs("train")) == 2
    assert dist.mlflow_train_runs == [dist.resumed[0]["run_id"]]  # and one MLflow run, not one per process
    assert dist.proj.marin("ledger", "check").returncode == 0


@pytest.mark.slow
def test_verify_replays_the_two_process_run_bit_exactly(dist: Dist) -> None:
    """The replay is a fresh, uninterrupted 2x2 run: equal to the resumed one in every record."""
    assert dist.verify.returncode == 0, dist.verify.stdout + dist.verify.stderr
    assert "BIT-EXACT" in dist.verify.stdout
    run = dist.proj.runs("train")[0]  # the verification record is appended to the 2x2 run
    ver = [r for r in run if r["kind"] == "verification"][-1]["body"]
    assert ver["result"] == "bit-exact" and ver["compared"]["checkpoint_tensors"] == 6
    assert ver["compared"]["metric"] == 12 and ver["compared"]["output"] >= 2
    assert ver["verifier"]["determinism_class"]["mesh"]["processes"] == 2


@pytest.mark.slow
def test_sigkill_of_one_process_stops_the_job_and_it_resumes(dist: Dist) -> None:
    k = dist.killed
    assert k["after_checkpoint"] is not None, "training ended before the kill"
    assert k["rc"] == 1 and k["stopped_s"] < 30, k
    lines = k["stderr"].strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marin: error: train: process 1 of 2"), lines
    assert "SIGKILL" in lines[0]
    assert dist.killed_run[-1]["kind"] != "run.finished"  # unfinished, so the next run resumes it
    assert dist.resumed[0]["run_id"] == dist.killed_run[0]["run_id"]
    resumes = [r["body"] for r in dist.resumed if r["kind"] == "run.resumed"]
    assert len(resumes) == 1 and resumes[0]["from_step"] >= k["after_checkpoint"]
    assert summary(dist.resumed)["checkpoints"][0] == summary(dist.killed_run)["checkpoints"][0]


@pytest.mark.slow
def test_two_by_two_is_not_one_by_four_bit_for_bit_and_says_so(dist: Dist) -> None:
    """Measured (docs/architecture.md): the cross-process all-reduce (gloo) sums in another order
    than one process's, so the last bits differ from step 1; the recorded classes differ."""
    a, one = summary(dist.resumed), summary(dist.one)
    assert a["model"] != one["model"] and a["checkpoints"] != one["checkpoints"]
    la = [float.fromhex(v["loss"]) for _, v in a["metrics"]]
    lo = [float.fromhex(v["loss"]) for _, v in one["metrics"]]
    assert len(la) == len(lo) == 12 and np.allclose(la, lo, rtol=1e-4, atol=0)  # the same computation up to rounding
    da, d1 = dist.resumed[0]["body"], dist.one[0]["body"]
    assert da["determinism_digest"] != d1["determinism_digest"]
    assert "processes" not in d1["determinism_class"]["mesh"] and d1["determinism_class"]["device_count"] == 4


# -- pure pieces ----------------------------------------------------------------------------

RT = RuntimeParams(xla_cpu_threads=2, devices=2, param_sharding="replicated", processes=2)


def test_topology_from_the_environment() -> None:
    assert distributed.topology(RT, {}).launch  # one machine: this process launches the workers
    assert not distributed.topology(RuntimeParams(2, 1, "replicated"), {}).launch
    cluster = {"MARIN_COORDINATOR": "h:1", "MARIN_PROCESS_ID": "1", "MARIN_NUM_PROCESSES": "2"}
    t = distributed.topology(RT, cluster)  # a host's stage: it launches its own worker, process 1
    assert (t.process_id, t.coordinator, t.launch, t.primary) == (1, "h:1", True, False)
    t = distributed.topology(RT, {**cluster, "MARIN_WORKER": "1"})  # that worker
    assert (t.process_id, t.coordinator, t.launch, t.primary) == (1, "h:1", False, False)
    assert distributed.topology(RT, {"MARIN_CLUSTER": "auto"}).auto


@pytest.mark.parametrize("environ, words", [
    ({"MARIN_PROCESS_ID": "0"}, "without MARIN_COORDINATOR, MARIN_NUM_PROCESSES"),
    ({"MARIN_COORDINATOR": "h:1", "MARIN_PROCESS_ID": "x", "MARIN_NUM_PROCESSES": "2"}, "must be integers"),
    ({"MARIN_COORDINATOR": "h:1", "MARIN_PROCESS_ID": "2", "MARIN_NUM_PROCESSES": "2"}, "an id in [0, 2)"),
    ({"MARIN_COORDINATOR": "h:1", "MARIN_PROCESS_ID": "0", "MARIN_NUM_PROCESSES": "3"}, "runtime.processes is 2"),
    ({"MARIN_CLUSTER": "slurm"}, "the only value is 'auto'"),
])
def test_topology_refuses_a_half_or_wrong_setting_in_one_line(environ: dict, words: str) -> None:
    with pytest.raises(StageError) as e:
        distributed.topology(RT, environ)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_how_a_worker_ended_is_named() -> None:
    assert launch.how(-signal.SIGKILL) == "was killed by SIGKILL"
    assert launch.how(distributed.PEER_LOST) == "stopped because another process was gone"
    assert launch.how(3) == "exited with status 3"


PEERS = [{"process_id": 0, "host": "host-a", "ip": "10.1.2.2"}, {"process_id": 1, "host": "host-b", "ip": "10.1.2.3"},
         {"process_id": 2, "host": "host-c", "ip": "10.1.2.4"}]


@pytest.mark.parametrize("log, me, lost", [
    ("absl::Status: UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):"
     "\n2\nThe tasks", 0, [2]),
    ("F1207 client.h:80] Terminating process ... DEADLINE_EXCEEDED: Deadline Exceeded\nRPC: /xla.coordination"
     ".CoordinationService/Heartbeat", 1, [0]),
    ("marin: peer error: Gloo: Connection closed by peer [10.1.2.4]:43121", 0, [2]),
    ("marin: peer error: something else entirely", 1, [0, 2]),
])
def test_the_process_that_is_gone_is_read_from_a_worker_log(log: str, me: int, lost: list[int]) -> None:
    assert launch.gone(log.replace("\\n", "\n"), me, 3, PEERS) == lost
    assert launch.named([1], PEERS) == "process 1 (host-b, 10.1.2.3)"


def test_params_refuse_a_batch_that_does_not_split_over_processes(tmp_path: Path) -> None:
    import yaml

    from marin import config
    from marin.errors import ParamsError
    from tests.conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"]["batch_size"] = 6
    params["runtime"].update(devices=2, processes=2)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ParamsError, match=r"runtime.processes x runtime.devices \(2 x 2\)"):
        config.load(tmp_path / "params.yaml")


def test_loader_rows_are_slices_of_the_batch(tmp_path: Path) -> None:
    from marin.train.loader import Loader, TokenStream

    path = tmp_path / "tokens.uint16"
    np.arange(5000, dtype=np.uint16).tofile(path)
    loader = Loader(TokenStream.open(path, np.dtype(np.uint16)), 16, 8, b"k" * 32)
    for step in (0, 3, 40):
        whole = loader.batch(step)
        parts = [loader.rows(step, lo, lo + 2) for lo in range(0, 8, 2)]
        for name in ("inputs", "targets"):
            assert np.array_equal(np.concatenate([p[name] for p in parts]), whole[name])



def test_the_interruption_note_is_read_once_for_its_own_run_and_its_absence_is_none(tmp_path: Path) -> None:
    assert distributed.interruption(tmp_path, "train-a") is None  # no launcher ever ran here
    (tmp_path / distributed.LOGS).mkdir(parents=True)
    distributed.note_interruption(tmp_path, "train-a", "train: process 1 (host-b, 10.0.0.3) is gone")
    assert distributed.interruption(tmp_path, "train-b") is None  # another run's note is not this one's
    distributed.note_interruption(tmp_path, "train-a", "train: process 1 (host-b, 10.0.0.3) is gone")
    assert distributed.interruption(tmp_path, "train-a") == "train: process 1 (host-b, 10.0.0.3) is gone"
    assert distributed.interruption(tmp_path, "train-a") is None  # read once
