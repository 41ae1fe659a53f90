"""The Model Openness Framework (LF AI & Data) release description: its 17 components, each
with a license and a location in the project, and the class they reach.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from marin import readers, stages
from marin.report.cards import NR, Ctx, licence_names
from marin.report.facts import ReportError

MOF_VERSION, MOF_DATE = "1.0", "2024-12-15"
NOT_INCLUDED, NOT_SPECIFIED = "Component not included", "License not specified"
# component -> (MOF class, required for the class, accepted licence content types)
MOF_COMPONENTS: dict[str, tuple[int, bool, tuple[str, ...]]] = {
    "Model architecture": (3, True, ("code",)),
    "Data preprocessing code": (1, True, ("code",)),
    "Training code": (2, True, ("code",)),
    "Inference code": (2, True, ("code",)),
    "Evaluation code": (2, True, ("code",)),
    "Supporting libraries and tools": (2, False, ("code",)),
    "Model parameters (Final)": (3, True, ("data", "code")),
    "Model parameters (Intermediate)": (1, True, ("data",)),
    "Datasets": (1, True, ("data", "code", "document")),
    "Evaluation data": (2, True, ("data",)),
    "Model metadata": (1, False, ("data",)),
    "Sample model outputs": (3, False, ("data", "code", "document")),
    "Model card": (3, True, ("document", "code")),
    "Data card": (3, True, ("document", "code")),
    "Technical report": (3, True, ("document", "code")),
    "Research paper": (1, True, ("document",)),
    "Evaluation results": (3, True, ("document", "code")),
}
MOF_CLASSES = {1: "Class I - Open Science", 2: "Class II - Open Tooling", 3: "Class III - Open Model"}


def mof(facts: dict[str, Any], doc: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The MOF release file (schema ``mof_schema.json``) listing the project's 17 components."""
    c = Ctx(facts, doc, meta)
    d, ev, r = doc["data"], c.evaluation, meta["report_dir"]
    code, model, docs = meta["code_license"], meta["model_license"], meta.get("docs_license", meta["code_license"])
    val = set(d["splits"].get("validation", {}).get("corpora", {}))
    data_lic = licence_names(c, [f["license"] for f in d["funnel"]] or [s["license"] for s in d["sources"]])
    eval_lic = licence_names(c, [f["license"] for f in d["funnel"] if f["corpus"] in val])
    have = {  # name -> (description, location, licence); absent names are not included
        "Model architecture": ("Decoder-only transformer in Flax NNX", "marin/model", code),
        "Data preprocessing code": ("Fetch, filter, deduplicate and tokenize the sources", "marin/data", code),
        "Training code": ("Training loop, optimizer, checkpoints and seeds", "marin/train", code),
        "Inference code": ("Scoring and greedy decoding of the trained model", "marin/evaluate", code),
        "Evaluation code": (_evaluation_code(c), "marin/evaluate", code),
        "Supporting libraries and tools": ("Pipeline stages, provenance ledger and verifier", "pipeline/", code),
        "Model parameters (Final)": (f"Final weights, tensor digest {c.t(doc['model']['tensor_digest'])}",
                                     doc["model"]["path"], model),
        "Model parameters (Intermediate)": ("Training checkpoints with optimizer state", "checkpoints/", model),
        "Datasets": ("Raw, curated and tokenized training and validation data", "data/", data_lic),
        "Evaluation data": (*_evaluation_data(c), eval_lic),
        "Model metadata": ("Resolved configuration and optimizer state stored in each checkpoint", "checkpoints/",
                           model),
        "Model card": ("Hugging Face model card", f"{r}/model_card.md", docs),
        "Data card": ("Datasheet for the training data", f"{r}/datasheet.md", docs),
        "Technical report": ("Report citing the ledger record of every value", f"{r}/report.md", docs),
    }
    if ev or c.doc.get("instruct"):
        have["Evaluation results"] = (*_evaluation_results(c), docs)
    if ev and ev["samples"]:
        have["Sample model outputs"] = ("Greedy completions of fixed prompts (an eval record)",
                                        f"ledger/runs/{ev['run_id']}.jsonl", docs)
    components: list[dict[str, str]] = []
    for name in MOF_COMPONENTS:
        desc, loc, lic = have.get(name, ("Not part of this release", "", NOT_INCLUDED))
        lic = lic or NOT_SPECIFIED
        path = f"https://spdx.org/licenses/{lic}.html" if re.fullmatch(r"[A-Za-z0-9.+-]+", lic) else ""
        components.append({"name": name, "description": desc, "location": loc, "license_name": lic,
                           "license_path": path if lic not in (NOT_INCLUDED, NOT_SPECIFIED) else ""})
    return {"framework": {"name": "Model Openness Framework", "version": MOF_VERSION, "date": MOF_DATE},
            "release": {"name": meta["model_name"], "version": str(meta["version"]), "date": str(meta["date"]),
                        "type": "language", "architecture": "transformer decoder", "treatment": "pre-trained",
                        "origin": meta.get("origin", meta["model_name"]), "producer": meta.get("producer", NR),
                        "contact": meta.get("contact", NR), "components": components}}


def _evaluation_code(c: Ctx) -> str:
    """What the evaluation code the release holds computed: each evaluation this report states."""
    parts = ["Bits per byte, perplexity and the unigram baseline (marin/evaluate/scoring.py)"]
    harness: dict[str, Any] = c.doc.get("harness") or {}
    if harness.get("rows"):
        version = harness["rows"][0]["harness_version"]
        parts.append(f"the lm-evaluation-harness {c.t(version)} adapter and its task files "
                     "(marin/evaluate/harness*.py, marin/evaluate/tasks/)")
    if c.doc.get("instruct"):
        parts.append("the base and instruct models' held-out instruction answers "
                     "(marin/evaluate/evaluate_instruct_stage.py)")
    return "; ".join(parts)


def _harness_rows(c: Ctx) -> list[dict[str, Any]]:
    harness: dict[str, Any] = c.doc.get("harness") or {}
    return harness.get("rows") or []


def _evaluation_data(c: Ctx) -> tuple[str, str]:
    """(description, locations) of the data every evaluation this report states was run on."""
    desc, where = ["Validation split of the tokenized data"], [stages.declaration("tokenize").out("tokens").as_posix()]
    if _harness_rows(c):
        desc.append("the harness tasks' items, cut from the validation split")
        where.append(stages.declaration("evalsets").out("evalsets").as_posix())
    if c.doc.get("instruct"):
        desc.append("the held-out instructions, built from the validation split")
        where.append((stages.declaration("evaluate_instruct").input("instructions") / "heldout.jsonl").as_posix())
    return "; ".join(desc), ", ".join(where)


def _evaluation_results(c: Ctx) -> tuple[str, str]:
    """(description, locations) of the DVC metrics files holding the results of the evaluations that ran."""
    desc: list[str] = []
    where: list[str] = []
    if c.evaluation:
        desc.append("Validation bits per byte and perplexity"
                    + (" and the harness tasks' scores" if _harness_rows(c) else ""))
        where.append(stages.declaration("evaluate").out("eval_metrics").as_posix())
    if c.doc.get("instruct"):
        desc.append("the base and instruct models' held-out instruction scores")
        where.append(stages.declaration("evaluate_instruct").out("instruct_eval_metrics").as_posix())
    return "; ".join(desc) + " (DVC metrics files)", ", ".join(where)


def _accepted(licenses_json: Path) -> dict[str, set[str]]:
    """Licence ids the MOF accepts, by content type, from its mof-licenses.json."""
    try:
        entries = readers.read_json(licenses_json, "json", ReportError)["licenses"]
        out: dict[str, set[str]] = {}
        for lic in entries:
            types = lic.get("ContentType", [])
            for t in [types] if isinstance(types, str) else types:
                out.setdefault(t, set()).add(lic["licenseId"])
    except FileNotFoundError:
        raise ReportError(f"{licenses_json}: no such MOF license list; restore marin/report/reference/") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ReportError(f"{licenses_json}: not a MOF license list ({type(e).__name__}: {e}); use "
                          "mof-licenses.json of lfai/model_openness_tool") from None
    return out


def _blocking(name: str, licence: str, accepted: dict[str, set[str]]) -> str | None:
    """Why component ``name`` (under ``licence``) does not count as open, or None when it does."""
    if licence == NOT_INCLUDED:
        return f"{name}: not included"
    types = MOF_COMPONENTS[name][2]
    ids = [p.strip("() ") for p in licence.split(" AND ")]
    closed = [i for i in ids if not any(i in accepted.get(t, ()) for t in types)]
    return (f"{name}: licence {', '.join(closed)} is not one the MOF accepts for {' or '.join(types)}"
            if closed else None)


def assessment(mof_dict: dict[str, Any], licenses_json: Path) -> dict[str, Any]:
    """The MOF class a release reaches (every required component of the class and the classes below it
    included and open under a licence accepted for its content type; else "Unclassified"), the required
    components that reached it, and the next class up with the components that kept the release from it."""
    accepted = _accepted(licenses_json)
    given = {x["name"]: x["license_name"] for x in mof_dict["release"]["components"]}
    out: dict[str, Any] = {"class": "Unclassified", "required_components_open": []}
    for cls in (3, 2, 1):
        needed = [n for n, (k, req, _) in MOF_COMPONENTS.items() if req and k == cls]
        missing = [why for n in needed if (why := _blocking(n, given.get(n, NOT_INCLUDED), accepted))]
        if missing:
            out["next_class"] = {"class": MOF_CLASSES[cls], "missed_because": missing}
            break
        out["class"] = MOF_CLASSES[cls]
        out["required_components_open"] += [f"{n} ({given[n]})" for n in needed]
    return out


def mof_class(mof_dict: dict[str, Any], licenses_json: Path) -> str:
    """The MOF class a release reaches (:func:`assessment`)."""
    return assessment(mof_dict, licenses_json)["class"]
