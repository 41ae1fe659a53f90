"""What a reader found in one run file (:func:`marin.ledger.store.read_run`): its records, typed by kind,
and the run.started fields readers use most as typed properties."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, overload

from marin.errors import LedgerError
from marin.ledger.bodies import (
    CheckpointBody,
    CodeState,
    DeterminismClass,
    Digest,
    Env,
    EvalBody,
    InputBody,
    Kind,
    MetricBody,
    OutputBody,
    PublicationBody,
    RunFinished,
    RunResumed,
    RunStarted,
    Seeds,
    SelectionBody,
    TrialBody,
    VerificationBody,
)
from marin.ledger.records import AFTER_FINISH, Record


@dataclass
class RunLog:
    """What a reader found in one run file."""

    path: Path
    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unparsable or invalid lines
    truncated: bytes | None = None  # bytes of a last line cut short by a crash

    @property
    def run_id(self) -> str:
        return self.path.name.removesuffix(".jsonl")

    @property
    def started(self) -> Record | None:
        return self.records[0] if self.records and self.records[0].kind == "run.started" else None

    @property
    def start(self) -> Record:
        """:attr:`started` where the reader needs it: a LedgerError naming the file when it has none."""
        if (rec := self.started) is None:
            raise LedgerError(f"{self.path}: no run.started record; see `marin ledger check`")
        return rec

    @property
    def start_body(self) -> RunStarted:
        """The body of :attr:`start`, typed (a LedgerError naming the file when the run has none)."""
        return cast(RunStarted, self.start.body)

    # The run.started fields readers use most, typed (each a LedgerError naming the file when the run has
    # no run.started record)
    @property
    def stage(self) -> str:
        return self.start_body["stage"]

    @property
    def params(self) -> dict[str, Any]:
        return self.start_body["params"]

    @property
    def code(self) -> CodeState:
        return self.start_body["code"]

    @property
    def env(self) -> Env:
        return self.start_body["env"]

    @property
    def recipe_digest(self) -> Digest:
        return self.start_body["recipe_digest"]

    @property
    def determinism_class(self) -> DeterminismClass:
        return self.start_body["determinism_class"]

    @property
    def seeds(self) -> Seeds:
        return self.start_body["seeds"]

    @property
    def end(self) -> Record:
        """:attr:`finished` where the reader needs it: a LedgerError naming the file when it has none."""
        if (rec := self.finished) is None:
            raise LedgerError(f"{self.path}: the run has no run.finished record (unfinished, or cut short)")
        return rec

    @property
    def finished(self) -> Record | None:
        """The run.finished record: the last record but for verifications appended after it."""
        for r in reversed(self.records):
            if r.kind == "run.finished":
                return r
            if r.kind not in AFTER_FINISH:
                return None
        return None

    @property
    def status(self) -> str:
        if self.finished is not None:
            return self.finished.body["status"]
        return "unfinished"

    def of_kind(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]

    @overload
    def bodies(self, kind: Literal["run.started"]) -> list[RunStarted]: ...
    @overload
    def bodies(self, kind: Literal["run.resumed"]) -> list[RunResumed]: ...
    @overload
    def bodies(self, kind: Literal["input"]) -> list[InputBody]: ...
    @overload
    def bodies(self, kind: Literal["output"]) -> list[OutputBody]: ...
    @overload
    def bodies(self, kind: Literal["checkpoint"]) -> list[CheckpointBody]: ...
    @overload
    def bodies(self, kind: Literal["metric"]) -> list[MetricBody]: ...
    @overload
    def bodies(self, kind: Literal["eval"]) -> list[EvalBody]: ...
    @overload
    def bodies(self, kind: Literal["run.finished"]) -> list[RunFinished]: ...
    @overload
    def bodies(self, kind: Literal["verification"]) -> list[VerificationBody]: ...
    @overload
    def bodies(self, kind: Literal["publication"]) -> list[PublicationBody]: ...
    @overload
    def bodies(self, kind: Literal["trial"]) -> list[TrialBody]: ...
    @overload
    def bodies(self, kind: Literal["selection"]) -> list[SelectionBody]: ...

    def bodies(self, kind: Kind) -> list[Any]:
        """The bodies of the records of ``kind``, typed by kind (:data:`marin.ledger.bodies.BODIES`), for
        readers that need neither seq nor digest; :meth:`of_kind` gives the records."""
        return [r.body for r in self.records if r.kind == kind]
