"""Neighbours of issue 38's bounded-input fixes that an outside audit found still open: a pinned
tokenizer whose chat tokens or EOS are not special (forged turns), the instructions stage's total,
Parquet footers that declare GBs, and archive totals (zip members of 1 MiB each, a flood of tar
headers). Each command runs as a measured child process (tests/test_bounded.py's helpers): one
line, the exit code, under 10 s and 500 MB, the ledger valid with every earlier run file unchanged.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import random
import struct
import tarfile
import zlib
from pathlib import Path

import pytest

from marin.config import TokenizeParams
from marin.data import chat
from marin.data import tokenize as tk
from tests.conftest import Project
from tests.test_bounded import ledger_kept, on_file, refused, run
from tests.test_bounded_instruct import with_messages
from tests.test_instruct import conversation

# -- H1. a pinned tokenizer whose reserved strings text could reach -------------------------------

TEXTS = ["In the beginning God created the heaven and the earth. " * 3,
         "ROMEO. But soft, what light through yonder window breaks? " * 3] * 10


def _pinned_spec(case: str) -> bytes:
    from tokenizers import Tokenizer, models, pre_tokenizers

    if case == "vocab_entry":  # the EOS only as a plain vocabulary word: the model maps that text to it
        words = [tk.EOS, *sorted({w for t in TEXTS for w in t.split()}), "[UNK]"]
        t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
        t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return t.to_str().encode()
    tok = tk.train_tokenizer(TEXTS, TokenizeParams(vocab_size=300, min_frequency=1, shard_max_tokens=1000))
    spec = json.loads(tok.to_str())
    for t in spec["added_tokens"]:  # the audit's: an added token marked "special": false
        if t["content"] == "<|assistant|>":
            t["special"] = False
    return json.dumps(spec).encode()


@pytest.mark.parametrize("case, token", [("not_special", "<|assistant|>"), ("vocab_entry", tk.EOS)])
def test_a_pinned_tokenizer_whose_reserved_tokens_are_not_special_is_refused(data_project: Project, case: str,
                                                                             token: str) -> None:
    from tokenizers import Tokenizer

    data = _pinned_spec(case)
    bad = Tokenizer.from_str(data.decode())
    assert bad.token_to_id(token) in bad.encode(f"hi {token}", add_special_tokens=False).ids  # the forgery it allowed
    (data_project.root / "tokenizer/forge.json").write_bytes(data)
    params = data_project.params
    params["tokenize"]["pretrained"] = {"path": "tokenizer/forge.json", "sha256": hashlib.sha256(data).hexdigest()}
    data_project.write_params(params)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.tokenize"), 1, f"tokenize.pretrained.path: tokenizer/forge.json: "
            f"{token!r} is a token but not a special added token", "a forged turn or document end", "(refused)")
    assert data_project.ledger_files() == before  # refused before any run started
    ledger_kept(data_project, before)


def test_forgeable_names_a_token_merges_reach_and_passes_a_trained_tokenizer() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.WordLevel({tk.EOS: 0, "hi": 1, "[UNK]": 2}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens([tk.EOS])  # special, yet the model's own vocabulary maps the word to it
    assert chat.forgeable(t, [tk.EOS]) == (tk.EOS, "encodes from plain text to its own id")
    trained = tk.train_tokenizer(TEXTS, TokenizeParams(vocab_size=300, min_frequency=1, shard_max_tokens=1000))
    assert chat.forgeable(trained, [tk.EOS, *chat.CHAT_TOKENS]) is None


# -- H2. the instructions stage: a total, and rows streamed to the file ------------------------------

def _many_lines_gz(path: Path, total: int) -> Path:
    """``total`` bytes of small valid conversations, as concatenated gzip members of 1 MiB (one
    stream to a reader) at ~160:1, under the 200x ratio: compressed once, written many times."""
    rng = random.Random(7)
    block = (conversation(0) + b"\n") * ((1 << 20) // 110)
    noise = json.dumps({"messages": [{"role": "user", "content": rng.randbytes(3500).hex()},
                                     {"role": "assistant", "content": "ok"}]}).encode() + b"\n"
    member = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = member.compress(block + noise) + member.flush()
    with open(path, "wb") as f:
        for _ in range(total // (len(block) + len(noise))):
            f.write(member)
    return path


def test_your_own_conversations_over_the_sft_cap_are_refused_unparsed(tmp_path: Path, data_project: Project) -> None:
    src = _many_lines_gz(tmp_path / "many.jsonl.gz", 4 << 30)
    assert 16 << 20 < src.stat().st_size < 32 << 20 and (4 << 30) / src.stat().st_size < 200
    with_messages(data_project, src)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.instructions"), 1, "fetch.sources[chat]:", "many.jsonl.gz: your own "
            "conversations (format: messages) decompress to over 1,073,741,824 bytes, the cap for a conversations "
            "file sft reads", "refusing them unparsed")
    assert not (data_project.root / "data/instructions").exists()
    assert data_project.runs("instructions")[-1][-1]["body"]["status"] == "failed"
    ledger_kept(data_project, before)


def test_a_conversation_over_the_line_sft_reads_is_refused_naming_it(tmp_path: Path, data_project: Project) -> None:
    src = tmp_path / "long.jsonl"
    big = json.dumps({"messages": [{"role": "user", "content": "word " * (400 << 10)},
                                   {"role": "assistant", "content": "ok"}]}).encode()  # 2 MB: under curate's 16 MiB
    src.write_bytes(b"\n".join([conversation(0), big, conversation(1)]) + b"\n")
    with_messages(data_project, src)
    before = data_project.ledger_files()
    refused(run(data_project, "-m", "pipeline.instructions"), 1, "data/instructions/train.jsonl: example ",
            "(chat long.jsonl:2) is 2,", "over the 1,048,576-byte cap for one line of a conversations file")
    ledger_kept(data_project, before)


# -- H5. Parquet: the footer's sizes checked before a page is decoded ---------------------------------

def _parquet_bomb(path: Path, groups: int, group_bytes: int) -> Path:
    """A zstd Parquet file of ``groups`` row groups, each ``group_bytes`` of one text value
    repeated (dictionary off: the footer says what Arrow would build), written group by group."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    value, rows = b"word " * (13 << 10), group_bytes // (65 << 10)  # 65 KiB values: under curate's cap
    data = pa.py_buffer(value * rows)
    offsets = pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * len(value))
    table = pa.table({"text": pa.StringArray.from_buffers(rows, offsets, data)})
    with pq.ParquetWriter(path, table.schema, compression="zstd", use_dictionary=False) as w:
        for _ in range(groups):
            w.write_table(table, row_group_size=rows)
    return path


@pytest.mark.parametrize("groups, group_mib, words", [
    (32, 128, "row group 0 (text) takes the file to 134,"),  # 4 GiB in all, each group under the cap
    (1, 320, "row group 0 (text) declares 335,"),  # one group over the cap
])
def test_a_parquet_bomb_is_refused_from_its_footer(tmp_path: Path, corpus: Path, groups: int, group_mib: int,
                                                   words: str) -> None:
    src = _parquet_bomb(tmp_path / "bomb.parquet", groups, group_mib << 20)
    assert src.stat().st_size < 8 << 20
    proj = on_file(tmp_path, corpus, src, fmt="parquet")
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "bomb.parquet: member 'bomb.parquet' " + words,
            "refusing the file unread")
    ledger_kept(proj, before)


# -- M7. archives: a total over all members, and a member count -------------------------------------

def _zip_of_zeros(path: Path, members: int, size: int) -> Path:
    """A zip of ``members`` entries of ``size`` zero bytes, deflated once and written by hand."""
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    data = z.compress(bytes(size)) + z.flush()
    crc, central, at = zlib.crc32(bytes(size)), [], 0
    with open(path, "wb") as f:
        for i in range(members):
            name = f"m{i:05d}.bin".encode()
            head = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 33, crc, len(data), size, len(name), 0)
            central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 33, crc, len(data), size,
                                       len(name), 0, 0, 0, 0, 0, at) + name)
            f.write(head + name + data)
            at += len(head) + len(name) + len(data)
        cd = b"".join(central)
        f.write(cd + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, members, members, len(cd), at, 0))
    return path


def test_a_zip_of_many_members_each_under_the_ratio_floor_is_refused(tmp_path: Path, corpus: Path) -> None:
    src = _zip_of_zeros(tmp_path / "zeros.zip", 10_000, 1 << 20)  # 10 GiB from ~10 MB
    assert src.stat().st_size < 12 << 20
    proj = on_file(tmp_path, corpus, src, fmt="text")
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "zeros.zip: members expand to 10,485,760,000 bytes in all, "
            "over 200x its", "refusing the archive (nothing was extracted)")
    ledger_kept(proj, before)


def test_a_tar_xz_flood_of_empty_headers_is_refused_at_the_member_cap(tmp_path: Path, corpus: Path) -> None:
    from marin.data import bounds

    src, rng = tmp_path / "flood.tar.xz", random.Random(3)
    with lzma.open(src, "wb", preset=0) as f:  # random names: ~20:1, under the ratio
        for _ in range(bounds.MAX_MEMBERS + 20_000):
            info = tarfile.TarInfo(f"{rng.getrandbits(64):016x}.txt")
            info.mtime = rng.getrandbits(30)
            f.write(info.tobuf(tarfile.USTAR_FORMAT))
        f.write(bytes(1024))
    proj = on_file(tmp_path, corpus, src, fmt="text")
    before = proj.ledger_files()
    refused(run(proj, "-m", "pipeline.curate"), 1, "flood.tar.xz: has over 100,000 members",
            "refusing the archive (nothing was extracted)")
    ledger_kept(proj, before)


def test_an_archive_under_the_bounds_is_still_read(tmp_path: Path) -> None:
    from marin.data import archive

    src = _zip_of_zeros(tmp_path / "ok.zip", 10, 1 << 16)  # 640 KiB in all: under the 1 MiB floor
    got = list(archive.members(src, ("*.bin",)))
    assert [n for n, _ in got][:2] == ["m00000.bin", "m00001.bin"] and got[0][1] == bytes(1 << 16)
