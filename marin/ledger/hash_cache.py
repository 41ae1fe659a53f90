"""File hashes (sha256, md5, size), read once and kept in the ledger index by (device, inode, size,
mtime, ctime): a file hashed in a stage's temporary folder is not read again once renamed into place."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from marin import hashing
from marin.ledger.index import Index, stat_key


def file_hashes(idx: Index, path: Path, rehash: bool = False) -> tuple[str, str, int]:
    """(sha256, md5, size) of a file, read once for both; reused while its inode is unchanged,
    so a file hashed in a stage's temporary directory is not read again once renamed into place."""
    st = os.stat(path)
    key = f"{st.st_dev}:{st.st_ino}"
    if not rehash:
        r = idx.db.execute("SELECT size, mtime_ns, ctime_ns, ino, sha256, md5 FROM hashes WHERE path=?",
                            (key,)).fetchone()
        if r is not None and tuple(r[:4]) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino):
            return r[4], r[5], st.st_size
    sha, md5, size = hashing.file_digests(path)
    if os.stat(path).st_mtime_ns == st.st_mtime_ns:  # not being written while we read it
        with idx.writing():
            idx.db.execute("INSERT OR REPLACE INTO hashes VALUES (?,?,?,?,?,?,?)", (key, *stat_key(st), sha, md5))
    return sha, md5, size


class HashCache:
    """:func:`file_hashes` of the project's index, called as a :data:`marin.hashing.FileHashes`: the command's
    index (``index``), else the project's, opened here and closed by :meth:`close` or at the end of a ``with``
    block (a closed cache hashes directly); plain hashing where no index can be kept."""

    def __init__(self, root: Path, rehash: bool = False, index: Index | None = None):
        self.rehash, self._owned = rehash, index is None
        try:
            self._index: Index | None = index or Index.open(root, refresh=False)
        except (OSError, sqlite3.Error):
            self._index = None

    def __call__(self, path: Path) -> tuple[str, str, int]:
        if self._index is None:
            return hashing.file_digests(path)
        try:
            return file_hashes(self._index, path, self.rehash)
        except sqlite3.Error:  # a locked or failing index never fails a command: hash directly
            return hashing.file_digests(path)

    def close(self) -> None:
        """Close the index this cache opened (not the command's)."""
        if self._owned and self._index is not None:
            self._index.close()
        self._index = None

    def __enter__(self) -> HashCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
