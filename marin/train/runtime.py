"""The JAX runtime of a stage: thread count and device count fixed from params before
jax initializes, the mesh, and the determinism class that records them.

Measured on this machine (jax 0.10.2, see docs/architecture.md): XLA's CPU backend takes
its thread-pool size from the ``NPROC`` environment variable, else from the CPU
affinity; the pool size decides the bits of reductions. ``taskset -c 0`` with
``NPROC=2`` reproduces an unpinned 2-core run exactly. So the stage sets ``NPROC`` from
``runtime.xla_cpu_threads`` and never inherits it from the machine.

It also keeps freed memory in the process (:func:`keep_freed_memory`): XLA's CPU client
allocates each execution's temporaries (445 MB per train step at the default size) with
``posix_memalign`` from its worker threads; glibc serves such a request from a thread arena
by a fresh ``mmap`` and unmaps it on free, so every step faulted ~110k pages back in and
27% of the step's CPU time was the kernel's (docs/architecture.md, issue 16).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys
from typing import Any

from marin.config import RuntimeParams
from marin.errors import StageError

_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def configure(rt: RuntimeParams) -> None:
    """Set the environment XLA reads at backend initialization. Call before jax starts."""
    if "jax" in sys.modules:
        import jax._src.xla_bridge as xb

        if xb._backends:  # already initialized: settings would be silently ignored
            raise StageError("jax was initialized before the runtime was configured; "
                             "configure the runtime first (marin.train.runtime.configure)")
    os.environ["NPROC"] = str(rt.xla_cpu_threads)
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(_DEVICE_FLAG)]
    if rt.devices > 1:
        flags.append(f"{_DEVICE_FLAG}={rt.devices}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    keep_freed_memory()


_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters


def keep_freed_memory() -> bool:
    """One malloc arena, no mmap'd chunks, no trimming (glibc only; False elsewhere).

    With one arena every thread allocates from the main heap, which honours "no mmap", and
    a freed block stays mapped for the next step's allocation of the same size (trimming
    off: a step's temporaries at d_model 256 / 8 layers, 2.26 GB, exceed the largest
    threshold mallopt accepts, 2 GiB - 1). The cost is memory kept: the heap settles after
    1-4 steps at about two steps' temporaries (asynchronous dispatch starts the next step
    before the last one frees), 7.1 GB RSS against 4.9 GB at that size, 853 MB at the
    default one, and the process keeps it until it exits. Allocation does not change what
    is computed: the bits are the same (tests/test_train.py)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(p, v) == 1 for p, v in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1)))


def global_devices(rt: RuntimeParams) -> int:
    """Devices on the mesh: ``runtime.devices`` in each of ``runtime.processes`` processes."""
    return rt.devices * rt.processes


def make_mesh(rt: RuntimeParams) -> Any:
    """A 1-D mesh with axis ``data`` over every process's ``runtime.devices`` devices."""
    import jax

    n = global_devices(rt)
    if jax.device_count() < n:
        raise StageError(
            f"runtime.devices x runtime.processes is {n} but jax sees {jax.device_count()} device(s); "
            "on CPU the count is set through XLA_FLAGS before jax starts (marin does this)"
        )
    return jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


def single_process(rt: RuntimeParams) -> RuntimeParams:
    """The same mesh size in one process (``processes x devices`` simulated devices): enough to
    restore and digest a multi-process run's checkpoints."""
    return dataclasses.replace(rt, devices=global_devices(rt), processes=1)


def determinism_class(rt: RuntimeParams, fp: dict[str, Any]) -> dict[str, Any]:
    """What can change the bits of a JAX computation here."""
    import jax

    devices = jax.devices()[: global_devices(rt)]
    flags = sorted(f for f in os.environ.get("XLA_FLAGS", "").split() if f)
    mesh: dict[str, Any] = {"axes": {"data": len(devices)}, "param_sharding": rt.param_sharding}
    if rt.processes > 1:  # the collectives cross processes (gloo on CPU): see docs/architecture.md
        mesh.update(processes=rt.processes, devices_per_process=rt.devices,
                    cpu_collectives=str(jax.config.jax_cpu_collectives_implementation))
    return {
        "kind": "jax",
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "mesh": mesh,
        "jax": fp["packages"]["jax"],
        "jaxlib": fp["packages"]["jaxlib"],
        "xla_flags": flags,
        "xla_cpu_threads": int(os.environ["NPROC"]),
        "prng_impl": str(jax.config.jax_default_prng_impl),
        "x64": bool(jax.config.jax_enable_x64),
        "machine": fp["machine"],
        "isa_flags": fp["isa_flags"],
    }
