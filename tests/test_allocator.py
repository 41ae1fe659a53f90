"""The allocator restart of a training process (marin.allocator): a real restarted interpreter,
checked from its own /proc (the library mapped, the pid kept, the environment given back), under
qemu-user (no restart: it would leave the emulator), and the pure pieces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from marin import allocator

PROBE = """
import json, os, sys
print(json.dumps({"pid": os.getpid()}), flush=True)
from marin.allocator import restart_with_fast_allocator
restart_with_fast_allocator()
import marin.allocator as a
maps = open("/proc/self/maps").read()
print(json.dumps({"pid": os.getpid(), "active": a.ACTIVE, "jemalloc_mapped": "jemalloc" in maps,
                  "env": {k: os.environ.get(k) for k in ("LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES",
                                                         "_MARIN_ALLOCATOR")},
                  "tunables": os.environ.get("GLIBC_TUNABLES")}))
"""


def probe(*prefix: str, restarts: int = 1, **env: str) -> tuple[dict, dict]:
    """(what the process printed first, what it printed last); the script prints its first line again
    after each restart."""
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", "GLIBC_TUNABLES")}
    out = subprocess.run([*prefix, sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) == 2 + restarts, lines
    return lines[0], lines[-1]


def test_a_restarted_process_has_jemalloc_mapped_the_same_pid_and_its_own_environment() -> None:
    assert allocator.fast_env({})[0] == "jemalloc", "libjemalloc2 is not installed: run scripts/system-packages.sh"
    before, after = probe()
    assert after["pid"] == before["pid"]  # replaced in place, as a supervisor (DVC) sees it
    assert after["active"] == "jemalloc" and after["jemalloc_mapped"]
    assert after["env"] == {"LD_PRELOAD": None, "MALLOC_CONF": None, "GLIBC_TUNABLES": None, "_MARIN_ALLOCATOR": None}


def test_glibc_huge_pages_and_the_system_allocator_on_request() -> None:
    _, glibc = probe(MARIN_ALLOCATOR="glibc-hugetlb", GLIBC_TUNABLES="glibc.malloc.check=0")
    assert glibc["active"] == "glibc-hugetlb" and not glibc["jemalloc_mapped"]
    assert glibc["tunables"] == "glibc.malloc.check=0"  # the caller's own tunables, given back
    _, system = probe(MARIN_ALLOCATOR="system", restarts=0)
    assert system["active"] is None and not system["jemalloc_mapped"]


def test_an_unknown_choice_is_one_line_and_exit_1() -> None:
    r = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, "MARIN_ALLOCATOR": "tcmalloc"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == \
        "marin: error: MARIN_ALLOCATOR=tcmalloc: expected one of auto, jemalloc, glibc-hugetlb, system"


def test_under_qemu_user_the_process_is_not_restarted_out_of_the_emulator() -> None:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.fail("qemu-x86_64 is not installed: run scripts/system-packages.sh (Debian package qemu-user)")
    before, after = probe(qemu, "-cpu", "Haswell", restarts=0)
    assert after["pid"] == before["pid"] and after["active"] is None and not after["jemalloc_mapped"]


@pytest.mark.parametrize("env,want", [
    ({}, {"LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": allocator.JEMALLOC_CONF}),
    ({"LD_PRELOAD": "libfoo.so"}, {"LD_PRELOAD": "libfoo.so libjemalloc.so.2", "MALLOC_CONF": allocator.JEMALLOC_CONF}),
    ({"LD_PRELOAD": "libjemalloc.so.2", "MALLOC_CONF": "narenas:1"}, {"LD_PRELOAD": "libjemalloc.so.2"}),
])
def test_jemalloc_is_added_to_what_the_caller_preloads_and_its_settings_win(env: dict, want: dict) -> None:
    assert allocator.fast_env(env) == ("jemalloc", want)


@pytest.mark.parametrize("current,want", [(None, "glibc.malloc.hugetlb=1"),
                                         ("glibc.malloc.check=0", "glibc.malloc.check=0:glibc.malloc.hugetlb=1"),
                                         ("glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=1")])
def test_glibc_tunables_are_joined(current: str | None, want: str) -> None:
    env = {} if current is None else {"GLIBC_TUNABLES": current}
    assert allocator.fast_env(env, "glibc-hugetlb") == ("glibc-hugetlb", {"GLIBC_TUNABLES": want})
