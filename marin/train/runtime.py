"""The JAX runtime of a stage: thread count and device count fixed from params before
jax initializes, the mesh, and the determinism class that records them.

Measured on this machine (jax 0.10.2, see docs/performance.md): XLA's CPU backend takes
its thread-pool size from the ``NPROC`` environment variable, else from the CPU
affinity; the pool size decides the bits of reductions. ``taskset -c 0`` with
``NPROC=2`` reproduces an unpinned 2-core run exactly. So the stage sets ``NPROC`` from
``runtime.xla_cpu_threads`` and never inherits it from the machine.

How a training process allocates memory is :mod:`marin.allocator`'s (a restart at the stage's start).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any, cast

from marin.config import RuntimeParams
from marin.errors import StageError

if TYPE_CHECKING:
    from marin.env_types import DeterminismClass, Env

_DEVICE_FLAG = "--xla_force_host_platform_device_count"

# The portable determinism profile (docs/architecture.md, "Portable bits"): XLA's generated code
# capped at AVX2, and the kernel libraries that choose their code from cpuid at run time kept
# out of every computation, so that any CPU at the x86-64-v3 level computes the same bits.
PORTABLE_LEVEL = "x86-64-v3"
PORTABLE_XLA_FLAGS = (
    "--xla_cpu_max_isa=AVX2",  # XLA's own code generation: no AVX-512 even where the CPU has it
    "--xla_cpu_use_xnnpack=false",  # XNNPACK picks its micro-kernels from cpuid (off by default in jax 0.10)
    # YNNPACK's dots (forward, input gradients) differ between AVX-512 and AVX2 without it
    "--xla_cpu_enable_platform_dependent_math=false",
)
# A dot that contracts a non-last dimension of its left operand (every weight gradient) runs as an
# Eigen contraction whose multiply oneDNN's JIT sgemm does, with code chosen from cpuid at its first
# call and deaf to XLA's ISA cap: oneDNN reads this cap from the environment (before that call).
ONEDNN_ISA_VAR = "ONEDNN_MAX_CPU_ISA"
PORTABLE_ONEDNN_ISA = "AVX2"


def xla_flags(rt: RuntimeParams, inherited: str) -> list[str]:
    """XLA_FLAGS for ``rt``: the inherited flags less those the runtime owns, then its own."""
    owned = (_DEVICE_FLAG, *(f.split("=", 1)[0] for f in PORTABLE_XLA_FLAGS))
    flags = [f for f in inherited.split() if not f.startswith(owned)]
    if rt.determinism in ("portable", "universal"):  # universal: its float32 parts (init) pinned on x86 too
        flags.extend(PORTABLE_XLA_FLAGS)
    if rt.devices > 1:
        flags.append(f"{_DEVICE_FLAG}={rt.devices}")
    return flags


def check_cpu(rt: RuntimeParams) -> None:
    """A portable run needs a CPU at the profile's level: below it the bits would not be the profile's.
    A universal run needs one process (its rounding log is kept by the process that rounds)."""
    from marin import cpu

    if rt.determinism == "universal" and rt.processes > 1:
        raise StageError(f"runtime.determinism: universal runs in one process (runtime.processes is {rt.processes}); "
                         "set runtime.processes: 1, or runtime.determinism: portable")
    if rt.determinism != "portable":
        return
    if not cpu.is_x86_64():  # measured on emulated aarch64: YNNPACK's reductions sum in another order
        raise StageError(f"runtime.determinism: portable is defined for x86-64 CPUs at {PORTABLE_LEVEL}; this one is "
                         f"{cpu.isa_level()} ({cpu.model()}), whose bits differ: set runtime.determinism: native")
    missing = cpu.missing_for(PORTABLE_LEVEL)
    if missing:
        raise StageError(f"runtime.determinism: portable computes at {PORTABLE_LEVEL} (AVX2, FMA), and this CPU "
                         f"({cpu.model()}) lacks {', '.join(missing)}; run on a CPU that has them, or set "
                         "runtime.determinism: native (bits then tied to this CPU)")


def configure(rt: RuntimeParams) -> None:
    """Set the environment XLA reads at backend initialization. Call before jax starts."""
    if "jax" in sys.modules:
        import jax._src.xla_bridge as xb

        if xb._backends:  # already initialized: settings would be silently ignored
            raise StageError("jax was initialized before the runtime was configured; "
                             "configure the runtime first (marin.train.runtime.configure)")
    check_cpu(rt)
    os.environ["NPROC"] = str(rt.xla_cpu_threads)
    if rt.determinism in ("portable", "universal"):
        os.environ[ONEDNN_ISA_VAR] = PORTABLE_ONEDNN_ISA
    if rt.determinism == "universal":  # float64 steps (marin.train.universal); the other profiles as before
        os.environ["JAX_ENABLE_X64"] = "1"
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_enable_x64", True)
    os.environ["XLA_FLAGS"] = " ".join(xla_flags(rt, os.environ.get("XLA_FLAGS", "")))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


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


def determinism_class(rt: RuntimeParams, fp: Env) -> DeterminismClass:
    """What can change the bits of a JAX computation here. Under the portable profile the CPU enters
    only as the profile's level (any CPU at it is in the class); under native, as its features; under
    universal not at all (its steps are rounded with a log), and the class names the threshold tau."""
    import jax

    devices = jax.devices()[: global_devices(rt)]
    flags = sorted(f for f in os.environ.get("XLA_FLAGS", "").split() if f)
    mesh: dict[str, Any] = {"axes": {"data": len(devices)}, "param_sharding": rt.param_sharding}
    if rt.processes > 1:  # the collectives cross processes (gloo on CPU): see docs/architecture.md
        mesh.update(processes=rt.processes, devices_per_process=rt.devices,
                    cpu_collectives=str(jax.config.values["jax_cpu_collectives_implementation"]))
    det = cast("dict[str, Any]", {  # with the CPU's part, a jax class (a TypedDict takes no ``**`` of a dict)
        "kind": "jax",
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "mesh": mesh,
        "jax": fp["packages"]["jax"],
        "jaxlib": fp["packages"]["jaxlib"],
        "xla_flags": flags,
        "xla_cpu_threads": int(os.environ["NPROC"]),
        "prng_impl": str(jax.config.values["jax_default_prng_impl"]),
        "x64": bool(jax.config.values["jax_enable_x64"]),
        "machine": fp["machine"],
        **cpu_class(rt, fp),
    })
    if rt.determinism == "universal":  # the bits do not depend on the machine: x86-64 and aarch64 are one class
        del det["machine"]
    return cast("DeterminismClass", det)


def cpu_class(rt: RuntimeParams, fp: Env) -> dict[str, Any]:
    """The CPU's part of the class: the profile and its level (portable), or the features the
    kernels dispatch on (native); and oneDNN's ISA cap, which decides the weight gradients' bits."""
    onednn = {"onednn_max_cpu_isa": os.environ.get(ONEDNN_ISA_VAR)}
    if rt.determinism == "universal":
        from marin.train import rounding_log

        return {"profile": "universal", "tau": rounding_log.tau(), **onednn,
                "rounding": "float64 steps from float32 state, rounded to nearest even but where the rounding "
                            "log says (values within tau float32 ulps of a midpoint)"}
    if rt.determinism == "portable":
        return {"profile": "portable", "isa_level": PORTABLE_LEVEL, **onednn}
    return {"profile": "native", "isa_flags": fp["isa_flags"], **onednn}
