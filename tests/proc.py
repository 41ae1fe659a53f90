"""One command's own CPU time and peak RSS, measured as the benchmarks and the budget tests need.

On Linux a child's ``ru_maxrss`` includes the high-water mark of the address space it was
forked from (exec records it), so a command forked straight from pytest or a big benchmark
would report that process's size as its own. :func:`measure` therefore forks each command
from a tiny launcher (a bare ``python -I -S``, ~10 MB) that waits for it with ``os.wait4``
and writes its exit code and rusage as JSON. CPU is the command's own plus that of the
children it reaped (a spawned pool's workers); peak RSS is the largest of those processes,
not their sum (``tree_rss_kib``, sampled while it runs, is the sum; ``own_cpu_s``, sampled
too, is the command's CPU without its workers').
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

# argv: usage file, CPU cap in seconds (0: none), address-space cap in bytes (0: none), the command
LAUNCHER = """
import json, os, resource, sys
pid = os.fork()
if pid == 0:
    try:
        if int(sys.argv[2]):
            resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[2]),) * 2)
        if int(sys.argv[3]):
            resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]),) * 2)
        os.execv(sys.argv[4], sys.argv[4:])
    finally:
        os._exit(127)
_, status, ru = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"code": os.waitstatus_to_exitcode(status), "cpu_s": ru.ru_utime + ru.ru_stime,
               "rss_kib": ru.ru_maxrss}, f)
"""


@dataclass(frozen=True)
class Child:
    code: int
    cpu_s: float
    rss_kib: int  # the peak of the largest single process (ru_maxrss)
    wall_s: float
    stdout: str
    stderr: str
    tree_rss_kib: int = 0  # the largest sampled sum over the command and its descendants (0: not sampled)
    own_cpu_s: float = 0.0  # the command's own CPU, without its children's, as last sampled (0: not sampled)


def _sample(launcher: psutil.Process) -> tuple[int, float]:
    """(summed RSS in KiB of the command's process tree, the command's own CPU s) now."""
    total, own = 0, 0.0
    try:
        procs = launcher.children(recursive=True)
    except psutil.Error:
        return 0, 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
            if p.ppid() == launcher.pid:
                t = p.cpu_times()
                own = t.user + t.system
        except psutil.Error:
            continue
    return total >> 10, own


def measure(cwd: Path, *argv: str, env: dict[str, str] | None = None, cpu_limit_s: int = 0,
            timeout: float = 3600, sample_s: float = 0.0, as_limit: int = 0) -> Child:
    """Run ``argv`` in ``cwd`` as a grandchild of the launcher; its own rusage and wall time.
    ``sample_s`` > 0 also samples the summed RSS of its process tree that often. ``as_limit``
    > 0 caps its address space (RLIMIT_AS, bytes): a runaway allocation fails the command
    instead of the machine (not for a command importing JAX, which reserves far more)."""
    with tempfile.TemporaryDirectory(prefix="measure-") as scratch:
        usage = Path(scratch) / "usage.json"
        out, err = Path(scratch) / "out", Path(scratch) / "err"
        t0, tree, own = time.perf_counter(), 0, 0.0
        with open(out, "wb") as o, open(err, "wb") as e:
            p = subprocess.Popen([sys.executable, "-I", "-S", "-c", LAUNCHER, str(usage), str(cpu_limit_s),
                                  str(as_limit), *argv],
                                 cwd=cwd, env=env, stdout=o, stderr=e)
            try:
                while p.poll() is None:
                    if time.perf_counter() - t0 > timeout:
                        raise subprocess.TimeoutExpired(argv, timeout)
                    if sample_s:
                        rss, cpu = _sample(psutil.Process(p.pid))
                        tree, own = max(tree, rss), max(own, cpu)
                    time.sleep(sample_s or 0.02)
            finally:
                if p.poll() is None:  # timed out or interrupted: the command and its workers, then the launcher
                    for c in psutil.Process(p.pid).children(recursive=True):
                        c.kill()
                    p.kill()
                    p.wait()
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise RuntimeError(f"the launcher failed ({p.returncode}): {err.read_text(errors='replace')}")
        u = json.loads(usage.read_text())
        return Child(u["code"], u["cpu_s"], u["rss_kib"], wall, out.read_text(errors="replace"),
                     err.read_text(errors="replace"), tree, own)
