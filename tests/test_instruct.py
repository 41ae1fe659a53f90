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
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, WORDS, Project, copy_project, env_for_subprocess, mini_params, new_project, tiny

pytestmark = pytest.mark.slow

SFT = {"steps": 150, "batch_size": 16, "lr": 5.0e-3, "schedule": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1,
       "wsd_decay_fraction": 0.2, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": 1.0e-8,
       "grad_clip": 1.0, "log_every": 10, "checkpoint_every": 50}
INSTRUCTIONS = {"salt": "marin-instructions-v1", "per_document": 16, "heldout_max": 64,
                "tasks": ["corpus", "reference"], "eval_tokens": 8}  # short answers: a tiny model learns them


def instruct_params(proj: Project, **sft: object) -> None:
    params = proj.params
    params["model"]["seq_len"] = 64  # a question and its answer fit a row
    params["sft"] = {**SFT, **sft}
    params["instructions"] = INSTRUCTIONS
    proj.write_params(params)


def lines(rng: random.Random, words: list[str], n: int) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 12))).capitalize() + "." for _ in range(n)]


def make_instruct_corpus(dest: Path) -> Path:
    """Prose files and verse chapters (the mini corpus's layout) in two disjoint vocabularies."""
    rng, half = random.Random(27), len(WORDS) // 2
    (dest / "texts").mkdir(parents=True)
    for i in range(12):
        (dest / "texts" / f"doc{i:02d}.txt").write_text("\n".join(lines(rng, WORDS[:half], 40)) + "\n")
    with open(dest / "verses.jsonl", "w") as f:
        for book in ("Alpha", "Beta", "Gamma", "Delta"):
            for chapter in (1, 2, 3):
                for verse, text in enumerate(lines(rng, WORDS[half:], 8), 1):
                    f.write(json.dumps({"book": book, "chapter": chapter, "verse": verse, "text": text}) + "\n")
    return dest


@pytest.fixture(scope="session")
def _sft_project(tmp_path_factory: pytest.TempPathFactory) -> Project:
    corpus = make_instruct_corpus(tmp_path_factory.mktemp("instruct-corpus") / "mini")
    proj = new_project(tmp_path_factory.mktemp("instruct") / "proj", mini_params(corpus))
    tiny(proj)
    instruct_params(proj)
    proj.git("commit", "-qam", "instruct params")
    for stage in ("fetch", "curate", "tokenize", "train", "instructions", "sft", "evaluate_instruct",
                  "export_instruct"):
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
    m = json.loads((proj.root / "metrics/instruct_eval.json").read_text())
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


def test_the_instruct_card_names_the_base_model_the_data_and_the_recipe(_sft_project: Project) -> None:
    import yaml

    proj = _sft_project
    text = (proj.root / "models/hf-instruct/README.md").read_text()
    head, body = text.split("---\n", 2)[1:]
    meta = yaml.safe_load(head)
    assert "base_model" not in meta and meta["library_name"] == "transformers"  # no report.hub.repo_id: no made-up id
    assert meta["language"] == proj.params["report"]["language"] and meta["language"]  # as the base model's card
    cfg = json.loads((proj.root / "models/instruct/config.json").read_text())
    base = json.loads((proj.root / "models/final/config.json").read_text())
    m = json.loads((proj.root / "data/instructions/manifest.json").read_text())
    assert base["tensor_digest"] in body and cfg["tensor_digest"] in body
    assert m["sets"]["train"]["digest"] in body and m["inputs"]["train"] in body
    assert cfg["sft"] == {**SFT, "max_epochs_warning": 4.0}  # the train section's fields, defaults filled
    assert f"- `lr`: {SFT['lr']}" in body


def test_the_instruct_card_is_a_full_hub_card_with_its_own_evaluation(sft_project: Project) -> None:
    from huggingface_hub import ModelCard
    from huggingface_hub.repocard_data import model_index_to_eval_results

    proj = sft_project
    card = ModelCard.load(proj.root / "models/hf-instruct/README.md")
    for heading in ("How to use", "Uses", "Bias, risks and limitations", "Training details", "Evaluation",
                    "Environmental impact"):
        assert f"\n## {heading}\n" in card.text, heading
    name, results = model_index_to_eval_results(card.data.to_dict()["model-index"])
    ev = json.loads((proj.root / "metrics/instruct_eval.json").read_text())["instruct"]
    want = {("all", m): ev[m] for m in ("exact_match", "containment")}
    want |= {(t, m): v[m] for t, v in ev["by_task"].items() for m in ("exact_match", "containment")}
    assert name == f"{proj.params['report']['model_name']}-instruct" and len(want) >= 4
    assert {(r.dataset_config, r.metric_type): r.metric_value for r in results} == want
    [sft] = proj.runs("sft")
    assert f"Training run `{sft[0]['run_id']}` (stage `sft`" in card.text  # the run that wrote models/instruct
    params = proj.params  # a Hub repository given: the instruct card's base_model names it
    params["report"]["hub"] = {"repo_id": "marin-lab/marin-tiny"}
    proj.write_params(params)
    proj.stage("export_instruct")
    again = ModelCard.load(proj.root / "models/hf-instruct/README.md")
    assert again.data.base_model == "marin-lab/marin-tiny" and "hf upload marin-lab/" not in again.text


def test_dvc_plots_draw_the_sft_curve_against_its_step_column(_sft_project: Project) -> None:
    """`dvc plots show` draws dvc.yaml's named plots only, each against the curve's `step` column: the sft
    loss among them, and no curve file a second time against its row index."""
    import csv

    from marin.stages.dvcyaml import PLOTS

    shown = json.loads(_sft_project.dvc("plots", "show", "--json").stdout)["data"]
    assert set(shown) == {name for name, _, _ in PLOTS}  # no plot named after a file: none by row index
    rows = list(csv.DictReader((_sft_project.root / "metrics/sft_curve.csv").open()))
    [data] = [p["content"]["data"]["values"] for p in shown["sft_loss"] if p["type"] == "vega"]
    assert [(int(d["step"]), float(d["loss"])) for d in data] == [(int(r["step"]), float(r["loss"])) for r in rows]
    assert int(rows[1]["step"]) - int(rows[0]["step"]) == _sft_project.params["sft"]["log_every"] > 1  # not 0, 1, 2


def test_the_report_compares_base_and_instruct_side_by_side_from_the_ledger(sft_project: Project) -> None:
    proj = sft_project
    proj.stage("report")
    name = proj.params["report"]["model_name"]
    md = (proj.root / f"reports/{name}/report.md").read_text()
    facts = json.loads((proj.root / f"reports/{name}/report.json").read_text())["facts"]
    section = md.split("## Base and instruct", 1)[1].split("\n## ", 1)[0]
    m = json.loads((proj.root / "metrics/instruct_eval.json").read_text())
    [sft] = proj.runs("sft")
    assert sft[0]["run_id"] in section and proj.runs("instructions")[0][0]["run_id"] in section
    for model in ("base", "instruct"):
        [row] = [ln for ln in section.splitlines() if ln.startswith(f"| {model} |")]
        cited = [facts[fid]["value"] for fid in re.findall(r"#(F\d+)\)", row)]
        assert cited == [m[model]["exact_match"], m[model]["containment"], m[model]["examples"]], row
    # by task: each model's score ± stderr beside the constant answer, marked where not beyond 2 stderr above it
    [ev] = proj.runs("evaluate_instruct")
    const = next(r["body"]["values"] for r in ev if r["kind"] == "eval"
                 and r["body"]["name"] == "constant_answer_instructions")
    for task, by in m["instruct"]["by_task"].items():
        for key in ("exact_match", "containment"):
            [row] = [ln for ln in section.splitlines() if ln.startswith(f"| `{task}` |")
                     and f"| {key.replace('_', ' ')} |" in ln]
            cells = row.strip("|").split("|")
            cited = [facts[fid]["value"] for fid in re.findall(r"#(F\d+)\)", row)]
            # examples, the answer, its score, base (value, stderr, mark), instruct (value, stderr, mark)
            assert cited[:3] == [by["examples"], const[f"{task}/{key}_answer"], const[f"{task}/{key}"]["value"]]
            assert cited[3] == m["base"]["by_task"][task][key] and cited[6] == by[key]
            se = cited[7]
            beyond = by[key] - const[f"{task}/{key}"]["value"] > 2 * se
            assert ("**[not distinguishable" in cells[6] or "**[worse" in cells[6]) == (not beyond), row
    # every run the report cites is in its tables: the instruct export the section sends the reader to as well
    [exported] = proj.runs("export_instruct")
    for title in ("Lineage", "Verification status"):
        assert f"| export_instruct | `{exported[0]['run_id']}` |" in md.split(f"\n## {title}\n", 1)[1].split("\n## ")[0]
    assert proj.marin("report", "verify", f"reports/{name}").returncode == 0
