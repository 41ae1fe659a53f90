"""No module reads a whole file or a whole line unbounded: every file is read through
:mod:`marin.readers` (a cap per kind), or in chunks of a stated size. The walk is over the
source's syntax, as tests/test_closure.py walks imports: a ``.read()``, ``.readline()`` or
``.readlines()`` without a size, ``Path.read_bytes()`` / ``read_text()``, ``json.load(f)``,
``pickle.load`` / ``tomllib.load``, ``yaml.safe_load`` or ``csv.reader`` / ``csv.DictReader`` of an
open file, and ``for line in f`` over a file opened in a ``with``. Exceptions are listed below, each with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

READER = "marin/readers.py"
LOADERS = {("json", "load"), ("pickle", "load"), ("tomllib", "load"), ("marshal", "load")}
YAML = {"safe_load", "load", "full_load", "unsafe_load", "safe_load_all", "load_all"}
CSV = {"reader", "DictReader"}  # each row is a line read unbounded
OPENERS = {"open", "open_regular", "opened", "fdopen", "urlopen"}  # calls whose result is a file

# (module, function, what) -> why it may read unbounded; keep it short: each entry is a promise.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("marin/allocator.py", "runs_natively", ".read_text()"): "/proc/self/comm: the kernel's, 16 bytes at most",
    ("marin/stages/closure.py", "module_closure", ".read_text()"): "the package's own source files",
    ("marin/stages/closure.py", "files", ".read_text()"): "the package's own source files",
    ("marin/schemas.py", "pins", ".read_bytes()"): "marin/schema_pins.json, shipped with the package",
    ("marin/schemas.py", "pin_problems", ".read_bytes()"): "the schemas/ files pinned by the package",
    ("marin/schemas.py", "current_pins", ".read_bytes()"): "the schemas/ files pinned by the package",
    ("marin/schemas.py", "_schema", ".read_bytes()"): "a schemas/ file, checked against its pin",
    ("marin/data/tokenize.py", "pretrained", ".read_bytes()"): "size checked against MAX_PRETRAINED_BYTES "
                                                               "just before (tokenize's owner switches it)",
    ("marin/data/archive.py", "members", ".read()"): "a member stream archive.py bounds itself (MAX_MEMBER_BYTES, "
                                                     "MAX_RATIO)",
    ("marin/tracking/live.py", "_send", ".read()"): "the run file this process appends, from the last offset sent",
}

# Not yet read through marin.readers (issue 38, defect 6): none left. The list may only shrink: a new
# unbounded read fails.
PENDING: set[tuple[str, str, str]] = set()


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _archive(func: ast.expr) -> bool:
    """``tarfile.open`` and the like: iterating one yields members, not lines."""
    return isinstance(func, ast.Attribute) and _name(func.value) in ("tarfile", "zipfile", "ZipFile")


def _files(fn: ast.AST) -> set[str]:
    """Names bound to an open file in ``fn``: ``with open(...) as f`` (or another opener)."""
    found = set()
    for node in ast.walk(fn):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                ctx = item.context_expr
                if (isinstance(ctx, ast.Call) and _name(ctx.func) in OPENERS and not _archive(ctx.func)
                        and isinstance(item.optional_vars, ast.Name)):
                    found.add(item.optional_vars.id)
    return found


def _call(node: ast.Call, files: set[str]) -> str | None:
    """What unbounded read ``node`` is, if it is one."""
    func, sized = node.func, bool(node.args) or any(k.arg == "size" for k in node.keywords)
    if not isinstance(func, ast.Attribute):
        return None
    attr, owner = func.attr, _name(func.value)
    if attr in ("read", "readline", "readlines") and not sized:
        return f".{attr}()"
    if attr in ("read_bytes", "read_text") and not node.args:
        return f".{attr}()"
    if (owner, attr) in LOADERS:
        return f"{owner}.{attr}"
    if node.args and ((owner == "yaml" and attr in YAML) or (owner == "csv" and attr in CSV)):
        arg = node.args[0]
        if (isinstance(arg, ast.Name) and arg.id in files) or (
                isinstance(arg, ast.Call) and _name(arg.func) in OPENERS):
            return f"{owner}.{attr} of a file"
    return None


def _iterates(it: ast.expr, files: set[str]) -> bool:
    """Whether ``it`` iterates the lines of an open file: ``f``, ``enumerate(f)``, ``iter(f)``."""
    if isinstance(it, ast.Call) and _name(it.func) in ("enumerate", "iter", "zip") and it.args:
        it = it.args[0]
    return isinstance(it, ast.Name) and it.id in files


def _scopes(tree: ast.Module):
    """(function name, node) for the module body and every function, innermost name for a node."""
    yield "<module>", tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node


def unbounded_reads(source: str, module: str) -> list[tuple[str, str, str, int]]:
    """(module, function, what, line) of every unbounded read in ``source``."""
    tree, seen, found = ast.parse(source), set(), []
    scopes = list(_scopes(tree))
    for name, scope in reversed(scopes):  # innermost function first: it names the read
        files = _files(scope)
        for node in ast.walk(scope):
            if id(node) in seen:
                continue
            what = None
            if isinstance(node, ast.Call):
                what = _call(node, files)
            elif isinstance(node, (ast.For, ast.comprehension)) and _iterates(node.iter, files):
                what = "for line in file"
            if what is not None:
                seen.add(id(node))
                line = node.iter.lineno if isinstance(node, ast.comprehension) else node.lineno
                found.append((module, name, what, line))
    return sorted(found, key=lambda x: x[3])


def offenders(root: Path = REPO) -> list[str]:
    out = []
    for path in sorted((root / "marin").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == READER:
            continue
        for module, fn, what, line in unbounded_reads(path.read_text(), rel):
            if (module, fn, what) not in ALLOWED and (module, fn, what) not in PENDING:
                out.append(f"{module}:{line} in {fn}: {what}")
    return out


def test_no_module_reads_a_file_or_a_line_unbounded() -> None:
    found = offenders()
    assert not found, "unbounded reads (use marin.readers, or read in sized chunks):\n" + "\n".join(found)


def test_every_allowed_read_still_exists_and_says_why() -> None:
    """A stale exception would let a new read of the same kind in through the same door."""
    present = set()
    for path in sorted((REPO / "marin").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        present |= {(m, fn, what) for m, fn, what, _ in unbounded_reads(path.read_text(), rel)}
    for key, why in ALLOWED.items():
        assert key in present, f"{key} is allowed but no longer read; drop it from ALLOWED"
        assert why.strip() and "\n" not in why, key
    for key in PENDING:
        assert key in present, f"{key} is read through marin.readers now; drop it from PENDING"


def test_the_walk_finds_each_form_of_unbounded_read() -> None:
    src = '''
import csv, json, yaml
from pathlib import Path
def whole(p):
    with open(p) as f:
        return f.read()
def line(f):
    return f.readline()
def all_lines(f):
    return f.readlines()
def path_bytes(p):
    return Path(p).read_bytes()
def path_text(p):
    return p.read_text(encoding="utf-8")
def loaded(f):
    return json.load(f)
def yaml_file(p):
    with open(p) as f:
        return yaml.safe_load(f)
def yaml_open(p):
    return yaml.safe_load(open(p))
def rows(p):
    with open(p, newline="") as f:
        return list(csv.DictReader(f))
def rows_open(p):
    return list(csv.reader(open(p)))
def each(p):
    with open(p, "rb") as f:
        for line in f:
            pass
    with open(p, "rb") as g:
        for i, line in enumerate(g):
            pass
'''
    got = {(fn, what) for _, fn, what, _ in unbounded_reads(src, "x.py")}
    assert got == {("whole", ".read()"), ("line", ".readline()"), ("all_lines", ".readlines()"),
                   ("path_bytes", ".read_bytes()"), ("path_text", ".read_text()"), ("loaded", "json.load"),
                   ("yaml_file", "yaml.safe_load of a file"), ("yaml_open", "yaml.safe_load of a file"),
                   ("rows", "csv.DictReader of a file"), ("rows_open", "csv.reader of a file"),
                   ("each", "for line in file")}


def test_the_walk_lets_sized_reads_and_parsed_text_through() -> None:
    src = '''
import json, yaml
from marin import readers
def ok(p, f, text):
    f.read(1 << 20)
    f.readline(4096)
    f.read(size=10)
    readers.read_bytes(p, "vsa")
    json.loads(readers.read_bytes(p, "json"))
    yaml.safe_load(text)
    csv.DictReader(io.StringIO(text, newline=""))
    for line in readers.lines(p, "run"):
        pass
'''
    assert unbounded_reads(src, "x.py") == []


def test_the_read_kinds_are_the_caps_table() -> None:
    """``readers.Kind``, the Literal every reader takes, names exactly the kinds CAPS has a cap for: a kind
    without a cap is a type error, not a KeyError at run time."""
    import typing

    from marin import readers

    assert set(typing.get_args(readers.Kind)) == set(readers.CAPS)
