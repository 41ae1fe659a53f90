"""How a process that trains allocates memory: a stage that runs JAX restarts itself once, first
thing, with jemalloc preloaded (configured to keep large blocks for reuse, on transparent huge
pages), or, where jemalloc is not installed, with glibc's malloc on huge pages.

XLA's CPU client allocates each execution's temporaries (300 MB per train step at the default
size, 2 GB at d_model 256 / 8 layers) with ``posix_memalign`` and frees them at its end. glibc
serves such a block by a fresh ``mmap`` and unmaps it on free, so every step faulted its
temporaries back in page by page: at the large size 2.4-2.7 s per step against 1.7 s once the
memory is reused. Keeping freed memory in glibc's heap (``mallopt``, what marin did before)
removed the faults but fragmented the heap to two to four steps' temporaries (6.6-8.6 GB peak
at the large size against 2.7 GB). jemalloc reuses the freed block for the next step and keeps the
peak at one step's: docs/performance.md has the measurements. glibc's ``hugetlb`` tunable alone
cuts the faults ~100x but still zeroes the block every step.

jemalloc serves blocks of ``HUGE_BLOCK`` bytes and more (XLA's temporaries, a logit array) from its
own arena for huge blocks, which by default purges a freed block at once (the next step faults it
back in: ~0.2 s of kernel time per 2.2 s step at the large size). :func:`tune_jemalloc` makes that
arena keep what is freed, and :func:`wait_until_freed` lets a train step start only once the previous
one's block is back (marin.train.step's pacing): XLA frees it on a worker thread just after the step's
outputs are ready, and a step dispatched in that window takes a second block, which then stays
resident (2.95 GB instead of 1.95 at the large size). The other arena decays as jemalloc's default.

Both are read when a process starts, hence the restart (same pid, arguments and streams). The
process restores the environment it was started with, so that what it runs (git, workers) starts
as it would have. No restart where the interpreter is not what the kernel runs (``qemu-x86_64
python``: a restart would leave the emulator), nor off Linux glibc, nor with
``MARIN_ALLOCATOR=system`` (``jemalloc`` or ``glibc-hugetlb`` choose one; ``auto``, the default,
takes jemalloc where it is installed). The allocator changes no computed bit (tests/test_train.py).
"""

from __future__ import annotations

import ctypes.util
import functools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HUGE_BLOCK = 64 << 20  # bytes: from here on jemalloc serves a block from its arena for huge blocks (oversize_threshold)
JEMALLOC_CONF = f"narenas:1,oversize_threshold:{HUGE_BLOCK},thp:always,metadata_thp:auto"  # one arena for the rest
GLIBC_HUGE_PAGES = "glibc.malloc.hugetlb=1"  # glibc >= 2.35; an older glibc ignores it
MARKER = "_MARIN_ALLOCATOR"  # set for the restarted process: the variables' values before the restart
ACTIVE: str | None = None  # after a restart: "jemalloc" or "glibc-hugetlb"
CHOICES = ("auto", "jemalloc", "glibc-hugetlb", "system")  # MARIN_ALLOCATOR; auto: jemalloc where installed


def _joined(current: str | None, add: str, sep: str) -> str:
    return add if not current else current if add in current.split(sep) else f"{current}{sep}{add}"


def fast_env(env: dict[str, str], choice: str = "auto") -> tuple[str, dict[str, str]]:
    """(allocator name, the variables to set in ``env`` for it): jemalloc where the system has it
    (``auto``) or where asked, else glibc's malloc on huge pages."""
    jemalloc = ctypes.util.find_library("jemalloc") if choice in ("auto", "jemalloc") else None
    if choice == "jemalloc" and not jemalloc:
        raise SystemExit("marin: error: MARIN_ALLOCATOR=jemalloc but no libjemalloc is installed: install it "
                         "(Debian: libjemalloc2) or set MARIN_ALLOCATOR=auto")
    if jemalloc:
        changes = {"LD_PRELOAD": _joined(env.get("LD_PRELOAD"), jemalloc, " ")}
        if "MALLOC_CONF" not in env:  # a user's own jemalloc settings win
            changes["MALLOC_CONF"] = JEMALLOC_CONF
        return "jemalloc", changes
    return "glibc-hugetlb", {"GLIBC_TUNABLES": _joined(env.get("GLIBC_TUNABLES"), GLIBC_HUGE_PAGES, ":")}


def runs_natively() -> bool:
    """Whether the kernel runs this interpreter itself: its command name is the interpreter's (under
    ``qemu-x86_64 python`` it is the emulator's)."""
    try:
        comm = Path("/proc/self/comm").read_text().strip()
    except OSError:
        return False
    return bool(comm) and Path(sys.executable).name[:15] == comm


def restart_with_fast_allocator() -> None:
    """Call first thing in an entry point: replace this process by one started with :func:`fast_env`,
    once; in the restarted process, put back the environment it was started with."""
    global ACTIVE
    if MARKER in os.environ:
        tune_jemalloc()
        saved = json.loads(os.environ.pop(MARKER))
        ACTIVE = saved.pop("")
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        return
    choice = os.environ.get("MARIN_ALLOCATOR", "auto")
    if choice not in CHOICES:
        raise SystemExit(f"marin: error: MARIN_ALLOCATOR={choice}: expected one of {', '.join(CHOICES)}")
    if choice == "system" or not sys.executable or not sys.platform.startswith("linux") \
            or platform.libc_ver()[0] != "glibc" or not runs_natively():
        return
    name, changes = fast_env(dict(os.environ), choice)
    saved = {"": name, **{var: os.environ.get(var) for var in changes}}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, **changes, MARKER: json.dumps(saved)})


@functools.cache
def _mallctl() -> Any:
    """jemalloc's ``mallctl`` where this process runs under it, else None."""
    return getattr(ctypes.CDLL(None), "mallctl", None)


def tune_jemalloc() -> bool:
    """Under marin's jemalloc settings (``JEMALLOC_CONF``), call first thing, before any block of
    ``HUGE_BLOCK`` bytes: the arena jemalloc then creates for such blocks keeps the ones freed, for
    reuse, instead of purging them at once (it does so only where the default decay is positive,
    hence -1 for arenas created from now on; the first arena keeps its 10 s). Whether it did."""
    mallctl = _mallctl()
    if mallctl is None or os.environ.get("MALLOC_CONF") != JEMALLOC_CONF:
        return False
    never = ctypes.c_ssize_t(-1)
    return mallctl(b"arenas.dirty_decay_ms", None, None, ctypes.byref(never), ctypes.c_size_t(8)) == 0


def live_bytes() -> int | None:
    """Bytes jemalloc has handed out and not yet taken back (its ``stats.allocated``), or None
    without jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return None
    epoch, value, size = ctypes.c_uint64(1), ctypes.c_size_t(0), ctypes.c_size_t(8)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))  # refresh the statistics
    if mallctl(b"stats.allocated", ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)):
        return None
    return value.value


def wait_until_freed(level: int | None, timeout_s: float = 0.01) -> None:
    """Wait (at most ``timeout_s``) until the live bytes are back under ``level`` plus half a huge
    block, i.e. until a huge block handed out since ``level`` was read is freed; no wait without
    jemalloc or without a level."""
    if level is None:
        return
    deadline = time.perf_counter() + timeout_s
    while (live := live_bytes()) is not None and live > level + HUGE_BLOCK // 2 and time.perf_counter() < deadline:
        time.sleep(0.0001)
