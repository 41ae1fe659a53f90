"""What the environment records are, as TypedDicts: run.started's ``code``, ``env`` and
``determinism_class`` (:mod:`marin.env` and :func:`marin.train.runtime.determinism_class` make them;
:mod:`marin.ledger.bodies` types the records that hold them, and a test holds their keys to the schemas)."""

# No ``from __future__ import annotations`` here: TypedDict reads NotRequired from evaluated
# annotations, and stringified ones would make every key required in __required_keys__.

from typing import Any, Literal, NotRequired, TypedDict

Digest = str  # "sha256:<64 hex>"


class CodeState(TypedDict):
    """run.started's ``code`` (:func:`marin.env.code_state`)."""

    git_commit: str | None
    tree_digest: str | None
    dirty: bool
    diff_digest: Digest | None
    code_digest: Digest
    lock_digest: Digest | None
    closure_digest: NotRequired[Digest]
    closure: NotRequired[dict[str, Digest]]
    changed: NotRequired[list[str]]
    stray: NotRequired[list[str]]
    stray_count: NotRequired[int]


class Env(TypedDict):
    """run.started's ``env``: the machine's fingerprint (:func:`marin.env.fingerprint`). The schema
    requires fewer keys (runs recorded before marin wrote the others may lack them)."""

    python: str
    python_implementation: str
    platform: str
    machine: str
    byteorder: str
    cpu_model: str
    isa_flags: list[str]
    isa_level: str
    cpu_count: int
    usable_cores: list[int]
    packages: dict[str, str | None]
    env_vars: dict[str, str]


class DeterminismClass(TypedDict):
    """run.started's ``determinism_class``: what can change a run's bits. ``kind`` says which of
    the rest it has: data (:func:`marin.env.data_class`), jax (:func:`marin.train.runtime.determinism_class`)
    or torch (the reference models' evaluation)."""

    kind: str
    python: NotRequired[str]  # data
    byteorder: NotRequired[str]
    pyarrow: NotRequired[str | None]
    tokenizers: NotRequired[str | None]
    machine: NotRequired[str]  # every kind
    backend: NotRequired[str]  # jax
    device_kind: NotRequired[str]
    device_count: NotRequired[int]
    mesh: NotRequired[dict[str, Any]]
    jax: NotRequired[str | None]
    jaxlib: NotRequired[str | None]
    xla_flags: NotRequired[list[str]]
    xla_cpu_threads: NotRequired[int]
    prng_impl: NotRequired[str]
    x64: NotRequired[bool]
    profile: NotRequired[Literal["portable", "native", "universal"]]
    tau: NotRequired[float]  # universal: the rounding log's threshold, in float32 ulps
    rounding: NotRequired[str]  # universal: how a step's results become float32
    isa_level: NotRequired[str]
    isa_flags: NotRequired[list[str]]
    onednn_max_cpu_isa: NotRequired[str | None]
    torch: NotRequired[str]  # torch
    device: NotRequired[str]
    dtype: NotRequired[str]
    threads: NotRequired[int]
