"""One error hierarchy. The CLI turns a MarinError into one line and an exit code."""

from __future__ import annotations


class MarinError(Exception):
    """Base of every error marin reports to a user; the message says what to do."""

    exit_code = 1

    def diagnostics(self) -> str:
        return str(self)


class ParamsError(MarinError):
    """params.yaml is missing, unparsable or does not match schemas/params.schema.json."""

    exit_code = 2


class SchemaError(MarinError):
    """A record or manifest does not match its JSON Schema."""


class LedgerError(MarinError):
    """The ledger cannot be read or appended to."""


class IntegrityError(MarinError):
    """A digest, chain link or Merkle root does not match what was recorded."""


class FetchError(MarinError):
    """A raw source could not be fetched or does not have its pinned digest."""


class StageError(MarinError):
    """A pipeline stage cannot proceed (missing input, bad data)."""


class NotAProjectError(MarinError):
    """A command that reads or writes a project ran where there is none."""

    exit_code = 2
