"""The instruction fine-tune of the base model: a :class:`marin.train.loop.Job`, so it runs through
the train stage's loop (resume from the last recorded checkpoint, checkpoint digests, exact
metrics, MLflow, ``marin verify`` and its segments) with its own params section (``sft``).

It starts from models/final (an input, by digest): the base model's weights and config, a fresh
optimizer. Each conversation of data/instructions/train.jsonl is one row, rendered by the chat
template (marin.data.chat) and cut to ``seq_len + 1`` tokens, padded with EOS (padding, not
packing: a row's attention sees one conversation, and most are far shorter than a row). The
loss and accuracy are means over the batch's assistant tokens (each message and its
``<|end|>``); prompts and padding weigh 0. Batch ``i`` is a keyed permutation of the rows,
a pure function of (seed, step), as pretraining's windows are (marin.train.loader). The
held-out curve is the same loss on the first ``batch_size`` held-out conversations.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from marin import hashing, model_folder, readers, stages
from marin.config import Params, TrainParams
from marin.data import chat
from marin.data import tokenize as tk
from marin.errors import ParamsError, StageError
from marin.ledger import Input
from marin.ledger.bodies import LoaderPosition
from marin.model import ModelConfig, weights
from marin.train import distributed, loop, runtime, seeds, step, universal
from marin.train.loader import sample_windows

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_DECLARED = stages.declaration("sft")  # the paths below: marin/stages/table.py
TOKENS, INSTRUCTIONS = _DECLARED.input("tokenizer").parent, _DECLARED.input("instructions")
BASE, MODEL, CURVE = _DECLARED.input("base_model"), _DECLARED.out("model"), _DECLARED.out("curve")
TOKENIZER, TEMPLATE = TOKENS / "tokenizer.json", TOKENS / chat.TEMPLATE_FILE
STREAMS = ("sft_data_order", "sft_step")
PACKING = ("one conversation per row, cut to seq_len + 1 tokens and padded with EOS; the loss is the mean over "
           "the batch's assistant tokens (each message and its <|end|>), prompts and padding weigh 0")


@dataclass(frozen=True)
class Rows:
    """The fine-tune's loader: batch ``i`` is rows of a keyed permutation (no state: resume is ``rows(i)``)."""

    inputs: np.ndarray  # (N, T) int32
    targets: np.ndarray  # (N, T) int32
    weights: np.ndarray  # (N, T) float32: 1 where the target is an assistant token
    batch_size: int
    key: bytes
    fields: ClassVar[tuple[str, ...]] = ("inputs", "targets", "weights")

    def position(self, step: int) -> LoaderPosition:
        g, n = step * self.batch_size, len(self.inputs)
        return {"epoch": g // n, "index": g % n}

    def rows(self, step: int, lo: int, hi: int) -> dict[str, np.ndarray]:
        at = sample_windows(step, self.batch_size, len(self.inputs), self.key)[lo:hi]
        return {"inputs": self.inputs[at], "targets": self.targets[at], "weights": self.weights[at]}


def encoded(path: Path, tok: Tokenizer, eos_id: int, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inputs, targets, weights), one row per conversation of a JSONL file."""
    eos = chat.token_of(tok, eos_id)
    rows = []
    for line in readers.lines(path, "conversations", StageError):
        if not line.strip():
            continue
        ids, mask = chat.encode(tok, json.loads(line)["messages"], eos)
        seq = np.full(seq_len + 1, eos_id, np.int32)
        w = np.zeros(seq_len + 1, np.float32)
        n = min(len(ids), seq_len + 1)
        seq[:n], w[:n] = ids[:n], mask[:n]
        rows.append((seq[:-1], seq[1:], w[1:]))
    if not rows:
        raise StageError(f"{path}: no conversations to fine-tune on; check params.yaml: instructions")
    xs, ys, ws = (np.stack(c) for c in zip(*rows, strict=True))
    return xs, ys, ws


def heldout_loss(graphdef: nnx.GraphDef, rows: tuple[np.ndarray, np.ndarray, np.ndarray], batch: int,
                 wide: bool = False) -> loop.ValLoss:
    """params -> the mean NLL over the assistant tokens of the first ``batch`` held-out conversations
    (``wide``: ``graphdef`` computes in float64, the universal profile)."""
    x, y, w = (a[:batch] for a in rows)
    nll = universal.eval_nll_fn(graphdef) if wide else step.eval_nll_fn(graphdef)
    return lambda params: float((distributed.host_array(nll(params, x, y)).astype(np.float64) * w).sum()
                                / max(float(w.sum()), 1.0))


def sft_params(params: Params) -> TrainParams:
    if params.sft is None:
        raise ParamsError("params.yaml: no sft section; add one (the shipped params.yaml has it)")
    return params.sft


def setup(root: Path, params: Params) -> loop.Setup:
    tp, rt = sft_params(params), params.runtime
    base = model_folder.read_config(root / BASE)
    cfg, tokm = ModelConfig(**base["model"]), base["tokenizer"]  # the base model's tokenizer: path, digest, eos_id
    if hashing.file_digest(root / TOKENIZER) != tokm["digest"]:
        raise StageError(f"{TOKENIZER} is not the tokenizer {BASE} was trained with ({tokm['digest']}); "
                         "run `dvc repro` to train the base model with it first")
    mesh = runtime.make_mesh(rt)
    optimizer = step.make_optimizer(tp)
    graphdef, abstract = step.abstract_state(cfg, optimizer)
    shardings = step.state_shardings(abstract, mesh, rt.param_sharding)
    tok = tk.load(root / TOKENIZER)
    train = encoded(root / INSTRUCTIONS / "train.jsonl", tok, tokm["eos_id"], cfg.max_seq_len)
    if len(train[0]) < tp.batch_size:  # as train's check: a step would hold some conversations twice or more
        raise StageError(f"{INSTRUCTIONS / 'train.jsonl'}: {len(train[0]):,} conversations, fewer than one batch "
                         f"(sft.batch_size {tp.batch_size}); lower sft.batch_size, or add instructions")
    heldout = encoded(root / INSTRUCTIONS / "heldout.jsonl", tok, tokm["eos_id"], cfg.max_seq_len)
    loader = Rows(*train, tp.batch_size, seeds.key_bytes(params.seed, "sft_data_order"))

    def init(params: Params) -> step.TrainState:  # the base model's weights, a fresh optimizer state
        _, base, _ = weights.load(root / BASE)
        rng = jax.random.key_data(seeds.key(params.seed, "sft_step"))
        return jax.jit(lambda p: step.TrainState(p, optimizer.init(p), jnp.zeros((), jnp.int32), rng),
                       out_shardings=shardings)(base)

    compute, train_step, rounding = loop.train_step_for(rt, tp, cfg, graphdef, optimizer, shardings, mesh)
    return loop.Setup(cfg, mesh, optimizer, step.lr_schedule(tp), graphdef, abstract, shardings, loader, train_step,
                      tokm, heldout_loss(compute, heldout, tp.batch_size, wide=rounding is not None), tp, init,
                      rounding=rounding)


def model_meta(root: Path, su: loop.Setup) -> dict[str, Any]:
    """config.json of models/instruct: the base model it was tuned from, its tokenizer and chat template."""
    base = model_folder.read_config(root / BASE)
    return {"tokenizer": {"path": TOKENIZER.as_posix(), "digest": su.tokenizer["digest"],
                          "eos_id": su.tokenizer["eos_id"]},
            "chat_template": {"path": TEMPLATE.as_posix(), "digest": hashing.file_digest(root / TEMPLATE)},
            "base_model": {"path": BASE.as_posix(), "tensor_digest": base["tensor_digest"],
                           "recipe_digest": base["recipe_digest"]},
            "packing": PACKING, "sft": dataclasses.asdict(su.tp)}


JOB = loop.Job("sft", ("seed", "sft", "runtime"),
               (Input("base_model", BASE.as_posix()), Input("tokenizer", TOKENIZER.as_posix()),
                Input("chat_template", TEMPLATE.as_posix()),
                Input("instructions", (INSTRUCTIONS / "train.jsonl").as_posix()),
                Input("heldout_instructions", (INSTRUCTIONS / "heldout.jsonl").as_posix())),
               STREAMS, setup, MODEL, CURVE, model_meta, loop.standard_hooks)
