"""Decontamination (issue 39, item 6): stage decontaminate finds the harness items whose 13-grams occur
in the training data; evaluate records each score beside its clean-subset score (report) or scores
only the clean items (exclude). The n-gram index is checked against a brute-force set of word tuples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from marin.evaluate import ngrams
from tests.conftest import Project

LAB = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: lab/{name}.jsonl
test_split: test
output_type: loglikelihood
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{' ' + answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: perplexity
    aggregation: perplexity
    higher_is_better: false
"""
CLEAN_WORDS = ["zephyr", "quartz", "fjord", "lynx", "oxbow", "kiwi", "jigsaw", "vortex", "plinth", "mauve",
               "tundra", "gecko", "nimbus", "rhombus", "sprocket", "walrus"]


def _brute(docs: list[str], items: list[str], n: int) -> list[bool]:
    grams = {tuple(ws[i:i + n]) for d in docs for ws in [ngrams.words(d)] for i in range(len(ws) - n + 1)}
    return [any(tuple(ws[i:i + n]) in grams for i in range(len(ws) - n + 1))
            for it in items for ws in [ngrams.words(it)]]


@pytest.mark.parametrize("n", [4, 8, 13])
def test_the_index_agrees_with_a_set_of_word_tuples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    monkeypatch.setattr(ngrams, "RUN_GRAMS", 300)  # many runs, each read in several chunks
    monkeypatch.setattr(ngrams, "CHUNK", 64)
    rng = random.Random(n)
    vocab = [f"w{i}" for i in range(30)]
    docs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 120))) for _ in range(60)]
    items = []
    for _ in range(200):
        if rng.random() < 0.3:  # a copied passage, recased and repunctuated
            ws = ngrams.words(rng.choice(docs))
            s = rng.randint(0, max(0, len(ws) - 20))
            items.append(", ".join(w.upper() for w in ws[s:s + 20]) + "!")
        else:
            items.append(" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))))
    built = ngrams.build(docs, n, tmp_path / "index")
    assert built["runs"] > 3
    dirty, short = ngrams.contaminated(tmp_path / "index", [ngrams.words(i) for i in items], n)
    want = _brute(docs, items, n)
    assert dirty == want and 0 < sum(want) < len(items)
    assert short == [len(ngrams.words(i)) < n for i in items]


def test_normalization_lowercases_and_splits_on_non_alphanumerics() -> None:
    assert ngrams.words("To-be, or NOT_to be: l'Été 1611!") == ["to", "be", "or", "not", "to", "be", "l", "été",
                                                                "1611"]


def _write_task(root: Path, name: str, pairs: list[tuple[str, str]]) -> None:
    (root / "lab").mkdir(exist_ok=True)
    (root / "lab" / f"{name}.yaml").write_text(LAB.format(name=name))
    (root / "lab" / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": a}) + "\n"
                                                        for p, a in pairs))


def _copied(root: Path, k: int) -> list[tuple[str, str]]:
    """``k`` passages of 20 words cut from the curated train split: prompt 19 words, answer the 20th."""
    texts = pq.read_table(root / "data/curated/train.parquet", columns=["text"]).column(0).to_pylist()
    out = []
    for t in texts[:k]:
        ws = t.split()[5:25]
        out.append((" ".join(ws[:-1]), ws[-1]))
    return out


def _clean(k: int) -> list[tuple[str, str]]:
    rng = random.Random(k)
    return [(" ".join(rng.choice(CLEAN_WORDS) for _ in range(19)), rng.choice(CLEAN_WORDS)) for _ in range(k)]


def _harness(proj: Project) -> dict[str, dict]:
    [run] = proj.runs("evaluate")[-1:]
    return {x["body"]["name"]: x["body"]["values"] for x in run if x["kind"] == "eval"
            and x["body"]["name"].startswith("harness:")}


def _value(v: object) -> float:
    return v["value"] if isinstance(v, dict) else v


@pytest.mark.slow
def test_copied_task_is_contaminated_a_clean_one_is_not_and_exclude_scores_the_clean_items(
        trained_project: Project) -> None:
    proj, root = trained_project, trained_project.root
    copied, clean = _copied(root, 4), _clean(5)
    _write_task(root, "lab_copied", copied)
    _write_task(root, "lab_clean", clean)
    mixed = [copied[0], clean[0], copied[1], clean[1], clean[2], copied[2], clean[3], clean[4]]
    _write_task(root, "lab_mixed", mixed)
    params = proj.params
    params["evaluate"]["harness"] = {"tasks": ["lab_copied", "lab_clean", "lab_mixed"], "include": ["lab"], "seed": 7}
    proj.write_params(params)
    assert proj.marin("stages", "--write").returncode == 0
    proj.stage("instructions")
    p = proj.stage("decontaminate")
    found = json.loads((root / "data/decontamination.json").read_text())
    tasks = found["tasks"]
    assert found["ngram"] == 13
    assert (tasks["lab_copied"]["fraction"], tasks["lab_copied"]["ids"]) == (1.0, [0, 1, 2, 3]), p.stdout
    assert (tasks["lab_clean"]["fraction"], tasks["lab_clean"]["ids"]) == (0.0, [])
    assert tasks["lab_mixed"]["ids"] == [i for i, x in enumerate(mixed) if x in copied] == [0, 2, 5]
    run = proj.runs("decontaminate")[-1]  # the session's project ran it once already
    rec = {x["body"]["name"]: x["body"]["values"] for x in run if x["kind"] == "eval"}
    assert rec["decontamination:lab_copied"]["contaminated"] == 4 and rec["decontamination:lab_clean"][
        "contaminated"] == 0
    assert not list((root / ".marin").glob("decontaminate-*"))  # the index is a temporary build artifact

    proj.stage("evaluate")  # report: every item scored, the clean subset's score beside it
    report = _harness(proj)["harness:lab_mixed"]
    assert report["samples"] == 8 and report["contaminated"] == 3 and report["clean/samples"] == 5

    params["evaluate"]["decontaminate"] = "exclude"
    proj.write_params(params)
    proj.stage("evaluate")
    got = _harness(proj)
    excluded, by_hand = got["harness:lab_mixed"], got["harness:lab_clean"]  # lab_clean: the same clean items
    assert excluded["samples"] == 5 and excluded["excluded"] == 3
    assert _value(excluded["acc"]) == _value(by_hand["acc"]) == _value(report["clean/acc"])
    assert _value(excluded["perplexity"]) == pytest.approx(_value(by_hand["perplexity"]), rel=1e-9)
    assert _value(report["clean/perplexity"]) == pytest.approx(_value(by_hand["perplexity"]), rel=1e-9)
    assert got["harness:lab_copied"] == {"error": "harness task 'lab_copied': every item it would score is "
                                                  "contaminated (evaluate.decontaminate: exclude)"}
    assert proj.marin("ledger", "check").returncode == 0


def test_exclude_without_findings_is_one_line_and_report_goes_on(tmp_path: Path) -> None:
    from marin.errors import StageError
    from marin.evaluate import decontam

    assert decontam.load(tmp_path, "report") is None  # evaluate scores as before, without clean-subset values
    with pytest.raises(StageError) as e:
        decontam.load(tmp_path, "exclude")
    assert len(str(e.value).splitlines()) == 1 and "dvc repro decontaminate" in str(e.value)
    (tmp_path / "data").mkdir()
    (tmp_path / "data/decontamination.json").write_text(json.dumps(
        {"ngram": 13, "tasks": {"t": {"items": 6, "contaminated": 2, "fraction": 1 / 3, "ids": [1, 4], "short": 0}}}))
    found = decontam.load(tmp_path, "exclude")
    assert found.clean_ids("t", None) == [0, 2, 3, 5] and found.clean_ids("t", 3) == [0, 2]
