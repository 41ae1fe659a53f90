"""Ledger records: built and parsed only through schema validation.

A record is ``{schema, run_id, seq, prev, time, kind, body, digest}``. ``digest`` is the
sha256 of the RFC 8785 canonical JSON of the record without ``digest``; ``prev`` links to
the previous record of the same run.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast, overload

from marin import hashing, schemas
from marin.errors import LedgerError, SchemaError
from marin.ledger.bodies import (
    BODIES,
    CheckpointBody,
    EvalBody,
    Exact,
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

KINDS: tuple[Kind, ...] = tuple(BODIES)  # every record kind, each with its body's TypedDict
# Kinds that may follow run.finished: claims about the finished run, outside its Merkle root.
AFTER_FINISH = ("verification",)
SCHEMA_VERSION = 1


def schema_id(kind: str) -> str:
    return f"marin.ledger/{kind}@{SCHEMA_VERSION}"


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_run_id(stage: str) -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stage.replace('_', '-')}-{stamp}-{secrets.token_hex(4)}"


def exact(x: float) -> Exact:
    """A float stored twice: a decimal for people and ``float.hex()`` for machines."""
    x = float(x)
    return {"value": x, "hex": x.hex()}


@dataclass(frozen=True)
class Record:
    schema: str
    run_id: str
    seq: int
    prev: str | None
    time: str
    kind: str
    body: dict[str, Any]
    digest: str

    @overload
    def body_as(self, kind: Literal["run.started"]) -> RunStarted: ...
    @overload
    def body_as(self, kind: Literal["run.resumed"]) -> RunResumed: ...
    @overload
    def body_as(self, kind: Literal["input"]) -> InputBody: ...
    @overload
    def body_as(self, kind: Literal["output"]) -> OutputBody: ...
    @overload
    def body_as(self, kind: Literal["checkpoint"]) -> CheckpointBody: ...
    @overload
    def body_as(self, kind: Literal["metric"]) -> MetricBody: ...
    @overload
    def body_as(self, kind: Literal["eval"]) -> EvalBody: ...
    @overload
    def body_as(self, kind: Literal["run.finished"]) -> RunFinished: ...
    @overload
    def body_as(self, kind: Literal["verification"]) -> VerificationBody: ...
    @overload
    def body_as(self, kind: Literal["publication"]) -> PublicationBody: ...
    @overload
    def body_as(self, kind: Literal["trial"]) -> TrialBody: ...
    @overload
    def body_as(self, kind: Literal["selection"]) -> SelectionBody: ...

    def body_as(self, kind: Kind) -> Any:
        """The body, typed as ``kind``'s TypedDict (:data:`marin.ledger.bodies.BODIES`), so a reader's keys
        are checked by the type checker; a LedgerError when the record is of another kind."""
        if self.kind != kind:
            raise LedgerError(f"run {self.run_id} seq {self.seq}: a {self.kind} record, read as {kind}")
        return self.body

    @property
    def step(self) -> int | None:
        """The step the record is of (a checkpoint's, a metric's, a published checkpoint's), for readers of
        any kind; None when its body has no integer step."""
        step = self.body.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    @property
    def name(self) -> str | None:
        """The name the record carries (an input's, an output's, an eval's, a publication's), for readers
        of any kind; None when its body has no string name."""
        name = self.body.get("name")
        return name if isinstance(name, str) else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema, "run_id": self.run_id, "seq": self.seq, "prev": self.prev,
            "time": self.time, "kind": self.kind, "body": self.body, "digest": self.digest,
        }

    def line(self) -> bytes:
        """The record as one JSONL line (canonical JSON, so lines are stable too)."""
        return hashing.canonical_json(self.to_dict()) + b"\n"

    @staticmethod
    def compute_digest(d: dict[str, Any]) -> str:
        return hashing.json_digest({k: v for k, v in d.items() if k != "digest"})

    @classmethod
    def create(
        cls, run_id: str, seq: int, prev: str | None, kind: str, body: Mapping[str, Any],
        time: str | None = None,
    ) -> Record:
        """Build a record, validating envelope and body; it cannot exist invalid."""
        d = {
            "schema": schema_id(kind), "run_id": run_id, "seq": seq, "prev": prev,
            "time": time or now(), "kind": kind, "body": body,
        }
        d["digest"] = cls.compute_digest(d)
        return cls.from_dict(d, where=f"new {kind} record for run {run_id}")

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Record:
        """Validate a parsed record (envelope, then the body against its kind's schema)."""
        fields = cast(dict[str, Any], d) if isinstance(d, dict) else None
        kind = fields.get("kind") if fields is not None else None
        if fields is not None and kind in _SCHEMA_IDS and fields["schema"] == _SCHEMA_IDS[kind] \
                and _accepts(fields, kind):
            return cls._of(fields)  # the usual case: both compiled validators accept
        schemas.validate(d, "ledger/record", where)
        fields = cast(dict[str, Any], d)  # an object, as the record schema accepted it
        if fields["schema"] != schema_id(str(kind)):
            raise SchemaError(f"{where}: schema {fields['schema']!r} does not match kind {kind!r}")
        schemas.validate(fields["body"], f"ledger/{kind}", f"{where} ({kind} body)")
        return cls(**fields)

    @classmethod
    def _of(cls, d: dict[str, Any]) -> Record:
        """A record of an envelope the schema accepted (its keys are exactly the fields), without the
        frozen dataclass's per-field ``__init__`` (a quarter of a validated read's time)."""
        r = object.__new__(cls)
        r.__dict__.update(d)
        return r

    @classmethod
    def from_line(cls, line: bytes, where: str, validate: bool = True) -> Record:
        """Parse one JSONL line; its bytes must be exactly the canonical form of its record.

        Another reader must see the very record that was hashed: duplicate keys (Python keeps
        the last, other parsers the first), non-finite numbers and any other serialization
        of the same record are refused. ``validate=False`` (readers other than ``ledger
        check``, which validates every line) only parses: records were validated when appended.
        """
        line = line.removesuffix(b"\n")
        if not validate:
            return cls._parsed(line, where)
        d = _canonical_fast(line)
        if d is None:  # the fast path could not decide: the exact, slow one names the problem
            d = _canonical_slow(line, where)
        return cls.from_dict(d, where)

    @classmethod
    def _parsed(cls, line: bytes, where: str) -> Record:
        try:
            d = json.loads(line)
            return cls(**d)
        except (ValueError, TypeError, RecursionError) as e:
            raise SchemaError(f"{where}: not a record ({e}); run `marin ledger check`") from None


_SCHEMA_IDS = {k: schema_id(k) for k in KINDS}


def _accepts(d: dict[str, Any], kind: str) -> bool:
    """Envelope and body valid, by the compiled validators (False: let ``schemas.validate`` explain)."""
    return schemas.is_valid(d, "ledger/record") and schemas.is_valid(d["body"], f"ledger/{kind}")


def content_digest(line: bytes) -> str:
    """The digest a canonical line's record hashes to: sha256 of the line without its top-level
    ``digest`` member (canonical JSON sorts keys, so dropping one member keeps the rest canonical;
    ``body`` sorts before ``digest`` and every key after it holds a scalar, so the last
    occurrence is the top-level one)."""
    line = line.removesuffix(b"\n")
    i = line.rfind(b',"digest":"sha256:')
    end = i + len(b',"digest":"sha256:') + 64  # the closing quote
    if i < 0 or line[end: end + 1] != b'"':
        return hashing.bytes_digest(line)  # no digest member: cannot match any recorded digest
    return hashing.bytes_digest(line[:i] + line[end + 1:])


def _canonical_fast(line: bytes) -> dict[str, Any] | None:
    """The parsed record if ``line`` is provably its RFC 8785 form, else None (undecided).

    Python's compact sorted JSON equals RFC 8785 for ASCII text whose numbers are integers
    within 2^53 and floats whose shortest repr has no exponent and no trailing ``.0`` (there
    ES6 and Python print numbers alike); anything else goes to the exact serializer.
    """
    if not line.isascii():
        return None
    _EXOTIC.clear()
    text = line.decode("ascii")
    try:
        d, end = _SCAN(text, 0)  # the C scanner itself: no whitespace skipping around the value
        if end != len(text) or _EXOTIC or not isinstance(d, dict) or "".join(_ENCODE(d, 0)) != text:
            return None
    except (StopIteration, ValueError, RecursionError):
        return None
    return cast(dict[str, Any], d)


def _plain_float(lit: str) -> float:
    if "e" in lit or "E" in lit or lit.endswith(".0"):
        _EXOTIC.append(lit)
    return float(lit)


def _plain_int(lit: str) -> int:
    if len(lit) > 15:  # beyond 2^53 a JSON number is not one IEEE double (RFC 8785 refuses it)
        _EXOTIC.append(lit)
    return int(lit)


_EXOTIC: list[str] = []  # numbers the fast path cannot vouch for, in the line being read
_DECODER = json.JSONDecoder(parse_float=_plain_float, parse_int=_plain_int,
                            parse_constant=lambda name: _EXOTIC.append(name))
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownVariableType]
# What ``_ENCODER.encode`` runs, made once rather than per call (no cycle check: parsed JSON has no cycles):
# CPython's C encoder where the interpreter has it (json.encoder's own optional accelerator, not in typeshed)
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_ENCODE: Callable[[Any, int], Iterable[str]] = (
    _C_ENCODER(None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)
    if _C_ENCODER is not None else lambda d, _level: _ENCODER.encode(d))


def _canonical_slow(line: bytes, where: str) -> dict[str, Any]:
    """Parse strictly with the exact RFC 8785 serializer; every refusal names why."""
    try:
        d = json.loads(line, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SchemaError(f"{where}: not valid JSON ({e})") from None
    except RecursionError:
        raise SchemaError(f"{where}: nested too deeply to be a record") from None
    except _LineError as e:
        raise SchemaError(f"{where}{_seq_of(line)}: {e}; such a line reads differently in other "
                          "JSON parsers, so it is refused (edited by hand?)") from None
    Record.from_dict(d, where)  # a line that is not a record is named as such first
    try:
        canonical = hashing.canonical_json(d)
    except (ValueError, TypeError, OverflowError) as e:  # rfc8785: an integer out of range, ...
        raise SchemaError(f"{where} (seq {d['seq']}): has no canonical JSON form ({e})") from None
    if canonical != line:
        raise SchemaError(f"{where} (seq {d['seq']}): the line is not in RFC 8785 canonical form "
                          "(re-serialized or edited); only the canonical bytes are what was hashed")
    return d


class _LineError(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _LineError(f"duplicate key {k!r}")
        d[k] = v
    return d


def _seq_of(line: bytes) -> str:
    """`` (seq N)`` of a line refused before it could be read strictly, for the message."""
    try:
        return f" (seq {json.loads(line)['seq']})"
    except Exception:  # the line is refused anyway; this only labels the message
        return ""


def _no_constant(name: str) -> Any:
    raise _LineError(f"{name} is not a JSON number")
