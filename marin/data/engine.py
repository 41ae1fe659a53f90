"""Where the data stages' per-shard work runs: in this process, a local process pool, or Ray.

    engine = Engine.from_params(params)            # runtime.data: engine, workers
    for result in engine.map(fn, items):           # results in the order of ``items``
        ...

``fn`` is a module-level function of one picklable item; results come back in input order
whatever finishes first, and at most ``2 × workers`` items are in flight, so memory is bounded
by a few shards, not by the corpus. Global steps (dedup across shards, the split, the
tokenizer's training sample) are reduce steps the caller runs on the ordered results. Which
engine ran, and with how many workers, is recorded in ``run.started.execution`` but is not
part of the recipe: outputs are bit-identical for any engine and worker count (tested).

- ``local``, 1 worker (the default): a plain loop, nothing to start.
- ``local``, N workers: a pool of N spawned processes.
- ``ray``: Ray tasks, on a cluster named by ``RAY_ADDRESS`` or on a local Ray started
  here with N CPUs (``ray.init`` takes seconds: worth it only for large corpora). Tasks carry
  bytes, never paths, so the nodes need no shared filesystem (``marin.data.rayengine``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
KINDS = ("local", "ray")


@dataclass(frozen=True)
class Engine:
    kind: str = "local"
    workers: int = 1

    @classmethod
    def from_params(cls, params: Any) -> Engine:
        data = getattr(params.runtime, "data", None)
        return cls(data.engine, data.workers) if data is not None else cls()

    def describe(self) -> dict[str, Any]:
        """What ``run.started.execution`` records (not part of the recipe)."""
        out: dict[str, Any] = {"engine": self.kind, "workers": self.workers}
        if self.kind == "ray" and os.environ.get("RAY_ADDRESS"):
            out["ray_address"] = os.environ["RAY_ADDRESS"]
        return out

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``fn`` over ``items``, results in input order, at most 2 × workers in flight."""
        if self.kind == "ray":
            from marin.data.rayengine import ray_map

            return ray_map(fn, items, self.workers)
        if self.workers == 1:
            return map(fn, items)
        return _pool_map(fn, items, self.workers)


def _windowed(submit: Callable[[T], Any], result: Callable[[Any], R], items: Iterable[T], window: int) -> Iterator[R]:
    pending: deque[Any] = deque()
    for item in items:
        pending.append(submit(item))
        if len(pending) >= window:
            yield result(pending.popleft())
    while pending:
        yield result(pending.popleft())


def _pool_map(fn: Callable[[T], R], items: Iterable[T], workers: int) -> Iterator[R]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: a forked Arrow or tokenizers thread pool can deadlock the child
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from _windowed(lambda x: pool.submit(fn, x), lambda f: f.result(), items, 2 * workers)
