"""Base and Instruct (issue 27) end to end on the mini corpus: the instruction set, the sft stage
(resumable, verified, with lineage back to the raw archives), your own conversations, the
evaluation of both models on the held-out instructions, and the export of the instruct model
that transformers answers with.

One session-scoped project is built once (tiny model, 64-token rows, a short fine-tune) and
copied by the tests that change it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, Project, copy_project, env_for_subprocess, mini_params, new_project, tiny

pytestmark = pytest.mark.slow

SFT = {"steps": 40, "batch_size": 8, "lr": 3.0e-3, "schedule": "cosine", "warmup_steps": 4, "min_lr_ratio": 0.1,
       "wsd_decay_fraction": 0.2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8,
       "grad_clip": 1.0, "log_every": 4, "checkpoint_every": 10}
INSTRUCTIONS = {"salt": "marin-instructions-v1", "per_document": 16, "heldout_max": 64,
                "tasks": ["corpus", "reference"], "eval_tokens": 8}  # short answers: a tiny model learns them


def instruct_params(proj: Project, **sft: object) -> None:
    params = proj.params
    params["model"]["seq_len"] = 64  # a question and its answer fit a row
    params["sft"] = {**SFT, **sft}
    params["instructions"] = INSTRUCTIONS
    proj.write_params(params)


@pytest.fixture(scope="session")
def _sft_project(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Project:
    proj = new_project(tmp_path_factory.mktemp("instruct") / "proj", mini_params(corpus))
    tiny(proj)
    instruct_params(proj)
    proj.git("commit", "-qam", "instruct params")
    for stage in ("fetch", "curate", "tokenize", "train", "instructions", "sft"):
        proj.stage(stage)
    return proj


@pytest.fixture
def sft_project(tmp_path: Path, _sft_project: Project) -> Project:
    """A copy of a project whose pipeline ran through sft (tiny model)."""
    return copy_project(_sft_project, tmp_path / "proj")


def records(run: list[dict], kind: str) -> list[dict]:
    return [r["body"] for r in run if r["kind"] == kind]


def test_instructions_are_drawn_from_the_curated_splits_and_counted(_sft_project: Project) -> None:
    proj = _sft_project
    m = json.loads((proj.root / "data/instructions/manifest.json").read_text())
    rows = {s: [json.loads(x) for x in (proj.root / f"data/instructions/{s}.jsonl").read_text().splitlines()]
            for s in ("train", "heldout")}
    import pyarrow.parquet as pq

    split_docs = {s: set(pq.read_table(proj.root / f"data/curated/{c}.parquet")["doc_id"].to_pylist())
                  for s, c in (("train", "train"), ("heldout", "validation"))}
    for s, got in rows.items():
        assert m["sets"][s]["examples"] == len(got) > 0
        assert {r["doc_id"] for r in got} <= split_docs[s]  # held-out questions come from held-out documents
        assert sum(m["sets"][s]["tasks"].values()) == len(got)
        for r in got:
            assert [x["role"] for x in r["messages"]] == ["user", "assistant"]
    assert m["sets"]["heldout"]["examples"] <= INSTRUCTIONS["heldout_max"]
    text = {d["doc_id"]: d for d in pq.read_table(proj.root / "data/curated/train.parquet").to_pylist()}
    for r in rows["train"]:  # the answers are the documents' own: their corpus, book and chapter
        doc, (q, a) = text[r["doc_id"]], (m["content"] for m in r["messages"])
        if r["task"] == "reference":
            assert doc["name"].endswith(f"#{a}") and q.split(": ", 1)[1] in doc["text"].split("\n")
        else:
            assert r["task"] == "corpus" and a == doc["corpus"] and q.split("? ", 1)[1] in doc["text"]


def summary(run: list[dict]) -> dict:
    """What must repeat bit for bit: checkpoint digests, exact metrics, the model digest."""
    return {"checkpoints": [(r["step"], r["digest"]) for r in records(run, "checkpoint")],
            "metrics": [(r["step"], {k: v["hex"] for k, v in r["values"].items()}) for r in records(run, "metric")],
            "model": [r["tensor_digest"] for r in records(run, "output") if r["name"] == "model"]}


def test_sft_starts_from_the_base_model_and_learns_the_assistant_turns(_sft_project: Project) -> None:
    proj = _sft_project
    [train], [sft] = proj.runs("train"), proj.runs("sft")
    [base_out] = [r for r in records(train, "output") if r["name"] == "model"]
    inputs = {r["name"]: r for r in records(sft, "input")}
    assert inputs["base_model"]["digest"] == base_out["digest"]  # by digest: the very base model
    cfg = json.loads((proj.root / "models/instruct/config.json").read_text())
    assert cfg["base_model"]["tensor_digest"] == base_out["tensor_digest"] != cfg["tensor_digest"]
    assert cfg["model"] == json.loads((proj.root / "models/final/config.json").read_text())["model"]
    assert sft[0]["body"]["params"]["sft"] == SFT and set(sft[0]["body"]["seeds"]["streams"]) == {
        "sft_data_order", "sft_step"}
    metrics = records(sft, "metric")
    assert [m["step"] for m in metrics] == list(range(4, 41, 4))
    first, last = metrics[0]["values"], metrics[-1]["values"]
    assert last["loss"]["value"] < first["loss"]["value"] / 2, (first, last)  # short answers: learnable
    assert last["val_loss"]["value"] < first["val_loss"]["value"]
    assert [c["step"] for c in records(sft, "checkpoint")] == [10, 20, 30, 40]
    curve = (proj.root / "metrics/sft_curve.csv").read_text().splitlines()
    assert curve[0] == "step,loss,lr,grad_norm,val_loss" and len(curve) == 1 + len(metrics)


def test_sigkill_during_sft_then_the_stage_resumes_bit_identical_and_verifies(sft_project: Project) -> None:
    proj = sft_project
    reference = summary(proj.runs("sft")[-1])
    proc = subprocess.Popen([str(BIN / "python"), "-m", "pipeline.sft"], cwd=proj.root, env=env_for_subprocess(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_at, deadline = None, time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
        try:
            runs = proj.runs("sft")
        except ValueError:  # read while the trainer was appending a line
            continue
        steps = [r["step"] for r in records(runs[-1], "metric")] if len(runs) == 2 else []
        if steps and steps[-1] >= 16:  # past the first checkpoint (10)
            proc.send_signal(signal.SIGKILL)
            killed_at = steps[-1]
            break
    proc.wait()
    assert killed_at is not None and proc.returncode == -signal.SIGKILL, "sft ended before the kill"
    killed = proj.runs("sft")[-1]
    assert killed[-1]["kind"] != "run.finished"
    proj.stage("sft")  # what `dvc repro` runs
    resumed = proj.runs("sft")[-1]
    assert resumed[0]["run_id"] == killed[0]["run_id"]
    [resume] = records(resumed, "run.resumed")
    assert resume["from_step"] <= killed_at and summary(resumed) == reference
    assert proj.marin("ledger", "check").returncode == 0

    run_id = resumed[0]["run_id"]
    v = proj.marin("verify", run_id)
    assert v.returncode == 0 and "BIT-EXACT" in v.stdout, v.stdout + v.stderr
    v = proj.marin("verify", run_id, "--segments", "2", "--seed", "7")
    assert v.returncode == 0 and "interval" in v.stdout, v.stdout + v.stderr


def test_lineage_of_the_instruct_model_walks_back_to_the_base_run_and_the_raw_archives(_sft_project: Project) -> None:
    proj = _sft_project
    p = proj.marin("lineage", "models/instruct")
    assert p.returncode == 0, p.stderr
    [train], [sft] = proj.runs("train"), proj.runs("sft")
    [fetch] = proj.runs("fetch")
    archives = [r["path"] for r in records(fetch, "input")]
    for needle in (sft[0]["run_id"], train[0]["run_id"], proj.runs("instructions")[0][0]["run_id"], *archives):
        assert needle in p.stdout, (needle, p.stdout)
