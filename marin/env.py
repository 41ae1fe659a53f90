"""The environment fingerprint of a run, and its determinism class.

The fingerprint is what a reader needs to reproduce the run's environment; the
determinism class is the part of it that can change output bits. Two runs of one recipe
in the same class must agree bit for bit (docs/architecture.md, "Determinism contract").
Environment variables are recorded only from an allow-list: no secrets in the ledger.
"""

from __future__ import annotations

import fnmatch
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from marin import cpu, hashing
from marin.errors import MarinError

if TYPE_CHECKING:
    from marin.env_types import CodeState, DeterminismClass, Env

# Variables that can change results or explain them. Everything else stays out.
ENV_ALLOW = (
    "XLA_FLAGS", "NPROC", "JAX_*", "ONEDNN_*", "DNNL_*", "TF_CPP_MIN_LOG_LEVEL", "OMP_NUM_THREADS",
    "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "PYTHONHASHSEED",
    "CUDA_VISIBLE_DEVICES", "TOKENIZERS_PARALLELISM", "MARIN_*", "LANG", "LC_ALL", "TZ",
)
# Never recorded even if an allow pattern matches them.
ENV_DENY = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*KEY*", "*CREDENTIAL*")

# Paths whose content is the "code" of the pipeline: a change here changes the recipe.
CODE_GLOBS = ("marin/**/*.py", "marin/**/*.json", "marin/**/*.csv", "pipeline/**/*.py", "schemas/**/*.json",
              "pyproject.toml", "uv.lock")
# Beside the code, files whose change can change a run's result: uncommitted, they make it dirty
# (closures/: the links through which DVC sees each stage's code, written with dvc.yaml).
RECIPE_FILES = ("dvc.yaml", "closures/**")
# Folders that are code as a whole: any file in them that differs from the commit (untracked, even
# git-ignored, but for __pycache__) makes a run dirty; Python would import an untracked
# ``marin/hashing.cpython-311-x86_64-linux-gnu.so`` in place of ``marin/hashing.py``.
CODE_DIRS = ("marin", "pipeline", "schemas")
MAX_NAMES = 200  # changed/stray file names listed in a record (the count is kept in full)
LOCK_FILE = "uv.lock"
# Paths that change while the pipeline runs, or whose content each run records in full
# (params.yaml: the sections a stage reads are in its run.started; metrics/: git-versioned stage
# outputs, which a reader records by digest); not part of the code state.
DIFF_EXCLUDE = ("ledger", "dvc.lock", "reports", "mlflow.db", "params.yaml", "metrics")

def recorded_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The allow-listed environment variables and their values."""
    environ = dict(os.environ if environ is None else environ)
    out = {}
    for k in sorted(environ):
        if any(fnmatch.fnmatchcase(k, p) for p in ENV_ALLOW) and not any(
            fnmatch.fnmatchcase(k.upper(), p) for p in ENV_DENY
        ):
            out[k] = environ[k]
    return out


def usable_cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class GitError(MarinError):
    """A git command failed (``git(..., check=True)``)."""


def git(cwd: Path, *args: str, check: bool = False, timeout: float = 60) -> str | None:
    """The output of ``git ARGS`` in ``cwd``. When git fails (or is missing, or times out): None,
    or with ``check`` a GitError naming the command and what git said."""
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:  # no git, or it hung
        why = str(e)
    else:
        if p.returncode == 0:
            return p.stdout.decode("utf-8", "surrogateescape")
        why = p.stderr.decode("utf-8", "replace").strip()
    if check:
        raise GitError(f"git {' '.join(args)} failed in {cwd}: {why}")
    return None


def code_paths(root: Path) -> list[str]:
    """Relative paths of the files that make up the pipeline's code."""
    found = set()
    for pattern in CODE_GLOBS:
        found.update(p.relative_to(root).as_posix() for p in root.glob(pattern) if p.is_file())
    return sorted(p for p in found if "__pycache__" not in p)


def code_state(root: Path, inputs: tuple[str, ...] | list[str] = (),
               closure: list[str] | None = None) -> CodeState:
    """Git commit, tree digest, uncommitted-diff digest, the digest of the code files, and (given
    ``closure``, the files of a stage's code: :mod:`marin.stages.closure`) each closure file's sha256
    and the digest over them, which is what the recipe digest covers.

    A run is ``dirty`` only when something that can change its result differs from the
    commit: the code (``CODE_GLOBS``, and any file in ``CODE_DIRS``), ``dvc.yaml``, and the
    run's own ``inputs`` where git tracks them. Other changed or untracked files are listed by
    name (``stray``), never by content: a ``notes.txt`` beside the project must not make every
    run unverifiable.
    """
    commit = git(root, "rev-parse", "--verify", "-q", "HEAD")
    tree = git(root, "rev-parse", "--verify", "-q", "HEAD^{tree}")
    code = [f":(glob){g}" for g in (*CODE_GLOBS, *RECIPE_FILES)]
    inputs = [p for p in inputs if p.split("/")[0] not in DIFF_EXCLUDE]  # pipeline outputs, recorded by digest
    relevant = code + [f":(literal){p}" for p in (*CODE_DIRS, *inputs)]  # an untracked input is recorded by digest
    diff = git(root, "diff", "HEAD", "--binary", "--", *relevant) if commit else None
    untracked = sorted(set(_lines(git(root, "ls-files", "--others", "--exclude-standard", "--", *code)))
                       | {p for p in _lines(git(root, "ls-files", "--others", "--", *CODE_DIRS))
                          if "__pycache__" not in p.split("/")})
    changed = sorted(set(_lines(git(root, "diff", "HEAD", "--name-only", "--", *relevant)) if commit else [])
                     | set(untracked))
    dirty_text = (diff or "") + "".join(f"untracked {p}\n" for p in untracked)
    excludes = [f":(exclude){p}" for p in DIFF_EXCLUDE]
    others = set(_lines(git(root, "ls-files", "--others", "--exclude-standard", "--", ".", *excludes)))
    if commit:
        others |= set(_lines(git(root, "diff", "HEAD", "--name-only", "--", ".", *excludes)))
    stray = sorted(others - set(changed))
    lock = root / LOCK_FILE
    state: CodeState = {
        "git_commit": commit.strip() if commit else None,
        "tree_digest": f"git-tree:{tree.strip()}" if tree else None,
        "dirty": bool(dirty_text),
        "diff_digest": hashing.bytes_digest(dirty_text.encode("utf-8", "surrogateescape")) if dirty_text else None,
        "code_digest": hashing.files_digest(root, code_paths(root)),
        "lock_digest": hashing.file_digest(lock) if lock.is_file() else None,
    }
    if closure is not None:
        files = {p: hashing.file_digest(root / p) for p in closure if (root / p).is_file()}
        state["closure_digest"] = hashing.files_map_digest(files)  # = files_digest(root, closure), read once
        state["closure"] = files
    if changed:
        state["changed"] = changed[:MAX_NAMES]
    if stray:
        state["stray"] = stray[:MAX_NAMES]
        state["stray_count"] = len(stray)
    return state


def _lines(out: str | None) -> list[str]:
    return [x for x in (out or "").splitlines() if x]


def fingerprint() -> Env:
    """What this machine and interpreter are, as far as a run's results may care."""
    return {
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "byteorder": sys.byteorder,
        "cpu_model": cpu.model(),  # from cpuid, as the kernels see it (marin/cpu.py)
        "isa_flags": cpu.reported_features(),
        "isa_level": cpu.isa_level(),
        "cpu_count": os.cpu_count() or 1,
        "usable_cores": usable_cores(),
        "packages": {
            d: version(d)
            for d in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "pyarrow",
                      "tokenizers", "datasketch", "dvc", "mlflow")
        },
        "env_vars": recorded_env_vars(),
    }


def data_class(fp: Env) -> DeterminismClass:
    """Determinism class of the data stages: pure Python, Arrow and Rust code whose bits
    depend on library versions (pinned by the lock digest in the recipe) and the platform."""
    return {
        "kind": "data",
        "python": ".".join(fp["python"].split(".")[:2]),
        "machine": fp["machine"],
        "byteorder": fp["byteorder"],
        "pyarrow": fp["packages"]["pyarrow"],
        "tokenizers": fp["packages"]["tokenizers"],
    }


def class_digest(det_class: Mapping[str, Any]) -> str:
    return hashing.json_digest(det_class)
