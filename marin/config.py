"""params.yaml: validated against schemas/params.schema.json, then frozen dataclasses.

Nothing reads params.yaml except through :func:`load`, so no stage can start on params
that the schema (and the cross-field checks below) would reject. Reading is bounded before
anything is built (:mod:`marin.params_file`): at most 1 MiB of UTF-8, no YAML anchors,
aliases or tags, bounded depth and size, string keys only, finite numbers only; every
refusal is one ParamsError line.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from marin import hashing, schemas
from marin.config_data import CurateParams, FetchParams, ModelParams, TokenizeParams

# the data stages' nested params, re-exported (``X as X``): their modules import them from marin.config
from marin.config_data import Dedup as Dedup
from marin.config_data import Extract as Extract
from marin.config_data import Filters as Filters
from marin.config_data import NearDedup as NearDedup
from marin.config_data import PretrainedTokenizer as PretrainedTokenizer
from marin.config_data import Source as Source
from marin.config_data import Split as Split
from marin.errors import MarinError, ParamsError
from marin.params_file import from_defaults, read_yaml, value_problem, with_defaults

# the values the schema (schemas/params.schema.json) allows, each in its enum's order (tests/test_defaults.py)
Schedule = Literal["cosine", "wsd"]
SelectMetric = Literal["bits_per_byte", "val_loss", "loss"]
Goal = Literal["min", "max"]
SweepMethod = Literal["grid", "random"]
Task = Literal["corpus", "reference", "quote", "speaker", "continue"]
Sharding = Literal["replicated", "fsdp"]
Determinism = Literal["portable", "native", "universal"]
DataEngine = Literal["local", "ray"]
Decontaminate = Literal["report", "exclude"]


@dataclass(frozen=True)
class TrainParams:
    steps: int
    batch_size: int
    lr: float
    schedule: Schedule
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
    max_epochs_warning: float = 4.0  # the train stage warns past this many epochs


@dataclass(frozen=True)
class SelectRule:
    metric: SelectMetric
    goal: Goal


@dataclass(frozen=True)
class SweepParams:
    """``marin sweep`` (marin/commands/sweep.py); no stage reads it."""

    method: SweepMethod
    space: tuple[dict[str, Any], ...]  # {param: dotted key, values: [...]} or {param, low, high, log}
    select: SelectRule
    trials: int = 4  # random only
    max_trials: int = from_defaults("sweep.max_trials")  # a grid's product of value counts, or trials, at most
    seed: int | None = None  # random only; default: the root seed
    target: str = "evaluate"


@dataclass(frozen=True)
class InstructionsParams:
    """The built-in instruction set (stage instructions; marin.instruct.tasks)."""

    salt: str
    per_document: int
    heldout_max: int
    tasks: tuple[Task, ...]
    eval_tokens: int  # greedy tokens per held-out instruction (evaluate)


@dataclass(frozen=True)
class DataRuntime:
    """Where the data stages run; never part of a recipe (outputs are the same for all)."""

    engine: DataEngine = from_defaults("runtime.data.engine")
    workers: int = from_defaults("runtime.data.workers")


@dataclass(frozen=True)
class RuntimeParams:
    xla_cpu_threads: int  # NPROC for XLA's CPU thread pool: decides the bits
    devices: int  # devices per process (simulated CPU devices when > 1)
    param_sharding: Sharding
    data: DataRuntime = DataRuntime()
    processes: int = from_defaults("runtime.processes")  # jax.distributed processes; the data axis: processes x devices
    # portable (bits pinned to x86-64-v3) | native (this CPU's fastest kernels) | universal (float64 steps rounded
    # to float32 with a rounding log: the same bits on x86-64 and aarch64)
    determinism: Determinism = from_defaults("runtime.determinism")


@dataclass(frozen=True)
class NetworkParams:
    """Bounds on every network operation (marin/net.py); never part of a recipe."""

    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0  # a silent server is given up after 3 x 20 s and the backoff (62 s; 60 s: 182 s)
    retries: int = 2
    total_timeout_s: float = 600.0  # one download, every try included
    max_bytes: int = 16 << 30  # one download's bytes, at most
    min_rate_bytes_s: float = 10240.0  # a try that gets less over min_rate_window_s ends: a trickling server (0: none)
    min_rate_window_s: float = 30.0


@dataclass(frozen=True)
class LedgerParams:
    """How ``marin ledger check`` judges the ledger; never part of a recipe."""

    clock_skew_s: float = 300.0  # record times may disagree this much (machines' clocks differ a little)


@dataclass(frozen=True)
class HubDataset:
    """A registry task's hub dataset, kept in the project (marin/evaluate/registry.py)."""

    hub_id: str  # the dataset_path the task's YAML names
    path: str  # project folder: <dataset_name or default>/<split>.<jsonl|json|parquet|csv>
    sha256: str  # hashing.dir_digest of the folder, hex
    license: str


@dataclass(frozen=True)
class HarnessParams:
    """lm-evaluation-harness tasks run on the model (marin/evaluate/harness_run.py)."""

    tasks: tuple[str, ...]  # names, or folders of YAMLs
    include: tuple[str, ...]  # project folders of task YAMLs whose tasks ``tasks`` may name
    num_fewshot: int | None  # None: each task's own
    limit: int | None  # samples per task, at most (None: all)
    seed: int  # the harness's random, numpy and few-shot seeds
    batch_size: int
    datasets: tuple[HubDataset, ...] = ()  # hub datasets of registry tasks, as project folders


@dataclass(frozen=True)
class Reference:
    """A Hugging Face model folder scored beside the model (marin/evaluate/reference_stage.py)."""

    name: str  # its stage: reference_<name>
    path: str  # project folder: config.json, weights, tokenizer, README.md (its card)
    sha256: str  # hashing.dir_digest of the folder, hex
    license: str


@dataclass(frozen=True)
class EvaluateParams:
    prompts: tuple[str, ...]
    sample_tokens: int
    batch_size: int
    harness: HarnessParams
    decontaminate: Decontaminate  # the items stage decontaminate found in training data
    references: tuple[Reference, ...] = ()  # other models on the same requests, a stage each


@dataclass(frozen=True)
class DecontaminateParams:
    """Stage decontaminate (marin/evaluate/decontaminate_stage.py): the n of its n-grams."""

    ngram: int


@dataclass(frozen=True)
class TraceParams:
    """Stage trace_index and ``marin trace`` (marin/evaluate/trace_index.py): the shortest span traced,
    the tokens of one index shard (what building holds in memory), and the most tokens of a text traced."""

    min_tokens: int
    shard_tokens: int
    max_query_tokens: int = 1 << 16  # `marin trace` only; 100 KB of prose is ~23,000 tokens (bench_trace.py)


@dataclass(frozen=True)
class EnergyAssumptions:
    """What the report's energy and CO2 estimate assumes (it is an estimate, and says so)."""

    cpu_watts_per_core: float
    gpu_watts: float
    pue: float
    kg_co2e_per_kwh: float


@dataclass(frozen=True)
class HubParams:
    """Where the model goes on the Hugging Face Hub (the cards' ``base_model`` and upload command)."""

    repo_id: str | None = None


@dataclass(frozen=True)
class ReportParams:
    model_name: str
    version: str
    license: str
    code_license: str
    signing_key: str | None
    fmti_indicators: str | None
    mof_licenses: str | None
    authors: tuple[str, ...]
    contact: str | None
    funding: str | None
    url: str | None
    energy: EnergyAssumptions | None
    language: tuple[str, ...]
    datasheet: dict[str, str] | None = None  # the lab's answers to datasheet questions the ledger cannot answer
    hub: HubParams | None = None  # optional: the model's Hub repository
    register: bool = False  # register every report run's model in MLflow, not only releases (marin.report.release)


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
    report: ReportParams | None  # only the report stage reads it
    sft: TrainParams | None  # only the sft stage reads it (the train section's fields)
    instructions: InstructionsParams | None  # only the instructions and sft stages read it
    sweep: SweepParams | None  # only `marin sweep` reads it
    decontaminate: DecontaminateParams  # stage decontaminate's n-gram size
    trace: TraceParams  # stage trace_index's shards, `marin trace`'s shortest span
    network: NetworkParams = NetworkParams()  # optional: timeouts and retries of network operations
    ledger: LedgerParams = LedgerParams()  # optional: the clock skew `marin ledger check` allows

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


def _build(cls: type, data: dict[str, Any]) -> Any:
    """Construct nested frozen dataclasses from validated dicts (lists become tuples)."""
    kwargs = {}
    for name, value in data.items():
        sub, is_float = field_kinds(cls)[name]
        if sub is not None and isinstance(value, list):
            kwargs[name] = tuple(_build(sub, v) for v in value)
        elif sub is not None and value is not None:
            kwargs[name] = _build(sub, value)
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        elif is_float and isinstance(value, int) and not isinstance(value, bool):
            kwargs[name] = float(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


@functools.cache
def field_kinds(cls: type) -> dict[str, tuple[type | None, bool]]:
    """Each field of the config dataclass ``cls``: the dataclass its value (or each item of it) is built as,
    else None, and whether it is a float; read from the field's type (``X | None``, ``tuple[X, ...]``)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (_dataclass_in(hints[f.name]), float in (hints[f.name], *typing.get_args(hints[f.name])))
            for f in dataclasses.fields(cls)}


def _dataclass_in(hint: Any) -> type | None:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    return next((c for c in map(_dataclass_in, typing.get_args(hint)) if c is not None), None)


def _training_checks(name: str, tp: TrainParams, rt: RuntimeParams) -> list[str]:
    """The train (or sft) section against the runtime: equal device shares, warmup below steps."""
    problems = []
    if tp.batch_size % rt.devices:
        problems.append(f"{name}.batch_size: {tp.batch_size} is not divisible by runtime.devices "
                        f"({rt.devices}); each device needs an equal share")
    elif tp.batch_size % (rt.devices * rt.processes):
        problems.append(f"{name}.batch_size: {tp.batch_size} is not divisible by runtime.processes x "
                        f"runtime.devices ({rt.processes} x {rt.devices}); each device needs an equal share")
    if tp.warmup_steps >= tp.steps:
        problems.append(f"{name}.warmup_steps: {tp.warmup_steps} is not below {name}.steps ({tp.steps})")
    return problems


def trial_count(s: SweepParams) -> int:
    """The trials of sweep ``s``: a grid's product of its value counts (counted, nothing built), else ``trials``."""
    if s.method == "grid":
        return math.prod(len(d.get("values", ())) for d in s.space)
    return s.trials


def sweep_problem(s: SweepParams | None) -> str | None:
    """Why sweep ``s`` has too many trials (above ``sweep.max_trials``), or None; the audit's 4 x 1000
    grid ran out of memory being listed."""
    if s is None or (n := trial_count(s)) <= s.max_trials:
        return None
    what = " x ".join(str(len(d.get("values", ()))) for d in s.space) + " grid" if s.method == "grid" else "random"
    fix = "shrink sweep.space" if s.method == "grid" else "lower sweep.trials"
    return f"sweep: {n} trials ({what}) is above sweep.max_trials ({s.max_trials}); {fix} or raise sweep.max_trials"


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
    problems += p.model.shape_problems()
    for name, tp in (("train", p.train), ("sft", p.sft)):
        problems += [] if tp is None else _training_checks(name, tp, p.runtime)
    problems += [x for x in [sweep_problem(p.sweep)] if x]
    names = [s.name for s in p.fetch.sources]
    for i, n in enumerate(names):
        if n in names[:i]:
            problems.append(f"fetch.sources[{i}].name: {n!r} is used twice; names must be unique")
    return problems


def parse(data: Any, what: str = "params.yaml") -> Params:
    """Validate a params mapping over the pipeline's defaults (marin/defaults.yaml) and build the
    frozen config."""
    data = with_defaults(data)
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
    """Read params.yaml over the pipeline's defaults (marin/defaults.yaml), validate and freeze it; a
    ParamsError (exit 2) names the key path."""
    path = Path(path)
    return parse(read_yaml(path), str(path))


def clock_skew_s(root: Path) -> float:
    """``ledger.clock_skew_s`` of the project's params.yaml, which ``marin ledger check`` passes to the ledger;
    the default where it has none, or where params.yaml is not valid (the ledger is checked whatever state
    params.yaml is in)."""
    path = Path(root) / "params.yaml"
    try:
        return load(path).ledger.clock_skew_s if path.is_file() else LedgerParams().clock_skew_s
    except MarinError:
        return LedgerParams().clock_skew_s
