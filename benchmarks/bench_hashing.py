"""Hashing throughput: marin's sha256 file digest against DVC's md5, on the same files.

    uv run python benchmarks/bench_hashing.py [DIR]

Hashes every file under DIR (default: data/ if present, else 256 MiB of generated
files), alternating the contenders for several rounds, and prints MB/s and ratios
measured side by side in this one run. Asserts nothing.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from dvc_data.hashfile.hash import file_md5
from dvc_objects.fs.local import LocalFileSystem

from marin import hashing

ROUNDS = 5


def files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def generated(tmp: Path) -> list[Path]:
    rng = os.urandom
    out = []
    for i in range(8):
        p = tmp / f"blob{i}.bin"
        p.write_bytes(rng(32 << 20))
        out.append(p)
    return out


def bench(name: str, fn, files: list[Path], total: int) -> float:
    t = time.perf_counter()
    for f in files:
        fn(f)
    dt = time.perf_counter() - t
    return total / dt / 1e6


def main() -> None:
    fs = LocalFileSystem()
    contenders = {
        "marin sha256 (hashing.file_digest)": hashing.file_digest,
        "marin dvc_md5 (hashing.dvc_md5)": hashing.dvc_md5,
        "DVC md5 (dvc_data file_md5)": lambda p: file_md5(os.fspath(p), fs),
    }
    with tempfile.TemporaryDirectory() as tmp:
        arg = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data")
        files = files_under(arg) if arg.is_dir() and files_under(arg) else generated(Path(tmp))
        total = sum(f.stat().st_size for f in files)
        print(f"{len(files)} files, {total / 1e6:.1f} MB, best of {ROUNDS} rounds (alternating)")
        best = dict.fromkeys(contenders, 0.0)
        for _ in range(ROUNDS):
            for name, fn in contenders.items():
                best[name] = max(best[name], bench(name, fn, files, total))
    ref = best["DVC md5 (dvc_data file_md5)"]
    for name, mbps in best.items():
        print(f"{name:40} {mbps:8.0f} MB/s   ratio to DVC md5: {mbps / ref:.2f}")


if __name__ == "__main__":
    main()
