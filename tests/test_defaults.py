"""Each default has one home (issue 59, item 1): marin/defaults.yaml for a knob a run records, its dataclass
field for a knob recorded only when params.yaml sets it, never both. The schema's "default"s and the config's
nesting follow from them: one row per field of every params section, list items included."""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from marin import config, params_file
from marin.config import Params, field_kinds
from marin.paths import SCHEMA_DIR
from tests.conftest import REPO

YAML = params_file.read_yaml(params_file.DEFAULTS)
SCHEMA = json.loads((SCHEMA_DIR / "params.schema.json").read_text())
NONE = object()  # no default


@dataclasses.dataclass(frozen=True)
class Row:
    path: str  # dotted, "[]" for a list's items: fetch.sources[].license_note
    cls: type
    field: dataclasses.Field[Any]


def _is_list(hint: Any) -> bool:
    return any(typing.get_origin(h) is tuple for h in (hint, *typing.get_args(hint)))


def _rows(cls: type, prefix: str = "") -> Iterator[Row]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "raw":
            continue
        path = f"{prefix}.{f.name}" if prefix else f.name
        yield Row(path, cls, f)
        sub = field_kinds(cls)[f.name][0]
        if sub is not None:
            yield from _rows(sub, path + "[]" if _is_list(hints[f.name]) else path)


ROWS = list(_rows(Params))


def _yaml(path: str) -> Any:
    """defaults.yaml's value at ``path``, or NONE (a list's items have no defaults there)."""
    node: Any = YAML
    for part in path.split("."):
        if "[]" in part or not isinstance(node, dict) or part not in node:
            return NONE
        node = node[part]
    return node


def _schema(path: str) -> dict[str, Any] | None:
    """The schema of ``path``, through $refs and into a list's items; None where params.yaml cannot set it."""
    node = SCHEMA
    for part in path.split("."):
        name, items = part.removesuffix("[]"), part.endswith("[]")
        if name not in _resolved(node)["properties"]:
            return None
        node = _resolved(_resolved(node)["properties"][name])
        if items:
            node = _resolved(node["items"])
    return _resolved(node)


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return NONE if f.default_factory is dataclasses.MISSING else f.default_factory()


def _plain(value: Any) -> Any:
    """A default as JSON has it: tuples as lists, dataclasses as mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def _default(row: Row) -> Any:
    """The one default of ``row``: defaults.yaml's value where it holds the key, else the field's."""
    held = _yaml(row.path)
    return held if held is not NONE else _plain(_field_default(row.field))


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_a_default_is_in_defaults_yaml_or_on_its_field_never_both(row: Row) -> None:
    """A field whose key defaults.yaml holds has no default of its own: none, one read from defaults.yaml
    (``from_defaults``), or a section built of such fields (``RuntimeParams.data``)."""
    held, own = _yaml(row.path), _field_default(row.field)
    if held is NONE or own is NONE:
        return
    key = row.field.metadata.get(params_file.DEFAULTS_KEY)
    if key is not None:
        assert key.rsplit(".", 1)[-1] == row.field.name and _plain(params_file.default_at(key)) == held
    else:
        assert dataclasses.is_dataclass(own), f"{row.path}: {own!r} on {row.cls.__name__} and {held!r} in defaults.yaml"
        assert _plain(own) == held and _plain(type(own)()) == held, row.path


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_the_schema_states_the_one_default(row: Row) -> None:
    """The schema's "default" is the one default, and a set-only knob's (defaults.yaml does not show it) is
    stated there; a number a description gives as the default is it too."""
    node, want = _schema(row.path), _default(row)
    if node is None:  # sft.max_epochs_warning: train's field, not settable for sft
        assert want is not NONE, f"{row.path}: neither in the schema nor given a default"
        return
    if "default" in node:
        assert want is not NONE, f"{row.path}: the schema has a default, and neither defaults.yaml nor the field"
        assert node["default"] == want, row.path
    elif _yaml(row.path) is NONE and want not in (NONE, None) and not isinstance(want, dict):
        pytest.fail(f'{row.path}: its default {want!r} is only on the field; give the schema its "default"')
    for said in re.findall(r"default:? (\d+)\b(?!\.\d| ?[KMG]i?B)", node.get("description", "")):
        assert int(said) == want, f"{row.path}: its description says default {said}, its default is {want!r}"


def test_trace_shard_tokens_has_one_value() -> None:
    """The bug that opened issue 59: 1 << 22 on the field and in the schema, 1 Mi in defaults.yaml (which the
    shipped pipeline used, docs/performance.md)."""
    row = next(r for r in ROWS if r.path == "trace.shard_tokens")
    assert _field_default(row.field) is NONE
    assert _yaml("trace.shard_tokens") == (_schema("trace.shard_tokens") or {})["default"] == 1 << 20
    assert config.load(REPO / "params.yaml").trace.shard_tokens == 1 << 20


def test_a_config_built_without_the_yaml_takes_its_defaults() -> None:
    rt = config.RuntimeParams(2, 1, "replicated")
    assert (rt.processes, rt.determinism, rt.data.engine, rt.data.workers) == (1, "portable", "local", 1)
    assert rt == config.load(REPO / "params.yaml").runtime


def _every_section(params: Any) -> dict[str, list[Any]]:
    """Each dataclass-typed field's values in a built config, by ``Class.field``."""
    seen: dict[str, list[Any]] = {}
    for f in dataclasses.fields(params):
        sub, _ = field_kinds(type(params))[f.name]
        value = getattr(params, f.name)
        if sub is None or value is None:
            continue
        seen.setdefault(f"{type(params).__name__}.{f.name}", []).append(value)
        for item in value if isinstance(value, tuple) else (value,):
            assert type(item) is sub, f"{type(params).__name__}.{f.name}: {item!r} is not a {sub.__name__}"
            for k, v in _every_section(item).items():
                seen.setdefault(k, []).extend(v)
    return seen


def test_the_config_nests_as_its_field_types_say() -> None:
    """What the hand-kept _NESTED table said, read from the annotations: every section, list item and
    optional part is built as its field's dataclass, once each is present."""
    given = params_file.read_yaml(REPO / "params.yaml")
    given["tokenize"]["pretrained"] = {"path": "tokenizer/gpt2.json", "sha256": "0" * 64}
    given["evaluate"]["references"] = [{"name": "ref", "path": "refs/ref", "sha256": "0" * 64, "license": "MIT"}]
    given["evaluate"].setdefault("harness", {})["datasets"] = [
        {"hub_id": "org/set", "path": "hub/org/set/test.jsonl", "sha256": "0" * 64, "license": "MIT"}]
    given["report"] = {**given.get("report", {}), "hub": {"repo_id": "org/model"}}
    p = config.parse(given)
    seen = _every_section(p)
    nested = {f"{r.cls.__name__}.{r.field.name}" for r in ROWS if field_kinds(r.cls)[r.field.name][0] is not None}
    assert set(seen) == nested
    assert isinstance(p.curate.filters.min_mean_word_length, float) and isinstance(p.network.retries, int)


def _enum(node: dict[str, Any]) -> list[Any]:
    """The values the schema allows at a node, or at each item of a list node; [] when it allows any."""
    if node.get("type") == "array" and "items" in node:
        node = _resolved(node["items"])
    return list(node.get("enum", []))


def _literal(hint: Any) -> list[Any]:
    """The values of the Literal in a field's type (``X``, ``X | None``, ``tuple[X, ...]``); [] without one."""
    return [v for h in (hint, *typing.get_args(hint)) if typing.get_origin(h) is typing.Literal
            for v in typing.get_args(h)]


@pytest.mark.parametrize("row", ROWS, ids=[r.path for r in ROWS])
def test_a_field_the_schema_limits_to_a_list_is_typed_as_that_list(row: Row) -> None:
    """Each config field whose values the schema enumerates is a ``Literal`` of those values, in their order (the
    type checker then refuses a misspelt one), and a field typed by a Literal is enumerated in the schema."""
    node = _schema(row.path)
    if node is None:
        return
    assert _literal(typing.get_type_hints(row.cls)[row.field.name]) == _enum(node), row.path


def test_the_enum_rule_sees_a_list_of_literals() -> None:
    tasks = typing.get_type_hints(config.InstructionsParams)["tasks"]
    assert _literal(tasks) == _enum(_schema("instructions.tasks") or {}) == ["corpus", "reference", "quote", "speaker",
                                                                              "continue"]
    assert len(_literal(typing.get_type_hints(config.RuntimeParams)["determinism"])) == 3
