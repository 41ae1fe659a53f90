"""RFC 6962 Merkle Tree Hash against the published reference vectors.

Vectors: google/certificate-transparency, cpp/merkletree/merkle_tree_test.cc
(kInputs / kSHA256Roots), also transparency-dev/merkle testonly/constants.go.
"""

import hashlib

import pytest

from marin.ledger.merkle import merkle_root

LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
)]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


@pytest.mark.parametrize("n", range(len(ROOTS)))
def test_reference_vectors(n: int) -> None:
    assert merkle_root(LEAVES[:n]).hex() == ROOTS[n]


def test_root_depends_on_order_and_every_leaf() -> None:
    leaves = [hashlib.sha256(bytes([i])).digest() for i in range(13)]
    root = merkle_root(leaves)
    assert merkle_root(leaves[::-1]) != root
    assert merkle_root(leaves[:-1]) != root
    tampered = list(leaves)
    tampered[6] = bytes(32)
    assert merkle_root(tampered) != root


@pytest.mark.parametrize("n", range(len(ROOTS)))
def test_incremental_builder_matches_the_reference_vectors(n: int) -> None:
    from marin.ledger.merkle import Builder

    b = Builder()
    for leaf in LEAVES[:n]:
        b.append(leaf)
    assert b.root().hex() == ROOTS[n] and b.size == n


def test_incremental_builder_equals_the_recursive_root_at_every_size_and_resumes() -> None:
    from marin.ledger.merkle import Builder

    leaves = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(300)]
    b = Builder()
    for i, leaf in enumerate(leaves):
        assert b.root() == merkle_root(leaves[:i])
        b = Builder.from_state(b.state()) if i % 7 == 0 else b  # a stored compact range resumes exactly
        b.append(leaf)
    assert b.root() == merkle_root(leaves)
