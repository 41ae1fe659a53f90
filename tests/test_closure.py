"""A stage's code is its import closure: the pure pieces (import reading, closure, folder
compaction), and dvc.yaml against closures found independently with ``modulefinder``."""

from __future__ import annotations

import modulefinder
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marin import stages
from marin.stages import closure, code_links, dvcyaml
from tests.conftest import REPO


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_imported_names_reads_every_import_form_including_lazy_and_relative() -> None:
    src = """
import os, marin.a
from marin.b import c, d as e
from . import sibling
from .sub import thing
from .. import up
def f():
    from marin.lazy import x
    import marin.lazier
"""
    names = closure.imported_names(src, "marin.pkg.mod", is_package=False)
    assert {"os", "marin.a", "marin.b", "marin.b.c", "marin.b.d", "marin.lazy", "marin.lazy.x",
            "marin.lazier", "marin.pkg", "marin.pkg.sibling", "marin.pkg.sub", "marin.pkg.sub.thing",
            "marin", "marin.up"} <= names
    assert "marin.b.e" not in names  # an alias is not a module
    in_package = closure.imported_names("from . import x", "marin.pkg", is_package=True)
    assert in_package == {"marin.pkg", "marin.pkg.x"}


def test_module_closure_follows_imports_parents_and_stops_at_other_packages(tmp_path: Path) -> None:
    write(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/s.py": "from marin.a import f\nimport json\n",
        "marin/__init__.py": "",
        "marin/a.py": "def f():\n    from marin.sub import b\n",
        "marin/sub/__init__.py": "from .c import g\n",
        "marin/sub/b.py": "",
        "marin/sub/c.py": "",
        "marin/unused.py": "import marin.a\n",
    })
    got = [p.relative_to(tmp_path).as_posix() for p in closure.module_closure(tmp_path, "pipeline.s")]
    assert got == ["marin/__init__.py", "marin/a.py", "marin/sub/__init__.py", "marin/sub/b.py", "marin/sub/c.py",
                   "pipeline/__init__.py", "pipeline/s.py"]


def test_a_sibling_file_a_module_names_by_path_is_code_but_its_imports_are_not_followed(tmp_path: Path) -> None:
    write(tmp_path, {
        "pipeline/__init__.py": "", "pipeline/s.py": "import marin.save\n",
        "marin/__init__.py": "",
        "marin/save.py": "from pathlib import Path\nGEN = Path(__file__).with_name('gen.py')\n"
                         "OTHER = Path('x').with_name('not_this.py')\n",
        "marin/gen.py": "def load():\n    import marin.heavy\n",
        "marin/heavy.py": "", "marin/not_this.py": "",
    })
    got = closure.files(tmp_path, "pipeline.s")
    assert "marin/gen.py" in got and "marin/save.py" in got
    assert "marin/heavy.py" not in got and "marin/not_this.py" not in got
    # the project's own case: MLflow runs the generator file when a stage mirrors a model into it
    assert "marin/tracking/generator_model.py" in stages.code_files(REPO, "train")


def test_package_data_takes_data_files_and_data_folders_not_subpackages(tmp_path: Path) -> None:
    write(tmp_path, {
        "marin/__init__.py": "", "marin/pins.json": "{}", "marin/ref/list.csv": "a",
        "marin/ns/mod.py": "", "marin/ns/data.json": "{}",  # a namespace package: not data
        "marin/__pycache__/x.pyc": "",
    })
    got = [p.relative_to(tmp_path).as_posix() for p in closure.package_data(tmp_path / "marin")]
    assert got == ["marin/pins.json", "marin/ref/list.csv"]


def test_a_link_folder_holds_each_stage_s_whole_closure(tmp_path: Path) -> None:
    write(tmp_path, {"m/a.py": "", "m/b.py": "", "m/c.py": "", "schemas/x.json": "{}", "uv.lock": ""})
    closures = {"s1": {"m/a.py", "m/b.py", "schemas/x.json", "uv.lock"},
                "s2": {"m/a.py", "m/c.py", "schemas/x.json", "uv.lock"}}
    (tmp_path / "closures/s1/stray.py").parent.mkdir(parents=True)
    (tmp_path / "closures/s1/stray.py").write_text("")  # a plain file there is removed
    code_links.write(tmp_path, closures)
    assert code_links.problems(tmp_path, closures) == []
    assert (tmp_path / "closures/s1/m/b.py").is_symlink() and not (tmp_path / "closures/s1/stray.py").exists()
    assert (tmp_path / "closures/s1/uv.lock").resolve() == (tmp_path / "uv.lock").resolve()
    for name in ("s1", "s2"):  # through its one folder, each stage's dependencies are exactly its closure
        assert code_links.dep(name) == f"closures/{name}"
        assert closure.expand(tmp_path, [code_links.dep(name)]) == sorted(closures[name])
    (tmp_path / "closures/s2/m/c.py").unlink()
    (tmp_path / "closures/s2/m/c.py").symlink_to("../../../m/b.py")
    assert code_links.problems(tmp_path, closures) == ["closures/s2/m/c.py: links to m/b.py, not m/c.py"]
    code_links.write(tmp_path, {"s1": closures["s1"]})  # a stage gone: its folder goes
    assert not (tmp_path / "closures/s2").exists()


def test_dvc_yaml_lists_one_code_folder_per_stage_not_every_file() -> None:
    """dvc exp show has a column per dependency: the code is one folder per stage, schemas/ and uv.lock
    inside it (it was ~180 files, then 17 folders)."""
    deps = {d for spec in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values() for d in spec["deps"]}
    code = {d for d in deps if d.split("/")[0] in ("closures", "marin", "pipeline", "schemas", "uv.lock")}
    assert code == {f"closures/{s}" for s in stages.NAMES}, sorted(code)


def independent_closure(stage: str) -> set[str]:
    """The project files ``python -m pipeline.<stage>`` and the function it runs (the declaration's
    ``fn``) may import, by the standard library's modulefinder (bytecode scanning, function bodies
    included), searching the repository only."""
    finder = modulefinder.ModuleFinder(path=[str(REPO)])
    finder.run_script(str(REPO / "pipeline" / f"{stage}.py"))
    finder.import_hook(stages.declaration(stage).fn_module)
    files = {Path(m.__file__).resolve() for m in finder.modules.values() if m.__file__}
    # a package's __init__ runs whenever a module below it is imported
    inits = {p.parent / "__init__.py" for f in files for p in [f, *f.parents] if REPO in p.parents}
    return {p.relative_to(REPO).as_posix() for p in files | inits
            if p.is_file() and p.is_relative_to(REPO) and p.parts[len(REPO.parts)] in ("marin", "pipeline")}


@pytest.mark.parametrize("stage", stages.NAMES)
def test_dvc_yaml_lists_every_module_the_stage_imports(stage: str) -> None:
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][stage]
    listed = set(closure.expand(REPO, [d for d in spec["deps"] if (REPO / d).exists()]))
    found = independent_closure(stage)
    assert found, stage
    assert found - {"pipeline/__init__.py"} <= listed, sorted(found - listed)
    assert {"schemas/ledger/run.started.schema.json", "marin/schema_pins.json", "uv.lock"} <= listed
    assert spec["cmd"] == f"python -m pipeline.{stage}"


def test_dvc_yaml_is_what_the_declarations_generate() -> None:
    assert dvcyaml.check(REPO) == []
    r = subprocess.run([sys.executable, "-m", "marin.cli", "stages", "--check"], cwd=REPO, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_stages_check_names_a_missing_dependency(tmp_path: Path) -> None:
    import shutil

    for rel in ("marin", "pipeline", "schemas", "closures", "uv.lock", "params.yaml", "dvc.yaml"):
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, tmp_path / rel, symlinks=True,
                            ignore=lambda d, names: [n for n in names if n == "__pycache__"])
        else:
            (tmp_path / rel).write_bytes(src.read_bytes())
    text = (tmp_path / "dvc.yaml").read_text()
    (tmp_path / "closures/curate/marin/data/shards.py").unlink()  # DVC would not see an edit to it
    problems = dvcyaml.check(tmp_path)
    assert any("stage curate misses code it imports: marin/data/shards.py" in p for p in problems), problems
    r = subprocess.run([sys.executable, "-m", "marin.cli", "--root", str(tmp_path), "stages", "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "marin/data/shards.py" in r.stderr and "marin stages --write" in r.stderr
    subprocess.run([sys.executable, "-m", "marin.cli", "--root", str(tmp_path), "stages", "--write"], check=True,
                   capture_output=True)
    assert (tmp_path / "dvc.yaml").read_text() == text and dvcyaml.check(tmp_path) == []
