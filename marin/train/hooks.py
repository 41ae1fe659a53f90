"""What happens around each training step, as hooks (Levanter's way): the step loop
(:func:`marin.train.loop.train_steps`) only steps and hands each hook a :class:`StepInfo`.

* :class:`Progress`: the bar on stderr (marin.progress);
* :class:`MetricRecorder`: the exact metrics of a log step as ledger ``metric`` records;
* :class:`LiveMetrics`: wakes the MLflow live view (marin.tracking.live) after each metric record;
* :class:`Checkpointer`: every process saves its orbax part, all digest what is on disk, and the
  primary records the ``checkpoint``.

Order matters for the ledger only: the metric record of a step comes before its checkpoint record
(:func:`standard` lists them so). A resumed run replays steps it has records of: a replayed value
must be identical (:func:`replayed`), and is not recorded again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import jax
from tqdm import tqdm

from marin import hashing, progress
from marin.errors import StageError
from marin.ledger import Run
from marin.ledger.bodies import CheckpointBody, Exact, LoaderPosition, MetricBody, RoundingSummary
from marin.tracking.live import Live
from marin.train import checkpoint, distributed, stored, weights
from marin.train.step import TrainState

CKPT = Path("checkpoints")
EXACT_METRICS = ("loss", "lr", "grad_norm", "accuracy")
Values = dict[str, Exact]  # the exact metrics of a step: loss, lr, grad_norm, accuracy, val_loss


@dataclass(frozen=True)
class StepInfo:
    """One optimizer step, done: ``step`` steps completed (1-based), the state after it, and at a
    log step its exact metrics (host-synced), the tokens per second since the last log step and, under
    the universal profile, its rounding log's summary (marin.train.universal)."""

    step: int
    state: TrainState
    values: Values | None = None
    tokens_per_s: float | None = None
    rounding: RoundingSummary | None = None


class TrainHook(Protocol):
    """Called by the step loop after every step, in registration order, and once at its end."""

    def on_step(self, info: StepInfo) -> None: ...

    def on_end(self) -> None: ...


class Progress:
    """The step bar on stderr (hidden outside the primary process, and by MARIN_PROGRESS=off)."""

    def __init__(self, stage: str, steps: int, start: int, hide: bool):
        self.bar: tqdm = progress.meter(stage, steps, "step", initial=start, hide=hide)

    def on_step(self, info: StepInfo) -> None:
        self.bar.update(1)
        if info.values is not None:
            self.bar.set_postfix(loss=f"{info.values['loss']['value']:.4f}", tok_s=f"{info.tokens_per_s:,.0f}")

    def on_end(self) -> None:
        self.bar.close()


class MetricRecorder:
    """A ledger ``metric`` record per log step (the primary process), unless a resumed run holds it."""

    def __init__(self, run: Run, recorded: dict[int, Values]):
        self.run, self.recorded = run, recorded

    def on_step(self, info: StepInfo) -> None:
        if info.values is None or info.tokens_per_s is None:
            return
        if not replayed("metric", info.step, self.recorded, info.values):
            body: MetricBody = {"step": info.step, "values": info.values,
                                "timing": {"tokens_per_s": round(info.tokens_per_s, 3)}}
            if info.rounding is not None:
                body["rounding"] = info.rounding
            self.run.record("metric", body)

    def on_end(self) -> None:
        pass


class LiveMetrics:
    """Counts log steps for the MLflow live view, which tails the ledger (marin.tracking.live)."""

    def __init__(self, live: Live):
        self.live = live

    def on_step(self, info: StepInfo) -> None:
        if info.values is not None:
            self.live.step()

    def on_end(self) -> None:
        self.live.close()


class LoaderPositions(Protocol):
    def position(self, step: int) -> LoaderPosition: ...


@dataclass
class Checkpointer:
    """At a checkpoint step every process hands over its part of the state (a collective where it is
    sharded), process 0 saves the whole state, digests what is on disk, stores it on the remote
    (``store``: MARIN_CHECKPOINT_REMOTE) and records it (``run``), unless a resumed run holds it."""

    root: Path
    run_id: str
    every: int
    last: int  # the final step: always checkpointed
    loader: LoaderPositions
    abstract: TrainState
    shardings: TrainState
    run: Run | None
    recorded: dict[int, str]
    primary: bool = True  # process 0: it saves
    store: stored.Store | None = None

    def __post_init__(self) -> None:
        self.ckpts = checkpoint.Checkpoints(self.root / CKPT / self.run_id) if self.primary else None

    def on_step(self, info: StepInfo) -> None:
        done = info.step
        if not (done % self.every == 0 or done == self.last):
            return
        state = checkpoint.host_state(info.state) if jax.process_count() > 1 else info.state  # every process
        if self.ckpts is None:
            return
        self.ckpts.save(done, state, {"step": done, "loader": self.loader.position(done), "run_id": self.run_id})
        restored, _ = (self.ckpts.restore_host(done, self.abstract) if self.ckpts.solo
                       else self.ckpts.restore(done, self.abstract, self.shardings))
        digest = checkpoint.state_digest(restored)
        where = CKPT / self.run_id / str(done)
        body: CheckpointBody = {
            "step": done, "path": where.as_posix(), "digest": digest,
            "params_digest": weights.params_digest(restored.params),
            "files_digest": hashing.path_digest(self.root / where), "loader": self.loader.position(done),
            "leaves": len(jax.tree.leaves(restored))}
        if self.store is not None:
            try:
                body["stored"] = self.store.put(self.run_id, done, digest, where.as_posix())
            except StageError as e:  # resumable: the run stays unfinished, its last stored checkpoint recorded
                distributed.stop_unfinished(f"{self.store.stage}: {e}")
        if self.run is not None and not replayed("checkpoint", done, self.recorded, digest):
            self.run.record("checkpoint", body)

    def on_end(self) -> None:
        if self.ckpts is not None:
            self.ckpts.close()
        if self.store is not None:
            self.store.close()


def replayed(kind: Literal["metric", "checkpoint"], s: int, recorded: dict[int, Values] | dict[int, str],
             value: Values | str) -> bool:
    """Whether a resumed run already holds the record of step ``s`` (then not appended again): the
    replayed value must be identical, or determinism is broken and we stop."""
    if s not in recorded:
        return False
    old = recorded[s]
    if isinstance(old, dict) and isinstance(value, dict):
        same = all(old[k]["hex"] == value[k]["hex"] for k in EXACT_METRICS)
    else:
        same = old == value
    if not same:
        raise StageError(f"resume diverged from the recorded run at step {s} ({kind}): recorded {old}, "
                         f"recomputed {value}; the environment's determinism class may have changed")
    return True
