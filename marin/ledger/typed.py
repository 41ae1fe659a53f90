"""One record's body as the TypedDict of its kind (:mod:`marin.ledger.bodies`), for readers that need
the record too (its seq and digest: a report's facts cite them); ``RunLog.bodies`` gives the bodies
of a run's records of a kind without the records."""

from __future__ import annotations

from typing import Any, Literal, overload

from marin.errors import LedgerError
from marin.ledger.bodies import (
    CheckpointBody,
    EvalBody,
    InputBody,
    Kind,
    MetricBody,
    OutputBody,
    PublicationBody,
    RunFinished,
    RunResumed,
    RunStarted,
    SelectionBody,
    TrialBody,
    VerificationBody,
)
from marin.ledger.records import Record


@overload
def body(rec: Record, kind: Literal["run.started"]) -> RunStarted: ...
@overload
def body(rec: Record, kind: Literal["run.resumed"]) -> RunResumed: ...
@overload
def body(rec: Record, kind: Literal["input"]) -> InputBody: ...
@overload
def body(rec: Record, kind: Literal["output"]) -> OutputBody: ...
@overload
def body(rec: Record, kind: Literal["checkpoint"]) -> CheckpointBody: ...
@overload
def body(rec: Record, kind: Literal["metric"]) -> MetricBody: ...
@overload
def body(rec: Record, kind: Literal["eval"]) -> EvalBody: ...
@overload
def body(rec: Record, kind: Literal["run.finished"]) -> RunFinished: ...
@overload
def body(rec: Record, kind: Literal["verification"]) -> VerificationBody: ...
@overload
def body(rec: Record, kind: Literal["publication"]) -> PublicationBody: ...
@overload
def body(rec: Record, kind: Literal["trial"]) -> TrialBody: ...
@overload
def body(rec: Record, kind: Literal["selection"]) -> SelectionBody: ...


def body(rec: Record, kind: Kind) -> Any:
    """``rec``'s body, typed by ``kind``; a record of another kind is an error (records are validated
    against their kind's schema when read, so the keys the TypedDict requires are there)."""
    if rec.kind != kind:
        raise LedgerError(f"run {rec.run_id} seq {rec.seq}: a {rec.kind} record, read as a {kind} record")
    return rec.body
