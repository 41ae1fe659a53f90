"""The caches every process of a test session shares, set up in the environment by the controller before
the xdist workers start (they inherit it): each folder is removed when the controller exits."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def _session_folder(var: str, prefix: str) -> None:
    """``$var``: a temporary folder made by the controller, removed when it exits (a worker, or a run
    given ``$var``, keeps the folder it inherited)."""
    if var not in os.environ:
        os.environ[var] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[var], True)


def share_caches() -> None:
    # One persistent JAX compilation cache for every stage the tests run: a tiny train stage costs ~7 CPU s
    # instead of ~19 when the same step was compiled before. A cached executable gives the same bits as a fresh
    # compile: tests/test_train.py::test_two_fresh_runs_are_bit_identical compares the two.
    _session_folder("JAX_COMPILATION_CACHE_DIR", "marin-tests-jax-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    # One bytecode cache for every Python process of the session (workers, stages, `marin`, `mlflow server`),
    # outside the venv and the projects: with PYTHONDONTWRITEBYTECODE set (as on some machines) and a venv
    # installed without .pyc files (uv's default), each process compiled mlflow (5.4 s -> 1.8 s to import from
    # the cache) and jax (2.1 s -> 0.8 s) from source again. Python checks each .pyc against its source's mtime.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    _session_folder("PYTHONPYCACHEPREFIX", "marin-tests-pycache-")
