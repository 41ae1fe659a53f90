"""The code's shape, read from its imports (``marin.stages.closure``): every pipeline/ script is a thin
entry point into its stage's declaration, whose function is ``run_stage`` of its stage's module;
packages' ``__init__.py`` stay small; the command modules (``marin.commands``) are imported by the
CLI alone; report and verify never import each other (what both need, keys, envelopes, verification
summaries and the trust policy, is ``marin.attest``, which imports neither); the ledger is a foundation: it
imports neither the pipeline's stages (nor their DVC files) nor the params, whose facts its callers pass in."""

from __future__ import annotations

from pathlib import Path

import pytest

from marin import stages
from marin.paths import PACKAGE_ROOT
from marin.stages import closure

ROOT = PACKAGE_ROOT.parent
INIT_LINES = 40
ENTRY_LINES = 30
# one command each (marin/commands/): shared code lives below them
CLI_ONLY = tuple(f"marin.commands.{p.stem}" for p in sorted((ROOT / "marin" / "commands").glob("*.py"))
                 if p.stem != "__init__")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    return closure.imported_names(path.read_text(encoding="utf-8"), _module(path), path.name == "__init__.py")


@pytest.mark.parametrize("stage", stages.NAMES)
def test_pipeline_script_is_a_thin_entry_point(stage: str) -> None:
    script = ROOT / "pipeline" / f"{stage}.py"
    text = script.read_text(encoding="utf-8")
    assert len(text.splitlines()) < ENTRY_LINES
    assert f'stage_main("{stage}")' in text, f"{script.name}: expected stage_main(\"{stage}\")"
    declared = stages.declaration(stage)
    assert declared.fn_module.endswith(f".{stage}_stage") and declared.fn.endswith(":run_stage"), declared.fn
    body = closure.module_file(ROOT, declared.fn_module)
    assert body is not None and "\ndef run_stage(root: Path, params: Params" in body.read_text(encoding="utf-8")
    runs_jax = "runtime.configure(" in body.read_text(encoding="utf-8")  # the stages that run a JAX model
    assert declared.uses_jax == runs_jax, f"{stage}: uses_jax={declared.uses_jax}, its code says {runs_jax}"


def test_package_inits_are_small() -> None:
    inits = sorted((ROOT / "marin").rglob("__init__.py"))
    assert len(inits) >= 8
    big = {p.relative_to(ROOT).as_posix(): n for p in inits if (n := len(p.read_text().splitlines())) > INIT_LINES}
    assert not big


def test_command_modules_are_imported_by_the_cli_alone() -> None:
    assert len(CLI_ONLY) >= 5
    importers: dict[str, list[str]] = {m: [] for m in CLI_ONLY}
    for path in sorted((ROOT / "marin").rglob("*.py")):
        for name in _imports(path) & set(CLI_ONLY):
            importers[name].append(path.relative_to(ROOT).as_posix())
    assert importers == {m: ["marin/cli_commands.py"] for m in CLI_ONLY}


# packages that must not import each other, either way: what both need lives below them
APART = (("marin.report", "marin.verify"),)


@pytest.mark.parametrize(("a", "b"), APART)
def test_sibling_packages_do_not_import_each_other(a: str, b: str) -> None:
    crossing = []
    for src, dst in ((a, b), (b, a)):
        for path in sorted((ROOT / src.replace(".", "/")).rglob("*.py")):
            crossing += [f"{path.relative_to(ROOT).as_posix()} imports {n}" for n in sorted(_imports(path))
                         if n == dst or n.startswith(dst + ".")]
    assert not crossing, crossing


# a package and what it must never import: it sits below them
BELOW = (("marin.attest", ("marin.report", "marin.verify")),
         ("marin.ledger", ("marin.stages", "marin.config")))


@pytest.mark.parametrize(("low", "high"), BELOW, ids=[low for low, _ in BELOW])
def test_a_lower_package_does_not_import_the_ones_above(low: str, high: tuple[str, ...]) -> None:
    upward = [f"{path.relative_to(ROOT).as_posix()} imports {n}"
              for path in sorted((ROOT / low.replace(".", "/")).rglob("*.py")) for n in sorted(_imports(path))
              if any(n == h or n.startswith(h + ".") for h in high)]
    assert not upward, upward


def test_the_sibling_rule_sees_an_import() -> None:
    """The rule's reader finds a lazy import inside a function (as report once reached verify)."""
    src = "def f():\n    from marin.verify import vsa\n    return vsa\n"
    assert "marin.verify.vsa" in closure.imported_names(src, "marin.report.x", False) or \
        "marin.verify" in closure.imported_names(src, "marin.report.x", False)


def test_the_foundation_rule_sees_a_lazy_import_of_the_params() -> None:
    """As ledger/clock.py once read params.yaml: ``from marin import config`` inside a function."""
    src = "def skew(root):\n    from marin import config\n    from marin.stages import dvcfiles\n"
    names = closure.imported_names(src, "marin.ledger.clock", False)
    assert {"marin.config", "marin.stages.dvcfiles"} <= names
