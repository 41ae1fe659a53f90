"""The harness in the pipeline: evalsets cut from the validation split only, each built-in task run
through ``lm_eval.simple_evaluate`` on the JAX adapter and recorded, ``marin verify`` bit-exact and
a forged task value named, a lab's own task YAML run by name, a task without local data failing
in one line while the others are recorded."""

from __future__ import annotations

import hashlib
import json

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import Project
from tests.test_verify import records, rewrite_chain, run_file, run_id, verifications, verify

pytestmark = pytest.mark.slow

BUILTIN = ("marin_cloze", "marin_cloze_fewshot", "marin_next_word")


def harness_records(proj: Project) -> dict[str, dict]:
    [run] = proj.runs("evaluate")[-1:]
    return {r["body"]["name"].removeprefix("harness:"): r["body"] for r in run
            if r["kind"] == "eval" and r["body"]["name"].startswith("harness:")}


def _jsonl(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def expected_mark(v: dict, unigram: dict, metric: str) -> str:
    """The mark, recomputed here from recorded values: beyond 2 stderr of the best baseline or not."""
    sign = 1 if metric != "perplexity" else -1
    base = [b["value"] for b in (v.get(f"chance/{metric}"), unigram.get(metric), v.get(f"constant/{metric}")) if b]
    gap = sign * v[metric]["value"] - max(sign * b for b in base)
    se = v[f"{metric}_stderr"]["value"]
    return ("better than baseline" if gap > 2 * se else "worse than baseline" if gap < -2 * se
            else "not distinguishable from baseline")


def test_evalsets_come_from_validation_documents_only(trained_project: Project) -> None:
    root = trained_project.root
    texts = {r["doc_id"]: r["text"] for r in pq.read_table(root / "data/curated/validation.parquet").to_pylist()}
    train = {r["doc_id"] for r in pq.read_table(root / "data/curated/train.parquet", columns=["doc_id"]).to_pylist()}
    m = json.loads((root / "data/evalsets/manifest.json").read_text())
    for name in ("cloze", "cloze_shots", "next_word"):
        items = _jsonl(root / f"data/evalsets/{name}.jsonl")
        assert items and m["files"][name]["items"] == len(items)
        assert m["files"][name]["digest"] == "sha256:" + hashlib.sha256(
            (root / f"data/evalsets/{name}.jsonl").read_bytes()).hexdigest()
        assert m["files"][name]["licenses"] == ["CC0-1.0"]  # the mini corpus's licence
        for it in items:
            assert it["doc_id"] in texts and it["doc_id"] not in train
            words = " ".join(texts[it["doc_id"]].split())
            last = it["target"] if "target" in it else it["choices"][it["gold"]]
            cut = f"{it['context']} {last}"
            assert cut in words  # a verbatim run of the document's words
    for it in _jsonl(root / "data/evalsets/next_word.jsonl"):
        assert len({c.casefold() for c in it["choices"]}) == 4 and 0 <= it["gold"] < 4
    test_ids = {it["id"] for it in _jsonl(root / "data/evalsets/cloze.jsonl")}
    assert not test_ids & {it["id"] for it in _jsonl(root / "data/evalsets/cloze_shots.jsonl")}
    [run] = trained_project.runs("evalsets")
    outs = {r["body"]["name"]: r["body"]["digest"] for r in run if r["kind"] == "output"}
    assert outs["evalset:cloze"] == m["files"]["cloze"]["digest"]


def test_each_builtin_task_is_recorded_and_its_values_recomputed(trained_project: Project) -> None:
    got = harness_records(trained_project)
    assert list(got) == list(BUILTIN)
    cloze = _jsonl(trained_project.root / "data/evalsets/cloze.jsonl")
    for name, body in got.items():
        v = body["values"]
        assert body["split"] == "harness" and "error" not in v
        assert v["harness_version"] == "0.4.13" and v["fewshot_seed"] == 1234
        assert v["num_fewshot"] == (2 if name == "marin_cloze_fewshot" else 0)
        for metric, value in v.items():
            if isinstance(value, dict):
                assert float.fromhex(value["hex"]) == value["value"], (name, metric)
        assert {"acc", "acc_stderr"} <= set(v) and v["task_config_digest"].startswith("sha256:")
    assert got["marin_cloze"]["values"]["samples"] == min(200, len(cloze))
    assert {"perplexity", "perplexity_stderr"} <= set(got["marin_cloze"]["values"])
    assert {"acc_norm", "acc_norm_stderr"} <= set(got["marin_next_word"]["values"])
    # the adapter by hand, without lm-eval's task machinery: the same accuracy and per-sample digest
    from marin.data import tokenize as tk
    from marin.evaluate import harness_run
    from marin.evaluate.harness import MarinLM
    from marin.model import weights

    root = trained_project.root
    graphdef, params, config = weights.load(root / "models/final")
    manifest = json.loads((root / "data/tokens/manifest.json").read_text())
    lm = MarinLM(graphdef, params, tk.load(root / "data/tokens/tokenizer.json"), manifest["tokenizer"]["eos_id"],
                 config["model"]["max_seq_len"])
    pairs = [lm._encode_pair(it["context"], " " + it["target"]) for it in cloze]
    scored = lm._loglikelihood_tokens([(None, c, x) for c, x in pairs])
    acc = sum(g for _, g in scored) / len(scored)
    assert got["marin_cloze"]["values"]["acc"]["value"] == pytest.approx(acc, abs=1e-12)
    # The per-sample digest is over exact log-likelihood bits, which depend on the XLA flags of the process
    # (the stage runs under the determinism profile; this pytest worker may have started JAX otherwise): its
    # bit-for-bit replay is test_verify_replays_the_harness_bit_exact_and_names_a_forged_value. Here: its form.
    samples = [{"doc_id": i, "resps": [[[ll, g]]]} for i, (ll, g) in enumerate(scored)]
    assert len(harness_run.samples_digest(samples)) == len(got["marin_cloze"]["values"]["loglikelihoods_digest"])
    metrics = json.loads((root / "metrics/eval.json").read_text())["harness"]
    assert metrics["marin_next_word"]["acc"] == got["marin_next_word"]["values"]["acc"]["value"]
    # the unigram baseline on the same questions: the choice whose tokens are most frequent in train
    import numpy as np

    [run] = trained_project.runs("evaluate")[-1:]
    base = {r["body"]["name"]: r["body"]["values"] for r in run if r["body"].get("name", "").startswith("unigram:")}
    assert set(base) == {f"unigram:{t}" for t in BUILTIN}
    train = np.concatenate([np.concatenate(pq.read_table(root / "data/tokens" / s["file"])["tokens"].to_numpy(
        zero_copy_only=False)) for s in manifest["splits"]["train"]["shards"]])
    counts = np.bincount(train, minlength=config["model"]["vocab_size"])[:config["model"]["vocab_size"]] + 1.0
    logp = np.log(counts / counts.sum())
    questions = _jsonl(root / "data/evalsets/next_word.jsonl")
    right = 0
    for it in questions:
        ctx = it["context"]
        scores = [logp[lm._encode_pair(ctx, " " + c)[1]].sum() for c in it["choices"]]
        right += int(np.argmax(scores)) == it["gold"]
    assert base["unigram:marin_next_word"]["acc"]["value"] == pytest.approx(right / len(questions), abs=1e-12)


def test_verify_replays_the_harness_bit_exact_and_names_a_forged_value(trained_project: Project) -> None:
    path = run_file(trained_project, "evaluate")
    p = verify(trained_project, run_id(path))
    assert p.returncode == 0, p.stdout + p.stderr
    [v] = verifications(path)
    assert v["result"] == "bit-exact"
    assert v["compared"]["output"] == 5  # metrics/eval.json and its context, the results JSON and samples JSONL,
    # the traced samples
    # lm-eval's results JSON and samples JSONL: outputs of the run, by digest, agreeing with its eval records
    root = trained_project.root
    outs = {r["body"]["name"]: r["body"] for r in records(path) if r["kind"] == "output"}
    for name, file in (("harness_results", "evals/harness/results.json"), ("harness_samples",
                                                                           "evals/harness/samples.jsonl")):
        assert outs[name]["path"] == file
        assert outs[name]["digest"] == "sha256:" + hashlib.sha256((root / file).read_bytes()).hexdigest()
    evals = {r["body"]["name"].removeprefix("harness:"): r["body"]["values"] for r in records(path)
             if r["kind"] == "eval" and r["body"]["name"].startswith("harness:")}
    results = json.loads((root / "evals/harness/results.json").read_text())
    lines = (root / "evals/harness/samples.jsonl").read_text().splitlines()
    samples = [json.loads(x) for x in lines]
    for task, v in evals.items():
        mine = [x for x in samples if x["task"] == task]
        assert len(mine) == v["samples"] and [x["doc_id"] for x in mine] == sorted(x["doc_id"] for x in mine)
        assert sum(x["acc"] for x in mine) / len(mine) == pytest.approx(v["acc"]["value"], abs=1e-12)
        assert results["results"][task]["acc,none"] == v["acc"]["value"]
        assert results["n-samples"][task]["effective"] == v["samples"]
    # one sample edited after the run: verify names it (task and document), though the replay agrees with the record
    k = next(i for i, x in enumerate(samples) if x["task"] == "marin_next_word")
    edited = {**samples[k], "acc": 1.0 - samples[k]["acc"]}
    original = (root / "evals/harness/samples.jsonl").read_bytes()
    (root / "evals/harness/samples.jsonl").write_text("\n".join([*lines[:k], json.dumps(edited), *lines[k + 1:]])
                                                      + "\n")
    p = verify(trained_project, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"line {k + 1}: task marin_next_word doc {samples[k]['doc_id']}: acc differ" in p.stdout
    assert verifications(path)[-1]["first_divergence"]["name"] == "harness_samples"
    (root / "evals/harness/samples.jsonl").write_bytes(original)
    recs = [r for r in records(path) if r["kind"] != "verification"]
    rec = next(r for r in recs if r["kind"] == "eval" and r["body"]["name"] == "harness:marin_next_word")
    better = min(1.0, rec["body"]["values"]["acc"]["value"] + 0.25)
    rec["body"]["values"]["acc"] = {"value": better, "hex": better.hex()}
    rewrite_chain(path, recs)
    assert trained_project.marin("ledger", "check").returncode == 0  # only the replay can tell
    p = verify(trained_project, run_id(path))
    assert p.returncode == 1, p.stdout + p.stderr
    d = verifications(path)[-1]["first_divergence"]
    assert (d["seq"], d["kind"], d["name"]) == (rec["seq"], "eval", "harness:marin_next_word")
    assert list(d["recorded"]) == ["acc"] and d["recorded"]["acc"]["value"] == better  # only the forged value
    assert f"seq {rec['seq']} eval harness:marin_next_word: acc recorded" in p.stdout


LAB_TASK = """task: lab_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: labtasks/lab.jsonl
test_split: test
output_type: loglikelihood
doc_to_text: "{{prompt}}"
doc_to_target: "{{' ' + answer}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""


def test_a_lab_task_runs_by_name_and_one_without_local_data_fails_in_one_line(trained_project: Project) -> None:
    root = trained_project.root
    (root / "labtasks").mkdir()
    (root / "labtasks/lab.yaml").write_text(LAB_TASK)
    (root / "labtasks/lab.jsonl").write_text("".join(json.dumps({"prompt": f"The king and the {w}", "answer": w})
                                                     + "\n" for w in ("lord", "queen", "crown")))
    (root / "labtasks/hub.yaml").write_text(LAB_TASK.replace("lab_cloze", "lab_hub").replace(
        "dataset_path: json", "dataset_path: EleutherAI/lambada_openai").replace("    test: labtasks/lab.jsonl\n",
                                                                                  "    test: x.jsonl\n"))
    params = trained_project.params
    params["evaluate"]["harness"] = {"tasks": ["lab_cloze", "lab_hub", "marin_next_word"], "include": ["labtasks"],
                                     "limit": 10, "seed": 7}
    trained_project.write_params(params)
    assert trained_project.marin("stages", "--write").returncode == 0  # labtasks/ a dependency of evaluate
    p = trained_project.stage("evaluate", check=False)
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip().splitlines() == [
        "marin: error: harness task 'lab_hub': dataset 'EleutherAI/lambada_openai' is not local (there is no hub "
        "here); use dataset_path: json with dataset_kwargs.data_files inside the project"]
    got = harness_records(trained_project)
    assert list(got) == ["lab_cloze", "lab_hub", "marin_next_word"]
    assert got["lab_cloze"]["values"]["samples"] == 3 and "acc" in got["lab_cloze"]["values"]
    assert got["lab_hub"]["values"] == {"error": p.stderr.strip().removeprefix("marin: error: ")}
    assert got["marin_next_word"]["values"]["fewshot_seed"] == 7
    # the terminal: each metric with its stderr, its baselines, its mark where not better, samples of items, limit
    [run] = trained_project.runs("evaluate")[-1:]
    unigram = next(r["body"]["values"] for r in run if r["body"].get("name") == "unigram:marin_next_word")
    v = got["marin_next_word"]["values"]
    [line] = [x for x in p.stdout.splitlines() if x.startswith("evaluate: harness marin_next_word: ")]
    parts = line.removeprefix("evaluate: harness marin_next_word: ").rsplit(" (", 1)[0].split("; ")
    for metric in ("acc", "acc_norm"):
        [part] = [x for x in parts if x.startswith(f"{metric} ")]
        assert f"{metric} {v[metric]['value']:.4f} ± {v[f'{metric}_stderr']['value']:.4f} (chance 0.2500, unigram " \
            f"{unigram[metric]['value']:.4f}, constant answer {v[f'constant/{metric}']['value']:.4f})" in part
        mark = expected_mark(v, unigram, metric)
        assert part.endswith(f"): {mark}" if mark != "better than baseline" else ")"), part
    assert line.endswith(f"({v['samples']} of {v['items']} samples, limit 10, 0-shot)")
    metrics = json.loads((root / "metrics/eval.json").read_text())["harness"]
    assert set(metrics) == {"lab_cloze", "marin_next_word"}


def test_results_are_shown_in_the_report_the_card_and_mlflow(trained_project: Project) -> None:
    from mlflow import MlflowClient

    from marin.report import harness_section

    proj = trained_project
    recorded = harness_records(proj)
    proj.stage("export")  # models/hf/README.md, below; before the report, which then shows the export
    proj.marin("report", check=True)
    report = (proj.root / "reports/marin-tiny/report.md").read_text()
    table = report[report.index("### Benchmarks (lm-evaluation-harness)"):].split("\n\n")[2].splitlines()
    assert table[0] == ("| task | metric | chance | unigram baseline | constant answer | model | ± stderr | "
                        "against baseline | clean items | samples | shots |")  # the session's project decontaminated
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in table[2:]}
    [run] = proj.runs("evaluate")[-1:]
    unigram = {r["body"]["name"].removeprefix("unigram:"): r["body"]["values"] for r in run
               if r["kind"] == "eval" and r["body"]["name"].startswith("unigram:")}
    marks = {}
    for task, body in recorded.items():
        v = body["values"]
        for metric in harness_section.metrics(v):
            cells = rows.pop((f"`{task}`", metric)).strip("|").split("|")
            shown = float(cells[5].strip()[1:].split("]")[0].replace(",", ""))
            assert shown == pytest.approx(v[metric]["value"], abs=1e-4, rel=1e-6)
            if task == "marin_next_word":
                assert "[0.25" in cells[2]  # the task's stated chance level
            assert cells[3].strip().startswith("[")  # the unigram baseline, cited
            if f"clean/{metric}" in v:  # the score on the items no training text shares a 13-gram with
                clean = float(cells[8].strip()[1:].split("]")[0].replace(",", ""))
                assert clean == pytest.approx(v[f"clean/{metric}"]["value"], abs=1e-4, rel=1e-6)
                n = v["contaminated"]["value"] if isinstance(v["contaminated"], dict) else v["contaminated"]
                assert f"[{n}](#" in cells[8] and "contaminated)" in cells[8], cells[8]
            assert cells[9].strip().startswith(f"[{v['samples']}")
            assert ("limit [" in cells[9]) == ("limit" in v)  # stated where one is set
            assert "limit" not in v or f"limit [{v['limit']}]" in cells[9]
            marks[(task, metric)] = expected_mark(v, unigram[task], metric)
            assert f"[{marks[(task, metric)]}]" in cells[7]
            assert cells[7].strip().startswith("**") == (marks[(task, metric)] != "better than baseline")
    assert not rows  # one row per recorded task and metric, nothing else
    assert any(m != "better than baseline" for m in marks.values())  # the tiny model: some below its baseline
    assert "How each stderr was computed: acc: [sample standard deviation / sqrt(n)" in report
    assert "perplexity: [bootstrap: 1000 resamples" in report
    card_md = (proj.root / "reports/marin-tiny/model_card.md").read_text()
    card_rows = card_md[card_md.index("### Benchmarks (lm-evaluation-harness)"):].split("\n\n")[2].splitlines()[2:]
    for (task, metric), mark in marks.items():  # the card's own table carries the same mark
        [line] = [x for x in card_rows if x.startswith(f"| `{task}` | {metric} |")]
        assert f"[{mark}]" in line.split("|")[8]
    card = yaml.safe_load((proj.root / "reports/marin-tiny/model_card.md").read_text().split("---")[1])
    [index] = card["model-index"]
    listed = {(r["task"]["name"], m["type"]): m["value"] for r in index["results"] for m in r["metrics"]}
    names = {(r["task"]["name"], m["type"]): m["name"] for r in index["results"] for m in r["metrics"]}
    for (task, metric), mark in marks.items():  # the model-index names the samples, limit and mark
        v = recorded[task]["values"]
        limit = f" (limit {v['limit']})" if "limit" in v else ""
        assert f"{v['samples']} of {v['items']} samples{limit}" in names[(task, metric)]
        assert names[(task, metric)].endswith(f"; {mark})") == (mark != "better than baseline")
    for task, body in recorded.items():
        for metric in harness_section.metrics(body["values"]):
            assert listed[(task, metric)] == body["values"][metric]["value"]
    # the same values in models/hf/README.md, which the export writes from metrics/eval.json
    hub = yaml.safe_load((proj.root / "models/hf/README.md").read_text().split("---")[1])
    [hub_index] = hub["model-index"]
    exported = {(r["task"]["name"], m["type"]): m["value"] for r in hub_index["results"] for m in r["metrics"]
                if r["task"]["name"] in recorded}
    assert exported == {key: v for key, v in listed.items() if key[0] in recorded}
    verified = proj.marin("report", "verify", "reports/marin-tiny")  # every cited number re-derived
    assert verified.returncode == 0, verified.stdout + verified.stderr
    proj.marin("mlflow", "sync", check=True)
    client = MlflowClient(f"sqlite:///{proj.root / 'mlflow.db'}")
    run_id = proj.runs("evaluate")[-1][0]["run_id"]
    [run] = client.search_runs([client.get_experiment_by_name("marin").experiment_id],
                               f"tags.`marin.run_id` = '{run_id}'")
    for task, body in recorded.items():
        assert run.data.metrics[f"eval/{task}/acc"] == body["values"]["acc"]["value"]
        assert run.data.params[f"eval/{task}/samples"] == str(body["values"]["samples"])  # a count: a param
