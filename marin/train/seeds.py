"""Every random stream is derived from the one root seed by name.

    key(name) = jax.random.fold_in(jax.random.key(root), uint32(sha256(name)[:4]))

The derivation and every derived key are recorded in ``run.started``.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marin.ledger.bodies import Seeds


STREAMS = ("init", "data_order", "step", "sampling")
DERIVATION = "jax.random.fold_in(jax.random.key(root), int.from_bytes(sha256(name)[:4], 'big'))"


def stream_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def key(root: int, name: str) -> Any:
    import jax

    return jax.random.fold_in(jax.random.key(root), stream_id(name))


def key_bytes(root: int, name: str) -> bytes:
    """The raw key data of a stream, for the pure-Python parts (the loader's permutation)."""
    import jax
    import numpy as np

    return np.asarray(jax.random.key_data(key(root, name)), dtype=np.uint32).tobytes()


def record(root: int, streams: tuple[str, ...] = STREAMS) -> Seeds:
    """What run.started records about the seeds (of ``streams``)."""
    import jax
    import numpy as np

    return {
        "root": root,
        "derivation": DERIVATION,
        "prng_impl": str(jax.config.values["jax_default_prng_impl"]),
        "streams": {
            n: {"fold_in": stream_id(n),
                "key_data": np.asarray(jax.random.key_data(key(root, n))).tolist()}
            for n in streams
        },
    }
