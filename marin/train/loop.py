"""The train stage: init or resume, the loop, checkpoints, metrics, the final model.

Reads top to bottom: plan the run → resume an unfinished run of the same recipe, or
start → for each step: batch → jitted step → (log) → (checkpoint) → save the model.
Call :func:`marin.train.runtime.configure` before importing this module.

What is trained, on what, into which output is a :class:`Job`: :data:`PRETRAIN` (the train
stage) or the instruction fine-tune (marin.instruct.sft), which reuses everything here.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from marin import env, fsutil, hashing, progress, stages
from marin.config import Params, TrainParams
from marin.data import manifest
from marin.errors import StageError
from marin.ledger import Input, Run, exact
from marin.ledger.bodies import CheckpointBody
from marin.ledger.hash_cache import hash_cache
from marin.ledger.index import Index
from marin.ledger.run import Plan
from marin.ledger.store import RunLog, load_run, read_run
from marin.model import ModelConfig, count_params
from marin.tracking.live import Live
from marin.train import checkpoint, distributed, runtime, seeds, step, weights
from marin.train.budget import Budget
from marin.train.loader import CACHE, Loader, open_stream

TOKENS, CKPT = Path("data/tokens"), Path("checkpoints")
MODEL, CURVE = Path(stages.MODEL), Path("metrics/train_curve.csv")
EXACT_METRICS = ("loss", "lr", "grad_norm", "accuracy")


def model_config(params: Params, vocab_size: int) -> ModelConfig:
    m = params.model
    return ModelConfig(vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
                       n_kv_heads=m.n_kv_heads, d_ff=m.d_ff, max_seq_len=m.seq_len,
                       tie_embeddings=m.tie_embeddings, rope_theta=m.rope_theta, dtype=m.dtype)


def find_resumable(root: Path, recipe: str, stage: str = "train") -> RunLog | None:
    """The latest unfinished run of ``stage`` with this recipe, if any (looked up in the ledger index)."""
    idx = Index.open(root)
    try:
        found = idx.unfinished(stage, recipe)
    finally:
        idx.close()
    for run_id in reversed(found):  # the index is derived: confirm against the run file itself
        log = load_run(root, run_id)
        if log.started is not None and log.finished is None and log.started.body["recipe_digest"] == recipe:
            return log
    return None


def last_good_checkpoint(recorded: list[tuple[int, str]], ckpts: checkpoint.Checkpoints, abstract: Any,
                         shardings: Any) -> tuple[int, Any] | None:
    """The latest recorded (step, digest) checkpoint that orbax committed and whose tensors
    still match. Every process calls it with the same list (restores are collective)."""
    committed = set(ckpts.steps())
    for s, digest in reversed(recorded):
        if s not in committed:
            continue
        state, _ = ckpts.restore(s, abstract, shardings)
        if checkpoint.state_digest(state) == digest:
            return s, state
        print(f"checkpoint {s} does not match its record; trying an earlier one")
    return None


@dataclass(frozen=True)
class Setup:
    """Model, optimizer, shardings, loader and compiled step: pure functions of params."""

    cfg: ModelConfig
    mesh: Any
    optimizer: Any
    schedule: Any
    graphdef: Any
    abstract: Any
    shardings: Any
    loader: Loader
    train_step: Any
    tokenizer: dict[str, Any]  # the tokenize manifest's tokenizer entry
    val_loss: Any  # params -> mean NLL on a fixed batch of validation windows (the validation-loss curve)
    tp: TrainParams  # the optimization section: params.train, or params.sft for the fine-tune
    init: Callable[[Params], Any] | None = None  # the state at step 0, when not a fresh init (a fine-tune's)
    train_tokens: int = 0  # tokens of the training split (the tokenize manifest): epochs = tokens seen / these

    def init_state(self, params: Params) -> Any:
        if self.init is not None:
            return self.init(params)
        # One compiled init placed straight into its shardings: eager NNX init compiles every
        # op separately (seconds), and uncommitted arrays would make step 2 compile again.
        keys = seeds.key(params.seed, "init"), seeds.key(params.seed, "step")
        return jax.jit(lambda: step.init_state(self.cfg, *keys, self.optimizer)[1], out_shardings=self.shardings)()

    def step(self, state: Any, i: int) -> tuple[Any, Any]:
        """Optimizer step ``i`` (0-based) on batch ``i``."""
        return self.train_step(state, self.global_batch(i))

    def global_batch(self, i: int) -> dict[str, Any]:
        """Batch ``i`` as global arrays over the mesh, this process reading only the rows of its
        own devices (the same pure (seed, step) order in every process)."""
        sharding = step.batch_sharding(self.mesh)
        shape = (self.loader.batch_size, self.cfg.max_seq_len)
        rows: dict[tuple[int, int], dict[str, Any]] = {}

        def part(name: str) -> Any:
            def load(index: tuple[slice, ...]) -> Any:
                lo, hi, _ = index[0].indices(shape[0])
                if (lo, hi) not in rows:
                    rows[lo, hi] = self.loader.rows(i, lo, hi)
                return rows[lo, hi][name]

            return jax.make_array_from_callback(shape, sharding, load)  # pyright: ignore[reportArgumentType]

        return {name: part(name) for name in getattr(self.loader, "fields", ("inputs", "targets"))}

    def metric_values(self, metrics: Any, i: int, params: Any) -> dict[str, Any]:
        """The exact metrics of step ``i`` (a host sync), and the validation loss of ``params``."""
        m = jax.device_get(metrics)
        values = {"loss": exact(m["loss"]), "lr": exact(self.schedule(i)), "grad_norm": exact(m["grad_norm"]),
                  "accuracy": exact(m["accuracy"])}
        val = self.val_loss(params)
        return values if val is None else {**values, "val_loss": exact(val)}


def validation_loss_fn(graphdef: Any, shards: list[Path], eos: int, seq_len: int, batch: int) -> Any:
    """The mean NLL (nats per token) of the params on the first ``batch`` validation windows
    (marin.data.documents' windows: every document token once); a fixed batch, so the curve is cheap."""
    import numpy as np

    from marin.data.documents import documents, windows

    rows: list[tuple[Any, Any, int]] = []
    for ids, _, _ in documents(shards):
        rows += list(windows(ids, eos, seq_len))
        if len(rows) >= batch:
            break
    if not rows:
        return lambda params: None
    xs, ys = np.stack([r[0] for r in rows[:batch]]), np.stack([r[1] for r in rows[:batch]])
    mask = np.arange(seq_len)[None, :] < np.array([r[2] for r in rows[:batch]])[:, None]
    nll = step.eval_nll_fn(graphdef)
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
    hashes = hash_cache(root)  # the digests Plan.make just took of the same files
    stream = open_stream(shards, tok["tokenizer"]["eos_id"], root / CACHE, lambda p: hashes(p)[0])
    loader = Loader(stream, cfg.max_seq_len, tp.batch_size, seeds.key_bytes(params.seed, "data_order"))
    val = validation_loss_fn(graphdef, [root / TOKENS / s["file"] for s in tok["splits"]["validation"]["shards"]],
                             tok["tokenizer"]["eos_id"], cfg.max_seq_len, tp.batch_size)
    return Setup(cfg, mesh, optimizer, step.lr_schedule(tp), graphdef, abstract, shardings, loader,
                 step.make_train_step(graphdef, optimizer, shardings, mesh), tok["tokenizer"], val, tp,
                 train_tokens=tok["splits"]["train"]["tokens"])


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


def _pretrain_meta(root: Path, su: Setup) -> dict[str, Any]:
    return {"tokenizer": {"path": (TOKENS / "tokenizer.json").as_posix(), "digest": su.tokenizer["digest"],
                          "eos_id": su.tokenizer["eos_id"]},
            "packing": "documents joined with EOS separators; attention is not masked at boundaries"}


PRETRAIN = Job("train", ("seed", "model", "train", "runtime"), (Input("tokens", TOKENS.as_posix()),), seeds.STREAMS,
               setup, MODEL, CURVE, _pretrain_meta)


def is_log_step(tp: Any, done: int) -> bool:
    return done % tp.log_every == 0 or done == tp.steps


def is_checkpoint_step(tp: Any, done: int) -> bool:
    return done % tp.checkpoint_every == 0 or done == tp.steps


@dataclass
class Begun:
    """Where training starts: the ledger run (process 0 only), its id, the state and step, and
    what a resumed run recorded already (its replayed values must agree)."""

    run: Run | None
    run_id: str
    state: Any
    metrics: dict[int, dict[str, Any]]
    ckpts: dict[int, str]


def begin(root: Path, params: Params, topo: distributed.Topology, job: Job) -> tuple[Setup, Begun]:
    """Plan the run; resume an unfinished run of the same recipe, in the same ledger run, or start.

    Process 0 alone reads and writes the ledger; the others learn the run and the recorded
    checkpoints from it (a collective), and every process restores the same checkpoint."""
    rt = params.runtime
    fp = env.fingerprint()
    procs = distributed.allgather_json(distributed.process_entry(fp)) if rt.processes > 1 else None
    execution = {"processes": procs, "coordinator": topo.coordinator or "cluster auto-detection"} if procs else None
    plan = prior = su = None
    if topo.primary:
        plan = Plan.make(root, job.stage, params=params.section(*job.sections), inputs=list(job.inputs),
                         det_class=runtime.determinism_class(rt, fp), seeds=seeds.record(params.seed, job.streams),
                         fingerprint=fp, execution=execution)
        su = job.setup(root, params)  # first, alone: it may build the token cache the others then read
        prior = find_resumable(root, plan.recipe_digest, job.stage)
    found = {"run_id": prior.run_id, "ckpts": [[c["step"], c["digest"]] for c in prior.bodies("checkpoint")]
             } if prior is not None else None
    if rt.processes > 1:
        found = distributed.from_primary(found)
    su = su or job.setup(root, params)
    state, start, metrics, ckpts = None, 0, {}, {}
    if found is not None:
        ck = checkpoint.Checkpoints(root / CKPT / found["run_id"])
        got = last_good_checkpoint([tuple(c) for c in found["ckpts"]], ck, su.abstract, su.shardings)
        ck.close()
        start, state = got if got is not None else (0, None)
        ckpts = dict(tuple(c) for c in found["ckpts"])
    run = None
    if topo.primary and prior is not None:
        metrics = {m["step"]: m["values"] for m in prior.bodies("metric")}
        run = Run.resume(root, prior.run_id, reason="unfinished run of the same recipe", from_step=start,
                         execution=execution)
        print(f"{job.stage}: resuming {run.run_id} from step {start}")
    elif topo.primary:
        assert plan is not None  # the primary process plans the run
        run = Run.begin(plan)
    run_id = distributed.from_primary(run.run_id if run else None) if rt.processes > 1 else run.run_id  # pyright: ignore[reportOptionalMemberAccess]  # one process is the primary
    if state is None:
        state = su.init_state(params)
    return su, Begun(run, run_id, state, metrics, ckpts)



def run(root: Path, params: Params, topo: distributed.Topology | None = None, job: Job = PRETRAIN) -> None:
    topo = topo or distributed.Topology(1)
    su, b = begin(root, params, topo, job)
    tp = su.tp
    cfg, abstract, shardings, loader, run, state = su.cfg, su.abstract, su.shardings, su.loader, b.run, b.state
    ckpts = checkpoint.Checkpoints(root / CKPT / b.run_id)
    live = Live.start(root, b.run_id, enabled=run is not None)  # metrics in MLflow while training (process 0)

    with (run if run is not None else contextlib.nullcontext()), distributed.peer_guard(topo):
        n_params = count_params(state.params)
        tokens_per_step = tp.batch_size * cfg.max_seq_len
        if topo.primary and su.train_tokens:  # pretraining; a fine-tune's data is not the token stream
            _announce_budget(Budget(tp.steps * tokens_per_step, su.train_tokens, n_params), tp.max_epochs_warning)
        start = int(state.step)
        bar = progress.meter(job.stage, tp.steps, "step", initial=start, hide=not topo.primary)  # MARIN_PROGRESS
        t_last, steps_since = time.perf_counter(), 0
        for i in range(start, tp.steps):
            state, metrics = su.step(state, i)
            done, steps_since = i + 1, steps_since + 1
            bar.update(1)

            if is_log_step(tp, done):  # host sync only here; every process evaluates, process 0 records
                values = su.metric_values(metrics, i, state.params)
                now = time.perf_counter()
                tok_s = steps_since * tokens_per_step / (now - t_last)
                t_last, steps_since = now, 0
                if run is not None:
                    if not _replayed("metric", done, b.metrics, values):
                        run.record("metric", {"step": done, "values": values,
                                              "timing": {"tokens_per_s": round(tok_s, 3)}})
                    live.step()
                bar.set_postfix(loss=f"{values['loss']['value']:.4f}", tok_s=f"{tok_s:,.0f}")

            if is_checkpoint_step(tp, done):  # every process saves its part, then all digest what is on disk
                ckpts.save(done, state, {"step": done, "loader": loader.position(done), "run_id": b.run_id})
                restored, _ = ckpts.restore(done, abstract, shardings)
                digest = checkpoint.state_digest(restored)
                where = CKPT / b.run_id / str(done)
                body: CheckpointBody = {
                    "step": done, "path": where.as_posix(), "digest": digest,
                    "params_digest": weights.params_digest(restored.params),
                    "files_digest": hashing.path_digest(root / where), "loader": loader.position(done),  # pyright: ignore[reportAssignmentType]
                    "leaves": len(jax.tree.leaves(restored))}
                if run is not None and not _replayed("checkpoint", done, b.ckpts, digest):
                    run.record("checkpoint", body)
        bar.close()
        ckpts.close()
        live.close()
        host_params = jax.tree.map(distributed.host_array, state.params)  # a collective for sharded params
        if run is not None:
            _publish(root, run, su, job, host_params, n_params, int(state.step))


def _announce_budget(budget: Budget, max_epochs: float) -> None:
    print(budget.line())
    if (warning := budget.warning(max_epochs)) is not None:
        print(warning, file=sys.stderr)


def _publish(root: Path, run: Run, su: Setup, job: Job, params: Any, n_params: int, steps: int) -> None:
    """The released model and the training curve (exact values, so it repeats bit for bit)."""
    with fsutil.atomic_dir(root / job.model) as tmp:
        tensor_digest = weights.save(tmp, params, su.cfg, {
            "n_params": n_params, "step": steps, "recipe_digest": run.recipe_digest, **job.model_meta(root, su)})
        rec = run.output("model", job.model, source=tmp, tensor_digest=tensor_digest,  # recorded, then published
                         meta={"n_params": n_params, "step": steps})
    _write_curve(root, run, job)
    print(f"{job.stage}: {n_params:,} parameters, {steps} steps, final model {job.model}: tensor digest "
          f"{tensor_digest} (over its tensors), folder digest {rec.body['digest']} (over its files)")


def _replayed(kind: str, s: int, recorded: dict[int, Any], value: Any) -> bool:
    """Whether a resumed run already holds the record of step ``s`` (then not appended again): the
    replayed value must be identical, or determinism is broken and we stop."""
    if s not in recorded:
        return False
    old = recorded[s]
    same = old == value if kind == "checkpoint" else all(old[k]["hex"] == value[k]["hex"] for k in EXACT_METRICS)
    if not same:
        raise StageError(f"resume diverged from the recorded run at step {s} ({kind}): recorded {old}, "
                         f"recomputed {value}; the environment's determinism class may have changed")
    return True


def _write_curve(root: Path, run: Run, job: Job) -> None:
    rows = ["step,loss,lr,grad_norm,val_loss"]
    for m in read_run(run.file.path, validate=False).bodies("metric"):
        v = m["values"]
        val = repr(v["val_loss"]["value"]) if "val_loss" in v else ""
        rows.append(f"{m['step']},{v['loss']['value']!r},{v['lr']['value']!r},{v['grad_norm']['value']!r},{val}")
    fsutil.write_bytes(root / job.curve, ("\n".join(rows) + "\n").encode(),
                       before_publish=lambda tmp: run.output(f"{job.stage}_curve", job.curve, source=tmp))
