"""Hostile archives: a member that could escape, a link, a device, a fifo or a hostile size
makes curate refuse the whole archive, naming the member, the archive and what to do."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from marin.data import archive
from marin.errors import StageError
from tests.conftest import Project, mini_params, new_project

GOOD = {"texts/a.txt": b"A plain text member.\n", "verses.jsonl": b'{"book": "A", "chapter": 1, "text": "x"}\n'}


def _tar_info(name: str, kind: bytes = tarfile.REGTYPE, **kw: object) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    for k, v in kw.items():
        setattr(ti, k, v)
    return ti


def write_tar(path: Path, hostile: tarfile.TarInfo) -> Path:
    """A gzipped tar of the good members plus ``hostile`` (written last, not selected)."""
    with tarfile.open(path, "w:gz") as tf:
        for name, data in GOOD.items():
            ti = _tar_info(name, size=len(data))
            tf.addfile(ti, io.BytesIO(data))
        small = hostile.isfile() and hostile.size == 1  # the huge one is a header only: refused before its data
        tf.addfile(hostile, io.BytesIO(b"x") if small else None)
    return path


def _zip_info(name: str, mode: int) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name)
    zi.create_system = 3  # Unix: external_attr carries the mode
    zi.external_attr = mode << 16
    return zi


def write_zip(path: Path, hostile: zipfile.ZipInfo, data: bytes = b"/etc/passwd") -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, body in GOOD.items():
            zf.writestr(name, body)
        zf.writestr(hostile, data)
    return path


TAR_CASES: dict[str, tuple[Callable[[], tarfile.TarInfo], str, str]] = {
    "dotdot": (lambda: _tar_info("../../etc/passwd", size=1), "../../etc/passwd", "escapes the archive"),
    "absolute": (lambda: _tar_info("/etc/passwd", size=1), "/etc/passwd", "escapes the archive"),
    "symlink": (lambda: _tar_info("texts/b.txt", tarfile.SYMTYPE, linkname="/etc/passwd"), "texts/b.txt",
                "is a symbolic link"),
    "hardlink": (lambda: _tar_info("texts/c.txt", tarfile.LNKTYPE, linkname="/etc/shadow"), "texts/c.txt",
                 "is a hard link"),
    "chardev": (lambda: _tar_info("dev/zero", tarfile.CHRTYPE, devmajor=1, devminor=5), "dev/zero",
                "is a character device"),
    "blockdev": (lambda: _tar_info("dev/sda", tarfile.BLKTYPE, devmajor=8, devminor=0), "dev/sda",
                 "is a block device"),
    "fifo": (lambda: _tar_info("texts/pipe", tarfile.FIFOTYPE), "texts/pipe", "is a fifo"),
    "huge": (lambda: _tar_info("texts/huge.txt", size=5 << 30), "texts/huge.txt", "over the"),
}

ZIP_CASES: dict[str, tuple[Callable[[], zipfile.ZipInfo], str, str]] = {
    "symlink": (lambda: _zip_info("texts/b.txt", stat.S_IFLNK | 0o777), "texts/b.txt", "is a symbolic link"),
    "fifo": (lambda: _zip_info("texts/p", stat.S_IFIFO | 0o644), "texts/p", "is a fifo"),
    "chardev": (lambda: _zip_info("dev/null", stat.S_IFCHR | 0o644), "dev/null", "is a character device"),
    "dotdot": (lambda: _zip_info("../../evil.txt", stat.S_IFREG | 0o644), "../../evil.txt", "escapes the archive"),
    "absolute": (lambda: _zip_info("/tmp/evil.txt", stat.S_IFREG | 0o644), "/tmp/evil.txt", "escapes the archive"),
    "backslash": (lambda: _zip_info("..\\..\\evil.txt", stat.S_IFREG | 0o644), "..\\..\\evil.txt",
                  "Windows path"),
    "drive": (lambda: _zip_info("C:/evil.txt", stat.S_IFREG | 0o644), "C:/evil.txt", "Windows path"),
}


# -- the pure checks ----------------------------------------------------------------------

@pytest.mark.parametrize("name, bad", [
    ("texts/a.txt", False), ("./texts/a.txt", False), ("a..b/c...txt", False), ("dir/", False),
    ("../x", True), ("a/../../x", True), ("a/..", True), ("/etc/passwd", True), ("a\\b", True),
    ("C:/x", True), ("c:x", True), ("a\0b", True),
])
def test_name_problem(name: str, bad: bool) -> None:
    assert (archive.name_problem(name) is not None) == bad


@pytest.mark.parametrize("case", sorted(TAR_CASES))
def test_tar_problem_names_each_hostile_kind(case: str) -> None:
    make, _, why = TAR_CASES[case]
    assert why in (archive.tar_problem(make()) or "")


def test_tar_problem_accepts_files_and_dirs() -> None:
    assert archive.tar_problem(_tar_info("texts/a.txt", size=10)) is None
    assert archive.tar_problem(_tar_info("texts", tarfile.DIRTYPE)) is None


@pytest.mark.parametrize("case", sorted(ZIP_CASES))
def test_zip_problem_names_each_hostile_kind(case: str) -> None:
    make, _, why = ZIP_CASES[case]
    assert why in (archive.zip_problem(make()) or "")


def test_zip_problem_sizes() -> None:
    ok = _zip_info("a.txt", stat.S_IFREG | 0o644)
    ok.file_size, ok.compress_size = 10 << 20, 3 << 20
    assert archive.zip_problem(ok) is None
    tiny = _zip_info("zeros.txt", 0)  # small members may compress as much as they like
    tiny.file_size, tiny.compress_size = 1 << 20, 1
    assert archive.zip_problem(tiny) is None
    bomb = _zip_info("bomb.txt", 0)
    bomb.file_size, bomb.compress_size = 1 << 30, 1 << 20
    assert "zip bomb" in archive.zip_problem(bomb)
    huge = _zip_info("huge.txt", 0)
    huge.file_size, huge.compress_size = 5 << 30, 4 << 30
    assert "over the 4,294,967,296-byte limit" in archive.zip_problem(huge)


# -- members(): the whole archive is checked, selected members or not --------------------

def test_members_reads_a_clean_tar_zip_and_dir(tmp_path: Path) -> None:
    t = tmp_path / "ok.tar"
    with tarfile.open(t, "w") as tf:
        for name, data in GOOD.items():
            tf.addfile(_tar_info(name, size=len(data)), io.BytesIO(data))
    z = tmp_path / "ok.zip"
    with zipfile.ZipFile(z, "w") as zf:
        for name, data in GOOD.items():
            zf.writestr(name, data)
    d = tmp_path / "ok"
    for name, data in GOOD.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    for src in (t, z, d):
        assert list(archive.members(src, ("*",))) == sorted(GOOD.items())


@pytest.mark.parametrize("case", sorted(TAR_CASES))
def test_members_refuses_hostile_tar(tmp_path: Path, case: str) -> None:
    make, member, why = TAR_CASES[case]
    src = write_tar(tmp_path / "x.tar.gz", make())
    with pytest.raises(StageError) as e:
        list(archive.members(src, ("texts/a.txt",)))  # the hostile member is not even selected
    assert f"x.tar.gz: member {member!r} " in str(e.value) and why in str(e.value)
    assert "refusing the archive" in str(e.value) and "pin its new sha256" in str(e.value)


@pytest.mark.parametrize("case", sorted(ZIP_CASES))
def test_members_refuses_hostile_zip(tmp_path: Path, case: str) -> None:
    make, member, why = ZIP_CASES[case]
    src = write_zip(tmp_path / "x.zip", make())
    with pytest.raises(StageError) as e:
        list(archive.members(src, ("texts/a.txt",)))
    assert f"x.zip: member {member!r} " in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("suffix, mode", [(".tar.gz", "w:gz"), (".tar.xz", "w:xz"), (".tar.bz2", "w:bz2"),
                                          (".zip", None)])
def test_a_truncated_archive_is_one_line_naming_it(tmp_path: Path, suffix: str, mode: str | None) -> None:
    whole = tmp_path / f"whole{suffix}"
    payload = {name: os.urandom(200_000) for name in ("texts/a.txt", "texts/b.txt")}  # incompressible
    if mode is None:
        with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in payload.items():
                zf.writestr(name, data)
    else:
        with tarfile.open(whole, mode) as tf:
            for name, data in payload.items():
                tf.addfile(_tar_info(name, size=len(data)), io.BytesIO(data))
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    with pytest.raises(StageError) as e:  # a StageError, not gzip's EOFError or zipfile's BadZipFile
        list(archive.members(cut, ("*",)))
    assert f"cut{suffix}: " in str(e.value) and "fetch it again" in str(e.value) and "\n" not in str(e.value)


def test_members_refuses_a_zip_bomb(tmp_path: Path) -> None:
    src = tmp_path / "bomb.zip"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("texts/a.txt", GOOD["texts/a.txt"])
        zf.writestr("zeros.bin", bytes(32 << 20))  # 32 MiB of zeros deflate about 1000:1
    with pytest.raises(StageError, match=r"bomb.zip: member 'zeros.bin' expands \d[\d,]* times"):
        list(archive.members(src, ("texts/*",)))


@pytest.mark.parametrize("kind, why", [("symlink", "is a symbolic link"), ("fifo", "is a fifo")])
def test_members_refuses_special_files_in_a_directory(tmp_path: Path, kind: str, why: str) -> None:
    d = tmp_path / "src"
    (d / "texts").mkdir(parents=True)
    (d / "texts" / "a.txt").write_text("fine\n")
    if kind == "symlink":
        (d / "texts" / "b.txt").symlink_to("/etc/passwd")
    else:
        os.mkfifo(d / "texts" / "b.txt")
    with pytest.raises(StageError, match=f"src: member 'texts/b.txt' {why}; refusing the archive"):
        list(archive.members(d, ("texts/a.txt",)))


# -- end to end: fetch pins the archive, curate refuses it --------------------------------

def _project_on(tmp_path: Path, corpus: Path, src: Path) -> Project:
    params = mini_params(corpus)
    s = params["fetch"]["sources"][0]
    s.update(kind="file", locator=str(src), sha256=hashlib.sha256(src.read_bytes()).hexdigest())
    proj = new_project(tmp_path / "proj", params)
    proj.stage("fetch")
    return proj


def _assert_refused(proj: Project, archive_name: str, member: str, why: str) -> None:
    p = proj.stage("curate", check=False)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1, p.stderr
    assert len(lines) == 1, p.stderr  # one line, no traceback
    line = lines[0]
    assert line.startswith(f"marin: error: data/raw/mini/{archive_name}: member {member!r} "), line
    assert why in line and "nothing was extracted" in line and "pin its new sha256 in params.yaml" in line
    assert not (proj.root / "data" / "curated").exists()
    assert proj.runs("curate")[-1][-1]["body"]["status"] == "failed"
    assert proj.marin("ledger", "check").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "hardlink", "chardev", "fifo"])
def test_curate_refuses_hostile_tar(tmp_path: Path, corpus: Path, case: str) -> None:
    make, member, why = TAR_CASES[case]
    proj = _project_on(tmp_path, corpus, write_tar(tmp_path / "x.tar.gz", make()))
    _assert_refused(proj, "x.tar.gz", member, why)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["symlink", "dotdot"])
def test_curate_refuses_hostile_zip(tmp_path: Path, corpus: Path, case: str) -> None:
    make, member, why = ZIP_CASES[case]
    proj = _project_on(tmp_path, corpus, write_zip(tmp_path / "x.zip", make()))
    _assert_refused(proj, "x.zip", member, why)


@pytest.mark.slow
def test_fetch_refuses_a_symlink_in_a_local_source(tmp_path: Path, corpus: Path) -> None:
    src = tmp_path / "mini"
    (src / "texts").mkdir(parents=True)
    (src / "texts" / "a.txt").write_text("fine\n")
    (src / "texts" / "b.txt").symlink_to("/etc/passwd")
    params = mini_params(corpus)
    params["fetch"]["sources"][0]["locator"] = str(src)
    proj = new_project(tmp_path / "proj", params)
    p = proj.stage("fetch", check=False)
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert f"{src}/texts/b.txt is a symbolic link; refusing the local source (nothing was copied)" in lines[0]
    assert not (proj.root / "data" / "raw").exists()
