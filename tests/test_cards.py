"""Model card, datasheet, FMTI and MOF outputs of a real trained project, checked with outside
tools (huggingface_hub, markdown-it, jsonschema) against values read straight from the ledger."""

from __future__ import annotations

import copy
import csv
import hashlib
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from huggingface_hub import ModelCard
from huggingface_hub.repocard_data import model_index_to_eval_results
from markdown_it import MarkdownIt

from marin import stages
from marin.ledger.query import Ledger
from marin.report import cards, fmti, mof
from marin.report.facts import ReportError
from marin.report.gather import gather
from tests.conftest import reference

pytestmark = pytest.mark.slow

META = {"model_name": "marin-tiny", "license": "Apache-2.0", "report_dir": "reports/marin-tiny",
        "code_license": "Apache-2.0", "model_license": "Apache-2.0", "date": "2026-11-30", "version": "0.1.0",
        "language": ["en"]}
HEADER = ["domain", "subdomain", "indicator", "disclosed", "disclosure", "evidence"]
SECTIONS = ["Motivation", "Composition", "Collection process", "Preprocessing/cleaning/labeling", "Uses",
            "Distribution", "Maintenance"]


@pytest.fixture
def built(trained_project: Any) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    with Ledger(trained_project.root, sources=stages.SOURCE_STAGES) as ledger:
        facts, doc = gather(trained_project.root, ledger)
    return trained_project.root, facts.to_dict(), doc


def pointer(doc: Any, ptr: str) -> Any:
    for part in ptr.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def ledger_records(root: Path, run_id: str) -> dict[int, dict[str, Any]]:
    lines = (root / "ledger" / "runs" / f"{run_id}.jsonl").read_text().splitlines()
    return {r["seq"]: r for r in map(json.loads, lines)}


def ledger_value(root: Path, facts: dict[str, Any], fid: str) -> Any:
    """The value a fact claims, found independently: in its ledger record, its recorded file, or
    recomputed from its inputs."""
    src = facts[fid]["source"]
    if "inputs" in src and src["formula"].startswith("Σ wall_s × cores"):  # hours: pairs (seconds, cores)
        xs = [ledger_value(root, facts, i) for i in src["inputs"]]
        return sum(w * (len(n) if isinstance(n, list) else n) for w, n in zip(xs[::2], xs[1::2], strict=True)) / 3600
    if "inputs" in src and src["formula"].startswith("Σ tokens inside spans"):  # traced outputs: covered, then sizes
        xs = [ledger_value(root, facts, i) for i in src["inputs"]]
        inside, total = sum(xs[:len(xs) // 2]), sum(xs[len(xs) // 2:])
        return inside / total if total else 0.0
    if "inputs" in src and src["formula"] == "Σ cpu_s":  # the runs' measured process CPU seconds: a sum
        return round(sum(ledger_value(root, facts, i) for i in src["inputs"]), 3)
    if "inputs" in src and src["formula"].startswith("tokens seen / "):  # epochs, tokens per parameter: a ratio
        seen, per = (ledger_value(root, facts, i) for i in src["inputs"])
        return seen / per
    if "inputs" in src and src["formula"].startswith("2-stderr mark"):  # a benchmark against its best baseline
        xs = [ledger_value(root, facts, i) for i in src["inputs"]]
        value, se, better, base = (*xs[:3], xs[3:]) if "best baseline" in src["formula"] else (*xs[:2], "higher",
                                                                                                 xs[2:])
        sign = 1 if better == "higher" else -1
        gap = sign * value - max(sign * b for b in base)
        return ("better than baseline" if gap > 2 * se else "worse than baseline" if gap < -2 * se
                else "not distinguishable from baseline")
    if "inputs" in src:
        coef = re.match(r"(\d+) ×", src["formula"])
        return math.prod([int(coef.group(1)) if coef else 1, *(ledger_value(root, facts, i) for i in src["inputs"])])
    rec = ledger_records(root, src["run_id"])[src["seq"]]
    assert rec["digest"] == src["record"], fid
    if "file" not in src:
        return pointer(rec, src["pointer"])
    assert rec["body"]["path"] == src["file"] and rec["body"]["digest"] == src["file_digest"], fid
    data = (root / src["file"]).read_bytes()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == src["file_digest"], fid
    return pointer(json.loads(data), src["pointer"])


def links_and_prose(text: str) -> tuple[list[tuple[str, str, str]], str]:
    """(href, rendered link text, title) of every link, and the rendered text outside links and code."""
    links, prose = [], []
    for tok in MarkdownIt("commonmark").enable("table").parse(text):
        inside = None
        for ch in tok.children or []:
            if ch.type == "link_open":
                inside = [str(ch.attrGet("href")), "", str(ch.attrGet("title") or "")]
            elif ch.type == "link_close":
                links.append((inside[0], inside[1], inside[2]))
                inside = None
            elif ch.type in ("text", "code_inline") and inside is not None:
                inside[1] += ch.content
            elif ch.type == "text":
                prose.append(ch.content)
    return links, " ".join(prose)


def check_citations(root: Path, facts: dict[str, Any], text: str) -> int:
    links, prose = links_and_prose(text)
    # a fact is cited as a link to the report's Sources heading, its id in the link's title
    cited = [(title.removeprefix("fact "), t) for h, t, title in links if h == "report.md#appendix-sources"]
    assert len(cited) == text.count('](report.md#appendix-sources "fact F'), "a citation did not render as a link"
    for fid, shown in cited:
        assert fid in facts, fid
        assert shown == facts[fid]["text"], (fid, shown)
        assert ledger_value(root, facts, fid) == facts[fid]["value"], fid
    # every number printed is a cited fact: outside links and code spans the prose holds no digit but
    # the caller's meta (licence ids) and two constants
    rest = prose.replace("Gebru et al., 2021", "").replace("6 × parameters", "")
    rest = rest.replace("sha256", "").replace("CO2", "")  # names, not numbers
    for v in (v for v in META.values() if isinstance(v, str)):
        rest = rest.replace(v, "")
    assert not re.search(r"\d", rest), re.findall(r".{30}\d.{30}", rest)
    return len(cited)


def test_model_card_is_a_valid_hub_card_with_the_ledger_eval_results(built: Any) -> None:
    root, facts, doc = built
    card = ModelCard(cards.model_card(facts, doc, META))
    data = card.data.to_dict()
    fetch = next((root / "ledger" / "runs").glob("fetch-*.jsonl")).stem
    sources = [r["body"]["name"] for r in ledger_records(root, fetch).values() if r["kind"] == "input"]
    assert sources and data["license"] == "apache-2.0"
    assert "datasets" not in data and data["language"] == ["en"]  # no source names a Hub dataset: none made up
    # no Hugging Face export in this project: the card names no library that would load it
    assert "library_name" not in data and data["pipeline_tag"] == "text-generation"
    [evaluate] = (root / "ledger" / "runs").glob("evaluate-*.jsonl")
    expected = {(r["body"].get("corpus", "all"), k, r["body"]["values"][k]["value"])
                for r in ledger_records(root, evaluate.stem).values()
                if r["kind"] == "eval" and r["body"]["name"] == "model" for k in ("bits_per_byte", "perplexity")}
    name, results = model_index_to_eval_results(data["model-index"])
    assert name == META["model_name"] and len(expected) == 4
    assert {(e.dataset_config, e.metric_type, e.metric_value) for e in results
            if e.task_name == "Causal language modeling"} == expected  # the harness's: test_harness_stage
    assert all(e.task_type == "text-generation" and e.dataset_split == "validation" for e in results)
    assert len(card.data.eval_results) == len(results)
    body = card.text
    for heading in ("How to use", "Model details", "Intended use", "Limitations", "Risks", "Training data",
                    "Training procedure", "Evaluation", "Reproducibility", "Citation and licence"):
        assert f"\n## {heading}\n" in body
    assert "unigram_baseline" in body.split("## Evaluation")[1]
    limitations = body.split("## Limitations")[1].split("## Risks")[0]  # limitations, not results
    assert "baseline" not in limitations and "bits per byte" in limitations
    assert not any(facts[r["bits_per_byte"]]["text"] in limitations for r in doc["evaluation"]["rows"])
    repro = body.split("## Reproducibility")[1].split("## Citation")[0]
    for run_id in [r["run_id"] for r in doc["lineage"]]:
        verified = any(r["kind"] == "verification" for r in ledger_records(root, run_id).values())
        row = next(line for line in repro.splitlines() if f"`{run_id}`" in line)
        assert ("no verification recorded" in row) is not verified, row


def test_cards_carry_the_people_and_parse_with_the_hubs_parsers(built: Any) -> None:
    from huggingface_hub import DatasetCard

    _, facts, doc = built
    meta = {**META, "authors": ["Ada Lovelace (Analytical Engines)"], "contact": "ada@example.org",
            "funding": "The Babbage Foundation", "license": "Made-Up-1.0"}
    card = ModelCard(cards.model_card(facts, doc, meta))
    assert card.data.license == "other" and card.data.license_name == "Made-Up-1.0"  # not a Hub id: other + name
    assert "Ada Lovelace (Analytical Engines)" in card.text and "ada@example.org" in card.text
    assert "@misc{" in card.text and "author = {{Ada Lovelace (Analytical Engines)}}" in card.text
    sheet = DatasetCard(cards.datasheet(facts, doc, meta))
    licences = {str(facts[s["license"]]["value"]).lower() for s in doc["data"]["sources"]}
    assert sheet.data.license in (sorted(licences), *licences) and sheet.data.task_categories == ["text-generation"]
    assert "Who created the dataset, on whose behalf: Ada Lovelace" in sheet.text
    assert "Funding: The Babbage Foundation" in sheet.text and "Maintainer and contact: ada@example.org" in sheet.text


def test_the_citation_check_catches_a_value_the_ledger_does_not_hold(built: Any) -> None:
    root, facts, doc = built
    wrong = copy.deepcopy(facts)
    fid = doc["model"]["n_params"]
    wrong[fid]["value"] += 1
    wrong[fid]["text"] = f"{wrong[fid]['value']:,}"
    with pytest.raises(AssertionError, match=fid):
        check_citations(root, wrong, ModelCard(cards.model_card(wrong, doc, META)).text)


def test_every_value_in_card_and_datasheet_is_a_ledger_fact(built: Any) -> None:
    root, facts, doc = built
    card = ModelCard(cards.model_card(facts, doc, META)).text
    assert check_citations(root, facts, card) > 60
    from huggingface_hub import DatasetCard

    assert check_citations(root, facts, DatasetCard(cards.datasheet(facts, doc, META)).text) > 30


def test_datasheet_has_the_seven_sections_and_says_what_is_not_recorded(built: Any) -> None:
    _, facts, doc = built
    text = cards.datasheet(facts, doc, META)
    assert re.findall(r"^## (.+)$", text, re.M) == SECTIONS
    maintenance = text.split("## Maintenance")[1]
    assert "Maintainer and contact: not recorded" in maintenance
    assert "Funding: not recorded" in text
    for f in doc["data"]["funnel"]:
        assert f"`{f['corpus']}`" in text.split("## Preprocessing")[1].split("## Uses")[0]


def test_datasheet_answers_from_facts_and_names_the_key_for_each_unrecorded_answer(built: Any) -> None:
    root, facts, doc = built
    text = cards.datasheet(facts, doc, META)
    missing = [line for line in text.splitlines() if "not recorded" in line and line.startswith("- ")]
    keys = [re.search(r"state it in params\.yaml as `(report\.[a-z_.]+)`", line) for line in missing]
    assert all(keys), [line for line, k in zip(missing, keys, strict=True) if not k]  # each says what to add, where
    schema = json.loads((Path(__file__).parents[1] / "schemas/params.schema.json").read_text())
    report = schema["properties"]["report"]["properties"]
    for k in (k.group(1).split(".")[1:] for k in keys):  # a key the params schema accepts
        assert (report[k[0]]["properties"][k[1]] if len(k) == 2 else report[k[0]])["type"], k
    assert len(missing) == 14  # authors, funding, contact (META has none) and the eleven report.datasheet keys
    # redundancies and errors: the curation funnel's removals, each a cited ledger fact
    line = next(x for x in text.splitlines() if x.startswith("- Missing information, errors or redundancies"))
    removed = [(f["corpus"], s) for f in doc["data"]["funnel"] for s in f["removed"]]
    assert removed and all(f"in `{c}` by `{s}`" in line for c, s in removed)
    assert check_citations(root, facts, line) == len(removed)
    # the lab's answers, given in params.yaml, replace every "not recorded"
    answers = {k.group(1).split(".")[-1]: "Stated by the lab." for k in keys
               if k.group(1).startswith("report.datasheet.")}
    full = {**META, "authors": ["Ada"], "contact": "ada@example.org", "funding": "None.", "datasheet": answers}
    sheet = cards.datasheet(facts, doc, full)
    assert len(answers) == 11 and not [x for x in sheet.splitlines() if "not recorded" in x and x.startswith("- ")]
    assert sheet.count("Stated by the lab. (params.yaml `report.datasheet.") == len(answers)


@pytest.mark.parametrize("name", ["fmti-indicators-dec2025.csv", "fmti-indicators-2024.csv"])
def test_fmti_has_one_row_per_indicator_with_ledger_evidence(built: Any, name: str) -> None:
    root, facts, doc = built
    with open(reference(name), newline="", encoding="utf-8-sig") as fh:
        indicators = list(csv.DictReader(fh))
    reader = csv.DictReader(io.StringIO(fmti.fmti(facts, doc, META, reference(name))))
    rows = list(reader)
    assert reader.fieldnames == HEADER
    assert [(r["domain"], r["subdomain"], r["indicator"]) for r in rows] == [
        (i["Domain"].strip(), i["Subdomain"].strip(), i["Indicator"].strip()) for i in indicators]
    yes = [r for r in rows if r["disclosed"] == "yes"]
    assert len(yes) >= 10
    for r in yes:
        assert r["disclosure"] and r["evidence"], r["indicator"]
        for ref in r["evidence"].split(" "):
            run_id, seq = ref.rsplit("#", 1)
            assert (root / "ledger" / "runs" / f"{run_id}.jsonl").is_file(), ref
            assert int(seq) in ledger_records(root, run_id), ref
    for r in rows:
        if r["disclosed"] != "yes":
            assert (r["disclosed"], r["disclosure"], r["evidence"]) == (
                "no", "not disclosed: not in the pipeline's records", "")
    size = next(r for r in yes if r["indicator"] == "Data size")
    assert facts[doc["data"]["splits"]["train"]["tokens"]]["text"] in size["disclosure"]


def test_fmti_without_its_indicator_list_is_an_error_never_a_built_in_list(built: Any, tmp_path: Path) -> None:
    _, facts, doc = built
    with pytest.raises(ReportError, match=r"missing\.csv: no such FMTI indicator list"):
        fmti.fmti(facts, doc, META, tmp_path / "missing.csv")
    with pytest.raises(ReportError, match="not an FMTI indicator list"):
        fmti.fmti(facts, doc, META, reference("mof-licenses.json"))


def test_mof_release_validates_and_reaches_class_ii(built: Any) -> None:
    root, facts, doc = built
    meta = {**META, "model_license": "Apache-2.0"}
    release = yaml.safe_load(yaml.safe_dump(mof.mof(facts, doc, meta), sort_keys=False))
    schema = json.loads(reference("mof_schema.json").read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator(schema, format_checker=validator.FORMAT_CHECKER).validate(release)
    comps = {c["name"]: c for c in release["release"]["components"]}
    assert len(comps) == 17 and comps["Research paper"]["license_name"] == "Component not included"
    for c in comps.values():  # what the release points at exists in the project (the report files aside)
        for where in filter(None, c["location"].split(", ")):
            assert where.startswith(META["report_dir"]) or (root / where).exists(), c
    licenses = reference("mof-licenses.json")
    # Class III and II components are all under Apache-2.0 (code/document) or CC0-1.0 (the evaluation
    # data); Class I needs a research paper, which is not included, and intermediate parameters under a data
    # licence (the checkpoints are under the model's Apache-2.0, a licence the MOF accepts for code and documents)
    assert mof.mof_class(release, licenses) == "Class II - Open Tooling"
    assert mof.assessment(release, licenses)["next_class"] == {"class": "Class I - Open Science", "missed_because": [
        "Model parameters (Intermediate): licence Apache-2.0 is not one the MOF accepts for data",
        "Research paper: not included"]}
    # the evaluation rows name every evaluation the report states: the harness's, beside bits per byte
    assert "lm-evaluation-harness" in comps["Evaluation code"]["description"]
    assert comps["Evaluation data"]["location"].split(", ") == ["data/tokens", "data/evalsets"]
    with pytest.raises(ReportError, match="no such MOF license list"):  # no built-in fallback list
        mof.mof_class(release, root / "missing.json")
    with pytest.raises(ReportError, match="not a MOF license list"):
        mof.mof_class(release, reference("mof_schema.json"))
    no_card = copy.deepcopy(release)
    no_card["release"]["components"] = [c for c in comps.values() if c["name"] != "Model card"]
    assert mof.mof_class(no_card, licenses) == "Unclassified"
    closed = copy.deepcopy(release)
    next(c for c in closed["release"]["components"] if c["name"] == "Training code")["license_name"] = "BUSL-1.1"
    assert mof.mof_class(closed, licenses) == "Class III - Open Model"
    doc_licence = copy.deepcopy(release)  # CC-BY-4.0 is a document licence, not one for data
    next(c for c in doc_licence["release"]["components"] if c["name"] == "Evaluation data")["license_name"] = (
        "CC-BY-4.0")
    assert mof.mof_class(doc_licence, licenses) == "Class III - Open Model"
