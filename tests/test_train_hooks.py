"""The step loop and its hooks (marin.train.hooks), in process on a tiny model: what each hook is
handed, in which order, and the refusal of a resumed run whose replayed values differ."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import numpy as np
import pytest

from marin.config import RuntimeParams, TrainParams
from marin.errors import StageError
from marin.ledger import exact
from marin.ledger.bodies import LoaderPosition
from marin.model import ModelConfig
from marin.train import loop, runtime, seeds, step
from marin.train.hooks import StepInfo, replayed

TP = TrainParams(steps=5, batch_size=2, lr=1e-3, schedule="cosine", warmup_steps=1, min_lr_ratio=0.1,
                 wsd_decay_fraction=0.2, weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip=1.0,
                 log_every=2, checkpoint_every=100)


@dataclass(frozen=True)
class RandomRows:
    """A batch source of its own (the loop takes any, by its protocol): rows from a seeded generator."""

    batch_size: int
    seq_len: int
    fields: ClassVar[tuple[str, ...]] = ("inputs", "targets")

    def position(self, step: int) -> LoaderPosition:
        return {"epoch": 0, "index": step * self.batch_size}

    def rows(self, step: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        x = np.random.default_rng(step).integers(0, 16, (self.batch_size, self.seq_len + 1), dtype=np.int32)[lo:hi]
        return {"inputs": x[:, :-1], "targets": x[:, 1:]}


class Recorder:
    def __init__(self, name: str, seen: list[tuple[str, int | str]]):
        self.name, self.seen = name, seen

    def on_step(self, info: StepInfo) -> None:
        self.seen.append((self.name, info.step))
        if info.values is not None:
            self.seen.append((self.name, "values"))

    def on_end(self) -> None:
        self.seen.append((self.name, "end"))


def tiny_setup() -> loop.Setup:
    cfg = ModelConfig(vocab_size=16, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16, max_seq_len=8)
    mesh = runtime.make_mesh(RuntimeParams(xla_cpu_threads=1, devices=1, param_sharding="replicated"))
    optimizer = step.make_optimizer(TP)
    graphdef, abstract = step.abstract_state(cfg, optimizer)
    shardings = step.state_shardings(abstract, mesh, "replicated")
    train_step = step.make_train_step(graphdef, optimizer, shardings, mesh)
    return loop.Setup(cfg, mesh, optimizer, step.lr_schedule(TP), graphdef, abstract, shardings,
                      RandomRows(TP.batch_size, cfg.max_seq_len), train_step, {"digest": "sha256:none", "eos_id": 0},
                      lambda params: None, TP)


def test_every_hook_sees_every_step_in_order_with_the_metrics_at_log_steps_then_ends() -> None:
    su = tiny_setup()
    seen: list[tuple[str, int | str]] = []
    keys = seeds.key(7, "init"), seeds.key(7, "step")
    start = jax.jit(lambda: step.init_state(su.cfg, *keys, su.optimizer)[1], out_shardings=su.shardings)()
    state = loop.train_steps(su, start, [Recorder("a", seen), Recorder("b", seen)])
    assert int(state.step) == TP.steps
    expected: list[tuple[str, int | str]] = []
    for done in range(1, TP.steps + 1):
        for name in "ab":
            expected.append((name, done))
            if done % TP.log_every == 0 or done == TP.steps:
                expected.append((name, "values"))
    assert seen == [*expected, ("a", "end"), ("b", "end")]


def test_a_replayed_record_must_be_identical() -> None:
    values = {k: exact(v) for k, v in (("loss", 2.5), ("lr", 1e-3), ("grad_norm", 0.5), ("accuracy", 0.25))}
    assert not replayed("metric", 4, {}, values)
    assert replayed("metric", 4, {4: values}, dict(values))
    assert replayed("checkpoint", 4, {4: "sha256:aa"}, "sha256:aa")
    with pytest.raises(StageError, match="resume diverged from the recorded run at step 4 \\(metric\\)"):
        replayed("metric", 4, {4: values}, {**values, "loss": exact(np.nextafter(2.5, 3.0))})
    with pytest.raises(StageError, match="at step 4 \\(checkpoint\\)"):
        replayed("checkpoint", 4, {4: "sha256:aa"}, "sha256:bb")
