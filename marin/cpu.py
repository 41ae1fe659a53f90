"""The CPU as the kernels see it: features and model from ``cpuid``, never ``/proc/cpuinfo``.

Libraries that pick kernels at run time (numpy's dispatch, XLA's ISA selection, oneDNN,
XNNPACK) ask the ``cpuid`` instruction. ``/proc/cpuinfo`` is the kernel's view of the
host: under an emulator (``qemu-x86_64 -cpu Haswell``) or a hypervisor that masks features it
can name features the code cannot use. So the features come from numpy's own ``cpuid``
probe (``__cpu_features__``, the list its run-time dispatch uses) and the model from the
``cpuid`` brand string, read by executing ``cpuid`` itself (x86-64 only; elsewhere the
platform's own name).

x86-64 micro-architecture levels (the psABI's): v2 adds SSE3/SSSE3/SSE4.1/SSE4.2/POPCNT, v3
AVX/AVX2/FMA/F16C/BMI1/BMI2/LZCNT/MOVBE, v4 AVX-512 F/BW/CD/DQ/VL.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import platform
import struct
from functools import cache

# The features a level needs, in numpy's names (each level includes the ones below it).
X86_LEVELS = {
    "x86-64-v2": ("SSE3", "SSSE3", "SSE41", "SSE42", "POPCNT"),
    "x86-64-v3": ("AVX", "AVX2", "FMA3", "F16C", "BMI", "BMI2", "LZCNT", "MOVBE"),
    "x86-64-v4": ("AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"),
}
LEVEL_ORDER = ("x86-64-v1", "x86-64-v2", "x86-64-v3", "x86-64-v4")
# The features that decide kernels and are worth naming when two CPUs differ.
REPORTED = ("SSE41", "SSE42", "AVX", "AVX2", "FMA3", "F16C", "AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ",
            "AVX512VL", "AVX512VNNI", "AVX512BF16", "AVX512_FP16", "AMX_TILE", "AMX_BF16", "AMX_INT8",
            "ASIMD", "ASIMDHP", "ASIMDDP", "SVE", "SVE2")

# void cpuid(uint32 leaf /*edi*/, uint32 subleaf /*esi*/, uint32 out[4] /*rdx*/), System V ABI:
# push rbx; mov eax,edi; mov ecx,esi; mov r8,rdx; cpuid; mov [r8],eax; mov [r8+4],ebx;
# mov [r8+8],ecx; mov [r8+12],edx; pop rbx; ret
_CPUID_CODE = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")


@cache
def features() -> frozenset[str]:
    """The CPU features numpy's run-time dispatch found (``cpuid`` on x86, hwcaps on Arm)."""
    import importlib

    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        umath = importlib.import_module("numpy.core._multiarray_umath")
    found: dict[str, bool] = umath.__cpu_features__
    return frozenset(k for k, v in found.items() if v)


def reported_features() -> list[str]:
    """The kernel-deciding features present, sorted (lower case, as records show them)."""
    have = features()
    return sorted(f.lower() for f in REPORTED if f in have)


def is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def isa_level(have: frozenset[str] | None = None) -> str:
    """The highest x86-64 level whose features are all present (``x86-64-v1`` at least);
    on other machines the architecture name (``aarch64``)."""
    if not is_x86_64():
        return platform.machine().lower()
    have = features() if have is None else have
    level = "x86-64-v1"
    for name in LEVEL_ORDER[1:]:
        if not all(f in have for f in X86_LEVELS[name]):
            break
        level = name
    return level


def missing_for(level: str, have: frozenset[str] | None = None) -> list[str]:
    """The features this CPU lacks to run at ``level`` (empty: it qualifies)."""
    have = features() if have is None else have
    if level in LEVEL_ORDER and not is_x86_64():
        return [f"the x86-64 architecture itself (this CPU is {platform.machine().lower()})"]
    if level not in LEVEL_ORDER:
        return [] if level == isa_level(have) else [level]
    need = [f for name in LEVEL_ORDER[1: LEVEL_ORDER.index(level) + 1] for f in X86_LEVELS[name]]
    return [f for f in need if f not in have]


def _cpuid(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
    buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    try:
        buf.write(_CPUID_CODE)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(addr)
        out = (ctypes.c_uint32 * 4)()
        fn(leaf, subleaf, out)
        del fn, addr  # the buffer's export must be released before it is closed
        return out[0], out[1], out[2], out[3]
    finally:
        with contextlib.suppress(BufferError):  # a live export: the mapping goes with the process
            buf.close()


@cache
def model() -> str:
    """The CPU's brand string from ``cpuid`` (leaves 0x80000002-4), e.g. ``Intel Core Processor
    (Haswell)`` under qemu; the platform's processor name where ``cpuid`` cannot be run."""
    if is_x86_64():
        try:
            if _cpuid(0x80000000)[0] >= 0x80000004:
                raw = b"".join(struct.pack("<4I", *_cpuid(leaf)) for leaf in (0x80000002, 0x80000003, 0x80000004))
                name = raw.split(b"\0", 1)[0].decode("ascii", "replace").strip()
                if name:
                    return " ".join(name.split())
        except (OSError, ValueError, AttributeError):  # no executable mapping allowed here
            pass
    return platform.processor() or platform.machine() or "unknown"
