"""The released model: ``model.safetensors`` (deterministic bytes) + ``config.json``.

Tensor names are the dotted parameter paths (``blocks.0.attn.wq.kernel``). Anyone can
load them with the ``safetensors`` package; :func:`load` rebuilds the Flax model.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save as safetensors_bytes

from marin import fsutil, hashing, model_folder
from marin.model import ModelConfig, Transformer
from marin.model_folder import CONFIG
from marin.train import distributed

WEIGHTS = "model.safetensors"


def _name(path: tuple[Any, ...]) -> str:
    parts = []
    for k in path:
        parts.append(str(getattr(k, "key", getattr(k, "idx", k))))
    return ".".join(parts)


def flat(params: Any) -> dict[str, np.ndarray]:
    """{dotted path: host array} of a parameter pytree."""
    return {_name(p): distributed.host_array(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}


def params_digest(params: Any) -> str:
    return hashing.tree_digest(flat(params))


def save(directory: Path, params: Any, cfg: ModelConfig, extra: dict[str, Any]) -> str:
    """Write weights and config; returns the tensor digest."""
    tensors = flat(params)
    directory.mkdir(parents=True, exist_ok=True)
    # through fsutil: mode 0644 like every output (safetensors' own save_file leaves 0600 here)
    fsutil.write_bytes(directory / WEIGHTS, safetensors_bytes(tensors, metadata={"format": "marin"}))
    digest = hashing.tree_digest(tensors)
    config = {"architecture": "marin-decoder", "model": dataclasses.asdict(cfg),
              "weights": WEIGHTS, "tensor_digest": digest, **extra}
    fsutil.write_bytes(directory / CONFIG, (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    return digest


def load(directory: Path) -> tuple[nnx.GraphDef, Any, dict[str, Any]]:
    """(graphdef, params, config) of a saved model; the tensor digest is checked."""
    tensors, config = model_folder.read(directory)
    cfg = ModelConfig(**config["model"])
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    abstract = nnx.to_pure_dict(abstract)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
    params = jax.tree_util.tree_unflatten(treedef, [tensors[_name(p)] for p, _ in leaves])
    return graphdef, params, config
