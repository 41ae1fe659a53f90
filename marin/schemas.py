"""Load the JSON Schemas (draft 2020-12) under schemas/ and validate against them."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator

from marin.errors import SchemaError
from marin.paths import SCHEMA_DIR


@functools.cache
def validator(name: str) -> Draft202012Validator:
    """Validator for ``schemas/<name>.schema.json`` (e.g. ``ledger/run.started``)."""
    path = SCHEMA_DIR / f"{name}.schema.json"
    try:
        schema = json.loads(path.read_text())
    except FileNotFoundError:
        raise SchemaError(f"no schema {path}: is the marin checkout complete?") from None
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def key_path(error: jsonschema.ValidationError) -> str:
    """``train.lr``-style path of the failing value, ``<root>`` for the top level."""
    parts = [str(p) if not isinstance(p, int) else f"[{p}]" for p in error.absolute_path]
    out = ""
    for p in parts:
        out += p if p.startswith("[") or not out else "." + p
    return out or "<root>"


def _best(errors: list[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    return jsonschema.exceptions.best_match(errors)


def explain(error: jsonschema.ValidationError) -> str:
    """One line: where, the bad value, what is allowed."""
    where = key_path(error)
    v = error.validator
    schema = error.schema
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
    lines = errors(instance, name)
    if lines:
        raise error(f"{what}: {lines[0]}" + (f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""))
