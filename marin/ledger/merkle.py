"""RFC 6962 (RFC 9162, section 2.1.1) Merkle Tree Hash over a list of leaves."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]): the empty tree hashes to sha256(""), a leaf to sha256(0x00 || d), and
    an inner node to sha256(0x01 || MTH(D[0:k]) || MTH(D[k:n])) with k the largest power
    of two smaller than n."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return _leaf(leaves[0])
    k = 1 << ((n - 1).bit_length() - 1)
    return _node(merkle_root(leaves[:k]), merkle_root(leaves[k:]))
