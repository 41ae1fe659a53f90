"""Shared fixtures: throwaway marin projects in temporary git repositories.

A project is a copy of this checkout's pipeline files; stages run in it as real
subprocesses (``python -m pipeline.<stage>`` or ``dvc repro``), exactly as a user runs them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.caches import share_caches

REPO = Path(__file__).resolve().parents[1]
# sha256 of the vendored copies of public standards, taken from the upstream files when they were
# copied (tests/data/README.md, marin/report/reference/README.md): tests read a copy only through
# ``reference``, which checks it, so an edited copy fails the tests that rely on it.
PINNED = {
    "marin/report/reference/fmti-indicators-dec2025.csv":
        "ab3bbdebf09f5d015909145272553bcd41b86a0129c73c4aef4722f325577c08",
    "marin/report/reference/fmti-indicators-2024.csv":
        "fc2b47c8c73d0aab3c1557728a30af63cf6c648c3cf51369febe5fc248051bfc",
    "marin/report/reference/mof-licenses.json": "d898bee5da1b5d1eef00ca3de00470af272b9abe315e4e74c742ea5a26ccea08",
    "tests/data/mof_schema.json": "da7292f27a91280364d6e4f1965663f6cbb8da6d652a0e499e9f764db796840a",
    "tests/data/prov-json.schema.json": "9cf7be7497718f41e40bd65f018cf6c9b815f9d7ca90a2c602d4b99322fd62d5",
}


def reference(name: str) -> Path:
    """The repository's copy of the public file ``name`` (a file name, or a path under the
    repository), after checking it against its pinned sha256."""
    rel = name if "/" in name else next(k for k in PINNED if k.endswith("/" + name))
    path = REPO / rel
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == PINNED[rel], f"{rel}: sha256 {digest} is not the pinned upstream copy's {PINNED[rel]}"
    return path
PROJECT_FILES = ("marin", "pipeline", "schemas", "closures", "tokenizer", "dvc.yaml", "params.yaml", "pyproject.toml",
                 "uv.lock", ".dvc/config", ".dvc/.gitignore", ".dvc/plots", ".dvcignore", ".gitignore",
                 "published-digests.json")  # a clone holds the published digests (marin reference check)
BIN = Path(sys.executable).parent
share_caches()  # the session's JAX compilation and bytecode caches (tests/caches.py)


def env_for_subprocess() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MARIN_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = "marin-test"
    env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = "test@marin.local"
    env["GIT_CONFIG_GLOBAL"] = "/dev/null"  # no user's ~/.gitconfig (merge.ff, hooks, signing) in a test's git
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["DVC_NO_ANALYTICS"] = "1"
    env.setdefault("MARIN_MLFLOW", "off")  # tests of the MLflow view turn it on
    env.setdefault("MARIN_PROGRESS", "off")  # stderr holds only the errors; tests of the progress bars turn it on
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@dataclass
class Project:
    root: Path
    env: dict[str, str] = field(default_factory=dict)  # extra environment for its commands

    def run(self, *cmd: str, check: bool = False, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(cmd, cwd=self.root, env={**env_for_subprocess(), **self.env}, capture_output=True,
                           text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{cmd} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def stage(self, name: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "python"), "-m", f"pipeline.{name}", check=check)

    def marin(self, *args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "python"), "-m", "marin.cli", *args, check=check)

    def dvc(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "dvc"), *args, check=check, timeout=timeout)

    def git(self, *args: str) -> str:
        return self.run("git", *args, check=True).stdout

    @property
    def params(self) -> dict:
        """params.yaml as written (a copy of the shipped one holds only what it sets over marin/defaults.yaml:
        :func:`put` adds a key; writing the merged params back would change every section DVC compares)."""
        return yaml.safe_load((self.root / "params.yaml").read_text())

    def write_params(self, data: dict) -> None:
        (self.root / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))

    def ledger_files(self) -> dict[str, bytes]:
        d = self.root / "ledger" / "runs"
        return {p.name: p.read_bytes() for p in sorted(d.glob("*.jsonl"))} if d.is_dir() else {}

    def runs(self, stage: str | None = None) -> list[list[dict]]:
        """Parsed run files (each a list of records), oldest first, optionally by stage."""
        out = []
        for data in self.ledger_files().values():
            complete = data[:data.rfind(b"\n") + 1]  # a line still being appended is not read
            recs = [json.loads(x) for x in complete.splitlines() if x.strip()]
            if recs and (stage is None or recs[0]["body"]["stage"] == stage):  # skip a file being created
                out.append(recs)
        return sorted(out, key=lambda r: r[0]["time"])

    def tree(self, rel: str) -> dict[str, bytes]:
        base = self.root / rel
        return {p.relative_to(base).as_posix(): p.read_bytes()
                for p in sorted(base.rglob("*")) if p.is_file()} if base.exists() else {}


def _merged(a: dict, b: dict) -> dict:
    return {**a, **{k: _merged(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
                    for k, v in b.items()}}


def evaluation(root: Path, metrics: str = "metrics/eval.json", context: str = "evals/eval_context.json") -> dict:
    """A DVC metrics file (the measurements) merged with its context file (baselines, counts, settings),
    the two files an evaluate stage writes."""
    return _merged(json.loads((root / metrics).read_text()), json.loads((root / context).read_text()))


def new_project(dest: Path, params: dict | None = None) -> Project:
    dest.mkdir(parents=True, exist_ok=True)
    for rel in PROJECT_FILES:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, symlinks=True,  # closures/: links DVC follows to the code
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / "ledger" / "runs").mkdir(parents=True)
    proj = Project(dest)
    if params is not None:
        proj.write_params(params)
    proj.git("init", "-q")
    proj.git("add", "-A")
    proj.git("commit", "-qm", "test project")
    return proj


# -- a small local corpus, built here so tests need no network ---------------------------

WORDS = [
    "the", "and", "of", "to", "in", "that", "is", "was", "he", "for", "it", "with", "as", "his",
    "on", "be", "at", "by", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
    "one", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been",
    "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over",
    "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
    "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because",
    "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make",
    "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life",
    "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us",
    "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used",
    "take", "three", "king", "lord", "love", "death", "night", "heart", "heaven", "earth", "light",
    "sword", "crown", "grace", "honour", "blood", "fair", "sweet", "gentle", "noble",
]


def make_text(rng: random.Random, lines: int) -> str:
    out = []
    for _ in range(lines):
        n = rng.randint(6, 12)
        out.append(" ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + ".")
    return "\n".join(out) + "\n"


def make_corpus(dest: Path) -> dict[str, int]:
    """Texts with known duplicates; returns the expected removal counts by step."""
    rng = random.Random(7)
    texts = dest / "texts"
    texts.mkdir(parents=True)
    docs = {f"doc{i:02d}.txt": make_text(rng, 40) for i in range(12)}
    docs["copy_of_doc03.txt"] = docs["doc03.txt"]  # exact duplicate
    lines = docs["doc05.txt"].split("\n")
    lines[3] = lines[3].replace(".", ", indeed.")  # near duplicate: one line changed
    docs["near_doc05.txt"] = "\n".join(lines)
    docs["short.txt"] = "Too short to keep.\n"
    for name, text in docs.items():
        (texts / name).write_text(text)
    with open(dest / "verses.jsonl", "w") as f:
        for book in ("Alpha", "Beta"):
            for chapter in (1, 2, 3):
                for verse in range(1, 9):
                    text = make_text(rng, 1).strip()
                    f.write(json.dumps({"book": book, "chapter": chapter, "verse": verse, "text": text}) + "\n")
    return {"exact_dedup": 1, "near_dedup": 1, "min_words": 1}


def put(params: dict, key: str, value: object) -> None:
    """Set the dotted ``key`` in a params document, adding the sections on the way (DVC's ``-S ++key=value``)."""
    *parents, leaf = key.split(".")
    for p in parents:
        params = params.setdefault(p, {})
    params[leaf] = value


def mini_params(corpus: Path) -> dict:
    """The shipped params.yaml over the defaults (every key written out), pointed at a local corpus and shrunk
    for speed."""
    from marin import hashing
    from marin.params_file import with_defaults

    params = with_defaults(yaml.safe_load((REPO / "params.yaml").read_text()))
    params["fetch"]["sources"] = [{
        "name": "mini", "kind": "local", "locator": str(corpus),
        "sha256": hashing.dir_digest(corpus).split(":")[1], "license": "CC0-1.0",
        "extract": [
            {"corpus": "prose", "include": ["texts/*.txt"], "format": "text"},
            {"corpus": "verses", "include": ["verses.jsonl"], "format": "jsonl",
             "text_field": "text", "group_by": ["book", "chapter"]},
        ],
    }]
    params["tokenize"]["vocab_size"] = 400
    params["tokenize"]["shard_max_tokens"] = 5000
    return params


def shared(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """``build(dir)`` once per test session, whatever the number of xdist workers: the first worker to
    ask builds it under a lock in the session's base folder, the others wait for it and get the same
    folder. What is built is read only; tests take copies (``copy_project``). A build that failed is
    not marked done, so the next worker to ask raises the same failure instead of using half a build."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's base is a child of the session's
    out = base / f"shared-{name}"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not (out / ".built").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            build(out)
            (out / ".built").touch()
    return out


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared(tmp_path_factory, "corpus", lambda d: make_corpus(d / "mini")) / "mini"


@pytest.fixture
def project(tmp_path: Path, corpus: Path) -> Project:
    """A fresh project on the mini corpus; no stage has run."""
    return new_project(tmp_path / "proj", mini_params(corpus))


def built_project(dest: Path, corpus: Path, stages: tuple[str, ...], shrink: bool = False) -> Project:
    """A project on the mini corpus whose ``stages`` ran (with a tiny model if ``shrink``)."""
    proj = new_project(dest, mini_params(corpus))
    if shrink:
        tiny(proj)
    for stage in stages:
        proj.stage(stage)
    return proj


def copy_project(src: Project, dest: Path) -> Project:
    """A throwaway copy of a built project (git history, ledger, data, checkpoints)."""
    shutil.copytree(src.root, dest, symlinks=True)
    return Project(dest)


@pytest.fixture(scope="session")
def _data_project(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Project:
    return Project(shared(tmp_path_factory, "data", lambda d: built_project(
        d / "proj", corpus, ("fetch", "curate", "tokenize"))) / "proj")


@pytest.fixture
def data_project(tmp_path: Path, _data_project: Project) -> Project:
    """A copy of a project whose data stages have run (fetch, curate, tokenize)."""
    return copy_project(_data_project, tmp_path / "proj")


TINY = {
    "model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "n_kv_heads": 1, "d_ff": 64, "seq_len": 32,
              "tie_embeddings": True, "rope_theta": 10000.0, "dtype": "float32"},
    "train": {"steps": 12, "batch_size": 8, "lr": 3.0e-3, "schedule": "cosine", "warmup_steps": 2,
              "min_lr_ratio": 0.1, "wsd_decay_fraction": 0.2, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
              "eps": 1.0e-8, "grad_clip": 1.0, "log_every": 2, "checkpoint_every": 4},
}


def tiny(proj: Project, **runtime: object) -> None:
    """Shrink the model and training to seconds (3 checkpoint intervals of 4 steps)."""
    params = proj.params
    params.update(json.loads(json.dumps(TINY)))
    params["runtime"].update(runtime)
    proj.write_params(params)


@pytest.fixture(scope="session")
def _trained_project(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Project:
    return Project(shared(tmp_path_factory, "trained", lambda d: built_project(
        d / "proj", corpus, ("fetch", "curate", "evalsets", "tokenize", "train", "instructions", "decontaminate",
                             "trace_index", "evaluate"), shrink=True)) / "proj")


@pytest.fixture
def trained_project(tmp_path: Path, _trained_project: Project) -> Project:
    """A copy of a project on the mini corpus whose pipeline ran through evaluate (and all its upstream
    stages, so that DVC can commit it) with a tiny model."""
    return copy_project(_trained_project, tmp_path / "proj")


@pytest.fixture
def reported(trained_project: Project) -> tuple[Project, Path]:
    """A copy of the trained project with a signing key and its report (reports/marin-tiny)."""
    trained_project.marin("keygen", check=True)
    trained_project.marin("report", check=True)
    return trained_project, trained_project.root / "reports" / "marin-tiny"


def shipped_repro(dest: Path) -> None:
    """The shipped pipeline on the built-in corpus exactly as the README runs it (a signing key made
    first, then ``dvc repro`` of the shipped params.yaml), so that its outputs can be compared with the
    published digests (tests/test_reference.py). Its first ``dvc repro``'s stdout and stderr are kept
    beside it, in ``repro.stdout`` and ``repro.stderr``."""
    proj = new_project(dest / "proj")
    proj.env["MARIN_MLFLOW"] = "on"  # each stage mirrors itself into the embedded store
    proj.marin("keygen", "--if-missing", check=True)  # the report stage signs with it (README command)
    p = proj.dvc("repro", timeout=5400)  # about 5 min on two quiet cores; 19 min at load 7 (measured)
    (dest / "repro.stdout").write_text(p.stdout)
    (dest / "repro.stderr").write_text(p.stderr)


@pytest.fixture(scope="session")
def _shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, str]:
    """The shipped pipeline's ``dvc repro``, once per session (read only: tests copy it)."""
    base = shared(tmp_path_factory, "shipped", shipped_repro)
    return Project(base / "proj", {"MARIN_MLFLOW": "on"}), (base / "repro.stdout").read_text()


@pytest.fixture(scope="session")
def s3():
    """A real S3 API (moto's server) on 127.0.0.1 for this test session (tests/servers.py)."""
    from tests.servers import S3

    server = S3().start()
    yield server
    server.stop()


# Fixtures of their own module, shared by several test files
pytest_plugins = ("tests.instruct_fixtures", "tests.universal_fixtures")

# The slowest files first (measured with --durations, 2026-12-06; test_aarch64.py's universal replays, ~10 min
# under qemu-aarch64 on 2 loaded cores, 2026-12-07), so that with `-n 2 --dist loadfile` the
# long ones run beside the many short ones instead of last on one worker. The order within a file (and
# among the other files) is pytest-randomly's: no test relies on another. Requires --no-loadscope-reorder (addopts).
SLOWEST_FIRST = ("test_portable.py", "test_aarch64.py", "test_pipeline_dvc.py", "test_verify.py", "test_tracking.py",
                 "test_train.py",
                 # after ~600 s of the files above: the shipped repro (built by test_pipeline_dvc's worker) is done
                 "test_separation.py", "test_instruct.py", "test_distributed.py", "test_hosts_train.py",
                 "test_hosts_ray.py", "test_experiments.py",
                 "test_team.py", "test_registry.py", "test_harness_stage.py", "test_report_trust.py",
                 "test_harness_registry.py",
                 "test_sweep_runs.py", "test_params_fuzz.py", "test_trace.py", "test_curate_scale.py",
                 "test_tracking_release.py", "test_publish.py", "test_report.py", "test_cli.py")


# A test that builds a project (a git repository, a copy of the pipeline, stages run as processes) is an
# end-to-end test: marked slow whatever its file says, so `pytest -m "not slow"` is the unit tier.
PROJECT_FIXTURES = frozenset({"project", "data_project", "_data_project", "trained_project", "_trained_project",
                              "_shipped", "sft_project", "_sft_project", "s3", "_universal_project",
                              "_universal_evaluated", "_universal_sft"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if PROJECT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
