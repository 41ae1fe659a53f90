"""The loader's pure pieces: the data-order permutation, the window of each sample, and the
packed stream read from its cache, checked against a straightforward reading of the shards."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marin.errors import StageError
from marin.train import loader as ld
from marin.train.loader import Loader, Permutation, epoch_key, open_stream, permute, sample_windows, window_bounds
from tests.conftest import REPO

EOS = 0


def key_of(seed: int) -> bytes:
    """A data-order key like seeds.key_bytes gives (8 bytes), without starting jax."""
    return hashlib.sha256(seed.to_bytes(8, "little")).digest()[:8]


# -- the permutation -----------------------------------------------------------------------

BIJECTION_SIZES = [1, 2, 3, 5, 7, 13, 31, 97, 2**4, 2**5 - 1, 2**8, 2**8 - 1, 2**10 - 1, 2**10 + 1, 4099,
                   65521, 2**16, 2**16 - 1, 2**17 + 1, 10**6 + 3, 2**20, 2**20 - 1, 3 * 2**19 + 7]


@pytest.mark.parametrize("n", BIJECTION_SIZES)
def test_permutation_is_a_bijection(n: int) -> None:
    for seed in (0, 1) if n < 10**5 else (0,):
        image = Permutation(n, key_of(seed))(np.arange(n))
        assert image.dtype == np.int64 and image.shape == (n,)
        assert image.min() >= 0 and image.max() < n
        assert np.array_equal(np.sort(image), np.arange(n)), f"not a bijection of [0, {n})"


def test_vectorized_permutation_equals_the_scalar_definition() -> None:
    rng = random.Random(1234)
    sizes = [*range(1, 130), *(2**k + d for k in range(8, 24, 3) for d in (-1, 0, 1))]
    sizes += [rng.randrange(2, 2**22) for _ in range(20)]
    for n in sizes:
        for seed in range(3):
            key = epoch_key(key_of(seed), rng.randrange(0, 1000))
            sample = sorted({0, n - 1, *(rng.randrange(n) for _ in range(300))})  # the scalar version is slow
            idx = list(range(n)) if n <= 2**12 else sample
            got = Permutation(n, key)(np.asarray(idx)).tolist()
            assert got == [permute(i, n, key) for i in idx], (n, seed)


def test_scalar_permutation_is_a_bijection_for_small_n() -> None:
    for n in range(1, 70):
        key = key_of(n)
        assert sorted(permute(i, n, key) for i in range(n)) == list(range(n))


def test_permutation_is_deterministic_per_key_and_differs_across_keys() -> None:
    for n in (17, 1000, 2**16 + 5):
        first = Permutation(n, key_of(7))(np.arange(n))
        assert np.array_equal(first, Permutation(n, key_of(7))(np.arange(n)))
        others = [Permutation(n, key_of(s))(np.arange(n)) for s in range(8, 14)]
        assert all(not np.array_equal(first, o) for o in others)
        assert not np.array_equal(first, np.arange(n))  # not the identity
    assert Permutation(1, key_of(3))(np.arange(1)).tolist() == [0]  # the only permutation of one element


def test_epoch_keys_differ_and_give_different_orders() -> None:
    k = key_of(5)
    keys = {epoch_key(k, e) for e in range(50)}
    assert len(keys) == 50 and all(len(x) == 32 for x in keys)
    a, b = (Permutation(500, epoch_key(k, e))(np.arange(500)) for e in (0, 1))
    assert not np.array_equal(a, b)


def test_out_of_range_indices_are_refused() -> None:
    with pytest.raises(IndexError):
        permute(5, 5, key_of(0))
    with pytest.raises(IndexError):
        permute(-1, 5, key_of(0))
    with pytest.raises(IndexError):
        Permutation(5, key_of(0))(np.array([0, 5]))
    with pytest.raises(ValueError):
        Permutation(0, key_of(0))



def test_the_data_order_is_pinned() -> None:
    """Fixed expected values, written down once: any change to the permutation, the epoch keys or
    the sample-to-window rule changes which data a recorded run saw, and fails here."""
    key = key_of(1234)
    assert [permute(i, 10, key) for i in range(10)] == [4, 1, 8, 5, 6, 7, 2, 3, 0, 9]
    assert [permute(i, 1000, key) for i in (0, 1, 2, 999)] == [136, 694, 92, 568]
    assert [sample_windows(step, 4, 10, key).tolist() for step in range(4)] == [
        [2, 3, 1, 8], [0, 5, 7, 9], [6, 4, 3, 1], [7, 9, 2, 5]]  # epochs 0 (steps 0-2) and 1 (from sample 10)
    assert sample_windows(7, 3, 1000, key).tolist() == [976, 345, 181]


def test_the_data_order_key_of_a_seed_is_pinned() -> None:
    """The key the train stage gives the loader for seed 1234 (jax's threefry fold_in), written down once."""
    from marin.train import seeds

    assert seeds.key_bytes(1234, "data_order").hex() == "feb1c80160e39d42"


# -- the window of each sample ---------------------------------------------------------------

def reference_windows(step: int, b: int, s: int, key: bytes) -> list[int]:
    """Sample g = step*B + b: epoch g // S, position g % S, permuted by the epoch's key."""
    return [permute(g % s, s, epoch_key(key, g // s)) for g in range(step * b, step * b + b)]


@pytest.mark.parametrize(("s", "b"), [(1, 1), (1, 4), (10, 3), (10, 10), (10, 25), (97, 8), (4096, 32)])
def test_sample_windows_follow_epoch_and_position(s: int, b: int) -> None:
    key = key_of(s * 1000 + b)
    steps = [*range(0, 3 * s // b + 3), 10**6, 10**9 + 7]
    for step in steps:
        assert sample_windows(step, b, s, key).tolist() == reference_windows(step, b, s, key), step


def test_each_epoch_visits_every_window_once() -> None:
    s, b, key = 37, 5, key_of(99)
    samples = np.concatenate([sample_windows(step, b, s, key) for step in range(0, 3 * s // b + 2)])
    for e in range(3):  # sample g is in epoch g // S whatever batch it falls in
        assert sorted(samples[e * s : (e + 1) * s].tolist()) == list(range(s))
    assert samples[:s].tolist() != samples[s : 2 * s].tolist()  # a new order each epoch


def test_window_bounds_overlap_by_one() -> None:
    for t in (1, 8, 128):
        assert window_bounds(0, t) == (0, t + 1)
        for w in range(5):
            start, stop = window_bounds(w, t)
            assert stop - start == t + 1 and window_bounds(w + 1, t)[0] == stop - 1


# -- the packed stream against a straightforward reading of the shards -----------------------

def write_token_shards(d: Path, docs: list[list[int]], per_shard: int, row_group: int = 3) -> list[Path]:
    """Shards in the tokenize format (list<uint16> tokens) with small row groups."""
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(0, len(docs), per_shard):
        part = docs[i : i + per_shard]
        table = pa.table({"doc_id": [f"d{i + j}" for j in range(len(part))], "corpus": ["c"] * len(part),
                          "n_bytes": pa.array([2 * len(x) for x in part], pa.int64()),
                          "tokens": pa.array(part, pa.list_(pa.uint16()))})
        paths.append(d / f"train-{len(paths):05d}.parquet")
        pq.write_table(table, paths[-1], row_group_size=row_group)
    return paths


def synthetic_docs(rng: random.Random, n: int, max_len: int) -> list[list[int]]:
    docs = [[rng.randrange(1, 65535) for _ in range(rng.randrange(0, max_len))] for _ in range(n)]
    docs[1] = []  # an empty document still adds its EOS
    return docs


def reference_stream(shards: list[Path], eos: int) -> list[int]:
    out: list[int] = []
    for p in shards:
        for ids in pq.read_table(p)["tokens"].to_pylist():
            out += [*ids, eos]
    return out


@pytest.mark.parametrize(("t", "b"), [(8, 4), (31, 3), (64, 16), (5, 50)])
def test_batches_equal_windows_of_the_shards(tmp_path: Path, t: int, b: int) -> None:
    shards = write_token_shards(tmp_path / "tokens", synthetic_docs(random.Random(t), 40, 60), per_shard=7)
    stream = reference_stream(shards, EOS)
    key = key_of(t)
    loader = Loader(open_stream(shards, EOS, tmp_path / "cache"), t, b, key)
    s = (len(stream) - 1) // t
    assert len(loader.stream) == len(stream) and loader.windows == s
    for step in [*range(0, 2 * s // b + 3), 12345]:  # past two epoch boundaries
        want = np.asarray([stream[w * t : w * t + t + 1] for w in reference_windows(step, b, s, key)], np.int32)
        got = loader.batch(step)
        assert got["inputs"].dtype == np.int32 and got["inputs"].shape == (b, t)
        assert np.array_equal(got["inputs"], want[:, :-1]) and np.array_equal(got["targets"], want[:, 1:]), step
        assert loader.position(step) == {"epoch": step * b // s, "index": step * b % s}
    ld._epoch_permutation.cache_clear()  # as in a fresh process
    resumed = Loader(open_stream(shards, EOS, tmp_path / "cache"), t, b, key)
    for step in (2 * s // b + 2, s // b + 1, 7, 0):  # any step first, in any order
        assert all(np.array_equal(resumed.batch(step)[k], loader.batch(step)[k]) for k in ("inputs", "targets"))


def test_the_cache_is_reused_and_keyed_by_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    shards = write_token_shards(tmp_path / "tokens", synthetic_docs(rng, 10, 30), per_shard=4)
    first = open_stream(shards, EOS, tmp_path / "cache")
    assert first.path.is_relative_to(tmp_path / "cache") and first.dtype == np.uint16
    with monkeypatch.context() as m:
        m.setattr(ld, "_build", lambda *a: pytest.fail("rebuilt an existing cache"))
        assert open_stream(shards, EOS, tmp_path / "cache").path == first.path
    other_eos = open_stream(shards, 7, tmp_path / "cache")
    assert other_eos.path != first.path and other_eos.read(0, len(other_eos)).tolist() == reference_stream(shards, 7)
    write_token_shards(tmp_path / "tokens", synthetic_docs(rng, 10, 30), per_shard=4)  # new content, same names
    changed = open_stream(shards, EOS, tmp_path / "cache")
    assert changed.path != first.path
    assert changed.read(0, len(changed)).tolist() == reference_stream(shards, EOS)


def test_a_stale_digest_is_not_cached(tmp_path: Path) -> None:
    shards = write_token_shards(tmp_path / "tokens", synthetic_docs(random.Random(4), 6, 20), per_shard=3)
    with pytest.raises(StageError, match="changed while the token cache was built"):
        open_stream(shards, EOS, tmp_path / "cache", file_digest=lambda p: "sha256:" + "0" * 64)
    assert not any((tmp_path / "cache").rglob("tokens.*"))


def test_the_stream_refuses_reads_past_its_end(tmp_path: Path) -> None:
    shards = write_token_shards(tmp_path / "tokens", [[1, 2, 3]], per_shard=1)
    stream = open_stream(shards, EOS, tmp_path / "cache")
    assert stream.read(0, 4).tolist() == [1, 2, 3, EOS]
    with pytest.raises(IndexError):
        stream.read(2, 5)
    with pytest.raises(ValueError, match="shorter than one sequence"):
        Loader(stream, 8, 2, key_of(0)).batch(0)


def test_the_cache_lives_in_a_git_ignored_folder() -> None:
    assert Path(".marin/cache/tokens") == ld.CACHE
    r = subprocess.run(["git", "check-ignore", "-q", str(ld.CACHE / "x" / "tokens.uint16")], cwd=REPO)
    assert r.returncode == 0, "the token cache must not be committed"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
def test_reading_batches_does_not_load_the_stream(tmp_path: Path) -> None:
    n = 32 * 2**20  # 64 MiB of uint16 tokens; the old loader held 128 MiB of int32
    path = tmp_path / "tokens.uint16"
    np.random.default_rng(0).integers(0, 4096, size=n, dtype=np.uint16).tofile(path)
    code = textwrap.dedent(f"""
        import numpy as np
        from marin.train.loader import Loader, TokenStream
        def kb(field):
            return int(next(x for x in open("/proc/self/status") if x.startswith(field)).split()[1])
        loader = Loader(TokenStream.open({str(path)!r}, np.dtype(np.uint16)), 1024, 64, b"k" * 8)
        loader.batch(0)
        base = kb("VmRSS")
        for step in range(1, 200):
            loader.batch(step)
        print(kb("VmHWM") - base)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    grown_kb = int(out.stdout.split()[-1])
    assert grown_kb < 16 * 1024, f"peak RSS grew by {grown_kb} KiB reading 200 batches of a 64 MiB stream"


@pytest.mark.slow
def test_batches_of_a_tokenized_project_equal_windows_of_its_shards(data_project) -> None:
    tokens = data_project.root / "data/tokens"
    manifest = json.loads((tokens / "manifest.json").read_text())
    shards = [tokens / s["file"] for s in manifest["splits"]["train"]["shards"]]
    eos = manifest["tokenizer"]["eos_id"]
    stream = reference_stream(shards, eos)
    assert len(stream) == manifest["splits"]["train"]["tokens"] + manifest["splits"]["train"]["docs"]
    t, b, key = 32, 8, key_of(20251129)
    loader = Loader(open_stream(shards, eos, data_project.root / ld.CACHE), t, b, key)
    s = loader.windows
    for step in range(0, 2 * s // b + 2):
        want = np.asarray([stream[w * t : w * t + t + 1] for w in reference_windows(step, b, s, key)], np.int32)
        got = loader.batch(step)
        assert np.array_equal(got["inputs"], want[:, :-1]) and np.array_equal(got["targets"], want[:, 1:]), step
