"""The runs a report cites beyond the model's own lineage: the latest succeeded run of each stage that
read the model (evaluate, export, evaluate_instruct), and the export_instruct run of the instruct
model that evaluate_instruct compared with it (the Base-and-instruct section sends the reader to its
card). Found through the index, not by a scan of the ledger."""

from __future__ import annotations

from marin.ledger.query import Ledger
from marin.ledger.store import RunLog

READERS = (("evaluate", "model"), ("export", "model"), ("evaluate_instruct", "base_model"))  # (stage, input name)


def latest_reader(ledger: Ledger, digests: set[str], name: str, stage: str) -> RunLog | None:
    """The latest succeeded run of ``stage`` whose input ``name`` is one of ``digests``: found in the
    index, not by a scan of the ledger."""
    runs = {r for d in digests for r, _, _, b in ledger.index.entities(digest=d, role="input") if b.get("name") == name}
    found = sorted((log for log in map(ledger.runs.__getitem__, runs)
                    if log.stage == stage and log.status == "succeeded"),
                   key=lambda log: (log.records[0].time, log.run_id))
    return found[-1] if found else None


def readers(ledger: Ledger, digests: set[str]) -> dict[str, RunLog]:
    """By stage, the runs that read the model whose folder digests are ``digests``, and the export of
    the instruct model that the evaluate_instruct run read."""
    found = {stage: log for stage, name in READERS if (log := latest_reader(ledger, digests, name, stage))}
    ev = found.get("evaluate_instruct")
    instruct: set[str] = {i["digest"] for i in ev.bodies("input") if i["name"] == "instruct_model"} if ev else set()
    if instruct and (export := latest_reader(ledger, instruct, "model", "export_instruct")) is not None:
        found["export_instruct"] = export
    return found
