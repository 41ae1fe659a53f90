"""What `dvc exp show` shows of a built project (issue 41, item 2): a few code columns (one folder of links
per stage, not every module of every closure), metrics files that hold only measurements of the model
(baselines, counts and settings beside them in a context file), and `dvc status` still naming exactly the
stages whose code an edit touches."""

from __future__ import annotations

import json

import pytest

from marin import stages
from tests.conftest import Project, evaluation
from tests.test_closure import independent_closure

pytestmark = pytest.mark.slow

CODE_ROOTS = ("closures", "marin", "pipeline", "schemas", "uv.lock")


def _leaves(doc: object) -> int:
    return sum(_leaves(v) for v in doc.values()) if isinstance(doc, dict) else 1


def _committed(proj: Project) -> Project:
    """The trained project with dvc.lock for the stages through evaluate, committed (the README's baseline)."""
    proj.dvc("commit", "-f", "-d", "evaluate")
    proj.git("add", "-A")
    proj.git("commit", "-qm", "baseline")
    return proj


def test_exp_show_has_a_code_column_per_stage_and_only_measurements_as_metrics(trained_project: Project) -> None:
    proj = _committed(trained_project)
    [base] = [r for r in json.loads(proj.dvc("exp", "show", "--json").stdout) if r["rev"] != "workspace"]
    data = base["data"]
    deps = set(data["deps"])
    metrics = {f: d["data"] for f, d in data["metrics"].items() if "data" in d}  # not instruct_eval.json:
    # the tiny project never ran evaluate_instruct
    params = _leaves({f: d["data"] for f, d in data["params"].items()})
    code = {d for d in deps if d.split("/")[0] in CODE_ROOTS}
    assert code == {f"closures/{s}" for s in stages.NAMES}, sorted(code)
    print(f"dvc exp show: {len(deps)} dependency columns ({len(code)} code), {_leaves(metrics)} metrics, "
          f"{params} params")  # this project writes every param out (tests/conftest.py: mini_params)
    assert _leaves(metrics) == 1 + len(metrics["metrics/eval.json"]["harness"])  # bits per byte, a score a task
    # metrics/eval.json holds the headline floats the evaluate run recorded, nothing else
    [run] = proj.runs("evaluate")[-1:]
    recorded = {r["body"]["name"].partition(":")[2]: r["body"]["values"] for r in run
                if r["kind"] == "eval" and r["body"]["name"].startswith("harness:")}
    harness = metrics["metrics/eval.json"]["harness"]
    assert set(harness) == set(recorded) and harness
    for task, values in harness.items():
        for key, v in values.items():
            assert isinstance(v, float) and isinstance(recorded[task][key], dict), (task, key)
            assert key == ("acc" if "acc" in recorded[task] else key), (task, key)
        settings = {k for k, v in recorded[task].items() if not isinstance(v, dict)}  # counts, shots, seeds
        assert {"samples", "num_fewshot", "fewshot_seed"} <= settings and not settings & set(values)
    context = json.loads((proj.root / "evals/eval_context.json").read_text())
    for task, values in context["harness"].items():
        assert values["num_fewshot"] == recorded[task]["num_fewshot"] and "chance/acc" in values
    assert "unigram_bits_per_byte" in context and "unigram_bits_per_byte" not in metrics["metrics/eval.json"]
    # the readers get the whole document back: the card's harness rows still state shots and samples
    merged = evaluation(proj.root)
    assert merged["harness"][next(iter(harness))]["samples"] == recorded[next(iter(harness))]["samples"]
    shown = json.loads(proj.dvc("metrics", "show", "--json", "metrics/eval.json").stdout)
    assert shown[""]["data"]["metrics/eval.json"]["data"] == metrics["metrics/eval.json"], shown


def yaml_stages(proj: Project) -> list[str]:
    import yaml

    return list(yaml.safe_load((proj.root / "dvc.lock").read_text())["stages"])


def test_an_edit_to_a_closure_file_makes_dvc_status_name_exactly_the_stages_that_import_it(
        trained_project: Project) -> None:
    proj = _committed(trained_project)
    ran = set(yaml_stages(proj))
    assert json.loads(proj.dvc("status", "--json", "-d", "evaluate").stdout) == {}
    for rel in ("marin/data/shards.py", "marin/evaluate/harness_run.py", "marin/ledger/store.py"):
        want = {s for s in ran if rel in independent_closure(s)}
        path = proj.root / rel
        original = path.read_bytes()
        path.write_bytes(original.replace(b"\n", b"\n# an edit of the same size\n", 1)[:len(original)])
        try:
            changed = json.loads(proj.dvc("status", "--json", "-d", "evaluate").stdout)
        finally:
            path.write_bytes(original)
        assert want and set(changed) == want, (rel, sorted(changed), sorted(want))
        for s in want:  # through its closure folder of links
            assert any("closures/" in json.dumps(c) for c in changed[s]), changed[s]
