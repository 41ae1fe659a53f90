"""What a training run is made of, apart from how it steps (:mod:`marin.train.loop`): its setup (model,
optimizer, shardings, loader, compiled step), where it begins (:mod:`marin.train.resume`), what its hooks
are made from, and the job (pretraining, or sft's fine-tune) that ties them together."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import jax
import numpy as np
import optax
from flax import nnx

from marin.config import Params, TrainParams
from marin.ledger import Input, Run, exact
from marin.model import ModelConfig
from marin.train import seeds, step
from marin.train.hooks import TrainHook, Values
from marin.train.loader import BatchSource
from marin.train.step import Batch, ModelParams, TrainState
from marin.train.universal import RoundingLog, UniversalStep

ValLoss = Callable[[ModelParams], "float | None"]  # the validation loss of the params (None: no validation data)


class TokenizerEntry(TypedDict):
    """The keys of a tokenizer entry (the tokenize manifest's, or a base model's config.json) read here."""

    digest: str
    eos_id: int


@dataclass(frozen=True)
class Setup:
    """Model, optimizer, shardings, loader and compiled step: pure functions of params."""

    cfg: ModelConfig
    mesh: jax.sharding.Mesh
    optimizer: optax.GradientTransformation
    schedule: optax.Schedule
    graphdef: nnx.GraphDef
    abstract: TrainState  # of ShapeDtypeStructs (jax.eval_shape)
    shardings: TrainState  # of NamedShardings, the state's layout over the mesh
    loader: BatchSource  # the token windows (Loader), or a fine-tune's rows
    train_step: step.PacedStep | UniversalStep
    tokenizer: TokenizerEntry  # the tokenize manifest's tokenizer entry
    val_loss: ValLoss  # mean NLL on a fixed batch of validation windows (the validation-loss curve)
    tp: TrainParams  # the optimization section: params.train, or params.sft for the fine-tune
    init: Callable[[Params], TrainState] | None = None  # the state at step 0, when not a fresh init (a fine-tune's)
    train_tokens: int = 0  # tokens of the training split (the tokenize manifest): epochs = tokens seen / these
    rounding: RoundingLog | None = None  # the universal profile's rounding log (marin.train.universal)

    def init_state(self, params: Params) -> TrainState:
        if self.init is not None:
            return self.init(params)
        # One compiled init placed straight into its shardings: eager NNX init compiles every
        # op separately (seconds), and uncommitted arrays would make step 2 compile again.
        keys = seeds.key(params.seed, "init"), seeds.key(params.seed, "step")
        return jax.jit(lambda: step.init_state(self.cfg, *keys, self.optimizer)[1], out_shardings=self.shardings)()

    def step(self, state: TrainState, i: int) -> tuple[TrainState, dict[str, jax.Array]]:
        """Optimizer step ``i`` (0-based) on batch ``i``."""
        return self.train_step(state, self.global_batch(i))

    def global_batch(self, i: int) -> Batch:
        """Batch ``i`` as global arrays over the mesh, this process reading only the rows of its
        own devices (the same pure (seed, step) order in every process)."""
        sharding = step.batch_sharding(self.mesh)
        shape = (self.loader.batch_size, self.cfg.max_seq_len)
        rows: dict[tuple[int, int], dict[str, np.ndarray]] = {}

        def part(name: str) -> jax.Array:
            def load(index: tuple[slice, ...]) -> np.ndarray:
                lo, hi, _ = index[0].indices(shape[0])
                if (lo, hi) not in rows:
                    rows[lo, hi] = self.loader.rows(i, lo, hi)
                return rows[lo, hi][name]

            return jax.make_array_from_callback(shape, sharding, load)  # pyright: ignore[reportArgumentType]

        return {name: part(name) for name in self.loader.fields}

    def metric_values(self, metrics: dict[str, jax.Array], i: int, params: ModelParams) -> Values:
        """The exact metrics of step ``i`` (a host sync), and the validation loss of ``params``."""
        m = jax.device_get(metrics)
        raw = {"loss": float(m["loss"]), "lr": float(np.asarray(self.schedule(i))),
               "grad_norm": float(m["grad_norm"]), "accuracy": float(m["accuracy"])}
        val = self.val_loss(params)
        if val is not None:
            raw["val_loss"] = val
        if self.rounding is not None:  # float64 under universal: rounded to float32 with the log, at step i + 1
            raw = self.rounding.values(i + 1, raw)
        return {k: exact(v) for k, v in raw.items()}


@dataclass
class Begun:
    """Where training starts: the ledger run (process 0 only), its id, the state and step, and
    what a resumed run recorded already (its replayed values must agree)."""

    run: Run | None
    run_id: str
    state: TrainState
    metrics: dict[int, Values]
    ckpts: dict[int, str]


@dataclass(frozen=True)
class HookContext:
    """What a job's hooks are made from: the run begun (marin.train.resume) and its setup."""

    root: Path
    stage: str
    su: Setup
    begun: Begun
    primary: bool  # process 0: the one that writes the ledger and shows progress


@dataclass(frozen=True)
class Job:
    """What a training run is: its stage, the params sections and inputs its recipe names, the
    seed streams it records, how it is set up, and where its model and curve go."""

    stage: str
    sections: tuple[str, ...]
    inputs: tuple[Input, ...]
    streams: tuple[str, ...]
    setup: Callable[[Path, Params], Setup]
    model: Path
    curve: Path
    model_meta: Callable[[Path, Setup], dict[str, Any]]  # config.json's extra keys (tokenizer, packing, ...)
    hooks: Callable[[HookContext], list[TrainHook]]  # what happens around each step: standard_hooks, or more
