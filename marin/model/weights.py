"""A saved model read back: ``model.safetensors`` + ``config.json`` (:mod:`marin.model_folder`) as
the Flax model's graph and parameters. Writing it is training's (:mod:`marin.train.weights`).

Tensor names are the dotted parameter paths (``blocks.0.attn.wq.kernel``). Anyone can
load them with the ``safetensors`` package; :func:`load` rebuilds the Flax model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
from flax import nnx

from marin import model_folder
from marin.model.transformer import ModelConfig, Transformer

WEIGHTS = "model.safetensors"
# A saved model read back: (graphdef, params, config), params the pure-dict pytree of arrays, config the
# folder's config.json (model shape, tokenizer ids)
Loaded = tuple[nnx.GraphDef, Any, dict[str, Any]]


def tensor_name(path: tuple[Any, ...]) -> str:
    """The dotted name of a parameter's pytree path."""
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)


def load(directory: Path) -> Loaded:
    """(graphdef, params, config) of a saved model; the tensor digest is checked."""
    tensors, config = model_folder.read(directory)
    cfg = ModelConfig(**config["model"])
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    abstract = nnx.to_pure_dict(abstract)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    params = jax.tree_util.tree_unflatten(treedef, [tensors[tensor_name(p)] for p, _ in leaves])
    return graphdef, params, config
