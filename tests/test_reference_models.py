"""Reference models beside ours (issue 39, item 5): a second model this project trains and exports is
listed in evaluate.references as a Hugging Face folder pinned by digest. Its stage, reference_<name>,
records lm-eval's own ``hf`` model on exactly the evaluate stage's requests; the values equal
``lm_eval.simple_evaluate(model="hf", ...)`` run here by hand on the same folder, and its bits per
byte equal transformers' own loss on the validation text. One changed byte of its weights makes
``dvc status`` name its stage only, and the report shows it beside our model."""

from __future__ import annotations

import json
import math
import re
import shutil

import pyarrow.parquet as pq
import pytest

from tests.conftest import BIN, Project, evaluation

pytestmark = pytest.mark.slow

NAME, FOLDER, STAGE = "tiny", "refs/tiny", "reference_tiny"
TASKS = ("marin_cloze", "marin_cloze_fewshot", "marin_next_word")


def _list(proj: Project, sha256: str) -> None:
    params = proj.params
    params["evaluate"]["references"] = [{"name": NAME, "path": FOLDER, "sha256": sha256, "license": "Apache-2.0"}]
    proj.write_params(params)


def _commit(proj: Project, message: str) -> None:
    proj.git("add", "-A")
    proj.git("commit", "-qm", message)


def _by_hand(proj: Project, monkeypatch: pytest.MonkeyPatch) -> dict:
    """lm-eval's hf model on the folder, as a user would run it, with evaluate's harness settings."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    hp = proj.params["evaluate"]["harness"]
    monkeypatch.chdir(proj.root)  # the built-in tasks name their data relative to the project
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(k, "1")
    tm = TaskManager(include_path=[str(proj.root / "marin/evaluate/tasks")], include_defaults=False)
    seed = hp["seed"]
    return lm_eval.simple_evaluate(
        model="hf", model_args={"pretrained": str(proj.root / FOLDER), "dtype": "float32"}, device="cpu",
        batch_size=hp["batch_size"], tasks=list(TASKS), task_manager=tm, limit=hp["limit"],
        num_fewshot=hp["num_fewshot"], random_seed=seed, numpy_random_seed=seed, fewshot_random_seed=seed,
        torch_random_seed=None, bootstrap_iters=1000)


def _bits_per_byte(proj: Project) -> float:
    """transformers' own mean cross-entropy (labels=...) over each document's windows of the model's
    context, after its start token, summed over the validation text, in bits per UTF-8 byte."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(proj.root / FOLDER, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(proj.root / FOLDER)
    ctx = model.config.max_position_embeddings
    start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    nats, n_bytes = 0.0, 0
    for text in pq.read_table(proj.root / "data/curated/validation.parquet", columns=["text"]).column(0).to_pylist():
        seq = [start, *tok(text, add_special_tokens=False)["input_ids"]]
        for j in range(0, len(seq) - 1, ctx):
            window = seq[j:j + ctx + 1]  # ctx inputs, the last one only a label
            x = torch.tensor([window])
            with torch.no_grad():  # HF shifts the labels itself: every token of the window but the first is one
                loss = model(x, labels=x).loss
            nats += float(loss) * (len(window) - 1)
        n_bytes += len(text.encode("utf-8"))
    return nats / math.log(2) / n_bytes


def test_a_second_trained_model_is_scored_beside_ours_as_a_reference(trained_project: Project,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    proj = trained_project
    proj.stage("export")  # models/hf: our tiny model as a Hugging Face folder, the second model here
    shutil.copytree(proj.root / "models/hf", proj.root / FOLDER)
    _list(proj, "0" * 64)
    assert proj.marin("stages", "--write").returncode == 0
    spec = proj.run("git", "diff", "dvc.yaml").stdout
    assert f"{STAGE}:" in spec and "pipeline.reference tiny" in spec and f"- {FOLDER}" in spec, spec
    p = proj.run(str(BIN / "python"), "-m", "pipeline.reference", NAME)
    [line] = p.stderr.strip().splitlines()  # the placeholder pin: refused in one line that prints the digest
    found = re.search(rf"{FOLDER} has sha256 ([0-9a-f]{{64}}), params.yaml pins 0{{64}}", line)
    assert p.returncode != 0 and found, line

    _list(proj, found.group(1))
    assert proj.marin("stages", "--check").returncode == 0
    _commit(proj, "a reference model")
    proj.dvc("commit", "-f", "train", "evaluate")  # their outputs are this project's, made by the stages above
    proj.dvc("repro", "--single-item", STAGE)
    _commit(proj, "scored")
    [run] = proj.runs(STAGE)[-1:]
    records = {r["body"]["name"]: r["body"] for r in run if r["kind"] == "eval" and "corpus" not in r["body"]}
    inputs = {r["body"]["name"]: r["body"] for r in run if r["kind"] == "input"}
    assert inputs["model"]["path"] == FOLDER and inputs["model"]["license"] == "Apache-2.0"

    theirs = _by_hand(proj, monkeypatch)
    for task in TASKS:
        mine = records[f"harness:{task}"]["values"]
        assert mine["samples"] == theirs["n-samples"][task]["effective"] > 0
        compared = [k for k in theirs["results"][task] if k.endswith(",none")]
        assert {"acc,none", "acc_stderr,none"} <= set(compared), compared
        for key in compared:
            assert math.isclose(mine[key.removesuffix(",none")]["value"], theirs["results"][task][key],
                                abs_tol=1e-6), (task, key)
    bpb = records["model"]["values"]["bits_per_byte"]["value"]
    assert math.isclose(bpb, _bits_per_byte(proj), rel_tol=1e-6), bpb
    ours = json.loads((proj.root / "metrics/eval.json").read_text())["bits_per_byte"]
    assert math.isclose(bpb, ours, rel_tol=1e-5), (bpb, ours)  # the same model and text, JAX and torch
    metrics = evaluation(proj.root, f"metrics/reference/{NAME}.json", f"evals/reference/{NAME}.json")
    # the folder is this project's export byte for byte: its ledger states parameters and tokens (issue 57, item 1)
    [train] = proj.runs("train")
    n_params = next(r["body"]["meta"]["n_params"] for r in train if r["kind"] == "output" and r["body"]["name"] ==
                    "model")
    hp = proj.params["train"]
    tokens = hp["steps"] * hp["batch_size"] * proj.params["model"]["seq_len"]
    assert metrics["bits_per_byte"] == bpb and (metrics["parameters"], metrics["training_tokens"]) == (n_params, tokens)
    assert metrics["stated_by"] == "ledger" and metrics["training_run"] == train[0]["run_id"]
    assert inputs["training_run"]["path"].startswith("ledger/runs/train-")  # a replay reads the same run again
    cost = records["cost"]["values"]  # lm-eval's batching: batch_size windows a forward pass, not one
    assert cost["validation_forward_passes"] * hp_batch(proj) >= cost["validation_windows"] > 0
    assert cost["validation_forward_passes"] < cost["validation_windows"] / 2, cost
    assert cost["harness_samples"] == sum(records[f"harness:{t}"]["values"]["samples"] for t in TASKS)
    assert metrics["cost"] == cost

    blob = proj.root / FOLDER / "model.safetensors"  # one byte of its weights
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))
    p = proj.run(str(BIN / "python"), "-m", "pipeline.reference", NAME)
    assert p.returncode != 0 and found.group(1) in p.stderr, p.stderr  # the pin no longer holds
    _list(proj, re.search(r"has sha256 ([0-9a-f]{64})", p.stderr).group(1))  # re-pinned
    status = proj.dvc("status", "train", "evaluate", STAGE).stdout
    named = re.findall(r"^(\S+):$", status, re.M)
    assert named == [STAGE] and FOLDER in status, status
    marin = proj.marin("status")
    stale = [x for x in (marin.stdout + marin.stderr).splitlines() if x.startswith("stale:")]
    assert [x.split()[1] for x in stale] == [STAGE] and FOLDER in stale[0], stale

    blob.write_bytes(bytes(data[:-1] + bytearray([data[-1] ^ 1])))  # back: the scored bytes
    _list(proj, found.group(1))
    proj.marin("keygen", "--if-missing", check=True)
    proj.marin("report", check=True)
    report = (proj.root / "reports/marin-tiny/report.md").read_text()
    built = json.loads((proj.root / "reports/marin-tiny/report.json").read_text())
    [ref], facts = built["doc"]["reference_models"], built["facts"]
    for task in TASKS:  # the report's numbers are lm-eval's by hand
        for key, value in theirs["results"][task].items():
            if key.endswith(",none") and "_stderr" not in key:
                cited = facts[ref["results"][f"{task} {key.removesuffix(',none')}"][""]]["value"]
                assert math.isclose(cited, value, abs_tol=1e-6), (task, key)
    row = next(x for x in report[report.index("### Reference models"):].splitlines() if x.startswith(f"| {NAME} "))
    shown = [facts[ref["results"]["marin_cloze acc"][""]], facts[ref["bits_per_byte"]], facts[ref["parameters"]]]
    assert shown[1]["value"] == bpb and shown[2]["value"] == n_params
    assert all(f"[{x['text']}](#{x['id']})" in row for x in shown), row
    # torch made the reference's numbers: its version, as the reference run recorded it, is in the package list
    run = next(r for r in proj.runs(STAGE) if r[0]["run_id"] == ref["run_id"])  # the run the report cites
    torch_version = run[0]["body"]["determinism_class"]["torch"]
    [packages] = [x for x in report.splitlines() if x.startswith("| packages |")]
    shown_torch = re.search(rf"torch \(reference_{NAME} run\) \[[^\]]+\]\(#(F\d+)\)", packages)
    assert shown_torch and facts[shown_torch.group(1)]["value"] == torch_version, packages
    assert proj.marin("report", "verify", "reports/marin-tiny").returncode == 0


def hp_batch(proj: Project) -> int:
    return proj.params["evaluate"]["harness"]["batch_size"]


def test_a_reference_is_a_stage_of_its_own_and_evaluate_no_longer_tracks_the_list(tmp_path) -> None:
    import yaml

    from marin import stages
    from tests.conftest import REPO

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert "references" not in params["evaluate"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert stages.declared(tmp_path) == stages.STAGES  # the default pipeline is the declared one
    params["evaluate"]["references"] = [{"name": "pythia-160m", "path": "refs/pythia-160m", "sha256": "a" * 64,
                                         "license": "Apache-2.0"}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    got = {s.name: s for s in stages.declared(tmp_path)}
    ref = got["reference_pythia-160m"]
    assert ref.cmd == "python -m pipeline.reference pythia-160m" and "refs/pythia-160m" in ref.deps
    assert stages.entry_modules(ref.name) == ("pipeline.reference", "marin.evaluate.reference_stage")
    for name in ("evaluate", "export"):
        assert "evaluate" not in got[name].params and "evaluate.harness" in got[name].params
        assert not any("references" in p for p in got[name].params)
    # the report shows the references' scores: DVC runs it after every reference stage (issue 57, item 1)
    assert "metrics/reference/pythia-160m.json" in got["report"].deps
    assert not any("metrics/reference" in d for s in got.values() if s.name != "report" for d in s.deps)


def test_the_card_states_parameters_and_tokens_or_not(tmp_path) -> None:
    from marin.evaluate.reference_stage import NOT_STATED, card_facts

    (tmp_path / "README.md").write_text("---\nlicense: apache-2.0\nparameters: 162322944\n"
                                        "training_tokens: 300000000000\n---\n# a model\n")
    assert card_facts(tmp_path) == {"parameters": 162322944, "training_tokens": 300000000000, "stated_by": "card"}
    (tmp_path / "README.md").write_text("# no metadata\n")
    (tmp_path / "config.json").write_text(json.dumps({"num_parameters": 1000, "model_type": "llama"}))
    assert card_facts(tmp_path) == {"parameters": 1000, "training_tokens": NOT_STATED, "stated_by": "card"}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert card_facts(tmp_path) == {"parameters": NOT_STATED, "training_tokens": NOT_STATED, "stated_by": "card"}


def test_a_reference_added_to_the_shipped_project_is_in_the_report_after_one_dvc_repro(_shipped, tmp_path) -> None:
    """Issue 57's must-show: list a reference, `dvc repro` once: its stage runs with its progress shown, then the
    report, which shows it with its cost; `dvc status` is clean. The shipped KJV's own licence is shown beside the
    package's in the report, the uploaded card and `marin trace`."""
    from marin import hashing
    from tests.conftest import copy_project

    shipped, _ = _shipped
    proj = copy_project(shipped, tmp_path / "proj")
    proj.env.update({**shipped.env, "MARIN_PROGRESS": "always"})
    shutil.copytree(proj.root / "models/hf", proj.root / FOLDER)  # this project's export, as a reference
    _list(proj, hashing.dir_digest(proj.root / FOLDER).removeprefix(hashing.PREFIX))
    proj.marin("stages", "--write", check=True)
    p = proj.dvc("repro")
    ran = re.findall(r"Running stage '([^']+)'", p.stdout)  # evaluate and export too, once: with a reference listed
    assert STAGE in ran and ran[-1] == "report" and set(ran) <= {"evaluate", "export", STAGE, "report"}, ran
    # they declare the keys of evaluate but references (docs/guide/harness.md)
    assert f"reference {NAME}: validation text: 100%" in p.stderr.replace("\r", "\n"), p.stderr[-2000:]
    assert re.search(rf"reference {NAME}: cost: harness [\d.]+ s, \d+ forward passes", p.stdout), p.stdout
    assert "up to date" in proj.dvc("status").stdout

    report = (proj.root / "reports/marin-tiny/report.md").read_text()
    facts = json.loads((proj.root / "reports/marin-tiny/report.json").read_text())["facts"]
    section = report[report.index("### Reference models"):]
    row = next(x for x in section.splitlines() if x.startswith(f"| {NAME} "))
    ours = next(x for x in section.splitlines() if x.startswith("| this model "))
    def shown(line: str) -> list[str]:  # parameters and tokens as printed, without their facts' anchors
        return [re.sub(r"\(#F\d+\)", "", x) for x in line.split(" | ")[3:5]]

    assert shown(row) == shown(ours), (row, ours)  # parameters and tokens: its ledger's, the same as ours
    [note] = [x for x in section.splitlines() if x.startswith(f"- `{NAME}` took ")]
    [wall] = [facts[i]["value"] for i in re.findall(r"\(#(F\d+)\)", note)[:1]]
    [run] = proj.runs(STAGE)
    assert wall == run[-1]["body"]["wall_s"] and "forward passes" in note, note
    assert proj.marin("report", "verify", "reports/marin-tiny").returncode == 0

    # the KJV is public domain; MIT is the licence of the package that ships it (issue 57, item 2)
    [kjv] = [x for x in report.splitlines() if x.startswith("| kjv |")]
    assert "MIT" in kjv and "public-domain" in kjv, kjv
    [card] = [x for x in (proj.root / "models/hf/README.md").read_text().splitlines() if x.startswith("| `kjv` |")]
    assert "| MIT | public-domain |" in card, card
    t = proj.marin("trace", "In the beginning God created the heaven and the earth.", check=True).stdout
    assert "(kjv/bible, text public-domain, archive MIT)" in t, t


def test_items_the_two_frameworks_score_differently_are_named(tmp_path) -> None:
    """lm-eval's in-memory samples (tuples) against evaluate's samples file (JSON lists): the item whose score
    differs is named, and the largest log-likelihood difference is over every request."""
    from marin.evaluate.reference_agreement import Ours, compare

    ours = [{"task": "t", "doc_id": 0, "metrics": ["acc"], "acc": 1, "target": " a", "resps": [[[-1.0, False]],
                                                                                             [[-2.0, False]]]},
            {"task": "t", "doc_id": 1, "metrics": ["acc"], "acc": 0, "target": " b", "resps": [[[-3.0, False]]]}]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in ours))
    theirs = [{**ours[0], "acc": 0, "resps": [[(-1.0000004, False)], [(-2.0, False)]]},
              {**ours[1], "resps": [[(-3.0000001, False)]]}]
    [got] = compare(tmp_path, Ours("evaluate-x", "ledger/runs/evaluate-x.jsonl", "samples.jsonl"), {"t": theirs}
                    ).values()
    assert (got["items"], got["differing"], got["differing_items"]) == (2, 1, '#0 " a"')
    assert math.isclose(got["largest_loglikelihood_difference"]["value"], 4e-7, rel_tol=1e-6), got
