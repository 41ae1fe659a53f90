"""The ledger: hash-chained, schema-validated JSONL records, one file per run."""

from marin.ledger.records import Record, exact
from marin.ledger.run import Input, Recipe, Run
from marin.ledger.store import RunFile, RunLog, read_all, read_run

__all__ = ["Input", "Recipe", "Record", "Run", "RunFile", "RunLog", "exact", "read_all", "read_run"]
