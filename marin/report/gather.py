"""The report's facts, gathered section by section: the model's lineage (every run must have
succeeded), the runs that read the model (:mod:`marin.report.cited`), then each section's ``facts``
in the order of :data:`SECTIONS`. That order numbers the facts (F1, F2, ...): a new section goes at
the end, so the facts of the others keep their ids."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from marin import stages
from marin.ledger.query import Ledger, Step, upstream
from marin.report import (
    budget,
    cited,
    compute,
    data,
    environment,
    evaluation,
    experiments,
    harness_section,
    instruct,
    memorisation,
    model,
    proves,
    references_section,
    training,
    usage,
    verification_status,
    verifications,
)
from marin.report.facts import Context, Facts, ReportError
from marin.report.vouching import Vouching

# (the key of report.json's doc, the section's facts), in the order their facts are cited
SECTIONS: tuple[tuple[str, Callable[[Facts, Context], Any]], ...] = (
    ("model", model.facts), ("data", data.facts), ("training", training.facts),
    ("budget", budget.facts),  # epochs and tokens per parameter, derived from the facts above
    ("evaluation", evaluation.facts), ("harness", harness_section.facts),
    ("reference_models", references_section.facts),  # other models, on the same requests
    ("export", usage.facts), ("environment", environment.facts), ("compute", compute.facts),
    ("verification", verification_status.facts), ("independent_verification", verifications.facts),
    ("instruct", instruct.facts), ("memorisation", memorisation.facts),  # the outputs shown above, traced
    ("experiments", experiments.facts), ("proves", proves.facts))


def gather(root: Path, ledger: Ledger, model_at: str = stages.MODEL,
           vouching: Vouching | None = None) -> tuple[Facts, dict[str, Any]]:
    """Facts about the model at ``model_at`` (a path, digest or train run id) and the report's structure, read
    from ``ledger``; ``vouching``: what the Independent verification section is judged against (None: no section)."""
    root = Path(root)
    target = ledger.resolve(model_at)
    node = ledger.node(target)
    if target.note:
        raise ReportError(f"{target.note}; the report describes recorded bytes only: restore the model "
                          "(dvc checkout) or name the train run")
    steps = upstream(node)
    for s in steps:
        if s.status != "succeeded":
            raise ReportError(f"run {s.run_id} ({s.stage}) in the model's lineage is {s.status}; a report "
                              "describes succeeded runs only")
    train = _one(steps, "train")
    for stage in ("fetch", "curate", "tokenize"):
        _one(steps, stage)
    logs = {s.stage: ledger.runs[s.run_id] for s in steps}
    read = cited.readers(ledger, {o.digest for o in train.outputs})  # evaluate, export, evaluate_instruct, ...
    logs.update(read)
    # every run whose records the report cites, and everything upstream of them (evaluate's evalsets run; the sft
    # and instructions runs behind evaluate_instruct): the lineage, the compute and the verification tables
    behind = upstream(node, *(ledger.step(log.run_id) for log in read.values()))
    c = Context(root, ledger, logs, {"lineage": [_lineage_row(s) for s in behind]}, vouching)
    f = Facts(root)
    for key, facts in SECTIONS:
        c.doc[key] = facts(f, c)
    return f, c.doc


def _lineage_row(s: Step) -> dict[str, Any]:
    return {"stage": s.stage, "run_id": s.run_id, "status": s.status, "recipe_digest": s.recipe_digest,
            "git_commit": s.code.get("git_commit"), "started": s.started, "finished": s.finished}


def _one(steps: list[Step], stage: str) -> Step:
    found = [s for s in steps if s.stage == stage]
    if not found:
        raise ReportError(f"the model's lineage has no {stage} run; run the pipeline (dvc repro)")
    return found[-1]
