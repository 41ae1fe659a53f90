"""The CPU as the kernels see it (marin/cpu.py): levels from feature sets, and cpuid itself."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from marin import cpu

V3 = frozenset({"SSE3", "SSSE3", "SSE41", "SSE42", "POPCNT", "AVX", "AVX2", "FMA3", "F16C", "BMI", "BMI2", "LZCNT",
                "MOVBE"})
V4 = V3 | {"AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"}

x86_only = pytest.mark.skipif(not cpu.is_x86_64(), reason="x86-64 levels are defined for x86-64 CPUs only")


@x86_only
@pytest.mark.parametrize(("have", "level"), [
    (frozenset(), "x86-64-v1"),
    (V3 - {"SSE42"}, "x86-64-v1"),  # a level needs every feature of the levels below it too
    (V3 - {"AVX2"}, "x86-64-v2"),
    (V3, "x86-64-v3"),
    (V4 - {"AVX512VL"}, "x86-64-v3"),
    (V4, "x86-64-v4"),
])
def test_isa_level_is_the_highest_level_whose_features_are_all_present(have: frozenset[str], level: str) -> None:
    assert cpu.isa_level(have) == level


@x86_only
def test_missing_for_names_exactly_the_features_a_level_lacks() -> None:
    sandy_bridge = V3 - {"AVX2", "FMA3", "F16C", "BMI", "BMI2", "LZCNT", "MOVBE"}
    assert cpu.missing_for("x86-64-v3", sandy_bridge) == ["AVX2", "FMA3", "F16C", "BMI", "BMI2", "LZCNT", "MOVBE"]
    assert cpu.missing_for("x86-64-v3", V4) == []
    assert cpu.missing_for("x86-64-v4", V3) == ["AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"]


@x86_only
def test_the_model_comes_from_cpuid_and_agrees_with_the_kernel_on_this_host() -> None:
    """Outside an emulator, the cpuid brand string is the kernel's ``model name`` (independently read)."""
    info = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    names = {line.split(":", 1)[1].strip() for line in info if line.startswith("model name")}
    assert " ".join(next(iter(names)).split()) == cpu.model()
    assert cpu.isa_level() in cpu.LEVEL_ORDER
    flags = {f for line in info if line.startswith("flags") for f in line.split(":", 1)[1].split()}
    assert ("avx2" in flags) == ("avx2" in cpu.reported_features())
    assert ("avx512f" in flags) == ("avx512f" in cpu.reported_features())


def test_the_fingerprint_records_the_cpuid_view() -> None:
    from marin import env

    fp = env.fingerprint()
    assert fp["cpu_model"] == cpu.model() and fp["isa_flags"] == cpu.reported_features()
    assert fp["isa_level"] == cpu.isa_level() and fp["machine"] == platform.machine()


def test_the_portable_profile_owns_its_xla_flags_and_native_adds_none() -> None:
    from marin.config import RuntimeParams
    from marin.train import runtime

    inherited = "--xla_cpu_max_isa=AVX512 --xla_dump_to=/tmp/d --xla_force_host_platform_device_count=8"
    portable = runtime.xla_flags(RuntimeParams(2, 1, "replicated", determinism="portable"), inherited)
    assert portable == ["--xla_dump_to=/tmp/d", *runtime.PORTABLE_XLA_FLAGS]  # a user's ISA flag cannot override it
    native = runtime.xla_flags(RuntimeParams(2, 4, "replicated", determinism="native"), inherited)
    assert native == ["--xla_dump_to=/tmp/d", "--xla_force_host_platform_device_count=4"]


@x86_only
def test_the_class_names_the_profile_not_the_cpu_under_portable() -> None:
    from marin.config import RuntimeParams
    from marin.train import runtime

    fp = {"isa_flags": ["avx2", "avx512f"]}
    portable = runtime.cpu_class(RuntimeParams(2, 1, "replicated", determinism="portable"), fp)
    assert portable["profile"] == "portable" and portable["isa_level"] == "x86-64-v3" and "isa_flags" not in portable
    native = runtime.cpu_class(RuntimeParams(2, 1, "replicated", determinism="native"), fp)
    assert native["profile"] == "native" and native["isa_flags"] == ["avx2", "avx512f"]
