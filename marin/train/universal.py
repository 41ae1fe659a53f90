"""The ``universal`` determinism profile: each train (and sft) step computed in float64 from the float32
state, the new state rounded to float32, and the rare rounding decisions that another machine could take
the other way written to a rounding log that a replay follows (docs/determinism.md, "Universal bits").

Two CPUs (x86-64 and aarch64, or two x86 CPUs of other features) compute a float64 step with other
summation orders and FMA contractions: their float64 results differ in the last bits, far below a float32
ulp. Rounded to float32 they agree, unless a value lies within those bits of a float32 rounding
midpoint. Every value within ``tau`` float32 ulps of one (:mod:`marin.train.rounding`) is logged as
(step, tensor, flat index, direction); a replay rounds those positions as logged and everything else
itself, and stops, naming step, tensor, index and distance, at a value within ``tau`` the log does not
have or a logged position that is not within ``tau``. The metrics (loss, lr, gradient norm, accuracy,
validation loss) are rounded the same way, as tensors ``metric.<name>``.

The log is a JSON-lines file beside the run's checkpoints (``checkpoints/<run>/rounding.jsonl``),
appended step by step and cut back to the checkpoint a resumed run starts from; every metric record
carries the entries per step since the previous one and the digest of the log through its step, and
the released model folder holds the whole log.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from marin.ledger.bodies import RoundingSummary
from marin.train import rounding, rounding_log
from marin.train.rounding_log import Log, RoundingError
from marin.train.step import Batch, ModelParams, TrainState, batch_sharding, loss_fn

METRIC = "metric."  # the tensor name of a rounded metric: metric.loss, metric.val_loss, ...


def widen(tree: Any) -> Any:
    """Every floating leaf as float64 (exact); integers and keys as they are."""
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def round_tree(tree: Any, t: float) -> tuple[Any, list[jax.Array]]:
    """(every float64 leaf rounded to nearest even float32, per leaf the count of values within ``t``
    of a midpoint); other leaves as they are, with a count of 0. Pure: runs inside jit."""
    leaves, treedef = jax.tree.flatten(tree)
    out, counts = [], []
    for a in leaves:
        if a.dtype != jnp.float64:
            out.append(a)
            counts.append(jnp.zeros((), jnp.int32))
            continue
        lo, dist, _ = rounding.decompose(a)
        d = rounding.nearest_even_direction(dist, lo)
        out.append(jax.lax.bitcast_convert_type(lo + d, jnp.float32))
        counts.append(jnp.sum(jnp.abs(dist) <= t, dtype=jnp.int32))
    return jax.tree.unflatten(treedef, out), counts


class RoundingLog:
    """The run's rounding decisions. Recording: each near-midpoint value's nearest-even direction is
    logged. Replaying (``recorded``): the logged directions are used and checked (module docstring)."""

    def __init__(self, t: float, recorded: Log | None = None):
        self.tau, self.recorded = t, recorded
        self.counts: dict[int, int] = {}  # entries per step, through the latest step written
        self.hasher = hashlib.sha256(rounding_log.header())
        self.file: Any = None
        self.path: Path | None = None
        self.step = 0  # the step whose entries are being written
        self.used: set[str] = set()  # the recorded tensors of ``step`` met so far (a replay)

    @classmethod
    def from_env(cls) -> RoundingLog:
        """This run's log: recording, or replaying the log ``MARIN_ROUNDING_LOG`` names."""
        replay = os.environ.get(rounding_log.REPLAY_VAR)
        return cls(rounding_log.tau(), rounding_log.read(Path(replay)) if replay else None)

    def open(self, path: Path | None, start: int) -> None:
        """Write to ``path`` (None: count and digest only), keeping what it holds through step ``start``
        (a resumed run's checkpoint: those entries were made durable before the checkpoint was recorded)
        and dropping the rest, which the resumed run computes again (a line cut short by a kill included)."""
        self.path, self.step, self.counts = path, start, {}
        self.used = set((self.recorded or {}).get(start, {}))  # the steps before ``start`` are not this run's
        kept: list[bytes] = []
        if path is not None and path.is_file() and start > 0:
            for step, tensor, index, direction in rounding_log.entries(path, partial=True):
                if step <= start:
                    kept.append(rounding_log.entry(step, tensor, index, direction))
                    self.counts[step] = self.counts.get(step, 0) + 1
        data = rounding_log.header() + b"".join(kept)
        self.hasher = hashlib.sha256(data)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            self.file = open(path, "ab")  # noqa: SIM115 (open for the run, closed by close())

    def _at(self, step: int) -> None:
        """Entries of ``step`` begin: a replay checks that the previous step used all its logged ones."""
        if step == self.step:
            return
        self._check_used()
        self.step, self.used = step, set()

    def _check_used(self) -> None:
        if self.recorded is None:
            return
        left = sorted(set(self.recorded.get(self.step, {})) - self.used)
        if left:
            first = left[0]
            i = min(self.recorded[self.step][first])
            raise RoundingError(f"step {self.step} tensor {first} index {i}: the recorded rounding log has an entry "
                                "for a value this run does not compute: the log is not this run's")

    def _write(self, step: int, tensor: str, index: np.ndarray, direction: np.ndarray) -> None:
        data = b"".join(rounding_log.entry(step, tensor, int(i), int(d))
                        for i, d in zip(index, direction, strict=True))
        if not data:
            return
        self.hasher.update(data)
        self.counts[step] = self.counts.get(step, 0) + len(index)
        if self.file is not None:
            self.file.write(data)

    def round(self, step: int, tensor: str, x: Any, near: int = -1) -> np.ndarray | None:
        """``x`` (float64) rounded to float32 with the log, as a flat host array; None when nearest-even
        everywhere is the answer (``near``: the count of near values, already known; -1: unknown)."""
        self._at(step)
        logged = (self.recorded or {}).get(step, {}).get(tensor, {})
        if logged:
            self.used.add(tensor)
        if near == 0 and not logged:
            return None
        flat = np.asarray(x, np.float64).reshape(-1)
        lo, dist, _ = rounding.decompose(flat)
        index = np.flatnonzero(np.abs(dist) <= self.tau)
        if self.recorded is None:
            direction = rounding.nearest_even_direction(dist[index], lo[index])
        else:
            self._check(step, tensor, index, dist, logged)
            index = np.array(sorted(logged), np.int64)
            direction = np.array([logged[int(i)] for i in index], np.uint32)
        self._write(step, tensor, index, direction)
        if self.recorded is None and near == -1 and not len(index):
            return None
        return rounding.round_with(flat, index, direction)

    def _check(self, step: int, tensor: str, near: np.ndarray, dist: np.ndarray, logged: dict[int, int]) -> None:
        unlogged = [int(i) for i in near if int(i) not in logged]
        if unlogged:
            i = unlogged[0]
            raise RoundingError(f"step {step} tensor {tensor} index {i}: the value lies {dist[i]:+.3g} float32 ulp "
                                f"from a float32 rounding midpoint, within tau {self.tau:.3g}, and the recorded "
                                "rounding log has no direction for it (recorded with a smaller tau, or an entry was "
                                "removed)")
        near_set = {int(i) for i in near}
        far = sorted(i for i in logged if i not in near_set)
        if far:
            i = far[0]
            where = f"lies {dist[i]:+.3g} float32 ulp from" if i < len(dist) else "is not in"
            raise RoundingError(f"step {step} tensor {tensor} index {i}: the recorded rounding log gives direction "
                                f"{logged[i]}, but the value {where} a float32 rounding midpoint, beyond tau "
                                f"{self.tau:.3g}: the log does not belong to this computation")

    def values(self, step: int, raw: dict[str, float]) -> dict[str, float]:
        """Metric values (float64) rounded to float32 with the log, each as the tensor ``metric.<name>``."""
        out = {}
        for name, v in raw.items():
            x = np.array([v], np.float64)
            r = self.round(step, METRIC + name, x)
            out[name] = float((r if r is not None else rounding.round_f32(x))[0])
        return out

    def end_step(self, step: int, durable: bool) -> None:
        """Step ``step`` is over (its metrics included): flush, and fsync when a checkpoint follows."""
        self._at(step)
        if self.file is not None:
            self.file.flush()
            if durable:
                os.fsync(self.file.fileno())

    def summary(self, first: int, last: int) -> RoundingSummary:
        """What a metric record of step ``last`` carries: the entries of steps ``first``..``last`` and
        the digest of the log through ``last``."""
        return {"entries": [self.counts.get(s, 0) for s in range(first, last + 1)], "from_step": first,
                "log_digest": "sha256:" + self.hasher.hexdigest()}

    def total(self) -> int:
        return sum(self.counts.values())

    def close(self) -> None:
        self._check_used()
        if self.file is not None:
            self.file.close()
            self.file = None


class UniversalStep:
    """The jitted float64 step (state -> rounded state, counts, float64 state, metrics) and the log
    applied on the host: called as a PacedStep is, ``(state, batch) -> (state, metrics)``."""

    def __init__(self, jitted: Any, log: RoundingLog):
        self.jitted, self.log = jitted, log

    def lower(self, *args: Any) -> Any:
        return self.jitted.lower(*args)

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        rounded, counts, wide, metrics = self.jitted(state, batch)
        step = int(rounded.step)  # the state after this step: the log's step, as checkpoints count
        counts = [int(c) for c in jax.device_get(counts)]
        paths, treedef = jax.tree_util.tree_flatten_with_path(rounded)
        out = []
        for (path, leaf), w, n in zip(paths, jax.tree.leaves(wide), counts, strict=True):
            fixed = self.log.round(step, jax.tree_util.keystr(path), w, n) if w.dtype == jnp.float64 else None
            out.append(leaf if fixed is None else jax.device_put(fixed.reshape(leaf.shape), leaf.sharding))
        return jax.tree.unflatten(treedef, out), metrics


def make_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, shardings: Any,
              mesh: jax.sharding.Mesh, log: RoundingLog) -> UniversalStep:
    """The universal train step over the float32 ``TrainState``: ``graphdef`` computes in float64."""
    def step64(state: TrainState, batch: Batch) -> tuple[Any, ...]:
        params, opt_state = widen(state.params), widen(state.opt_state)
        if "weights" in batch:
            batch = {**batch, "weights": batch["weights"].astype(jnp.float64)}

        def loss_of(p: ModelParams) -> tuple[jax.Array, dict[str, jax.Array]]:
            return loss_fn(nnx.merge(graphdef, p), batch)

        (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        new = state._replace(params=optax.apply_updates(params, updates), opt_state=opt_state, step=state.step + 1)
        rounded, counts = round_tree(new, log.tau)
        return rounded, counts, new, {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return UniversalStep(jax.jit(step64, in_shardings=(shardings, batch_sharding(mesh)),
                                 out_shardings=(shardings, replicated, shardings, replicated)), log)


def eval_nll_fn(graphdef: nnx.GraphDef) -> Callable[[ModelParams, Any, Any], jax.Array]:
    """Jitted per-token negative log-likelihood (B, T) in float64 of float32 params (``graphdef``
    computes in float64)."""
    @jax.jit
    def nll(params: ModelParams, inputs: Any, targets: Any) -> jax.Array:
        logits = nnx.merge(graphdef, widen(params))(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets)

    return nll
