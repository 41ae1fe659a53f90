"""The code of a stage: the project files that ``python -m pipeline.<stage>`` and the function it runs
(its declaration's ``fn``) can import or read.

Found by reading imports (``ast``), never by running them: every ``import`` and ``from ...
import`` anywhere in a module, functions included (a lazy import is still code the stage may
run), resolved to files of the project's own packages; each imported module brings the
``__init__.py`` of every package above it (Python runs them first), and each package brings
its data files (non-Python files in it and in its non-package folders: the schema pins, the
report's reference data), and each module brings the sibling files it names by path,
``Path(__file__).with_name("<file>")`` (MLflow's "models from code" runs
``marin/tracking/generator_model.py`` so, and copies it into the model it saves). Such a file is read
where it is named, its own imports are not followed: what it imports runs when a user loads the
model, not in the stage. Every stage also reads the JSON Schemas its records are checked
against and runs on the locked environment, so ``schemas/`` and ``uv.lock`` belong to every
closure.

The closure is what ``dvc.yaml`` lists as a stage's code (``marin stages``, :mod:`marin.stages.dvcyaml`,
as folders of links: :mod:`marin.stages.code_links`),
what the recipe digest covers, and what ``marin status`` compares with the code a run recorded.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("marin", "pipeline")  # the project's own top-level packages
COMMON = ("schemas", "uv.lock")  # read or run by every stage
SKIP_DIRS = ("__pycache__",)
SKIP_SUFFIXES = (".pyc",)


def module_file(root: Path, name: str) -> Path | None:
    """The file that defines module ``name`` in the project, or None (not ours, or absent)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _statements(body: list[ast.stmt]) -> Iterable[ast.AST]:
    """Every statement in ``body`` and in the bodies nested in it (functions, classes, branches,
    loops, ``try`` and its handlers, ``with``, ``match`` and its cases): an import is a statement, so
    no expression is visited (a module's expressions are most of its tree: a stage's 66 modules walked
    whole took 0.2 s a run)."""
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                todo.extend(reversed(inner))


# Memoised by source text (pure functions of it): `marin status` follows all 13 closures, which share
# most modules, and parsed each module once per stage (2.8 s a call on the shipped project).
@functools.lru_cache(maxsize=2048)
def imported_names(source: str, module: str, is_package: bool) -> frozenset[str]:
    """Every module name an import statement in ``source`` may load (``module`` is the name of
    the module the source belongs to, for relative imports). ``from a import b`` yields ``a``
    and ``a.b``: ``b`` may be a submodule or a name defined in ``a``."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in _statements(_parse(source).body):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{a.name}" for a in node.names if a.name != "*")
    return frozenset(names)


@functools.lru_cache(maxsize=2048)
def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def _is_path_of_this_file(node: ast.AST) -> bool:
    """``Path(__file__)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__")


@functools.lru_cache(maxsize=2048)
def named_siblings(source: str) -> frozenset[str]:
    """File names a module's ``source`` reads next to itself: the string argument of every
    ``Path(__file__).with_name("...")`` (only a source that spells both is walked)."""
    if "__file__" not in source or "with_name" not in source:
        return frozenset()
    return frozenset({node.args[0].value for node in ast.walk(_parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "with_name"
            and _is_path_of_this_file(node.func.value) and len(node.args) == 1
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)})


def _with_parents(name: str) -> Iterable[str]:
    parts = name.split(".")
    return (".".join(parts[: i + 1]) for i in range(len(parts)))


def module_closure(root: Path, *entries: str) -> list[Path]:
    """The project's Python files that importing the modules ``entries`` may load, sorted."""
    seen: dict[str, Path] = {}
    todo = list(entries)
    while todo:
        name = todo.pop()
        for n in _with_parents(name):
            if n in seen:
                continue
            path = module_file(root, n)
            if path is None:
                continue
            seen[n] = path
            todo.extend(imported_names(path.read_text(encoding="utf-8"), n, path.name == "__init__.py"))
    return sorted(set(seen.values()))


def _walk(folder: Path) -> Iterable[Path]:
    for p in sorted(folder.iterdir()):
        if p.is_dir():
            if p.name not in SKIP_DIRS:
                yield from _walk(p)
        elif p.is_file() and not p.name.endswith(SKIP_SUFFIXES):
            yield p


def package_data(package_dir: Path) -> list[Path]:
    """Non-Python files of a package: in it and in its folders that hold no Python module."""
    out = [p for p in sorted(package_dir.iterdir()) if p.is_file() and p.suffix not in (".py", ".pyc")]
    for sub in sorted(package_dir.iterdir()):
        if sub.is_dir() and sub.name not in SKIP_DIRS and not any(sub.glob("*.py")):  # namespace packages too
            out.extend(_walk(sub))
    return out


def files(root: Path, *entries: str) -> list[str]:
    """Project-relative paths of every file in the code closure of ``python -m ENTRY`` (of each
    entry): its modules, the sibling files they name, their packages' data files, and ``COMMON``."""
    root = Path(root)
    modules = module_closure(root, *entries)
    files = set(modules)
    for m in modules:
        files.update(f for f in (m.with_name(n) for n in named_siblings(m.read_text(encoding="utf-8"))) if f.is_file())
    for init in (m for m in modules if m.name == "__init__.py"):
        files.update(package_data(init.parent))
    for common in COMMON:
        p = root / common
        files.update(_walk(p) if p.is_dir() else [p] if p.is_file() else [])
    return sorted(p.relative_to(root).as_posix() for p in files)


def expand(root: Path, deps: Iterable[str]) -> list[str]:
    """The project files behind dependency paths (folders walked as DVC walks them, links followed to
    the file they point to: :mod:`marin.stages.code_links`), sorted."""
    root = Path(root)
    out: set[str] = set()
    for d in deps:
        p = root / d
        for x in _walk(p) if p.is_dir() else [p]:
            out.add(Path(os.path.normpath(x.parent / os.readlink(x))).relative_to(root).as_posix()
                    if x.is_symlink() else x.relative_to(root).as_posix())
    return sorted(out)
