"""The instruct model released (issue 27): its card names the base model, data and recipe and is a full
Hub card with its own evaluation; DVC draws the sft curve; the report compares base and instruct."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conftest import Project, evaluation
from tests.instruct_fixtures import SFT

pytestmark = pytest.mark.slow


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
    ev = evaluation(proj.root, "metrics/instruct_eval.json", "evals/instruct_eval_context.json")["instruct"]
    every = ("choice_acc", "token_acc", "containment", "exact_match")  # issue 57: the card had only the last two
    want = {("all", m): ev[m] for m in every} | {(t, m): v[m] for t, v in ev["by_task"].items() for m in every}
    assert name == f"{proj.params['report']['model_name']}-instruct" and len(want) >= 8
    assert {(r.dataset_config, r.metric_type): r.metric_value for r in results} == want
    assert results[0].metric_type in ("choice_acc", "token_acc")  # led by a metric that moves, never exact match
    headline = json.loads((proj.root / "metrics/instruct_eval.json").read_text())  # both models' two accuracies
    table = card.text[card.text.index("| task | examples | metric | instruct | base |"):].split("\n\n")[0]
    for metric, label in (("choice_acc", "choice accuracy"), ("token_acc", "token accuracy")):
        inst, base = headline["instruct"][metric], headline["base"][metric]
        row = f"| all | {ev['examples']} | {label} | {inst:.4f} | {base:.4f} |"
        assert row in table.splitlines(), (row, table)
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
    m = evaluation(proj.root, "metrics/instruct_eval.json", "evals/instruct_eval_context.json")
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
    # MOF's evaluation rows hold the instruct evaluation the section shows: its code, data and metrics file
    comps = {c["name"]: c for c in yaml.safe_load((proj.root / f"reports/{name}/mof.yml").read_text())["release"][
        "components"]}
    assert "held-out instruction answers" in comps["Evaluation code"]["description"]
    assert "data/instructions/heldout.jsonl" in comps["Evaluation data"]["location"].split(", ")
    evaluated = ["metrics/eval.json"] if proj.runs("evaluate") else []  # this project's evaluate ran or not
    assert comps["Evaluation results"]["location"].split(", ") == [*evaluated, "metrics/instruct_eval.json"]
    assert proj.marin("report", "verify", f"reports/{name}").returncode == 0
