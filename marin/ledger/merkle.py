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


class Builder:
    """RFC 6962 root maintained as leaves are appended: O(log n) state, O(1) amortized per leaf.

    The tree over n leaves is the perfect subtrees given by n's binary digits, largest first;
    its root folds them from the right: MTH = node(P1, node(P2, ... Pk)). ``state`` and
    ``from_state`` let the compact range be stored and resumed (RFC 9162's "compact range").
    """

    def __init__(self) -> None:
        self.size = 0
        self._peaks: list[tuple[int, bytes]] = []  # (leaf count, hash), sizes strictly decreasing

    def append(self, data: bytes) -> None:
        node, count = _leaf(data), 1
        while self._peaks and self._peaks[-1][0] == count:
            left = self._peaks.pop()[1]
            node, count = _node(left, node), count * 2
        self._peaks.append((count, node))
        self.size += 1

    def root(self) -> bytes:
        if not self._peaks:
            return hashlib.sha256(b"").digest()
        acc = self._peaks[-1][1]
        for _, h in reversed(self._peaks[:-1]):
            acc = _node(h, acc)
        return acc

    def state(self) -> list[list[object]]:
        return [[count, h.hex()] for count, h in self._peaks]

    @classmethod
    def from_state(cls, state: list[list[object]]) -> Builder:
        b = cls()
        b._peaks = [(int(str(c)), bytes.fromhex(str(h))) for c, h in state]
        b.size = sum(c for c, _ in b._peaks)
        return b
