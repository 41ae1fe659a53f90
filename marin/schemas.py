"""Load the JSON Schemas (draft 2020-12) under schemas/ and validate against them."""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from marin import hashing
from marin.errors import SchemaError
from marin.paths import PACKAGE_ROOT, SCHEMA_DIR

if TYPE_CHECKING:  # the explaining validator (pure Python) is imported only to explain a rejection
    import jsonschema
    from jsonschema import Draft202012Validator

# The schema set is pinned: a schema edited in the working tree must be reported, not believed
# (an edited metric schema that accepts anything would let a forged record pass `ledger check`).
PINS = PACKAGE_ROOT / "schema_pins.json"


@functools.cache
def pins() -> dict[str, str]:
    """``schemas/<name>.schema.json`` -> the sha256 this marin was released with."""
    try:
        return json.loads(PINS.read_bytes())
    except (OSError, ValueError) as e:
        raise SchemaError(f"{PINS}: cannot read the schema pins ({e}); is the marin checkout complete?") from None


def _pin_problem(rel: str, data: bytes | None) -> str | None:
    pinned = pins().get(rel)
    if data is None:
        return f"{rel}: missing; marin pins {pinned}; restore it (`git checkout -- {rel}`)" if pinned else None
    got = hashing.bytes_digest(data)
    if pinned is None:
        return f"{rel}: not in the pinned schema set ({PINS.name}); remove it, or run `marin schemas pin` and commit"
    if got != pinned:
        return (f"{rel}: edited (now {got}, pinned {pinned}); an edited schema is not used to check "
                f"records: restore it (`git checkout -- {rel}`), or if the change is intended, run "
                "`marin schemas pin` and commit both")
    return None


def pin_problems() -> list[str]:
    """One line per schema file that differs from, is missing from, or is absent in the pins."""
    on_disk = {f"schemas/{p.relative_to(SCHEMA_DIR).as_posix()}": p for p in SCHEMA_DIR.rglob("*.schema.json")}
    out = []
    for rel in sorted(set(on_disk) | set(pins())):
        problem = _pin_problem(rel, on_disk[rel].read_bytes() if rel in on_disk else None)
        if problem:
            out.append(problem)
    return out


def current_pins() -> dict[str, str]:
    """The digests of the schema files as they are now (what `marin schemas pin` writes); a file that
    is not a valid draft 2020-12 schema is refused, in one line naming it: it could not judge a record."""
    out = {}
    for path in sorted(SCHEMA_DIR.rglob("*.schema.json")):
        rel, data = f"schemas/{path.relative_to(SCHEMA_DIR).as_posix()}", path.read_bytes()
        try:
            schema = json.loads(data)
        except ValueError as e:
            raise SchemaError(f"{rel}: not JSON ({e}); fix it, then run `marin schemas pin`") from None
        _compiled(schema, rel)
        out[rel] = hashing.bytes_digest(data)
    return out


def _compiled(schema: Any, rel: str) -> Any:
    """The compiled (Rust) validator of ``schema``; building it checks the schema against the draft
    2020-12 meta-schema, and one that fails is refused in one line naming ``rel``."""
    try:
        return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)
    except jsonschema_rs.ValidationError as e:
        raise SchemaError(f"{rel}: not a valid draft 2020-12 schema ({str(e).splitlines()[0]}); fix it, "
                          "then run `marin schemas pin`") from None


class UnpinnedSchema(SchemaError):
    """The schema a record would be checked against is edited, missing or unpinned: it cannot judge."""


@functools.cache
def _schema(name: str) -> dict[str, Any]:
    """``schemas/<name>.schema.json``, parsed, if it is the pinned one."""
    path = SCHEMA_DIR / f"{name}.schema.json"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UnpinnedSchema(f"no schema {path}: is the marin checkout complete?") from None
    problem = _pin_problem(f"schemas/{name}.schema.json", data)
    if problem:
        raise UnpinnedSchema(problem)
    return json.loads(data)


@functools.cache
def validator(name: str) -> Draft202012Validator:
    """The explaining validator for ``schemas/<name>.schema.json`` (e.g. ``ledger/run.started``)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(_schema(name), format_checker=Draft202012Validator.FORMAT_CHECKER)


@functools.cache
def _fast(name: str) -> Any:
    """A compiled (Rust) validator of the same schema: ~200x faster, used to accept; the explaining
    one above names what is wrong when it rejects. Building it checks the schema against the
    draft 2020-12 meta-schema (the pinned set passes: tests/test_records.py, ``marin schemas pin``)."""
    return _compiled(_schema(name), f"schemas/{name}.schema.json")


def is_valid(instance: Any, name: str) -> bool:
    try:
        return bool(_fast(name).is_valid(instance))
    except (ValueError, TypeError, OverflowError):  # a value the compiled validator cannot take (a huge int)
        return not errors(instance, name)


def key_path(error: jsonschema.ValidationError) -> str:
    """``train.lr``-style path of the failing value, ``<root>`` for the top level."""
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path]
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else "." + p
    return out or "<root>"


def _best(errors: list[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    from jsonschema.exceptions import best_match

    return best_match(errors)


def explain(error: jsonschema.ValidationError) -> str:
    """One line: where, the bad value, what is allowed."""
    where = key_path(error)
    v = str(error.validator)
    schema: dict[str, Any] = error.schema if isinstance(error.schema, dict) else {}  # a bool schema has no keys
    if v == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed)) if isinstance(error.instance, dict) else []
        names = ", ".join(extra)
        prefix = where + "." if where != "<root>" else ""
        return f"{prefix}{names}: unknown key; allowed keys here: {', '.join(allowed)}"
    if v == "required":
        missing = [k for k in schema["required"] if k not in error.instance]
        prefix = where + "." if where != "<root>" else ""
        return f"{prefix}{missing[0]}: missing; it is required ({schema['required']!s})"
    value = json.dumps(error.instance, default=str)
    if len(value) > 60:
        value = value[:57] + "..."
    if v == "type":
        return f"{where}: {value} has the wrong type; expected {schema['type']}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{where}: {value} is out of range; {_range(schema)}"
    if v == "enum":
        return f"{where}: {value} is not allowed; expected one of {schema['enum']}"
    if v in ("maxLength", "minLength", "maxItems", "minItems"):
        n = len(error.instance) if isinstance(error.instance, str | list) else None
        unit = "characters" if v.endswith("Length") else "items"
        bound = "at most" if v.startswith("max") else "at least"
        return f"{where}: {n} {unit}; {bound} {schema[v]} allowed"
    if v == "pattern":
        desc = schema.get("description", f"a string matching {schema['pattern']}")
        return f"{where}: {value} is not allowed; expected {desc}"
    return f"{where}: {value}: {error.message}"


def _range(schema: dict[str, Any]) -> str:
    lo = schema.get("minimum", schema.get("exclusiveMinimum"))
    hi = schema.get("maximum", schema.get("exclusiveMaximum"))
    lo_op = ">=" if "minimum" in schema else ">"
    hi_op = "<=" if "maximum" in schema else "<"
    parts = []
    if lo is not None:
        parts.append(f"{lo_op} {lo}")
    if hi is not None:
        parts.append(f"{hi_op} {hi}")
    return "allowed: " + " and ".join(parts)


def errors(instance: Any, name: str) -> list[str]:
    """Every validation failure of ``instance`` against schema ``name``, one line each."""
    errs = sorted(validator(name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    lines = []
    for e in errs:
        if e.context:  # oneOf/anyOf: explain the most relevant branch
            e = _best(e.context)
        lines.append(explain(e))
    return lines


def validate(instance: Any, name: str, what: str, error: type[Exception] = SchemaError) -> None:
    """Raise ``error`` with one line per failure, prefixed with ``what`` (a file or record)."""
    if is_valid(instance, name):
        return
    lines = errors(instance, name) or [_fast_message(instance, name)]
    if lines:
        raise error(f"{what}: {lines[0]}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""))


def _fast_message(instance: Any, name: str) -> str:
    """What the compiled validator found, where the explaining one found nothing (e.g. a strict format)."""
    try:
        e = next(iter(_fast(name).iter_errors(instance)))
    except StopIteration:
        return "rejected by the schema"
    where = ".".join(str(p) for p in e.instance_path) or "<root>"
    return f"{where}: {e.message}"
