import hashlib
import os
import subprocess

import numpy as np
import pytest

from marin import hashing


def test_canonical_json_rfc8785_examples() -> None:
    # RFC 8785 section 3.2.2/3.2.3: sorted keys, no whitespace, ES6 number form.
    assert hashing.canonical_json({"b": 1, "a": [1.0, 1e21, 0.000001]}) == b'{"a":[1,1e+21,0.000001],"b":1}'
    assert hashing.canonical_json({"\u20ac": "\u00e9"}) == '{"€":"é"}'.encode()


def test_digest_format_and_parse_roundtrip() -> None:
    d = hashing.bytes_digest(b"abc")
    assert d == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    assert hashing.fmt(hashing.parse(d)) == d
    with pytest.raises(ValueError):
        hashing.parse("md5:abc")


def test_dir_digest_ignores_mtime_and_sees_content(tmp_path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("x")
    (tmp_path / "y.txt").write_text("y")
    d1 = hashing.dir_digest(tmp_path)
    os.utime(tmp_path / "y.txt", (0, 0))
    assert hashing.dir_digest(tmp_path) == d1
    (tmp_path / "y.txt").write_text("Y")
    assert hashing.dir_digest(tmp_path) != d1
    (tmp_path / "y.txt").write_text("y")
    (tmp_path / "y.txt").rename(tmp_path / "z.txt")
    assert hashing.dir_digest(tmp_path) != d1


def test_tree_digest_sees_dtype_shape_and_bits() -> None:
    a = np.arange(6, dtype=np.float32)
    base = hashing.tree_digest({"w": a})
    assert hashing.tree_digest({"w": a.copy()}) == base
    assert hashing.tree_digest({"w": a.reshape(2, 3)}) != base
    assert hashing.tree_digest({"w": a.astype(np.float64)}) != base
    assert hashing.tree_digest({"v": a}) != base
    b = a.copy()
    b.view(np.uint32)[3] ^= 1  # one bit of one element
    assert hashing.tree_digest({"w": b}) != base


def test_dvc_md5_matches_real_dvc(tmp_path) -> None:
    """Our md5 equals what `dvc add` writes for a file and for a directory."""
    import sys

    dvc = os.path.join(os.path.dirname(sys.executable), "dvc")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "f.txt").write_bytes(b"line\r\nother\n")
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    for name, data in {"a.txt": b"a", "a-b.txt": b"ab", "sub/Z.txt": b"", "sub/c.bin": bytes(300)}.items():
        (d / name).write_bytes(data)
    for target in ("f.txt", "d"):
        subprocess.run([dvc, "add", "-q", target], cwd=tmp_path, check=True)
        import yaml

        out = yaml.safe_load((tmp_path / f"{target}.dvc").read_text())["outs"][0]
        assert hashing.dvc_md5(tmp_path / target) == out["md5"], target


def _fifo(root, outside) -> None:
    os.mkfifo(root / "sub" / "pipe")


def _socket(root, outside) -> None:
    import contextlib
    import socket

    with contextlib.chdir(root / "sub"), socket.socket(socket.AF_UNIX) as s:  # a relative name: sun_path is short
        s.bind("sock")


def _file_link(root, outside) -> None:
    (root / "sub" / "link").symlink_to(outside / "elsewhere.txt")


NOT_PLAIN = {  # (make it, entry named, why, whether following links to files lets it through)
    "fifo": (_fifo, "sub/pipe", "is a fifo", False),
    "socket": (_socket, "sub/sock", "is a socket", False),
    "link to a file outside": (_file_link, "sub/link", "is a symbolic link", True),
    "link to /dev/zero": (lambda r, o: (r / "sub" / "zero").symlink_to("/dev/zero"), "sub/zero",
                          "is a symbolic link", False),
    "link to a folder": (lambda r, o: (r / "sub" / "d").symlink_to(o), "sub/d", "is a symbolic link", False),
    "link that leads nowhere": (lambda r, o: (r / "sub" / "gone").symlink_to(o / "gone"), "sub/gone",
                                "is a symbolic link", False),
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
def test_a_folder_digest_names_an_entry_it_cannot_hash_instead_of_skipping_it(tmp_path, case: str) -> None:
    """Issue 55, defect 4: a fifo, socket, device or link in a hashed folder was left out of its digest
    (or followed out of the folder); now every digest of a folder names it. A link to a regular file is
    followed only where a DVC checkout may link its cache (the default), never for an input folder."""
    make, entry, why, followed = NOT_PLAIN[case]
    root, outside = tmp_path / "folder", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "a.txt").write_text("a")
    (outside / "elsewhere.txt").write_text("outside")
    make(root, outside)
    strict = (lambda p: hashing.dir_digest(p, links=False), lambda p: hashing.dir_entries(p, links=False))
    default = (hashing.dir_digest, hashing.dir_entries, hashing.path_digest, hashing.path_size, hashing.dvc_md5,
               hashing.digest_path)
    for fn in strict + (() if followed else default):
        with pytest.raises(hashing.NotPlain, match=rf"{entry}: {why}"):
            fn(root)
    if followed:  # hashed as the file it leads to: the digest of a copy
        linked = hashing.dir_digest(root)
        (root / "sub" / "link").unlink()
        (root / "sub" / "link").write_text("outside")
        assert hashing.dir_digest(root) == linked == hashing.dir_digest(root, links=False)
