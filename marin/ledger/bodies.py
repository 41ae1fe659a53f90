"""The body of each kind of ledger record, as a TypedDict: the keys its JSON Schema
(``schemas/ledger/<kind>.schema.json``) requires or allows, for type hints where bodies are
built. The schema stays the authority (a test holds these keys to it); nested objects that
the schema leaves open are ``dict[str, Any]``, but for those readers use most (the code state,
the environment, the determinism class, the seeds), typed by what marin writes into them."""

# No ``from __future__ import annotations`` here: TypedDict reads NotRequired from evaluated
# annotations, and stringified ones would make every key required in __required_keys__.

from typing import Any, Literal, NotRequired, TypedDict

# run.started's open objects, typed beside what makes them (re-exported: readers take every body type from here)
from marin.env_types import CodeState as CodeState
from marin.env_types import DeterminismClass as DeterminismClass
from marin.env_types import Digest as Digest
from marin.env_types import Env as Env


class Exact(TypedDict):
    """A float kept bit for bit: its decimal value and ``float.hex()``."""

    value: float
    hex: str


class Named(TypedDict):
    """A name and a digest: run.started's inputs, run.finished's outputs."""

    name: str
    digest: Digest


class Stream(TypedDict):
    fold_in: int
    key_data: list[int]


class Seeds(TypedDict):
    """run.started's ``seeds`` (:func:`marin.train.seeds.record`); empty for stages that draw none."""

    root: NotRequired[int]
    derivation: NotRequired[str]
    prng_impl: NotRequired[str]
    streams: NotRequired[dict[str, Stream]]


class RunStarted(TypedDict):
    stage: str
    command: list[str]
    params: dict[str, Any]
    recipe_digest: Digest
    inputs: list[Named]
    code: CodeState
    env: Env
    determinism_class: DeterminismClass
    determinism_digest: Digest
    seeds: Seeds
    execution: NotRequired[dict[str, Any]]


class RunResumed(TypedDict):
    from_seq: int
    from_step: NotRequired[int]
    reason: str
    env: Env
    code: CodeState
    execution: NotRequired[dict[str, Any]]


class RunFinished(TypedDict):
    status: Literal["succeeded", "failed"]
    outputs: list[Named]
    merkle_root: Digest
    records: int
    wall_s: float
    ledger_s: float
    cpu_s: NotRequired[float]  # process CPU seconds (os.times), absent in runs written before it was measured
    error: NotRequired[str]


class InputBody(TypedDict):
    name: str
    path: str
    digest: Digest
    size: int
    license: NotRequired[str]
    text_license: NotRequired[str]  # a raw source's texts' own status where it differs from license (fetch)
    locator: NotRequired[str]
    dvc_md5: NotRequired[str]
    digest_of: NotRequired[Literal["ledger_head", "public_key"]]
    runs: NotRequired[int]


class OutputBody(TypedDict):
    name: str
    path: str
    digest: Digest
    size: int
    type: Literal["file", "dir"]
    dvc_md5: str
    files: NotRequired[int]
    entries: NotRequired[list[dict[str, Any]]]
    listing: NotRequired[str]
    tensor_digest: NotRequired[Digest]
    meta: NotRequired[dict[str, Any]]


class LoaderPosition(TypedDict):
    epoch: int
    index: int


class StoredCheckpoint(TypedDict):
    """Where a checkpoint was stored for hosts without a shared disk: a DVC remote, the manifest's sha256."""

    remote: str
    url: str
    manifest: Digest


class CheckpointBody(TypedDict):
    step: int
    path: str
    digest: Digest
    params_digest: NotRequired[Digest]
    files_digest: NotRequired[Digest]
    loader: LoaderPosition
    leaves: int
    stored: NotRequired[StoredCheckpoint]


class RoundingSummary(TypedDict):
    """A universal run's rounding log at a metric record: entries per step since ``from_step``, and
    the digest of the log through the record's step."""

    entries: list[int]
    from_step: int
    log_digest: str


class MetricBody(TypedDict):
    step: int
    values: dict[str, Exact]
    timing: NotRequired[dict[str, float]]
    rounding: NotRequired[RoundingSummary]


class Sample(TypedDict):
    prompt: str
    completion: str
    token_ids: list[int]


class EvalBody(TypedDict):
    name: str
    split: str
    corpus: NotRequired[str]
    values: dict[str, Exact | int | str]
    samples: NotRequired[list[Sample]]


class PublicationBody(TypedDict):
    what: Literal["dvc", "checkpoint"]
    name: str
    path: str
    digest: Digest
    size: int
    remote: str
    url: str
    dvc_md5: NotRequired[str]
    run_id: NotRequired[str]
    step: NotRequired[int]
    manifest: NotRequired[Digest]
    files: NotRequired[int]


class VerifiedRun(TypedDict):
    run_id: str
    recipe_digest: Digest
    finished_digest: Digest


class CpuDifference(TypedDict):
    """How the verifier's CPU differs from the recorder's (:func:`marin.verify.compare.cpu_differences`)."""

    recorded: dict[str, Any]
    verifier: dict[str, Any]
    only_recorded: list[str]
    only_verifier: list[str]


class ClassDifference(TypedDict):
    """One flattened determinism-class key whose value the replay's class does not share."""

    key: str
    recorded: Any
    verifier: Any


class Segments(TypedDict):
    """The intervals ``marin verify --segments K`` drew and replayed."""

    seed: int
    seed_source: NotRequired[Literal["random", "chosen by the verifier"]]
    k: int
    n: int
    drawn: list[list[int]]
    detection_probability: float


class VerificationBody(TypedDict):
    verified: VerifiedRun
    mode: Literal["full", "segments"]
    result: Literal["bit-exact", "mismatch", "class-differs"]
    exit_code: Literal[0, 1, 3]
    verifier: dict[str, Any]
    compared: dict[str, int]
    first_divergence: dict[str, Any] | None
    cpu: NotRequired[CpuDifference]  # the verifier's CPU differs from the recorder's
    class_differences: NotRequired[list[ClassDifference]]
    distances: NotRequired[dict[str, Any]]
    segments: NotRequired[Segments]
    replay_run_id: NotRequired[str]
    signer: NotRequired[dict[str, str]]  # {"keyid": ...}: the key `marin verify --sign` signs it with
    time: dict[str, float]


def compared_nothing(body: VerificationBody) -> bool:
    """A verification that compared no record (a skipped replay, a hand-made record) verified nothing:
    it is no verdict, and nothing counts it."""
    return not any(n > 0 for n in body["compared"].values())


class TrialRun(TypedDict):
    run_id: str
    stage: str
    status: Literal["succeeded", "failed", "unfinished"]


class TrialBody(TypedDict):
    index: int
    params: dict[str, float | int | str | bool]
    status: Literal["succeeded", "failed"]
    experiment: str
    commit: NotRequired[str]
    runs: list[TrialRun]
    metrics: dict[str, float]
    error: NotRequired[str]


class SelectionRule(TypedDict):
    metric: str
    goal: Literal["min", "max"]


class SelectionBody(TypedDict):
    rule: SelectionRule
    trial: int | None
    experiment: NotRequired[str]
    value: NotRequired[float]
    reason: str


Kind = Literal["run.started", "run.resumed", "input", "output", "checkpoint", "metric", "eval", "run.finished",
               "verification", "publication", "trial", "selection"]  # record.schema.json's ``kind``

BODIES: dict[Kind, type] = {
    "run.started": RunStarted, "run.resumed": RunResumed, "input": InputBody, "output": OutputBody,
    "checkpoint": CheckpointBody, "metric": MetricBody, "eval": EvalBody, "run.finished": RunFinished,
    "verification": VerificationBody, "publication": PublicationBody, "trial": TrialBody,
    "selection": SelectionBody,
}  # the body of each record kind, in records.KINDS's order
