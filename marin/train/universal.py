"""The ``universal`` determinism profile: each train (and sft) step computed in float64 from the float32
state, rounded to float32 where the step's results are kept, and the rare rounding decisions that another
machine could take the other way written to a rounding log that a replay follows (docs/determinism.md,
"Universal bits").

Two CPUs (x86-64 and aarch64, or two x86 CPUs of other features) compute a float64 step with other
summation orders and FMA contractions: their float64 results differ by a float64 rounding or a few of the
largest terms that made each value, far below a float32 ulp of those terms. A value is *near* when it lies
within ``tau`` float32 ulps of its *scale* (that largest term) from a float32 rounding midpoint
(:func:`marin.train.rounding.scaled_distance`); every near value is logged as (step, tensor, flat index,
direction). A step rounds twice: the gradient (its scale: the tensor's largest value, since a weight
gradient sums many terms and may cancel to almost nothing), then, from that float32 gradient, the
optimizer's new parameters and moments (:mod:`marin.train.adamw64`: their scales are AdamW's terms per
element, and the first moment is exact). The step's clip factor and learning rate are rounded the same way
(``scalar.clip``, ``scalar.lr``).
A replay rounds the logged positions as logged and everything else itself, and stops, naming step, tensor,
index and distance, at an unlogged value within ``tau / 4`` or a logged one beyond ``4 tau``: an honest
pair of machines, differing by less than ``tau / 2`` of a scale, never meets either. The metrics (loss,
lr, gradient norm, accuracy, validation loss) are rounded the same way, as tensors ``metric.<name>``.

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

from marin.config import TrainParams
from marin.ledger.bodies import RoundingSummary
from marin.train import adamw64, rounding, rounding_log
from marin.train.rounding_log import Log, RoundingError
from marin.train.step import Batch, ModelParams, TrainState, batch_sharding, loss_fn, lr_schedule

METRIC = "metric."  # the tensor name of a rounded metric: metric.loss, metric.val_loss, ...
GRAD = rounding_log.GRAD  # the gradient's tensors, rounded before the optimizer uses them
SCALAR = "scalar."  # the step's clip factor and learning rate, rounded before the optimizer uses them
UNLOGGED, LOGGED = 0.25, 4.0  # a replay's windows, in tau: an unlogged value nearer stops it, a logged one farther


def widen(tree: Any) -> Any:
    """Every floating leaf as float64 (exact); integers and keys as they are."""
    return jax.tree.map(lambda a: a.astype(jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def round_tree(tree: Any, t: float, scales: Any = None) -> tuple[Any, list[tuple[jax.Array, ...]]]:
    """(every float64 leaf rounded to nearest even float32; per leaf (the count of its near values, where
    they are, its largest finite magnitude): near is within ``t`` of a midpoint in ulps of the scale, per
    element from ``scales`` (a tree like ``tree``) or else that largest magnitude); other leaves as they
    are, with a count of 0. Pure: runs inside jit."""
    leaves, treedef = jax.tree.flatten(tree)
    scale_leaves = jax.tree.leaves(scales) if scales is not None else [None] * len(leaves)
    out, near = [], []
    for a, sc in zip(leaves, scale_leaves, strict=True):
        if a.dtype != jnp.float64:
            out.append(a)
            near.append((jnp.zeros((), jnp.int32), jnp.zeros((0,), jnp.bool_), jnp.zeros((), jnp.float64)))
            continue
        lo, own, _ = rounding.decompose(a)
        out.append(jax.lax.bitcast_convert_type(lo + rounding.nearest_even_direction(own, lo), jnp.float32))
        largest = jnp.max(jnp.abs(jnp.where(jnp.isfinite(a), a, 0.0))) if a.size else jnp.zeros((), jnp.float64)
        mask = (jnp.abs(rounding.scaled_distance(a, largest if sc is None else sc)) <= t) & (a != 0)
        near.append((jnp.sum(mask, dtype=jnp.int32), mask, largest))
    return jax.tree.unflatten(treedef, out), near


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
        # a replay's logged directions that are not its own nearest even: on the recorder's machine, changed entries
        self.against: list[tuple[int, str, int, int]] = []

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

    def round(self, step: int, tensor: str, x: Any, near: int = -1, scale: Any = None) -> np.ndarray | None:
        """``x`` (float64) rounded to float32 with the log, as a flat host array; None when nearest-even
        everywhere is the answer (``near``: the count of near values, already known; -1: unknown).
        ``scale``: per element (or one), else the tensor's largest value (:func:`round_tree`)."""
        self._at(step)
        logged = (self.recorded or {}).get(step, {}).get(tensor, {})
        if logged:
            self.used.add(tensor)
        if near == 0 and not logged:
            return None
        flat = np.asarray(x, np.float64).reshape(-1)
        sc = None if scale is None else np.asarray(scale, np.float64).reshape(-1)
        lo, own, _ = rounding.decompose(flat)
        dist = rounding.scaled_distance(flat, sc)
        if self.recorded is None:
            index = np.flatnonzero(rounding.near_scaled(flat, self.tau, sc))
            direction = rounding.nearest_even_direction(own[index], lo[index])
        else:
            self._check(step, tensor, flat, dist, logged)
            index = np.array(sorted(logged), np.int64)
            direction = np.array([logged[int(i)] for i in index], np.uint32)
            nearest = rounding.nearest_even_direction(own[index], lo[index])
            self.against += [(step, tensor, int(i), int(d)) for i, d, r in zip(index, direction, nearest, strict=True)
                             if d != r]
        self._write(step, tensor, index, direction)
        if self.recorded is None and near == -1 and not len(index):
            return None
        return rounding.round_with(flat, index, direction)

    def logged(self, step: int, tensor: str) -> bool:
        """Whether the recorded log (a replay) has entries for ``tensor`` at ``step``."""
        return bool((self.recorded or {}).get(step, {}).get(tensor))

    def decide(self, step: int, tensor: str, index: np.ndarray, dist: np.ndarray, nearest: np.ndarray,
               lookup: Callable[[list[int]], tuple[np.ndarray, np.ndarray]]) -> list[tuple[int, int]]:
        """The log's part for a leaf whose near values the step listed (``index``, their scaled ``dist``
        and ``nearest``-even directions): recording writes them and changes nothing; a replay checks them
        and the logged entries (``lookup``: distances and nearest-even directions at other indices) and
        returns the (index, direction) its log sets against nearest even."""
        self._at(step)
        logged = (self.recorded or {}).get(step, {}).get(tensor, {})
        if logged:
            self.used.add(tensor)
        if self.recorded is None:
            self._write(step, tensor, index, nearest)
            return []
        at = {int(i): (float(d), int(r)) for i, d, r in zip(index, dist, nearest, strict=True)}
        other = sorted(i for i in logged if i not in at)
        if other:
            d, r = lookup(other)
            at.update({i: (float(dd), int(rr)) for i, dd, rr in zip(other, d, r, strict=True)})
        unlogged = [i for i in sorted(at) if abs(at[i][0]) <= self.tau * UNLOGGED and i not in logged]
        if unlogged:
            self._unlogged(step, tensor, unlogged[0], at[unlogged[0]][0])
        far = [i for i in sorted(logged) if abs(at[i][0]) > self.tau * LOGGED]
        if far:
            self._far(step, tensor, far[0], logged[far[0]], at[far[0]][0])
        index = np.array(sorted(logged), np.int64)
        self._write(step, tensor, index, np.array([logged[int(i)] for i in index], np.uint32))
        changes = [(i, d) for i, d in sorted(logged.items()) if d != at[i][1]]
        self.against += [(step, tensor, i, d) for i, d in changes]
        return changes

    def _unlogged(self, step: int, tensor: str, i: int, dist: float) -> None:
        raise RoundingError(f"step {step} tensor {tensor} index {i}: the value lies {dist:+.3g} float32 ulp "
                            f"(of its scale) from a float32 rounding midpoint, within tau/{1 / UNLOGGED:g} "
                            f"({self.tau * UNLOGGED:.3g}), and the recorded rounding log has no direction for "
                            "it (recorded with a smaller tau, or an entry was removed)")

    def _far(self, step: int, tensor: str, i: int, direction: int, dist: float) -> None:
        where = "is not in" if np.isnan(dist) else f"lies {dist:+.3g} float32 ulp (of its scale) from"
        raise RoundingError(f"step {step} tensor {tensor} index {i}: the recorded rounding log gives direction "
                            f"{direction}, but the value {where} a float32 rounding midpoint, beyond "
                            f"{LOGGED:g} tau ({self.tau * LOGGED:.3g}): the log does not belong to this computation")

    def _check(self, step: int, tensor: str, x: np.ndarray, dist: np.ndarray, logged: dict[int, int]) -> None:
        """A replay: no unlogged value within tau / 4 of a midpoint, no logged one beyond 4 tau (in ulps of
        the scale): the recorder's and this machine's values then differ by more than tau / 2 of a scale."""
        unlogged = [int(i) for i in np.flatnonzero((np.abs(dist) <= self.tau * UNLOGGED) & (x != 0))
                    if int(i) not in logged]
        if unlogged:
            self._unlogged(step, tensor, unlogged[0], float(dist[unlogged[0]]))
        far = sorted(i for i in logged if i >= len(dist) or abs(dist[i]) > self.tau * LOGGED)
        if far:
            i = far[0]
            self._far(step, tensor, i, logged[i], float(dist[i]) if i < len(dist) else float("nan"))

    def values(self, step: int, raw: dict[str, float], prefix: str = METRIC) -> dict[str, float]:
        """Scalars (float64) rounded to float32 with the log, each as the tensor ``<prefix><name>``
        (metrics: ``metric.loss``, ...; the step's own: ``scalar.clip``, ``scalar.lr``)."""
        out = {}
        for name, v in raw.items():
            x = np.array([v], np.float64)
            r = self.round(step, prefix + name, x)
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
    """The float64 step as two jitted halves with the log applied on the host between and after them: the
    gradient (rounded to float32), then the optimizer from it (the new state rounded). Called as a
    PacedStep is, ``(state, batch) -> (state, metrics)``; ``keep``: the last step's float64 gradient, state
    and the state's error scales stay in ``self.kept`` (benchmarks/universal_bits.py)."""

    def __init__(self, grad: Any, update: Any, log: RoundingLog, tp: TrainParams, keep: bool = False):
        self.grad, self.update, self.log, self.tp, self.keep = grad, update, log, tp, keep
        self.schedule = lr_schedule(tp)
        self.kept: tuple[Any, Any, Any] | None = None

    def lower(self, *args: Any) -> Any:
        return self.grad.lower(*args)

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, Any]]:
        i = int(state.step)
        step = i + 1  # the state after this step: the log's step, as checkpoints count
        g32, near, g64, metrics = self.grad(state, batch)
        g32 = apply_log(self.log, step, GRAD, g32, near, g64)
        # the clip factor and the learning rate from a sum and a cosine: float32 through the log
        norm = float(np.sqrt(sum(float(np.dot(g, g)) for g in (np.asarray(x, np.float64).reshape(-1)
                                                                 for x in jax.tree.leaves(g32)))))
        scalars = self.log.values(step, {"clip": min(1.0, self.tp.grad_clip / max(norm, 1e-300)),
                                         "lr": float(np.asarray(self.schedule(i)))}, prefix=SCALAR)
        rounded, near, new64, scales = self.update(state, g32, np.float64(scalars["clip"]),
                                                   np.float64(scalars["lr"]))
        new = apply_log(self.log, step, "", rounded, near, new64, scales)
        if self.keep:
            self.kept = (g64, new64, scales)
        return new, {**metrics, "grad_norm": np.float64(norm)}



def apply_log(log: RoundingLog, step: int, prefix: str, rounded: Any, near: list[tuple[jax.Array, ...]], wide: Any,
              scales: Any = None) -> Any:
    """``rounded`` (:func:`round_tree`'s tree of ``wide``) with the log's part, each leaf the tensor
    ``prefix`` + its path: recording only writes the near values; a replay changes the leaves whose logged
    directions are not nearest even. Only the near values (and a replay's logged ones) are read on the
    host, and the masks of the leaves that have any."""
    counts = jax.device_get([(n, largest) for n, _, largest in near])
    paths, treedef = jax.tree_util.tree_flatten_with_path(rounded)
    scale_leaves = jax.tree.leaves(scales) if scales is not None else [None] * len(paths)
    out = []
    for (path, leaf), w, sc, (n, largest), (_, mask, _) in zip(paths, jax.tree.leaves(wide), scale_leaves,
                                                               counts, near, strict=True):
        name = prefix + jax.tree_util.keystr(path)
        if w.dtype != jnp.float64 or (int(n) == 0 and not log.logged(step, name)):
            out.append(leaf)
            continue
        index = np.flatnonzero(np.asarray(mask).reshape(-1)) if int(n) else np.zeros(0, np.int64)
        read = _reader(w, sc, float(largest))
        dist, nearest = read([int(i) for i in index])
        changes = log.decide(step, name, index, dist, nearest, read)
        if not changes:
            out.append(leaf)
            continue
        lo = rounding.decompose(np.asarray(w, np.float64).reshape(-1)[[i for i, _ in changes]])[0]
        fixed = np.array(leaf).reshape(-1)
        fixed.view(np.uint32)[[i for i, _ in changes]] = lo + np.array([d for _, d in changes], np.uint32)
        out.append(jax.device_put(fixed.reshape(leaf.shape), leaf.sharding))
    return jax.tree.unflatten(treedef, out)


def _reader(wide: Any, scale: Any, largest: float) -> Callable[[list[int]], tuple[np.ndarray, np.ndarray]]:
    """(scaled distances, nearest-even directions) of a float64 leaf at flat indices (NaN for an index
    outside it), computed on the host for those values only (scale: per element, else ``largest``)."""
    flat = np.asarray(wide, np.float64).reshape(-1)
    per = None if scale is None else np.asarray(scale, np.float64).reshape(-1)

    def read(indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
        inside = np.array([i < flat.size for i in indices], bool)
        pos = np.array([i if i < flat.size else 0 for i in indices], np.int64)
        x = flat[pos]
        lo, own, _ = rounding.decompose(x)
        dist = rounding.scaled_distance(x, largest if per is None else per[pos])
        return np.where(inside, dist, np.nan), rounding.nearest_even_direction(own, lo)

    return read


def make_step(graphdef: nnx.GraphDef, tp: TrainParams, shardings: Any, mesh: jax.sharding.Mesh, log: RoundingLog,
              keep: bool = False) -> UniversalStep:
    """The universal train step over the float32 ``TrainState`` of ``make_optimizer(tp)``: ``graphdef``
    computes in float64, the optimizer is :mod:`marin.train.adamw64`."""
    def grad64(state: TrainState, batch: Batch) -> tuple[Any, ...]:
        params = widen(state.params)
        if "weights" in batch:
            batch = {**batch, "weights": batch["weights"].astype(jnp.float64)}

        def loss_of(p: ModelParams) -> tuple[jax.Array, dict[str, jax.Array]]:
            return loss_fn(nnx.merge(graphdef, p), batch)

        (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        rounded, near = round_tree(grads, log.tau)  # the gradient's scale: each tensor's largest value
        return rounded, near, grads, {"loss": loss, **aux}

    def update64(state: TrainState, g32: ModelParams, clip: jax.Array, lr: jax.Array) -> tuple[Any, ...]:
        res = adamw64.update(widen(state.opt_state), g32, widen(state.params), clip, lr, tp)
        new = state._replace(params=res.params, opt_state=res.opt_state, step=state.step + 1)
        scales = new._replace(params=res.scales[0], opt_state=res.scales[1])
        rounded, near = round_tree(new, log.tau, scales)
        return rounded, near, new, scales

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return UniversalStep(
        jax.jit(grad64, in_shardings=(shardings, batch_sharding(mesh)),
                out_shardings=(shardings.params, replicated, shardings.params, replicated)),
        jax.jit(update64, in_shardings=(shardings, shardings.params, replicated, replicated),
                out_shardings=(shardings, replicated, shardings, shardings)), log, tp, keep)


def eval_nll_fn(graphdef: nnx.GraphDef) -> Callable[[ModelParams, Any, Any], jax.Array]:
    """Jitted per-token negative log-likelihood (B, T) in float64 of float32 params (``graphdef``
    computes in float64)."""
    @jax.jit
    def nll(params: ModelParams, inputs: Any, targets: Any) -> jax.Array:
        logits = nnx.merge(graphdef, widen(params))(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets)

    return nll
