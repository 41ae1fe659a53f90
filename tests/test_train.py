"""The trainer: bit-identical repeats, exact resume after SIGKILL, the mesh, thread count."""

import json
import random
import shutil
import signal
import subprocess
import time

import pytest

from marin.ledger import read_run
from marin.ledger.check import check_run
from tests.conftest import BIN, env_for_subprocess, tiny

pytestmark = pytest.mark.slow
KILL_SEED = 20260115  # the kill step is drawn from it (step 27): a failure repeats with the same step


def last_train(proj) -> list[dict]:
    return proj.runs("train")[-1]


def summary(run: list[dict]) -> dict:
    """What must repeat bit for bit: checkpoint digests, exact metrics, the model digest."""
    return {
        "checkpoints": [(r["body"]["step"], r["body"]["digest"]) for r in run if r["kind"] == "checkpoint"],
        "metrics": [(r["body"]["step"], {k: v["hex"] for k, v in r["body"]["values"].items()})
                    for r in run if r["kind"] == "metric"],
        "model": [r["body"]["tensor_digest"] for r in run if r["kind"] == "output" and r["body"]["name"] == "model"],
    }


def fresh_train(proj, prefix: tuple[str, ...] = ()) -> list[dict]:
    shutil.rmtree(proj.root / "models", ignore_errors=True)
    proj.run(*prefix, str(BIN / "python"), "-m", "pipeline.train", check=True)
    return last_train(proj)


def test_two_fresh_runs_are_bit_identical(data_project, tmp_path) -> None:
    """The first run compiles afresh into an empty compilation cache, the second loads its
    executables from it: the bits are the same (so the tests' shared cache hides nothing). The
    first runs on jemalloc (the stage restarts itself with it: tests/test_allocator.py), the second
    on glibc's own malloc: the allocator changes no bit either."""
    tiny(data_project)
    cache = tmp_path / "jax-cache"
    data_project.env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    a = fresh_train(data_project)
    assert any(cache.iterdir()), "the first run wrote no compiled executable"
    data_project.env["MARIN_ALLOCATOR"] = "system"
    b = fresh_train(data_project)
    assert a[0]["run_id"] != b[0]["run_id"]
    assert a[0]["body"]["recipe_digest"] == b[0]["body"]["recipe_digest"]
    sa, sb = summary(a), summary(b)
    assert len(sa["checkpoints"]) == 3 and len(sa["metrics"]) == 6
    assert sa == sb
    seeds = a[0]["body"]["seeds"]
    assert seeds["root"] == data_project.params["seed"]
    assert set(seeds["streams"]) >= {"init", "data_order"}


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill", "ctrl-c"])
def test_sigkill_then_repro_resumes_bit_identical(data_project, sig: signal.Signals) -> None:
    proj = data_project
    tiny(proj)
    params = proj.params
    params["train"].update(steps=60, checkpoint_every=10, log_every=1)
    proj.write_params(params)
    reference = summary(fresh_train(proj))
    shutil.rmtree(proj.root / "models")

    target = random.Random(KILL_SEED).randint(12, 45)  # a step past the first checkpoint, the same every run
    proc = subprocess.Popen([str(BIN / "python"), "-m", "pipeline.train"], cwd=proj.root,
                            env=env_for_subprocess(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            # an xdist worker ignores SIGINT, and an ignored signal stays ignored across exec:
                            # the trainer gets Ctrl-C as from a terminal, not as a background job of a script
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    killed_at = None
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
        try:
            runs = proj.runs("train")
        except ValueError:  # read while the trainer was appending a line: read again
            continue
        steps = [r["body"]["step"] for r in runs[-1] if r["kind"] == "metric"] if len(runs) == 2 else []
        if steps and steps[-1] >= target:
            proc.send_signal(sig)
            killed_at = steps[-1]
            break
    proc.wait()
    expected = -signal.SIGKILL if sig == signal.SIGKILL else 130  # Ctrl-C: one line and exit 130
    assert killed_at is not None and proc.returncode == expected, f"training ended before the kill at {target}"
    killed = proj.runs("train")[-1]
    assert killed[-1]["kind"] != "run.finished"  # unfinished
    path = proj.root / "ledger" / "runs" / f"{killed[0]['run_id']}.jsonl"
    assert check_run(read_run(path)) == []  # the killed run's ledger stays valid
    assert proj.marin("ledger", "check").returncode == 0

    proj.run(str(BIN / "python"), "-m", "pipeline.train", check=True)  # what `dvc repro` runs

    resumed = proj.runs("train")[-1]
    assert resumed[0]["run_id"] == killed[0]["run_id"]  # the same ledger run
    resumes = [r for r in resumed if r["kind"] == "run.resumed"]
    assert len(resumes) == 1 and resumes[0]["body"]["from_step"] <= killed_at
    assert summary(resumed) == reference
    assert proj.marin("ledger", "check").returncode == 0


def test_four_simulated_devices_repeat_and_record_the_mesh(data_project) -> None:
    tiny(data_project, devices=4)
    a, b = fresh_train(data_project), fresh_train(data_project)
    assert summary(a) == summary(b)
    det = a[0]["body"]["determinism_class"]
    assert det["device_count"] == 4 and det["mesh"] == {"axes": {"data": 4}, "param_sharding": "replicated"}
    assert "--xla_force_host_platform_device_count=4" in det["xla_flags"]


def test_fsdp_on_four_devices_trains(data_project) -> None:
    tiny(data_project, devices=4, param_sharding="fsdp")
    run = fresh_train(data_project)
    assert run[-1]["body"]["status"] == "succeeded"
    assert run[0]["body"]["determinism_class"]["mesh"]["param_sharding"] == "fsdp"


def test_thread_count_from_params_decides_the_class_not_the_affinity(data_project) -> None:
    tiny(data_project, xla_cpu_threads=2)
    unpinned = fresh_train(data_project)
    pinned = fresh_train(data_project, prefix=("taskset", "-c", "0"))
    assert pinned[0]["body"]["env"]["usable_cores"] == [0]
    assert pinned[0]["body"]["determinism_class"]["xla_cpu_threads"] == 2
    assert pinned[0]["body"]["determinism_digest"] == unpinned[0]["body"]["determinism_digest"]
    assert summary(pinned) == summary(unpinned)  # bit-identical on one core

    tiny(data_project, xla_cpu_threads=1)
    one = fresh_train(data_project)
    assert one[0]["body"]["determinism_class"]["xla_cpu_threads"] == 1
    assert one[0]["body"]["determinism_digest"] != unpinned[0]["body"]["determinism_digest"]
    assert one[0]["body"]["recipe_digest"] != unpinned[0]["body"]["recipe_digest"]


def test_evaluate_records_and_metrics(data_project) -> None:
    tiny(data_project)
    fresh_train(data_project)
    data_project.stage("evaluate")
    run = data_project.runs("evaluate")[-1]
    evals = [r["body"] for r in run if r["kind"] == "eval"]
    names = {(e["name"], e.get("corpus")) for e in evals}
    assert {("model", None), ("unigram_baseline", None), ("greedy_samples", None)} <= names
    import pyarrow.parquet as pq

    corpora = set(pq.read_table(data_project.root / "data/curated/validation.parquet")["corpus"].to_pylist())
    assert corpora and {("model", c) for c in corpora} <= names  # and per corpus
    metrics = json.loads((data_project.root / "metrics/eval.json").read_text())
    model_all = next(e for e in evals if e["name"] == "model" and "corpus" not in e)
    assert metrics["bits_per_byte"] == model_all["values"]["bits_per_byte"]["value"]
    assert float.fromhex(model_all["values"]["bits_per_byte"]["hex"]) == metrics["bits_per_byte"]
    samples = next(e for e in evals if e["name"] == "greedy_samples")["samples"]
    assert [s["prompt"] for s in samples] == data_project.params["evaluate"]["prompts"]
    assert data_project.marin("ledger", "check").returncode == 0


def test_dvc_exp_run_with_a_param_override(data_project) -> None:
    proj = data_project
    tiny(proj)
    proj.dvc("repro", "train")  # the stages below train (evaluate, export, report) are not what this is about
    proj.git("add", "-A")
    proj.git("commit", "-qm", "baseline")
    before = len(proj.runs("train"))
    out = proj.dvc("exp", "run", "-S", "train.lr=0.001", "train").stdout
    assert "Running stage 'train'" in out
    runs = proj.runs("train")
    assert len(runs) == before + 1
    assert runs[-1][0]["body"]["params"]["train"]["lr"] == 0.001
    assert runs[-1][-1]["body"]["status"] == "succeeded"


def test_marin_diff_names_the_param_and_the_first_diverging_step(data_project) -> None:
    tiny(data_project)
    a = fresh_train(data_project)
    params = data_project.params
    params["train"]["lr"] = 0.001
    data_project.write_params(params)
    b = fresh_train(data_project)
    r = data_project.marin("diff", a[0]["run_id"], b[0]["run_id"])
    assert r.returncode == 1
    assert "params: 1 difference(s)" in r.stdout and "train.lr: 0.003 -> 0.001" in r.stdout
    assert "code: same" in r.stdout and "determinism class: same" in r.stdout and "inputs: same" in r.stdout
    metrics_b = {x["body"]["step"]: x["body"]["values"] for x in b if x["kind"] == "metric"}
    step = next(x["body"]["step"] for x in a if x["kind"] == "metric"
                and x["body"]["values"] != metrics_b[x["body"]["step"]])
    assert step < next(x["body"]["step"] for x in a if x["kind"] == "checkpoint")  # the metrics diverge first
    assert f"first divergence: metrics at step {step}: " in r.stdout and "loss" in r.stdout.split("first divergence")[1]
    same = data_project.marin("diff", a[0]["run_id"], a[0]["run_id"])
    assert same.returncode == 0 and "first divergence: none" in same.stdout
