"""Optimizer, loss, and the one jitted, pure train step over a plain-pytree TrainState.

Functional NNX: the model is split once into a static ``graphdef`` and its parameters,
kept as a plain nested dict (``nnx.to_pure_dict``) inside ``TrainState``, which orbax
saves and restores and ``jax.sharding`` places as-is. The step rebuilds the module with
``nnx.merge(graphdef, params)``.

References: Loshchilov & Hutter 2019 (AdamW, arXiv:1711.05101); Loshchilov & Hutter 2017
(cosine schedule, arXiv:1608.03983); Hu et al. 2024 (MiniCPM's warmup-stable-decay,
arXiv:2404.06395); Pascanu et al. 2013 (gradient-norm clipping, arXiv:1211.5063);
Rajbhandari et al. 2020 (ZeRO / fully sharded data parallel, arXiv:1910.02054).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from marin import allocator
from marin.config import TrainParams
from marin.model import ModelConfig, Transformer
from marin.model.head_loss import head_cross_entropy

Batch = dict[str, jax.Array]  # inputs (B, T) int32, targets (B, T) int32, optionally weights (B, T) float32
ModelParams = dict[str, Any]  # nested dict of float32 arrays (nnx.to_pure_dict)


class TrainState(NamedTuple):
    params: ModelParams
    opt_state: optax.OptState
    step: jax.Array  # int32 scalar: completed optimizer steps (= the loader position)
    rng: jax.Array  # uint32 key data of the dropout/step stream (unused by this model)


def lr_schedule(tp: TrainParams) -> optax.Schedule:
    end_lr = tp.lr * tp.min_lr_ratio
    if tp.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            init_value=0.0, peak_value=tp.lr, warmup_steps=tp.warmup_steps,
            decay_steps=tp.steps, end_value=end_lr,
        )
    decay_steps = max(1, int(tp.steps * tp.wsd_decay_fraction))
    stable_end = max(tp.warmup_steps, tp.steps - decay_steps)
    return optax.join_schedules(
        [optax.linear_schedule(0.0, tp.lr, tp.warmup_steps), optax.constant_schedule(tp.lr),
         optax.linear_schedule(tp.lr, end_lr, decay_steps)],
        boundaries=[tp.warmup_steps, stable_end],
    )


def make_optimizer(tp: TrainParams) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW; weight decay on matrices only, not norm scales."""
    def decay_mask(params: Any) -> Any:
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    return optax.chain(
        optax.clip_by_global_norm(tp.grad_clip),
        optax.adamw(lr_schedule(tp), b1=tp.beta1, b2=tp.beta2, eps=tp.eps,
                    weight_decay=tp.weight_decay, mask=decay_mask),
    )


def loss_fn(model: Transformer, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy in nats per token, and the share of positions whose
    target has the largest logit (a tie counts as a hit), through the fused output projection and
    loss (:func:`marin.model.head_loss.head_cross_entropy`: the (B, T, V) logits are never held).
    With ``weights`` in the batch (a fine-tune's: 1 on the assistant tokens, 0 elsewhere) both are
    means over the weighted positions of the batch."""
    x = model.hidden(batch["inputs"])  # (B, T, D)
    x = x.reshape(-1, x.shape[-1])  # (B*T, D)
    targets = batch["targets"].reshape(-1)
    weights = batch["weights"].reshape(-1) if "weights" in batch else jnp.ones(targets.shape, jnp.float32)
    loss, accuracy = head_cross_entropy(x, model.head(x.dtype), targets, weights)
    return loss, {"accuracy": accuracy}


def init_state(cfg: ModelConfig, init_key: jax.Array, step_key: jax.Array,
               optimizer: optax.GradientTransformation) -> tuple[nnx.GraphDef, TrainState]:
    model = Transformer(cfg, rngs=nnx.Rngs(params=init_key))
    graphdef, params = nnx.split(model)
    params = nnx.to_pure_dict(params)
    state = TrainState(params=params, opt_state=optimizer.init(params),
                       step=jnp.zeros((), jnp.int32), rng=jax.random.key_data(step_key))
    return graphdef, state


def abstract_state(cfg: ModelConfig, optimizer: optax.GradientTransformation) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, TrainState of ShapeDtypeStructs) without allocating, for restores."""
    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    k = jax.random.key(0)
    return graphdef, jax.eval_shape(lambda: init_state(cfg, k, k, optimizer)[1])


def state_shardings(state: Any, mesh: jax.sharding.Mesh, param_sharding: str) -> Any:
    """Replicated everywhere, or fsdp: every leaf whose first axis divides evenly over
    ``data`` is split along it (params and the Adam moments alike); the rest replicated."""
    n = mesh.shape["data"]

    def spec(leaf: Any) -> NamedSharding:
        shape = getattr(leaf, "shape", ())
        if param_sharding == "fsdp" and len(shape) >= 2 and shape[0] % n == 0:
            return NamedSharding(mesh, PartitionSpec("data", *([None] * (len(shape) - 1))))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(spec, state)


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec("data"))


def make_train_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation,
                    shardings: Any, mesh: jax.sharding.Mesh) -> PacedStep:
    """Jitted ``train_step(state, batch) -> (state, metrics)``; the input state is donated.

    In/out shardings are pinned, so one executable serves the whole run; XLA inserts the
    gradient all-reduce (and, for fsdp, the parameter all-gathers).
    """
    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        def loss_of(params: ModelParams) -> tuple[jax.Array, dict[str, jax.Array]]:
            return loss_fn(nnx.merge(graphdef, params), batch)

        (loss, aux), grads = jax.value_and_grad(loss_of, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new = state._replace(params=params, opt_state=opt_state, step=state.step + 1)
        return new, {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}

    replicated = NamedSharding(mesh, PartitionSpec())
    return PacedStep(jax.jit(train_step, in_shardings=(shardings, batch_sharding(mesh)),
                             out_shardings=(shardings, replicated), donate_argnums=0))


class PacedStep:
    """A jitted train step that starts once the previous one is over and XLA has freed its
    temporaries (marin.allocator.wait_until_freed): so that each step reuses the one block of
    temporaries jemalloc keeps rather than taking a second one (marin.allocator). The caller still
    builds the next batch while the previous step runs (it is an argument of the call)."""

    def __init__(self, jitted: Any):
        self.jitted = jitted
        self.level: int | None = None  # jemalloc's live bytes when the previous step was dispatched

    def lower(self, *args: Any) -> Any:
        return self.jitted.lower(*args)

    def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
        jax.block_until_ready(state)  # the previous step's output
        allocator.wait_until_freed(self.level)
        self.level = allocator.live_bytes()
        return self.jitted(state, batch)


def eval_nll_fn(graphdef: nnx.GraphDef) -> Callable[[ModelParams, ArrayLike, ArrayLike], jax.Array]:
    """Jitted per-token negative log-likelihood (B, T) in nats."""
    @jax.jit
    def nll(params: ModelParams, inputs: ArrayLike, targets: ArrayLike) -> jax.Array:
        logits = nnx.merge(graphdef, params)(inputs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets)

    return nll
