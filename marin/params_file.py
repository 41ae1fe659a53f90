"""Reading params.yaml under limits that hold before anything is built: at most 1 MiB of
UTF-8, no YAML anchors, aliases or tags, bounded depth and size, string keys that are names,
finite numbers exact in JSON, no control characters; every refusal is one ParamsError line
naming the file and the key (:mod:`marin.config` then validates and builds the config). A project's
params.yaml sets what it changes over the pipeline's defaults (``marin/defaults.yaml``):
:func:`with_defaults` merges the two."""

from __future__ import annotations

import codecs
import copy
import dataclasses
import errno
import functools
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from marin.errors import ParamsError
from marin.fsutil import open_regular

DEFAULTS = Path(__file__).with_name("defaults.yaml")  # code: in every stage's closure (package data)
DEFAULTS_KEY = "defaults.yaml"  # a field's metadata: the dotted key of defaults.yaml its default is read from
MAX_BYTES = 1 << 20  # the shipped params.yaml is about 5 KB
MAX_DEPTH = 16  # the shipped file nests 7 deep (fetch.sources[0].extract[0].include)
MAX_NODES = 10_000  # the shipped file has about 150 values
MAX_INT = 2**53 - 1  # the largest integer RFC 8785 (the ledger's JSON) carries exactly
_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_TAG + t for t in ("str", "int", "float", "bool", "null"))
_KEY = re.compile(r"[a-z_][a-z0-9_]{0,63}")
# C0/C1 controls but tab, newline and carriage return; lone surrogates cannot be UTF-8
_BAD_CHAR = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml: 1 MiB parses in milliseconds


def _too_large(path: Path, size: str) -> str:
    return (f"{path}: {size} is too large; params.yaml may be at most {MAX_BYTES} bytes (1 MiB): "
            "remove what the pipeline does not read")


def _read(path: Path) -> str:
    """The text of a regular file of at most MAX_BYTES, UTF-8 without a byte order mark."""
    try:  # checked on the open file, not a stat before it: a fifo swapped in meanwhile would block
        f = open_regular(path, follow=True)
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found; run from the project root or set MARIN_ROOT") from None
    except OSError as e:
        if e.errno == errno.EINVAL:  # open_regular's own: a fifo, a directory, a device
            raise ParamsError(f"{path}: not a regular file; params.yaml must be a plain YAML file") from None
        raise ParamsError(f"{path}: cannot read ({e.strerror}); check the file") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_BYTES:
            raise ParamsError(_too_large(path, f"{size} bytes"))
        data = f.read(MAX_BYTES + 1)  # it may have grown since fstat
    if len(data) > MAX_BYTES:
        raise ParamsError(_too_large(path, f"over {MAX_BYTES} bytes"))
    if data.startswith(codecs.BOM_UTF8):
        raise ParamsError(f"{path}: starts with a byte order mark; save it as UTF-8 without BOM")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ParamsError(f"{path}: not UTF-8 at line {line} (byte {e.start}: {e.reason}); "
                          "save it as UTF-8") from None


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _show(value: object) -> str:
    """A short one-line rendering of a value for a message."""
    text = ascii(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _scan(text: str) -> None:
    """Refuse anchors, aliases, tags, deep nesting and too many values, one event at a time.

    Nothing is composed or constructed yet, so an alias bomb costs no memory.
    """
    depth = nodes = docs = 0
    for ev in yaml.parse(text, Loader=_Loader):
        where = _at(ev.start_mark)
        if isinstance(ev, yaml.AliasEvent) or getattr(ev, "anchor", None) is not None:
            raise ParamsError(f"{where}: YAML anchors and aliases (&name, *name) are not allowed; "
                              "write the value out in full")
        if getattr(ev, "tag", None) is not None:
            raise ParamsError(f"{where}: YAML tag {_show(ev.tag)} is not allowed; write a plain value")
        if isinstance(ev, yaml.DocumentStartEvent):
            docs += 1
            if docs > 1:
                raise ParamsError(f"{where}: a second YAML document; params.yaml holds exactly one")
        if isinstance(ev, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_NODES:
                raise ParamsError(f"{where}: more than {MAX_NODES} YAML nodes (keys and values); "
                                  "params.yaml is a short config")
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise ParamsError(f"{where}: nested more than {MAX_DEPTH} levels deep; flatten it")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _key_problem(key: Any, path: str) -> str | None:
    if isinstance(key, str) and _KEY.fullmatch(key):
        return None
    return f"{path or '<root>'}: key {_show(key)} is not a params key; keys are lowercase names (a-z, 0-9, '_')"


def _key_kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return f"{_show(node.value)} (a YAML {node.tag.removeprefix(_TAG)}, not a string)"
    return "a mapping" if isinstance(node, yaml.MappingNode) else "a sequence"


def _value(node: yaml.Node, path: str, ctor: yaml.constructor.SafeConstructor) -> Any:
    """Plain data from a composed node: unique string keys, only str/int/float/bool/null scalars."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not (isinstance(key_node, yaml.ScalarNode) and key_node.tag == _TAG + "str"):
                raise ParamsError(f"{path or '<root>'}: {_key_kind(key_node)} as a key at "
                                  f"{_at(key_node.start_mark)}; keys are names like `seed`")
            key, line = key_node.value, key_node.start_mark.line + 1
            if problem := _key_problem(key, path):
                raise ParamsError(f"{problem} (at {_at(key_node.start_mark)})")
            if key in out:
                raise ParamsError(f"{_join(path, key)}: duplicate key {key!r} at line {line} "
                                  f"(first at line {lines[key]}); keep one of them")
            out[key], lines[key] = _value(value_node, _join(path, key), ctor), line
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_value(v, f"{path}[{i}]", ctor) for i, v in enumerate(node.value)]
    where = path or "<root>"
    if node.tag not in _SCALAR_TAGS:
        kind = node.tag.removeprefix(_TAG)
        raise ParamsError(f"{where}: {_show(node.value)} reads as a YAML {kind}; quote it to make a string")
    if node.tag == _TAG + "int" and len(node.value) > 32:  # int() refuses over 4300 digits, slowly
        raise ParamsError(f"{where}: an integer of {len(node.value)} characters is out of range; "
                          f"integers lie within +-{MAX_INT}")
    return ctor.construct_object(node)


def _yaml_problem(e: yaml.YAMLError, text: str) -> str:
    """One line for a YAML syntax error: where and what."""
    if isinstance(e, yaml.reader.ReaderError):
        line = text.count("\n", 0, e.position) + 1
        char = e.character if isinstance(e.character, int) else ord(e.character)
        return f"not valid YAML at line {line}: character U+{char:04X} is not allowed; remove it"
    mark = getattr(e, "problem_mark", None)
    where = f" at {_at(mark)}" if mark else ""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    return f"not valid YAML{where}: {problem}"


def read_yaml(path: Path) -> Any:
    """params.yaml as plain data, or a one-line ParamsError saying where it is refused."""
    text = _read(path)
    try:
        _scan(text)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
        return None if node is None else _value(node, "", yaml.constructor.SafeConstructor())
    except yaml.YAMLError as e:
        raise ParamsError(f"{path}: {_yaml_problem(e, text)}") from None
    except ParamsError as e:
        raise ParamsError(f"{path}: {e}") from None


def value_problem(obj: object, path: str = "", depth: int = 0) -> str | None:
    """The first key that is not a name, number that is not finite or exact in JSON, or
    string with a control character, anywhere in ``obj``; None when there is none."""
    where = path or "<root>"
    if depth > MAX_DEPTH:
        return f"{where}: nested more than {MAX_DEPTH} levels deep; flatten it"
    if isinstance(obj, dict):
        for k, v in obj.items():
            if problem := _key_problem(k, path):
                return problem
            if problem := value_problem(v, _join(path, k), depth + 1):
                return problem
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if problem := value_problem(v, f"{path}[{i}]", depth + 1):
                return problem
    elif isinstance(obj, float) and not math.isfinite(obj):
        return f"{where}: {obj} is not a finite number; every number in params must be finite"
    elif isinstance(obj, int) and not isinstance(obj, bool) and abs(obj) > MAX_INT:
        return f"{where}: {_show(obj)} is out of range; integers lie within +-{MAX_INT}"
    elif isinstance(obj, str) and (bad := _BAD_CHAR.search(obj)):
        return (f"{where}: control character U+{ord(bad.group()):04X} at position {bad.start()}; "
                "remove it")
    elif obj is not None and not isinstance(obj, (str, int, float, bool)):
        return f"{where}: a {type(obj).__name__} is not a params value"
    return None


@functools.cache
def _defaults() -> dict[str, Any]:
    return read_yaml(DEFAULTS)


def default_at(key: str) -> object:
    """The value of the dotted ``key`` in marin/defaults.yaml, lists as tuples; a KeyError when it holds none."""
    node: object = _defaults()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"marin/defaults.yaml holds no {key}")
        node = node[part]
    return _frozen(node)


def _frozen(value: object) -> object:
    return tuple(_frozen(v) for v in value) if isinstance(value, list) else value


def from_defaults(key: str) -> Any:
    """A dataclass field whose default is defaults.yaml's ``key``: the field reads the one home of its
    default, so a config built without the YAML (``RuntimeParams(2, 1, "replicated")``) agrees with it."""
    return dataclasses.field(default=default_at(key), metadata={DEFAULTS_KEY: key})


def merged(given: object, default: object) -> object:
    """``given`` over ``default``: mappings merge key by key, anything else given replaces the default,
    and an empty section (``curate:``, null) over a mapping keeps the mapping."""
    if isinstance(default, dict) and (given is None or isinstance(given, dict)):
        over = given or {}
        rest = {k: v for k, v in default.items() if k not in over}
        return {**{k: merged(v, default.get(k)) for k, v in over.items()}, **rest}
    return given


def with_defaults(given: object) -> object:
    """A params.yaml document over the pipeline's defaults: what every stage reads and records."""
    return merged(given, copy.deepcopy(_defaults())) if isinstance(given, dict) else given


def present(given: object, key: str) -> str | None:
    """The longest prefix of the dotted ``key`` that the document ``given`` holds (``runtime`` for
    ``runtime.devices`` in a file with ``runtime: {}``), or None when not even its section is there."""
    parts, node, found = key.split("."), given, None
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            break
        node, found = node[part], ".".join(parts[:i + 1])
    return found


def dump(doc: object) -> str:
    """``doc`` as block-style YAML in its own key order (``marin params show``)."""
    return yaml.safe_dump(doc, sort_keys=False, width=120)
