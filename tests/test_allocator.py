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


BLOCKS = """
import ctypes, json, resource, threading, time
from marin.allocator import HUGE_BLOCK, restart_with_fast_allocator
restart_with_fast_allocator()
from marin import allocator
libc, n = ctypes.CDLL(None), 4 * HUGE_BLOCK
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def faults_touching_a_fresh_block() -> int:
    p = libc.malloc(n)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    ctypes.memset(p, 1, n)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    libc.free(p)
    return faults
first, second = faults_touching_a_fresh_block(), faults_touching_a_fresh_block()
level = allocator.live_bytes()
p = libc.malloc(n)
threading.Timer(0.2, libc.free, [p]).start()
t0 = time.perf_counter(); allocator.wait_until_freed(level, timeout_s=30); waited = time.perf_counter() - t0
kept = libc.malloc(n)
t0 = time.perf_counter(); allocator.wait_until_freed(level, timeout_s=0.3); timed_out = time.perf_counter() - t0
print(json.dumps({"first": first, "second": second, "waited": waited, "timed_out": timed_out,
                  "held": allocator.live_bytes() - level}))
"""


def blocks(**env: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    out = subprocess.run([sys.executable, "-c", BLOCKS], env={**clean, **env}, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_freed_huge_block_is_kept_for_the_next_one_and_waited_for() -> None:
    """Under marin's jemalloc settings a freed block of 4 x HUGE_BLOCK bytes serves the next request
    without a page fault (jemalloc's own huge-block arena would have returned it to the kernel), and
    ``wait_until_freed`` returns once another thread frees the block handed out after its level, or
    at its timeout when none is freed."""
    tuned = blocks()
    assert tuned["first"] > 100 and tuned["second"] < tuned["first"] / 20, tuned
    assert 0.2 <= tuned["waited"] < 5, tuned
    assert 0.3 <= tuned["timed_out"] < 5 and tuned["held"] > 3 * allocator.HUGE_BLOCK, tuned  # never freed
    own = blocks(LD_PRELOAD=allocator.fast_env({})[1]["LD_PRELOAD"],
                 MALLOC_CONF=f"oversize_threshold:{allocator.HUGE_BLOCK}")
    assert own["second"] > own["first"] / 2, own  # a user's own settings are left as they are: purged at once


STEPS = """
import ctypes, json
from marin.allocator import restart_with_fast_allocator
restart_with_fast_allocator()
import jax, numpy as np
from marin import config
from marin.train import loop, runtime, step
p = config.load("params.yaml")
runtime.configure(p.runtime)
cfg = loop.model_config(p, p.tokenize.vocab_size)
mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
opt = step.make_optimizer(p.train)
graphdef, abstract = step.abstract_state(cfg, opt)
shardings = step.state_shardings(abstract, mesh, "replicated")
state = jax.jit(lambda: step.init_state(cfg, jax.random.key(0), jax.random.key(1), opt)[1], out_shardings=shardings)()
train_step = step.make_train_step(graphdef, opt, shardings, mesh)
x = np.random.default_rng(0).integers(0, cfg.vocab_size, (p.train.batch_size, cfg.max_seq_len + 1), dtype=np.int32)
batch = {"inputs": x[:, :-1], "targets": x[:, 1:]}
temps = train_step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
for _ in range(12):
    state, metrics = train_step(state, batch)
jax.block_until_ready((state, metrics))
mallctl, epoch, value, size = ctypes.CDLL(None).mallctl, ctypes.c_uint64(1), ctypes.c_size_t(0), ctypes.c_size_t(8)
mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))
assert mallctl(b"stats.arenas.1.resident", ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) == 0
print(json.dumps({"temps": temps, "huge_arena_resident": value.value}))
"""


def test_paced_train_steps_reuse_one_block_of_temporaries() -> None:
    """Twelve train steps of params.yaml's model hold one block of XLA temporaries in jemalloc's
    huge-block arena (its own count of resident bytes). Dispatched back to back unpaced, a step
    takes its block while XLA has not yet freed the previous one, and two stay resident (most runs)."""
    out = subprocess.run([sys.executable, "-c", STEPS], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["temps"] > 2 * allocator.HUGE_BLOCK, got  # the block is a huge one
    assert got["huge_arena_resident"] < 1.5 * got["temps"], got
