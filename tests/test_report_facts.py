"""One set of facts behind the report, its model card, fmti.csv and mof.yml: none says something
another contradicts; params.yaml's placeholders are warned about and refused at release."""

from __future__ import annotations

import csv
import functools
import io
import json
import re
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard
from markdown_it import MarkdownIt

from marin.export.card import hf_license
from marin.report.placeholders import placeholders
from tests.conftest import Project

REAL = {"authors": ["Ada Lovelace (Analytical Engines)"], "contact": "ada@example.org",
        "url": "https://example.org/marin-tiny"}


def test_placeholders_are_named_key_by_key() -> None:
    shipped = {"authors": ["marin contributors"], "contact": "maintainers@marin.local", "url": None}
    got = placeholders(shipped)
    assert [line.split()[0] for line in got] == ["report.authors", "report.contact", "report.url"]
    assert placeholders(REAL) == []
    assert [line.split()[0] for line in placeholders({**REAL, "contact": "me@lab.marin.local"})] == ["report.contact"]


def _tokens(path: Path) -> list:
    body = ModelCard.load(path).text if path.suffix == ".md" else path.read_text()  # past the YAML header
    return MarkdownIt("commonmark").enable("table").parse(body)


def links(path: Path) -> list[str]:
    """The href of every link in a Markdown file."""
    return [str(ch.attrGet("href")) for t in _tokens(path) for ch in t.children or [] if ch.type == "link_open"]


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub and the Hub give a file's headings: lower case, punctuation dropped, spaces
    as hyphens, ``-1``, ``-2`` for repeats."""
    tokens, out = _tokens(path), set()
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            text = "".join(ch.content for ch in tokens[i + 1].children or [] if ch.type in ("text", "code_inline"))
            slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
            n = sum(1 for x in out if x == slug or re.fullmatch(re.escape(slug) + r"-\d+", x))
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.slow
def test_report_card_fmti_and_mof_agree_and_placeholders_block_a_release(trained_project: Project) -> None:
    proj = trained_project
    proj.marin("keygen", check=True)
    r = proj.marin("report")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("report: warning: params.yaml: report.")]
    assert len(warned) == 3  # authors, contact, url: the shipped placeholders
    out = proj.root / "reports" / proj.params["report"]["model_name"]
    refused = proj.marin("report", "verify", str(out), "--release")
    assert refused.returncode == 1 and "report.json: report.authors is ['marin contributors']" in refused.stderr
    assert proj.marin("report", "verify", str(out)).returncode == 0  # signed and true: only not releasable

    md, rep = (out / "report.md").read_text(), json.loads((out / "report.json").read_text())
    facts, doc, meta = rep["facts"], rep["doc"], rep["meta"]
    fmti = {row["indicator"]: row for row in csv.DictReader(io.StringIO((out / "fmti.csv").read_text()))}
    mof = {c["name"]: c for c in yaml.safe_load((out / "mof.yml").read_text())["release"]["components"]}
    card = ModelCard.load(out / "model_card.md")
    data = card.data.to_dict()

    # energy and CO2: the report's estimate, and FMTI's, the same numbers
    kwh, co2 = re.search(r"\*\*Estimate\*\* \(not a measurement\): (\S+ kWh) and (\S+ g CO2-equivalent)", md).groups()
    assert fmti["Energy usage for final training run"]["disclosed"] == "yes"
    assert kwh in fmti["Energy usage for final training run"]["disclosure"]
    assert co2 in fmti["Carbon emissions for final training run"]["disclosure"]
    # the data: the sources the report lists; the card's `datasets` holds Hub ids only, and none is given here
    sources = [s["name"] for s in doc["data"]["sources"]]
    assert sources and all(f"\n| {s} |" in md for s in sources)
    assert not any(s.get("hub_dataset") for s in proj.params["fetch"]["sources"]) and "datasets" not in data
    public = [s for s in doc["data"]["sources"]
              if not str(facts[s["locator"]]["value"]).startswith(("local:", "file:", "glob:"))]
    assert (fmti["Public datasets"]["disclosed"] == "yes") == bool(public)
    assert data["language"] == meta["language"] and fmti["Data language composition"]["disclosed"] == "yes"
    assert all(lang in fmti["Data language composition"]["disclosure"] for lang in meta["language"])
    # the licence: one value in card, MOF and FMTI
    assert data["license"] == hf_license(meta["license"])
    assert mof["Model parameters (Final)"]["license_name"] == meta["license"]
    assert meta["license"] in fmti["Terms of use"]["disclosure"]
    # responsible use: documented in report and card, so disclosed in FMTI
    for section in ("Intended use", "Limitations", "Risks"):
        assert f"\n## {section}\n" in md and f"\n## {section}\n" in card.text
    assert fmti["Documentation for responsible use"]["disclosed"] == "yes"
    # evaluation: the card's model-index values are the report's facts; FMTI discloses them
    rows = [r for r in doc["evaluation"]["rows"] if r["name"] == "model"]
    index = {(r["dataset"]["config"], m["type"]): m["value"] for r in data["model-index"][0]["results"]
             for m in r["metrics"] if "config" in r["dataset"]}  # harness tasks: test_harness_stage
    assert index == {(r["corpus"], k): facts[r[k]]["value"] for r in rows for k in ("bits_per_byte", "perplexity")}
    assert fmti["Capabilities evaluation"]["disclosed"] == "yes" and "Evaluation results" in mof
    # the citation carries the tensor digest CITATION.cff promises
    digest = facts[doc["model"]["tensor_digest"]]["value"]
    assert f"note = {{Model tensor digest {digest}}}" in md
    # every FMTI "no" is an indicator the report has no section for
    said = {"energy": "Energy usage for final training run", "CO2": "Carbon emissions for final training run"}
    assert all(fmti[name]["disclosed"] == "yes" for word, name in said.items() if word in md)
    # the datasheet: each question the ledger cannot answer names the params.yaml key that answers it
    unanswered = [x for x in (out / "datasheet.md").read_text().splitlines() if "not recorded" in x and x[:2] == "- "]
    assert 0 < len(unanswered) <= 11 and all("state it in params.yaml as `report.datasheet." in x for x in unanswered)
    # the card's and datasheet's links open on the Hub: a file of the folder, an anchor of its headings
    anchors = functools.cache(heading_anchors)  # each file parsed once, not once per link to it
    for name in ("model_card.md", "datasheet.md"):
        hrefs = links(out / name)
        assert len(hrefs) > 20 and not any("#F" in h for h in hrefs)
        for href in hrefs:
            path, _, anchor = href.partition("#")
            if re.match(r"[a-z]+:", path):  # https:, mailto:
                continue
            target = out / path if path else out / name
            assert target.is_file() and target.resolve().is_relative_to(out.resolve()), (name, href)
            assert not anchor or anchor in anchors(target), (name, href)

    params = proj.params
    params["report"].update(REAL)
    proj.write_params(params)
    r = proj.marin("report", check=True)
    assert "report: warning" not in r.stderr
    ok = proj.marin("report", "verify", str(out), "--release")
    assert ok.returncode == 0, ok.stderr
