"""The train stage: init or resume, the step loop and its hooks, the final model.

Reads top to bottom: plan the run → resume an unfinished run of the same recipe, or start
(marin.train.resume) → for each step: batch → jitted step → the hooks (marin.train.hooks:
progress, ledger metrics, live MLflow metrics, checkpoints) → save the model (marin.train.release).
Call :func:`marin.train.runtime.configure` before importing this module.

What is trained, on what, into which output is a :class:`Job`: :data:`PRETRAIN` (the train
stage) or the instruction fine-tune (marin.instruct.sft), which reuses everything here. The step
loop (:func:`train_steps`) knows nothing of the ledger or MLflow: the hooks the job registers
(:func:`standard_hooks`: progress, metric records, live metrics, checkpoints) do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from marin import stages
from marin.config import Params, RuntimeParams, TrainParams
from marin.data import manifest
from marin.ledger import Input
from marin.ledger.hash_cache import HashCache
from marin.model import ModelConfig, count_params
from marin.tracking.live import Live
from marin.train import distributed, release, rounding_log, runtime, seeds, step, stored, universal
from marin.train.budget import Budget
from marin.train.hooks import CKPT, Checkpointer, LiveMetrics, MetricRecorder, Progress, StepInfo, TrainHook
from marin.train.job import HookContext, Job, Setup, ValLoss
from marin.train.loader import CACHE, Loader, open_stream
from marin.train.resume import begin
from marin.train.step import TrainState

TOKENS = Path("data/tokens")
MODEL, CURVE = Path(stages.MODEL), Path("metrics/train_curve.csv")
def model_config(params: Params, vocab_size: int) -> ModelConfig:
    m = params.model
    return ModelConfig(vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                       n_kv_heads=m.n_kv_heads, d_ff=m.d_ff, max_seq_len=m.seq_len,
                       tie_embeddings=m.tie_embeddings, rope_theta=m.rope_theta, dtype=m.dtype)


def validation_loss_fn(graphdef: nnx.GraphDef, shards: list[Path], eos: int, seq_len: int, batch: int,
                       wide: bool = False) -> ValLoss:
    """The mean NLL (nats per token) of the params on the first ``batch`` validation windows
    (marin.data.documents' windows: every document token once); a fixed batch, so the curve is cheap.
    ``wide``: ``graphdef`` computes in float64 (the universal profile)."""
    from marin.data.documents import documents, windows

    rows: list[tuple[np.ndarray, np.ndarray, int]] = []
    for ids, _, _ in documents(shards):
        rows += list(windows(ids, eos, seq_len))
        if len(rows) >= batch:
            break
    if not rows:
        return lambda params: None
    xs, ys = np.stack([r[0] for r in rows[:batch]]), np.stack([r[1] for r in rows[:batch]])
    mask = np.arange(seq_len)[None, :] < np.array([r[2] for r in rows[:batch]])[:, None]
    nll = universal.eval_nll_fn(graphdef) if wide else step.eval_nll_fn(graphdef)
    # host_array: on several processes the result may be spread over them (a collective, so all call it)
    return lambda params: float((distributed.host_array(nll(params, xs, ys)).astype(np.float64) * mask).sum()
                                / mask.sum())


def setup(root: Path, params: Params) -> Setup:
    tp, rt = params.train, params.runtime
    tok = manifest.read(root / TOKENS / "manifest.json", "tokenize")
    cfg = model_config(params, tok["tokenizer"]["vocab_size"])
    mesh = runtime.make_mesh(rt)
    optimizer = step.make_optimizer(tp)
    graphdef, abstract = step.abstract_state(cfg, optimizer)
    shardings = step.state_shardings(abstract, mesh, rt.param_sharding)
    shards = [root / TOKENS / s["file"] for s in tok["splits"]["train"]["shards"]]
    with HashCache(root) as hashes:  # the digests Plan.make just took of the same files
        stream = open_stream(shards, tok["tokenizer"]["eos_id"], root / CACHE, lambda p: hashes(p)[0])
    loader = Loader(stream, cfg.max_seq_len, tp.batch_size, seeds.key_bytes(params.seed, "data_order"))
    compute, train_step, rounding = train_step_for(rt, tp, cfg, graphdef, optimizer, shardings, mesh)
    val = validation_loss_fn(compute, [root / TOKENS / s["file"] for s in tok["splits"]["validation"]["shards"]],
                             tok["tokenizer"]["eos_id"], cfg.max_seq_len, tp.batch_size, wide=rounding is not None)
    return Setup(cfg, mesh, optimizer, step.lr_schedule(tp), graphdef, abstract, shardings, loader, train_step,
                 tok["tokenizer"], val, tp, train_tokens=tok["splits"]["train"]["tokens"], rounding=rounding)


def train_step_for(rt: RuntimeParams, tp: TrainParams, cfg: ModelConfig, graphdef: nnx.GraphDef,
                   optimizer: optax.GradientTransformation, shardings: TrainState, mesh: jax.sharding.Mesh
                   ) -> tuple[nnx.GraphDef, step.PacedStep | universal.UniversalStep, universal.RoundingLog | None]:
    """(the graphdef that evaluates, the compiled step, the rounding log): under the universal profile a
    float64 model and step (marin.train.universal), else ``graphdef`` and the float32 step."""
    if rt.determinism != "universal":
        return graphdef, step.make_train_step(graphdef, optimizer, shardings, mesh), None
    wide, _ = step.abstract_state(dataclasses.replace(cfg, dtype="float64"), optimizer)
    log = universal.RoundingLog.from_env()
    return wide, universal.make_step(wide, tp, shardings, mesh, log), log


def standard_hooks(ctx: HookContext) -> list[TrainHook]:
    """Progress, the ledger's metric records (process 0), the live MLflow view, checkpoints: the
    metric record of a step comes before its checkpoint record (the ledger's order)."""
    su, b = ctx.su, ctx.begun
    hooks: list[TrainHook] = [Progress(ctx.stage, su.tp.steps, int(b.state.step), hide=not ctx.primary)]
    if b.run is not None:
        hooks.append(MetricRecorder(b.run, b.metrics))
    live = Live.start(ctx.root, b.run_id, enabled=b.run is not None)  # metrics in MLflow while training (process 0)
    remote = stored.configured() if ctx.primary else None
    store = stored.Store(ctx.root, remote, ctx.stage) if remote else None
    return [*hooks, LiveMetrics(live), Checkpointer(ctx.root, b.run_id, su.tp.checkpoint_every, su.tp.steps,
                                                    su.loader, su.abstract, su.shardings, b.run, b.ckpts,
                                                    ctx.primary, store)]


def _pretrain_meta(root: Path, su: Setup) -> dict[str, Any]:
    return {"tokenizer": {"path": (TOKENS / "tokenizer.json").as_posix(), "digest": su.tokenizer["digest"],
                          "eos_id": su.tokenizer["eos_id"]},
            "packing": "documents joined with EOS separators; attention is not masked at boundaries"}


PRETRAIN = Job("train", ("seed", "model", "train", "runtime"), (Input("tokens", TOKENS.as_posix()),), seeds.STREAMS,
               setup, MODEL, CURVE, _pretrain_meta, standard_hooks)




def is_log_step(tp: TrainParams, done: int) -> bool:
    return done % tp.log_every == 0 or done == tp.steps


def run(root: Path, params: Params, topo: distributed.Topology | None = None, job: Job = PRETRAIN) -> None:
    topo = topo or distributed.Topology(1)
    su, b = begin(root, params, topo, job)
    with (b.run if b.run is not None else contextlib.nullcontext()), distributed.peer_guard(topo):
        n_params = count_params(b.state.params)
        if topo.primary and su.train_tokens:  # pretraining; a fine-tune's data is not the token stream
            tokens = su.tp.steps * su.tp.batch_size * su.cfg.max_seq_len
            _announce_budget(Budget(tokens, su.train_tokens, n_params), su.tp.max_epochs_warning)
        if su.rounding is not None:  # beside the checkpoints, cut back to the step this run starts from
            su.rounding.open(root / CKPT / b.run_id / rounding_log.LOG_FILE, int(b.state.step))
        state = train_steps(su, b.state, job.hooks(HookContext(root, job.stage, su, b, topo.primary)))
        host_params = jax.tree.map(distributed.host_array, state.params)  # a collective for sharded params
        if b.run is not None:
            release.publish(root, b.run, su, job, host_params, n_params, int(state.step))


def train_steps(su: Setup, state: TrainState, hooks: Sequence[TrainHook]) -> TrainState:
    """Step from ``state.step`` to the last step, handing each step's :class:`StepInfo` to every hook
    in order (its exact metrics at log steps), then end every hook. No ledger, no MLflow here."""
    tp = su.tp
    tokens_per_step = tp.batch_size * su.cfg.max_seq_len
    t_last, steps_since = time.perf_counter(), 0
    for i in range(int(state.step), tp.steps):
        state, metrics = su.step(state, i)
        done, steps_since = i + 1, steps_since + 1
        values = tok_s = rounding = None
        if is_log_step(tp, done):  # host sync only here; every process evaluates (the val loss is a collective)
            values = su.metric_values(metrics, i, state.params)
            now = time.perf_counter()
            tok_s = steps_since * tokens_per_step / (now - t_last)
            t_last, steps_since = now, 0
        if su.rounding is not None:  # the log through this step, durable before its checkpoint
            su.rounding.end_step(done, durable=done % tp.checkpoint_every == 0 or done == tp.steps)
            if values is not None:
                rounding = su.rounding.summary((i // tp.log_every) * tp.log_every + 1, done)
        info = StepInfo(done, state, values, tok_s, rounding)
        for hook in hooks:
            hook.on_step(info)
    for hook in hooks:
        hook.on_end()
    if su.rounding is not None:
        su.rounding.close()
    return state


def _announce_budget(budget: Budget, max_epochs: float) -> None:
    print(budget.line())
    if (warning := budget.warning(max_epochs)) is not None:
        print(warning, file=sys.stderr)
