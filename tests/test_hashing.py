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
