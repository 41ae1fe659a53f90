"""Base and Instruct (issue 27) end to end on the mini corpus: the instruction set, the sft stage
(resumable, verified, with lineage back to the raw archives), your own conversations, the
evaluation of both models on the held-out instructions, and the export of the instruct model
that transformers answers with.

One session-scoped project is built once (tiny model, 64-token rows, a short fine-tune) and
copied by the tests that change it. Its corpus is the mini corpus's shape (prose files, verses
grouped by book and chapter) with one difference that makes a held-out question answerable: the
prose and the verses draw their words from two disjoint halves of the word list, so which corpus
a held-out line comes from can be learned (the mini corpus's two corpora are one distribution)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.conftest import BIN, Project, env_for_subprocess, evaluation
from tests.instruct_fixtures import INSTRUCTIONS, SFT, instruct_params

pytestmark = pytest.mark.slow

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
    assert [m["step"] for m in metrics] == list(range(10, 151, 10))
    first, last = metrics[0]["values"], metrics[-1]["values"]
    assert last["loss"]["value"] < first["loss"]["value"] / 2, (first, last)  # short answers: learnable
    assert last["val_loss"]["value"] < first["val_loss"]["value"]
    assert [c["step"] for c in records(sft, "checkpoint")] == [50, 100, 150]
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
        if steps and steps[-1] >= 70:  # past the first checkpoint (50)
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


def test_the_instruct_model_answers_held_out_instructions_far_better_than_the_base_model(
        _sft_project: Project) -> None:
    proj = _sft_project
    m = evaluation(proj.root, "metrics/instruct_eval.json", "evals/instruct_eval_context.json")
    heldout = [json.loads(x) for x in (proj.root / "data/instructions/heldout.jsonl").read_text().splitlines()]
    [run] = proj.runs("evaluate_instruct")
    evals = {r["name"]: r for r in records(run, "eval")}
    for name in ("base", "instruct"):  # the scores, recomputed from the recorded answers
        answers = evals[f"{name}_instructions"]["samples"]
        assert [a["prompt"] for a in answers] == [e["messages"][0]["content"] for e in heldout]
        hits = [a["completion"].strip() == e["messages"][1]["content"] for a, e in zip(answers, heldout, strict=True)]
        assert m[name]["exact_match"] == sum(hits) / len(heldout) and m[name]["examples"] == len(heldout)
    print(f"held-out exact match: base {m['base']['exact_match']:.3f}, instruct {m['instruct']['exact_match']:.3f}; "
          f"containment: base {m['base']['containment']:.3f}, instruct {m['instruct']['containment']:.3f}")
    tasks = sorted({e["task"] for e in heldout})
    for name in ("base", "instruct"):  # by task, with stderrs, recomputed from the recorded answers
        v, answers = evals[f"{name}_instructions"]["values"], evals[f"{name}_instructions"]["samples"]
        for task in tasks:
            hits = [float(a["completion"].strip() == e["messages"][1]["content"].strip())
                    for a, e in zip(answers, heldout, strict=True) if e["task"] == task]
            mean = sum(hits) / len(hits)
            se = (sum((h - mean) ** 2 for h in hits) / (len(hits) - 1)) ** 0.5 / len(hits) ** 0.5
            assert v[f"{task}/exact_match"]["value"] == pytest.approx(mean, abs=1e-12)
            assert v[f"{task}/exact_match_stderr"]["value"] == pytest.approx(se, abs=1e-12)
            assert v[f"{task}/examples"] == len(hits) == m[name]["by_task"][task]["examples"]
    const = evals["constant_answer_instructions"]["values"]
    for task in tasks:  # the constant answer: the task's most frequent reference, given to every example
        refs = [e["messages"][1]["content"] for e in heldout if e["task"] == task]
        top = max(refs.count(r) for r in refs)
        assert const[f"{task}/exact_match"]["value"] == pytest.approx(top / len(refs), abs=1e-12)
        assert refs.count(const[f"{task}/exact_match_answer"]) == top
        best = const[f"{task}/containment_answer"]
        assert best in refs and const[f"{task}/containment"]["value"] == pytest.approx(
            sum(r.strip().casefold() in best.casefold() for r in refs) / len(refs), abs=1e-12)
        assert const[f"{task}/containment"]["value"] >= const[f"{task}/exact_match"]["value"]
        print(f"{task}: constant answer {best!r}: containment {const[f'{task}/containment']['value']:.3f}")
    assert m["base"]["exact_match"] <= 0.05  # it never saw the chat format: near zero, and shown
    assert m["instruct"]["exact_match"] >= m["base"]["exact_match"] + 0.3
    assert m["instruct"]["by_task"]["corpus"]["exact_match"] >= 0.5


def pin_messages(proj: Project, lines: list[bytes]) -> None:
    """A messages JSONL in the project, pinned with `marin pin` as a fetch source of format messages."""
    (proj.root / "mine").mkdir(exist_ok=True)
    (proj.root / "mine/chat.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    p = proj.marin("pin", "mine/chat.jsonl", "--name", "mychat")
    assert p.returncode == 0, p.stderr
    sha = next(ln.split()[-1] for ln in p.stdout.splitlines() if ln.strip().startswith("sha256:"))
    params = proj.params
    params["fetch"]["sources"].append({"name": "mychat", "kind": "file", "locator": "mine/chat.jsonl", "sha256": sha,
                                       "license": "CC0-1.0", "extract": [{"corpus": "mychat", "include": ["*.jsonl"],
                                                                          "format": "messages"}]})
    proj.write_params(params)


def conversation(i: int) -> bytes:
    return json.dumps({"messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": f"What is {i} plus one?"},
                                    {"role": "assistant", "content": str(i + 1)}]}).encode()


def test_your_own_conversations_pinned_with_marin_pin_run_through_sft(sft_project: Project) -> None:
    proj = sft_project
    pin_messages(proj, [conversation(i) for i in range(20)])
    proj.git("add", "-A")
    proj.git("commit", "-qm", "my conversations")
    curated = proj.tree("data/curated")
    for stage in ("fetch", "curate", "instructions", "sft"):
        proj.stage(stage)
    assert proj.tree("data/curated") == curated  # not a corpus: curate skips it
    m = json.loads((proj.root / "data/instructions/manifest.json").read_text())
    [src] = m["sources"]
    assert src["name"] == "mychat" and src["license"] == "CC0-1.0" and src["conversations"] == 20
    assert m["sets"]["train"]["sources"]["mychat"] == 20
    own = [json.loads(x) for x in (proj.root / "data/instructions/train.jsonl").read_text().splitlines()
           if json.loads(x).get("source") == "mychat"]
    assert [r["messages"][1]["content"] for r in own] == [f"What is {i} plus one?" for i in range(20)]
    [instr] = proj.runs("instructions")[-1:]
    [inp] = [r for r in records(instr, "input") if r["name"] == "archive:mychat"]
    assert inp["license"] == "CC0-1.0" and inp["digest"] == src["digest"]
    sft = proj.runs("sft")[-1]
    assert sft[-1]["body"]["status"] == "succeeded"
    assert {r["name"]: r["digest"] for r in records(sft, "input")}["instructions"] == m["sets"]["train"]["digest"]


@pytest.mark.parametrize("bad, why", [
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "no assistant turn"),
    (json.dumps({"messages": [{"role": "narrator", "content": "hi"},
                              {"role": "assistant", "content": "x"}]}).encode(), "messages[0] has role 'narrator'"),
    (b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "x"}]}',
     "not UTF-8 at byte"),
])
def test_a_malformed_conversation_is_refused_in_one_line_naming_the_file_and_line(
        data_project: Project, bad: bytes, why: str) -> None:
    proj = data_project
    instruct_params(proj)
    pin_messages(proj, [conversation(0), conversation(1), bad, conversation(3)])
    proj.stage("fetch")
    ledger = proj.ledger_files()
    r = proj.stage("instructions", check=False)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("marin: error: chat.jsonl line 3: ") and why in r.stderr, r.stderr
    assert not (proj.root / "data/instructions").exists()
    assert proj.marin("ledger", "check").returncode == 0 and len(proj.ledger_files()) == len(ledger) + 1


def test_a_batch_larger_than_the_instruction_set_is_one_line(sft_project: Project) -> None:
    proj = sft_project
    n = sum(1 for _ in (proj.root / "data/instructions/train.jsonl").open())
    params = proj.params
    params["sft"]["batch_size"] = n + 1
    proj.write_params(params)
    r = proj.stage("sft", check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"data/instructions/train.jsonl: {n:,} conversations, fewer than one batch (sft.batch_size {n + 1})" \
        in r.stderr
    assert proj.marin("ledger", "check").returncode == 0


def test_transformers_answers_with_the_chat_template_exactly_as_the_jax_model(_sft_project: Project) -> None:
    """apply_chat_template + generate on models/hf-instruct give the JAX model's greedy answers
    (evaluate_instruct's records), token for token, for every held-out instruction whose prompt and
    answer fit the model's context (beyond it the JAX side keeps the last seq_len tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from marin.data import chat
    from marin.data import tokenize as tk

    proj = _sft_project
    out = proj.root / "models/hf-instruct"
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["chat_template"] == (proj.root / "data/tokens/chat_template.jinja").read_text() == chat.TEMPLATE
    ours = tk.load(proj.root / "data/tokens/tokenizer.json")
    heldout = [json.loads(x) for x in (proj.root / "data/instructions/heldout.jsonl").read_text().splitlines()]
    [run] = proj.runs("evaluate_instruct")
    [answers] = [r["samples"] for r in records(run, "eval") if r["name"] == "instruct_instructions"]
    n = INSTRUCTIONS["eval_tokens"]
    end = ours.token_to_id(chat.END)
    stopped = compared = 0
    for e, a in zip(heldout, answers, strict=True):
        enc = tok.apply_chat_template(e["messages"][:-1], add_generation_prompt=True, sanitize_control_tokens=True,
                                      return_tensors="pt", return_dict=True)
        ids = enc["input_ids"]
        assert ids[0].tolist() == chat.prompt_ids(ours, e["messages"][:-1], tk.EOS).tolist()
        if ids.shape[1] + n > proj.params["model"]["seq_len"]:
            continue
        compared += 1
        with torch.no_grad():
            gen = model.generate(**enc, max_new_tokens=n, do_sample=False)
        assert gen[0, ids.shape[1]:].tolist() == a["token_ids"], (e["messages"][0]["content"], a)
        stopped += a["token_ids"][-1] == end
    assert compared >= len(heldout) // 2 and stopped >= compared // 2  # most end at <|end|>, as generate did
